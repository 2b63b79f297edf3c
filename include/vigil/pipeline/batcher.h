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
// Thread-safety: all methods are thread-safe. Close() makes Push return false and lets NextBatch drain
// what is queued (at once, without waiting for max_wait), then report kClosed.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace vigil::pipeline {

template <typename T>
class Batcher {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: max_batch >= 1, per_stream_capacity >= 1, streams >= 1.
  Batcher(size_t max_batch, std::chrono::milliseconds max_wait, size_t per_stream_capacity, size_t streams)
      : max_batch_(max_batch), max_wait_(max_wait), capacity_(per_stream_capacity), queues_(streams) {}

  // Queues `item` on `stream`'s queue; waits while that queue is full. False (item dropped) after Close().
  // REQUIRES: stream < streams.
  bool Push(size_t stream, T item) {
    std::unique_lock lock(mu_);
    std::deque<Entry>& q = queues_[stream];
    cv_.wait(lock, [&] { return closed_ || q.size() < capacity_; });
    if (closed_) return false;
    q.push_back({std::move(item), Clock::now()});
    ++total_;
    cv_.notify_all();
    return true;
  }

  enum class Result { kBatch, kTimeout, kClosed };
  // Waits up to `idle` for a first item (kTimeout when none came), then forms a batch (above) into
  // *out (cleared first) and sets *ticket (when given) to its ticket. kClosed once closed and drained.
  // A kBatch batch has 1..max_batch items.
  Result NextBatch(std::vector<T>* out, std::chrono::nanoseconds idle, uint64_t* ticket = nullptr) {
    out->clear();
    std::unique_lock lock(mu_);
    const Clock::time_point give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(idle);
    for (;;) {
      if (!cv_.wait_until(lock, give_up, [&] { return closed_ || total_ > 0; })) return Result::kTimeout;
      if (total_ == 0) return Result::kClosed;
      cv_.wait_until(lock, OldestLocked() + max_wait_, [&] { return closed_ || total_ >= max_batch_; });
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
    cv_.notify_all();
    return Result::kBatch;
  }

  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  // Close() that also takes every queued item out (in stream order, each stream's in push order) and
  // returns them instead of letting NextBatch drain them: a stop that does not wait for the engine.
  std::vector<T> CloseAndTake() {
    std::vector<T> out;
    std::lock_guard lock(mu_);
    closed_ = true;
    for (std::deque<Entry>& q : queues_) {
      for (Entry& e : q) out.push_back(std::move(e.item));
      q.clear();
    }
    total_ = 0;
    cv_.notify_all();
    return out;
  }
  // Items queued in all streams.
  size_t depth() const {
    std::lock_guard lock(mu_);
    return total_;
  }

 private:
  struct Entry {
    T item;
    Clock::time_point pushed;
  };
  Clock::time_point OldestLocked() const {  // REQUIRES: mu_ held, total_ > 0
    Clock::time_point oldest = Clock::time_point::max();
    for (const std::deque<Entry>& q : queues_) {
      if (!q.empty()) oldest = std::min(oldest, q.front().pushed);
    }
    return oldest;
  }

  const size_t max_batch_;
  const std::chrono::milliseconds max_wait_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Entry>> queues_;  // GUARDED_BY(mu_) one per stream
  size_t total_ = 0;                       // GUARDED_BY(mu_) items in all queues
  size_t next_ = 0;                        // GUARDED_BY(mu_) the stream the next batch starts with
  uint64_t next_ticket_ = 0;               // GUARDED_BY(mu_) the next batch's ticket
  bool closed_ = false;                    // GUARDED_BY(mu_)
};

}  // namespace vigil::pipeline
