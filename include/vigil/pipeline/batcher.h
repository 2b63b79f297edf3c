// vigil/pipeline/batcher.h — the cross-stream batcher in front of one inference engine: fair round-robin
// batches with a deadline.
//
// Each stream (0..streams-1) has its own bounded queue. Producers (one per stream) Push; Push blocks while
// that stream's queue holds `per_stream_capacity` items (backpressure to that stream's reader only: a live
// reader then drops its oldest frame, counted, and a file reader waits). The consumer takes batches with
// NextBatch: it waits for a first item, then until max_batch items are queued in all or max_wait has passed
// since the oldest queued item was pushed (the deadline), and takes up to max_batch items round-robin: one
// item from each non-empty stream in turn, starting with the stream after the last one served by the
// previous batch. So when the engine is the bottleneck every stream is served equally (per-stream counts of
// taken items differ by at most one batch), and items of one stream come out in the order it pushed them.
//
// Several consumers may take batches from one Batcher (the Detectors of one device, pipeline/workers.h):
// each batch gets a ticket, 0, 1, 2, … in the order the batches were taken, so a consumer that needs a
// stream's items in order across consumers can restore it by ticket (a stream's items are spread over
// batches in ticket order). A consumer that wakes to find the items taken by another waits again.
//
// Time: every time read (push times, max_wait and idle deadlines) goes through a vigil::Clock (default
// SystemClock()); waits sleep on a CondVar for the time left by that clock and recheck it.
//
// Thread-safety: all methods are thread-safe (one vigil::Mutex guards the queues; clang checks it).
// Close() makes Push return false and lets NextBatch drain what is queued (at once, without waiting for
// max_wait), then report kClosed. Ownership: the Clock is not owned and outlives the Batcher.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"

namespace vigil::pipeline {

template <typename T>
class Batcher {
 public:
  // REQUIRES: max_batch >= 1, per_stream_capacity >= 1, streams >= 1, clock != nullptr.
  Batcher(size_t max_batch, std::chrono::milliseconds max_wait, size_t per_stream_capacity, size_t streams,
          Clock* clock = SystemClock())
      : max_batch_(max_batch),
        max_wait_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(max_wait).count()),
        capacity_(per_stream_capacity),
        clock_(clock),
        queues_(streams) {}

  // Queues `item` on `stream`'s queue; waits while that queue is full. False (item dropped) after Close().
  // REQUIRES: stream < streams.
  bool Push(size_t stream, T item) VIGIL_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (!closed_ && queues_[stream].size() >= capacity_) cv_.Wait(lock);
    if (closed_) return false;
    queues_[stream].push_back({std::move(item), clock_->SteadyNs()});
    ++total_;
    cv_.NotifyAll();
    return true;
  }

  enum class Result { kBatch, kTimeout, kClosed };
  // Waits up to `idle` for a first item (kTimeout when none came), then forms a batch (above) into
  // *out (cleared first) and sets *ticket (when given) to its ticket. kClosed once closed and drained.
  // A kBatch batch has 1..max_batch items.
  Result NextBatch(std::vector<T>* out, std::chrono::nanoseconds idle, uint64_t* ticket = nullptr)
      VIGIL_EXCLUDES(mu_) {
    out->clear();
    MutexLock lock(mu_);
    const int64_t give_up = clock_->SteadyNs() + idle.count();
    for (;;) {
      while (!closed_ && total_ == 0) {
        if (!WaitUntilNs(lock, give_up)) break;
      }
      if (!closed_ && total_ == 0) return Result::kTimeout;
      if (total_ == 0) return Result::kClosed;
      const int64_t deadline = OldestLocked() + max_wait_ns_;
      while (!closed_ && total_ < max_batch_) {
        if (!WaitUntilNs(lock, deadline)) break;
      }
      if (total_ > 0) break;  // else another consumer took them meanwhile
    }
    const size_t n = queues_.size();
    size_t stream = next_;
    size_t idle_streams = 0;  // consecutive empty streams seen: all empty after n
    while (out->size() < max_batch_ && total_ > 0 && idle_streams < n) {
      std::deque<Entry>& q = queues_[stream];
      if (q.empty()) {
        ++idle_streams;
      } else {
        idle_streams = 0;
        out->push_back(std::move(q.front().item));
        q.pop_front();
        --total_;
        next_ = (stream + 1) % n;
      }
      stream = (stream + 1) % n;
    }
    if (ticket != nullptr) *ticket = next_ticket_;
    ++next_ticket_;
    cv_.NotifyAll();
    return Result::kBatch;
  }

  void Close() VIGIL_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    closed_ = true;
    cv_.NotifyAll();
  }
  // Close() that also takes every queued item out (in stream order, each stream's in push order) and
  // returns them instead of letting NextBatch drain them: a stop that does not wait for the engine.
  std::vector<T> CloseAndTake() VIGIL_EXCLUDES(mu_) {
    std::vector<T> out;
    MutexLock lock(mu_);
    closed_ = true;
    for (std::deque<Entry>& q : queues_) {
      for (Entry& e : q) out.push_back(std::move(e.item));
      q.clear();
    }
    total_ = 0;
    cv_.NotifyAll();
    return out;
  }
  // Items queued in all streams.
  size_t depth() const VIGIL_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return total_;
  }

 private:
  struct Entry {
    T item;
    int64_t pushed_ns;  // clock_->SteadyNs() at Push
  };
  // Waits on cv_ until notified or the clock reaches `deadline_ns` (false: reached, without a wait).
  // The CondVar sleeps for the time left by clock_ (a relative wait), so a FakeClock's time is honoured.
  bool WaitUntilNs(MutexLock& lock, int64_t deadline_ns) VIGIL_REQUIRES(mu_) {
    const int64_t left = deadline_ns - clock_->SteadyNs();
    if (left <= 0) return false;
    cv_.WaitFor(lock, std::chrono::nanoseconds(left));
    return true;
  }
  int64_t OldestLocked() const VIGIL_REQUIRES(mu_) {  // REQUIRES: total_ > 0
    int64_t oldest = std::numeric_limits<int64_t>::max();
    for (const std::deque<Entry>& q : queues_) {
      if (!q.empty()) oldest = std::min(oldest, q.front().pushed_ns);
    }
    return oldest;
  }

  const size_t max_batch_;
  const int64_t max_wait_ns_;
  const size_t capacity_;
  Clock* const clock_;
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<std::deque<Entry>> queues_ VIGIL_GUARDED_BY(mu_);  // one per stream
  size_t total_ VIGIL_GUARDED_BY(mu_) = 0;                       // items in all queues
  size_t next_ VIGIL_GUARDED_BY(mu_) = 0;                        // the stream the next batch starts with
  uint64_t next_ticket_ VIGIL_GUARDED_BY(mu_) = 0;               // the next batch's ticket
  bool closed_ VIGIL_GUARDED_BY(mu_) = false;
};

}  // namespace vigil::pipeline
