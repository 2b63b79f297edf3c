// vigil/pipeline/snapshotter.h — an event's pictures, encoded off the inference path.
//
// The edge's sink thread offers each event's frame (moved or shared, never copied: a device frame keeps its GPU
// picture alive through its keepalive) with the event's boxes; one thread of the Snapshotter downloads a device
// frame (video::DownloadBgr), encodes the pictures (video::EncodeSnapshots: the frame downscaled and/or a crop per
// box) and hands each to the sink as a transport::Snapshot (the Courier's OfferSnapshot, which sends it beside the
// reports). Nothing waits on it: an event that finds `capacity` events queued gets no picture, counted.
//
// Outcomes, counted per stream through `on_outcome` (the edge's vigil_edge_snapshots_total{stream, result}):
//   "sent"          a picture the sink took
//   "queue_full"    an event that found the queue full (no picture encoded for it)
//   "encode_error"  an event whose frame could not be downloaded or encoded (logged once per stream)
//   "too_large"     a picture over transport::kMaxSnapshotBytes (lower the quality or max_width)
//   "refused"       a picture the sink refused (the courier's queue was full, or it was closed)
// Thread-safety: Offer from one thread (the sink thread); Close from any; on_outcome and the sink run on the
// Snapshotter's thread. Close drops what is still queued (counted "queue_full") and joins the thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/transport/protocol.h"
#include "vigil/video/frame.h"
#include "vigil/video/snapshot.h"

namespace vigil::pipeline {

class Snapshotter {
 public:
  struct Job {
    size_t stream = 0;                     // the edge's stream index (for on_outcome)
    video::Frame frame;                    // the event's frame (host or device); its stream_id, run, seq name it
    std::vector<video::SnapshotBox> boxes;  // the event's detections, in its report's row order (source pixels)
    video::SnapshotOptions options;
  };
  using Sink = std::function<bool(transport::Snapshot)>;  // false: refused
  using OnOutcome = std::function<void(size_t stream, const char* outcome, uint64_t n)>;

  // REQUIRES: capacity ≥ 1. Starts the thread.
  Snapshotter(size_t capacity, Sink sink, OnOutcome on_outcome);
  ~Snapshotter();  // Close()
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // Queues `job`; false (counted "queue_full") when `capacity` jobs wait or after Close.
  bool Offer(Job job);
  // Waits until every job queued so far was handled (tests, the edge's shutdown). false after `timeout_ms`.
  bool WaitIdle(int timeout_ms);
  void Close();

 private:
  void Loop();
  void Handle(Job& job);

  const size_t capacity_;
  Sink sink_;
  OnOutcome on_outcome_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Job> jobs_ VIGIL_GUARDED_BY(mu_);
  bool busy_ VIGIL_GUARDED_BY(mu_) = false;  // a job is being handled
  bool closed_ VIGIL_GUARDED_BY(mu_) = false;
  std::vector<bool> error_logged_;  // per stream; the thread only
  std::thread thread_;
};

}  // namespace vigil::pipeline
