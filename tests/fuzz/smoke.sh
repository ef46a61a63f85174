#!/usr/bin/env bash
# The fuzzers' CI smoke run (ctest fuzz.smoke): builds every fuzzer of tests/fuzz with clang in
# its own build folder and runs each for a short while over its seed corpus. Fails when the
# build fails or a fuzzer finds a crash, a leak, undefined behaviour or a timeout.
#
#   tests/fuzz/smoke.sh SOURCE_DIR BUILD_DIR [SECONDS_PER_FUZZER]
#
# How to fuzz for longer: see tests/fuzz/CMakeLists.txt.
set -euo pipefail

src=${1:?usage: smoke.sh SOURCE_DIR BUILD_DIR [SECONDS]}
build=${2:?usage: smoke.sh SOURCE_DIR BUILD_DIR [SECONDS]}
seconds=${3:-13}

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz smoke: clang++ not found (deploy/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

# GPU-only style: common and the fuzz targets; only the parsers' sources are compiled from the
# backend and the gateway. Warnings stay warnings here: this build checks the parsers, not
# clang's opinion of the rest of the tree.
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DEDGE_FUZZ=ON -DEDGE_GPU_ONLY=ON -DEDGE_CUDA=OFF -DEDGE_WERROR=OFF >/dev/null
fuzzers=(gguf safetensors openai_request tokenizer_json tokenizer_vocab tokenizer_encode internal_protocol
         admin_request query_string grammar chat_template output_parser)
cmake --build "$build" --parallel "$(nproc)" --target edge_fuzz_seeds "${fuzzers[@]/#/edge_fuzz_}"

fuzz_dir="$build/tests/fuzz"
corpus="$build/corpus"
rm -rf "$corpus" "$build/artifacts"
mkdir -p "$build/artifacts"
"$fuzz_dir/edge_fuzz_seeds" "$corpus"

# The real fixture's header region (metadata with 512-entry arrays, 48 tensor infos) as one
# more GGUF seed, and its llama2.c tokenizer as a vocabulary seed, when the fixtures are there
# (edge_fuzz_tokenizer_encode then loads its tokenizer too).
models=${EDGE_TEST_MODELS:-$src/../shared/models}
export EDGE_TEST_MODELS=$models
stories_header_bytes=14176
if [[ -f "$models/stories260K/stories260K.gguf" ]]; then
  head -c "$stories_header_bytes" "$models/stories260K/stories260K.gguf" >"$corpus/gguf/stories260K-header"
fi
if [[ -f "$models/stories260K/tok512.bin" ]]; then
  cp "$models/stories260K/tok512.bin" "$corpus/tokenizer_vocab/stories260K-tok512"
fi
export EDGE_FUZZ_TOKENIZERS=$corpus/tokenizers

run_fuzzer() {
  local kind=$1
  # New inputs go to a scratch folder; the seeds stay as they were written.
  mkdir -p "$corpus/$kind-found"
  echo "fuzz smoke: edge_fuzz_$kind for ${seconds}s"
  "$fuzz_dir/edge_fuzz_$kind" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$src/tests/fuzz/$kind.dict" -artifact_prefix="$build/artifacts/$kind-" \
    "$corpus/$kind-found" "$corpus/$kind"
}

for kind in "${fuzzers[@]}"; do run_fuzzer "$kind"; done
echo "fuzz smoke: no crashes"
