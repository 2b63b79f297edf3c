// vigil/transport/unix_socket.h — Unix-domain stream sockets: the control channel of the cuda_ipc link.
//
// A Unix-domain socket reaches only processes of this host, and the kernel tells the listener who
// connected (SO_PEERCRED: pid, uid, gid), so the listener refuses any peer whose uid it does not allow
// before a byte is read. The socket file is created with mode 0600 (0666 when other uids are allowed,
// which SO_PEERCRED then filters). A stale socket file (nobody listening) is replaced; a live one is not
// (Listen fails naming it).
//
// Connections are the plain socket Connection of connection.h (non-blocking, poll with deadlines);
// peer() is "unix:pid=1234,uid=1000".
// Thread-safety: as connection.h.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"

namespace vigil::transport {

// Dials the socket at `path`. Errors: Unavailable (no such socket, nobody listening, refused).
std::unique_ptr<Dialer> MakeUnixDialer(std::string path);

struct UnixListenOptions {
  std::string kind = "unix";         // Listener::kind() (the cuda_ipc listener passes "cuda_ipc")
  std::vector<uid_t> allow_uids;     // peers allowed; empty = only this process's own uid (root is not
                                     // implied: list 0 to allow it)
  int backlog = 64;
};

class UnixListener final : public Listener {
 public:
  // Binds and listens at `path` (≤ 107 bytes). Errors: InvalidArgument (path too long or empty),
  // AlreadyExists (another process listens there), Unavailable (bind/listen failed: the OS reason).
  static StatusOr<std::unique_ptr<UnixListener>> Listen(const std::string& path, UnixListenOptions options = {});
  ~UnixListener() override;  // closes the socket and removes its file
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  std::string_view kind() const override { return opt_.kind; }
  uint16_t port() const override { return 0; }
  const std::string& address() const override { return address_; }  // "unix:/run/vigil/agg.sock"
  // Errors as Listener, and PermissionDenied for a peer whose uid is not allowed (its connection is
  // closed; the message names its pid and uid). The receiver counts those as `peer_credentials`.
  StatusOr<std::unique_ptr<Connection>> Accept(std::chrono::milliseconds timeout) override;

 private:
  UnixListener(int fd, std::string path, UnixListenOptions options);
  int fd_;
  std::string path_, address_;
  UnixListenOptions opt_;
};

}  // namespace vigil::transport
