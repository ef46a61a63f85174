// A small blocking Redis client over hiredis: a pool of connections, each with a connect
// timeout and a command timeout, so that a call made on a gateway IO thread is bounded in time
// however Redis (or the network to it) misbehaves.
//
//   redis_client redis({.host = "127.0.0.1", .port = 6379});
//   auto replies = redis.pipeline({{"SCRIPT", "LOAD", body}, {"EVALSHA", sha, "1", key}});
//
// A pipeline sends its commands in one write and reads their replies in order: one round trip.
// Redis's own error replies (NOSCRIPT, WRONGTYPE, ...) are replies; only not reaching Redis (no
// connection, a timeout, a broken connection) is a failed result, and may_have_run() tells the
// two kinds of failure apart: commands that never left (no connection) cannot run, while
// commands sent without a reply (a timeout, a connection broken after sending) may have run or
// may still run: a stopped Redis (SIGSTOP) executes what it had received once it resumes.
//
// A connection that failed is closed, with every idle one (after a Redis restart they are all
// dead), and new connections are not attempted again until a backoff has passed (50 ms doubling
// to 2 s, reset by a new connection): during an outage or a stall calls fail at once instead of
// each waiting for a connect or command timeout.
//
// Thread-safe; a call holds one connection for its duration.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "edge/common/status.h"

struct redisContext;

namespace edge::gateway {

struct redis_reply {
  enum class kind { nil, integer, string, status, error, array };
  kind type = kind::nil;
  std::int64_t integer = 0;
  std::string text;                  // string, status and error replies
  std::vector<redis_reply> elements; // array replies

  bool is_error() const { return type == kind::error; }
  // An error reply whose text starts with `code` ("NOSCRIPT").
  bool is_error(std::string_view code) const;
};

using redis_command = std::vector<std::string>;  // the command and its arguments

// Whether a failed call's commands may have reached Redis (and so may have run, or run later).
bool may_have_run(const status& failure);

struct redis_client_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::int64_t db = 0;  // SELECTed on every new connection
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds command_timeout{100};  // one write or read; also the longest wait for a free connection
  std::size_t max_connections = 16;
};

class redis_client {
 public:
  explicit redis_client(redis_client_options options);
  ~redis_client();
  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;

  // Sends `commands` in one pipeline; their replies, in order.
  result<std::vector<redis_reply>> pipeline(std::span<const redis_command> commands);
  result<std::vector<redis_reply>> pipeline(std::initializer_list<redis_command> commands) {
    return pipeline(std::span<const redis_command>(commands.begin(), commands.size()));
  }
  result<redis_reply> command(const redis_command& command);

  const redis_client_options& options() const { return options_; }

 private:
  using steady = std::chrono::steady_clock;

  struct taken {
    redisContext* context = nullptr;
    bool pooled = false;  // it had been idle in the pool (and may have been closed meanwhile)
  };
  result<taken> take();                // an idle connection or a new one
  void give_back(redisContext* context);
  // After a failure: it and every idle connection are closed, and with `back_off` no new one is
  // attempted before the backoff has passed.
  void discard(redisContext* context, bool back_off, const status& why);
  void back_off(const status& why);  // mutex_ held
  result<redisContext*> connect();

  const redis_client_options options_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<redisContext*> idle_;  // guarded by mutex_
  std::size_t open_ = 0;             // connections open (idle or in use); guarded by mutex_
  steady::time_point retry_at_{};    // no new connection before this; guarded by mutex_
  std::chrono::milliseconds backoff_{0};  // guarded by mutex_
  std::string last_failure_;              // why the last connect failed; guarded by mutex_
};

}  // namespace edge::gateway
