// HttpListener: the accept loop in front of a cpp-httplib Server, screening connections before
// a worker thread is spent on them. cpp-httplib gives each accepted connection a worker that
// blocks reading it, so 80 clients sending their headers a line every two seconds hold 80
// workers and nobody else is answered. Here one thread (the gate) watches every new connection
// with epoll and peeks at what it sent, consuming nothing; only a connection whose request
// head has arrived (and a short body whole, or a long one's first part) reaches a worker,
// which then reads it from the socket at once. What the gate answers itself, closing after:
//   - 408 when the head has not arrived within header_timeout_s of the connection opening;
//   - 431 when the head passes max_header_bytes;
//   - 413 at once for a Content-Length over max_body_bytes, 400 for a negative or malformed one;
//   - 429 with Retry-After when an address holds max_connections_per_address connections
//     (the request is read first so the client sees the answer, not a reset).
// The listening socket's backlog is SOMAXCONN. Each connection serves one request (keep-alive
// would let a client send its second request as slowly as it likes on a worker).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/status.h"

namespace httplib {
class Server;
}

namespace strata::server {

struct ListenerLimits {
  int workers = 72;                      // threads serving screened requests
  double header_timeout_s = 10.0;        // the request head (and a short body) must arrive by then
  size_t max_header_bytes = size_t(64) << 10;
  size_t max_body_bytes = size_t(32) << 20;
  int max_connections_per_address = 256;  // 0: no limit (a supervised child: every peer is its supervisor)
};

// What the gate decided from the bytes a connection has sent so far (exposed for tests).
struct HeadCheck {
  enum Kind { kWait, kReady, kReject } kind = kWait;
  int status = 0;        // kReject: the HTTP status to answer
  std::string message;   // kReject: why
  std::string path;      // the request target's path, when the request line has arrived
};
// `peeked`: the connection's bytes so far. Ready once the head is complete and the body is
// whole, or has its first `body_gate` bytes, or is chunked or expects 100-continue.
HeadCheck check_request_head(std::string_view peeked, const ListenerLimits& limits, size_t body_gate);

class HttpListener {
 public:
  HttpListener(httplib::Server& server, ListenerLimits limits);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds host:port (0: any free port) through the server; returns the port.
  Result<int> bind(const std::string& host, int port);
  // Serves until stop(); false if the listening socket failed.
  bool run();
  void stop();

  // Connections the gate answered itself (408, 413, 431, 429, 400), for /metrics.
  int64_t rejected() const { return rejected_.load(); }

 private:
  struct Pending;
  void gate_loop();
  void worker_loop();
  void admit(int fd, const std::string& address);
  void release(const std::string& address);
  void answer_and_close(int fd, int status, const std::string& path, const std::string& message);

  httplib::Server& server_;
  ListenerLimits limits_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: new connections or stop
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> rejected_{0};

  std::mutex mu_;
  std::condition_variable ready_cv_;
  std::deque<std::pair<int, std::string>> ready_;       // screened connections for the workers
  std::deque<std::pair<int, std::string>> incoming_;    // accepted, for the gate
  std::map<std::string, int> per_address_;              // open connections per peer address
  std::vector<std::thread> workers_;
  std::thread gate_;
};

}  // namespace strata::server
