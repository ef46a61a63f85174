#include <doctest/doctest.h>

#include <boost/json/serialize.hpp>

#include <vector>

#include "edge/gateway/openai/openai_response.h"

namespace gw = edge::gateway;
namespace backend = edge::backend;

namespace {

std::string text(const boost::json::object& o) { return boost::json::serialize(o); }

const backend::token_usage usage{.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};

}  // namespace

TEST_CASE("a whole chat answer has OpenAI's shape and usage") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-req_1", 1700000000, "m"};
  const gw::choice_result choice{.text = "Hi \"there\"", .reason = backend::finish_reason::stop, .logprobs = nullptr};
  CHECK(text(gw::completion_response(meta, std::span(&choice, 1), usage)) ==
        R"({"id":"chatcmpl-req_1","object":"chat.completion","created":1700000000,"model":"m",)"
        R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\"","refusal":null},)"
        R"("logprobs":null,"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST_CASE("a whole completions answer is a text_completion") {
  const gw::response_meta meta{gw::openai_api::completions, gw::response_id(gw::openai_api::completions, "req_2"), 1, "m"};
  const gw::choice_result choice{.text = "abc", .reason = backend::finish_reason::length, .logprobs = nullptr};
  CHECK(text(gw::completion_response(meta, std::span(&choice, 1), usage)) ==
        R"({"id":"cmpl-req_2","object":"text_completion","created":1,"model":"m",)"
        R"("choices":[{"index":0,"text":"abc","logprobs":null,"finish_reason":"length"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST_CASE("chat chunks: role first, content deltas, the finish, then usage; usage null before it when asked") {
  const gw::chunk_builder chunks({gw::openai_api::chat_completions, "chatcmpl-x", 7, "m"}, /*include_usage=*/true);
  const std::string head = R"({"id":"chatcmpl-x","object":"chat.completion.chunk","created":7,"model":"m",)";
  CHECK(text(chunks.role()) == head + R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
                                      R"("logprobs":null,"finish_reason":null}],"usage":null})");
  CHECK(text(chunks.content("Once")) ==
        head + R"("choices":[{"index":0,"delta":{"content":"Once"},"logprobs":null,"finish_reason":null}],"usage":null})");
  CHECK(text(chunks.finish(backend::finish_reason::stop)) ==
        head + R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null})");
  CHECK(text(chunks.usage(usage)) ==
        head + R"("choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
               R"("prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST_CASE("completion chunks carry text and no usage member unless asked") {
  const gw::chunk_builder chunks({gw::openai_api::completions, "cmpl-x", 7, "m"}, /*include_usage=*/false);
  CHECK(text(chunks.content("a")) == R"({"id":"cmpl-x","object":"text_completion","created":7,"model":"m",)"
                                     R"("choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]})");
  CHECK(text(chunks.finish(backend::finish_reason::length)) ==
        R"({"id":"cmpl-x","object":"text_completion","created":7,"model":"m",)"
        R"("choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]})");
}

TEST_CASE("several choices: each with its index, reason and logprobs; chunks name their choice") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-n", 3, "m"};
  const std::vector<gw::choice_result> choices = {
      {.text = "a", .reason = backend::finish_reason::stop, .logprobs = boost::json::object{{"content", boost::json::array{}}}},
      {.text = "bc", .reason = backend::finish_reason::length, .logprobs = nullptr}};
  CHECK(text(gw::completion_response(meta, choices, usage)) ==
        R"({"id":"chatcmpl-n","object":"chat.completion","created":3,"model":"m","choices":[)"
        R"({"index":0,"message":{"role":"assistant","content":"a","refusal":null},"logprobs":{"content":[]},)"
        R"("finish_reason":"stop"},)"
        R"({"index":1,"message":{"role":"assistant","content":"bc","refusal":null},"logprobs":null,)"
        R"("finish_reason":"length"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
  const gw::chunk_builder chunks(meta, /*include_usage=*/false);
  const std::string head = R"({"id":"chatcmpl-n","object":"chat.completion.chunk","created":3,"model":"m",)";
  CHECK(text(chunks.role(2)) == head + R"("choices":[{"index":2,"delta":{"role":"assistant","content":""},)"
                                       R"("logprobs":null,"finish_reason":null}]})");
  CHECK(text(chunks.content("x", 1, boost::json::object{{"content", boost::json::array{}}})) ==
        head + R"("choices":[{"index":1,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]})");
  CHECK(text(chunks.finish(backend::finish_reason::length, 1)) ==
        head + R"("choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"length"}]})");
}

TEST_CASE("the models API lists the served model") {
  gw::serving_model model;
  model.id = "stories260K";
  model.created = 1700000000;
  model.context_length = 512;
  CHECK(text(gw::model_list(model)) ==
        R"({"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,)"
        R"("owned_by":"edgeinfer","max_model_len":512}]})");
}
