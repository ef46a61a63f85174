// The CPU matmul alone (kernels/matmul: run_matmul), per weight format, shape and token count:
// what a decode or prefill step's matrices cost without the rest of the forward pass.
//
//   edge_bench_matmul [--formats int4,int4-tiles,int8,bf16,bf16-tiles,f16,fp8,f32,...] [--shapes 2048x2048,2816x2048]
//                     [--tokens 1,4,8,16,64] [--threads 2] [--working-set-mib 256] [--seconds 0.5]
//                     [--int4-group-size 32]
//
// A format named with "-tiles" (int4-tiles, bf16-tiles, ...) is in CPU row tiles
// (weight_format.h), as a model loaded for the CPU executor holds it. Each shape N×K is an N-row matrix of K inputs. Enough distinct matrices of each shape are made
// to fill --working-set-mib of weights, and the calls cycle through them, so a working set larger
// than the last-level cache measures matmuls that stream their weights from memory, as decode
// does; a small one (e.g. 1) measures them from cache. Prints, per format, shape and token
// count, the median of several timed passes (and the range): microseconds per call, multiply-adds
// per second, weight bytes read per second, and the speed against the first format listed. The
// formats take turns pass by pass, so that a shared machine's drifting load slows them alike,
// and the ratio is the median of the passes' ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/thread_pool.h"
#include "edge/kernels/weight_format.h"
#include "kernels/matmul/cpu_tiles.h"
#include "kernels/matmul/matmul.h"

namespace {

using namespace edge::kernels;
using clock_type = std::chrono::steady_clock;

struct shape {
  std::int64_t n, k;
};

struct options {
  std::vector<std::string> formats = {"int4", "int8", "bf16"};
  std::vector<shape> shapes = {{2048, 2048}, {2816, 2048}, {2048, 1408}};
  std::vector<std::int64_t> tokens = {1, 4, 8, 16};
  std::size_t threads = 2;
  double working_set_mib = 256;
  double seconds = 0.5;
  std::int64_t group_size = 32;
};

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    if (comma > at) out.emplace_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: edge_bench_matmul [--formats int4,int8,bf16,f16,fp8,f32] [--shapes NxK,...] "
               "[--tokens 1,4,...] [--threads N] [--working-set-mib M] [--seconds S] [--int4-group-size G]\n");
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) usage();
    const char* value = argv[++i];
    if (flag == "--formats") {
      o.formats = split(value);
    } else if (flag == "--shapes") {
      o.shapes.clear();
      for (const std::string& s : split(value)) {
        const std::size_t x = s.find('x');
        if (x == std::string::npos) usage();
        o.shapes.push_back({std::atoll(s.substr(0, x).c_str()), std::atoll(s.substr(x + 1).c_str())});
      }
    } else if (flag == "--tokens") {
      o.tokens.clear();
      for (const std::string& s : split(value)) o.tokens.push_back(std::atoll(s.c_str()));
    } else if (flag == "--threads") {
      o.threads = static_cast<std::size_t>(std::atoll(value));
    } else if (flag == "--working-set-mib") {
      o.working_set_mib = std::atof(value);
    } else if (flag == "--seconds") {
      o.seconds = std::atof(value);
    } else if (flag == "--int4-group-size") {
      o.group_size = std::atoll(value);
    } else {
      usage();
    }
  }
  if (o.threads < 1) usage();
  return o;
}

bool tiles_named(std::string_view name) { return name.ends_with("-tiles"); }

weight_format format_named(std::string_view name) {
  if (tiles_named(name)) name.remove_suffix(std::string_view("-tiles").size());
  if (name == "int4") return weight_format::int4;
  if (name == "int8") return weight_format::int8;
  if (name == "bf16") return weight_format::bf16;
  if (name == "f16") return weight_format::f16;
  if (name == "fp8") return weight_format::fp8_e4m3;
  if (name == "f32") return weight_format::f32;
  usage();
}

// One matrix's storage: random bytes are valid codes of every format but the float ones, whose
// random bit patterns may be NaN; those get small random values.
struct matrix {
  std::vector<std::uint8_t> values;
  std::vector<float> scales;
  weight_view view;
};

matrix make_rows(weight_format f, shape s, std::int64_t group_size, std::mt19937& rng);

matrix make_matrix(weight_format f, bool tiles, shape s, std::int64_t group_size, std::mt19937& rng) {
  matrix rows = make_rows(f, s, group_size, rng);
  if (!tiles) return rows;
  matrix m;
  m.values.resize(static_cast<std::size_t>(cpu_tiles::values_bytes(f, s.n, s.k)));
  m.scales.resize(static_cast<std::size_t>(cpu_tiles::scale_count(f, s.n, s.k, rows.view.group_size)));
  m.view = rows.view;
  m.view.values = m.values.data();
  m.view.scales = m.scales.data();
  m.view.layout = weight_layout::cpu_tiles;
  const edge::status done = pack_cpu_tiles(rows.view, s.n, s.k, m.values.data(), m.scales.data());
  if (!done.ok()) {
    std::fprintf(stderr, "%s\n", done.message().c_str());
    std::exit(1);
  }
  return m;
}

matrix make_rows(weight_format f, shape s, std::int64_t group_size, std::mt19937& rng) {
  matrix m;
  m.values.resize(static_cast<std::size_t>(weight_values_bytes(f, s.n, s.k)));
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::int64_t group = f == weight_format::int8 ? int8_traits::group_size : group_size;
  if (f == weight_format::f32) {
    auto* v = reinterpret_cast<float*>(m.values.data());
    for (std::int64_t i = 0; i < s.n * s.k; ++i) v[i] = normal(rng);
  } else if (f == weight_format::bf16 || f == weight_format::f16) {
    auto* v = reinterpret_cast<std::uint16_t*>(m.values.data());
    // 0x3c00 ± a few: small finite numbers in both f16 and bf16 (bf16 0x3c00 is 2^-7).
    for (std::int64_t i = 0; i < s.n * s.k; ++i) v[i] = static_cast<std::uint16_t>(0x3c00 + byte(rng) - 128);
  } else if (f == weight_format::fp8_e4m3) {
    for (auto& b : m.values) b = static_cast<std::uint8_t>(byte(rng) & 0x77);  // finite codes
  } else {
    for (auto& b : m.values) b = static_cast<std::uint8_t>(byte(rng));
  }
  m.scales.resize(static_cast<std::size_t>(std::max<std::int64_t>(weight_scale_count(f, s.n, s.k, group), 1)));
  for (float& x : m.scales) x = 0.01f + 0.001f * static_cast<float>(byte(rng));
  m.view = {.format = f,
            .values = m.values.data(),
            .scales = has_scales(f) ? m.scales.data() : nullptr,
            .group_size = f == weight_format::int4 ? group_size : (f == weight_format::int8 ? group : 0)};
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  edge::thread_pool pool(o.threads - 1);
  const stream s{.where = device::cpu, .pool = o.threads > 1 ? &pool : nullptr, .cuda_stream = nullptr};
  std::mt19937 rng(7);
  std::printf("%-10s %-11s %6s %10s %22s %11s %9s %16s\n", "format", "shape", "tokens", "us/call", "GMAC/s (range)",
              "weight GB/s", "matrices", "vs first format");
  for (const shape sh : o.shapes) {
    // Every format's matrices, made once; the formats then take turns pass by pass.
    struct format_set {
      std::string name;
      double bytes;  // per matrix, values and scales
      std::vector<matrix> matrices;
    };
    std::vector<format_set> sets;
    for (const std::string& name : o.formats) {
      const weight_format f = format_named(name);
      const auto bytes = static_cast<double>(weight_values_bytes(f, sh.n, sh.k)) +
                         4.0 * static_cast<double>(weight_scale_count(f, sh.n, sh.k, o.group_size));
      const auto count = std::max<std::int64_t>(1, static_cast<std::int64_t>(o.working_set_mib * 1048576.0 / bytes));
      format_set set{name, bytes, {}};
      for (std::int64_t i = 0; i < count; ++i) set.matrices.push_back(make_matrix(f, tiles_named(name), sh, o.group_size, rng));
      sets.push_back(std::move(set));
    }
    const std::int64_t max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
    std::vector<float> x(static_cast<std::size_t>(max_tokens * sh.k));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);
    std::vector<float> y(static_cast<std::size_t>(max_tokens * sh.n));
    for (const std::int64_t tokens : o.tokens) {
      const auto call = [&](const matrix& m) {
        const edge::status done = run_matmul({.x = x.data(), .w = m.view, .y = y.data(), .tokens = tokens, .n = sh.n,
                                              .k = sh.k, .x_stride = sh.k, .y_stride = sh.n},
                                             s);
        if (!done.ok()) {
          std::fprintf(stderr, "matmul: %s\n", done.message().c_str());
          std::exit(1);
        }
      };
      // Seconds per call of each format, pass by pass.
      std::vector<std::vector<double>> per_call(sets.size());
      for (const format_set& set : sets) {
        for (const matrix& m : set.matrices) call(m);  // warm-up: page in, grow scratch
      }
      const auto start = clock_type::now();
      while (per_call[0].size() < 5 || std::chrono::duration<double>(clock_type::now() - start).count() <
                                           o.seconds * static_cast<double>(sets.size())) {
        for (std::size_t f = 0; f < sets.size(); ++f) {
          const auto t0 = clock_type::now();
          for (const matrix& m : sets[f].matrices) call(m);
          per_call[f].push_back(std::chrono::duration<double>(clock_type::now() - t0).count() /
                                static_cast<double>(sets[f].matrices.size()));
        }
      }
      for (std::size_t f = 0; f < sets.size(); ++f) {
        const double mid = median(per_call[f]);
        const double fastest = *std::min_element(per_call[f].begin(), per_call[f].end());
        const double slowest = *std::max_element(per_call[f].begin(), per_call[f].end());
        // The pass-by-pass speed ratio against the first format: drifting load cancels out.
        std::vector<double> ratios;
        for (std::size_t i = 0; i < per_call[f].size(); ++i) ratios.push_back(per_call[0][i] / per_call[f][i]);
        std::sort(ratios.begin(), ratios.end());
        const double macs = static_cast<double>(tokens * sh.n * sh.k);
        char label[32];
        std::snprintf(label, sizeof label, "%lldx%lld", static_cast<long long>(sh.n), static_cast<long long>(sh.k));
        char gmacs[48];
        std::snprintf(gmacs, sizeof gmacs, "%.1f (%.1f-%.1f)", macs / mid * 1e-9, macs / slowest * 1e-9,
                      macs / fastest * 1e-9);
        char ratio[48];
        std::snprintf(ratio, sizeof ratio, "%.2fx (%.2f-%.2f)", median(ratios), ratios.front(), ratios.back());
        std::printf("%-10s %-11s %6lld %10.1f %22s %11.1f %9lld %16s\n", sets[f].name.c_str(), label,
                    static_cast<long long>(tokens), mid * 1e6, gmacs, sets[f].bytes / mid * 1e-9,
                    static_cast<long long>(sets[f].matrices.size()), f == 0 ? "" : ratio);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
