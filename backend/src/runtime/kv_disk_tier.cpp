#include "edge/backend/runtime/kv_disk_tier.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/format.h"
#include "edge/common/splitmix64.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

constexpr char file_magic[8] = {'E', 'D', 'G', 'E', 'K', 'V', 'B', '1'};
constexpr std::uint32_t file_version = 1;
constexpr std::string_view block_suffix = ".kvb";
constexpr std::string_view temporary_marker = ".tmp";
// A tenant's name is stored with its blocks (for its cap after a restart); names are ids, short.
constexpr std::size_t max_tenant_length = 1024;

// Every field little-endian, in this order, with no padding: 96 bytes.
struct block_file_header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t tenant_length;   // bytes of the name after the header
  std::uint8_t identity[32];     // kv_block_identity
  std::uint8_t hash[32];         // the block's chain hash (also the file's name)
  std::uint64_t payload_bytes;   // the packed block after the name
  std::uint64_t checksum;        // kv_block_checksum of name then block, seeded with the hash
};
constexpr std::size_t header_bytes = 8 + 4 + 4 + 32 + 32 + 8 + 8;

void put_u32(std::byte* at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}
void put_u64(std::byte* at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}
std::uint32_t get_u32(const std::byte* at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(at[i]);
  return v;
}
std::uint64_t get_u64(const std::byte* at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(at[i]);
  return v;
}

std::array<std::byte, header_bytes> encode_header(const block_file_header& h) {
  std::array<std::byte, header_bytes> out{};
  std::byte* p = out.data();
  std::memcpy(p, h.magic, 8);
  put_u32(p + 8, h.version);
  put_u32(p + 12, h.tenant_length);
  std::memcpy(p + 16, h.identity, 32);
  std::memcpy(p + 48, h.hash, 32);
  put_u64(p + 80, h.payload_bytes);
  put_u64(p + 88, h.checksum);
  return out;
}

block_file_header decode_header(const std::byte* p) {
  block_file_header h{};
  std::memcpy(h.magic, p, 8);
  h.version = get_u32(p + 8);
  h.tenant_length = get_u32(p + 12);
  std::memcpy(h.identity, p + 16, 32);
  std::memcpy(h.hash, p + 48, 32);
  h.payload_bytes = get_u64(p + 80);
  h.checksum = get_u64(p + 88);
  return h;
}

std::optional<block_hash> parse_hex_hash(std::string_view text) {
  block_hash h{};
  if (text.size() != h.size() * 2) return std::nullopt;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < h.size(); ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    h[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return h;
}

std::uint64_t checksum_of(const block_hash& hash, std::string_view tenant, std::span<const std::byte> payload) {
  std::uint64_t seed = 0;
  std::memcpy(&seed, hash.data(), sizeof seed);
  const std::uint64_t name = kv_block_checksum(std::as_bytes(std::span(tenant)), seed);
  return kv_block_checksum(payload, name);
}

struct file_closer {
  void operator()(std::FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};
using file_handle = std::unique_ptr<std::FILE, file_closer>;

}  // namespace

std::uint64_t kv_block_checksum(std::span<const std::byte> data, std::uint64_t seed) {
  // Four independent lanes over 32-byte stripes, each word multiplied in and rotated (the shape
  // of the fast non-cryptographic hashes), then the tail byte by byte and a final mix.
  constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ull;
  constexpr std::uint64_t p2 = 0xC2B2AE3D27D4EB4Full;
  std::uint64_t lanes[4] = {seed + p1 + p2, seed + p2, seed, seed - p1};
  const std::byte* p = data.data();
  const std::size_t n = data.size();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      std::uint64_t word = 0;
      std::memcpy(&word, p + i + 8 * static_cast<std::size_t>(k), sizeof word);
      lanes[k] = std::rotl(lanes[k] + word * p2, 31) * p1;
    }
  }
  std::uint64_t h = std::rotl(lanes[0], 1) + std::rotl(lanes[1], 7) + std::rotl(lanes[2], 12) + std::rotl(lanes[3], 18);
  for (; i < n; ++i) h = std::rotl((h ^ static_cast<std::uint64_t>(p[i])) * p1, 11);
  std::uint64_t state = h ^ static_cast<std::uint64_t>(n);
  return splitmix64(state);
}

sha256_digest kv_block_identity(const model& m, const kv_cache_layout& layout) {
  sha256_hasher hasher;
  const model_config& c = m.config;
  hasher.update(format("edgeinfer kv block identity 1\narch {}\nvocab {} hidden {} inter {} layers {} heads {} kv {} "
                       "head_dim {} eps {} theta {} rotary {} moe {} mla {} dsa {}\n",
                       to_string(c.arch), c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                       c.num_kv_heads, c.head_dim, c.rms_norm_eps, c.rope_theta, c.rotary_dim, c.moe.has_value(),
                       c.mla.has_value(), c.dsa.has_value()));
  hasher.update(format("kv {} block {} rows {}x{}x{}+{}\n", kernels::to_string(layout.dtype), layout.block_size,
                       layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.value_dim));
  // How the weights were converted on load changes every K and V computed from them.
  if (!m.weights.layers.empty()) {
    const weight_matrix& w = m.weights.layers.front().wq.present() ? m.weights.layers.front().wq
                                                                   : m.weights.layers.front().wk;
    hasher.update(format("projection {} group {} layout {}\n", kernels::to_string(w.format), w.group_size,
                         static_cast<int>(w.layout)));
  }
  // The weights themselves: each file's size and pages sampled through it (a different
  // checkpoint of the same shapes differs there), and the leading bytes of the embedding.
  constexpr std::size_t samples = 16;
  constexpr std::size_t sample_bytes = 4096;
  const auto sample = [&](std::span<const std::byte> bytes) {
    hasher.update(format("bytes {}\n", bytes.size()));
    if (bytes.empty()) return;
    for (std::size_t k = 0; k < samples; ++k) {
      const std::size_t at = bytes.size() > sample_bytes ? (bytes.size() - sample_bytes) / (samples - 1) * k : 0;
      hasher.update(bytes.subspan(at, std::min(sample_bytes, bytes.size() - at)));
    }
  };
  for (const auto& file : m.files) sample(file->bytes());
  if (m.weights.token_embedding.present()) {
    sample(std::span(m.weights.token_embedding.data, m.weights.token_embedding.bytes()));
  }
  return hasher.finish();
}

std::size_t kv_disk_tier::hash_of_digest::operator()(const block_hash& h) const noexcept {
  std::size_t value = 0;
  std::memcpy(&value, h.data(), sizeof(value));
  return value;
}

kv_disk_tier::kv_disk_tier(const kv_disk_tier_options& options, std::filesystem::path folder)
    : options_(options), folder_(std::move(folder)) {}

result<std::unique_ptr<kv_disk_tier>> kv_disk_tier::open(const kv_disk_tier_options& options) {
  if (options.block_bytes == 0) return invalid_argument("a disk tier of empty blocks");
  if (options.capacity_bytes <= 0) return invalid_argument("a disk tier needs a positive size");
  // A short prefix of the identity names the folder: enough to keep models apart; the header
  // holds the whole identity.
  const fs::path folder = options.directory / to_hex(options.identity).substr(0, 16);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return unavailable(format("cannot create the KV disk cache folder {}: {}", folder.string(), ec.message()));
  std::unique_ptr<kv_disk_tier> tier(new kv_disk_tier(options, folder));
  EDGE_RETURN_IF_ERROR(tier->scan());
  tier->writer_ = std::thread([t = tier.get()] { t->run_writer(); });
  return tier;
}

kv_disk_tier::~kv_disk_tier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::int64_t kv_disk_tier::file_bytes(std::size_t tenant_length) const {
  return static_cast<std::int64_t>(header_bytes + tenant_length + options_.block_bytes);
}

fs::path kv_disk_tier::path_of(const block_hash& hash) const {
  return folder_ / (to_hex(hash) + std::string(block_suffix));
}

result<kv_disk_tier::file_header> kv_disk_tier::read_header(std::FILE* file, const block_hash& hash,
                                                            std::int64_t file_size) const {
  std::array<std::byte, header_bytes> raw{};
  if (std::fread(raw.data(), 1, raw.size(), file) != raw.size()) return data_loss("shorter than a header");
  const block_file_header h = decode_header(raw.data());
  if (std::memcmp(h.magic, file_magic, sizeof file_magic) != 0 || h.version != file_version) {
    return data_loss("not a block file of this version");
  }
  if (std::memcmp(h.identity, options_.identity.data(), 32) != 0) return data_loss("a block of another model or layout");
  if (std::memcmp(h.hash, hash.data(), 32) != 0) return data_loss("holds another block");
  if (h.tenant_length > max_tenant_length || h.payload_bytes != options_.block_bytes) {
    return data_loss("sizes are not this layout's");
  }
  if (file_size != file_bytes(h.tenant_length)) return data_loss("truncated or extended");
  file_header out{.tenant = std::string(h.tenant_length, '\0'), .checksum = h.checksum};
  if (std::fread(out.tenant.data(), 1, out.tenant.size(), file) != out.tenant.size()) return data_loss("truncated");
  return out;
}

status kv_disk_tier::scan() {
  struct found {
    block_hash hash;
    std::string tenant;
    std::int64_t bytes;
    fs::file_time_type time;
  };
  std::vector<found> files;
  std::error_code ec;
  fs::directory_iterator it(folder_, ec);
  if (ec) return unavailable(format("cannot read the KV disk cache folder {}: {}", folder_.string(), ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return unavailable(format("cannot read the KV disk cache folder {}: {}", folder_.string(), ec.message()));
    const fs::path path = it->path();
    const std::string name = path.filename().string();
    // A write that a crash interrupted.
    if (name.find(temporary_marker) != std::string::npos) {
      fs::remove(path, ec);
      continue;
    }
    if (!name.ends_with(block_suffix)) continue;  // not ours: left alone
    const auto hash = parse_hex_hash(std::string_view(name).substr(0, name.size() - block_suffix.size()));
    const auto size = static_cast<std::int64_t>(it->file_size(ec));
    std::optional<std::string> tenant;
    if (hash && !ec) {
      file_handle f(std::fopen(path.c_str(), "rb"));
      if (f) {
        auto header = read_header(f.get(), *hash, size);
        if (header.ok()) tenant = std::move(header).value().tenant;
      }
    }
    if (!tenant) {
      fs::remove(path, ec);
      ++counters_.rejected;
      continue;
    }
    files.push_back({*hash, std::move(*tenant), size, it->last_write_time(ec)});
  }
  std::sort(files.begin(), files.end(), [](const found& a, const found& b) { return a.time < b.time; });
  std::lock_guard lock(mutex_);
  for (found& f : files) index(f.hash, std::move(f.tenant), f.bytes, nullptr);
  // A smaller size than the last run's: the oldest go.
  while (used_bytes_ > options_.capacity_bytes && !lru_.empty()) {
    forget(lru_.front(), true);
    ++counters_.evicted;
  }
  // The removals queued above run once the writer starts.
  return {};
}

void kv_disk_tier::index(const block_hash& hash, std::string tenant, std::int64_t bytes,
                         std::shared_ptr<const std::vector<std::byte>> pending) {
  tenant_files& t = tenants_[tenant];
  entry e{.tenant = std::move(tenant), .bytes = bytes, .pending = std::move(pending)};
  e.lru = lru_.insert(lru_.end(), hash);
  e.tenant_lru = t.lru.insert(t.lru.end(), hash);
  t.bytes += bytes;
  used_bytes_ += bytes;
  index_.emplace(hash, std::move(e));
}

void kv_disk_tier::forget(block_hash hash, bool remove_file) {
  const auto it = index_.find(hash);
  if (it == index_.end()) return;
  entry& e = it->second;
  lru_.erase(e.lru);
  const auto t = tenants_.find(e.tenant);
  t->second.lru.erase(e.tenant_lru);
  t->second.bytes -= e.bytes;
  if (t->second.lru.empty()) tenants_.erase(t);
  used_bytes_ -= e.bytes;
  index_.erase(it);
  if (remove_file) {
    queue_.push_back({.write = false, .hash = hash});
    changed_.notify_all();
  }
}

void kv_disk_tier::touch(entry& e) {
  lru_.splice(lru_.end(), lru_, e.lru);
  tenant_files& t = tenants_.at(e.tenant);
  t.lru.splice(t.lru.end(), t.lru, e.tenant_lru);
}

bool kv_disk_tier::contains(const block_hash& hash) const {
  std::lock_guard lock(mutex_);
  return index_.contains(hash);
}

bool kv_disk_tier::put(const block_hash& hash, std::string_view tenant, std::int64_t cap,
                       std::span<const std::byte> packed) {
  std::lock_guard lock(mutex_);
  if (const auto it = index_.find(hash); it != index_.end()) {
    touch(it->second);
    return true;
  }
  const std::int64_t bytes = file_bytes(tenant.size());
  if (packed.size() != options_.block_bytes || tenant.size() > max_tenant_length || bytes > cap ||
      bytes > options_.capacity_bytes || pending_bytes_ + packed.size() > options_.max_pending_bytes) {
    ++counters_.not_kept;
    return false;
  }
  // At its cap, a tenant makes room among its own files only; then anyone's, oldest first.
  const std::string name(tenant);
  for (auto t = tenants_.find(name); t != tenants_.end() && t->second.bytes + bytes > cap; t = tenants_.find(name)) {
    forget(t->second.lru.front(), true);
    ++counters_.evicted;
  }
  while (used_bytes_ + bytes > options_.capacity_bytes) {
    forget(lru_.front(), true);
    ++counters_.evicted;
  }
  auto data = std::make_shared<const std::vector<std::byte>>(packed.begin(), packed.end());
  index(hash, std::string(tenant), bytes, data);
  pending_bytes_ += packed.size();
  queue_.push_back({.write = true, .hash = hash, .tenant = std::string(tenant), .data = std::move(data)});
  changed_.notify_all();
  return true;
}

bool kv_disk_tier::get(const block_hash& hash, std::span<std::byte> packed) {
  std::shared_ptr<const std::vector<std::byte>> pending;
  {
    std::lock_guard lock(mutex_);
    const auto it = index_.find(hash);
    if (it == index_.end() || packed.size() != options_.block_bytes) return false;
    touch(it->second);
    pending = it->second.pending;
  }
  if (pending) {
    std::memcpy(packed.data(), pending->data(), packed.size());
    std::lock_guard lock(mutex_);
    ++counters_.read;
    return true;
  }
  // The writer never rewrites an indexed block, and only this thread removes entries: the file
  // stays what it is while it is read.
  const fs::path path = path_of(hash);
  bool whole = false;
  {
    std::error_code ec;
    const auto size = static_cast<std::int64_t>(fs::file_size(path, ec));
    file_handle f(ec ? nullptr : std::fopen(path.c_str(), "rb"));
    if (f) {
      const auto header = read_header(f.get(), hash, size);
      whole = header.ok() && std::fread(packed.data(), 1, packed.size(), f.get()) == packed.size() &&
              header.value().checksum == checksum_of(hash, header.value().tenant, packed);
    }
  }
  std::lock_guard lock(mutex_);
  if (!whole) {
    forget(hash, true);
    ++counters_.rejected;
    return false;
  }
  ++counters_.read;
  return true;
}

bool kv_disk_tier::write_file(const operation& op) const {
  const fs::path path = path_of(op.hash);
  const fs::path temporary = path.string() + std::string(temporary_marker);
  block_file_header h{};
  std::memcpy(h.magic, file_magic, sizeof file_magic);
  h.version = file_version;
  h.tenant_length = static_cast<std::uint32_t>(op.tenant.size());
  std::memcpy(h.identity, options_.identity.data(), 32);
  std::memcpy(h.hash, op.hash.data(), 32);
  h.payload_bytes = op.data->size();
  h.checksum = checksum_of(op.hash, op.tenant, *op.data);
  const auto raw = encode_header(h);
  bool ok = false;
  {
    file_handle f(std::fopen(temporary.c_str(), "wb"));
    ok = f && std::fwrite(raw.data(), 1, raw.size(), f.get()) == raw.size() &&
         std::fwrite(op.tenant.data(), 1, op.tenant.size(), f.get()) == op.tenant.size() &&
         std::fwrite(op.data->data(), 1, op.data->size(), f.get()) == op.data->size() && std::fflush(f.get()) == 0;
  }
  std::error_code ec;
  if (ok) fs::rename(temporary, path, ec);
  if (!ok || ec) {
    fs::remove(temporary, ec);
    return false;
  }
  return true;
}

void kv_disk_tier::run_writer() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, with everything done
    operation op = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    bool ok = true;
    std::error_code ec;
    if (op.write) {
      ok = write_file(op);
    } else {
      fs::remove(path_of(op.hash), ec);
    }
    lock.lock();
    writing_ = false;
    if (op.write) {
      pending_bytes_ -= op.data->size();
      const auto it = index_.find(op.hash);
      // Still the block queued (not forgotten, nor forgotten and put again meanwhile).
      if (it != index_.end() && it->second.pending == op.data) {
        if (ok) {
          it->second.pending.reset();
        } else {
          forget(op.hash, false);
        }
      }
      ++(ok ? counters_.written : counters_.write_failures);
    }
    changed_.notify_all();
  }
}

void kv_disk_tier::flush() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

std::int64_t kv_disk_tier::used_bytes() const {
  std::lock_guard lock(mutex_);
  return used_bytes_;
}

std::int64_t kv_disk_tier::blocks() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(index_.size());
}

std::int64_t kv_disk_tier::used_by(std::string_view tenant) const {
  std::lock_guard lock(mutex_);
  const auto it = tenants_.find(std::string(tenant));
  return it == tenants_.end() ? 0 : it->second.bytes;
}

kv_disk_tier_counters kv_disk_tier::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace edge::backend
