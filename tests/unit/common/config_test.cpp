#include <doctest/doctest.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include "edge/common/config.h"

namespace {

using namespace std::chrono_literals;
namespace config = edge::config;

config::schema test_schema() {
  config::schema s;
  s.add_string("host", "127.0.0.1", "listen address");
  s.add_integer("port", 8080, 0, 65535, "listen port");
  s.add_bytes("max-body", "4MiB", 1024, std::int64_t{1} << 30, "body limit");
  s.add_duration("shutdown-timeout", "30s", 0ms, 24h, "drain time");
  s.add_boolean("enable-prefix-caching", true, "prefix cache");
  s.add_number("gpu-memory-utilization", 0.9, 0.05, 1.0, "memory share");
  s.add_choice("log-format", "text", {"text", "json"}, "log format");
  s.add_path("model", std::nullopt, "model path");
  return s;
}

// A TOML file in a fresh temporary folder, removed when the test ends.
struct temp_file {
  std::filesystem::path path;
  explicit temp_file(const std::string& contents) {
    path = std::filesystem::temp_directory_path() /
           ("edge_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".toml");
    std::ofstream(path) << contents;
  }
  ~temp_file() { std::filesystem::remove(path); }
  static inline int counter = 0;
};

config::sources with(std::map<std::string, std::string> flags, std::map<std::string, std::string> env) {
  return {.flags = std::move(flags),
          .getenv = [env = std::move(env)](const std::string& name) -> std::optional<std::string> {
            auto it = env.find(name);
            if (it == env.end()) return std::nullopt;
            return it->second;
          }};
}

}  // namespace

TEST_CASE("defaults apply when nothing else is given") {
  auto v = config::resolve(test_schema(), with({}, {}));
  REQUIRE(v.ok());
  CHECK(v->string("host") == "127.0.0.1");
  CHECK(v->integer("port") == 8080);
  CHECK(v->bytes("max-body") == 4u << 20);
  CHECK(v->duration("shutdown-timeout") == 30s);
  CHECK(v->boolean("enable-prefix-caching"));
  CHECK(v->number("gpu-memory-utilization") == doctest::Approx(0.9));
  CHECK(v->string("log-format") == "text");
  CHECK_FALSE(v->has("model"));
  CHECK_FALSE(v->optional_string("model").has_value());
  CHECK(v->source_of("port") == config::origin::default_value);
}

TEST_CASE("precedence: flag > environment > file > default") {
  temp_file file("port = 1111\nhost = \"10.0.0.1\"\nmax_body = \"8MiB\"\nlog_format = \"json\"\n");
  const std::string path = file.path.string();

  SUBCASE("the file beats the default") {
    auto v = config::resolve(test_schema(), with({{"config", path}}, {}));
    REQUIRE(v.ok());
    CHECK(v->integer("port") == 1111);
    CHECK(v->source_of("port") == config::origin::file);
    CHECK(v->string("host") == "10.0.0.1");
    CHECK(v->bytes("max-body") == 8u << 20);
    CHECK(v->string("log-format") == "json");
    CHECK(v->duration("shutdown-timeout") == 30s);
  }
  SUBCASE("the environment beats the file") {
    auto v = config::resolve(test_schema(), with({{"config", path}}, {{"EDGE_PORT", "2222"}}));
    REQUIRE(v.ok());
    CHECK(v->integer("port") == 2222);
    CHECK(v->source_of("port") == config::origin::environment);
    CHECK(v->string("host") == "10.0.0.1");
  }
  SUBCASE("a flag beats the environment") {
    auto v = config::resolve(test_schema(), with({{"config", path}, {"port", "3333"}}, {{"EDGE_PORT", "2222"}}));
    REQUIRE(v.ok());
    CHECK(v->integer("port") == 3333);
    CHECK(v->source_of("port") == config::origin::flag);
  }
  SUBCASE("EDGE_CONFIG names the file when --config is absent") {
    auto v = config::resolve(test_schema(), with({}, {{"EDGE_CONFIG", path}}));
    REQUIRE(v.ok());
    CHECK(v->integer("port") == 1111);
  }
  SUBCASE("an empty environment variable counts as unset") {
    auto v = config::resolve(test_schema(), with({{"config", path}}, {{"EDGE_PORT", ""}}));
    REQUIRE(v.ok());
    CHECK(v->integer("port") == 1111);
  }
}

TEST_CASE("bad values name the option, the source and what was expected") {
  SUBCASE("environment") {
    auto v = config::resolve(test_schema(), with({}, {{"EDGE_PORT", "80x"}}));
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().code() == edge::status_code::invalid_argument);
    CHECK(v.error().message() ==
          "invalid value \"80x\" for port (environment variable EDGE_PORT): expected an integer from 0 to 65535");
  }
  SUBCASE("flag out of range") {
    auto v = config::resolve(test_schema(), with({{"port", "70000"}}, {}));
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().message() ==
          "invalid value \"70000\" for port (flag --port): expected an integer from 0 to 65535");
  }
  SUBCASE("choice") {
    auto v = config::resolve(test_schema(), with({{"log-format", "xml"}}, {}));
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().message() == "invalid value \"xml\" for log-format (flag --log-format): expected one of text or json");
  }
  SUBCASE("bytes") {
    auto v = config::resolve(test_schema(), with({{"max-body", "4 parsecs"}}, {}));
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().message() ==
          "invalid value \"4 parsecs\" for max-body (flag --max-body): expected a size such as 4096, 512KiB or "
          "4MiB from 1 KiB to 1 GiB");
  }
  SUBCASE("boolean") {
    auto v = config::resolve(test_schema(), with({}, {{"EDGE_ENABLE_PREFIX_CACHING", "maybe"}}));
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().message().find("expected true or false") != std::string::npos);
  }
  SUBCASE("wrong TOML type") {
    temp_file file("port = \"8080\"\n");
    auto v = config::resolve(test_schema(), with({{"config", file.path.string()}}, {}));
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().message() == "invalid value for port (" + file.path.string() +
                                     " line 1): expected an integer from 0 to 65535, found a string");
  }
  SUBCASE("several problems are reported together") {
    auto v = config::resolve(test_schema(), with({{"port", "x"}}, {{"EDGE_MAX_BODY", "1"}}));
    REQUIRE_FALSE(v.ok());
    const std::string& m = v.error().message();
    INFO(m);
    CHECK(m.rfind("configuration errors:\n", 0) == 0);
    CHECK(m.find("for port (flag --port)") != std::string::npos);
    CHECK(m.find("for max-body (environment variable EDGE_MAX_BODY)") != std::string::npos);
  }
}

TEST_CASE("unknown file keys are errors with a suggestion") {
  temp_file file("host = \"0.0.0.0\"\nprot = 9000\n");
  auto v = config::resolve(test_schema(), with({{"config", file.path.string()}}, {}));
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().message() ==
        "unknown key \"prot\" in " + file.path.string() + " (line 2); did you mean \"port\"?");

  temp_file dashed("max-body = \"1MiB\"\n");
  auto d = config::resolve(test_schema(), with({{"config", dashed.path.string()}}, {}));
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().message().find("did you mean \"max_body\"?") != std::string::npos);

  temp_file unrelated("completely_unrelated_setting = 1\n");
  auto u = config::resolve(test_schema(), with({{"config", unrelated.path.string()}}, {}));
  REQUIRE_FALSE(u.ok());
  CHECK(u.error().message().find("did you mean") == std::string::npos);
}

TEST_CASE("TOML syntax errors and missing files are reported with their location") {
  temp_file broken("port = = 1\n");
  auto v = config::resolve(test_schema(), with({{"config", broken.path.string()}}, {}));
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().message().rfind("config file " + broken.path.string() + " line 1, column", 0) == 0);

  auto missing = config::resolve(test_schema(), with({{"config", "/nonexistent/edge.toml"}}, {}));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message().find("/nonexistent/edge.toml") != std::string::npos);
}

TEST_CASE("sizes and durations parse with units") {
  CHECK(*config::parse_bytes("4096") == 4096);
  CHECK(*config::parse_bytes("4KiB") == 4096);
  CHECK(*config::parse_bytes("4kb") == 4000);
  CHECK(*config::parse_bytes("1.5GiB") == 1610612736);
  CHECK(*config::parse_bytes(" 2 MiB ") == 2097152);
  CHECK_FALSE(config::parse_bytes("-1").ok());
  CHECK_FALSE(config::parse_bytes("MiB").ok());
  CHECK_FALSE(config::parse_bytes("3 furlongs").ok());

  CHECK(*config::parse_duration("250ms") == 250ms);
  CHECK(*config::parse_duration("30s") == 30s);
  CHECK(*config::parse_duration("30") == 30s);
  CHECK(*config::parse_duration("1.5") == 1500ms);
  CHECK(*config::parse_duration("2m") == 120s);
  CHECK(*config::parse_duration("1h") == 3600s);
  CHECK_FALSE(config::parse_duration("soon").ok());
  CHECK_FALSE(config::parse_duration("5 days").ok());
}

TEST_CASE("TOML durations and sizes accept numbers and strings") {
  temp_file file("shutdown_timeout = 5\nmax_body = 2048\ngpu_memory_utilization = 1\nenable_prefix_caching = false\n");
  auto v = config::resolve(test_schema(), with({{"config", file.path.string()}}, {}));
  REQUIRE(v.ok());
  CHECK(v->duration("shutdown-timeout") == 5s);
  CHECK(v->bytes("max-body") == 2048);
  CHECK(v->number("gpu-memory-utilization") == doctest::Approx(1.0));
  CHECK_FALSE(v->boolean("enable-prefix-caching"));
}

TEST_CASE("the CLI11 binding records only the flags given") {
  const config::schema s = test_schema();
  CLI::App app;
  config::cli_binding binding(app, s);
  const char* argv[] = {"edgeinfer", "--port", "9000", "--no-enable-prefix-caching", "--max-body=1MiB"};
  app.parse(5, argv);
  const auto& given = binding.given();
  CHECK(given.size() == 3);
  CHECK(given.at("port") == "9000");
  CHECK(given.at("enable-prefix-caching") == "false");
  CHECK(given.at("max-body") == "1MiB");

  auto v = config::resolve(s, with(given, {{"EDGE_PORT", "1"}}));
  REQUIRE(v.ok());
  CHECK(v->integer("port") == 9000);
  CHECK_FALSE(v->boolean("enable-prefix-caching"));
  CHECK(v->bytes("max-body") == 1u << 20);
}

TEST_CASE("a repeatable flag given several times settles as one comma-separated list") {
  CLI::App app;
  config::schema with_model;
  with_model.add_string("api-key", std::nullopt, "keys").also_repeatable();
  with_model.add_path("model", std::nullopt, "model path").also_positional();
  config::cli_binding binding(app, with_model);
  // Each --api-key takes one value: what follows the second one is the positional model.
  const char* argv[] = {"edgeinfer", "--api-key", "first", "--api-key=second", "--api-key", "third", "m.gguf"};
  app.parse(7, argv);
  CHECK(binding.given().at("api-key") == "first,second,third");
  CHECK(binding.given().at("model") == "m.gguf");

  CHECK_THROWS_AS(config::schema().add_integer("n", 1, 0, 9, "n").also_repeatable(), std::logic_error);
}

TEST_CASE("option names map to flags, variables and file keys in one way") {
  const config::option_spec spec{.name = "max-num-batched-tokens"};
  CHECK(spec.flag() == "--max-num-batched-tokens");
  CHECK(spec.env_name() == "EDGE_MAX_NUM_BATCHED_TOKENS");
  CHECK(spec.file_key() == "max_num_batched_tokens");
}

TEST_CASE("describe() never shows the value of a token, secret or password") {
  config::schema s;
  s.add_string("admin-token", std::nullopt, "admin token");
  s.add_string("api-key", std::nullopt, "API keys");
  s.add_string("host", "127.0.0.1", "listen address");
  auto settled = config::resolve(
      s, {.flags = {{"admin-token", "hunter2-hunter2-hunter2"}, {"api-key", "sk-opensesame"}}, .getenv = {}});
  REQUIRE(settled.ok());
  const std::string text = settled->describe();
  CHECK(text.find("hunter2") == std::string::npos);
  CHECK(text.find("opensesame") == std::string::npos);
  CHECK(text.find("api-key=<redacted> (flag)") != std::string::npos);
  CHECK(text.find("admin-token=<redacted> (flag)") != std::string::npos);
  CHECK(text.find("host=127.0.0.1 (default)") != std::string::npos);
}
