// A real PostgreSQL server for unit tests: a cluster made with Debian's initdb in a temporary
// folder, listening on a free loopback port (and a socket in that folder), trusting local
// connections, killed and removed when destroyed. Run as root (as CI runs), the cluster belongs
// to the `postgres` user, as PostgreSQL refuses to run as root. deploy/install-deps.sh installs
// the server; a test that needs one fails (saying why) where it is missing.
//
// shared() is one server per test process; fresh_database() gives each test an empty database
// of its own on it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pwd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tenancy/postgres.h"
#include "test_support.h"

extern char** environ;

namespace edge::testing {

class postgres_server {
 public:
  // The folder of Debian's PostgreSQL programs (the newest version installed), or empty.
  static std::filesystem::path binaries() {
    std::filesystem::path best;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
      const auto bin = entry.path() / "bin";
      if (std::filesystem::exists(bin / "postgres") && (best.empty() || bin > best)) best = bin;
    }
    return best;
  }

  // Starts one; throws when PostgreSQL is not installed or does not start.
  static std::unique_ptr<postgres_server> start() {
    const auto bin = binaries();
    if (bin.empty()) {
      throw std::runtime_error("PostgreSQL is not installed (deploy/install-deps.sh installs Debian's postgresql)");
    }
    std::unique_ptr<postgres_server> server(new postgres_server(bin));
    server->init();
    for (int attempt = 0; attempt < 5; ++attempt) {
      server->port_ = free_loopback_port();
      if (server->launch()) return server;
    }
    throw std::runtime_error("PostgreSQL did not start; see " + (server->dir_.path() / "postgres.log").string());
  }

  static postgres_server& shared() {
    static std::unique_ptr<postgres_server> server = start();
    return *server;
  }

  ~postgres_server() { kill(); }

  std::uint16_t port() const { return port_; }
  std::string url(std::string_view database = "postgres") const {
    return "postgresql://edge@127.0.0.1:" + std::to_string(port_) + "/" + std::string(database);
  }

  // A new empty database; its URL.
  std::string fresh_database() {
    static std::atomic<int> counter{0};
    const std::string name = "test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    auto admin = gateway::postgres::connection::open({.url = url()});
    if (!admin.ok()) throw std::runtime_error("cannot connect to the test PostgreSQL: " + admin.error().to_string());
    if (status made = admin->run("CREATE DATABASE " + name); !made.ok()) {
      throw std::runtime_error("cannot create a test database: " + made.to_string());
    }
    return url(name);
  }

  // Kills it as a crash would (SIGKILL), with every backend process.
  void kill() {
    if (pid_ <= 0) return;
    signal_all(SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // Stalls it as a hung host would (SIGSTOP on the postmaster and every backend), and resumes it.
  void stop() { signal_all(SIGSTOP); }
  void resume() { signal_all(SIGCONT); }

  // Starts it again on the same port with what it held. Throws if it does not answer.
  void restart() {
    kill();
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (launch()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("PostgreSQL did not restart on port " + std::to_string(port_));
  }

 private:
  explicit postgres_server(std::filesystem::path bin) : bin_(std::move(bin)) {}

  static bool as_root() { return ::geteuid() == 0; }

  // The postmaster and its children (each backend makes itself a process group of its own, so a
  // signal to the postmaster's group does not reach them).
  void signal_all(int signal_number) const {
    if (pid_ <= 0) return;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      std::getline(stat, line);
      // pid (comm) state ppid ...: the command may hold spaces and parentheses, the last ')' ends it.
      const std::size_t close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 1));
      std::string state;
      pid_t parent = 0;
      rest >> state >> parent;
      if (parent == pid_) ::kill(static_cast<pid_t>(std::stol(name)), signal_number);
    }
    ::kill(pid_, signal_number);
  }

  // argv run as the cluster's owner: the postgres user when we are root.
  std::vector<std::string> owned(std::vector<std::string> args) const {
    if (!as_root()) return args;
    std::vector<std::string> out{"/usr/bin/setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"};
    out.insert(out.end(), args.begin(), args.end());
    return out;
  }

  static pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, bool own_group) {
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attributes, 0);
    }
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int failed = ::posix_spawn(&pid, argv[0], &files, &attributes, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attributes);
    if (failed != 0) throw std::runtime_error("cannot start " + args[0]);
    return pid;
  }

  void init() {
    data_ = dir_.path() / "data";
    if (as_root()) {
      // The postgres user must reach the folder and own the cluster's files.
      std::filesystem::permissions(dir_.path(), std::filesystem::perms::all);
      const passwd* owner = ::getpwnam("postgres");
      if (owner == nullptr) throw std::runtime_error("there is no postgres user to own the test cluster");
      if (::chown(dir_.path().c_str(), owner->pw_uid, owner->pw_gid) != 0) {
        throw std::runtime_error("cannot give the test cluster's folder to the postgres user");
      }
    }
    const pid_t pid = spawn(owned({(bin_ / "initdb").string(), "-D", data_.string(), "-U", "edge", "--auth=trust",
                                   "-E", "UTF8", "--no-sync", "--locale=C"}),
                            dir_.path() / "initdb.log", false);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error("initdb failed; see " + (dir_.path() / "initdb.log").string());
    }
  }

  // Starts the postmaster and waits (up to 20 s) until it takes connections; false if it exited.
  bool launch() {
    pid_ = spawn(owned({(bin_ / "postgres").string(), "-D", data_.string(), "-p", std::to_string(port_), "-c",
                        "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir_.path().string(), "-c",
                        "fsync=off", "-c", "max_connections=200"}),
                 dir_.path() / "postgres.log", /*own_group=*/true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      auto probe = gateway::postgres::connection::open({.url = url(), .connect_timeout = std::chrono::seconds(2)});
      if (probe.ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill();
    return false;
  }

  std::filesystem::path bin_;
  temp_dir dir_;
  std::filesystem::path data_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;  // the postmaster (setpriv execs it: the same process), leader of its group
};

}  // namespace edge::testing
