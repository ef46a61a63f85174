// Each template reproduces what the family's reference template renders for the five roles the API
// has, character for character (the unit tests hold the reference strings):
//
// llama-2   meta-llama/Llama-2-*-chat-hf: BOS before every [INST], the system prompt inside the
//           first user turn, contents stripped (Python str.strip()), assistant turns end " EOS".
// llama-3   meta-llama/Meta-Llama-3-*-Instruct: a header per message, contents trimmed, BOS once.
// chatml    Qwen2/Qwen3 and other ChatML models.
// mistral   mistralai/Mistral-7B-Instruct-v0.2/v0.3 (current template): "[INST] user[/INST]",
//           " assistant</s>", the system prompt before the last turn when it is the user's.
// plain     "role: content" lines, then "assistant:".
#include "chat_formats.h"

#include <array>
#include <cassert>

namespace edge::backend {
namespace {

constexpr std::string_view plain_jinja =
    R"({%- for message in messages -%}
{{- message['role'] + ': ' + message['content'] + '\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- 'assistant:' -}}{%- endif -%})";

constexpr std::string_view llama2_jinja =
    R"({%- if messages and messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set system_message = none -%}
{%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
{%- if loop.first and system_message is not none -%}
{%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] -%}
{%- else -%}
{%- set content = message['content'] -%}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}
{%- elif message['role'] == 'assistant' -%}
{{- ' ' + content | trim + ' ' + eos_token -}}
{%- endif -%}
{%- endfor -%})";

constexpr std::string_view llama3_jinja =
    R"({%- if messages -%}{{- bos_token -}}{%- endif -%}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%})";

constexpr std::string_view chatml_jinja =
    R"({%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%})";

constexpr std::string_view mistral_jinja =
    R"({%- if messages and messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set system_message = none -%}
{%- set turns = messages -%}
{%- endif -%}
{{- bos_token -}}
{%- for message in turns -%}
{%- if message['role'] == 'user' -%}
{%- if loop.last and system_message is not none -%}
{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' -}}
{%- else -%}
{{- '[INST] ' + message['content'] + '[/INST]' -}}
{%- endif -%}
{%- elif message['role'] == 'assistant' -%}
{{- ' ' + message['content'] + eos_token -}}
{%- endif -%}
{%- endfor -%})";

constexpr std::array<std::string_view, 1> llama2_also{"llama2"};
constexpr std::array<std::string_view, 1> llama3_also{"llama3"};

constexpr std::array<chat_format, 5> formats{{
    {.kind = chat_template_kind::plain, .name = "plain", .also = {}, .jinja = plain_jinja},
    {.kind = chat_template_kind::llama2, .name = "llama-2", .also = llama2_also, .jinja = llama2_jinja},
    {.kind = chat_template_kind::llama3, .name = "llama-3", .also = llama3_also, .jinja = llama3_jinja},
    {.kind = chat_template_kind::chatml, .name = "chatml", .also = {}, .jinja = chatml_jinja},
    {.kind = chat_template_kind::mistral, .name = "mistral", .also = {}, .jinja = mistral_jinja},
}};

}  // namespace

std::span<const chat_format> chat_formats() { return formats; }

const chat_format& chat_format_of(chat_template_kind kind) {
  const chat_format& f = formats[static_cast<std::size_t>(kind)];
  assert(f.kind == kind);
  return f;
}

}  // namespace edge::backend
