// vigil/transport/connection.h — byte-stream connections (TCP today) behind small interfaces.
//
// Connection and Dialer are the seam between the report protocol and the wire: the publisher dials
// through a Dialer, so tests wrap the TCP one with faults (cut a connection after N bytes, delay,
// drop) the way leveldb tests run on a fault-injecting Env. This module is the only code that opens
// sockets (docs/architecture.md).
//
// TCP specifics: sockets are non-blocking with TCP_NODELAY (a report is a small frame; Nagle plus
// delayed ACKs would add ~40 ms) and close-on-exec; writes use MSG_NOSIGNAL (no SIGPIPE).
// Thread-safety: one thread may Read while another Writes; Shutdown may be called from any thread.
// Ownership: the Connection owns its socket and closes it in its destructor.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "vigil/common/status.h"

namespace vigil::transport {

class Connection {
 public:
  virtual ~Connection() = default;
  // Writes all of `bytes` within `timeout`. Errors: Unavailable (peer closed or reset, or Shutdown),
  // DeadlineExceeded (the peer stopped reading; part of `bytes` may have been sent).
  virtual Status Write(std::string_view bytes, std::chrono::milliseconds timeout) = 0;
  // Waits up to `timeout` for data, then reads what is there (1..max bytes) into `buf`.
  // Errors: DeadlineExceeded (nothing arrived), Unavailable (peer closed, reset, or Shutdown).
  virtual StatusOr<size_t> Read(char* buf, size_t max, std::chrono::milliseconds timeout) = 0;
  // Makes pending and later Read/Write calls fail promptly with Unavailable. Idempotent.
  virtual void Shutdown() = 0;
  // The peer's address, "127.0.0.1:40212" or "[::1]:40212".
  virtual std::string peer() const = 0;
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

// A listening TCP socket (SO_REUSEADDR, so a restarted aggregator can bind its port at once).
class TcpListener {
 public:
  // Binds host:port (host "" = all IPv4 interfaces, port 0 = any free port) and listens.
  // Errors: Unavailable naming the address and the OS reason (e.g. "Address already in use").
  static StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host, uint16_t port, int backlog = 128);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  uint16_t port() const { return port_; }  // the bound port (resolves port 0)
  const std::string& address() const { return address_; }

  // Waits up to `timeout` for a connection. Errors: DeadlineExceeded when none arrived, Unavailable
  // on a socket error (e.g. out of file descriptors).
  StatusOr<std::unique_ptr<Connection>> Accept(std::chrono::milliseconds timeout);

 private:
  TcpListener(int fd, uint16_t port, std::string address) : fd_(fd), port_(port), address_(std::move(address)) {}
  int fd_;
  uint16_t port_;
  std::string address_;
};

}  // namespace vigil::transport
