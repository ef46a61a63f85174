// `edgeinfer tokenize`: text to token ids and back with a model's tokenizer, without loading
// its weights. One text (--text or all of stdin) prints one JSON array; --batch-jsonl turns
// every stdin line holding a JSON string into a line holding a JSON array (and, with --decode,
// arrays back into strings), so that many texts cost one process start.
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/string.hpp>
#include <boost/json/value.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <iterator>
#include <sstream>

#include "commands.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/format.h"
#include "edge/common/log.h"

namespace edge::cli {
namespace {

config::schema tokenize_options() {
  config::schema s;
  s.add_path("model", std::nullopt, "Model whose tokenizer to use: a GGUF, a llama2.c checkpoint or a Hugging Face folder");
  s.add_path("tokenizer", std::nullopt, "Tokenizer file: tokenizer.json, a GGUF or a llama2.c tokenizer.bin");
  s.add_string("text", std::nullopt, "Text to encode (default: all of standard input, byte for byte)");
  s.add_boolean("decode", false, "Decode instead: the input is a JSON array or whitespace-separated ids; prints the text and a newline");
  s.add_boolean("bos", true, "Prepend BOS where the model's tokenizer does (--no-bos: never)");
  s.add_boolean("special", true,
                "Encode special-token text such as <|im_start|> as the special token, and print special tokens "
                "when decoding (--no-special: treat it as plain text, leave them out)");
  s.add_boolean("batch-jsonl", false,
                "Read one JSON string per line, write one JSON array of ids per line (with --decode: arrays in, "
                "strings out)");
  return s;
}

void write_out(std::string_view text) { std::fwrite(text.data(), 1, text.size(), stdout); }

std::string ids_to_json(const std::vector<backend::token_id>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
  return out;
}

// A JSON array of integers, or integers separated by whitespace (and optionally commas).
result<std::vector<backend::token_id>> parse_ids(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  std::vector<backend::token_id> ids;
  if (first != std::string_view::npos && text[first] == '[') {
    boost::system::error_code ec;
    const boost::json::value value = boost::json::parse(text, ec);
    if (ec || !value.is_array()) return invalid_argument(format("not a JSON array of token ids: {}", text));
    for (const auto& element : value.as_array()) {
      if (!element.is_int64() && !element.is_uint64()) return invalid_argument(format("not a token id: {}", boost::json::serialize(element)));
      const std::int64_t id = element.is_int64() ? element.as_int64() : static_cast<std::int64_t>(element.as_uint64());
      if (id < 0 || id > INT32_MAX) return invalid_argument(format("token id {} is out of range", id));
      ids.push_back(static_cast<backend::token_id>(id));
    }
    return ids;
  }
  std::string cleaned(text);
  for (char& c : cleaned) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(cleaned);
  std::string word;
  while (in >> word) {
    std::size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || id < 0 || id > INT32_MAX) return invalid_argument(format("not a token id: {}", word));
    ids.push_back(static_cast<backend::token_id>(id));
  }
  return ids;
}

// Which of --model and --tokenizer to use: nullopt when neither or both come from one source.
// Otherwise the one from the stronger source (flag > environment > file) wins, so that an
// EDGE_MODEL in the environment does not get in the way of --tokenizer.
std::optional<std::string> chosen_option(const config::values& settings) {
  const bool has_model = settings.has("model");
  const bool has_tokenizer = settings.has("tokenizer");
  if (has_model && has_tokenizer) {
    const auto model_source = settings.source_of("model");
    const auto tokenizer_source = settings.source_of("tokenizer");
    if (model_source == tokenizer_source) return std::nullopt;
    return tokenizer_source > model_source ? "tokenizer" : "model";
  }
  if (has_tokenizer) return "tokenizer";
  if (has_model) return "model";
  return std::nullopt;
}

int run_batch(const backend::tokenizer& tok, const backend::encode_options& options, bool decode, bool with_special,
              const logger& log) {
  std::string line;
  std::string out;
  std::size_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.clear();
    if (decode) {
      auto ids = parse_ids(line);
      if (!ids.ok()) {
        log.error("line {}: {}", number, ids.error().message());
        return 1;
      }
      out = boost::json::serialize(boost::json::string(tok.decode(*ids, with_special)));
    } else {
      boost::system::error_code ec;
      const boost::json::value value = boost::json::parse(line, ec);
      if (ec || !value.is_string()) {
        log.error("line {}: expected a JSON string", number);
        return 1;
      }
      const boost::json::string& text = value.as_string();
      out = ids_to_json(tok.encode(std::string_view(text.data(), text.size()), options));
    }
    out += '\n';
    write_out(out);
  }
  std::fflush(stdout);
  return 0;
}

int run_tokenize(const config::values& settings) {
  const logger log{"tokenize"};
  const auto option = chosen_option(settings);
  if (!option) {
    std::fprintf(stderr, "edgeinfer tokenize: give --model or --tokenizer (one of them)\n");
    return 2;
  }
  auto loaded = *option == "tokenizer" ? backend::load_tokenizer(settings.string("tokenizer"))
                                       : backend::load_model_tokenizer(settings.string("model"));
  if (!loaded.ok()) {
    log.error("{}", loaded.error().message());
    return 1;
  }
  const backend::tokenizer& tok = **loaded;
  const bool decode = settings.boolean("decode");
  const bool special = settings.boolean("special");
  const backend::encode_options options{.add_bos = settings.boolean("bos"), .parse_special = special};
  if (settings.boolean("batch-jsonl")) return run_batch(tok, options, decode, special, log);

  std::string input;
  if (auto text = settings.optional_string("text")) {
    input = std::move(*text);
  } else {
    input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (decode) {
    auto ids = parse_ids(input);
    if (!ids.ok()) {
      log.error("{}", ids.error().message());
      return 1;
    }
    write_out(tok.decode(*ids, special) + "\n");
  } else {
    write_out(ids_to_json(tok.encode(input, options)) + "\n");
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

command make_tokenize_command(CLI::App& app) {
  return command(app, "tokenize", "Turn text into token ids (or ids into text) with a model's tokenizer",
                 tokenize_options(), run_tokenize);
}

}  // namespace edge::cli
