#include "redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "edge/common/format.h"

namespace edge::gateway {
namespace {

using namespace std::chrono_literals;

constexpr std::chrono::milliseconds first_backoff = 50ms;
constexpr std::chrono::milliseconds max_backoff = 2s;

timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

redis_reply convert(const redisReply& r) {
  redis_reply out;
  switch (r.type) {
    case REDIS_REPLY_INTEGER:
      out.type = redis_reply::kind::integer;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_STRING:
      out.type = redis_reply::kind::string;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = redis_reply::kind::status;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = redis_reply::kind::error;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = redis_reply::kind::array;
      out.elements.reserve(r.elements);
      for (std::size_t i = 0; i < r.elements; ++i) out.elements.push_back(convert(*r.element[i]));
      break;
    default:
      out.type = redis_reply::kind::nil;
      break;
  }
  return out;
}

std::string describe_failure(const redisContext& c, std::chrono::milliseconds command_timeout) {
  if (c.err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return format("no answer within {} ms", command_timeout.count());
  }
  return c.errstr[0] != '\0' ? std::string(c.errstr) : std::string("connection failed");
}

// Whether the connection failed because the server had closed it (end of stream, reset, broken
// pipe), as opposed to a timeout or a protocol error.
bool closed_by_server(const redisContext& c) {
  if (c.err == REDIS_ERR_EOF) return true;
  if (c.err != REDIS_ERR_IO) return false;
  const std::string_view text(c.errstr);
  return text == std::strerror(ECONNRESET) || text == std::strerror(EPIPE);
}

// Writes every command, then reads one reply per command. A failure leaves the connection
// unusable (replies out of step), so the caller closes it. Once hiredis starts writing, what
// reached Redis is unknown: such a failure is deadline_exceeded (may_have_run).
result<std::vector<redis_reply>> exchange(redisContext* c, std::span<const redis_command> commands,
                                          const redis_client_options& options) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const redis_command& command : commands) {
    argv.clear();
    lengths.clear();
    for (const std::string& part : command) {
      argv.push_back(part.data());
      lengths.push_back(part.size());
    }
    if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()) != REDIS_OK) {
      return unavailable(format("Redis at {}:{}: {}", options.host, options.port, describe_failure(*c, options.command_timeout)));
    }
  }
  std::vector<redis_reply> replies;
  replies.reserve(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
      return status(status_code::deadline_exceeded, format("Redis at {}:{}: {}", options.host, options.port,
                                                           describe_failure(*c, options.command_timeout)));
    }
    replies.push_back(convert(*static_cast<redisReply*>(raw)));
    freeReplyObject(raw);
  }
  return replies;
}

}  // namespace

bool may_have_run(const status& failure) { return failure.code() == status_code::deadline_exceeded; }

bool redis_reply::is_error(std::string_view code) const {
  return type == kind::error && std::string_view(text).substr(0, code.size()) == code;
}

redis_client::redis_client(redis_client_options options) : options_(std::move(options)) {}

redis_client::~redis_client() {
  for (redisContext* c : idle_) redisFree(c);
}

result<redisContext*> redis_client::connect() {
  redisContext* c = redisConnectWithTimeout(options_.host.c_str(), options_.port, to_timeval(options_.connect_timeout));
  if (c == nullptr) return unavailable("cannot allocate a Redis connection");
  const auto fail = [&](std::string why) -> status {
    redisFree(c);
    return unavailable(format("cannot connect to Redis at {}:{}: {}", options_.host, options_.port, why));
  };
  if (c->err != 0) {
    return fail(c->err == REDIS_ERR_IO && (errno == EINPROGRESS || errno == ETIMEDOUT)
                    ? format("no connection within {} ms", options_.connect_timeout.count())
                    : std::string(c->errstr));
  }
  if (redisSetTimeout(c, to_timeval(options_.command_timeout)) != REDIS_OK) return fail(c->errstr);
  redisEnableKeepAlive(c);
  if (options_.db != 0) {
    const redis_command select{"SELECT", std::to_string(options_.db)};
    auto replies = exchange(c, std::span<const redis_command>(&select, 1), options_);
    if (!replies.ok()) return fail(replies.error().message());
    if ((*replies)[0].is_error()) return fail(format("SELECT {}: {}", options_.db, (*replies)[0].text));
  }
  return c;
}

result<redis_client::taken> redis_client::take() {
  std::unique_lock lock(mutex_);
  const auto deadline = steady::now() + options_.command_timeout;
  while (idle_.empty() && open_ >= options_.max_connections) {
    if (freed_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
        open_ >= options_.max_connections) {
      return resource_exhausted(format("all {} Redis connections stayed busy for {} ms", options_.max_connections,
                                       options_.command_timeout.count()));
    }
  }
  if (!idle_.empty()) {
    redisContext* c = idle_.back();
    idle_.pop_back();
    return taken{c, true};
  }
  if (const auto now = steady::now(); now < retry_at_) {
    return unavailable(format("{} (next attempt in {} ms)", last_failure_,
                              std::chrono::ceil<std::chrono::milliseconds>(retry_at_ - now).count()));
  }
  ++open_;
  lock.unlock();
  auto connected = connect();
  lock.lock();
  if (!connected.ok()) {
    --open_;
    back_off(connected.error());
    freed_.notify_one();
    return connected.error();
  }
  backoff_ = std::chrono::milliseconds(0);
  return taken{*connected, false};
}

void redis_client::give_back(redisContext* context) {
  std::lock_guard lock(mutex_);
  idle_.push_back(context);
  freed_.notify_one();
}

void redis_client::back_off(const status& why) {
  backoff_ = backoff_.count() == 0 ? first_backoff : std::min(backoff_ * 2, max_backoff);
  retry_at_ = steady::now() + backoff_;
  last_failure_ = why.message();
}

void redis_client::discard(redisContext* context, bool back_off_too, const status& why) {
  std::vector<redisContext*> closing;
  {
    std::lock_guard lock(mutex_);
    closing.swap(idle_);
    closing.push_back(context);
    open_ -= closing.size();
    if (back_off_too) back_off(why);
    freed_.notify_all();
  }
  for (redisContext* c : closing) redisFree(c);
}

result<std::vector<redis_reply>> redis_client::pipeline(std::span<const redis_command> commands) {
  for (int attempt = 0;; ++attempt) {
    EDGE_ASSIGN_OR_RETURN(const taken t, take());
    auto replies = exchange(t.context, commands, options_);
    if (replies.ok()) {
      give_back(t.context);
      return replies;
    }
    // A pooled connection that the server closed while it sat idle (Redis restarted): the
    // commands reached no live server, so they go once more, on a new connection, instead of
    // turning one restart into a failed call. Timeouts are not retried: the commands may have run.
    const bool closed_while_idle = t.pooled && closed_by_server(*t.context);
    const bool final = !closed_while_idle || attempt > 0;
    discard(t.context, final, replies.error());
    if (final) return replies;
  }
}

result<redis_reply> redis_client::command(const redis_command& command) {
  EDGE_ASSIGN_OR_RETURN(auto replies, pipeline(std::span<const redis_command>(&command, 1)));
  return std::move(replies[0]);
}

}  // namespace edge::gateway
