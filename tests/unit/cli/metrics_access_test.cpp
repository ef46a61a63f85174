// /metrics's access from the serving commands' options (metrics_access_from): the token from
// --metrics-token or the first line of --metrics-token-file, open without one only on loopback.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "serve_command.h"
#include "test_support.h"

namespace {

namespace cli = edge::cli;
namespace config = edge::config;

edge::result<edge::gateway::metrics_access> access_for(const std::map<std::string, std::string>& flags) {
  config::sources from{.flags = {}, .getenv = [](const std::string&) -> std::optional<std::string> { return std::nullopt; }};
  for (const auto& [name, value] : flags) from.flags.emplace(name, value);
  auto settings = config::resolve(cli::serve_options(), from);
  REQUIRE_MESSAGE(settings.ok(), settings.error().message());
  return cli::metrics_access_from(*settings);
}

}  // namespace

TEST_CASE("metrics access: open without a token only where --host is a loopback address") {
  for (const char* host : {"127.0.0.1", "127.0.0.2", "::1", "localhost"}) {
    const auto access = access_for({{"host", host}});
    REQUIRE(access.ok());
    CHECK_MESSAGE(access->open, host);
    CHECK(access->token.empty());
  }
  for (const char* host : {"0.0.0.0", "::", "10.1.2.3", "edgeinfer.example"}) {
    const auto access = access_for({{"host", host}});
    REQUIRE(access.ok());
    CHECK_FALSE_MESSAGE(access->open, host);
  }
}

TEST_CASE("metrics access: the token from the flag or from a file's first line") {
  CHECK(access_for({{"metrics-token", "metrics-token-0123456789"}})->token == "metrics-token-0123456789");
  edge::testing::temp_dir dir;
  const auto file = dir.path() / "token";
  std::ofstream(file) << "metrics-token-from-file \r\nsecond line\n";
  const auto from_file = access_for({{"metrics-token-file", file.string()}, {"host", "0.0.0.0"}});
  REQUIRE(from_file.ok());
  CHECK(from_file->token == "metrics-token-from-file");

  const auto both = access_for({{"metrics-token", "metrics-token-0123456789"}, {"metrics-token-file", file.string()}});
  REQUIRE_FALSE(both.ok());
  CHECK(both.error().message().find("not both") != std::string::npos);
  const auto missing = access_for({{"metrics-token-file", (dir.path() / "absent").string()}});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message().find("cannot be read") != std::string::npos);
  const auto short_token = access_for({{"metrics-token", "short"}});
  REQUIRE_FALSE(short_token.ok());
  CHECK(short_token.error().message().find("at least 16") != std::string::npos);
  std::ofstream(dir.path() / "empty") << "\n";
  CHECK_FALSE(access_for({{"metrics-token-file", (dir.path() / "empty").string()}}).ok());
}
