// Noticing a client that has gone away while its request is still being generated (including a
// non-streaming request still in prefill, when nothing is written to the socket yet).
#pragma once

#include <string>

namespace mr::server {

// True when the peer has closed its end or reset the connection (recv(MSG_PEEK) sees EOF or an
// error). Data the client already sent (a pipelined request) does not count as closed.
bool PeerClosed(int fd);

}  // namespace mr::server
