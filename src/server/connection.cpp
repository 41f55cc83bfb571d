#include "server/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mr::server {
namespace {

bool Address(const sockaddr_storage& ss, std::string* ip, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    *port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  *ip = buf;
  return true;
}

}  // namespace

int FindConnectionSocket(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof(peer), ll = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    std::string pip, lip;
    int pport = 0, lport = 0;
    if (!Address(peer, &pip, &pport) || !Address(local, &lip, &lport)) continue;
    if (pport == remote_port && lport == local_port && pip == remote_addr) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

bool PeerClosed(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace mr::server
