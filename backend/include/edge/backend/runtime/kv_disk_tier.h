// The disk tier of the prefix cache: full KV blocks written through from the host tier to files
// in a local folder, under the same tenant-salted chain hashes (kv_block_pool.h), so that they
// outlive host memory and restarts. kv_tiers.h decides what goes where; this class keeps the
// files.
//
// Files. The folder given holds one subfolder per identity (kv_block_identity: the model's
// weights, its configuration and the KV layout), so that two models, or two KV dtypes, never
// read each other's blocks. A block is one file, <hash in hex>.kvb:
//
//   header (block_file_header, little-endian), the tenant's name, the packed block
//
// The header names the identity and the hash, the sizes, and a checksum of the name and the
// block. Writes go to a temporary file renamed into place, so a file is whole or absent; a
// crash may still leave a short or torn file, and a file may be damaged later: every read checks
// the identity, the hash, the sizes and the checksum, and a file that fails is removed, never
// served. At open, the files are indexed from their headers (oldest first by modification
// time), and files that are not whole blocks of this identity are removed.
//
// Space. The files take at most `capacity_bytes`; beyond it the least recently used go. Each
// tenant may hold at most its cap of bytes: at its cap a tenant's new block replaces its own
// least recently used one, never another tenant's.
//
// Threads. put() and get() are called by one thread (the engine's); writing and removing files
// happen on a writer thread of the tier's own, in the order asked, so that the engine never
// waits for a write. A block queued and not yet written is served from its queued copy. The
// queue holds at most `max_pending_bytes` of blocks: beyond it a block is not kept (counted).
// Reads are synchronous on the calling thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/common/sha256.h"
#include "edge/common/status.h"

namespace edge::backend {

struct model;
struct kv_cache_layout;

// What a cached block's bytes depend on: the model's configuration, its weights (their sizes and
// bytes sampled through every file, and how they were converted on load), and the KV layout
// (dtype, block size, rows). Blocks of another identity are foreign.
sha256_digest kv_block_identity(const model& m, const kv_cache_layout& layout);

// A fast checksum of a block file's contents (not cryptographic: it finds damage, not forgery;
// whoever can write the folder can write any block).
std::uint64_t kv_block_checksum(std::span<const std::byte> data, std::uint64_t seed);

struct kv_disk_tier_options {
  std::filesystem::path directory;
  std::int64_t capacity_bytes = 0;  // the files' bytes at most, headers included
  sha256_digest identity{};
  std::size_t block_bytes = 0;      // one packed block (kv_cache_layout::bytes_per_block)
  std::size_t max_pending_bytes = std::size_t{64} << 20;
};

struct kv_disk_tier_counters {
  std::int64_t written = 0;         // blocks written to files
  std::int64_t write_failures = 0;  // writes that failed (the block is forgotten)
  std::int64_t not_kept = 0;        // blocks put() did not keep: queue full, or a cap under one block
  std::int64_t read = 0;            // blocks get() returned
  std::int64_t rejected = 0;        // files found short, damaged or foreign, and removed
  std::int64_t evicted = 0;         // files removed to stay within the capacity or a tenant's cap
};

class kv_disk_tier {
 public:
  static constexpr std::int64_t unlimited = std::numeric_limits<std::int64_t>::max();

  // Creates the identity's folder when needed and indexes its files. invalid_argument for an
  // empty block or capacity; io errors (unavailable) when the folder cannot be made or read.
  static result<std::unique_ptr<kv_disk_tier>> open(const kv_disk_tier_options& options);
  // Finishes the queued writes.
  ~kv_disk_tier();
  kv_disk_tier(const kv_disk_tier&) = delete;
  kv_disk_tier& operator=(const kv_disk_tier&) = delete;

  bool contains(const block_hash& hash) const;
  // Keeps `packed` (copied now) as the block `hash` of `tenant`, whose files may take at most
  // `cap` bytes. False when it is not kept. A block already kept is only made recent.
  bool put(const block_hash& hash, std::string_view tenant, std::int64_t cap, std::span<const std::byte> packed);
  // Reads the block `hash` into `packed` (block_bytes). False when it is not here, or its file
  // is not a whole, intact block of this identity and hash (the file is then removed).
  bool get(const block_hash& hash, std::span<std::byte> packed);

  std::int64_t used_bytes() const;
  std::int64_t blocks() const;
  std::int64_t used_by(std::string_view tenant) const;
  std::int64_t capacity_bytes() const { return options_.capacity_bytes; }
  std::size_t block_bytes() const { return options_.block_bytes; }
  // A block file's bytes for a tenant's name of `tenant_length` bytes.
  std::int64_t file_bytes(std::size_t tenant_length) const;
  const std::filesystem::path& folder() const { return folder_; }
  std::filesystem::path path_of(const block_hash& hash) const;
  kv_disk_tier_counters counters() const;

  // Waits until every queued write and removal is done.
  void flush();

 private:
  struct entry {
    std::string tenant;
    std::int64_t bytes = 0;
    std::list<block_hash>::iterator lru;         // in lru_
    std::list<block_hash>::iterator tenant_lru;  // in its tenant's list
    // The block's bytes while its write is queued; null once written.
    std::shared_ptr<const std::vector<std::byte>> pending;
  };
  struct tenant_files {
    std::int64_t bytes = 0;
    std::list<block_hash> lru;  // least recently used first
  };
  struct operation {
    bool write = false;  // else remove
    block_hash hash{};
    std::string tenant;
    std::shared_ptr<const std::vector<std::byte>> data;
  };
  struct hash_of_digest {
    std::size_t operator()(const block_hash& h) const noexcept;
  };

  explicit kv_disk_tier(const kv_disk_tier_options& options, std::filesystem::path folder);
  status scan();
  // The caller holds mutex_.
  void index(const block_hash& hash, std::string tenant, std::int64_t bytes,
             std::shared_ptr<const std::vector<std::byte>> pending);
  // By value: callers pass list elements that forget() erases.
  void forget(block_hash hash, bool remove_file);
  void touch(entry& e);
  void run_writer();
  bool write_file(const operation& op) const;
  struct file_header {
    std::string tenant;
    std::uint64_t checksum = 0;
  };
  // The header and name of a block file of `file_size` bytes, read from its start, or why they
  // are not those of a whole block of this identity and `hash` (data_loss).
  result<file_header> read_header(std::FILE* file, const block_hash& hash, std::int64_t file_size) const;

  const kv_disk_tier_options options_;
  const std::filesystem::path folder_;

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::unordered_map<block_hash, entry, hash_of_digest> index_;
  std::list<block_hash> lru_;  // least recently used first
  std::unordered_map<std::string, tenant_files> tenants_;
  std::int64_t used_bytes_ = 0;
  std::deque<operation> queue_;
  std::size_t pending_bytes_ = 0;
  bool writing_ = false;  // the writer is working on an operation taken off the queue
  bool stopping_ = false;
  kv_disk_tier_counters counters_;
  std::thread writer_;  // last: started once everything above exists
};

}  // namespace edge::backend
