// The built-in chat templates against the strings the reference Jinja templates render.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "edge/backend/tokenizer/chat_template.h"

namespace {

using edge::backend::chat_message;
using edge::backend::chat_template_kind;

const std::vector<chat_message> conversation = {
    {"system", "You are helpful."},
    {"user", "Hi"},
    {"assistant", "Hello!"},
    {"user", "How are you?"},
};

std::string render(chat_template_kind kind, const std::vector<chat_message>& messages, std::string bos, std::string eos,
                   bool generation_prompt = true) {
  return edge::backend::render_chat(kind, messages,
                                    {.bos_text = std::move(bos), .eos_text = std::move(eos),
                                     .add_generation_prompt = generation_prompt});
}

}  // namespace

TEST_CASE("llama-2: BOS before each [INST], the system prompt inside the first turn") {
  CHECK(render(chat_template_kind::llama2, conversation, "<s>", "</s>") ==
        "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] How are you? [/INST]");
  // Contents are stripped (Jinja's str.strip(), Unicode spaces included).
  CHECK(render(chat_template_kind::llama2, {{"user", " \n Hi\xC2\xA0\t"}}, "<s>", "</s>") == "<s>[INST] Hi [/INST]");
  CHECK(render(chat_template_kind::llama2, {{"user", "Hi"}, {"assistant", " Yo "}}, "<s>", "</s>") ==
        "<s>[INST] Hi [/INST] Yo </s>");
}

TEST_CASE("llama-3: headers, trimmed contents, BOS once, the assistant header as the prompt") {
  CHECK(render(chat_template_kind::llama3, conversation, "<|begin_of_text|>", "<|eot_id|>") ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render(chat_template_kind::llama3, {{"user", "  x\n"}}, "<|begin_of_text|>", "", false) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

TEST_CASE("chatml: im_start/im_end per message, untouched contents") {
  CHECK(render(chat_template_kind::chatml, conversation, "", "") ==
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render(chat_template_kind::chatml, {{"user", " a "}}, "", "", false) == "<|im_start|>user\n a <|im_end|>\n");
}

TEST_CASE("mistral (v0.2/v0.3): no space before [/INST], the system prompt before the last user turn") {
  CHECK(render(chat_template_kind::mistral, conversation, "<s>", "</s>") ==
        "<s>[INST] Hi[/INST] Hello!</s>[INST] You are helpful.\n\nHow are you?[/INST]");
  CHECK(render(chat_template_kind::mistral, {{"user", "Hi"}}, "<s>", "</s>") == "<s>[INST] Hi[/INST]");
  // With the last turn not a user one, the system prompt has nowhere to go.
  CHECK(render(chat_template_kind::mistral, {{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}}, "<s>", "</s>") ==
        "<s>[INST] Hi[/INST] Yo</s>");
}

TEST_CASE("plain: role lines, then assistant:") {
  CHECK(render(chat_template_kind::plain, {{"system", "S"}, {"user", "Hi"}}, "", "") == "system: S\nuser: Hi\nassistant:");
  CHECK(render(chat_template_kind::plain, {{"user", "Hi"}}, "", "", false) == "user: Hi\n");
}

TEST_CASE("chat template names and fingerprints") {
  using edge::backend::detect_chat_template;
  using edge::backend::parse_chat_template_name;
  for (const auto kind : {chat_template_kind::plain, chat_template_kind::llama2, chat_template_kind::llama3,
                          chat_template_kind::chatml, chat_template_kind::mistral}) {
    CHECK(parse_chat_template_name(edge::backend::to_string(kind)) == kind);
  }
  CHECK(parse_chat_template_name("llama3") == chat_template_kind::llama3);
  CHECK(parse_chat_template_name("llama2") == chat_template_kind::llama2);
  CHECK_FALSE(parse_chat_template_name("vicuna").has_value());

  CHECK(detect_chat_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                             "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}") == chat_template_kind::chatml);
  CHECK(detect_chat_template("{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
                             "+ message['content'] | trim + '<|eot_id|>' %}") == chat_template_kind::llama3);
  CHECK(detect_chat_template("{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' %}"
                             "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}") == chat_template_kind::llama2);
  CHECK(detect_chat_template("{{- bos_token }}{%- for message in loop_messages %}"
                             "{{- '[INST] ' + message['content'] + '[/INST]' }}") == chat_template_kind::mistral);
  CHECK_FALSE(detect_chat_template("{{ '<start_of_turn>' + role }}").has_value());
}
