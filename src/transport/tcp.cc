// TCP implementation of connection.h (POSIX sockets, poll).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "vigil/common/deadline.h"
#include "vigil/transport/connection.h"

#include "sockaddr.h"
#include "socket_connection.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
using net::AddrInfoPtr;
using net::FormatAddress;
using net::Resolve;
using net::Errno;

class TcpDialer final : public Dialer {
 public:
  TcpDialer(std::string host, uint16_t port) : host_(std::move(host)), port_(port) {}

  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    VIGIL_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host_, port_, false));
    const auto deadline = Deadline::After(timeout);
    std::string last_error = "no address";
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = StrCat("socket: ", Errno(errno));
        continue;
      }
      const int err = net::ConnectBy(fd, a->ai_addr, a->ai_addrlen, deadline);
      if (err == 0) return std::unique_ptr<Connection>(new SocketConnection(fd, /*tcp_nodelay=*/true, FormatAddress(a->ai_addr, a->ai_addrlen)));
      last_error = StrCat(FormatAddress(a->ai_addr, a->ai_addrlen), ": ", Errno(err));
      ::close(fd);
    }
    return absl::UnavailableError(StrCat("connect to ", target(), ": ", last_error));
  }

  std::string target() const override { return StrCat("tcp://", host_, ":", port_); }

 private:
  const std::string host_;
  const uint16_t port_;
};

}  // namespace

std::unique_ptr<Dialer> MakeTcpDialer(std::string host, uint16_t port) {
  return std::make_unique<TcpDialer>(std::move(host), port);
}

StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host, uint16_t port, int backlog) {
  const std::string where = StrCat(host.empty() ? "0.0.0.0" : host, ":", port);
  VIGIL_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, true));
  std::string last_error = "no address";
  for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = StrCat("socket: ", Errno(errno));
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, backlog) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      const uint16_t actual = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      return std::unique_ptr<TcpListener>(
          new TcpListener(fd, actual, FormatAddress(reinterpret_cast<sockaddr*>(&bound), len)));
    }
    last_error = Errno(errno);
    ::close(fd);
  }
  return absl::UnavailableError(StrCat("listen on ", where, ": ", last_error));
}

TcpListener::~TcpListener() { ::close(fd_); }

StatusOr<std::unique_ptr<Connection>> TcpListener::Accept(milliseconds timeout) {
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  VIGIL_ASSIGN_OR_RETURN(const int fd, net::AcceptBy(fd_, Deadline::After(timeout), address_,
                                                     reinterpret_cast<sockaddr*>(&peer), &len));
  return std::unique_ptr<Connection>(
      new SocketConnection(fd, /*tcp_nodelay=*/true, FormatAddress(reinterpret_cast<sockaddr*>(&peer), len)));
}

namespace net {

StatusOr<AddrInfoPtr> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? (passive ? "0.0.0.0" : nullptr) : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) return absl::InvalidArgumentError(StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc)));
  return AddrInfoPtr(res);
}

std::string FormatAddress(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "?";
  return sa->sa_family == AF_INET6 ? StrCat("[", host, "]:", serv) : StrCat(host, ":", serv);
}

}  // namespace net

}  // namespace vigil::transport
