#include <doctest/doctest.h>

#include <vector>

#include "edge/backend/runtime/sampler.h"

using namespace edge::backend;

TEST_CASE("the uniform draw depends only on seed and step") {
  CHECK(uniform_for_step(1, 0) == uniform_for_step(1, 0));
  CHECK(uniform_for_step(1, 0) != uniform_for_step(1, 1));
  CHECK(uniform_for_step(1, 0) != uniform_for_step(2, 0));
  double sum = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const float u = uniform_for_step(7, i);
    CHECK(u >= 0.0f);
    CHECK(u < 1.0f);
    sum += u;
  }
  CHECK(sum / 10000 == doctest::Approx(0.5).epsilon(0.02));
}

TEST_CASE("penalties follow the OpenAI and repetition-penalty definitions") {
  sampling_params p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const std::vector<token_id> prompt = {0, 1};
  sequence_sampler s(p, prompt);
  s.accept(2);
  s.accept(2);
  s.accept(3);
  std::vector<float> logits = {4.0f, -4.0f, 1.0f, 1.0f, 1.0f};
  s.apply_penalties(logits);
  CHECK(logits[0] == 2.0f);                   // prompt, positive: divided
  CHECK(logits[1] == -8.0f);                  // prompt, negative: multiplied
  CHECK(logits[2] == 0.5f - 0.5f - 0.5f);     // output twice: repetition, presence, 2 × frequency
  CHECK(logits[3] == 0.5f - 0.5f - 0.25f);    // output once
  CHECK(logits[4] == 1.0f);                   // never seen
}

TEST_CASE("greedy rows ask the kernel for argmax, others carry the step's uniform") {
  sampling_params greedy;
  greedy.temperature = 0.0f;
  sequence_sampler g(greedy, {});
  CHECK(g.next_row().temperature == 0.0f);

  sampling_params sampled;
  sampled.seed = 9;
  sequence_sampler s(sampled, {});
  CHECK(s.next_row().uniform == uniform_for_step(9, 0));
  s.accept(1);
  CHECK(s.next_row().uniform == uniform_for_step(9, 1));
}
