#include "edge/gateway/openai/answer_writer.h"

#include <boost/json/serialize.hpp>

#include "edge/gateway/openai/anthropic_response.h"
#include "edge/gateway/openai/responses_response.h"

namespace edge::gateway {
namespace {

// OpenAI's chunks while streaming; each choice's text or message, for the whole answer, when not.
class openai_writer final : public answer_writer {
 public:
  openai_writer(response_meta meta, const openai_request& r, std::vector<std::string> echoed)
      : chunks_(meta, r.include_usage),
        meta_(std::move(meta)),
        stream_(r.stream),
        include_usage_(r.include_usage),
        echo_alone_(r.echo && !r.logprobs),
        per_prompt_(static_cast<std::size_t>(r.n)),
        echoed_(std::move(echoed)),
        choices_(per_prompt_ * std::max<std::size_t>(echoed_.size(), 1)) {
    if (r.echo && !stream_) {
      for (std::size_t i = 0; i < choices_.size(); ++i) choices_[i].text = echoed_of(i);
    }
  }

  void open(std::vector<named_event>& out) override {
    for (std::size_t i = 0; i < choices_.size(); ++i) {
      const auto index = static_cast<std::int32_t>(i);
      if (meta_.api == openai_api::chat_completions) {
        out.push_back({{}, chunks_.role(index)});
      } else if (echo_alone_ && !echoed_of(i).empty()) {
        out.push_back({{}, chunks_.content(echoed_of(i), index)});
      }
    }
  }

  void echo(std::int32_t index, boost::json::value logprobs, std::vector<named_event>& out) override {
    if (stream_) out.push_back({{}, chunks_.content(echoed_of(static_cast<std::size_t>(index)), index, std::move(logprobs))});
  }

  void output(std::int32_t index, const output_event& event, boost::json::value logprobs,
              std::vector<named_event>& out) override {
    choice& c = at(index);
    c.made_tool_calls |= std::holds_alternative<tool_call_begin>(event);
    if (!stream_) {
      c.message.add(event);
      return;
    }
    out.push_back({{}, chunks_.event(event, index, std::move(logprobs))});
  }

  void text(std::int32_t index, std::string_view text, boost::json::value logprobs,
            std::vector<named_event>& out) override {
    if (!stream_) {
      at(index).text += text;
      return;
    }
    out.push_back({{}, chunks_.content(text, index, std::move(logprobs))});
  }

  void choice_end(std::int32_t index, backend::finish_reason reason, std::string_view, boost::json::value logprobs,
                  std::vector<named_event>& out) override {
    choice& c = at(index);
    c.reason = reason;
    if (stream_) out.push_back({{}, chunks_.finish(reason, index, std::move(logprobs), c.made_tool_calls)});
  }

  void end(const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens,
           std::vector<named_event>& out) override {
    if (include_usage_) out.push_back({{}, chunks_.usage(usage, reasoning_tokens)});
  }

  std::string whole(std::vector<std::string> logprobs, const backend::token_usage& usage,
                    std::optional<std::int64_t> reasoning_tokens) override {
    std::vector<choice_result> results;
    results.reserve(choices_.size());
    for (std::size_t i = 0; i < choices_.size(); ++i) {
      choice& c = choices_[i];
      results.push_back({.text = std::move(c.text),
                         .message = std::move(c.message),
                         .reason = c.reason,
                         .logprobs = i < logprobs.size() ? std::move(logprobs[i]) : std::string("null")});
    }
    return completion_body(meta_, results, usage, reasoning_tokens);
  }

  named_event failure(const refusal& failure) override { return {{}, refusal_body(failure)}; }
  bool ends_with_done() const override { return true; }

 private:
  struct choice {
    std::string text;                 // completions, not streamed
    assistant_message message;        // chat, not streamed
    bool made_tool_calls = false;     // chat: some tool call has begun
    backend::finish_reason reason = backend::finish_reason::stop;
  };

  // The relay hands only indices of the answer's choices (it drops any other).
  choice& at(std::int32_t index) { return choices_[static_cast<std::size_t>(index)]; }
  // What choice i's text starts with under echo: its prompt's.
  const std::string& echoed_of(std::size_t i) const {
    static const std::string none;
    const std::size_t prompt = i / per_prompt_;
    return prompt < echoed_.size() ? echoed_[prompt] : none;
  }

  chunk_builder chunks_;
  response_meta meta_;
  bool stream_;
  bool include_usage_;
  bool echo_alone_;  // completions: echo without logprobs, whose prompt event never comes
  std::size_t per_prompt_;            // n: choices of each prompt
  std::vector<std::string> echoed_;   // each prompt's text under echo (one per prompt)
  std::vector<choice> choices_;
};

// Anthropic's message: messages_answer's events and message, over the one choice.
class messages_writer final : public answer_writer {
 public:
  messages_writer(std::string id, std::string model, const backend::token_usage& usage)
      : answer_(std::move(id), std::move(model), usage) {}

  // As Anthropic's streams open: the message, then a ping.
  void open(std::vector<named_event>& out) override {
    out.push_back(answer_.start());
    out.push_back(*heartbeat());
  }
  std::optional<named_event> heartbeat() const override { return named_event{"ping", {{"type", "ping"}}}; }
  void echo(std::int32_t, boost::json::value, std::vector<named_event>&) override {}
  void output(std::int32_t, const output_event& event, boost::json::value, std::vector<named_event>& out) override {
    answer_.add(event, out);
  }
  void text(std::int32_t, std::string_view text, boost::json::value, std::vector<named_event>& out) override {
    answer_.add(content_delta{std::string(text)}, out);
  }
  void choice_end(std::int32_t, backend::finish_reason reason, std::string_view stop_string, boost::json::value,
                  std::vector<named_event>&) override {
    reason_ = reason;
    stop_string_ = stop_string;
  }
  void end(const backend::token_usage& usage, std::optional<std::int64_t>, std::vector<named_event>& out) override {
    answer_.finish(reason_, stop_string_, usage, out);
  }
  std::string whole(std::vector<std::string>, const backend::token_usage& usage,
                    std::optional<std::int64_t> reasoning_tokens) override {
    std::vector<named_event> unsent;
    end(usage, reasoning_tokens, unsent);
    return boost::json::serialize(answer_.message());
  }
  named_event failure(const refusal& failure) override {
    return {"error", anthropic_error_body(refusal_info(failure.kind).status, failure.message)};
  }
  bool ends_with_done() const override { return false; }

 private:
  messages_answer answer_;
  backend::finish_reason reason_ = backend::finish_reason::stop;
  std::string stop_string_;
};

// OpenAI's response: responses_answer's events and response, over the one choice.
class responses_writer final : public answer_writer {
 public:
  responses_writer(std::string id, std::string model, std::int64_t created_at, boost::json::object echo, bool store)
      : answer_(std::move(id), std::move(model), created_at, std::move(echo)), store_(store) {}

  void open(std::vector<named_event>& out) override { answer_.start(out); }
  void echo(std::int32_t, boost::json::value, std::vector<named_event>&) override {}
  void output(std::int32_t, const output_event& event, boost::json::value, std::vector<named_event>& out) override {
    answer_.add(event, out);
  }
  void text(std::int32_t, std::string_view text, boost::json::value, std::vector<named_event>& out) override {
    answer_.add(content_delta{std::string(text)}, out);
  }
  void choice_end(std::int32_t, backend::finish_reason reason, std::string_view, boost::json::value,
                  std::vector<named_event>&) override {
    reason_ = reason;
  }
  void end(const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens,
           std::vector<named_event>& out) override {
    answer_.finish(reason_, usage, reasoning_tokens, out);
    ended_ = true;
  }
  std::string whole(std::vector<std::string>, const backend::token_usage& usage,
                    std::optional<std::int64_t> reasoning_tokens) override {
    std::vector<named_event> unsent;
    end(usage, reasoning_tokens, unsent);
    return boost::json::serialize(answer_.response());
  }
  named_event failure(const refusal& failure) override {
    const refusal_row& row = refusal_info(failure.kind);
    return answer_.failure(row.code.empty() ? row.type : row.code, failure.message);
  }
  bool ends_with_done() const override { return false; }
  std::optional<boost::json::object> kept() const override {
    if (!store_ || !ended_) return std::nullopt;
    return answer_.response();
  }

 private:
  responses_answer answer_;
  bool store_;
  bool ended_ = false;
  backend::finish_reason reason_ = backend::finish_reason::stop;
};

}  // namespace

std::unique_ptr<answer_writer> make_responses_writer(std::string id, std::string model, std::int64_t created_at,
                                                     boost::json::object echo, bool store) {
  return std::make_unique<responses_writer>(std::move(id), std::move(model), created_at, std::move(echo), store);
}

std::unique_ptr<answer_writer> make_openai_writer(response_meta meta, const openai_request& r,
                                                  std::vector<std::string> echoed) {
  return std::make_unique<openai_writer>(std::move(meta), r, std::move(echoed));
}

std::unique_ptr<answer_writer> make_messages_writer(std::string id, std::string model,
                                                    const backend::token_usage& usage) {
  return std::make_unique<messages_writer>(std::move(id), std::move(model), usage);
}

}  // namespace edge::gateway
