#!/usr/bin/env bash
# The fuzzers' CI smoke run (ctest fuzz.smoke): builds the GGUF, safetensors and OpenAI request
# fuzzers with clang in their own build folder and runs each for a short while over its seed corpus. Fails
# when the build fails or a fuzzer finds a crash, a leak, undefined behaviour or a timeout.
#
#   tests/fuzz/smoke.sh SOURCE_DIR BUILD_DIR [SECONDS_PER_FUZZER]
#
# How to fuzz for longer: see tests/fuzz/CMakeLists.txt.
set -euo pipefail

src=${1:?usage: smoke.sh SOURCE_DIR BUILD_DIR [SECONDS]}
build=${2:?usage: smoke.sh SOURCE_DIR BUILD_DIR [SECONDS]}
seconds=${3:-25}

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz smoke: clang++ not found (deploy/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

# GPU-only style: common, kernels and the fuzz targets; only the parsers' sources are compiled
# from the backend. Warnings stay warnings here: this build checks the parsers, not clang's
# opinion of the rest of the tree.
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DEDGE_FUZZ=ON -DEDGE_GPU_ONLY=ON -DEDGE_CUDA=OFF -DEDGE_WERROR=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target edge_fuzz_gguf edge_fuzz_safetensors \
  edge_fuzz_openai_request edge_fuzz_seeds

fuzz_dir="$build/tests/fuzz"
corpus="$build/corpus"
rm -rf "$corpus" "$build/artifacts"
mkdir -p "$build/artifacts"
"$fuzz_dir/edge_fuzz_seeds" "$corpus"

# The real fixture's header region (metadata with 512-entry arrays, 48 tensor infos) as one
# more GGUF seed, when the fixtures are there.
models=${EDGE_TEST_MODELS:-$src/../shared/models}
stories_header_bytes=14176
if [[ -f "$models/stories260K/stories260K.gguf" ]]; then
  head -c "$stories_header_bytes" "$models/stories260K/stories260K.gguf" >"$corpus/gguf/stories260K-header"
fi

run_fuzzer() {
  local name=$1 kind=$2
  # New inputs go to a scratch folder; the seeds stay as they were written.
  mkdir -p "$corpus/$kind-found"
  echo "fuzz smoke: $name for ${seconds}s"
  "$fuzz_dir/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$src/tests/fuzz/$kind.dict" -artifact_prefix="$build/artifacts/$kind-" \
    "$corpus/$kind-found" "$corpus/$kind"
}

run_fuzzer edge_fuzz_gguf gguf
run_fuzzer edge_fuzz_safetensors safetensors
run_fuzzer edge_fuzz_openai_request openai_request
echo "fuzz smoke: no crashes"
