#include "server/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

namespace strata::server {

namespace {

bool address_of(const sockaddr_storage& a, std::string* host, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, buf, sizeof(buf));
    *port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof(buf));
    *port = ntohs(s->sin6_port);
  } else {
    return false;
  }
  *host = buf;
  return true;
}

}  // namespace

int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    std::string ph, sh;
    int pp = 0, sp = 0;
    if (!address_of(peer, &ph, &pp) || !address_of(self, &sh, &sp)) continue;
    if (pp == remote_port && sp == local_port && (remote_addr.empty() || ph == remote_addr)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{};
  p.fd = fd;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace strata::server
