// vigil/transport/receiver.h — the aggregator side: accepts edges over TCP and hands over their reports.
//
// One accept thread; per connection one reader thread and one writer thread (an aggregator serves tens of
// edges, not thousands). A connection must start with Hello (protocol version kProtocolVersion). The
// handler decides on it — on its own time, e.g. after granting an epoch durably — and calls
// Session::Admit (sends Welcome) or Session::Refuse (sends Reject, closes). Until admitted, anything but
// Heartbeats is a protocol violation. After the Welcome, Reports and Heartbeats (echoed at once); a Report
// whose epoch is not the session's is answered Reject(kStaleEpoch) by the receiver and never reaches the
// handler. A frame that does not decode (bad magic, CRC, version, truncated body, invalid report), a
// Report from another edge id than the Hello's, or any other protocol violation gets a Reject (empty
// stream, reason kProtocolError / kUnsupportedVersion) and closes that connection only, counted in
// ReceiverStats; nothing a client sends can stop the receiver or the process.
// A connection silent for `peer_timeout` is closed (publishers send heartbeats).
//
// Sending never blocks the caller on a socket: Admit, Refuse and Enqueue append to the session's send
// queue, which its writer thread drains. A session whose queue exceeds `max_send_queue_bytes`, or whose
// socket accepts nothing for `write_timeout` (the edge stopped reading), is closed: its edge reconnects
// and re-sends, and the aggregator's commit thread never waits on an edge.
//
// Thread-safety: ReceiverHandler callbacks run on connection threads, concurrently for different
// connections and in arrival order for one connection. Session methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
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
  Session(uint64_t id, std::shared_ptr<Connection> conn, Hello hello, size_t max_send_queue_bytes);

  uint64_t id() const { return id_; }  // unique per receiver
  const std::string& edge() const { return hello_.edge; }
  const Hello& hello() const { return hello_; }  // as received: held epoch, flags, class names, streams
  std::string peer() const { return conn_->peer(); }
  // The epoch the session was admitted with; 0 before Admit.
  uint64_t epoch() const;
  bool admitted() const { return epoch() != 0; }

  // Admits the session with welcome.epoch (≥ 1) and queues the Welcome. Later calls are ignored.
  void Admit(const Welcome& welcome);
  // Queues Reject(reason, empty stream, detail, epoch) and closes the connection once it is written
  // (fenced: another instance was admitted; or the Hello was refused).
  void Refuse(RejectReason reason, uint64_t epoch, std::string detail);
  // Queues encoded frames (one or more, e.g. a batch of Acks) for the writer thread; never blocks.
  // false when the session is closed, or the queue would exceed max_send_queue_bytes (the session is then
  // closed: its edge re-sends after reconnecting).
  bool Enqueue(std::string frames);
  // Closes the connection (the receiver then ends it and calls OnClose).
  void Close();
  bool closed() const;

 private:
  friend class TcpReceiver;
  // Writer thread: sends queued frames until closed (frames still queued at Close are dropped). After
  // Refuse it closes the connection once the Reject is written. A failed or blocked (write_timeout)
  // write closes the session.
  void WriterLoop(std::chrono::milliseconds write_timeout);

  const uint64_t id_;
  const std::shared_ptr<Connection> conn_;
  const Hello hello_;
  const size_t max_queue_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;  // GUARDED_BY(mu_)
  size_t queue_bytes_ = 0;         // GUARDED_BY(mu_)
  uint64_t epoch_ = 0;             // GUARDED_BY(mu_)
  bool closing_ = false;           // GUARDED_BY(mu_) close after the queue drains (Refuse)
  bool closed_ = false;            // GUARDED_BY(mu_)
};

class ReceiverHandler {
 public:
  virtual ~ReceiverHandler() = default;
  // A connection said Hello (valid, this protocol version). The handler must eventually Admit or Refuse
  // the session (or Close it). A non-OK status refuses it at once: the edge gets
  // Reject(kProtocolError, message) and the connection closes.
  virtual Status OnHello(const std::shared_ptr<Session>& session) = 0;
  // A valid Report whose edge is the session's and whose epoch is the session's admitted epoch. May block
  // to apply backpressure (the connection is not read meanwhile). The handler answers with Ack/Reject
  // through Session::Enqueue, now or later.
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
  size_t max_send_queue_bytes = 64 << 20;         // per session, queued and not yet written; at least one
                                                  // largest frame (kHeaderBytes + kMaxBodyBytes). Default: 64 MiB
};

struct ReceiverStats {
  uint64_t accepted = 0;         // connections accepted
  uint64_t refused = 0;          // closed at once: over max_connections
  uint64_t active = 0;           // open now
  uint64_t protocol_errors = 0;  // connections closed for a malformed frame or a protocol violation
  uint64_t timeouts = 0;         // connections closed after peer_timeout of silence
  uint64_t stale_reports = 0;    // reports refused because their epoch was not their session's
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
