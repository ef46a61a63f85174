#include "edge/common/sha256.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace edge {
namespace {

// FIPS 180-4 §5.3.3: the first 32 bits of the fractional parts of the square roots of the first
// eight primes.
constexpr std::array<std::uint32_t, 8> initial_state = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

// FIPS 180-4 §4.2.2: the first 32 bits of the fractional parts of the cube roots of the first
// sixty-four primes.
constexpr std::array<std::uint32_t, 64> round_constants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// The message length is appended as a 64-bit big-endian bit count.
constexpr std::size_t length_field_size = 8;

// Byte order is spelled out rather than taken from the host so the digest is the same on every
// machine.
std::uint32_t load_be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

void store_be32(std::uint8_t* p, std::uint32_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}

std::uint32_t big_sigma0(std::uint32_t x) noexcept { return std::rotr(x, 2) ^ std::rotr(x, 13) ^ std::rotr(x, 22); }
std::uint32_t big_sigma1(std::uint32_t x) noexcept { return std::rotr(x, 6) ^ std::rotr(x, 11) ^ std::rotr(x, 25); }
std::uint32_t small_sigma0(std::uint32_t x) noexcept { return std::rotr(x, 7) ^ std::rotr(x, 18) ^ (x >> 3); }
std::uint32_t small_sigma1(std::uint32_t x) noexcept { return std::rotr(x, 17) ^ std::rotr(x, 19) ^ (x >> 10); }
std::uint32_t choose(std::uint32_t x, std::uint32_t y, std::uint32_t z) noexcept { return (x & y) ^ (~x & z); }
std::uint32_t majority(std::uint32_t x, std::uint32_t y, std::uint32_t z) noexcept { return (x & y) ^ (x & z) ^ (y & z); }

// Keeps the compiler from reasoning about `value` between iterations, so it cannot turn an
// accumulate-everything loop into one that stops once the answer is known.
void opaque(std::uint8_t& value) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __asm__ volatile("" : "+r"(value));
#else
  volatile std::uint8_t sink = value;
  value = sink;
#endif
}

}  // namespace

void sha256_hasher::reset() noexcept {
  state_ = initial_state;
  pending_size_ = 0;
  total_bytes_ = 0;
}

void sha256_hasher::compress_blocks(const std::uint8_t* blocks, std::size_t block_count) noexcept {
  std::array<std::uint32_t, 64> schedule;  // W_0..W_63 of FIPS 180-4 §6.2.2
  for (std::size_t block = 0; block < block_count; ++block) {
    const std::uint8_t* words = blocks + block * sha256_block_size;
    for (std::size_t t = 0; t < 16; ++t) schedule[t] = load_be32(words + 4 * t);
    for (std::size_t t = 16; t < 64; ++t) {
      schedule[t] = small_sigma1(schedule[t - 2]) + schedule[t - 7] + small_sigma0(schedule[t - 15]) +
                    schedule[t - 16];
    }

    std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (std::size_t t = 0; t < 64; ++t) {
      const std::uint32_t t1 = h + big_sigma1(e) + choose(e, f, g) + round_constants[t] + schedule[t];
      const std::uint32_t t2 = big_sigma0(a) + majority(a, b, c);
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
  }
}

void sha256_hasher::update(std::span<const std::byte> data) noexcept {
  if (data.empty()) return;
  const auto* in = reinterpret_cast<const std::uint8_t*>(data.data());
  std::size_t remaining = data.size();
  total_bytes_ += remaining;

  if (pending_size_ > 0) {
    const std::size_t take = std::min(remaining, sha256_block_size - pending_size_);
    std::memcpy(pending_.data() + pending_size_, in, take);
    pending_size_ += take;
    in += take;
    remaining -= take;
    if (pending_size_ < sha256_block_size) return;
    compress_blocks(pending_.data(), 1);
    pending_size_ = 0;
  }

  // Whole blocks are hashed straight from the caller's memory; only a tail is copied.
  const std::size_t whole_blocks = remaining / sha256_block_size;
  compress_blocks(in, whole_blocks);
  in += whole_blocks * sha256_block_size;
  remaining -= whole_blocks * sha256_block_size;

  if (remaining > 0) {
    std::memcpy(pending_.data(), in, remaining);
    pending_size_ = remaining;
  }
}

void sha256_hasher::update(std::string_view data) noexcept {
  update(std::as_bytes(std::span<const char>(data.data(), data.size())));
}

sha256_digest sha256_hasher::finish() noexcept {
  const std::uint64_t bit_length = total_bytes_ * 8;

  // FIPS 180-4 §5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the 64-bit length.
  pending_[pending_size_++] = 0x80;
  if (pending_size_ > sha256_block_size - length_field_size) {
    std::memset(pending_.data() + pending_size_, 0, sha256_block_size - pending_size_);
    compress_blocks(pending_.data(), 1);
    pending_size_ = 0;
  }
  std::memset(pending_.data() + pending_size_, 0, sha256_block_size - length_field_size - pending_size_);
  for (std::size_t i = 0; i < length_field_size; ++i) {
    pending_[sha256_block_size - 1 - i] = static_cast<std::uint8_t>(bit_length >> (8 * i));
  }
  compress_blocks(pending_.data(), 1);

  sha256_digest digest;
  for (std::size_t i = 0; i < state_.size(); ++i) store_be32(digest.data() + 4 * i, state_[i]);
  reset();
  return digest;
}

sha256_digest sha256(std::span<const std::byte> data) noexcept {
  sha256_hasher hasher;
  hasher.update(data);
  return hasher.finish();
}

sha256_digest sha256(std::string_view data) noexcept {
  sha256_hasher hasher;
  hasher.update(data);
  return hasher.finish();
}

std::string to_hex(const sha256_digest& digest) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex(2 * digest.size(), '\0');
  for (std::size_t i = 0; i < digest.size(); ++i) {
    hex[2 * i] = digits[digest[i] >> 4];
    hex[2 * i + 1] = digits[digest[i] & 0x0f];
  }
  return hex;
}

bool constant_time_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept {
  if (a.size() != b.size()) return false;
  std::uint8_t difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<std::uint8_t>(a[i] ^ b[i]);
    opaque(difference);
  }
  return difference == 0;
}

bool constant_time_equal(std::string_view a, std::string_view b) noexcept {
  return constant_time_equal(std::span(reinterpret_cast<const std::uint8_t*>(a.data()), a.size()),
                             std::span(reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
}

}  // namespace edge
