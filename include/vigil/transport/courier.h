// vigil/transport/courier.h — drains an Outbox to the aggregator over an ordered list of Links.
//
// One sender thread runs sessions one after another. For each it tries the links in the configured
// order (the first that opens wins), sends Hello (edge id, the epoch it holds — 0 until the first
// Welcome —, the handler's class names and resumed streams), and hands the Welcome to the handler
// before sending anything else. Then it sends every pending Outbox message from the oldest on, in id
// order, and after that each new one as it is pushed; a reader thread passes Acks and Rejects to the
// Outbox (Complete) and to the handler. A session that breaks is closed — an error; `peer_timeout` with
// nothing received while heartbeats go out every `heartbeat_interval`; or the oldest message it sent
// not acknowledged within `ack_timeout` (a report or its ack lost on the link) — and the next session,
// on the same link or the next one in the list, starts again from the oldest pending message:
// at-least-once delivery, in order, across links (the aggregator stores each frame once: protocol.h).
// After every failure of all links the sender waits with exponential backoff and jitter (Backoff); a
// session that delivered anything resets the backoff, and each new session tries the preferred link
// first again.
//
// Fail-back: while a session runs on a link other than the first, a prober thread tries the links
// before it every `probe_interval` (a full authenticated Open). When one opens, the courier moves there:
// the current session ends, and the new one re-sends everything unacknowledged. The aggregator
// supersedes the old session when it admits the new one (it ignores what the old one still had queued),
// so nothing is stored twice or out of order. Every switch is counted (CourierStats::link_switches,
// per link `sessions`) and logged. Failure detection and the probe schedule are health.h's pure state
// machines on `clock`.
//
// Authentication: an Open that fails with Unauthenticated (wrong or missing key, or an aggregator that
// cannot prove it knows ours) is counted (auth_failures), logged, and retried with backoff like an
// unreachable link: an operator may fix the keys while the edge keeps its outbox.
//
// A message whose device rows cannot be downloaded (Link::Send fails with Internal) can never be sent: the
// courier completes it as refused in the Outbox and calls OnReject with Reject(kInvalid, detail "not sent:
// …"), and the session goes on with the next message.
//
// Snapshots (an event's pictures, protocol.h): OfferSnapshot queues one for the sender thread, which sends it on
// the open session after the reports waiting then (reports first; at most one snapshot after each batch while
// reports keep coming). They are best effort: not in the Outbox, not re-sent. A snapshot that finds the queue
// full (max_snapshot_bytes) is refused and counted (snapshots_dropped); one whose write fails with the session
// is counted lost (snapshots_lost); ones still queued at Close are counted dropped.
//
// Source states (protocol.h SourceStates): SetSourceStates keeps the newest list; the sender sends it at the start
// of every session and again whenever it changed, before queued snapshots. Not acknowledged, nothing counted.
//
// Fencing: a Hello answered with Reject(kFenced), or a Reject(kFenced) during a session (a newer instance
// of this edge id was admitted), ends the courier: OnFenced is called once, nothing more is sent, and
// Stats().fenced is true. The edge then stops publishing and exits non-zero (a standby demotes instead).
//
// Thread-safety: all methods are thread-safe. Handler callbacks run on the courier's threads, never
// concurrently with each other for OnWelcome/OnFenced; OnAck runs on the reader thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/status.h"
#include "vigil/transport/link.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

class CourierHandler {
 public:
  virtual ~CourierHandler() = default;
  // The Hello for a new session, without edge id and epoch (the courier fills them): class names and the
  // (stream, run) pairs to resume. Called before every session.
  virtual Hello MakeHello() = 0;
  // The aggregator admitted a session; called before any message of it is sent. `link`: the link's kind.
  virtual void OnWelcome(const Welcome& welcome, std::string_view link) = 0;
  // An Ack for a pending message arrived; called just before the Outbox completes that message, so a
  // caller woken by Outbox::WaitEmpty sees every OnAck already made. Not called for a repeated ack.
  virtual void OnAck(const Ack& ack) = 0;
  // A Report was refused (after the Outbox completed its message): counted by the caller. Also called for a
  // message the courier could not send (device rows failed to download: kInvalid, "not sent: …").
  virtual void OnReject(const Reject& reject) = 0;
  // Another instance of this edge id holds a newer epoch; the courier has stopped. `why` names it.
  virtual void OnFenced(const Status& why) = 0;
};

struct CourierOptions {
  std::string edge;                         // edge id, 1..65535 bytes
  std::vector<std::shared_ptr<Link>> links;  // in order of preference; at least one
  std::chrono::milliseconds backoff_initial{100};      // Default: 100 ms
  std::chrono::milliseconds backoff_max{5000};         // Default: 5 s
  std::chrono::milliseconds connect_timeout{2000};     // Open (connect + Welcome). Default: 2 s
  std::chrono::milliseconds heartbeat_interval{1000};  // Default: 1 s
  std::chrono::milliseconds peer_timeout{5000};        // silence that ends a session. Default: 5 s
  std::chrono::milliseconds ack_timeout{15000};        // oldest sent message unacknowledged this long ends
                                                       // the session. Default: 15 s
  std::chrono::milliseconds probe_interval{1000};      // on a fallback link: try the preferred ones this
                                                       // often. Default: 1 s
  size_t max_batch = 256;                              // messages per Send call. Default: 256
  size_t max_snapshot_bytes = size_t{32} << 20;        // JPEG bytes queued for sending at most. Default: 32 MiB
  Clock* clock = nullptr;                              // failure detection and probes; null = SystemClock()
};

// Per link, in the order of CourierOptions::links.
struct CourierLinkStats {
  std::string kind, target;
  uint64_t sessions = 0;       // sessions admitted on it
  uint64_t open_failures = 0;  // Opens that failed (probes included)
  uint64_t sent = 0;           // messages written on it, re-sends included
  std::string transports;      // Link::transports() of its last session ("tcp" under UCX: degraded)
};

struct CourierStats {
  uint64_t sessions = 0;          // sessions admitted (Welcome received)
  uint64_t open_failures = 0;     // Open attempts that failed (any link)
  uint64_t disconnects = 0;       // admitted sessions that ended other than by Close
  uint64_t sent = 0;              // messages written, re-sends included
  uint64_t resent = 0;            // messages written again in a later session
  uint64_t link_switches = 0;     // sessions on another link than the previous session's
  uint64_t fail_backs = 0;        // of those, moves to a preferred link found by a probe
  uint64_t probes = 0;            // probes of preferred links (each tries them in order)
  uint64_t auth_failures = 0;     // Opens refused for authentication (either side)
  uint64_t ack_timeouts = 0;      // sessions ended because an ack did not come within ack_timeout
  uint64_t snapshots_sent = 0;     // snapshots written on a session
  uint64_t snapshots_dropped = 0;  // refused by OfferSnapshot (queue full, closed, fenced) or unsent at Close
  uint64_t snapshots_lost = 0;     // their write failed (the session broke)
  uint64_t snapshots_queued = 0;   // waiting now
  uint64_t source_states_sent = 0;  // SourceStates messages written
  std::vector<CourierLinkStats> links;
  uint64_t epoch = 0;             // the epoch held; 0 before the first Welcome
  std::string link;               // kind of the link of the current session; "" when none
  bool connected = false;
  bool fenced = false;
  std::string last_error;
};

class Courier {
 public:
  // Validates the options (InvalidArgument naming the field) and starts the sender thread. `outbox` and
  // `handler` must outlive the Courier.
  static StatusOr<std::unique_ptr<Courier>> Start(CourierOptions options, Outbox* outbox, CourierHandler* handler);
  virtual ~Courier() = default;
  virtual CourierStats Stats() const = 0;
  // Queues `snapshot` (ValidateSnapshot must pass) for the sender; false when it was refused and counted
  // (queue full, closed or fenced). Never blocks.
  virtual bool OfferSnapshot(Snapshot snapshot) = 0;
  // The newest states of the edge's sources (ValidateSourceStates must pass); sent as described above.
  virtual void SetSourceStates(SourceStates states) = 0;
  // Stops the threads and closes the session; pending messages stay in the Outbox. Idempotent.
  virtual void Close() = 0;
};

// Exponential backoff with "equal jitter": attempt k waits uniformly in [d/2, d] with
// d = min(max, initial · 2^k) (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
// Not thread-safe.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, uint64_t seed);
  std::chrono::milliseconds Next();
  void Reset() { attempt_ = 0; }

 private:
  std::chrono::milliseconds initial_, max_;
  int attempt_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace vigil::transport
