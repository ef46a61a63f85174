// A real redis-server for unit tests: on a free loopback port, in a temporary folder, without
// persistence unless asked (then an append-only file written at every command, so that a
// kill -9 and a restart keep every counter); killed when destroyed. Tests that need one skip
// (saying so) where redis-server is not installed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tenancy/redis_client.h"
#include "test_support.h"

extern char** environ;

namespace edge::testing {

class redis_server {
 public:
  // The redis-server on PATH, if any.
  static std::optional<std::filesystem::path> binary() {
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path != nullptr ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const auto candidate = std::filesystem::path(dir) / "redis-server";
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return std::nullopt;
  }

  enum class persistence { none, every_command };

  // Starts one on a free port; null when redis-server is not installed. Throws if it is
  // installed but does not answer.
  static std::unique_ptr<redis_server> start(persistence kept = persistence::none) {
    const auto path = binary();
    if (!path) return nullptr;
    std::unique_ptr<redis_server> server(new redis_server(*path, kept));
    for (int attempt = 0; attempt < 5; ++attempt) {
      server->port_ = free_loopback_port();
      if (server->launch()) return server;
    }
    throw std::runtime_error("redis-server did not start; see " + (server->dir_ / "redis.log").string());
  }

  ~redis_server() { kill(); }

  std::uint16_t port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

  // Kills it as a crash would (SIGKILL).
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // Stalls it as a hung host would (SIGSTOP): the kernel still accepts connections and
  // buffers what clients send; nothing is answered until resume() (SIGCONT), when Redis runs
  // it all.
  void stop() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  // Starts it again on the same port: empty, or, with persistence, with what it held. Throws
  // if it does not answer.
  void restart() { relaunch(std::chrono::microseconds(0)); }

  // Like restart(), but reading back what it held takes `per_key` for each key, and meanwhile
  // it answers every client, as a big Redis does while it loads: "LOADING Redis is loading the
  // dataset in memory". Returns once it so answers.
  void restart_loading_slowly(std::chrono::microseconds per_key) { relaunch(per_key); }

  // Writes `keys` keys that the tests never read, and has them in the append-only file's
  // snapshot part (the part restart_loading_slowly() reads slowly). Needs persistence.
  void add_ballast(std::size_t keys) {
    const auto redis = client();
    std::vector<gateway::redis_command> sets;
    for (std::size_t i = 0; i < keys; ++i) sets.push_back({"SET", "ballast:" + std::to_string(i), "x"});
    if (!redis->pipeline(sets).ok()) throw std::runtime_error("cannot write the ballast keys");
    if (!redis->command({"BGREWRITEAOF"}).ok()) throw std::runtime_error("BGREWRITEAOF failed");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      const auto info = redis->command({"INFO", "persistence"});
      if (info.ok() && info->text.find("aof_rewrite_in_progress:0") != std::string::npos &&
          info->text.find("aof_rewrite_scheduled:0") != std::string::npos) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("the append-only file was not rewritten within 30 s");
  }

  // A client of its own, for tests that look at the keys.
  std::unique_ptr<gateway::redis_client> client() const {
    return std::make_unique<gateway::redis_client>(gateway::redis_client_options{
        .host = "127.0.0.1", .port = port_, .command_timeout = std::chrono::seconds(5)});
  }

 private:
  redis_server(std::filesystem::path binary, persistence kept) : binary_(std::move(binary)), kept_(kept) {}

  void relaunch(std::chrono::microseconds per_key) {
    kill();
    for (int attempt = 0; attempt < 50; ++attempt) {  // the port may linger a moment
      if (launch(per_key)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("redis-server did not restart on port " + std::to_string(port_));
  }

  // Spawns redis-server and waits (up to 10 s) for PING (or, loading slowly, for its LOADING
  // answer); false if it exited (port taken).
  bool launch(std::chrono::microseconds per_key = std::chrono::microseconds(0)) {
    const std::string port = std::to_string(port_);
    const std::string log = (dir_.path() / "redis.log").string();
    const bool append = kept_ == persistence::every_command;
    std::vector<std::string> args{binary_.string(), "--port", port, "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", append ? "yes" : "no", "--appendfsync", append ? "always" : "everysec",
                                  "--dir", dir_.path().string(), "--logfile", log, "--daemonize", "no"};
    if (per_key.count() > 0) {
      // Redis's own settings for testing this: a pause per key loaded, and clients served
      // every kilobyte read.
      for (std::string a : {"--key-load-delay", "", "--loading-process-events-interval-bytes", "1024"}) {
        args.push_back(a.empty() ? std::to_string(per_key.count()) : a);
      }
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, binary_.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      throw std::runtime_error("cannot start " + binary_.string());
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      gateway::redis_client probe({.host = "127.0.0.1", .port = port_});
      if (auto pong = probe.command({"PING"});
          pong.ok() && (pong->text == "PONG" || (per_key.count() > 0 && pong->is_error("LOADING")))) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill();
    return false;
  }

  std::filesystem::path binary_;
  persistence kept_;
  temp_dir dir_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace edge::testing
