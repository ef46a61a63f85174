// SHA-256 (FIPS 180-4) and a constant-time comparison, with no dependency beyond the standard
// library so that every binary, the bare-CUDA test binaries included, can hash.
//
// Uses: API-key secrets are stored and compared as SHA-256 digests; prefix-cache block keys
// chain a parent digest, a tenant salt and a block's token ids.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace edge {

inline constexpr std::size_t sha256_digest_size = 32;
inline constexpr std::size_t sha256_block_size = 64;

using sha256_digest = std::array<std::uint8_t, sha256_digest_size>;

// Incremental SHA-256. Feed bytes with update() in any split; finish() gives the digest of
// everything fed since construction (or the previous finish()) and leaves the hasher ready for
// a new message. Not thread-safe: one hasher per thread or per message.
class sha256_hasher {
 public:
  sha256_hasher() noexcept { reset(); }

  void update(std::span<const std::byte> data) noexcept;
  void update(std::string_view data) noexcept;

  // Pads, returns the digest, and resets.
  sha256_digest finish() noexcept;

  // Forgets everything fed so far.
  void reset() noexcept;

 private:
  void compress_blocks(const std::uint8_t* blocks, std::size_t block_count) noexcept;

  std::array<std::uint32_t, 8> state_{};
  std::array<std::uint8_t, sha256_block_size> pending_{};  // a partial block awaiting more input
  std::size_t pending_size_ = 0;
  std::uint64_t total_bytes_ = 0;
};

sha256_digest sha256(std::span<const std::byte> data) noexcept;
sha256_digest sha256(std::string_view data) noexcept;

// 64 lower-case hex digits.
std::string to_hex(const sha256_digest& digest);

// Equality whose running time depends only on the two lengths, never on where the contents
// first differ, so comparing a presented secret's digest with a stored one leaks nothing by
// timing. Inputs of different lengths are unequal (the lengths are not secret).
bool constant_time_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept;
bool constant_time_equal(std::string_view a, std::string_view b) noexcept;

}  // namespace edge
