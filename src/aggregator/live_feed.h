// aggregator/live_feed.h — the aggregator's live channel (internal to src/aggregator): what the storage thread
// committed, told to the Server-Sent-Events streams of GET /api/events/live (aggregator/http_api.h).
//
// Two things flow through it: a version number, bumped by every commit that stored an event or decided one (a
// stream that sees it move reads the new events from the store), and the feed of decisions on pending events
// (aggregator/confirm.h), each a JSON body numbered from 1, sent as `event: state` so the dashboard updates the row.
// The feed keeps the newest kMaxDecided decisions; a stream further behind misses the older ones (it reads the
// event's state from the store on its next page anyway).
//
// Ownership: the aggregator (aggregator.cc) owns the one LiveFeed; it owns no thread. The storage thread publishes
// (EventsStored, PublishDecisions); HTTP worker threads read and wait (Version, AppendDecisions, WaitForChange);
// the controlling thread closes it at shutdown, which wakes every waiting stream.
// Thread-safety: every method is thread-safe (one internal mutex).
// Errors: none; after Close, Version answers nullopt and WaitForChange kClosed at once.
// Time: waits read the Clock seam (LiveFeedOptions::clock): the deadline is a steady_clock time point built from
// Clock::SteadyNs (SystemClock's origin is steady_clock's); under a FakeClock a timed wait times out at once.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"

namespace vigil::aggregator {

class LiveFeed {
 public:
  static constexpr size_t kMaxDecided = 4096;

  // `clock`: never null; not owned (Default: SystemClock()).
  explicit LiveFeed(const Clock* clock = SystemClock()) : clock_(clock) {}

  // Storage thread, after a commit that stored at least one event: the streams wake and read the store.
  void EventsStored() VIGIL_EXCLUDES(mu_);

  // Storage thread, after a commit: every decision that decided its event (decided.applied[i]) goes to the feed as
  // {"key":"edge/stream/run/seq", "edge", "stream", "run", "seq", "state", "state_reason", "decided_ns": at_ns,
  //  "detections": [{"index", "label", "second_label", "second_score"}]}, and the version moves when any did.
  void PublishDecisions(const std::vector<EventDecision>& decisions, const DecisionResult& decided, int64_t at_ns)
      VIGIL_EXCLUDES(mu_);

  // Shutdown: every stream ends (its HTTP worker is freed for the server's stop()).
  void Close() VIGIL_EXCLUDES(mu_);

  // The newest decision's number (0: none yet): a new stream's cursor, so it gets the decisions from then on.
  uint64_t decided_seq() const VIGIL_EXCLUDES(mu_);

  // The current version; nullopt once closed.
  std::optional<uint64_t> Version() const VIGIL_EXCLUDES(mu_);

  // Appends "event: state\ndata: <json>\n\n" for every decision in the feed numbered after *cursor, in order, and
  // moves *cursor to the last one appended.
  void AppendDecisions(uint64_t* cursor, std::string* out) const VIGIL_EXCLUDES(mu_);

  enum class Wake { kChanged, kTimeout, kClosed };
  // Waits until the version differs from `seen` (kChanged, at once if it already does), the feed is closed
  // (kClosed) or `timeout_ns` passed (kTimeout).
  Wake WaitForChange(uint64_t seen, int64_t timeout_ns) VIGIL_EXCLUDES(mu_);

 private:
  const Clock* const clock_;
  mutable Mutex mu_;
  CondVar changed_;
  uint64_t version_ VIGIL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<uint64_t, std::string>> decided_ VIGIL_GUARDED_BY(mu_);  // (number, JSON body)
  uint64_t decided_seq_ VIGIL_GUARDED_BY(mu_) = 0;
  bool closed_ VIGIL_GUARDED_BY(mu_) = false;
};

}  // namespace vigil::aggregator
