#include "kv/redis/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <charconv>

namespace strata {

std::string RedisUrl::display() const {
  std::string s = "redis://";
  if (!user.empty() || !password.empty()) s += user + ":***@";
  return s + host + ":" + std::to_string(port) + "/" + std::to_string(db);
}

namespace {

bool parse_int(std::string_view s, int lo, int hi, int& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && out >= lo && out <= hi;
}

timeval to_timeval(double s) {
  timeval tv;
  tv.tv_sec = time_t(s);
  tv.tv_usec = suseconds_t((s - double(tv.tv_sec)) * 1e6);
  return tv;
}

}  // namespace

Result<RedisUrl> parse_redis_url(const std::string& url) {
  constexpr std::string_view kScheme = "redis://";
  auto bad = [&](const std::string& why, const std::string& shown) {
    return make_error(ErrorCode::kInvalidArgument, "Redis URL '" + shown + "': " + why +
                                                       " (expected redis://[[user]:password@]host[:port][/db])");
  };
  std::string_view s = url;
  if (!s.starts_with(kScheme)) {
    const bool has_at = s.find('@') != std::string_view::npos;
    return bad(s.starts_with("rediss://") ? "TLS (rediss://) is not supported; run a local TLS proxy" : "not a redis:// URL",
               has_at ? std::string("(hidden: it holds a password)") : url);
  }
  s.remove_prefix(kScheme.size());
  RedisUrl u;
  std::string shown = url;
  if (const size_t at = s.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = s.substr(0, at);
    s.remove_prefix(at + 1);
    const size_t colon = cred.find(':');
    if (colon == std::string_view::npos) {
      u.password = std::string(cred);  // redis://password@host: the password alone
    } else {
      u.user = std::string(cred.substr(0, colon));
      u.password = std::string(cred.substr(colon + 1));
    }
    shown = std::string(kScheme) + (u.user.empty() ? "" : u.user) + ":***@" + std::string(s);
  }
  if (const size_t slash = s.find('/'); slash != std::string_view::npos) {
    const std::string_view db = s.substr(slash + 1);
    if (!db.empty() && !parse_int(db, 0, 1 << 20, u.db)) return bad("database '" + std::string(db) + "' is not a number", shown);
    s = s.substr(0, slash);
  }
  if (s.starts_with('[')) {  // [v6 address]:port
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['", shown);
    u.host = std::string(s.substr(1, close - 1));
    s.remove_prefix(close + 1);
    if (!s.empty()) {
      if (!s.starts_with(':') || !parse_int(s.substr(1), 1, 65535, u.port)) return bad("bad port", shown);
    }
  } else {
    const size_t colon = s.rfind(':');
    if (colon != std::string_view::npos) {
      if (!parse_int(s.substr(colon + 1), 1, 65535, u.port)) {
        return bad("port '" + std::string(s.substr(colon + 1)) + "' is not in 1..65535", shown);
      }
      s = s.substr(0, colon);
    }
    if (!s.empty()) u.host = std::string(s);
  }
  if (u.host.empty()) return bad("no host", shown);
  return u;
}

RedisClient::RedisClient(RedisUrl url, double timeout_s, double retry_s)
    : url_(std::move(url)), timeout_s_(timeout_s), retry_s_(retry_s) {}

RedisClient::~RedisClient() { drop(); }

void RedisClient::set_retry() {
  // Doubles with each failed connect, up to 4x: a host that swallows packets costs its
  // connect timeout that rarely, on whichever thread asks.
  const double wait = retry_s_ * double(1 << std::min(failed_connects_, 2));
  next_try_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait));
}

void RedisClient::drop() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

Status RedisClient::connect() {
  drop();
  set_retry();
  ++failed_connects_;  // reset below once connected
  const std::string where = url_.display();
  redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port, to_timeval(timeout_s_));
  if (c == nullptr) return make_error(ErrorCode::kIo, where + ": cannot allocate a connection");
  if (c->err != 0) {
    std::string why = c->errstr;
    redisFree(c);
    return make_error(ErrorCode::kIo, where + ": cannot connect: " + why);
  }
  redisSetTimeout(c, to_timeval(timeout_s_));
  auto run = [&](std::vector<std::string> args, std::string* why) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, int(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) {
      *why = c->errstr;
      return false;
    }
    const bool ok = r->type != REDIS_REPLY_ERROR;
    if (!ok) *why = std::string(r->str, r->len);
    freeReplyObject(r);
    return ok;
  };
  std::string why;
  if (!url_.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!url_.user.empty()) auth.push_back(url_.user);
    auth.push_back(url_.password);
    if (!run(auth, &why)) {
      redisFree(c);
      return make_error(ErrorCode::kInvalidArgument, where + ": AUTH failed: " + why);
    }
  }
  if (url_.db != 0 && !run({"SELECT", std::to_string(url_.db)}, &why)) {
    redisFree(c);
    return make_error(ErrorCode::kInvalidArgument, where + ": SELECT " + std::to_string(url_.db) + " failed: " + why);
  }
  if (!run({"PING"}, &why)) {
    redisFree(c);
    // A server that wants a password answers NOAUTH here.
    return make_error(ErrorCode::kInvalidArgument, where + ": PING failed: " + why);
  }
  ctx_ = c;
  failed_connects_ = 0;
  if (was_connected_) ++reconnects_;
  was_connected_ = true;
  return Status::ok_status();
}

Result<std::vector<RedisReply>> RedisClient::pipeline(const std::vector<std::vector<std::string_view>>& commands) {
  bool fresh = false;
  if (ctx_ == nullptr) {
    if (std::chrono::steady_clock::now() < next_try_) {
      return make_error(ErrorCode::kIo, url_.display() + ": not connected");
    }
    if (auto st = connect(); !st.ok()) return st.error();
    fresh = true;
  }
  auto r = run(commands);
  if (r.ok() || fresh) return r;
  // A connection idle across a server restart fails its first use: one new connection, at once
  // (the commands strata sends are idempotent).
  if (auto st = connect(); !st.ok()) return st.error();
  return run(commands);
}

Result<std::vector<RedisReply>> RedisClient::run(const std::vector<std::vector<std::string_view>>& commands) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& cmd : commands) {
    argv.clear();
    lens.clear();
    for (std::string_view a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, int(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
      std::string why = ctx_->errstr;
      drop();
      set_retry();
      return make_error(ErrorCode::kIo, url_.display() + ": " + why);
    }
  }
  std::vector<RedisReply> out(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      std::string why = ctx_->errstr;
      drop();
      set_retry();
      return make_error(ErrorCode::kIo, url_.display() + ": " + (why.empty() ? "connection lost" : why));
    }
    auto* r = static_cast<redisReply*>(raw);
    RedisReply& o = out[i];
    switch (r->type) {
      case REDIS_REPLY_STRING: o.kind = RedisReply::kString; o.str.assign(r->str, r->len); break;
      case REDIS_REPLY_STATUS: o.kind = RedisReply::kStatus; o.str.assign(r->str, r->len); break;
      case REDIS_REPLY_ERROR: o.kind = RedisReply::kError; o.str.assign(r->str, r->len); break;
      case REDIS_REPLY_INTEGER: o.kind = RedisReply::kInteger; o.integer = r->integer; break;
      case REDIS_REPLY_ARRAY: o.kind = RedisReply::kArray; o.integer = int64_t(r->elements); break;
      default: o.kind = RedisReply::kNil; break;
    }
    freeReplyObject(r);
  }
  return out;
}

}  // namespace strata
