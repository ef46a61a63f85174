# The two commands of the README, and helpers.
#
#   make run     install what is missing, build, serve on 127.0.0.1:8080 with the default model
#   make test    install what is missing, build, run every test but the GPU ones
#   make build | deps | clean | test-sanitize | bench (bench-serving + bench-decode + bench-engine + bench-gateway)
#   make bench-scaleout   throughput of a split gateway with one backend against two (CPU)
#   make bench-agent-cache  agent sessions through a split gateway: prompt-cache hit ratio and TTFT with and
#                         without session affinity and a host KV tier (SESSIONS, TURNS, ...: tests/bench/agent_cache.sh)
#   make bench-quota      the quota store in memory against Redis, per call and per request
#   make bench-moe        Mixture-of-Experts decode: Qwen3-30B-A3B layers, bf16/fp8/int4 experts, against dense
#   make bench-mla        latent attention decode: Kimi K2 layers with INT4 experts over bf16 and FP8 latents
#   make bench-deepseek2  batch-1 decode of a GGUF deepseek2 in edgeinfer and in llama.cpp (../shared/peers)
#   make bench-peer       the synthetic Llama 3.2 1B in edgeinfer and in llama.cpp: F16, Q8_0/fp8, Q4_0/int4, Q4_K_M
#   make bench-grammar    structured outputs: compiles, limits, token masks over Qwen's and Llama 3's vocabularies, decode with a schema
#
# Variables: BUILD_TYPE (RelWithDebInfo), EDGE_SANITIZE (e.g. "address;undefined": builds in
# build-sanitize/), EDGE_CUDA (AUTO|ON|OFF), JOBS (cores), HOST/PORT/ARGS for `make run`.

BUILD_TYPE    ?= RelWithDebInfo
EDGE_CUDA     ?= AUTO
EDGE_SANITIZE ?=
JOBS          ?= $(shell nproc 2>/dev/null || echo 2)
HOST          ?= 127.0.0.1
PORT          ?= 8080

ifeq ($(strip $(EDGE_SANITIZE)),)
BUILD_DIR ?= build
else
BUILD_DIR ?= build-sanitize
endif

GENERATOR := $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)
NODE_STAMP := tests/node_modules/.installed

.PHONY: all run test build deps clean test-sanitize configure bench bench-serving bench-decode bench-engine \
        bench-gateway bench-scaleout bench-agent-cache bench-quota bench-moe bench-mla bench-deepseek2 bench-peer bench-grammar

all: build

deps: $(NODE_STAMP)
	@deploy/install-deps.sh

# npm packages for the integration tests, from the lock file; re-run only when it changes.
$(NODE_STAMP): tests/package.json tests/package-lock.json
	@deploy/install-deps.sh
	cd tests && npm ci --no-audit --no-fund --loglevel=error
	@mkdir -p tests/node_modules && touch $(NODE_STAMP)

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DEDGE_CUDA=$(EDGE_CUDA) "-DEDGE_SANITIZE=$(EDGE_SANITIZE)"

configure: $(BUILD_DIR)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --label-exclude gpu --output-on-failure -j $(JOBS)

test-sanitize:
	$(MAKE) test EDGE_SANITIZE="address;undefined"

bench: bench-serving bench-decode bench-engine bench-gateway

# The serving sweep of docs/benchmarks.md (rewrites that file), about 13 minutes on 2 cores.
bench-serving: build
	tests/bench/serving.sh $(BUILD_DIR)

bench-decode: build
	tests/bench/decode.sh $(BUILD_DIR)

bench-grammar: build
	tests/bench/grammar.sh $(BUILD_DIR)

bench-engine: build
	tests/bench/engine.sh $(BUILD_DIR)

# GET /v1/models vs nginx, gateway overhead on a streamed request, memory per idle stream.
bench-gateway: build
	tests/bench/gateway.sh $(BUILD_DIR)

# One backend against two behind `edgeinfer gateway` (docs/performance.md), about 12 minutes.
bench-scaleout: build
	tests/bench/scaleout.sh $(BUILD_DIR)

# Agent sessions through the split gateway (tests/bench/agent_cache.sh; scale it down with SESSIONS,
# TURNS, TURN_LEN_MIN/MAX and SYSTEM_LEN: the full 50 x 20 takes hours on 2 cores).
bench-agent-cache: build
	tests/bench/agent_cache.sh $(BUILD_DIR)

# The quota store in memory vs in Redis: per call and per request (docs/performance.md).
bench-quota: build
	tests/bench/quota.sh $(BUILD_DIR)

# 4 layers of synthetic Qwen3-30B-A3B (about 6 GiB each, MoE and dense, written once), about
# 5 minutes on 2 cores.
bench-moe: build
	tests/bench/moe_decode.sh $(BUILD_DIR) 4

# 4 layers of synthetic Kimi K2 with 64 of its experts (about 22 GB in bf16, written once; the
# first load quantizes its experts), then 64 streams on an FP8 latent budget: over 15 minutes on 2 cores.
bench-mla: build
	tests/bench/mla_decode.sh $(BUILD_DIR) 4 64

# deepseek-v3-small (4.5 GB in bf16 and its Q4_0, written once) next to llama.cpp's prebuilt
# binaries, 5 rounds, about 4 minutes on 2 cores; run on an otherwise idle machine.
bench-deepseek2: build
	tests/bench/deepseek2_peer.sh $(BUILD_DIR) speed 5

# The synthetic Llama 3.2 1B as F16 and llama.cpp's Q8_0, Q4_0 and Q4_K_M of it (about 5.4 GB in
# all, written once) in edgeinfer and in llama.cpp's prebuilt binaries: batch-1 decode and prefill,
# 1/8/16 streams through each one's server, greedy text; 3 rounds. Long: run on an otherwise idle
# machine (EDGE_PEER_LAYERS=2 writes a 2-layer model for a quick check).
bench-peer: build
	tests/bench/peer.sh $(BUILD_DIR) 3

run: build
	$(BUILD_DIR)/edgeinfer serve --host $(HOST) --port $(PORT) $(ARGS)

clean:
	rm -rf build build-sanitize build-gpu tests/node_modules
