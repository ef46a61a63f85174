#!/usr/bin/env bash
# The GPU checks as one command for a GPU machine (cmake, ninja or make, nvcc; none of the
# server's libraries). Here, first:
#
#   tests/gpu/run.sh --dry-run
#
# copies the stories260K fixture into build-gpu-models/ and writes the MoE and MLA ones there with
# build/edgeinfer (ignored by git; the GPU run carries them), configures and builds build-gpu/
# (EDGE_GPU_ONLY=ON: common, kernels, edge_backend_core, tests/gpu), and stops before the first
# GPU call. On the GPU machine, the same without
# --dry-run builds there and runs, each step under its own time limit, under 5 minutes in all:
#
#   build      warnings not fatal (the machine's host compiler is not CI's), sm_90a only
#   numerics   host FP8/BF16/FP16 encoders = the hardware conversions, bit for bit
#   kernels    every CUDA kernel = its CPU reference over awkward shapes (tolerances inline)
#   engine     CUDA engine greedy stories260K = CPU engine, for every weight format and KV dtype;
#              a tiny MoE model (GGUF qwen3moe) likewise, for its experts in bf16, int4 and fp8;
#              a tiny latent-attention model (GGUF deepseek2) for bf16 and fp8 KV;
#              GGUF K-quants widened to bf16 on upload
#   bench      bandwidth fractions, GEMM and prefill attention TFLOP/s against their baselines,
#              sampling times, synthetic Llama-3-8B decode tokens/s tables
#   memcheck   compute-sanitizer --tool memcheck on the kernels test's --quick shapes of the
#              tensor-core and grouped kernels (n/a, not a failure, where the machine cannot run it)
#
# The steps' limits add up to the deadline (budget below), so a slow step costs its own time,
# never a later step's. build-gpu-models/ (the fixtures, ignored by git) must travel with the
# checkout: a run without it stops at once and says so.
#
# Each step's whole output goes to $OUT/<step>.log (build-gpu/logs/ without $OUT); the summary
# (each step's verdict and time, its checks line, its first failures, the bench tables) is
# printed last and kept in summary.txt beside the logs, small enough for a tail of 12,000
# characters. Exits non-zero when any step fails, a skip included.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

dry_run=false
if [[ ${1:-} == --dry-run ]]; then dry_run=true; fi

logs=${OUT:-build-gpu/logs}
mkdir -p "$logs"
summary=$logs/summary.txt
: > "$summary"
# Under 5 minutes on the GPU machine: each step's limit, adding up to the deadline. A dry run
# here (2 cores building sm_90a) takes what it takes.
declare -A budget=([build]=100 [numerics]=10 [kernels]=70 [engine]=30 [bench]=60 [memcheck]=20)
total=0
for seconds in "${budget[@]}"; do total=$((total + seconds)); done
((total <= 290)) || { echo "run.sh: the steps' limits add up to ${total} s, past 290" >&2; exit 2; }
deadline=$((SECONDS + total))
if $dry_run; then
  deadline=$((SECONDS + 7200))
  budget[build]=7200
fi
failed=0

# The fixture travels with the checkout: ../shared is not on the GPU machine.
fixture=build-gpu-models
models=${EDGE_TEST_MODELS:-../shared/models}
if [[ -f $models/stories260K/stories260K.bin && $(realpath -m "$models") != $(realpath -m "$fixture") ]]; then
  mkdir -p "$fixture"
  cp -r "$models/stories260K" "$fixture/"
fi
# The MoE fixture: make-model's tiny-qwen3-moe-sparse as a qwen3moe GGUF (a few hundred KB),
# written by the full build's edgeinfer where there is one (the GPU machine builds none and
# reads the one carried with the checkout).
moe_fixture=$fixture/tiny-qwen3-moe-sparse.gguf
if [[ ! -f $moe_fixture && -x build/edgeinfer ]]; then
  mkdir -p "$fixture"
  build/edgeinfer make-model --preset tiny-qwen3-moe-sparse --format gguf --seed 7 --out "$moe_fixture" --log-level warn
fi
# The latent-attention fixture: make-model's deepseek-v3-tiny-gguf as a deepseek2 GGUF (this
# build reads GGUF and llama2.c files only: the safetensors reader needs simdjson).
mla_fixture=$fixture/deepseek-v3-tiny-gguf.gguf
if [[ ! -f $mla_fixture && -x build/edgeinfer ]]; then
  mkdir -p "$fixture"
  build/edgeinfer make-model --preset deepseek-v3-tiny-gguf --format gguf --seed 7 --out "$mla_fixture" --log-level warn
fi
# The K-quant fixture's source: make-model's tiny-hd128 as an F32 GGUF (7 MB), which the engine
# test rewrites as Q4_K / Q5_K / Q6_K blocks of its own.
kquant_source=$fixture/tiny-hd128-f32.gguf
if [[ ! -f $kquant_source && -x build/edgeinfer ]]; then
  mkdir -p "$fixture"
  build/edgeinfer make-model --preset tiny-hd128 --format gguf --dtype f32 --seed 7 --out "$kquant_source" --log-level warn
fi
export EDGE_TEST_MODELS=$PWD/$fixture

# Without ../shared or build/edgeinfer here (the GPU machine), the fixtures come with the checkout
# or not at all: say which is missing before spending the machine's time on a build.
if ! $dry_run; then
  missing=()
  for f in "$fixture/stories260K/stories260K.bin" "$moe_fixture" "$mla_fixture" "$kquant_source"; do
    [[ -f $f ]] || missing+=("$f")
  done
  if ((${#missing[@]} > 0)); then
    echo "run.sh: missing ${missing[*]}: run tests/gpu/run.sh --dry-run where ../shared and build/edgeinfer are," >&2
    echo "run.sh: then copy $fixture/ with the checkout (the device tool: carry [\"$fixture\"])" >&2
    exit 2
  fi
fi

note() { printf '%s\n' "$*" >> "$summary"; }

# A step's exit code for "this machine cannot run the tool" (compute-sanitizer missing, or
# refusing the device, as it does on some virtualised GPU machines): noted, not a failure.
export unavailable=78

# step NAME LIMIT_SECONDS COMMAND...: runs COMMAND into NAME.log, notes its verdict and what of
# its log the summary needs.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS))
  if ((left < 10)); then
    note "$(printf '%-9s FAIL  not run: out of time' "$name")"
    failed=1
    return 1
  fi
  ((limit > left)) && limit=$left
  local start=$SECONDS rc=0
  timeout --kill-after=5 "$limit" "$@" > "$logs/$name.log" 2>&1 || rc=$?
  local verdict=ok
  if ((rc == 124 || rc == 137)); then
    verdict="FAIL  timed out after ${limit}s"
  elif ((rc == 77)); then
    verdict="FAIL  skipped (exit 77)"
  elif ((rc == unavailable)); then
    verdict="n/a   the tool cannot run here"
  elif ((rc != 0)); then
    verdict="FAIL  exit $rc"
  fi
  note "$(printf '%-9s %-4s %4ds' "$name" "$verdict" $((SECONDS - start)))"
  ((rc == unavailable)) && rc=0
  grep -E ': [0-9]+ checks, [0-9]+ failed|^numerics_gpu_test: |ERROR SUMMARY|^skipped: |^cannot run: ' "$logs/$name.log" |
    tail -n 3 | cut -c1-150 | sed 's/^/          /' >> "$summary"
  if ((rc != 0)); then
    failed=1
    if [[ $name == build ]]; then
      grep -E 'error|Error' "$logs/$name.log" | head -n 5 | cut -c1-150 | sed 's/^/          /' >> "$summary"
    else
      grep -E '^FAIL|error|Error' "$logs/$name.log" | head -n 5 | cut -c1-150 | sed 's/^/          /' >> "$summary"
    fi
  fi
  return "$rc"
}

# shellcheck disable=SC2317  # build and memcheck run through bash -c
build() {
  local generator=()
  if command -v ninja > /dev/null; then generator=(-G Ninja); fi
  # sm_90a only: these tests exist to exercise Hopper's instructions, and PTX for another
  # architecture would quietly test cuda_fp8.h's software fallback instead.
  cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DEDGE_GPU_ONLY=ON -DEDGE_CUDA=ON \
    -DEDGE_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES=90a-real &&
    cmake --build build-gpu --parallel "$(nproc)"
}

# shellcheck disable=SC2317
memcheck() {
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || true)
  if [[ -z $sanitizer && -x /usr/local/cuda/bin/compute-sanitizer ]]; then sanitizer=/usr/local/cuda/bin/compute-sanitizer; fi
  if [[ -z $sanitizer ]]; then
    echo "ERROR SUMMARY: compute-sanitizer is not installed here"
    return "$unavailable"
  fi
  local log rc=0
  log=$(mktemp)
  "$sanitizer" --tool memcheck --error-exitcode 3 build-gpu/tests/gpu/edge_gpu_kernels_test --quick \
    --only matmul,head_matmul,paged_attention,moe_experts,mla_attention > "$log" 2>&1 || rc=$?
  cat "$log"
  if ((rc != 0)) && grep -q 'Device not supported' "$log"; then
    echo "ERROR SUMMARY: compute-sanitizer does not support this device here"
    rc=$unavailable
  fi
  rm -f "$log"
  return "$rc"
}

export -f build memcheck
bin=build-gpu/tests/gpu
if step build "${budget[build]}" bash -c build; then
  if $dry_run; then
    note "dry run: built; the fixtures are $(ls "$fixture/stories260K/stories260K.bin" 2> /dev/null || echo MISSING) and $(ls "$moe_fixture" 2> /dev/null || echo "MISSING (build edgeinfer in build/ first)"); no GPU step run"
    note "          MLA fixture: $(ls "$mla_fixture" 2> /dev/null || echo "MISSING (build edgeinfer in build/ first)")"
    [[ -f $fixture/stories260K/stories260K.bin && -f $moe_fixture && -f $mla_fixture ]] || failed=1
  else
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$logs/device.log" 2>&1 &&
      note "device   $(head -n 1 "$logs/device.log")"
    step numerics "${budget[numerics]}" "$bin/edge_gpu_numerics_test"
    step kernels "${budget[kernels]}" "$bin/edge_gpu_kernels_test"
    step engine "${budget[engine]}" "$bin/edge_gpu_engine_test"
    # The figures before the sanitizer, which only checks: a run cut by the deadline loses the
    # least; the tables of a bench cut short are kept too.
    step bench "${budget[bench]}" "$bin/edge_gpu_decode_bench"
    [[ -f $logs/bench.log ]] && grep -E '^\||bandwidth' "$logs/bench.log" | cut -c1-160 >> "$summary"
    step memcheck "${budget[memcheck]}" bash -c memcheck
  fi
fi

echo
echo "==== tests/gpu/run.sh summary (logs in $logs) ===="
# Bounded by construction (at most about 10 KB); cut regardless, so that it always fits the
# 12,000 characters of output a GPU run brings back.
head -c 11000 "$summary"
exit $failed
