// Writes the seed corpora of the parser fuzzers: small valid GGUF and safetensors files that
// between them use every metadata value type, nested arrays, every accepted tensor type, a
// non-default alignment and safetensors metadata; OpenAI request bodies that use every field;
// tokenizers of both families in every format the loaders read (tokenizer_seeds.h); the
// internal protocol's requests, events, info and load bodies; admin API bodies and query
// strings; JSON schemas and grammar texts; chat templates; model output in every tool-call and
// reasoning syntax. Mutations of valid inputs reach far deeper into a parser than random bytes do.
//
//   edge_fuzz_seeds DIR     writes DIR/<fuzzer>/* for each fuzzer (its name without
//                           edge_fuzz_), and DIR/tokenizers/, the tokenizers that
//                           edge_fuzz_tokenizer_encode loads
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model_test_support.h"
#include "tokenizer_seeds.h"

namespace {

namespace fs = std::filesystem;
namespace t = edge::testing;

std::vector<std::vector<std::byte>> gguf_seeds() {
  std::vector<std::vector<std::byte>> seeds;
  // Every value type, a nested array, and tensors of the three accepted types.
  seeds.push_back(t::make_gguf(
      8,
      [](t::byte_writer& w) {
        w.str("general.architecture").put<std::uint32_t>(t::gguf_string).str("llama");
        w.str("llama.block_count").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(1);
        w.str("small").put<std::uint32_t>(t::gguf_i8).put<std::int8_t>(-3);
        w.str("flag").put<std::uint32_t>(t::gguf_bool).put<std::uint8_t>(1);
        w.str("eps").put<std::uint32_t>(t::gguf_f32).put<float>(1e-5f);
        w.str("big").put<std::uint32_t>(t::gguf_f64).put<double>(1e300);
        w.str("tokenizer.ggml.tokens").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_string);
        w.put<std::uint64_t>(3).str("<s>").str("a").str("\xe2\x96\x81the");
        w.str("nested").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_array).put<std::uint64_t>(1);
        w.put<std::uint32_t>(t::gguf_u16).put<std::uint64_t>(2).put<std::uint16_t>(7).put<std::uint16_t>(9);
      },
      {{"token_embd.weight", {4, 3}, t::ggml_f32, t::f32_bytes({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})},
       {"output_norm.weight", {4}, t::ggml_f16, std::vector<std::byte>(8, std::byte{0x3c})},
       {"blk.0.attn_q.weight", {2, 2, 1, 1}, t::ggml_bf16, std::vector<std::byte>(8, std::byte{0x3f})}}));
  // Version 2, alignment 64, integers of every width.
  seeds.push_back(t::make_gguf(
      7,
      [](t::byte_writer& w) {
        w.str("general.alignment").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(64);
        w.str("u8").put<std::uint32_t>(t::gguf_u8).put<std::uint8_t>(255);
        w.str("u16").put<std::uint32_t>(t::gguf_u16).put<std::uint16_t>(65535);
        w.str("i16").put<std::uint32_t>(t::gguf_i16).put<std::int16_t>(-2);
        w.str("i32").put<std::uint32_t>(t::gguf_i32).put<std::int32_t>(-1);
        w.str("u64").put<std::uint32_t>(t::gguf_u64).put<std::uint64_t>(1ull << 40);
        w.str("i64").put<std::uint32_t>(t::gguf_i64).put<std::int64_t>(-(1ll << 40));
      },
      {{"a", {8}, t::ggml_f32, t::f32_bytes({0, 1, 2, 3, 4, 5, 6, 7})}, {"b", {1}, t::ggml_f32, t::f32_bytes({1})}},
      64, 2));
  // No tensors, no metadata.
  seeds.push_back(t::make_gguf(0, [](t::byte_writer&) {}, {}));
  return seeds;
}

std::vector<std::vector<std::byte>> safetensors_seeds() {
  std::vector<std::vector<std::byte>> seeds;
  auto data = t::f32_bytes({1, 2, 3, 4});
  data.resize(26, std::byte{0x3f});
  seeds.push_back(t::make_safetensors(
      R"({"__metadata__": {"format": "pt", "edgeinfer_synthetic": "true"}, )"
      R"("model.embed_tokens.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, )"
      R"("model.norm.weight": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}, )"
      R"("lm_head.weight": {"dtype": "F16", "shape": [2, 1], "data_offsets": [22, 26]}}  )",
      data));
  seeds.push_back(t::make_safetensors(R"({"scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}})",
                                      t::f32_bytes({2.5f})));
  seeds.push_back(t::make_safetensors("{}", {}));
  return seeds;
}

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* bytes = reinterpret_cast<const std::byte*>(text.data());
  return {bytes, bytes + text.size()};
}

std::vector<std::vector<std::byte>> seeds_of(const std::vector<std::string>& texts) {
  std::vector<std::vector<std::byte>> seeds;
  for (const std::string& text : texts) seeds.push_back(bytes_of(text));
  return seeds;
}

// A GGUF string array.
void put_strings(t::byte_writer& w, std::string_view key, const std::vector<std::string>& values) {
  w.str(key).put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_string).put<std::uint64_t>(values.size());
  for (const std::string& value : values) w.str(value);
}

void put_u32(t::byte_writer& w, std::string_view key, std::uint32_t value) {
  w.str(key).put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(value);
}

void put_bool(t::byte_writer& w, std::string_view key, bool value) {
  w.str(key).put<std::uint32_t>(t::gguf_bool).put<std::uint8_t>(value ? 1 : 0);
}

void put_types(t::byte_writer& w, const std::vector<int>& types) {
  w.str("tokenizer.ggml.token_type").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_i32);
  w.put<std::uint64_t>(types.size());
  for (const int type : types) w.put<std::int32_t>(type);
}

// GGUF vocabularies as llama.cpp's converters write them, and llama.2c tokenizer files.
std::vector<std::vector<std::byte>> tokenizer_vocab_seeds() {
  std::vector<std::vector<std::byte>> seeds;
  const auto spm = edge::fuzz::spm_vocabulary();
  std::vector<std::string> spm_texts;
  std::vector<int> spm_types;
  for (const auto& piece : spm) {
    spm_texts.push_back(piece.text);
    spm_types.push_back(piece.gguf_type);
  }
  seeds.push_back(t::make_gguf(
      9,
      [&](t::byte_writer& w) {
        w.str("tokenizer.ggml.model").put<std::uint32_t>(t::gguf_string).str("llama");
        put_strings(w, "tokenizer.ggml.tokens", spm_texts);
        w.str("tokenizer.ggml.scores").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_f32);
        w.put<std::uint64_t>(spm.size());
        for (const auto& piece : spm) w.put<float>(piece.score);
        put_types(w, spm_types);
        put_u32(w, "tokenizer.ggml.bos_token_id", 1);
        put_u32(w, "tokenizer.ggml.eos_token_id", 2);
        put_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        put_bool(w, "tokenizer.ggml.add_bos_token", true);
        put_bool(w, "tokenizer.ggml.add_space_prefix", true);
      },
      {}));
  // No scores or types (byte tokens are found by their text), no dummy prefix.
  seeds.push_back(t::make_gguf(
      3,
      [&](t::byte_writer& w) {
        w.str("tokenizer.ggml.model").put<std::uint32_t>(t::gguf_string).str("llama");
        put_strings(w, "tokenizer.ggml.tokens", spm_texts);
        put_bool(w, "tokenizer.ggml.add_space_prefix", false);
      },
      {}));
  const auto bpe = edge::fuzz::byte_level_vocab();
  const auto first_special = static_cast<std::uint32_t>(bpe.tokens.size() - 3);
  seeds.push_back(t::make_gguf(
      7,
      [&](t::byte_writer& w) {
        w.str("tokenizer.ggml.model").put<std::uint32_t>(t::gguf_string).str("gpt2");
        w.str("tokenizer.ggml.pre").put<std::uint32_t>(t::gguf_string).str("llama-bpe");
        put_strings(w, "tokenizer.ggml.tokens", bpe.tokens);
        put_types(w, bpe.gguf_types);
        put_strings(w, "tokenizer.ggml.merges", bpe.merges);
        put_u32(w, "tokenizer.ggml.bos_token_id", first_special);
        put_bool(w, "tokenizer.ggml.add_bos_token", true);
      },
      {}));
  seeds.push_back(t::make_gguf(
      4,
      [&](t::byte_writer& w) {
        w.str("tokenizer.ggml.model").put<std::uint32_t>(t::gguf_string).str("gpt2");
        w.str("tokenizer.ggml.pre").put<std::uint32_t>(t::gguf_string).str("qwen2");
        put_strings(w, "tokenizer.ggml.tokens", bpe.tokens);
        put_strings(w, "tokenizer.ggml.merges", bpe.merges);
      },
      {}));
  seeds.push_back(bytes_of(edge::fuzz::llama2c_tokenizer_file()));
  return seeds;
}

std::vector<std::vector<std::byte>> internal_protocol_seeds() {
  return seeds_of({
      (R"({"id":"r1","tenant":"acme","weight":1.5,"priority":2,"cache_salt":"s","prompt":[1,403,407],)"
       R"("sampling":{"temperature":0.7,"top_k":40,"top_p":0.9,"min_p":0.05,"repetition_penalty":1.1,)"
       R"("presence_penalty":0.5,"frequency_penalty":-0.5,"seed":42},"max_tokens":16,"stop":["
","The end"],)"
       R"("stop_token_ids":[2],"ignore_eos":false,"logprobs":2})"),
      R"({"prompt":[1],"max_tokens":1,"sampling":{"seed":null},"logprobs":null})",
      R"({"prompt":[1],"max_tokens":1,"host_tier_cap_bytes":0,"disk_tier_cap_bytes":1073741824})",
      (R"({"prompt":[1,403],"max_tokens":4,"n":3,"prompt_logprobs":2,"sampling":{"logit_bias":{"403":-100,"7":2.5}},)"
       R"("logprobs":1,"skip_special_tokens":false,)"
       R"json("grammar":"(grammar (root (seq (lit 7b) (rep 0 3 (cls 97 122)) (lit 7d))))"})json"),
      R"({"type":"admitted"})",
      R"({"type":"delta","index":2,"text":"end","tokens":[9],"finish":"length"})",
      (R"({"type":"prompt_logprobs","logprobs":[{"id":403,"logprob":-1.5,"top":[{"id":2,"logprob":-0.5}]},)"
       R"({"id":407,"logprob":-0.25,"top":[]}]})"),
      R"({"type":"heartbeat"})",
      (R"({"type":"delta","text":"Once é","tokens":[403,7],"logprobs":[{"id":403,"logprob":-0.25,)"
       R"("top":[{"id":403,"logprob":-0.25},{"id":7,"logprob":-3.5}]},{"id":7,"logprob":-1e30,"top":[]}]})"),
      (R"({"type":"finished","reason":"length","error":"","usage":{"prompt_tokens":5,"completion_tokens":16,)"
       R"("cached_tokens":0},"timings":{"queued_seconds":0.01,"time_to_first_token":0.05,"total_seconds":0.5,)"
       R"("preemptions":1}})"),
      (R"({"model":"stories260K","context_length":512,"chat_template":"llama-2","tokenizer_fingerprint":)"
       R"("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","vocab_size":512,"block_size":16,)"
       R"("version":"0.1.0"})"),
      (R"({"waiting":1,"running":2,"in_flight":3,"kv_blocks_total":100,"kv_blocks_free":40,"kv_usage_ratio":0.6,)"
       R"("prefix_cache":{"block_size":16,"cached_blocks":10,"queries":100,"hits":25,"hit_rate":0.25}})"),
  });
}

std::vector<std::vector<std::byte>> admin_request_seeds() {
  return seeds_of({
      (R"({"id":"acme","weight":2,"quotas":{"requests_per_minute":600,"tokens_per_minute":100000,)"
       R"("max_concurrent":4,"daily_tokens":1000000,"max_tokens_per_request":null}})"),
      R"({"id":"acme-2.b_c","quotas":{"daily_tokens":null},"weight":0.5})",
      R"({"id":"acme","weight":1.25,"quotas":{"tokens_per_minute":null,"max_concurrent":8}})",
      R"({"id":"acme","quotas":{"kv_host_cache_bytes":1073741824,"kv_disk_cache_bytes":0}})",
      R"({"expires_in":3600})",
      R"({"expires_at":"2026-05-01T12:00:00Z"})",
      R"({"expires_at":1777636800,"expires_in":null})",
      "",
  });
}

std::vector<std::vector<std::byte>> query_string_seeds() {
  return seeds_of({
      "from=2026-05-01&to=2026-05-02T00:00:00Z",
      "from=1777636800&to=1777640400",
      "limit=50&before=1234",
      "to=2026-05-01T13:00Z&from=2026-04-30+13:00:00",
      "from=2026%2D05%2D01&to=9999-12-31T23:59:59%2B00:00",
      "org%2Fname%20x+y",
      "2026-05-01t13:00:00z",
  });
}

std::vector<std::vector<std::byte>> openai_request_seeds() {
  // Each seed in parentheses: adjacent literals are one seed, not several.
  const char* bodies[] = {
      (R"({"model":"stories260K","messages":[{"role":"system","content":"Be brief."},)"
       R"({"role":"user","content":[{"type":"text","text":"Once upon"},{"type":"text","text":" a time"}]},)"
       R"({"role":"assistant","content":null},{"role":"developer","content":"More."}],)"
       R"("max_completion_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":42,)"
       R"("stop":["\n","The end"],"presence_penalty":0.5,"frequency_penalty":-0.5,"n":1,"stream":true,)"
       R"("stream_options":{"include_usage":true},"user":"u","logprobs":false,"tools":[],)"
       R"("response_format":{"type":"text"}})"),
      (R"({"model":"m","prompt":"Once upon a time","max_tokens":16,"stop":"\n","best_of":1,"echo":false,)"
       R"("repetition_penalty":1.1,"ignore_eos":true,"seed":-1,"suffix":null})"),
      (R"({"messages":[{"role":"user","content":"Weather?","name":"u"},{"role":"assistant","content":null,)"
       R"("reasoning_content":"r","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather",)"
       R"("arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"21 C"}],)"
       R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d","strict":true,)"
       R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],)"
       R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,)"
       R"("chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true})"),
      R"({"prompt":[1,403,407,261,378],"max_tokens":3.0})",
      (R"({"prompt":"x","n":3,"best_of":3,"logprobs":5,"echo":true,"logit_bias":{"50256":-100,"7":100,"7":2}})"),
      (R"({"messages":[{"role":"user","content":"x"}],"n":2,"logprobs":true,"top_logprobs":20,)"
       R"("logit_bias":{"0":-0.5}})"),
      R"({"prompt":["text"],"stream":false})",
  };
  std::vector<std::vector<std::byte>> seeds;
  for (const std::string_view body : bodies) seeds.push_back(bytes_of(body));
  return seeds;
}

// A mode byte ('j': even, a JSON schema; 'g': odd, a grammar's text form), then the text; after
// a NUL, the matcher's choices.
std::vector<std::vector<std::byte>> grammar_seeds() {
  std::vector<std::vector<std::byte>> seeds;
  // Small grammars with choices that walk them to their end: '0' ends where the grammar may,
  // '1' and '2' pick allowed tokens, '3' tries any token. The fuzzer compiles one input in eight
  // (by a hash): each is written with several endings of its choices, so that some compile.
  const auto compiled = [&seeds](const std::string& text) {
    constexpr std::string_view choices = "1201230112021302";
    for (std::size_t extra = 0; extra < 24; ++extra) {
      std::string seed = text + '\0' + std::string(choices);
      seed.append(extra, '1');
      seeds.push_back(bytes_of(seed));
    }
  };
  const char* schemas[] = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name"],"additionalProperties":false})",
      R"({"anyOf":[{"type":"array","items":{"enum":["a",1,null]},"maxItems":2},{"type":"number","exclusiveMinimum":-1.5}]})",
      R"({"$defs":{"n":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["next"]}},"$ref":"#/$defs/n"})",
      R"({"type":"string","format":"date-time"})",
      R"({"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":{"type":"integer"}})",
      R"({"allOf":[{"properties":{"a":{"const":1}},"required":["a"]},{"properties":{"b":{"type":"string"}}}]})",
      R"({"type":"array","prefixItems":[{"type":"string","format":"uuid"}],"items":false,"nullable":true})",
  };
  for (const std::string_view schema : schemas) seeds.push_back(bytes_of("j" + std::string(schema)));
  seeds.push_back(bytes_of("g(grammar (rule 78 (alt (lit 78) (seq (lit 5b) (ref 0) (lit 5d)))) (root (seq (tok 3c7c63616c6c7c3e) (ref 0))))"));
  seeds.push_back(bytes_of("g(grammar (root (seq (num real -1.5 0 2 1) (rep 0 3 (cls 97 122)) (jchar))))"));
  for (const char* schema :
       {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"enum":["x",2]}},"required":["a"]})",
        R"({"type":"integer","minimum":-5,"maximum":12})", R"({"type":"string","maxLength":3})",
        R"({"type":"array","items":{"type":"boolean"},"maxItems":1})"}) {
    compiled("j" + std::string(schema));
  }
  compiled("g(grammar (rule 78 (alt (lit 78) (seq (lit 5b) (ref 0) (lit 5d)))) (root (ref 0)))");
  compiled("g(grammar (root (seq (lit 7b) (rep 1 3 (cls 97 122)) (lit 7d) (tok 3c7c656e647c3e))))");
  return seeds;
}

// Templates that use the statements, expressions, filters, tests and methods chat templates use
// (written for the fuzzer; the real templates the parity test reads are not copied here). A NUL
// byte starts the JSON context a seed renders with.
std::vector<std::vector<std::byte>> chat_template_seeds() {
  using namespace std::string_view_literals;
  const std::string_view templates[] = {
      R"({{- bos_token }}{%- for message in messages %}{{- '<|start|>' + message['role'] + '\n' + message['content'] | trim }})"
      R"({%- if not loop.last %}{{ eos_token }}{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{% endif %})",
      R"({%- if tools %}{%- for tool in tools %}{{ tool | tojson }}{{ '\n' if not loop.last }}{%- endfor %}{%- endif %})"
      R"({%- set ns = namespace(last=-1, multi=true) %}{%- for m in messages[::-1] %}{%- if ns.multi and m.role == 'user' %})"
      R"({%- set ns.multi = false %}{%- set ns.last = messages|length - 1 - loop.index0 %}{%- endif %}{%- endfor %})"
      R"({%- for m in messages %}{%- if m.role == 'assistant' and m.tool_calls is defined %}{%- for c in m.tool_calls %})"
      R"({%- if c.function %}{%- set c = c.function %}{%- endif %}<call>{"name": "{{ c.name }}", "arguments": )"
      R"({%- if c.arguments is string %}{{ c.arguments }}{%- else %}{{ c.arguments | tojson }}{%- endif %}}</call>)"
      R"({%- endfor %}{%- elif m.content is string and '</think>' in m.content %})"
      R"({{ m.content.split('</think>')[-1].lstrip('\n') }}{%- else %}{{ m.content }}{%- endif %}{%- endfor %})",
      R"({% macro render(items, depth=0) %}{% for k, v in items | dictsort %}{{ '  ' * depth }}{{ k }}: )"
      R"({% if v is mapping %}{{ render(v, depth + 1) }}{% else %}{{ v }}{% endif %}{% endfor %}{% endmacro %})"
      R"({% for tool in tools %}{{ render(tool.function.parameters) }}{% endfor %}{% call render({'a': 1}) %}x{% endcall %})",
      R"({% set t %}{{ 'x' ~ 1 ~ none }}{% endset %}{{ t | upper | replace('X', 'y') }}{{ [1, 2, 3][1:] | join(',') }})"
      R"({{ 7 // 2 }}{{ 2 ** 8 }}{{ 'a' if true else 'b' }}{{ range(3) | map('string') | list }}{% raw %}{{ x }}{% endraw %})"
      R"({{ '%s=%d' | format('n', 3) }}{{ '{}-{}'.format(1, 2) }}{{ {'b': 1, 'a': 2} | items | list }})",
      "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }} {{ m.content | default('', true) }}\n"
      "{% else %}empty{% endfor %}{{ raise_exception('stop') if messages | length > 9 }}\x00"
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": null}]})"sv,
  };
  std::vector<std::vector<std::byte>> seeds;
  for (const std::string_view source : templates) seeds.push_back(bytes_of(source));
  return seeds;
}

// The first byte chooses the parsers (output_parser_fuzz.cpp), the second how the text is cut.
std::vector<std::vector<std::byte>> output_parser_seeds() {
  const std::vector<std::pair<std::uint8_t, std::string_view>> answers = {
      {2 + 6, "<think>\nThe user wants the weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", "
              "\"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\"}"
              "\n</tool_call>"},
      {1, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; {\"name\": \"get_time\", "
          "\"parameters\": {}}"},
      {3 + 6 + 18, "weighing it</think>Both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                   "```json\n{\"city\": \"Lima\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {4 + 12, "<think>Looking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               "<|tool_call_argument_begin|>{\"city\": \"Kyoto\"}<|tool_call_end|><|tool_calls_section_end|>"},
      {5 + 6 + 36, "<think>x</think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New \"York\"</arg_value>\n"
                   "<arg_key>days</arg_key>\n<arg_value>five</arg_value>\n</tool_call><tool_call>get_time\n</tool_call>"},
      {2, "Text that mentions <tool_call> and é日本😀, then <tool_call>{\"name\": \"launch\", \"arguments\": {}}"
          "</tool_call>"},
  };
  std::vector<std::vector<std::byte>> seeds;
  for (std::size_t i = 0; i < answers.size(); ++i) {
    std::vector<std::byte> seed{std::byte{answers[i].first}, std::byte{static_cast<std::uint8_t>(i * 3)}};
    for (const char c : answers[i].second) seed.push_back(static_cast<std::byte>(c));
    seeds.push_back(std::move(seed));
  }
  return seeds;
}

bool write_all(const fs::path& folder, const std::vector<std::vector<std::byte>>& seeds) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", folder.c_str(), ec.message().c_str());
    return false;
  }
  for (std::size_t i = 0; i < seeds.size(); ++i) t::write_bytes(folder / ("seed-" + std::to_string(i)), seeds[i]);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const bool written =
      write_all(root / "gguf", gguf_seeds()) && write_all(root / "safetensors", safetensors_seeds()) &&
      write_all(root / "openai_request", openai_request_seeds()) &&
      write_all(root / "tokenizer_json", seeds_of(edge::fuzz::tokenizer_json_seeds())) &&
      write_all(root / "tokenizer_vocab", tokenizer_vocab_seeds()) &&
      write_all(root / "tokenizer_encode", seeds_of(edge::fuzz::tokenizer_encode_seeds())) &&
      write_all(root / "internal_protocol", internal_protocol_seeds()) &&
      write_all(root / "admin_request", admin_request_seeds()) &&
      write_all(root / "query_string", query_string_seeds()) && write_all(root / "grammar", grammar_seeds()) &&
      write_all(root / "chat_template", chat_template_seeds()) &&
      write_all(root / "output_parser", output_parser_seeds()) && write_all(root / "tokenizers", {});
  if (!written) return 1;
  t::write_text(root / "tokenizers" / "byte_level.json", edge::fuzz::byte_level_tokenizer_json());
  t::write_text(root / "tokenizers" / "spm_style.json", edge::fuzz::spm_style_tokenizer_json());
  t::write_text(root / "tokenizers" / "spm.bin", edge::fuzz::llama2c_tokenizer_file());
  return 0;
}
