#include "edge/backend/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// One request in flight.
struct sequence {
  const generation_request* request;
  std::vector<token_id> tokens;  // prompt, then generated
  std::int64_t prefilled = 0;    // prompt tokens whose K/V are in the cache
  std::vector<std::int32_t> blocks;
  std::unique_ptr<sequence_decoder> decoder;
  generation_output output;
  bool finished = false;

  std::int64_t prompt_size() const { return static_cast<std::int64_t>(request->prompt.size()); }
};

}  // namespace

generator::generator(const model& m, executor& exec, kv_block_pool& blocks, std::int64_t block_size,
                     generator_options options)
    : model_(m), exec_(exec), blocks_(blocks), block_size_(block_size), options_(options) {}

result<std::vector<generation_output>> generator::run(
    std::span<const generation_request> requests, const std::function<void(std::size_t, std::string_view)>& on_text,
    generation_timing* timing) {
  const std::int64_t vocab = exec_.vocab_size();
  const std::int64_t block_size = block_size_;
  const std::int64_t context = model_.config.max_position;

  std::vector<sequence> seqs(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const generation_request& r = requests[i];
    if (r.prompt.empty()) return invalid_argument(format("request {} has an empty prompt", i));
    if (static_cast<std::int64_t>(r.prompt.size()) >= context) {
      return out_of_range(format("request {}: prompt of {} tokens does not fit the context of {}", i, r.prompt.size(),
                                 context));
    }
    sequence& s = seqs[i];
    s.request = &r;
    s.tokens = r.prompt;
    s.decoder = std::make_unique<sequence_decoder>(
        *model_.tok, r.sampling, r.prompt,
        decode_limits{.max_tokens = r.max_tokens, .context = context, .ignore_eos = r.ignore_eos, .stop = r.stop});
  }

  // Frees every sequence's blocks however run() ends.
  struct release_blocks {
    kv_block_pool& pool;
    std::vector<sequence>& seqs;
    ~release_blocks() {
      for (auto& s : seqs) {
        for (auto b : s.blocks) pool.free(b);
        s.blocks.clear();
      }
    }
  } release{blocks_, seqs};

  const auto grow_to = [&](sequence& s, std::int64_t positions) -> status {
    while (static_cast<std::int64_t>(s.blocks.size()) * block_size < positions) {
      auto block = blocks_.allocate();
      if (!block) return resource_exhausted("the KV cache is full");
      s.blocks.push_back(*block);
    }
    return {};
  };

  const auto release_text = [&](std::size_t i, const std::string& text) {
    if (text.empty()) return;
    seqs[i].output.text += text;
    if (on_text) on_text(i, text);
  };

  // Takes a sampled token: records it, streams its text, and ends the sequence when due.
  const auto accept = [&](std::size_t i, token_id id) {
    sequence& s = seqs[i];
    s.tokens.push_back(id);
    s.output.tokens.push_back(id);
    sequence_decoder::step step = s.decoder->accept(id, static_cast<std::int64_t>(s.tokens.size()));
    release_text(i, step.text);
    if (step.finish) {
      s.output.reason = *step.finish;
      s.finished = true;
    }
  };

  std::vector<float> logits;
  std::vector<std::int32_t> chosen;
  std::vector<std::size_t> row_owner;
  std::vector<sequence_decoder*> row_decoders;
  batch_plan plan;

  // Samples one token for every entry that asked for logits.
  const auto sample = [&]() -> status {
    row_decoders.clear();
    for (const std::size_t i : row_owner) row_decoders.push_back(seqs[i].decoder.get());
    chosen.resize(row_owner.size());
    EDGE_RETURN_IF_ERROR(sample_rows(logits, vocab, row_decoders, chosen));
    for (std::size_t r = 0; r < row_owner.size(); ++r) accept(row_owner[r], chosen[r]);
    return {};
  };

  const auto forward = [&]() -> status {
    logits.resize(static_cast<std::size_t>(plan.logits_rows() * vocab));
    EDGE_RETURN_IF_ERROR(exec_.forward(plan, logits));
    return sample();
  };

  // Prefill: as many prompt tokens per step as the executor takes, chunked if asked.
  const auto prefill_start = clock_type::now();
  std::int64_t prefill_tokens = 0;
  for (;;) {
    plan.entries.clear();
    row_owner.clear();
    std::int64_t budget = exec_.max_batch_tokens();
    for (std::size_t i = 0; i < seqs.size() && budget > 0 &&
                            static_cast<std::int64_t>(plan.entries.size()) < exec_.max_sequences();
         ++i) {
      sequence& s = seqs[i];
      const std::int64_t left = s.prompt_size() - s.prefilled;
      if (left == 0) continue;
      std::int64_t chunk = std::min(left, budget);
      if (options_.prefill_chunk > 0) chunk = std::min(chunk, options_.prefill_chunk);
      EDGE_RETURN_IF_ERROR(grow_to(s, s.prefilled + chunk));
      const bool completes = s.prefilled + chunk == s.prompt_size();
      plan.entries.push_back({.tokens = std::span<const token_id>(s.tokens).subspan(static_cast<std::size_t>(s.prefilled),
                                                                                   static_cast<std::size_t>(chunk)),
                              .start_position = s.prefilled,
                              .block_table = s.blocks,
                              .compute_logits = completes});
      if (completes) row_owner.push_back(i);
      s.prefilled += chunk;
      budget -= chunk;
      prefill_tokens += chunk;
    }
    if (plan.entries.empty()) break;
    EDGE_RETURN_IF_ERROR(forward());
  }
  const double prefill_seconds = seconds_since(prefill_start);

  // Decode: every unfinished sequence feeds back its newest token.
  const auto decode_start = clock_type::now();
  std::int64_t decode_tokens = 0;
  std::int64_t decode_steps = 0;
  for (;;) {
    plan.entries.clear();
    row_owner.clear();
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      sequence& s = seqs[i];
      if (s.finished) continue;
      const auto position = static_cast<std::int64_t>(s.tokens.size()) - 1;
      EDGE_RETURN_IF_ERROR(grow_to(s, position + 1));
      plan.entries.push_back({.tokens = std::span<const token_id>(s.tokens).subspan(static_cast<std::size_t>(position), 1),
                              .start_position = position,
                              .block_table = s.blocks,
                              .compute_logits = true});
      row_owner.push_back(i);
      if (static_cast<std::int64_t>(plan.entries.size()) == std::min(exec_.max_batch_tokens(), exec_.max_sequences())) {
        break;
      }
    }
    if (plan.entries.empty()) break;
    EDGE_RETURN_IF_ERROR(forward());
    decode_tokens += static_cast<std::int64_t>(plan.entries.size());
    ++decode_steps;
  }

  if (timing != nullptr) {
    *timing = {.prefill_seconds = prefill_seconds,
               .decode_seconds = seconds_since(decode_start),
               .prefill_tokens = prefill_tokens,
               .decode_tokens = decode_tokens,
               .decode_steps = decode_steps};
  }
  std::vector<generation_output> outputs;
  outputs.reserve(seqs.size());
  for (auto& s : seqs) outputs.push_back(std::move(s.output));
  return outputs;
}

}  // namespace edge::backend
