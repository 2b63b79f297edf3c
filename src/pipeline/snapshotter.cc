#include "vigil/common/deadline.h"
#include "vigil/pipeline/snapshotter.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "vigil/common/clock.h"

namespace vigil::pipeline {

Snapshotter::Snapshotter(size_t capacity, Sink sink, OnOutcome on_outcome)
    : capacity_(capacity), sink_(std::move(sink)), on_outcome_(std::move(on_outcome)) {
  thread_ = std::thread([this] { Loop(); });
}

Snapshotter::~Snapshotter() { Close(); }

bool Snapshotter::Offer(Job job) {
  {
    MutexLock lock(mu_);
    if (!closed_ && jobs_.size() < capacity_) {
      jobs_.push_back(std::move(job));
      cv_.NotifyAll();
      return true;
    }
  }
  on_outcome_(job.stream, "queue_full", 1);
  return false;
}

bool Snapshotter::WaitIdle(int timeout_ms) {
  const Deadline deadline = Deadline::After(std::chrono::milliseconds(timeout_ms));
  MutexLock lock(mu_);
  while (!(jobs_.empty() && !busy_)) {
    if (!cv_.WaitUntil(lock, deadline)) return jobs_.empty() && !busy_;
  }
  return true;
}

void Snapshotter::Close() {
  std::deque<Job> dropped;
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
    dropped.swap(jobs_);
    cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
  for (const Job& j : dropped) on_outcome_(j.stream, "queue_full", 1);
}

void Snapshotter::Loop() {
  for (;;) {
    Job job;
    {
      MutexLock lock(mu_);
      while (!closed_ && jobs_.empty()) cv_.Wait(lock);
      if (closed_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    Handle(job);
    job = Job{};  // a device frame's GPU picture goes back to its pool now
    MutexLock lock(mu_);
    busy_ = false;
    cv_.NotifyAll();
  }
}

void Snapshotter::Handle(Job& job) {
  video::Frame& f = job.frame;
  Status st = video::DownloadBgr(f);  // a host frame is left as it is
  StatusOr<std::vector<video::SnapshotPicture>> pics =
      st.ok() ? video::EncodeSnapshots(f, job.boxes, job.options) : StatusOr<std::vector<video::SnapshotPicture>>(st);
  if (!pics.ok()) {
    on_outcome_(job.stream, "encode_error", 1);
    if (job.stream >= error_logged_.size()) error_logged_.resize(job.stream + 1, false);
    if (!error_logged_[job.stream]) {
      error_logged_[job.stream] = true;
      spdlog::error("stream '{}': an event's snapshot cannot be encoded (said once per stream): {}", f.stream_id,
                    std::string(pics.status().message()));
    }
    return;
  }
  for (video::SnapshotPicture& p : *pics) {
    if (p.jpeg.size() > transport::kMaxSnapshotBytes) {
      on_outcome_(job.stream, "too_large", 1);
      continue;
    }
    transport::Snapshot s;
    s.stream = f.stream_id;
    s.run = f.run;
    s.seq = f.seq;
    s.box = p.box;
    s.x = static_cast<uint32_t>(p.x);
    s.y = static_cast<uint32_t>(p.y);
    s.width = static_cast<uint32_t>(p.width);
    s.height = static_cast<uint32_t>(p.height);
    s.out_width = static_cast<uint32_t>(p.out_width);
    s.out_height = static_cast<uint32_t>(p.out_height);
    s.jpeg = std::move(p.jpeg);
    if (Status v = transport::ValidateSnapshot(s); !v.ok()) {  // e.g. a stream id a report could not carry either
      on_outcome_(job.stream, "encode_error", 1);
      continue;
    }
    on_outcome_(job.stream, sink_(std::move(s)) ? "sent" : "refused", 1);
  }
}

}  // namespace vigil::pipeline
