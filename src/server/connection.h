// Noticing a client that has gone away while its request is still being generated (including a
// non-streaming request still in prefill, when nothing is written to the socket yet).
// cpp-httplib 0.11 does not expose a request's socket, so it is found by its addresses.
#pragma once

#include <string>

namespace mr::server {

// The connected socket whose peer is remote_addr:remote_port and whose local port is
// local_port; -1 when none matches.
int FindConnectionSocket(const std::string& remote_addr, int remote_port, int local_port);

// True when the peer has closed its end or reset the connection (recv(MSG_PEEK) sees EOF or an
// error). Data the client already sent (a pipelined request) does not count as closed.
bool PeerClosed(int fd);

}  // namespace mr::server
