#include "server/http_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <strings.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <unordered_map>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "server/api_error.h"
#include "server/http_errors.h"

namespace strata::server {

// cpp-httplib 0.11 serves a socket only from its own accept loop: Server::process_and_close_socket
// is private. The listener accepts and screens connections itself, then hands each one to it
// through a member pointer named in an explicit instantiation, where access is not checked
// ([temp.spec.general]/6). The call is virtual, so it runs httplib::Server's own body.
namespace {
using ProcessSocket = bool (httplib::Server::*)(socket_t);
}
ProcessSocket httplib_process_socket();
template <ProcessSocket Member>
struct HttplibProcessSocket {
  friend ProcessSocket httplib_process_socket() { return Member; }
};
template struct HttplibProcessSocket<&httplib::Server::process_and_close_socket>;

namespace {

using Steady = std::chrono::steady_clock;

constexpr size_t kBodyGate = size_t(32) << 10;  // a body's first bytes a connection must send before a worker reads it

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string status_text(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// The peer's address without the port ("127.0.0.1", "::1").
std::string peer_address(const sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, buf, sizeof(buf));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

// The listening socket cpp-httplib bound on `port`, found among the process's descriptors.
int find_listening_fd(int port) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr {};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (p == port) return fd;
  }
  return -1;
}

// Lets this process hold as many descriptors as its hard limit allows (each connection is one).
void raise_descriptor_limit() {
  rlimit rl {};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace

HeadCheck check_request_head(std::string_view peeked, const ListenerLimits& limits, size_t body_gate) {
  HeadCheck h;
  const size_t line_end = peeked.find("\r\n");
  if (line_end != std::string::npos) {
    // "POST /v1/chat/completions?x=1 HTTP/1.1"
    const std::string_view line(peeked.data(), line_end);
    const size_t sp1 = line.find(' ');
    if (sp1 != std::string_view::npos) {
      const size_t sp2 = line.find(' ', sp1 + 1);
      std::string_view target = line.substr(sp1 + 1, sp2 == std::string_view::npos ? std::string_view::npos : sp2 - sp1 - 1);
      target = target.substr(0, target.find('?'));
      h.path = std::string(target.substr(0, 256));
    }
  }
  const size_t head_end = peeked.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (peeked.size() > limits.max_header_bytes) {
      h.kind = HeadCheck::kReject;
      h.status = 431;
      h.message = "the request head is larger than " + std::to_string(limits.max_header_bytes) + " bytes";
    }
    return h;
  }
  if (head_end + 4 > limits.max_header_bytes) {
    h.kind = HeadCheck::kReject;
    h.status = 431;
    h.message = "the request head is larger than " + std::to_string(limits.max_header_bytes) + " bytes";
    return h;
  }
  std::optional<uint64_t> content_length;
  bool chunked = false;
  bool expect_continue = false;
  size_t pos = line_end + 2;
  while (pos < head_end) {
    const size_t eol = peeked.find("\r\n", pos);
    const std::string_view header(peeked.data() + pos, eol - pos);
    pos = eol + 2;
    const size_t colon = header.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = trim(header.substr(0, colon));
    const std::string_view value = trim(header.substr(colon + 1));
    if (iequals(name, "Content-Length")) {
      bool digits = !value.empty() && value.size() <= 19;
      for (char c : value) digits = digits && std::isdigit(static_cast<unsigned char>(c));
      if (!digits) {
        h.kind = HeadCheck::kReject;
        h.status = value.size() > 19 && value.find_first_not_of("0123456789") == std::string_view::npos ? 413 : 400;
        h.message = h.status == 413 ? "Content-Length " + std::string(value.substr(0, 40)) + " is larger than --max-body-bytes (" +
                                          std::to_string(limits.max_body_bytes) + " bytes)"
                                    : "Content-Length must be a non-negative integer, got '" +
                                          std::string(value.substr(0, 40)) + "'";
        return h;
      }
      const uint64_t n = std::stoull(std::string(value));
      if (content_length && *content_length != n) {
        h.kind = HeadCheck::kReject;
        h.status = 400;
        h.message = "the request has two different Content-Length headers";
        return h;
      }
      content_length = n;
    } else if (iequals(name, "Transfer-Encoding")) {
      chunked = true;
    } else if (iequals(name, "Expect")) {
      expect_continue = true;
    }
  }
  if (content_length && *content_length > limits.max_body_bytes) {
    h.kind = HeadCheck::kReject;
    h.status = 413;
    h.message = "request body is larger than --max-body-bytes (Content-Length " + std::to_string(*content_length) + ", limit " +
                std::to_string(limits.max_body_bytes) + " bytes)";
    return h;
  }
  const uint64_t body = peeked.size() - (head_end + 4);
  const uint64_t want = content_length ? std::min<uint64_t>(*content_length, body_gate) : 0;
  if (chunked || expect_continue || body >= want) h.kind = HeadCheck::kReady;
  return h;
}

struct HttpListener::Pending {
  int fd = -1;
  std::string address;
  Steady::time_point deadline;
  bool over_budget = false;  // answered 429 once its request has arrived
  bool draining = false;     // answered; reading what is left until the peer closes
};

HttpListener::HttpListener(httplib::Server& server, ListenerLimits limits) : server_(server), limits_(std::move(limits)) {
  server_.set_keep_alive_max_count(1);
}

HttpListener::~HttpListener() {
  stop();
  if (gate_.joinable()) gate_.join();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

Result<int> HttpListener::bind(const std::string& host, int port) {
  raise_descriptor_limit();
  if (port == 0) {
    port = server_.bind_to_any_port(host);
    if (port < 0) return make_error(ErrorCode::kIo, "cannot listen on " + host + " (any port)");
  } else if (!server_.bind_to_port(host, port)) {
    return make_error(ErrorCode::kIo, "cannot listen on " + host + ":" + std::to_string(port) + " (in use, or no permission)");
  }
  listen_fd_ = find_listening_fd(port);
  if (listen_fd_ < 0) return make_error(ErrorCode::kIo, "the listening socket on port " + std::to_string(port) + " was not found");
  // A request body waits in the socket's buffer while the gate peeks at it.
  const int rcvbuf = 1 << 20;
  setsockopt(listen_fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  ::listen(listen_fd_, SOMAXCONN);
  return port;
}

bool HttpListener::run() {
  if (listen_fd_ < 0) return false;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return false;
  epoll_event ev {};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  for (int i = 0; i < std::max(limits_.workers, 1); ++i) workers_.emplace_back([this] { worker_loop(); });
  gate_ = std::thread([this] { gate_loop(); });
  bool ok = true;
  while (!stopping_.load()) {
    sockaddr_storage addr {};
    socklen_t alen = sizeof(addr);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) break;
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the backlog holds the connection until one is free.
        log::warn("accept: {} (waiting for a free descriptor)", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      if (errno == EINVAL) break;  // shut down by stop()
      log::error("accept: {}", std::strerror(errno));
      ok = false;
      break;
    }
    admit(fd, peer_address(addr));
  }
  stopping_ = true;
  ready_cv_.notify_all();
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
  }
  if (gate_.joinable()) gate_.join();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  workers_.clear();
  return ok;
}

void HttpListener::stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // accept returns EINVAL
  ready_cv_.notify_all();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
    }
  }
}

void HttpListener::admit(int fd, const std::string& address) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++per_address_[address];
    incoming_.emplace_back(fd, address);
  }
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
  }
}

void HttpListener::release(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_address_.find(address);
  if (it != per_address_.end() && --it->second <= 0) per_address_.erase(it);
}

void HttpListener::answer_and_close(int fd, int status, const std::string& path, const std::string& message) {
  ApiError e;
  e.status = status;
  e.message = message;
  if (status == 413) e.param = "body";
  if (status == 429 || status == 503) e.retry_after_s = 1;
  const nlohmann::json body = is_anthropic_path(path) ? anthropic_error_body(e) : openai_error_body(e);
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  out += "Content-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) + "\r\nConnection: close\r\n";
  if (e.retry_after_s > 0) out += "Retry-After: " + std::to_string(e.retry_after_s) + "\r\n";
  out += "\r\n" + text;
  // Best effort on a non-blocking socket: an answer this small fits the send buffer.
  if (send(fd, out.data(), out.size(), MSG_NOSIGNAL) < 0) {
  }
  ::shutdown(fd, SHUT_WR);
}

void HttpListener::gate_loop() {
  std::unordered_map<int, Pending> pending;
  std::string buf(limits_.max_header_bytes + kBodyGate + 1, '\0');
  auto drop = [&](int fd) {
    auto it = pending.find(fd);
    if (it == pending.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    release(it->second.address);
    pending.erase(it);
  };
  // Answers and keeps reading until the peer closes (at most 1 s), so unread bytes do not
  // turn the answer into a reset.
  auto reject = [&](Pending& p, int status, const std::string& path, const std::string& message) {
    rejected_.fetch_add(1);
    answer_and_close(p.fd, status, path, message);
    p.draining = true;
    p.deadline = Steady::now() + std::chrono::seconds(1);
  };
  auto over_budget = [&](Pending& p, const std::string& path) {
    reject(p, 429, path,
           "too many connections from " + p.address + " (" + std::to_string(limits_.max_connections_per_address) +
               " at most); retry later");
  };
  auto examine = [&](Pending& p) {
    if (p.draining) {
      char sink[4096];
      for (;;) {
        const ssize_t n = recv(p.fd, sink, sizeof(sink), 0);
        if (n > 0) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return drop(p.fd);
        return;
      }
    }
    const ssize_t n = recv(p.fd, buf.data(), buf.size(), MSG_PEEK);
    if (n == 0) return drop(p.fd);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return drop(p.fd);
    }
    const HeadCheck h = check_request_head(std::string_view(buf.data(), size_t(n)), limits_, kBodyGate);
    if (h.kind == HeadCheck::kReject) return reject(p, h.status, h.path, h.message);
    if (h.kind == HeadCheck::kWait) return;
    if (p.over_budget) return over_budget(p, h.path);
    // Ready: a worker reads it, blocking again as cpp-httplib expects (its read and write
    // timeouts bound each wait).
    const int fd = p.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace_back(fd, p.address);
    }
    ready_cv_.notify_one();
    pending.erase(fd);
  };

  std::vector<epoll_event> events(256);
  while (!stopping_.load()) {
    const int n = epoll_wait(epoll_fd_, events.data(), int(events.size()), 100);
    std::deque<std::pair<int, std::string>> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh.swap(incoming_);
    }
    for (auto& [fd, address] : fresh) {
      Pending p;
      p.fd = fd;
      p.address = address;
      p.deadline = Steady::now() + std::chrono::microseconds(int64_t(limits_.header_timeout_s * 1e6));
      if (limits_.max_connections_per_address > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        p.over_budget = per_address_[address] > limits_.max_connections_per_address;
      }
      // Edge-triggered: peeking consumes nothing, so a level-triggered watch would fire again at once.
      epoll_event ev {};
      ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      pending.emplace(fd, std::move(p));
      examine(pending.at(fd));  // what arrived before the watch began
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[size_t(i)].data.fd;
      if (fd == wake_fd_) {
        uint64_t v = 0;
        if (read(wake_fd_, &v, sizeof(v)) < 0) {
        }
        continue;
      }
      auto it = pending.find(fd);
      if (it != pending.end()) examine(it->second);
    }
    const auto now = Steady::now();
    std::vector<int> late;
    for (auto& [fd, p] : pending) {
      if (now >= p.deadline) late.push_back(fd);
    }
    for (int fd : late) {
      Pending& p = pending.at(fd);
      if (p.draining) {
        drop(fd);
        continue;
      }
      const ssize_t got = recv(fd, buf.data(), buf.size(), MSG_PEEK);
      const std::string path = check_request_head(std::string_view(buf.data(), got > 0 ? size_t(got) : 0), limits_, kBodyGate).path;
      if (p.over_budget) {
        over_budget(p, path);
      } else {
        reject(p, 408, path,
               "the request did not arrive within " + std::to_string(int(limits_.header_timeout_s)) + " s (--header-timeout)");
      }
    }
  }
  for (auto& [fd, p] : pending) {
    close(fd);
    release(p.address);
  }
  pending.clear();
}

void HttpListener::worker_loop() {
  const ProcessSocket process = httplib_process_socket();
  for (;;) {
    std::pair<int, std::string> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_cv_.wait(lock, [this] { return stopping_.load() || !ready_.empty(); });
      if (ready_.empty()) return;
      job = std::move(ready_.front());
      ready_.pop_front();
    }
    try {
      (server_.*process)(job.first);  // reads, answers and closes the socket
    } catch (const std::exception& e) {
      log::error("serving a connection: {}", e.what());
      close(job.first);
    }
    release(job.second);
  }
}

}  // namespace strata::server
