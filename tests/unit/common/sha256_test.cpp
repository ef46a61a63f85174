#include "edge/common/sha256.h"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace {

std::string hex_of(std::string_view message) { return edge::to_hex(edge::sha256(message)); }

// A message whose bytes all differ from their neighbours, so a byte dropped, duplicated or
// reordered at a split point changes the digest.
std::string patterned_message(std::size_t size) {
  std::string message(size, '\0');
  for (std::size_t i = 0; i < size; ++i) message[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return message;
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 example vectors") {
  CHECK(hex_of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
               "mnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(hex_of(std::string(1'000'000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 pads correctly around the block and length-field boundaries") {
  // 55 bytes leave exactly room for the 0x80 byte and the length; 56 and 63 force a second
  // padding block; 64, 65, 119 and 120 repeat that one block later.
  CHECK(hex_of(std::string(55, 'a')) == "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(hex_of(std::string(56, 'a')) == "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(hex_of(std::string(63, 'a')) == "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  CHECK(hex_of(std::string(64, 'a')) == "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  CHECK(hex_of(std::string(65, 'a')) == "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0");
  CHECK(hex_of(std::string(119, 'a')) == "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb");
  CHECK(hex_of(std::string(120, 'a')) == "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c");
}

TEST_CASE("sha256 hashes raw bytes, including zero and high bytes") {
  const std::array<std::byte, 3> bytes = {std::byte{0x00}, std::byte{0x01}, std::byte{0xff}};
  CHECK(edge::to_hex(edge::sha256(std::span<const std::byte>(bytes))) ==
        "26a66b061e8f48f39927c312f25293959729eee95978e2892d49d3512a5cc092");
  CHECK(edge::to_hex(edge::sha256(std::string_view("\x00\x01\xff", 3))) ==
        "26a66b061e8f48f39927c312f25293959729eee95978e2892d49d3512a5cc092");
}

TEST_CASE("incremental updates split at every offset match the one-shot digest") {
  // Three and a bit blocks, so splits land before, on and after every block boundary.
  const std::string message = patterned_message(3 * edge::sha256_block_size + 9);
  const edge::sha256_digest expected = edge::sha256(message);
  const std::string_view view = message;

  for (std::size_t split = 0; split <= message.size(); ++split) {
    CAPTURE(split);
    edge::sha256_hasher hasher;
    hasher.update(view.substr(0, split));
    hasher.update(view.substr(split));
    CHECK(hasher.finish() == expected);
  }

  for (std::size_t first = 0; first <= message.size(); first += 5) {
    for (std::size_t second = first; second <= message.size(); second += 7) {
      CAPTURE(first);
      CAPTURE(second);
      edge::sha256_hasher hasher;
      hasher.update(view.substr(0, first));
      hasher.update(std::as_bytes(std::span<const char>(view.substr(first, second - first))));
      hasher.update(view.substr(second));
      CHECK(hasher.finish() == expected);
    }
  }

  edge::sha256_hasher byte_at_a_time;
  for (const char c : message) byte_at_a_time.update(std::string_view(&c, 1));
  CHECK(byte_at_a_time.finish() == expected);
}

TEST_CASE("finish resets the hasher for the next message") {
  edge::sha256_hasher hasher;
  hasher.update("some earlier message");
  (void)hasher.finish();
  hasher.update("abc");
  CHECK(edge::to_hex(hasher.finish()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(edge::to_hex(hasher.finish()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");

  hasher.update("discarded");
  hasher.reset();
  hasher.update("abc");
  CHECK(hasher.finish() == edge::sha256("abc"));
}

TEST_CASE("to_hex writes 64 lower-case digits") {
  edge::sha256_digest digest{};
  digest[0] = 0xab;
  digest[31] = 0x0f;
  const std::string hex = edge::to_hex(digest);
  CHECK(hex.size() == 64);
  CHECK(hex.substr(0, 4) == "ab00");
  CHECK(hex.substr(60) == "000f");
}

TEST_CASE("constant_time_equal compares contents and lengths") {
  const edge::sha256_digest a = edge::sha256("secret-one");
  edge::sha256_digest b = a;
  CHECK(edge::constant_time_equal(a, b));

  for (std::size_t i = 0; i < b.size(); ++i) {
    CAPTURE(i);
    b = a;
    b[i] ^= 0x01;
    CHECK_FALSE(edge::constant_time_equal(a, b));
    b[i] ^= 0x81;
    CHECK_FALSE(edge::constant_time_equal(a, b));
  }

  CHECK_FALSE(edge::constant_time_equal(std::span(a).first(31), std::span(a)));
  CHECK(edge::constant_time_equal(std::span(a).first(0), std::span(b).first(0)));

  CHECK(edge::constant_time_equal(std::string_view("ek-abc"), std::string_view("ek-abc")));
  CHECK_FALSE(edge::constant_time_equal(std::string_view("ek-abc"), std::string_view("ek-abd")));
  CHECK_FALSE(edge::constant_time_equal(std::string_view("ek-abc"), std::string_view("ek-abcd")));
  CHECK_FALSE(edge::constant_time_equal(std::string_view(""), std::string_view("x")));
  CHECK(edge::constant_time_equal(std::string_view(""), std::string_view("")));
  // Bytes above 0x7f are compared as bytes, not as signed chars.
  CHECK_FALSE(edge::constant_time_equal(std::string_view("\x80"), std::string_view("\x00", 1)));
}
