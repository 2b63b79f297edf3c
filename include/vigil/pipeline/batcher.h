// vigil/pipeline/batcher.h — the cross-stream batcher in front of one inference engine.
//
// Producers (one per stream) Push items; the consumer takes batches with NextBatch: it waits for a
// first item, then until max_batch items are queued or max_wait has passed since that first item was
// pushed, and takes up to max_batch items in push order. One FIFO queue for all streams: items of one
// producer come out in the order it pushed them (per-stream order preserved), streams interleave as
// they arrive. Push blocks while `capacity` items are queued (backpressure to the stream readers).
//
// Thread-safety: all methods are thread-safe. Close() makes Push return false and lets NextBatch drain
// what is queued, then report kClosed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

namespace vigil::pipeline {

template <typename T>
class Batcher {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: max_batch >= 1, capacity >= max_batch.
  Batcher(size_t max_batch, std::chrono::milliseconds max_wait, size_t capacity)
      : max_batch_(max_batch), max_wait_(max_wait), capacity_(capacity) {}

  // Queues `item`; waits while the queue is full. False (item dropped) after Close().
  bool Push(T item) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return closed_ || queue_.size() < capacity_; });
    if (closed_) return false;
    queue_.push_back({std::move(item), Clock::now()});
    cv_.notify_all();
    return true;
  }

  enum class Result { kBatch, kTimeout, kClosed };
  // Waits up to `idle` for a first item (kTimeout when none came), then forms a batch (above) into
  // *out (cleared first). kClosed once closed and drained.
  Result NextBatch(std::vector<T>* out, std::chrono::nanoseconds idle) {
    out->clear();
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, idle, [&] { return closed_ || !queue_.empty(); })) return Result::kTimeout;
    if (queue_.empty()) return Result::kClosed;
    const Clock::time_point deadline = queue_.front().pushed + max_wait_;
    cv_.wait_until(lock, deadline, [&] { return closed_ || queue_.size() >= max_batch_; });
    while (!queue_.empty() && out->size() < max_batch_) {
      out->push_back(std::move(queue_.front().item));
      queue_.pop_front();
    }
    cv_.notify_all();
    return Result::kBatch;
  }

  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  size_t depth() const {
    std::lock_guard lock(mu_);
    return queue_.size();
  }

 private:
  struct Entry {
    T item;
    Clock::time_point pushed;
  };
  const size_t max_batch_;
  const std::chrono::milliseconds max_wait_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool closed_ = false;
};

}  // namespace vigil::pipeline
