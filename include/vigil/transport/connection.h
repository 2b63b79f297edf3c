// vigil/transport/connection.h — byte-stream connections behind small interfaces: TCP here, TLS over any
// connection (tls.h), UCX endpoints (ucx.h).
//
// Connection, Dialer and Listener are the seam between the report protocol and the wire: the publisher
// dials through a Dialer and the receiver accepts from a Listener, so the same framing and handshake run
// over every link kind, and tests wrap them with faults (cut a connection after N bytes, delay, drop)
// the way leveldb tests run on a fault-injecting Env. The transport module is the only code that opens
// sockets or UCX endpoints (docs/architecture.md).
//
// TCP specifics: sockets are non-blocking with TCP_NODELAY (a report is a small frame; Nagle plus
// delayed ACKs would add ~40 ms) and close-on-exec; writes use MSG_NOSIGNAL (no SIGPIPE).
// Thread-safety: one thread may Read while another Writes; Shutdown may be called from any thread.
// Ownership: the Connection owns its socket and closes it in its destructor.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

struct DevicePayload;  // outbox.h

class Connection {
 public:
  virtual ~Connection() = default;
  // Writes all of `bytes` within `timeout`. Errors: Unavailable (peer closed or reset, or Shutdown),
  // DeadlineExceeded (the peer stopped reading; part of `bytes` may have been sent).
  virtual Status Write(std::string_view bytes, std::chrono::milliseconds timeout) = 0;
  // Waits up to `timeout` for data, then reads what is there (1..max bytes) into `buf`.
  // Errors: DeadlineExceeded (nothing arrived), Unavailable (peer closed, reset, or Shutdown).
  virtual StatusOr<size_t> Read(char* buf, size_t max, std::chrono::milliseconds timeout) = 0;
  // For a connection that decodes what it receives itself (cuda_ipc.h: a report in a ring slot is checked and
  // decoded once, straight from the slot, instead of being encoded into bytes again for the receiver's
  // decoder): true, and the receiver calls ReadMessages instead of Read (such a connection's Read fails with
  // Unimplemented). Default: false. Thread-safe.
  virtual bool decodes() const { return false; }
  // Waits up to `timeout` for data, then appends what arrived, in order, to `out`: whole messages, and for
  // bytes that are not a valid frame the decoder's error (FrameDecoder::Next's: Unimplemented for another
  // protocol version, InvalidArgument or DataLoss for a malformed or corrupt frame), after which the stream
  // is unusable. Returns the bytes they took (≥ 1 when `out` grew). Errors: as Read; DataLoss also for a ring
  // slot that fails its checks (nothing of it was appended). Unimplemented by default.
  virtual StatusOr<size_t> ReadMessages(std::deque<StatusOr<Message>>* /*out*/, std::chrono::milliseconds /*timeout*/) {
    return absl::UnimplementedError("this connection does not decode");
  }
  // Makes pending and later Read/Write calls fail promptly with Unavailable. Idempotent.
  virtual void Shutdown() = 0;
  // The peer's address, "127.0.0.1:40212" or "[::1]:40212" (the access control's allow-list matches it).
  virtual std::string peer() const = 0;
  // What carries the bytes underneath, for metrics and logs: "" for a plain socket; for UCX the
  // transports its endpoint selected, comma-separated ("tcp", "posix,sysv,cma", "rc_mlx5"); for TLS the
  // inner connection's. Thread-safe.
  virtual std::string transports() const { return {}; }
  // For a link whose reports travel beside the byte stream (cuda_ipc.h: a ring in GPU memory): called once
  // by the receiver after the peer authenticated and before its Hello goes to the handler. Returns the
  // frames to send then (the ring offer), or nullopt for a plain connection. `ok` false: no ring could be set
  // up (the frames say why); the receiver closes the connection after sending them. With an offer, the
  // receiver admits the session only after the peer answered RingAccept, so a peer that cannot use the
  // ring is never granted an epoch and never supersedes its session on another link. Thread-safe.
  struct SessionOffer {
    std::string frames;
    bool ok = true;
  };
  virtual std::optional<SessionOffer> OfferSession() { return std::nullopt; }

  // For a connection that can send detection rows from where they live (ucx.h: from GPU memory when UCX
  // has CUDA transports): whether WriteReport takes rows on CUDA device `device` (-1: rows in host memory
  // held apart from the frame). Default: no. Thread-safe.
  virtual bool takes_rows_from(int /*device*/) const { return false; }
  // Writes `frame` — one Report frame encoded with no detection rows (protocol.h) — and `rows.count` rows
  // sent straight from `rows.device_rows` (after waiting for `rows.ready_event`); the peer's Read returns
  // one ordinary Report frame carrying those rows, in order with the bytes of Write. The peer checks the
  // rows (ValidateReport) and fails the connection with DataLoss on rows that do not pass. `rows.keepalive`
  // is held until the send completes. Errors: as Write; OutOfRange (`frame` larger than the transport takes
  // beside rows: nothing was sent, the caller sends the rows another way); Unimplemented by default.
  virtual Status WriteReport(std::string_view /*frame*/, const DevicePayload& /*rows*/,
                             std::chrono::milliseconds /*timeout*/) {
    return absl::UnimplementedError("this connection sends no rows from device memory");
  }
};

class Dialer {
 public:
  virtual ~Dialer() = default;
  // Opens a connection within `timeout`. Errors: Unavailable (refused, unreachable, timed out),
  // InvalidArgument (the host does not resolve).
  virtual StatusOr<std::unique_ptr<Connection>> Dial(std::chrono::milliseconds timeout) = 0;
  // What it dials, "tcp://host:port", for messages.
  virtual std::string target() const = 0;
};

// Dials host:port over TCP (IPv4 or IPv6, whatever the name resolves to, in resolver order).
std::unique_ptr<Dialer> MakeTcpDialer(std::string host, uint16_t port);

// Where a receiver accepts connections from (a TCP socket, UCX listener, TLS over either).
// Thread-safety: Accept from one thread; the accessors from any.
class Listener {
 public:
  virtual ~Listener() = default;
  // The link kind it serves as the configs name it: "tcp", "ucx" (TLS keeps its inner kind: "tcp").
  virtual std::string_view kind() const = 0;
  virtual uint16_t port() const = 0;               // the bound port (resolves port 0)
  virtual const std::string& address() const = 0;  // "0.0.0.0:7400", for logs
  // Waits up to `timeout` for a connection. Errors: DeadlineExceeded when none arrived, Unavailable
  // on an error of the listener (e.g. out of file descriptors). A connection whose own setup fails (a
  // TLS handshake) is not reported here: it fails on its first Read or Write.
  virtual StatusOr<std::unique_ptr<Connection>> Accept(std::chrono::milliseconds timeout) = 0;
};

// A listening TCP socket (SO_REUSEADDR, so a restarted aggregator can bind its port at once).
class TcpListener final : public Listener {
 public:
  // Binds host:port (host "" = all IPv4 interfaces, port 0 = any free port) and listens.
  // Errors: Unavailable naming the address and the OS reason (e.g. "Address already in use").
  static StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host, uint16_t port, int backlog = 128);
  ~TcpListener() override;
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  std::string_view kind() const override { return "tcp"; }
  uint16_t port() const override { return port_; }
  const std::string& address() const override { return address_; }
  StatusOr<std::unique_ptr<Connection>> Accept(std::chrono::milliseconds timeout) override;

 private:
  TcpListener(int fd, uint16_t port, std::string address) : fd_(fd), port_(port), address_(std::move(address)) {}
  int fd_;
  uint16_t port_;
  std::string address_;
};

}  // namespace vigil::transport
