// The built-in chat templates. Each renderer reproduces, character for character, what the
// model family's reference Jinja template renders (tokenizer_config.json "chat_template"):
//
// llama-2   meta-llama/Llama-2-*-chat-hf: BOS before every [INST], the system prompt inside the
//           first user turn, contents stripped (Python str.strip()), assistant turns end " EOS".
// llama-3   meta-llama/Meta-Llama-3-*-Instruct: header per message, contents trimmed, BOS once.
// chatml    Qwen2/Qwen3 and other ChatML models, without any model-specific default system
//           prompt.
// mistral   mistralai/Mistral-7B-Instruct-v0.2/v0.3 (current template): "[INST] user[/INST]",
//           " assistant</s>", the system prompt before the last user message.
// plain     "role: content" lines, then "assistant:".
#include "edge/backend/tokenizer/chat_template.h"

#include <array>
#include <utility>

#include "edge/common/utf8.h"

namespace edge::backend {
namespace {

// Python's str.isspace() set, which Jinja's strip()/trim() use.
bool is_python_space(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string_view python_strip(std::string_view text) {
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t length = utf8::valid_length(text, begin);
    if (length == 0 || !is_python_space(utf8::decode(text.substr(begin), length))) break;
    begin += length;
  }
  std::size_t end = text.size();
  while (end > begin) {
    std::size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    const std::size_t length = utf8::valid_length(text, start);
    if (length != end - start || !is_python_space(utf8::decode(text.substr(start), length))) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

// Templates that take a leading system message out of the loop.
std::pair<const chat_message*, std::span<const chat_message>> split_system(std::span<const chat_message> messages) {
  if (!messages.empty() && messages.front().role == "system") return {&messages.front(), messages.subspan(1)};
  return {nullptr, messages};
}

std::string render_llama2(std::span<const chat_message> messages, const chat_render_options& options) {
  const auto [system, turns] = split_system(messages);
  std::string out;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    std::string content;
    if (i == 0 && system) {
      content = "<<SYS>>\n" + system->content + "\n<</SYS>>\n\n" + turns[i].content;
    } else {
      content = turns[i].content;
    }
    if (turns[i].role == "user") {
      out += options.bos_text;
      out += "[INST] ";
      out += python_strip(content);
      out += " [/INST]";
    } else if (turns[i].role == "assistant") {
      out += ' ';
      out += python_strip(content);
      out += ' ';
      out += options.eos_text;
    }
  }
  return out;
}

std::string render_llama3(std::span<const chat_message> messages, const chat_render_options& options) {
  std::string out = messages.empty() ? std::string() : options.bos_text;
  for (const chat_message& m : messages) {
    out += "<|start_header_id|>";
    out += m.role;
    out += "<|end_header_id|>\n\n";
    out += python_strip(m.content);
    out += "<|eot_id|>";
  }
  if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_chatml(std::span<const chat_message> messages, const chat_render_options& options) {
  std::string out;
  for (const chat_message& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += '\n';
    out += m.content;
    out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_mistral(std::span<const chat_message> messages, const chat_render_options& options) {
  const auto [system, turns] = split_system(messages);
  std::string out = options.bos_text;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].role == "user") {
      out += "[INST] ";
      if (system && i + 1 == turns.size()) {
        out += system->content;
        out += "\n\n";
      }
      out += turns[i].content;
      out += "[/INST]";
    } else if (turns[i].role == "assistant") {
      out += ' ';
      out += turns[i].content;
      out += options.eos_text;
    }
  }
  return out;
}

std::string render_plain(std::span<const chat_message> messages, const chat_render_options& options) {
  std::string out;
  for (const chat_message& m : messages) {
    out += m.role;
    out += ": ";
    out += m.content;
    out += '\n';
  }
  if (options.add_generation_prompt) out += "assistant:";
  return out;
}

}  // namespace

std::string_view to_string(chat_template_kind kind) {
  switch (kind) {
    case chat_template_kind::plain: return "plain";
    case chat_template_kind::llama2: return "llama-2";
    case chat_template_kind::llama3: return "llama-3";
    case chat_template_kind::chatml: return "chatml";
    case chat_template_kind::mistral: return "mistral";
  }
  return "plain";
}

std::optional<chat_template_kind> parse_chat_template_name(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, chat_template_kind>, 7> names = {{
      {"plain", chat_template_kind::plain},
      {"llama-2", chat_template_kind::llama2},
      {"llama2", chat_template_kind::llama2},
      {"llama-3", chat_template_kind::llama3},
      {"llama3", chat_template_kind::llama3},
      {"chatml", chat_template_kind::chatml},
      {"mistral", chat_template_kind::mistral},
  }};
  for (const auto& [text, kind] : names) {
    if (text == name) return kind;
  }
  return std::nullopt;
}

std::optional<chat_template_kind> detect_chat_template(std::string_view jinja_source) {
  const auto has = [&](std::string_view needle) { return jinja_source.find(needle) != std::string_view::npos; };
  if (has("<|im_start|>")) return chat_template_kind::chatml;
  if (has("<|start_header_id|>")) return chat_template_kind::llama3;
  if (has("[INST]")) return has("<<SYS>>") ? chat_template_kind::llama2 : chat_template_kind::mistral;
  return std::nullopt;
}

std::string render_chat(chat_template_kind kind, std::span<const chat_message> messages,
                        const chat_render_options& options) {
  switch (kind) {
    case chat_template_kind::llama2: return render_llama2(messages, options);
    case chat_template_kind::llama3: return render_llama3(messages, options);
    case chat_template_kind::chatml: return render_chatml(messages, options);
    case chat_template_kind::mistral: return render_mistral(messages, options);
    case chat_template_kind::plain: return render_plain(messages, options);
  }
  return render_plain(messages, options);
}

}  // namespace edge::backend
