// vigil/replication/failure_detector.h — when a hot standby should suspect its primary (issue 16): a pure
// state machine over the arrival times of the peer's heartbeats (nanoseconds on a steady clock), so tests
// drive it with a fake clock.
//
// Two modes (both judge silence only; the replication channel's EOF/reset and the primary's own health
// reports are faster signals the caller acts on directly):
//  - kFixed: suspect once `misses` heartbeat intervals passed without one (seed 003: 500 ms × 3 = 1.5 s;
//    VRRP's 3 × advert interval).
//  - kPhiAccrual (Hayashibara et al., "The φ Accrual Failure Detector", 2004; as in Akka and Cassandra):
//    learns the mean and standard deviation of the last `window` gaps between heartbeats and reports
//    φ = −log10(P(a gap at least this long)), under a normal distribution of gaps (the logistic
//    approximation of its tail Akka uses). Suspect when φ ≥ `phi_threshold`. On a loaded machine the gaps
//    spread and the detector waits longer instead of suspecting falsely; `min_std_dev` keeps a perfectly
//    regular peer from being suspected after a gap barely above the mean, and `acceptable_pause` is
//    added to the mean (a known GC-like pause budget). Until the first gap is seen, the distribution is
//    seeded with `interval` (mean) and interval / 4 (standard deviation).
//
// Local pauses (both modes; Cassandra's "not marking nodes down due to local pause"): silence measured by a
// process that was itself paused — starved of CPU on an overloaded host, a storm of page faults, stopped — is
// not the peer's. The owner reports each run of its check loop (Checked: when it meant to run, when it ran); a
// run later than `local_pause` means the answers that arrived meanwhile may still sit unread in this process,
// and nobody is suspected until one `interval` after the pause (the readers catch up). That grace is bounded:
// at most `misses` intervals of it per silence (a heartbeat resets it), so pauses at every check delay a
// suspicion by at most that much, never forever.
//
// Thread-safety: not thread-safe; one owner. Units: nanoseconds throughout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "vigil/common/status.h"

namespace vigil::replication {

struct FailureDetectorOptions {
  enum class Mode { kFixed, kPhiAccrual };
  Mode mode = Mode::kFixed;
  int64_t interval_ns = 500'000'000;         // the heartbeat interval both sides use. Default: 500 ms
  int misses = 3;                            // kFixed: intervals of silence that make a suspect. Default: 3
  double phi_threshold = 8.0;                // kPhiAccrual: suspect at φ ≥ this (≈ 1 in 10^8). Default: 8
  size_t window = 200;                       // kPhiAccrual: gaps remembered. Default: 200
  int64_t min_std_dev_ns = 50'000'000;       // kPhiAccrual: floor of the gaps' standard deviation. Default: 50 ms
  int64_t acceptable_pause_ns = 0;           // kPhiAccrual: added to the mean gap. Default: 0
  int64_t local_pause_ns = 0;                // a check this late is a local pause; 0: interval / 2. Default: 0
};

// InvalidArgument naming the field when an option is out of range (interval > 0, misses ≥ 1, threshold > 0,
// window ≥ 2, min_std_dev > 0, pause ≥ 0, local_pause ≥ 0).
Status ValidateFailureDetectorOptions(const FailureDetectorOptions& o);

class FailureDetector {
 public:
  // REQUIRES: ValidateFailureDetectorOptions(options).ok(). The peer counts as heard at `now`.
  FailureDetector(FailureDetectorOptions options, int64_t now);

  // A heartbeat (or any frame) from the peer arrived at `at`; an `at` older than the last one is ignored.
  void Heartbeat(int64_t at);
  // The suspicion level at `now`: kPhiAccrual's φ; kFixed's (silence / interval) / misses × threshold, so
  // that both modes suspect at phi(now) ≥ phi_threshold. Never negative; grows with silence.
  double Phi(int64_t now) const;
  // Phi(now) ≥ phi_threshold, and no local pause's grace runs at `now`.
  bool Suspect(int64_t now) const { return now >= grace_until_ && Phi(now) >= opt_.phi_threshold; }
  // The earliest time ≥ now at which Suspect may become true if nothing arrives (for waiting).
  int64_t SuspectAt(int64_t now) const;
  // The owner's check ran at `now`, meant for `due` (its wait's deadline). Returns the pause (now − due) when it
  // counts as a local pause (later than local_pause), else 0; a pause starts a grace of one interval from `now`
  // while the grace budget of this silence lasts.
  int64_t Checked(int64_t due, int64_t now);
  uint64_t local_pauses() const { return local_pauses_; }

  int64_t silent_for(int64_t now) const { return now - last_; }
  size_t samples() const { return gaps_.size(); }
  double mean_gap_ns() const;
  double std_dev_ns() const;  // before the floor

 private:
  FailureDetectorOptions opt_;
  int64_t SuspectAtIgnoringGrace(int64_t now) const;  // the first t ≥ now with Phi(t) ≥ threshold

  int64_t last_;
  int64_t grace_until_ = 0;    // no suspicion before (a local pause's grace)
  int64_t grace_granted_ = 0;  // grace given since the last heartbeat, ns
  uint64_t local_pauses_ = 0;
  std::deque<int64_t> gaps_;  // the last `window` gaps
  double sum_ = 0, sum_sq_ = 0;
};

}  // namespace vigil::replication
