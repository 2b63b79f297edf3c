// vigil/pipeline/workers.h — the inference stage of the edge pipeline: per-device workers behind fair
// cross-stream batchers. `vigil edge` runs it (pipeline/edge.h) and `vigil bench streams` runs the edge, so
// this is the one batching and worker implementation of the code base.
//
//   Push(stream, frame) ─► Batcher of the stream's device ─► worker 0..K-1 of that device ─► results ─► sink
//                          (a bounded queue per stream,       (each its own Detector:         (one thread,
//                           round-robin batches with a         own engine, CUDA stream,        per device in
//                           deadline: batcher.h)               graph and staging)              batch order)
//
// Devices: "cpu" or "cuda:N" (a CUDA backend build). Each device has its own Batcher(max_batch, max_wait,
// per_stream_capacity) over the streams assigned to it and `workers_per_device` workers, each a thread with
// its own Detector loaded from the same model. With two or more workers per device one worker's upload,
// letterbox and post-processing (and its frames' wait for the GPU) overlap another's inference, the way
// Triton's instance groups or DeepStream's several engines do; one per device serialises them (the CPU
// engine: its OpenMP team already uses every core it is given).
//
// A worker takes a batch, calls `before_detect` (on its thread: e.g. save the pictures), runs the batch
// (Detector::DetectFrames when the Detector has GPU stages: host BGR frames are uploaded, NVDEC frames read
// in place; else Detector::Detect on host BGR, device frames downloaded first), then gives the frames'
// pixels back at once (a GPU surface returns to its decoder's pool, a host picture is freed: a BatchResult
// keeps every other field of the Frame) and queues the result. One sink thread hands results to `sink` in
// the order their batches were taken, per device — so a stream's frames reach the sink in the order they
// were pushed, whichever worker ran them. The sink runs on its own thread, so the rules, the ledger and a
// file stream's wait for room in the outbox never hold a worker or the GPU; a slow sink still pushes back:
// at most `result_capacity` results wait (a result that the sink is waiting for is always let in).
//
// Streams that cannot open or fail are the caller's business; a batch whose detection fails yields a
// BatchResult with that status and no detections (the caller counts its frames as dropped), and the worker
// goes on with the next batch.
//
// Thread-safety: Load from any thread; Start once; Push from any threads (one producer per stream keeps
// that stream's order); Close and Join from any thread, Join once. Callbacks run on the pool's threads:
// on_worker_start and before_detect on worker threads (concurrently with each other), sink and
// on_sink_start on the sink thread only.
// Ownership: the pool owns its Detectors and threads; Join (or the destructor, which Closes and Joins)
// ends them. Errors: Load returns the first Detector's Load error (naming the model and device) or
// InvalidArgument for bad options.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/detect/detector.h"
#include "vigil/pipeline/batcher.h"
#include "vigil/video/frame.h"

namespace vigil::pipeline {

struct WorkItem {
  size_t stream = 0;   // 0..streams-1
  video::Frame frame;  // host BGR or a device frame of the stream's device (pipeline/frame_ref.h)
};

// What a worker made of one batch.
struct BatchResult {
  std::vector<WorkItem> items;  // the batch, in batch order; pixels released (bgr empty, device unset) except
                                // for streams of WorkerPoolOptions::keep_pictures
  Status status;                // not ok: detection failed; detections and timing are empty
  std::vector<std::vector<detect::Detection>> detections;  // per item, source pixels
  std::vector<detect::DetectTiming> timing;                 // per item
  // Per item, the detections kept in device memory (WorkerPoolOptions::keep_device_rows on a GPU detector);
  // empty otherwise.
  std::vector<detect::DeviceRows> device_rows;
  int64_t started_ns = 0;   // steady clock, ns: the worker took the batch
  int64_t detected_ns = 0;  // steady clock, ns: its detections were on the host
  size_t device = 0;        // index into WorkerPoolOptions::devices
  size_t worker = 0;        // 0..num_workers()-1
};

struct WorkerPoolOptions {
  std::string model_path;
  detect::DetectorOptions detector;  // engine.device is replaced by each device in turn
  std::vector<std::string> devices;  // >= 1: "cpu", "cuda", "cuda:N"; distinct
  int workers_per_device = 1;        // Detectors (and threads) per device, 1..64
  size_t max_batch = 1;              // frames per batch, >= 1
  std::chrono::milliseconds max_wait{0};  // a partial batch waits at most this long for more frames
  size_t streams = 1;                // >= 1
  // Device index of each stream (size streams, values < devices.size()); empty: stream mod devices.
  std::vector<size_t> stream_device;
  // Frames queued per stream before Push waits; 0: about two batches per device's worker set, split over
  // its streams (at least 1 each).
  size_t per_stream_capacity = 0;
  size_t result_capacity = 0;  // results waiting for the sink; 0: 2 per worker
  // GPU detectors also keep each batch's detections in device memory (BatchResult::device_rows), for links
  // that send rows from there (cuda_ipc, ucx with CUDA transports). Default: off.
  bool keep_device_rows = false;
  // Per stream (size streams, or empty: none): its items keep their pictures (host pixels or the device frame) in
  // the BatchResult, for the sink to take (an event's snapshot). Holds them until the sink returns. Default: none.
  std::vector<bool> keep_pictures;
  // Seam: makes worker w's Detector for a device (tests: a stand-in engine). Empty: Detector::Load of
  // model_path with `detector` on that device.
  std::function<StatusOr<std::unique_ptr<detect::Detector>>(const std::string& device, size_t worker)> load_detector;
  // Every time read (the batchers' max_wait deadlines, WaitDone's timeout) goes through it. Not owned.
  Clock* clock = SystemClock();
};

class WorkerPool {
 public:
  using Sink = std::function<void(BatchResult& result)>;
  // Before a batch is detected, on its worker's thread. A non-OK status fails the batch with it (nothing is
  // detected; the sink gets a BatchResult with that status): the edge's fault injection uses it.
  using BeforeDetect = std::function<Status(std::vector<WorkItem>& batch, size_t device)>;
  using OnWorkerStart = std::function<void(size_t device, size_t worker)>;

  // Checks the options and loads the Detectors (in parallel: a CUDA load compiles cuDNN engines on the CPU).
  static StatusOr<std::unique_ptr<WorkerPool>> Load(WorkerPoolOptions options);
  ~WorkerPool();  // Close, then Join when started
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts the workers and the sink thread. `before_detect` and `on_worker_start`/`on_sink_start` may be empty.
  void Start(Sink sink, BeforeDetect before_detect = {}, OnWorkerStart on_worker_start = {},
             std::function<void()> on_sink_start = {});
  // Queues a frame of `stream` on its device's batcher; waits while that stream's queue is full. False
  // (item dropped) after Close. REQUIRES: stream < streams.
  bool Push(size_t stream, WorkItem item);
  // No more Push; the workers run what is queued, the sink gets every result, then their threads end.
  void Close();
  // Close, and the frames still queued are not run: they are returned (the caller accounts for them; a
  // live stream's become drop marks). Batches already taken finish and reach the sink.
  std::vector<WorkItem> CloseAndTakeQueued();
  // True once the workers have ended (after Close) and the sink has had every result; waits up to `timeout`.
  bool WaitDone(std::chrono::milliseconds timeout) VIGIL_EXCLUDES(mu_);
  // Waits for the workers and the sink thread to end (so: call Close first).
  void Join();

  size_t num_devices() const { return options_.devices.size(); }
  size_t num_workers() const { return workers_.size(); }
  size_t device_of(size_t stream) const { return stream_device_[stream]; }
  // Detector of worker `w` (0..num_workers()-1): device w / workers_per_device. Immutable, thread-safe.
  const detect::Detector& detector(size_t w = 0) const { return *workers_[w].detector; }
  size_t worker_device(size_t w) const { return workers_[w].device; }
  size_t per_stream_capacity() const { return per_stream_capacity_; }
  // Frames waiting in the batchers, all devices.
  size_t queued() const;

 private:
  struct Worker {
    std::unique_ptr<detect::Detector> detector;
    size_t device = 0;
    std::thread thread;
  };
  struct Pending {
    uint64_t ticket = 0;
    BatchResult result;
  };
  explicit WorkerPool(WorkerPoolOptions options);
  void WorkerLoop(size_t w) VIGIL_EXCLUDES(mu_);
  void SinkLoop() VIGIL_EXCLUDES(mu_);
  BatchResult RunBatch(size_t w, std::vector<WorkItem>& batch);
  void Deliver(size_t device, uint64_t ticket, BatchResult result) VIGIL_EXCLUDES(mu_);

  WorkerPoolOptions options_;
  std::vector<size_t> stream_device_;
  size_t per_stream_capacity_ = 1;
  std::vector<std::unique_ptr<Batcher<WorkItem>>> batchers_;  // by device
  std::vector<Worker> workers_;
  Sink sink_;
  BeforeDetect before_detect_;
  OnWorkerStart on_worker_start_;
  std::function<void()> on_sink_start_;
  std::thread sink_thread_;
  bool started_ = false, joined_ = false;

  Mutex mu_;
  CondVar cv_;
  // Results not yet handed to the sink, by device then ticket.
  std::vector<std::map<uint64_t, BatchResult>> results_ VIGIL_GUARDED_BY(mu_);
  std::vector<uint64_t> next_ticket_ VIGIL_GUARDED_BY(mu_);  // per device: the ticket the sink hands over next
  size_t held_ VIGIL_GUARDED_BY(mu_) = 0;                    // results in results_
  size_t workers_running_ VIGIL_GUARDED_BY(mu_) = 0;
  bool done_ VIGIL_GUARDED_BY(mu_) = false;  // the sink thread handed over the last result
};

}  // namespace vigil::pipeline
