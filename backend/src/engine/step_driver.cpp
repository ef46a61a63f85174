#include "edge/backend/engine/step_driver.h"

#include <span>

#include "kernels/sampling/sampling.h"

namespace edge::backend {

step_driver::step_driver(scheduler& sched, executor& exec) : sched_(sched), exec_(exec) {}

result<std::span<sampled_token>> step_driver::run(const step_plan& plan,
                                                    const std::function<driven_sequence(sequence_id)>& sequence_of) {
  batch_.entries.clear();
  batch_.copies = plan.copies;
  batch_.spills = plan.spills;
  batch_.restores = plan.restores;
  row_ids_.clear();
  row_seqs_.clear();
  rows_.clear();
  scored_.clear();
  constrained_rows_.clear();
  std::size_t copied = 0;
  for (const scheduled_chunk& chunk : plan.chunks) {
    batch_.entries.push_back({.tokens = chunk.tokens,
                              .start_position = chunk.start,
                              .block_table = chunk.block_table,
                              .compute_logits = chunk.samples,
                              .prompt_logits_offset = chunk.prompt_logits_offset,
                              .prompt_logits_count = chunk.prompt_logits_count});
    if (!chunk.samples) continue;
    const driven_sequence seq = sequence_of(chunk.id);
    const bool on_host = seq.decoder->samples_on_host();
    row_sampling row{.sample = !on_host, .copy_logits = on_host || seq.logprobs.has_value()};
    if (row.sample) {
      row.config = seq.decoder->next_row();
      row.bias = seq.decoder->sampling().logit_bias;
    }
    if (seq.decoder->constrained()) constrained_rows_.push_back(rows_.size());
    copied += row.copy_logits ? 1 : 0;
    row_ids_.push_back(chunk.id);
    row_seqs_.push_back(seq);
    rows_.push_back(row);
  }
  // The grammars' masks: the rows hold spans of masks_ (sized first), which the executor has
  // filled once the forward pass is under way (on a GPU, while it runs).
  const auto words = static_cast<std::size_t>(kernels::allowed_words(exec_.vocab_size()));
  masks_.resize(constrained_rows_.size() * words);
  const auto mask_of = [&](std::size_t k) { return std::span(masks_).subspan(k * words, words); };
  for (std::size_t k = 0; k < constrained_rows_.size(); ++k) rows_[constrained_rows_[k]].allowed = mask_of(k);
  const auto fill_masks = [&] {
    for (std::size_t k = 0; k < constrained_rows_.size(); ++k) row_seqs_[constrained_rows_[k]].decoder->fill_allowed(mask_of(k));
  };
  const auto vocab = static_cast<std::size_t>(exec_.vocab_size());
  const auto prompt_rows = static_cast<std::size_t>(batch_.prompt_logits_rows());
  tokens_.assign(rows_.size(), 0);
  logits_.resize((copied + prompt_rows) * vocab);
  EDGE_RETURN_IF_ERROR(exec_.forward_sample(batch_, rows_, tokens_, logits_,
                                            constrained_rows_.empty() ? mask_filler{} : mask_filler(fill_masks)));

  // First every token (what can fail), then the records: an error leaves nothing half done.
  sampled_.assign(rows_.size(), sampled_token{});
  std::vector<sampled_token>& out = sampled_;
  std::size_t logits_row = 0;
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    const driven_sequence& seq = row_seqs_[r];
    std::span<float> row;  // the raw logits, when copied
    if (rows_[r].copy_logits) row = std::span<float>(logits_).subspan(logits_row++ * vocab, vocab);
    std::span<const float> raw = row;
    if (!rows_[r].sample) {
      // Penalties change the row and sampling uses it as scratch: log probabilities, which are of
      // the model's own distribution, read a copy taken first.
      if (seq.logprobs) {
        raw_.assign(row.begin(), row.end());
        raw = raw_;
      }
      kernels::sampling_row config = seq.decoder->prepare(row);
      config.allowed_row = rows_[r].allowed.empty() ? -1 : 0;
      const std::vector<kernels::logit_bias>& bias = seq.decoder->sampling().logit_bias;
      EDGE_RETURN_IF_ERROR(kernels::run_sampling({.logits = row.data(),
                                                  .config = &config,
                                                  .out = &tokens_[r],
                                                  .rows = 1,
                                                  .vocab = static_cast<std::int64_t>(vocab),
                                                  .biases = bias.data(),
                                                  .allowed = rows_[r].allowed.data()},
                                                 {}));
    }
    out[r].id = row_ids_[r];
    out[r].token = tokens_[r];
    if (seq.logprobs) out[r].logprobs = logprobs_of(raw, out[r].token, *seq.logprobs);
  }
  // The prompt logits rows follow the copied ones, chunk after chunk: each is scored against the
  // prompt token after its position.
  for (const scheduled_chunk& chunk : plan.chunks) {
    if (chunk.prompt_logits_count == 0) continue;
    const driven_sequence seq = sequence_of(chunk.id);
    const std::span<const std::int32_t> tokens = sched_.tokens(chunk.id);
    scored_prompt& scored = scored_.emplace_back();
    scored.id = chunk.id;
    scored.first = chunk.start + chunk.prompt_logits_offset + 1;
    for (std::int64_t i = 0; i < chunk.prompt_logits_count; ++i) {
      const std::span<const float> row = std::span<const float>(logits_).subspan(logits_row++ * vocab, vocab);
      const token_id next = tokens[static_cast<std::size_t>(scored.first + i)];
      scored.logprobs.push_back(logprobs_of(row, next, seq.prompt_logprobs));
    }
  }
  sched_.complete(plan);
  for (std::size_t r = 0; r < out.size(); ++r) {
    sched_.append_token(out[r].id, out[r].token);
    out[r].decoded = row_seqs_[r].decoder->accept(out[r].token, sched_.sequence_length(out[r].id));
  }
  return std::span<sampled_token>(out);
}

}  // namespace edge::backend
