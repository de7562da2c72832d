#include "server/supervisor.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <set>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "server/api_error.h"
#include "server/http_errors.h"
#include "server/api_response.h"
#include "server/connection_watch.h"
#include "server/http_listener.h"

namespace strata::server {

// ---- PartFilter ----

void PartFilter::begin_attempt() {
  buffer_.clear();
  pending_.clear();
  lost_ = false;
}

void PartFilter::feed(const char* data, size_t n, const Emit& emit) {
  buffer_.append(data, n);
  size_t start = 0;
  for (;;) {
    const size_t end = buffer_.find("\n\n", start);
    if (end == std::string::npos) break;
    const std::string_view block(buffer_.data() + start, end - start);
    const std::string_view prefix(kPartPrefix);
    if (block.substr(0, prefix.size()) == prefix) {
      on_part(std::string(block.substr(prefix.size())), emit);
    } else {
      pending_.append(block);
      pending_ += "\n\n";
    }
    start = end + 2;
  }
  buffer_.erase(0, start);
}

void PartFilter::on_part(const std::string& label, const Emit& emit) {
  auto forward = [&] {
    if (!pending_.empty()) emit(pending_);
  };
  if (label == "start") {
    if (!start_sent_) forward();
    start_sent_ = true;
  } else if (label.rfind("token ", 0) == 0) {
    int64_t n = 0;
    try {
      n = std::stoll(label.substr(6));
    } catch (const std::exception&) {
      n = 0;
    }
    if (n > delivered_) {
      // Parts arrive in order from 1 on every attempt, so a gap is a broken child.
      if (n != delivered_ + 1) log::error("stream part {} follows part {}", n, delivered_);
      forward();
      delivered_ = n;
    }
  } else if (label == "end") {
    if (!ended_) forward();
    ended_ = true;
  } else if (label == "lost") {
    lost_ = true;
  } else {
    log::warn("unknown stream part '{}'", label);
  }
  pending_.clear();
}

// ---- command lines ----

std::vector<std::string> own_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    out.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> child_command_line(const std::vector<std::string>& own, const std::string& executable,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> out = {executable};
  for (size_t i = 1; i < own.size(); ++i) {
    const std::string& a = own[i];
    if (a == "--supervise" || a.rfind("--supervise=", 0) == 0) continue;
    if (a == "--host" || a == "--port") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--host=", 0) == 0 || a.rfind("--port=", 0) == 0) continue;
    out.push_back(a);
  }
  for (const char* a : {"--host", "127.0.0.1", "--port", "0", "--supervised-child"}) out.push_back(a);
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

namespace {

using json = nlohmann::json;
using Steady = std::chrono::steady_clock;

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "ended (wait status " + std::to_string(status) + ")";
}

// A death the request in flight may have caused: a fault signal or a failing exit. SIGKILL,
// SIGTERM and SIGINT come from outside (an operator, the OOM killer, a stop).
bool is_crash(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) != 0;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return sig != SIGKILL && sig != SIGTERM && sig != SIGINT;
  }
  return false;
}

// 32 hex digits from the system's entropy source.
std::string random_secret() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) s += hex[rd() % 16];
  return s;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 1;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The closing SSE text of a stream the supervisor cannot finish.
std::string stream_error_text(const std::string& path, const ApiError& e) {
  if (is_anthropic_path(path)) return sse_event("error", anthropic_error_body(e));
  return sse_data(openai_error_body(e)) + "data: [DONE]\n\n";
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool starts_with_ci(const std::string& s, const std::string& prefix) { return lower(s).rfind(prefix, 0) == 0; }

// Headers that describe one hop (or that httplib adds to a received request) stay behind,
// and a client cannot send the supervisor's own headers. Compression is per hop too: the
// child answers uncompressed and this server compresses for its client.
bool hop_header(const std::string& name) {
  static const char* kHop[] = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "remote_addr",
                               "remote_port", "local_addr", "local_port", "content-type", "accept-encoding",
                               "content-encoding"};
  const std::string n = lower(name);
  for (const char* h : kHop) {
    if (n == h) return true;
  }
  return starts_with_ci(n, "x-strata-");
}

std::string percent_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string id_prefix(const std::string& path) {
  if (path == "/v1/chat/completions") return "chatcmpl-";
  if (path == "/v1/completions") return "cmpl-";
  if (path == "/v1/responses") return "resp_";
  return "msg_";
}

// One streamed generation: the worker thread talks to the child (again after each crash),
// the client's HTTP thread writes what the worker queues.
struct StreamRelay {
  std::mutex mu;
  std::condition_variable cv;
  bool head = false;         // the first answer of the child arrived
  bool streaming = false;    // ... and it was a 200 event stream
  int status = 0;            // otherwise: its status, headers and body
  httplib::Headers headers;
  std::string content_type;
  std::string body;
  std::deque<std::string> out;  // SSE text for the client
  bool done = false;
  std::atomic<bool> client_gone{false};
  httplib::Client* active = nullptr;  // the attempt in flight, stopped when the client leaves
  std::thread worker;
};

}  // namespace

class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& o)
      : o_(o), http_(std::make_unique<httplib::Server>()), secret_(random_secret()) {}
  int run();

 private:
  struct Child {
    uint64_t epoch = 0;
    int port = 0;
  };

  bool spawn(int* wait_status);
  void monitor();
  void stop_child();
  std::optional<Child> wait_child(uint64_t min_epoch, const std::function<bool()>& cancelled);
  bool survives(uint64_t epoch);
  std::string unavailable_reason();
  // Whether child `epoch` died of a crash (is_crash), once it is gone.
  bool crashed(uint64_t epoch);
  // Requests whose engine crashed twice under them, by body: never sent to an engine again.
  static uint64_t request_key(const httplib::Request& req);
  void quarantine(uint64_t key);
  bool quarantined(uint64_t key);

  void install_routes();
  void health(httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);
  void relay_plain(const httplib::Request& req, httplib::Response& res, const httplib::Headers& extra);
  void relay_stream(const httplib::Request& req, httplib::Response& res, const httplib::Headers& extra);
  void stream_worker(std::shared_ptr<StreamRelay> relay, httplib::Request request);
  httplib::Request child_request(const httplib::Request& req, const httplib::Headers& extra) const;

  SupervisorOptions o_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<HttpListener> listener_;
  const std::string secret_;  // sent to the child in kSupervisorSecretHeader with every request

  std::mutex mu_;
  std::condition_variable cv_;
  pid_t pid_ = -1;
  int child_port_ = 0;
  uint64_t epoch_ = 0;   // grows with each child that starts serving
  bool ready_ = false;   // the current child serves
  bool stopping_ = false;
  bool gave_up_ = false;
  int64_t restarts_ = 0;
  double last_restart_unix_ = 0.0;
  std::string last_exit_;
  std::deque<Steady::time_point> recent_restarts_;
  std::map<uint64_t, bool> crashed_epochs_;  // epoch -> died of a crash (the last 64)
  std::deque<uint64_t> quarantine_order_;
  std::set<uint64_t> quarantine_;            // request keys (the last 1024)
  int64_t quarantined_total_ = 0;
};

bool Supervisor::crashed(uint64_t epoch) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = crashed_epochs_.find(epoch);
  return it != crashed_epochs_.end() && it->second;
}

uint64_t Supervisor::request_key(const httplib::Request& req) {
  return std::hash<std::string>{}(req.method + " " + req.path + "\n" + req.body);
}

void Supervisor::quarantine(uint64_t key) {
  std::lock_guard<std::mutex> l(mu_);
  ++quarantined_total_;
  if (!quarantine_.insert(key).second) return;
  quarantine_order_.push_back(key);
  if (quarantine_order_.size() > 1024) {
    quarantine_.erase(quarantine_order_.front());
    quarantine_order_.pop_front();
  }
}

bool Supervisor::quarantined(uint64_t key) {
  std::lock_guard<std::mutex> l(mu_);
  return quarantine_.count(key) > 0;
}

constexpr int kCrashesBeforeQuarantine = 2;

std::string quarantine_message() {
  return "the engine process crashed twice while serving this request: it is quarantined and will not be retried "
         "(an identical request is refused the same way)";
}

// Starts a child and reads its "listening on http://host:port" line. False: it ended first.
bool Supervisor::spawn(int* wait_status) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    log::error("cannot create a pipe for the engine process: {}", std::strerror(errno));
    *wait_status = 1 << 8;
    return false;
  }
  std::vector<char*> argv;
  for (const std::string& a : o_.child_argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The secret travels in the environment, not the command line (which any local user can read).
  const std::string secret_env = std::string(kSupervisorSecretEnv) + "=" + secret_;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, kSupervisorSecretEnv, std::strlen(kSupervisorSecretEnv)) != 0) envp.push_back(*e);
  }
  envp.push_back(const_cast<char*>(secret_env.c_str()));
  envp.push_back(nullptr);
  sigset_t none;
  sigemptyset(&none);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec. Its own process group keeps a terminal's ^C
    // away (the supervisor stops it); the death signal ends it with the supervisor.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    close_range(3, ~0U, 0);  // client sockets and the listener stay with the supervisor
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    log::error("cannot start the engine process: {}", std::strerror(errno));
    *wait_status = 1 << 8;
    return false;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    pid_ = pid;
    if (stopping_) kill(pid, SIGTERM);
  }
  log::info("engine process {} starting", pid);
  std::string out;
  int port = -1;
  char buf[512];
  const std::string marker = "listening on http://";
  while (port < 0) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, size_t(n));
    const size_t at = out.find(marker);
    const size_t eol = at == std::string::npos ? std::string::npos : out.find('\n', at);
    if (eol == std::string::npos) continue;
    const std::string addr = out.substr(at + marker.size(), eol - at - marker.size());
    const size_t colon = addr.rfind(':');
    try {
      port = std::stoi(addr.substr(colon + 1));
    } catch (const std::exception&) {
      log::error("engine process printed an address without a port: '{}'", addr);
      kill(pid, SIGKILL);
      break;
    }
  }
  close(fds[0]);  // it prints nothing else on stdout
  if (port < 0) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      pid_ = -1;
    }
    cv_.notify_all();
    *wait_status = status;
    return false;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    child_port_ = port;
    ready_ = true;
    ++epoch_;
  }
  cv_.notify_all();
  log::info("engine process {} serves on 127.0.0.1:{}", pid, port);
  return true;
}

// Waits for the child; restarts it when it dies, unless stopping. Runs on its own thread.
void Supervisor::monitor() {
  for (;;) {
    pid_t pid;
    {
      std::lock_guard<std::mutex> l(mu_);
      pid = pid_;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      ready_ = false;
      pid_ = -1;
      last_exit_ = describe_exit(status);
      crashed_epochs_[epoch_] = is_crash(status);
      while (crashed_epochs_.size() > 64) crashed_epochs_.erase(crashed_epochs_.begin());
      if (stopping_) {
        cv_.notify_all();
        return;
      }
    }
    cv_.notify_all();
    log::error("engine process {} {}: restarting it", pid, describe_exit(status));
    for (;;) {
      std::unique_lock<std::mutex> l(mu_);
      const auto now = Steady::now();
      while (!recent_restarts_.empty() && now - recent_restarts_.front() > std::chrono::minutes(1)) {
        recent_restarts_.pop_front();
      }
      if (int(recent_restarts_.size()) >= o_.max_restarts_per_minute) {
        gave_up_ = true;
        l.unlock();
        cv_.notify_all();
        log::error("the engine process ended {} times within a minute: giving up", o_.max_restarts_per_minute);
        kill(getpid(), SIGTERM);  // the signal thread shuts the server down
        return;
      }
      // Back off when restarts come in quick succession: 0 s, 0.25 s, 0.5 s, ... at most 5 s.
      const size_t n = recent_restarts_.size();
      const double backoff = n == 0 ? 0.0 : std::min(5.0, 0.25 * double(1u << std::min<size_t>(n - 1, 5)));
      recent_restarts_.push_back(now);
      if (cv_.wait_for(l, std::chrono::duration<double>(backoff), [this] { return stopping_; })) return;
      l.unlock();
      int start_status = 0;
      if (spawn(&start_status)) {
        std::lock_guard<std::mutex> g(mu_);
        ++restarts_;
        last_restart_unix_ = unix_now();
        break;
      }
      std::lock_guard<std::mutex> g(mu_);
      last_exit_ = "restart failed: " + describe_exit(start_status);
      log::error("engine process {}", last_exit_);
      if (stopping_) return;
    }
  }
}

// SIGTERM to the child (it finishes its streams and flushes its KV writer), SIGKILL past the timeout.
void Supervisor::stop_child() {
  pid_t pid;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    pid = pid_;
  }
  cv_.notify_all();
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, std::chrono::duration<double>(o_.stop_timeout_s), [this] { return pid_ < 0; })) {
    log::warn("engine process {} did not stop within {} s: killing it", pid, o_.stop_timeout_s);
    kill(pid, SIGKILL);
    cv_.wait_for(l, std::chrono::seconds(5), [this] { return pid_ < 0; });
  }
}

// A serving child of epoch >= min_epoch; nullopt when stopping, given up, cancelled or after 10 minutes.
std::optional<Supervisor::Child> Supervisor::wait_child(uint64_t min_epoch, const std::function<bool()>& cancelled) {
  const auto deadline = Steady::now() + std::chrono::minutes(10);
  std::unique_lock<std::mutex> l(mu_);
  while (!(ready_ && epoch_ >= min_epoch)) {
    if (stopping_ || gave_up_ || (cancelled && cancelled()) || Steady::now() > deadline) return std::nullopt;
    cv_.wait_for(l, std::chrono::milliseconds(100));
  }
  return Child{epoch_, child_port_};
}

// After a failed exchange with child `epoch`: true when it still serves 3 s later (the failure
// was not its death), false once it is gone.
bool Supervisor::survives(uint64_t epoch) {
  std::unique_lock<std::mutex> l(mu_);
  return !cv_.wait_for(l, std::chrono::seconds(3), [&] { return !ready_ || epoch_ != epoch || stopping_; });
}

std::string Supervisor::unavailable_reason() {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return "the server is shutting down";
  if (gave_up_) return "the engine process ended too often (" + last_exit_ + ")";
  return "the engine process is restarting (" + last_exit_ + ")";
}

httplib::Request Supervisor::child_request(const httplib::Request& req, const httplib::Headers& extra) const {
  httplib::Request c;
  c.method = req.method;
  c.path = req.target;
  if (c.path.empty()) {
    c.path = req.path;
    char sep = '?';
    for (const auto& [k, v] : req.params) {
      c.path += sep + percent_encode(k) + "=" + percent_encode(v);
      sep = '&';
    }
  }
  for (const auto& [k, v] : req.headers) {
    if (!hop_header(k)) c.headers.emplace(k, v);
  }
  for (const auto& [k, v] : extra) c.headers.emplace(k, v);
  c.headers.emplace(kSupervisorSecretHeader, secret_);
  c.body = req.body;
  const std::string type = req.get_header_value("Content-Type");
  if (!req.body.empty() || !type.empty()) c.headers.emplace("Content-Type", type.empty() ? "application/json" : type);
  return c;
}

void Supervisor::health(httplib::Response& res) {
  json sup;
  bool ready;
  int port;
  {
    std::lock_guard<std::mutex> l(mu_);
    ready = ready_ && !stopping_;
    port = child_port_;
    sup = {{"restarts", restarts_},
           {"last_restart", restarts_ > 0 ? json(last_restart_unix_) : json(nullptr)},
           {"last_exit", last_exit_.empty() ? json(nullptr) : json(last_exit_)},
           {"engine_pid", ready ? json(pid_) : json(nullptr)},
           {"engine_up", ready}};
  }
  json body;
  if (ready) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(2);
    cli.set_read_timeout(5);
    httplib::Headers h = {{kSupervisorSecretHeader, secret_}};
    auto r = cli.Get("/health", h);
    if (r && r->status == 200) {
      body = {{"status", "ok"}};
    } else {
      sup["engine_up"] = false;  // the process runs but its engine does not serve
      body = {{"status", "error"}, {"message", r ? "the engine process answers " + std::to_string(r->status) + ": " + r->body
                                                 : "the engine process does not answer: " + httplib::to_string(r.error())}};
    }
  } else {
    body = {{"status", "error"}, {"message", unavailable_reason()}};
  }
  body["supervisor"] = sup;
  res.status = body["status"] == "ok" ? 200 : 503;
  res.set_content(body.dump(), "application/json");
}

void Supervisor::metrics(const httplib::Request& req, httplib::Response& res) {
  int64_t restarts;
  int64_t quarantined;
  bool ready;
  int port;
  {
    std::lock_guard<std::mutex> l(mu_);
    restarts = restarts_;
    quarantined = quarantined_total_;
    ready = ready_ && !stopping_;
    port = child_port_;
  }
  std::string text;
  if (ready) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(2);
    cli.set_read_timeout(10);
    auto r = cli.send(child_request(req, {}));
    if (r && r->status != 200) {
      res.status = r->status;
      res.set_content(r->body, r->get_header_value("Content-Type"));
      return;
    }
    if (r) text = r->body;
    ready = bool(r);
  }
  text += "# HELP strata_supervisor_restarts_total Engine process restarts since the server started.\n";
  text += "# TYPE strata_supervisor_restarts_total counter\n";
  text += "strata_supervisor_restarts_total " + std::to_string(restarts) + "\n";
  text += "# HELP strata_supervisor_quarantined_total Requests failed because the engine crashed twice under them.\n";
  text += "# TYPE strata_supervisor_quarantined_total counter\n";
  text += "strata_supervisor_quarantined_total " + std::to_string(quarantined) + "\n";
  text += "# HELP strata_supervisor_rejected_connections_total Client connections answered before a worker read them.\n";
  text += "# TYPE strata_supervisor_rejected_connections_total counter\n";
  text += "strata_supervisor_rejected_connections_total " + std::to_string(listener_->rejected()) + "\n";
  text += "# HELP strata_supervisor_engine_up 1 while the engine process serves.\n";
  text += "# TYPE strata_supervisor_engine_up gauge\n";
  text += "strata_supervisor_engine_up " + std::string(ready ? "1" : "0") + "\n";
  res.set_content(text, "text/plain; version=0.0.4");
}

// Any request but a streamed generation: sent to the child until one answers it with a live
// engine (every strata endpoint may be repeated: a generation resumes from its checkpoint).
void Supervisor::relay_plain(const httplib::Request& req, httplib::Response& res, const httplib::Headers& extra) {
  const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
  auto gone = [fd] { return peer_closed(fd); };
  const httplib::Request creq = child_request(req, extra);
  const uint64_t key = request_key(req);
  uint64_t min_epoch = 0;
  int same_child_failures = 0;
  int crashes = 0;
  for (;;) {
    if (quarantined(key)) {
      ApiError e;
      e.status = 500;
      e.code = "request_quarantined";
      e.message = quarantine_message();
      return write_error(req, res, e);
    }
    auto child = wait_child(min_epoch, gone);
    if (!child) {
      ApiError e;
      e.status = 503;
      e.message = unavailable_reason();
      return write_error(req, res, e);
    }
    httplib::Client cli("127.0.0.1", child->port);
    cli.set_url_encode(false);
    cli.set_connection_timeout(5);
    cli.set_read_timeout(24 * 3600);
    cli.set_write_timeout(60);
    httplib::Request attempt = creq;
    httplib::Response cres;
    httplib::Error err = httplib::Error::Success;
    // A client that leaves closes the child's connection too, so the child cancels the work.
    std::mutex watch_mu;
    std::condition_variable watch_cv;
    bool answered = false;
    bool left = false;
    std::thread watch([&] {
      std::unique_lock<std::mutex> l(watch_mu);
      while (!watch_cv.wait_for(l, std::chrono::milliseconds(100), [&] { return answered; })) {
        if (gone()) {
          left = true;
          cli.stop();
          return;
        }
      }
    });
    const bool ok = cli.send(attempt, cres, err);
    {
      std::lock_guard<std::mutex> l(watch_mu);
      answered = true;
    }
    watch_cv.notify_all();
    watch.join();
    if (left) {
      res.status = 499;  // nobody reads it
      return;
    }
    if (ok && !cres.has_header(kEngineDownHeader)) {
      res.status = cres.status;
      for (const auto& [k, v] : cres.headers) {
        if (!hop_header(k)) res.headers.emplace(k, v);
      }
      const std::string type = cres.get_header_value("Content-Type");
      res.set_content(cres.body, type.empty() ? "text/plain" : type);
      return;
    }
    if (!survives(child->epoch)) {
      min_epoch = child->epoch + 1;
      if (crashed(child->epoch) && ++crashes >= kCrashesBeforeQuarantine) {
        log::error("{} {}: the engine process crashed {} times under this request: quarantined", req.method, req.path, crashes);
        quarantine(key);
        continue;  // answered above
      }
      log::info("{} {}: re-sending to the restarted engine process", req.method, req.path);
      continue;
    }
    if (++same_child_failures > 2) {
      ApiError e;
      e.status = 502;
      e.message = "the engine process does not answer: " + (ok ? std::string("its engine stopped") : httplib::to_string(err));
      return write_error(req, res, e);
    }
  }
}

void Supervisor::stream_worker(std::shared_ptr<StreamRelay> relay, httplib::Request request) {
  StreamRelay& r = *relay;
  auto cancelled = [&r] { return r.client_gone.load(); };
  auto push = [&r](const std::string& text) {
    {
      std::lock_guard<std::mutex> l(r.mu);
      r.out.push_back(text);
    }
    r.cv.notify_all();
  };
  auto finish = [&r](std::optional<std::string> tail) {
    std::lock_guard<std::mutex> l(r.mu);
    if (tail) r.out.push_back(*tail);
    r.done = true;
    r.head = true;
    r.cv.notify_all();
  };
  auto fail = [&](int status, const std::string& message, const std::string& code = "") {
    ApiError e;
    e.status = status;
    e.message = message;
    e.code = code;
    std::unique_lock<std::mutex> l(r.mu);
    if (!r.head) {
      // Nothing was sent yet: an ordinary error answer.
      r.status = status;
      r.content_type = "application/json";
      r.body = (is_anthropic_path(request.path) ? anthropic_error_body(e) : openai_error_body(e)).dump();
      l.unlock();
      return finish(std::nullopt);
    }
    l.unlock();
    finish(stream_error_text(request.path, e));
  };

  PartFilter filter;
  uint64_t min_epoch = 0;
  int same_child_failures = 0;
  int crashes = 0;
  const uint64_t key = request_key(request);
  for (;;) {
    if (quarantined(key)) return fail(500, quarantine_message(), "request_quarantined");
    auto child = wait_child(min_epoch, cancelled);
    if (cancelled()) return finish(std::nullopt);
    if (!child) return fail(503, unavailable_reason());
    httplib::Client cli("127.0.0.1", child->port);
    cli.set_url_encode(false);
    cli.set_connection_timeout(5);
    cli.set_read_timeout(24 * 3600);
    cli.set_write_timeout(60);
    {
      std::lock_guard<std::mutex> l(r.mu);
      r.active = &cli;
    }
    if (cancelled()) {
      std::lock_guard<std::mutex> l(r.mu);
      r.active = nullptr;
      return finish(std::nullopt);
    }
    filter.begin_attempt();
    bool parted = false;
    int status = 0;
    std::string other_body;
    httplib::Request attempt = request;
    attempt.response_handler = [&](const httplib::Response& res) {
      status = res.status;
      parted = res.status == 200 && starts_with_ci(res.get_header_value("Content-Type"), "text/event-stream");
      if (parted) {
        std::lock_guard<std::mutex> l(r.mu);
        if (!r.head) {
          r.head = true;
          r.streaming = true;
          r.cv.notify_all();
        }
      }
      return !cancelled();
    };
    attempt.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (parted) {
        filter.feed(data, n, push);
      } else {
        other_body.append(data, n);
      }
      return !cancelled();
    };
    httplib::Response cres;
    httplib::Error err = httplib::Error::Success;
    const bool ok = cli.send(attempt, cres, err);
    {
      std::lock_guard<std::mutex> l(r.mu);
      r.active = nullptr;
    }
    if (cancelled()) return finish(std::nullopt);
    if (filter.ended()) return finish(std::nullopt);
    const bool engine_down = ok && (cres.has_header(kEngineDownHeader) || filter.lost());
    if (ok && !parted && !engine_down) {
      std::unique_lock<std::mutex> l(r.mu);
      if (!r.head) {
        // The child refused the request (a bad field, a full queue): its answer as it is.
        r.status = status;
        for (const auto& [k, v] : cres.headers) {
          if (!hop_header(k)) r.headers.emplace(k, v);
        }
        r.content_type = cres.get_header_value("Content-Type");
        r.body = std::move(other_body);
        l.unlock();
        return finish(std::nullopt);
      }
      l.unlock();
      // A re-sent request was refused after its stream began: a full queue clears up.
      if ((status == 429 || status == 503) && ++same_child_failures <= 30) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      return fail(status, "the restarted engine refused the request (" + std::to_string(status) + "): " + other_body);
    }
    // The stream was cut: wait for the next child when this one died.
    if (!survives(child->epoch)) {
      min_epoch = child->epoch + 1;
      if (crashed(child->epoch) && ++crashes >= kCrashesBeforeQuarantine) {
        log::error("{}: the engine process crashed {} times under this stream: quarantined", request.path, crashes);
        quarantine(key);
        continue;  // answered above
      }
      log::info("{}: stream cut after {} tokens, re-sending to the restarted engine process", request.path,
                filter.delivered());
      continue;
    }
    if (++same_child_failures > 2) {
      return fail(502, "the engine process does not answer: " +
                           (ok ? std::string("the stream ended early") : httplib::to_string(err)));
    }
  }
}

void Supervisor::relay_stream(const httplib::Request& req, httplib::Response& res, const httplib::Headers& extra) {
  auto relay = std::make_shared<StreamRelay>();
  httplib::Headers headers = extra;
  headers.emplace(kStreamPartsHeader, "1");
  relay->worker = std::thread([this, relay, c = child_request(req, headers)] { stream_worker(relay, c); });
  const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
  {
    std::unique_lock<std::mutex> l(relay->mu);
    while (!relay->head) {
      relay->cv.wait_for(l, std::chrono::milliseconds(100));
      if (!relay->head && peer_closed(fd)) {
        relay->client_gone = true;
        if (relay->active) relay->active->stop();
      }
    }
  }
  if (!relay->streaming) {
    relay->worker.join();
    res.status = relay->status > 0 ? relay->status : 503;  // 0: the client left first
    for (const auto& [k, v] : relay->headers) res.headers.emplace(k, v);
    res.set_content(relay->body, relay->content_type.empty() ? "application/json" : relay->content_type);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto leave = [relay] {
    std::lock_guard<std::mutex> l(relay->mu);
    relay->client_gone = true;
    if (relay->active) relay->active->stop();
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [relay, fd, leave](size_t, httplib::DataSink& sink) {
        for (;;) {
          std::deque<std::string> batch;
          bool done;
          {
            std::unique_lock<std::mutex> l(relay->mu);
            relay->cv.wait_for(l, std::chrono::milliseconds(100), [&] { return !relay->out.empty() || relay->done; });
            batch.swap(relay->out);
            done = relay->done;
          }
          for (const std::string& s : batch) {
            if (!sink.write(s.data(), s.size())) {
              leave();
              return false;
            }
          }
          if (done) break;
          if (batch.empty() && peer_closed(fd)) {
            leave();
            return false;
          }
        }
        sink.done();
        return true;
      },
      [relay, leave](bool) {
        leave();
        if (relay->worker.joinable()) relay->worker.join();
      });
}

void Supervisor::install_routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(o_.max_body_bytes);
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // The page at / holds no data (the engine process serves it); its calls carry the key.
    if (req.path == "/health" || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;
    const auto e = check_api_key(o_.api_key, req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
    if (!e) return httplib::Server::HandlerResponse::Unhandled;
    write_error(req, res, *e);
    return httplib::Server::HandlerResponse::Handled;
  });

  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    if (res.status == 413) {
      e.message = "request body is larger than --max-body-bytes (" + std::to_string(o_.max_body_bytes) + " bytes)";
      e.param = "body";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    write_error(req, res, e);
  });

  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    write_internal_error(req, res, ep);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
  s.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) { metrics(req, res); });

  auto generate = [this](const httplib::Request& req, httplib::Response& res) {
    // Pinned for every attempt: a seed for a request without one, the response id and time.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    httplib::Headers extra = {
        {kSeedHeader, std::to_string(rng())},
        {kResponseIdHeader, random_id(id_prefix(req.path))},
        {kCreatedHeader,
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count())}};
    const json body = json::parse(req.body, nullptr, false);
    const bool stream = body.is_object() && body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
    if (stream) return relay_stream(req, res, extra);
    relay_plain(req, res, extra);
  };
  s.Post("/v1/chat/completions", generate);
  s.Post("/v1/completions", generate);
  s.Post("/v1/messages", generate);
  s.Post("/v1/responses", generate);
  auto plain = [this](const httplib::Request& req, httplib::Response& res) { relay_plain(req, res, {}); };
  s.Get(".*", plain);
  s.Post(".*", plain);
  s.Put(".*", plain);
  s.Delete(".*", plain);
  s.Patch(".*", plain);
}

int Supervisor::run() {
  // SIGINT/SIGTERM go to one waiting thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto remove_temp = [this] {
    if (o_.temp_dir.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(o_.temp_dir, ec);
  };
  int status = 0;
  if (!spawn(&status)) {
    log::error("the engine process {} before serving", describe_exit(status));
    remove_temp();
    return exit_code_of(status) == 0 ? 1 : exit_code_of(status);
  }
  std::thread watcher([this] { monitor(); });

  install_routes();
  ListenerLimits limits = o_.listener;
  limits.workers = std::max(o_.http_threads, 4);
  limits.max_body_bytes = o_.max_body_bytes;
  listener_ = std::make_unique<HttpListener>(*http_, limits);
  auto bound = listener_->bind(o_.host, o_.port);
  const int port = bound.ok() ? *bound : -1;
  if (!bound.ok()) {
    log::error("{}", bound.error().message);
    stop_child();
    watcher.join();
    remove_temp();
    return 1;
  }

  // One stop() is lost when the signal lands before the listener runs: it repeats until the
  // listener has returned.
  std::atomic<bool> listener_done{false};
  std::thread waiter([this, &listener_done, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (listener_done.load()) return;
    log::info("signal {}: stopping the engine process, then the server", sig);
    stop_child();
    while (!listener_done.load()) {
      listener_->stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  log::info("supervising the engine process (pid {}); restarts it up to {} times a minute", pid_,
            o_.max_restarts_per_minute);
  std::printf("strata serve: listening on http://%s:%d\n", o_.host.c_str(), port);
  std::fflush(stdout);
  const bool ok = listener_->run();
  listener_done = true;
  stop_child();
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the signal thread if the listener ended on its own
  waiter.join();
  watcher.join();
  remove_temp();
  bool gave_up;
  {
    std::lock_guard<std::mutex> l(mu_);
    gave_up = gave_up_;
  }
  return ok && !gave_up ? 0 : 1;
}

int run_supervisor(const SupervisorOptions& options) {
  Supervisor s(options);
  return s.run();
}

}  // namespace strata::server
