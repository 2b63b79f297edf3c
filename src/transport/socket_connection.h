// Internal: a Connection (connection.h) over a connected stream socket — TCP (tcp.cc) or a Unix-domain
// socket (unix_socket.cc). Non-blocking socket, poll with deadlines, MSG_NOSIGNAL, close-on-exec.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "vigil/common/deadline.h"
#include "vigil/transport/connection.h"

namespace vigil::transport {
namespace net {

using std::chrono::milliseconds;

inline std::string Errno(int err) { return std::strerror(err); }

// Waits for `events` on fd until `deadline`; EINTR is retried. Returns revents, 0 on timeout, -1 error.
inline int PollUntil(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, deadline.PollMs());
    if (n > 0) return p.revents;
    if (n == 0) return 0;
    if (errno != EINTR) return -1;
  }
}


inline void Configure(int fd, bool tcp_nodelay) {
  const int one = 1;
  if (tcp_nodelay) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Connects the non-blocking socket `fd` to `addr` by `deadline`: 0, or the errno (ETIMEDOUT when the
// deadline passed first).
inline int ConnectBy(int fd, const sockaddr* addr, socklen_t len, Deadline deadline) {
  if (::connect(fd, addr, len) == 0) return 0;
  int err = errno;
  if (err != EINPROGRESS && err != EAGAIN) return err;
  const int ev = PollUntil(fd, POLLOUT, deadline);
  socklen_t err_len = sizeof err;
  if (ev == 0) return ETIMEDOUT;
  if (ev < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) return errno;
  return err;
}

// Accepts a connection on the non-blocking listening socket `fd` by `deadline` (close-on-exec,
// non-blocking), its address in `peer`/`len` when given. Errors: DeadlineExceeded when none came,
// Unavailable naming `where` and the OS reason.
inline StatusOr<int> AcceptBy(int fd, Deadline deadline, const std::string& where, sockaddr* peer = nullptr,
                              socklen_t* len = nullptr) {
  for (;;) {
    const int c = ::accept4(fd, peer, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c >= 0) return c;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(StrCat("accept on ", where, ": ", Errno(errno)));
    }
    const int ev = PollUntil(fd, POLLIN, deadline);
    if (ev == 0) return absl::DeadlineExceededError("no connection");
    if (ev < 0) return absl::UnavailableError(StrCat("poll on ", where, ": ", Errno(errno)));
  }
}

}  // namespace net

class SocketConnection final : public Connection {
  using milliseconds = std::chrono::milliseconds;

 public:
  // Takes ownership of `fd` (a connected stream socket); makes it non-blocking, with TCP_NODELAY for TCP.
  SocketConnection(int fd, bool tcp_nodelay, std::string peer) : fd_(fd), peer_(std::move(peer)) {
    net::Configure(fd_, tcp_nodelay);
  }
  ~SocketConnection() override { ::close(fd_); }
  int fd() const { return fd_; }

  Status Write(std::string_view bytes, milliseconds timeout) override {
    const auto deadline = Deadline::After(timeout);
    while (!bytes.empty()) {
      if (shut_.load()) return absl::UnavailableError(StrCat(peer_, ": connection shut down"));
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(StrCat(peer_, ": send: ", net::Errno(errno)));
      }
      const int ev = net::PollUntil(fd_, POLLOUT, deadline);
      if (ev == 0) {
        return absl::DeadlineExceededError(
            StrCat(peer_, ": send blocked for ", timeout.count(), " ms (the peer is not reading)"));
      }
      if (ev < 0) return absl::UnavailableError(StrCat(peer_, ": poll: ", net::Errno(errno)));
    }
    return absl::OkStatus();
  }

  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    const auto deadline = Deadline::After(timeout);
    for (;;) {
      if (shut_.load()) return absl::UnavailableError(StrCat(peer_, ": connection shut down"));
      const ssize_t n = ::recv(fd_, buf, max, 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) return absl::UnavailableError(StrCat(peer_, ": peer closed the connection"));
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(StrCat(peer_, ": recv: ", net::Errno(errno)));
      }
      const int ev = net::PollUntil(fd_, POLLIN, deadline);
      if (ev == 0) return absl::DeadlineExceededError(StrCat(peer_, ": nothing received for ", timeout.count(), " ms"));
      if (ev < 0) return absl::UnavailableError(StrCat(peer_, ": poll: ", net::Errno(errno)));
    }
  }

  void Shutdown() override {
    if (!shut_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);  // wakes a poll on another thread
  }

  std::string peer() const override { return peer_; }

 private:
  const int fd_;
  const std::string peer_;
  std::atomic<bool> shut_{false};
};


}  // namespace vigil::transport
