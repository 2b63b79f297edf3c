#include "vigil/common/deadline.h"
#include "vigil/video/stream_reader.h"

#include <algorithm>

namespace vigil::video {

StreamReader::StreamReader(std::unique_ptr<Source> source, StreamReaderOptions options)
    : source_(std::move(source)),
      capacity_(std::max<size_t>(1, options.queue_capacity)),
      drop_oldest_(options.policy == QueuePolicy::kDropOldest ||
                   (options.policy == QueuePolicy::kAuto && source_->live())),
      on_frame_(std::move(options.on_frame)),
      on_drop_(std::move(options.on_drop)),
      thread_([this, start = std::move(options.on_thread_start)] {
        if (start) start();
        Run();
      }) {}

StreamReader::~StreamReader() { Stop(); }

void StreamReader::Run() {
  Status status;
  while (true) {
    StatusOr<std::optional<Frame>> next = source_->Next();
    if (!next.ok()) {
      if (!absl::IsCancelled(next.status())) status = next.status();
      break;
    }
    if (!next->has_value()) break;
    Frame& frame = **next;
    if (on_frame_ && !on_frame_(frame)) continue;
    std::optional<Frame> dropped;
    MutexLock lock(mu_);
    if (drop_oldest_) {
      if (queue_.size() >= capacity_) {
        dropped = std::move(queue_.front());
        queue_.pop_front();
        ++dropped_;
      }
    } else {
      while (!stop_ && queue_.size() >= capacity_) cv_.Wait(lock);
      if (stop_) {
        lock.Unlock();
        if (on_drop_) on_drop_(frame, DropReason::kStopped);
        break;
      }
    }
    queue_.push_back(std::move(frame));
    cv_.NotifyAll();
    lock.Unlock();
    if (dropped && on_drop_) on_drop_(*dropped, DropReason::kQueueFull);
  }
  MutexLock lock(mu_);
  finished_ = true;
  final_status_ = status;
  cv_.NotifyAll();
}

StreamReader::PopResult StreamReader::Pop(Frame* frame, std::chrono::nanoseconds timeout) {
  MutexLock lock(mu_);
  const Deadline deadline = Deadline::After(timeout);
  while (queue_.empty() && !finished_) {
    if (!cv_.WaitUntil(lock, deadline) && queue_.empty() && !finished_) return PopResult::kTimeout;
  }
  if (queue_.empty()) return PopResult::kEnd;
  *frame = std::move(queue_.front());
  queue_.pop_front();
  cv_.NotifyAll();
  return PopResult::kFrame;
}

void StreamReader::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  source_->Interrupt();
  cv_.NotifyAll();
  MutexLock lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

Status StreamReader::final_status() const {
  MutexLock lock(mu_);
  return final_status_;
}

StreamStats StreamReader::Stats() const {
  StreamStats stats = source_->Stats();
  MutexLock lock(mu_);
  stats.dropped_queue_full = dropped_;
  stats.queue_depth = queue_.size();
  return stats;
}

}  // namespace vigil::video
