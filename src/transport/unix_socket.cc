// Unix-domain sockets (unix_socket.h).
#include "vigil/common/deadline.h"
#include "vigil/transport/unix_socket.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>

#include "socket_connection.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;

StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty()) return absl::InvalidArgumentError("unix socket: empty path");
  if (path.size() >= sizeof a.sun_path) {
    return absl::InvalidArgumentError(
        StrCat("unix socket '", path, "': path is ", path.size(), " bytes, the limit is ", sizeof a.sun_path - 1));
  }
  std::copy(path.begin(), path.end(), a.sun_path);
  return a;
}

// Connects a fresh socket to `a`; returns the fd, or -1 with errno set.
int ConnectTo(const sockaddr_un& a, Deadline deadline) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int err = net::ConnectBy(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a, deadline);
  if (err == 0) return fd;
  ::close(fd);
  errno = err;
  return -1;
}

class UnixDialer final : public Dialer {
 public:
  explicit UnixDialer(std::string path) : path_(std::move(path)) {}
  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    VIGIL_ASSIGN_OR_RETURN(sockaddr_un a, Address(path_));
    const int fd = ConnectTo(a, Deadline::After(timeout));
    if (fd < 0) return absl::UnavailableError(StrCat("connect to ", target(), ": ", net::Errno(errno)));
    return std::unique_ptr<Connection>(new SocketConnection(fd, /*tcp_nodelay=*/false, StrCat("unix:", path_)));
  }
  std::string target() const override { return StrCat("unix:", path_); }

 private:
  const std::string path_;
};

}  // namespace

std::unique_ptr<Dialer> MakeUnixDialer(std::string path) { return std::make_unique<UnixDialer>(std::move(path)); }

UnixListener::UnixListener(int fd, std::string path, UnixListenOptions options)
    : fd_(fd), path_(std::move(path)), address_(StrCat("unix:", path_)), opt_(std::move(options)) {}

UnixListener::~UnixListener() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(const std::string& path, UnixListenOptions options) {
  VIGIL_ASSIGN_OR_RETURN(sockaddr_un a, Address(path));
  if (options.allow_uids.empty()) options.allow_uids.push_back(::getuid());
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(StrCat("unix socket '", path, "': the path exists and is not a socket"));
    }
    const int probe = ConnectTo(a, Deadline::After(milliseconds(200)));
    if (probe >= 0) {
      ::close(probe);
      return absl::AlreadyExistsError(StrCat("unix socket '", path, "': another process listens there"));
    }
    ::unlink(path.c_str());  // stale: left by a process that died
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(StrCat("unix socket '", path, "': socket: ", net::Errno(errno)));
  const bool others = std::any_of(options.allow_uids.begin(), options.allow_uids.end(),
                                  [](uid_t u) { return u != ::getuid(); });
  const mode_t old = ::umask(others ? 0111 : 0177);  // the file is made by bind
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  const int bind_errno = errno;
  ::umask(old);
  if (rc != 0 || ::listen(fd, options.backlog) != 0) {
    const int err = rc != 0 ? bind_errno : errno;
    ::close(fd);
    if (rc != 0 && err == ENOENT) {
      const size_t slash = path.rfind('/');
      return absl::UnavailableError(StrCat("unix socket '", path, "': the directory '",
                                           slash == std::string::npos ? "." : path.substr(0, slash),
                                           "' does not exist (create it, e.g. mkdir -p, as the user that runs this process)"));
    }
    return absl::UnavailableError(StrCat("unix socket '", path, "': ", rc != 0 ? "bind" : "listen", ": ", net::Errno(err)));
  }
  return std::unique_ptr<UnixListener>(new UnixListener(fd, path, std::move(options)));
}

StatusOr<std::unique_ptr<Connection>> UnixListener::Accept(milliseconds timeout) {
  VIGIL_ASSIGN_OR_RETURN(const int fd, net::AcceptBy(fd_, Deadline::After(timeout), address_));
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::PermissionDeniedError(StrCat("unix socket ", path_, ": SO_PEERCRED: ", net::Errno(err)));
  }
  const std::string peer = StrCat("unix:pid=", cred.pid, ",uid=", cred.uid);
  if (std::find(opt_.allow_uids.begin(), opt_.allow_uids.end(), cred.uid) == opt_.allow_uids.end()) {
    ::close(fd);
    return absl::PermissionDeniedError(StrCat(peer, ": uid ", cred.uid, " is not allowed on ", address_, " (allow_uids)"));
  }
  return std::unique_ptr<Connection>(new SocketConnection(fd, /*tcp_nodelay=*/false, peer));
}

}  // namespace vigil::transport
