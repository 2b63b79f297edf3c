// vigil/pipeline/health_watch.h — the edge's watch over its own inference (issue 16, 41): whether it is
// unhealthy (a primary steps down: health.h UnhealthyReason), whether it stalled (logged and counted), and the
// chaos tests' injected inference faults (VIGIL_FAULT_INFERENCE).
//
// The pool's side feeds it what happens: Pushing / PushRefused for each frame handed to the worker pool (a
// feeder thread), BatchDone for each batch result (the sink thread), BeforeBatch before each batch runs (a worker
// thread: the injected fault). Run's thread asks, every ~100 ms: CheckHealth (calls on_unhealthy once per Run,
// with why) and WatchForStall (no frame processed for 10 s while streams are active: one warning per stall, with
// where things stand, and vigil_edge_stalls_total). Metrics: vigil_edge_unhealthy_total (registered at Start
// when a callback is set, so it scrapes at 0), vigil_edge_stalls_total.
// Fault injection ("stall:AFTER:MS": the batch numbered AFTER, from 1, stalls MS ms; "error:AFTER": every batch
// from AFTER on fails with Internal) is for the chaos tests only, never set in production.
//
// Time: every reading comes from the Clock given (CheckHealth and WatchForStall take `now` from the caller's
// reading of it); the injected stall sleeps through `sleep` (tests pass one that records).
// Ownership: the Edge owns it; it refers to the registry (outlives it). Threads: as above. Thread-safety: every
// method may be called from its thread as listed concurrently with the others (atomics, one mutex for the last
// error); SetFault, set_on_unhealthy and Start before the pool starts; CheckHealth and WatchForStall from one
// thread. Errors: SetFault returns InvalidArgument for a malformed spec; BeforeBatch returns the injected error.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/health.h"

namespace vigil::pipeline {

struct HealthWatchOptions {
  std::string edge;                       // the edge id, for the logs
  metrics::Registry* registry = nullptr;  // required; outlives the watch
  Clock* clock = SystemClock();           // Default: the system clock
  std::function<void(std::chrono::milliseconds)> sleep;  // the injected stall. Default: std::this_thread::sleep_for
};

class HealthWatch {
 public:
  static constexpr int64_t kStallNs = 10'000'000'000;  // no frame processed this long while streams are active

  explicit HealthWatch(HealthWatchOptions options);

  // The injected fault (VIGIL_FAULT_INFERENCE's value; null or "": none). Errors: InvalidArgument naming the
  // spec ("stall:AFTER:MS or error:AFTER").
  Status SetFault(const char* spec);
  // Called once per Run, on Run's thread, when the edge finds itself unhealthy (bounds: health.h).
  void set_on_unhealthy(std::function<void(const std::string& why)> f, HealthBounds bounds);
  // The pool starts now: the stall clock starts (and vigil_edge_unhealthy_total is registered when watching).
  void Start();

  void Pushing();      // a frame is about to be pushed to the pool (an idle pool's stall clock starts with it)
  void PushRefused();  // … and the pool did not take it (closed)
  void BatchDone(size_t frames, const Status& status) VIGIL_EXCLUDES(mu_);  // a batch result (the sink thread)
  Status BeforeBatch();  // a worker, before each batch: the injected fault, if any

  // Run's thread: the health judged at `now` (steady ns): calls on_unhealthy (once) when unhealthy.
  void CheckHealth(int64_t now) VIGIL_EXCLUDES(mu_);
  // Run's thread: `frames` processed so far with `active` streams at `now`; `where` (called only to log a stall)
  // says where things stand (readers, batcher, outbox, link).
  void WatchForStall(int64_t now, int active, uint64_t frames, const std::function<std::string()>& where);

  uint64_t frames_waiting() const { return frames_pushed_.load() - frames_done_.load(); }

 private:
  enum class FaultKind { kNone, kStall, kError };

  const std::string edge_;
  metrics::Registry& reg_;
  Clock* const clock_;
  std::function<void(std::chrono::milliseconds)> sleep_;
  // Set before the pool starts.
  std::function<void(const std::string&)> on_unhealthy_;
  HealthBounds bounds_;
  FaultKind fault_ = FaultKind::kNone;
  uint64_t fault_after_ = 0;
  int fault_ms_ = 0;
  // The pool's side.
  std::atomic<int64_t> last_batch_ns_{0};  // the last batch result, or the first frame pushed to an idle pool
  std::atomic<uint64_t> frames_pushed_{0}, frames_done_{0};
  std::atomic<int> failed_in_row_{0};      // batches failed since the last one that did not (the sink writes)
  std::atomic<uint64_t> batches_started_{0};
  Mutex mu_;
  std::string last_error_ VIGIL_GUARDED_BY(mu_);  // the last failed batch's status message
  // Run's thread.
  bool unhealthy_reported_ = false;
  uint64_t stall_frames_ = 0;
  int64_t stall_since_ns_ = 0;
  bool stall_reported_ = false;
};

}  // namespace vigil::pipeline
