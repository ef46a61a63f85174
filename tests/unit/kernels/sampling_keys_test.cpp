// The CUDA sampler's radix selection (sampling_keys.h), run on the host over the same keys and
// checked against the sorted order the CPU sampler uses.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/sampling/sampling_keys.h"

namespace {

namespace keys = edge::kernels::sampling_keys;

// The passes of the selection over a host row, one loop per pass as the device does it.
struct host_passes {
  std::span<const float> row;
  bool mass = false;  // weight: the value's fixed-point mass, or 1 per item
  std::array<std::uint64_t, keys::radix_bins> weights{};
  std::array<std::uint32_t, keys::radix_bins> counts{};
  int passes_run = 0;

  void histogram(bool low_half, std::uint32_t hi, std::uint32_t lo, int level) {
    ++passes_run;
    weights.fill(0);
    counts.fill(0);
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (std::isnan(row[i])) continue;
      const std::uint32_t h = keys::ordered_bits(row[i]);
      std::uint32_t key = h;
      if (!low_half) {
        if (!keys::matches(h, hi, level)) continue;
      } else {
        key = keys::id_key(static_cast<std::int64_t>(i));
        if (h != hi || !keys::matches(key, lo, level)) continue;
      }
      const int d = keys::digit(key, level);
      weights[static_cast<std::size_t>(d)] += mass ? keys::fixed_mass(row[i]) : 1u;
      ++counts[static_cast<std::size_t>(d)];
    }
  }
  std::uint64_t total() const {
    std::uint64_t t = 0;
    for (const std::uint64_t w : weights) t += w;
    return t;
  }
  std::uint32_t count(int d) const { return counts[static_cast<std::size_t>(d)]; }
  keys::digit_choice choose(std::uint64_t above, std::uint64_t threshold, keys::passes p) const {
    return keys::choose_digit(weights.data(), above, threshold, p);
  }
  std::uint32_t only_key(std::uint32_t hi) {
    ++passes_run;
    std::uint32_t found = 0;
    int seen = 0;
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (!std::isnan(row[i]) && keys::ordered_bits(row[i]) == hi) {
        found = keys::id_key(static_cast<std::int64_t>(i));
        ++seen;
      }
    }
    CHECK(seen == 1);
    return found;
  }
};

// The reference: sort the kept items as the CPU does (larger value first, lower id first among
// equals) and walk the cumulative weight to the first item that passes.
keys::boundary sorted_boundary(std::span<const float> row, bool mass, std::uint64_t threshold, keys::passes p) {
  struct item {
    float value;
    std::int32_t id;
  };
  std::vector<item> items;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (!std::isnan(row[i])) items.push_back({row[i], static_cast<std::int32_t>(i)});
  }
  std::sort(items.begin(), items.end(),
            [](const item& a, const item& b) { return a.value > b.value || (a.value == b.value && a.id < b.id); });
  if (p == keys::passes::at_least && threshold == 0) threshold = 1;
  std::uint64_t cumulative = 0;
  for (const item& x : items) {
    cumulative += mass ? keys::fixed_mass(x.value) : 1u;
    if (keys::passes_threshold(cumulative, threshold, p)) {
      return {.hi = keys::ordered_bits(x.value), .lo = keys::id_key(x.id), .found = true};
    }
  }
  return {};
}

struct fixed_threshold {
  std::uint64_t value;
  std::uint64_t operator()(std::uint64_t) const { return value; }
};

void check_same(std::span<const float> row, bool mass, std::uint64_t threshold, keys::passes p,
                const std::string& what) {
  CAPTURE(what);
  CAPTURE(threshold);
  host_passes ops{.row = row, .mass = mass};
  const keys::boundary got = keys::find_boundary(ops, fixed_threshold{threshold}, p);
  const keys::boundary want = sorted_boundary(row, mass, threshold, p);
  REQUIRE(got.found == want.found);
  if (want.found) {
    CHECK(got.hi == want.hi);
    CHECK(got.lo == want.lo);
  }
  // 4 passes for the value, then 1 for a unique one or 4 for tied ids.
  CHECK(ops.passes_run <= 2 * keys::radix_levels);
}

// Rows of several kinds: spread values, heavy ties, signed zeros, NaNs (dropped items).
std::vector<std::vector<float>> logit_rows() {
  std::mt19937 rng(7);
  std::vector<std::vector<float>> rows;
  for (const std::size_t n : {1u, 2u, 54u, 97u, 1000u, 4096u}) {
    std::uniform_real_distribution<float> spread(-6.0f, 6.0f);
    std::vector<float> row(n);
    for (float& v : row) v = spread(rng);
    rows.push_back(row);
    std::uniform_int_distribution<int> few(-2, 2);
    for (float& v : row) v = static_cast<float>(few(rng));
    rows.push_back(row);  // ties everywhere, and zeros
    for (std::size_t i = 0; i < n; ++i) row[i] = i % 3 == 0 ? -0.0f : (i % 3 == 1 ? 0.0f : std::nanf(""));
    rows.push_back(row);  // only zeros of both signs, and NaNs
    for (std::size_t i = 0; i < n; ++i) row[i] = i % 5 == 0 ? std::nanf("") : spread(rng);
    row[0] = -std::numeric_limits<float>::infinity();
    rows.push_back(row);
  }
  return rows;
}

// Probability rows: a softmax of spread logits, with exact zeros, denormals and ties.
std::vector<std::vector<float>> probability_rows() {
  std::vector<std::vector<float>> rows;
  for (auto logits : logit_rows()) {
    float max_value = -std::numeric_limits<float>::infinity();
    for (const float v : logits) {
      if (!std::isnan(v)) max_value = std::max(max_value, v);
    }
    if (!std::isfinite(max_value)) continue;
    double total = 0.0;
    for (float& v : logits) {
      if (std::isnan(v)) continue;
      v = std::exp(4.0f * (v - max_value));  // sharp, so that the tail underflows
      total += v;
    }
    for (float& v : logits) v = static_cast<float>(v / total);
    if (logits.size() > 3) {
      logits[1] = 0.0f;
      logits[2] = std::numeric_limits<float>::denorm_min();
    }
    rows.push_back(logits);
  }
  return rows;
}

}  // namespace

TEST_CASE("ordered bits follow the float order and give -0.0 and +0.0 one key") {
  const std::vector<float> ascending = {-std::numeric_limits<float>::infinity(), -3.5f, -1.0f,
                                        -std::numeric_limits<float>::denorm_min(), 0.0f,
                                        std::numeric_limits<float>::denorm_min(), 1e-30f, 1.0f, 2.0f,
                                        std::numeric_limits<float>::infinity()};
  for (std::size_t i = 1; i < ascending.size(); ++i) {
    CAPTURE(ascending[i]);
    CHECK(keys::ordered_bits(ascending[i - 1]) < keys::ordered_bits(ascending[i]));
  }
  CHECK(keys::ordered_bits(-0.0f) == keys::ordered_bits(0.0f));
  CHECK(keys::id_key(3) > keys::id_key(4));
  CHECK(keys::id_of(keys::id_key(128255)) == 128255);
}

TEST_CASE("digits, prefixes and fixed-point masses") {
  CHECK(keys::digit(0xA1B2C3D4u, 0) == 0xA1);
  CHECK(keys::digit(0xA1B2C3D4u, 3) == 0xD4);
  CHECK(keys::matches(0xA1B2C3D4u, 0xA1B20000u, 2));
  CHECK_FALSE(keys::matches(0xA1B2C3D4u, 0xA1B30000u, 2));
  CHECK(keys::matches(0x12345678u, 0xFFFFFFFFu, 0));
  CHECK(keys::with_digit(0xA1000000u, 1, 0xB2) == 0xA1B20000u);
  CHECK(keys::fixed_mass(1.0) == std::uint64_t{1} << 62);
  CHECK(keys::fixed_mass(0.0) == 0);
  CHECK(keys::fixed_mass(-1.0) == 0);
  CHECK(keys::fixed_mass(std::nan("")) == 0);
  CHECK(keys::fixed_mass(0.25) == std::uint64_t{1} << 60);
  // Clamped, so that a threshold past the total mass cannot overflow (sums of probabilities
  // that add up to about 1 stay near 2^62).
  CHECK(keys::fixed_mass(3.0) == std::uint64_t{3} << 62);
  CHECK(keys::fixed_mass(1e30) == keys::fixed_mass(3.0));
}

TEST_CASE("choose_digit takes the largest digit whose weight from it on passes") {
  std::array<std::uint64_t, keys::radix_bins> bins{};
  bins[200] = 3;
  bins[100] = 5;
  bins[7] = 2;
  CHECK(keys::choose_digit(bins.data(), 0, 3, keys::passes::at_least).digit == 200);
  CHECK(keys::choose_digit(bins.data(), 0, 3, keys::passes::more_than).digit == 100);
  const keys::digit_choice c = keys::choose_digit(bins.data(), 1, 9, keys::passes::at_least);
  CHECK(c.digit == 100);
  CHECK(c.above == 4);
  CHECK(keys::choose_digit(bins.data(), 0, 11, keys::passes::at_least).digit == -1);
  CHECK(keys::choose_digit(bins.data(), 0, 10, keys::passes::at_least).digit == 7);
}

TEST_CASE("the radix selection finds the CPU's top-k boundary, ties by id included") {
  for (const auto& row : logit_rows()) {
    const auto n = static_cast<std::uint64_t>(row.size());
    for (const std::uint64_t k : {std::uint64_t{1}, std::uint64_t{2}, n / 2, n - 1, n, n + 1}) {
      check_same(row, false, k, keys::passes::at_least, "top-k of " + std::to_string(n));
    }
  }
}

TEST_CASE("the radix selection finds the CPU's top-p and draw boundaries in fixed-point mass") {
  for (const auto& row : probability_rows()) {
    const std::string size = std::to_string(row.size());
    for (const double top_p : {1e-20, 0.1, 0.5, 0.9, 0.999, 1.0, 1.5}) {
      check_same(row, true, keys::fixed_mass(top_p), keys::passes::at_least, "top-p of " + size);
    }
    host_passes totals{.row = row, .mass = true};
    totals.histogram(false, 0, 0, 0);
    const std::uint64_t kept = totals.total();
    for (const double uniform : {0.0, 1e-12, 0.3, 0.5, 0.999999}) {
      const auto target = static_cast<std::uint64_t>(uniform * static_cast<double>(kept));
      check_same(row, true, target, keys::passes::more_than, "draw of " + size);
    }
    // The draw's threshold from the total, as the device computes it in its first pass.
    host_passes ops{.row = row, .mass = true};
    const keys::boundary b =
        keys::find_boundary(ops, [](std::uint64_t t) { return static_cast<std::uint64_t>(0.5 * static_cast<double>(t)); },
                            keys::passes::more_than);
    const keys::boundary want =
        sorted_boundary(row, true, static_cast<std::uint64_t>(0.5 * static_cast<double>(kept)), keys::passes::more_than);
    CHECK(b.found == want.found);
    CHECK(b.lo == want.lo);
  }
}

TEST_CASE("items after the boundary are the ones the sorted order puts after it") {
  const keys::boundary b{.hi = keys::ordered_bits(1.0f), .lo = keys::id_key(5), .found = true};
  CHECK(keys::after(b, keys::ordered_bits(0.5f), keys::id_key(0)));
  CHECK(keys::after(b, keys::ordered_bits(1.0f), keys::id_key(6)));
  CHECK_FALSE(keys::after(b, keys::ordered_bits(1.0f), keys::id_key(5)));
  CHECK_FALSE(keys::after(b, keys::ordered_bits(1.0f), keys::id_key(4)));
  CHECK_FALSE(keys::after(b, keys::ordered_bits(2.0f), keys::id_key(9)));
}
