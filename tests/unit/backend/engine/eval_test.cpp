// `edgeinfer eval`'s measurements on the real fixture: teacher forcing gives the logits that
// decoding one token at a time gives, the reference agrees with itself exactly, windows cover
// every token once, and a lossy KV cache shows up as disagreement and KL.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "edge/backend/engine/eval.h"
#include "edge/backend/model/model.h"
#include "edge/common/thread_pool.h"
#include "test_support.h"

namespace {

using namespace edge::backend;
using edge::kernels::dtype;

const std::string story =
    "Once upon a time, there was a little dog named Sam. Sam liked to dig in the garden. One day he found a big "
    "bone under the tree. He was very happy and ran to show his friend the cat. The cat did not like bones, but she "
    "was glad that Sam was happy. They played in the sun until it was time to go home.";

struct fixture {
  std::unique_ptr<model> m;
  std::vector<token_id> text, prompt;
  edge::thread_pool pool{1};

  fixture() {
    auto loaded = load_model({.path = edge::testing::stories260k_dir() / "stories260K.gguf"});
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().message());
    m = std::move(loaded).value();
    text = m->tok->encode(story, {.add_bos = true, .parse_special = false});
    prompt = m->tok->encode("Once upon a time", {.add_bos = true, .parse_special = false});
  }

  eval_reference reference(std::int64_t window = 0, std::int64_t chunk = 128) {
    auto r = eval_reference::run(*m, text, prompt, {.window = window, .chunk = chunk, .greedy_tokens = 40, .pool = &pool});
    REQUIRE_MESSAGE(r.ok(), r.error().message());
    return std::move(r).value();
  }
};

}  // namespace

TEST_CASE("configurations parse as WEIGHTS/KV with the reference first") {
  auto configs = parse_eval_configurations("f32/fp8, f32/bf16,f32/fp8,,f32/f32");
  REQUIRE(configs.ok());
  REQUIRE(configs->size() == 3);
  CHECK((*configs)[0].name() == "f32/f32");
  CHECK((*configs)[1] == eval_configuration{"f32", dtype::fp8_e4m3});
  CHECK((*configs)[2].name() == "f32/bf16");
  CHECK(parse_eval_configurations("f32/auto").error().code() == edge::status_code::invalid_argument);
  CHECK(parse_eval_configurations("f32").error().code() == edge::status_code::invalid_argument);
  CHECK(parse_eval_configurations("q2/fp8").error().code() == edge::status_code::invalid_argument);

  auto quantized = parse_eval_configurations("int4/fp8,fp8/bf16,bf16/f16,f16/f32");
  REQUIRE(quantized.ok());
  CHECK(quantized->size() == 5);
  CHECK((*quantized)[1] == eval_configuration{"int4", dtype::fp8_e4m3});

  const auto defaults = default_eval_configurations();
  CHECK(defaults.front().is_reference());
  for (const auto& config : {eval_configuration{"f32", dtype::fp8_e4m3}, eval_configuration{"int4", dtype::bf16},
                             eval_configuration{"int4", dtype::fp8_e4m3}, eval_configuration{"fp8", dtype::bf16}}) {
    CAPTURE(config.name());
    CHECK(std::find(defaults.begin(), defaults.end(), config) != defaults.end());
  }
}

TEST_CASE("the first sentence of a text is the default greedy prompt") {
  CHECK(first_sentence("  Once upon a time, a cat sat. Then it ran.") == "Once upon a time, a cat sat.");
  CHECK(first_sentence("Where is it? Here.") == "Where is it?");
  CHECK(first_sentence("A title\nThe story.") == "A title");
  CHECK(first_sentence("no end at all ") == "no end at all");
}

TEST_CASE("teacher forcing predicts what greedy decoding produces, and the reference agrees with itself") {
  fixture f;
  // A text that is the model's own greedy continuation: at every position after the prompt,
  // the teacher-forced argmax must be the next token of the text.
  const eval_reference first = f.reference();
  std::vector<token_id> own = f.prompt;
  own.insert(own.end(), first.self().continuation.begin(), first.self().continuation.end());
  f.text = own;
  const eval_reference r = f.reference(0, 7);  // odd chunks: positions split across forward passes
  REQUIRE(r.predicted().size() == own.size() - 1);
  for (std::size_t i = f.prompt.size() - 1; i + 1 < own.size(); ++i) {
    CAPTURE(i);
    CHECK(r.predicted()[i] == own[i + 1]);
  }

  const auto again = r.compare(*f.m, {"f32", dtype::f32});
  REQUIRE(again.ok());
  CHECK(again->top1_agreement == 1.0);
  CHECK(again->mean_kl == 0.0);
  CHECK(again->perplexity == r.self().perplexity);
  CHECK(again->greedy_match == 40);
  CHECK(again->continuation_text == r.self().continuation_text);
}

TEST_CASE("windows score every token after the first exactly once") {
  fixture f;
  const auto n = static_cast<std::int64_t>(f.text.size());
  REQUIRE(n > 40);
  const eval_reference whole = f.reference();
  const eval_reference windowed = f.reference(16);
  CHECK(whole.windows() == 1);
  CHECK(windowed.window() == 16);
  CHECK(windowed.windows() == (n - 1 + 14) / 15);  // 15 new predictions per window of 16
  CHECK(windowed.self().predictions == n - 1);
  // Less context per prediction makes the text less predictable.
  CHECK(windowed.self().perplexity > whole.self().perplexity);
  CHECK(windowed.predicted()[0] == whole.predicted()[0]);
}

TEST_CASE("lossy KV caches disagree a little with the reference; more lossy, more so") {
  fixture f;
  const eval_reference r = f.reference();
  CHECK(r.self().perplexity > 1.0);
  CHECK(r.self().perplexity < 20.0);  // a children's story is easy for a model of children's stories
  auto bf16 = r.compare(*f.m, {"f32", dtype::bf16});
  auto fp8 = r.compare(*f.m, {"f32", dtype::fp8_e4m3});
  REQUIRE(bf16.ok());
  REQUIRE(fp8.ok());
  CHECK(bf16->mean_kl > 0.0);
  CHECK(fp8->mean_kl > bf16->mean_kl);
  CHECK(fp8->max_kl >= fp8->mean_kl);
  CHECK(bf16->top1_agreement >= 0.97);
  CHECK(fp8->top1_agreement >= 0.90);
  CHECK(fp8->top1_agreement <= bf16->top1_agreement);
  CHECK(std::fabs(std::log(fp8->perplexity / r.self().perplexity)) < 0.1);
  CHECK(fp8->predictions == r.self().predictions);

  const std::vector<eval_metrics> columns = {r.self(), *bf16, *fp8};
  const std::string table = format_eval_table(columns);
  CHECK(table.find("weights/KV cache") == 0);
  CHECK(table.find("f32/fp8") != std::string::npos);
  CHECK(table.find("greedy match (of 40)") != std::string::npos);
  CHECK(table.find("100.00%") != std::string::npos);
}
