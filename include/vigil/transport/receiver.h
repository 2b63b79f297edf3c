// vigil/transport/receiver.h — the aggregator side: accepts edges on one Listener (TCP, TLS, UCX) and hands
// over their reports.
//
// One accept thread; per connection one reader thread and one writer thread (an aggregator serves tens of
// edges, not thousands). A connection from an address outside the allow-list is closed at once, nothing
// sent. A connection must start with Hello (protocol version kProtocolVersion); the receiver answers
// Challenge and checks the edge's Auth (auth.h) before the handler hears of it (and, on a cuda_ipc
// connection, offers the ring and waits for the edge's RingAccept first: Connection::OfferSession): a connection that fails
// authentication, or does not finish it within `handshake_timeout`, gets Reject(kUnauthenticated) and is
// closed, and nothing of it reaches the handler. Every refusal is counted by reason and logged with the
// peer. Then the handler decides on the Hello — on its own time, e.g. after granting an epoch durably — and calls
// Session::Admit (sends Welcome) or Session::Refuse (sends Reject, closes). Until admitted, anything but
// Heartbeats is a protocol violation. After the Welcome, Reports, Snapshots, SourceStates and Heartbeats (echoed at once). Reports
// must come in link_seq order (protocol.h): a repeat is ignored (counted), a gap closes the session
// (Reject kProtocolError, counted), so the handler sees each session's reports once, in the order sent,
// whatever the link below did. A Report whose epoch is not the session's is answered Reject(kStaleEpoch) by the receiver and never reaches the
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
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

// One accepted connection after its Hello; made by the receiver, shared with the handler.
class Session {
 public:
  Session(uint64_t id, std::shared_ptr<Connection> conn, Hello hello, size_t max_send_queue_bytes,
          std::string link = "tcp");

  uint64_t id() const { return id_; }  // unique per receiver
  const std::string& link() const { return link_; }  // the listener's kind: "tcp", "ucx"
  const std::string& edge() const { return hello_.edge; }
  const Hello& hello() const { return hello_; }  // as received: held epoch, flags, class names, streams
  std::string peer() const { return conn_->peer(); }
  // The epoch the session was admitted with; 0 before Admit.
  uint64_t epoch() const VIGIL_EXCLUDES(mu_);
  bool admitted() const { return epoch() != 0; }

  // Admits the session with welcome.epoch (≥ 1) and queues the Welcome. Later calls are ignored.
  void Admit(const Welcome& welcome) VIGIL_EXCLUDES(mu_);
  // Queues Reject(reason, empty stream, detail, epoch) and closes the connection once it is written
  // (fenced: another instance was admitted; or the Hello was refused).
  void Refuse(RejectReason reason, uint64_t epoch, std::string detail) VIGIL_EXCLUDES(mu_);
  // Queues encoded frames (one or more, e.g. a batch of Acks) for the writer thread; never blocks.
  // false when the session is closed, or the queue would exceed max_send_queue_bytes (the session is then
  // closed: its edge re-sends after reconnecting).
  bool Enqueue(std::string frames) VIGIL_EXCLUDES(mu_);
  // Closes the connection (the receiver then ends it and calls OnClose).
  void Close() VIGIL_EXCLUDES(mu_);
  bool closed() const VIGIL_EXCLUDES(mu_);
  // Marks the session as replaced by a newer session of the same edge instance (it reconnected, maybe
  // over another link) and closes it: the handler ignores whatever of it is still queued, because the
  // edge re-sends it on the new session. Sticky.
  void Supersede() VIGIL_EXCLUDES(mu_);
  bool superseded() const VIGIL_EXCLUDES(mu_);

 private:
  friend class Receiver;
  // Writer thread: sends queued frames until closed (frames still queued at Close are dropped). After
  // Refuse it closes the connection once the Reject is written. A failed or blocked (write_timeout)
  // write closes the session.
  void WriterLoop(std::chrono::milliseconds write_timeout) VIGIL_EXCLUDES(mu_);

  const uint64_t id_;
  const std::shared_ptr<Connection> conn_;
  const Hello hello_;
  const size_t max_queue_bytes_;
  const std::string link_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::string> queue_ VIGIL_GUARDED_BY(mu_);
  size_t queue_bytes_ VIGIL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ VIGIL_GUARDED_BY(mu_) = 0;
  bool closing_ VIGIL_GUARDED_BY(mu_) = false;  // close after the queue drains (Refuse)
  bool closed_ VIGIL_GUARDED_BY(mu_) = false;
  bool superseded_ VIGIL_GUARDED_BY(mu_) = false;
};

class ReceiverHandler {
 public:
  virtual ~ReceiverHandler() = default;
  // A connection said Hello (valid, this protocol version) and authenticated. The handler must eventually Admit or Refuse
  // the session (or Close it). A non-OK status refuses it at once: the edge gets
  // Reject(kProtocolError, message) and the connection closes.
  virtual Status OnHello(const std::shared_ptr<Session>& session) = 0;
  // A valid Report whose edge is the session's and whose epoch is the session's admitted epoch. May block
  // to apply backpressure (the connection is not read meanwhile). The handler answers with Ack/Reject
  // through Session::Enqueue, now or later.
  virtual void OnReport(const std::shared_ptr<Session>& session, Report report) = 0;
  // A valid Snapshot of an admitted session (not acknowledged; the handler stores it or counts why not).
  // Must not block for long. Default: ignored.
  virtual void OnSnapshot(const std::shared_ptr<Session>& /*session*/, Snapshot /*snapshot*/) {}
  // A valid SourceStates of an admitted session (the newest wins). Default: ignored.
  virtual void OnSourceStates(const std::shared_ptr<Session>& /*session*/, SourceStates /*states*/) {}
  // The connection ended (`why`: peer closed, timeout, protocol error, receiver stopping).
  virtual void OnClose(const std::shared_ptr<Session>& session, const Status& why) = 0;
};

struct ReceiverOptions {
  int max_connections = 256;                      // more are accepted and closed at once (counted). Default: 256
  std::chrono::milliseconds peer_timeout{10000};  // close a connection silent this long. Default: 10 s
  std::chrono::milliseconds write_timeout{1000};  // a send blocked this long closes the connection. Default: 1 s
  size_t max_send_queue_bytes = 64 << 20;         // per session, queued and not yet written; at least one
                                                  // largest frame (kHeaderBytes + kMaxBodyBytes). Default: 64 MiB
  std::chrono::milliseconds handshake_timeout{5000};  // accept → valid Auth, at most. Default: 5 s
  // Edge keys: null = no authentication (Challenge without proof, any Auth accepted; logged at Start).
  std::shared_ptr<const KeyStore> keys;
  // Addresses allowed to connect: null = any.
  std::shared_ptr<const AllowList> allow;
};

// Why a connection was refused before its session began (ReceiverStats::rejected, metric label `reason`).
inline constexpr const char* kRejectAddress = "address";               // not in the allow-list
inline constexpr const char* kRejectUnknownEdge = "unknown_edge";      // no key for the Hello's edge id
inline constexpr const char* kRejectBadProof = "bad_proof";            // Auth's proof does not match the key
inline constexpr const char* kRejectNoProof = "no_proof";              // Auth without a proof
inline constexpr const char* kRejectHandshakeTimeout = "handshake_timeout";  // no valid Auth in time
inline constexpr const char* kRejectMalformed = "malformed";           // a frame that does not decode, or not Hello/Auth
inline constexpr const char* kRejectVersion = "unsupported_version";   // another protocol version
inline constexpr const char* kRejectTls = "tls";                       // the TLS handshake failed (tls.h)
inline constexpr const char* kRejectPeerCredentials = "peer_credentials";  // a Unix-socket peer's uid is not allowed
inline constexpr const char* kRejectRingUnavailable = "ring_unavailable";  // cuda_ipc: no ring could be set up
inline constexpr const char* kRejectRingRefused = "ring_refused";  // cuda_ipc: the edge hung up instead of RingAccept
// The edge hung up after our Challenge without answering: it could not verify our proof (a different key
// for its id on the two sides), or it is not a vigil edge.
inline constexpr const char* kRejectChallengeRefused = "challenge_refused";

struct ReceiverStats {
  uint64_t accepted = 0;         // connections accepted
  uint64_t refused = 0;          // closed at once: over max_connections
  std::map<std::string, uint64_t> rejected;  // before the session: by reason (kReject*)
  uint64_t authenticated = 0;    // connections that passed the handshake
  uint64_t repeated_reports = 0;  // Reports whose link_seq was already seen (a duplicated frame), ignored
  uint64_t sequence_gaps = 0;     // sessions closed for a Report after a gap in link_seq
  uint64_t active = 0;           // open now
  uint64_t protocol_errors = 0;  // connections closed for a malformed frame or a protocol violation
  uint64_t timeouts = 0;         // connections closed after peer_timeout of silence
  uint64_t stale_reports = 0;    // reports refused because their epoch was not their session's
  uint64_t frames = 0;           // frames decoded
  uint64_t bytes = 0;            // bytes received
};

class Receiver {
 public:
  // Starts accepting on `listener` (MakeTcp…, TcpListener::Listen, UcxListen, MakeTlsListener). `handler`
  // must outlive the receiver. Errors: InvalidArgument (options).
  static StatusOr<std::unique_ptr<Receiver>> Start(ReceiverOptions options, std::unique_ptr<Listener> listener,
                                                   ReceiverHandler* handler);
  ~Receiver();  // Stop()

  uint16_t port() const;
  const std::string& address() const;
  std::string_view kind() const;  // the listener's: "tcp", "ucx"
  ReceiverStats Stats() const;
  // Stops accepting, closes every connection, and joins all threads (OnClose runs for each).
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Receiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::transport
