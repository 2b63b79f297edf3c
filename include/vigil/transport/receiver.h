// vigil/transport/receiver.h — the aggregator side: accepts edges over TCP and hands over their reports.
//
// One accept thread, one thread per connection (an aggregator serves tens of edges, not thousands).
// A connection must start with Hello (protocol version kProtocolVersion); then Reports and Heartbeats
// (echoed at once). A frame that does not decode (bad magic, CRC, version, truncated body, invalid
// report), a Report from another edge id than the Hello's, or any other protocol violation gets a
// Reject (empty stream, reason kProtocolError / kUnsupportedVersion) and closes that connection only,
// counted in ReceiverStats; nothing a client sends can stop the receiver or the process.
// A connection silent for `peer_timeout` is closed (publishers send heartbeats).
//
// Thread-safety: ReceiverHandler callbacks run on connection threads, concurrently for different
// connections and in arrival order for one connection. Session::Send is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

// One accepted connection after its Hello; made by the receiver, shared with the handler.
class Session {
 public:
  Session(uint64_t id, std::shared_ptr<Connection> conn, Hello hello, std::chrono::milliseconds write_timeout)
      : id_(id), conn_(std::move(conn)), hello_(std::move(hello)), write_timeout_(write_timeout) {}

  uint64_t id() const { return id_; }  // unique per receiver
  const std::string& edge() const { return hello_.edge; }
  uint64_t epoch() const { return hello_.epoch; }
  std::string peer() const { return conn_->peer(); }

  // Sends encoded frames (one or more, e.g. a batch of Acks). A send that cannot complete within the
  // receiver's write_timeout (the edge is not reading) shuts the session down, so a stalled edge
  // cannot stall its caller for longer. Errors: Unavailable / DeadlineExceeded.
  Status SendFrames(std::string_view frames);
  Status Send(const Message& m) { return SendFrames(EncodeFrame(m)); }
  // Closes the connection (the receiver then ends it and calls OnClose).
  void Close() { conn_->Shutdown(); }

 private:
  const uint64_t id_;
  const std::shared_ptr<Connection> conn_;
  const Hello hello_;
  const std::chrono::milliseconds write_timeout_;
  std::mutex write_mu_;  // one writer at a time: frames are never interleaved
};

class ReceiverHandler {
 public:
  virtual ~ReceiverHandler() = default;
  // A connection said Hello. A non-OK status refuses it: the edge gets Reject(kProtocolError, message)
  // and the connection closes.
  virtual Status OnHello(const std::shared_ptr<Session>& session) = 0;
  // A valid Report whose edge is the session's. May block to apply backpressure (the connection is
  // not read meanwhile). The handler answers with Ack/Reject through the session, now or later.
  virtual void OnReport(const std::shared_ptr<Session>& session, Report report) = 0;
  // The connection ended (`why`: peer closed, timeout, protocol error, receiver stopping).
  virtual void OnClose(const std::shared_ptr<Session>& session, const Status& why) = 0;
};

struct ReceiverOptions {
  std::string host = "0.0.0.0";                   // "" = all IPv4 interfaces
  uint16_t port = 7400;                           // 0 = any free port. Default: 7400
  int max_connections = 256;                      // more are accepted and closed at once (counted). Default: 256
  std::chrono::milliseconds peer_timeout{10000};  // close a connection silent this long. Default: 10 s
  std::chrono::milliseconds write_timeout{1000};  // a send blocked this long closes the connection. Default: 1 s
};

struct ReceiverStats {
  uint64_t accepted = 0;         // connections accepted
  uint64_t refused = 0;          // closed at once: over max_connections
  uint64_t active = 0;           // open now
  uint64_t protocol_errors = 0;  // connections closed for a malformed frame or a protocol violation
  uint64_t timeouts = 0;         // connections closed after peer_timeout of silence
  uint64_t frames = 0;           // frames decoded
  uint64_t bytes = 0;            // bytes received
};

class TcpReceiver {
 public:
  // Binds and starts accepting. `handler` must outlive the receiver.
  // Errors: Unavailable (cannot bind), InvalidArgument (options).
  static StatusOr<std::unique_ptr<TcpReceiver>> Start(ReceiverOptions options, ReceiverHandler* handler);
  ~TcpReceiver();  // Stop()

  uint16_t port() const;
  const std::string& address() const;
  ReceiverStats Stats() const;
  // Stops accepting, closes every connection, and joins all threads (OnClose runs for each).
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit TcpReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::transport
