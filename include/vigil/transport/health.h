// vigil/transport/health.h — the courier's failure detection and fail-back decisions, as pure state
// machines over times they are told (nanoseconds on a steady clock), so they are tested with a fake clock.
//
// SessionHealth: for one session, whether to send a heartbeat (nothing written for heartbeat_interval),
// or to give the session up: the aggregator silent for peer_timeout (heartbeats are echoed, so silence
// means a dead peer or path), or the oldest message this session sent not acknowledged for ack_timeout
// (a report or its ack lost on the link: the session is replaced and the report re-sent).
// FailbackSchedule: while a session runs on a link other than the preferred one, when to try the
// preferred links again (every probe_interval, measured from the session's start and from each probe).
//
// Thread-safety: not thread-safe; one owner (the courier's sender thread, or a test).
#pragma once

#include <cstddef>
#include <cstdint>

namespace vigil::transport {

class SessionHealth {
 public:
  struct Options {
    int64_t heartbeat_interval_ns = 1'000'000'000;
    int64_t peer_timeout_ns = 5'000'000'000;
    int64_t ack_timeout_ns = 15'000'000'000;
  };
  enum class Verdict { kOk, kSendHeartbeat, kPeerSilent, kAckOverdue };

  // A session that started at `now`: counts as written and heard then.
  SessionHealth(Options options, int64_t now);

  void Wrote(int64_t now) { last_write_ = now; }  // a frame went out
  void Heard(int64_t at) {                       // a frame came in at `at` (older times are ignored)
    if (at > last_heard_) last_heard_ = at;
  }
  // The oldest unacknowledged message now: its id, and whether this session has sent it (false: nothing
  // is pending, or the oldest is still to be sent).
  void Oldest(uint64_t id, bool sent, int64_t now);

  // What to do at `now`, most urgent first: kPeerSilent, kAckOverdue, kSendHeartbeat, kOk.
  Verdict Check(int64_t now) const;
  // When Check may next change its answer (≥ now), for waiting.
  int64_t NextCheck(int64_t now) const;

  int64_t silent_for(int64_t now) const { return now - last_heard_; }
  uint64_t oldest_id() const { return oldest_id_; }
  int64_t oldest_unacked_for(int64_t now) const { return oldest_since_ < 0 ? 0 : now - oldest_since_; }

 private:
  Options opt_;
  int64_t last_write_, last_heard_;
  uint64_t oldest_id_ = 0;
  int64_t oldest_since_ = -1;  // when the current oldest was first seen sent; -1: none is
};

class FailbackSchedule {
 public:
  explicit FailbackSchedule(int64_t probe_interval_ns) : interval_(probe_interval_ns) {}
  // A session started on link `index` (0 = the preferred one: nothing to probe).
  void SessionStarted(size_t index, int64_t now);
  // Whether to try the links before the current one now.
  bool ProbeDue(int64_t now) const { return index_ > 0 && now >= next_; }
  // A probe ended (whatever its result): the next one is due probe_interval later.
  void Probed(int64_t now) { next_ = now + interval_; }
  int64_t next_probe() const { return next_; }
  size_t index() const { return index_; }

 private:
  int64_t interval_;
  size_t index_ = 0;
  int64_t next_ = 0;
};

}  // namespace vigil::transport
