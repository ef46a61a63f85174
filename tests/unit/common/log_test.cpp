#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "edge/common/log.h"

namespace {

// Captures log lines for the duration of a test and restores the defaults afterwards.
struct captured_log {
  std::vector<std::string> lines;
  captured_log() {
    edge::log::set_sink([this](std::string_view line) { lines.emplace_back(line); });
  }
  ~captured_log() {
    edge::log::set_sink({});
    edge::log::set_format(edge::log::format::text);
    edge::log::set_level(edge::log::level::info);
  }
};

}  // namespace

TEST_CASE("text lines carry a timestamp, level, component and message") {
  captured_log capture;
  edge::logger log{"gateway"};
  log.info("listening on http://{}:{}", "127.0.0.1", 8080);
  REQUIRE(capture.lines.size() == 1);
  const std::string& line = capture.lines[0];
  CHECK(line.size() > 24);
  CHECK(line[4] == '-');
  CHECK(line[10] == 'T');
  CHECK(line.find("Z info  gateway: listening on http://127.0.0.1:8080\n") == 23);
}

TEST_CASE("levels below the threshold are dropped") {
  captured_log capture;
  edge::log::set_level(edge::log::level::warn);
  edge::logger log{"x"};
  log.info("hidden");
  log.debug("hidden");
  log.warn("shown");
  log.error("shown too");
  REQUIRE(capture.lines.size() == 2);
  CHECK(capture.lines[0].find("warn") != std::string::npos);
  edge::log::set_level(edge::log::level::off);
  log.error("nothing");
  CHECK(capture.lines.size() == 2);
}

TEST_CASE("json lines are valid JSON with escaped content") {
  captured_log capture;
  edge::log::set_format(edge::log::format::json);
  edge::logger log{"engine"};
  log.warn("quote \" backslash \\ newline \n tab \t bell \x07 bad utf8 \xff ok é");
  REQUIRE(capture.lines.size() == 1);
  const std::string& line = capture.lines[0];
  CHECK(line.rfind("{\"ts\":\"", 0) == 0);
  CHECK(line.find("\"level\":\"warn\",\"component\":\"engine\",") != std::string::npos);
  CHECK(line.find(R"("msg":"quote \" backslash \\ newline \n tab \t bell \u0007 bad utf8 )"
                  "\xEF\xBF\xBD"
                  R"( ok )"
                  "\xC3\xA9"
                  R"("})") != std::string::npos);
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
}

TEST_CASE("parse_level and parse_format accept the documented names only") {
  CHECK(edge::log::parse_level("debug") == edge::log::level::debug);
  CHECK(edge::log::parse_level("warning") == edge::log::level::warn);
  CHECK_FALSE(edge::log::parse_level("verbose").has_value());
  CHECK(edge::log::parse_format("json") == edge::log::format::json);
  CHECK_FALSE(edge::log::parse_format("xml").has_value());
}

TEST_CASE("lines from many threads are never interleaved") {
  captured_log capture;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      edge::logger log{"t" + std::to_string(t)};
      for (int i = 0; i < 200; ++i) log.info("message {} from thread {}", i, t);
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(capture.lines.size() == 800);
  for (const auto& line : capture.lines) {
    CHECK(line.find("message ") != std::string::npos);
    CHECK(line.find('\n') == line.size() - 1);
  }
}

TEST_CASE("fields follow the message: key=value in text, top-level members in JSON") {
  captured_log capture;
  const edge::log::field fields[] = {{"request_id", "req_1"}, {"status", "200", true}, {"tenant", "a\"b"}};
  edge::log::emit(edge::log::level::info, "access", "POST /v1/completions", fields);
  edge::log::set_format(edge::log::format::json);
  edge::log::emit(edge::log::level::info, "access", "POST /v1/completions", fields);
  REQUIRE(capture.lines.size() == 2);
  CHECK(capture.lines[0].find("access: POST /v1/completions request_id=req_1 status=200 tenant=a\"b\n") !=
        std::string::npos);
  CHECK(capture.lines[1].find(
            "\"msg\":\"POST /v1/completions\",\"request_id\":\"req_1\",\"status\":200,\"tenant\":\"a\\\"b\"}\n") !=
        std::string::npos);
}

TEST_CASE("text lines escape what could forge a line: control characters, DEL, C1 and invalid UTF-8") {
  captured_log capture;
  edge::logger log{"access"};
  log.info("GET /x\n2026-01-01T00:00:00.000Z info  access: forged\r\x1b[2J\x7f \xff nel \xC2\x85 \\ caf\xC3\xA9");
  REQUIRE(capture.lines.size() == 1);
  const std::string& line = capture.lines[0];
  CHECK(line.find('\n') == line.size() - 1);
  CHECK(line.find('\r') == std::string::npos);
  CHECK(line.find("access: GET /x\\n2026-01-01T00:00:00.000Z info  access: forged\\r\\x1b[2J\\x7f \\xff nel "
                  "\\u0085 \\\\ caf\xC3\xA9\n") != std::string::npos);
}

TEST_CASE("text field values are escaped, and quoted when they could pass for more fields") {
  captured_log capture;
  const edge::log::field fields[] = {
      {"tenant", "evil\nX"}, {"path", "a status=200"}, {"empty", ""}, {"quoted", "\"x y\\"}, {"status", "499", true}};
  edge::log::emit(edge::log::level::info, "access", "POST /v1/completions", fields);
  REQUIRE(capture.lines.size() == 1);
  CHECK(capture.lines[0].find(
            "access: POST /v1/completions tenant=evil\\nX path=\"a status=200\" empty=\"\" quoted=\"\\\"x y\\\\\" "
            "status=499\n") != std::string::npos);
}

TEST_CASE("json lines stay one valid object whatever a number field holds") {
  captured_log capture;
  edge::log::set_format(edge::log::format::json);
  const edge::log::field fields[] = {{"status", "200", true},
                                     {"duration_ms", "1.5e3", true},
                                     {"forged", "1,\"level\":\"error\"", true},
                                     {"empty", "", true}};
  edge::log::emit(edge::log::level::info, "access", "GET /", fields);
  REQUIRE(capture.lines.size() == 1);
  CHECK(capture.lines[0].find(R"("status":200,"duration_ms":1.5e3,"forged":"1,\"level\":\"error\"","empty":""})") !=
        std::string::npos);
}
