// Finds the socket of an HTTP request and tells whether its peer went away. cpp-httplib
// hands handlers no socket, so the socket is found among the process's descriptors by its
// address pair (unique among open TCP connections); the handler's thread keeps it open for
// as long as the handler runs, so the descriptor cannot be reused underneath.
#pragma once

#include <string>

namespace strata::server {

// The descriptor of the connection local_port <-> remote_addr:remote_port; -1 when not found.
int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port);

// True once the peer closed or reset the connection (poll: RDHUP/HUP/ERR). fd < 0: false.
bool peer_closed(int fd);

}  // namespace strata::server
