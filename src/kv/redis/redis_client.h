// RedisClient: one connection to a Redis node (hiredis), for one thread at a time, that
// reconnects by itself. Used by the shared KV tier (redis_tier.h) and shared checkpoints.
//
// A URL is redis://[[user]:password@]host[:port][/db]. connect() fails with the reason (refused,
// unreachable, AUTH rejected, SELECT rejected); after a connection is lost, a command fails
// at once (no wait) until the retry interval (doubling while connects fail) has passed, then
// one reconnect is tried; a
// connection found dead at its first use since (the server restarted) is replaced at once. Commands
// are pipelined: every command is sent, then every reply read, in one round trip.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

struct redisContext;

namespace strata {

struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;      // empty: AUTH password (the default user)
  std::string password;  // empty: no AUTH
  int db = 0;
  std::string display() const;  // the URL with the password masked, for messages
};

// Errors name the URL (password masked) and what is wrong with it.
Result<RedisUrl> parse_redis_url(const std::string& url);

struct RedisReply {
  enum Kind { kNil, kString, kInteger, kStatus, kArray, kError } kind = kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
};

class RedisClient {
 public:
  RedisClient(RedisUrl url, double timeout_s, double retry_s = 0.5);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Connects now (AUTH, SELECT, PING); the reason on failure.
  Status connect();
  bool connected() const { return ctx_ != nullptr; }
  // Runs commands (each a list of arguments) in one round trip: reconnecting first when the
  // connection is down and the retry interval has passed. An error when the connection is down
  // or fails meanwhile (it is dropped then); per-command errors are kError replies.
  Result<std::vector<RedisReply>> pipeline(const std::vector<std::vector<std::string_view>>& commands);
  int64_t reconnects() const { return reconnects_; }
  const RedisUrl& url() const { return url_; }

 private:
  void drop();
  void set_retry();
  Result<std::vector<RedisReply>> run(const std::vector<std::vector<std::string_view>>& commands);
  RedisUrl url_;
  double timeout_s_, retry_s_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point next_try_{};
  bool was_connected_ = false;
  int failed_connects_ = 0;
  int64_t reconnects_ = 0;
};

}  // namespace strata
