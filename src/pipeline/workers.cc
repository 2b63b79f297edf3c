#include "vigil/pipeline/workers.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "vigil/common/clock.h"
#include "vigil/pipeline/frame_ref.h"

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Load(WorkerPoolOptions options) {
  if (options.devices.empty()) return absl::InvalidArgumentError("worker pool: no device");
  if (std::set<std::string>(options.devices.begin(), options.devices.end()).size() != options.devices.size()) {
    return absl::InvalidArgumentError("worker pool: a device is listed twice");
  }
  if (options.workers_per_device < 1 || options.workers_per_device > 64) {
    return absl::InvalidArgumentError(StrCat("worker pool: workers per device ", options.workers_per_device,
                                             " is not in 1..64"));
  }
  if (options.max_batch < 1 || options.streams < 1) {
    return absl::InvalidArgumentError("worker pool: max_batch and streams must be at least 1");
  }
  if (!options.stream_device.empty()) {
    if (options.stream_device.size() != options.streams) {
      return absl::InvalidArgumentError(StrCat("worker pool: ", options.stream_device.size(), " stream devices for ",
                                               options.streams, " streams"));
    }
    for (size_t d : options.stream_device) {
      if (d >= options.devices.size()) {
        return absl::InvalidArgumentError(StrCat("worker pool: device index ", d, " of ", options.devices.size()));
      }
    }
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool(std::move(options)));
  WorkerPoolOptions& o = pool->options_;
  const size_t num_devices = o.devices.size();
  pool->stream_device_.resize(o.streams);
  std::vector<size_t> streams_of(num_devices, 0);
  for (size_t s = 0; s < o.streams; ++s) {
    pool->stream_device_[s] = o.stream_device.empty() ? s % num_devices : o.stream_device[s];
    ++streams_of[pool->stream_device_[s]];
  }
  // About two batches per worker queued on a device, split evenly over its streams: no stream can fill a
  // device's queue for the others, and frames (maybe GPU surfaces) do not pile up.
  size_t capacity = o.per_stream_capacity;
  if (capacity == 0) {
    const size_t busiest = std::max<size_t>(1, *std::max_element(streams_of.begin(), streams_of.end()));
    const size_t per_device = std::max<size_t>(4, 2 * o.max_batch * static_cast<size_t>(o.workers_per_device));
    capacity = std::max<size_t>(1, (per_device + busiest - 1) / busiest);
  }
  pool->per_stream_capacity_ = capacity;
  for (size_t d = 0; d < num_devices; ++d) {
    // Each device's batcher has a queue for every stream (streams of other devices never push to it).
    pool->batchers_.push_back(std::make_unique<Batcher<WorkItem>>(o.max_batch, o.max_wait, capacity, o.streams, o.clock));
  }
  {
    WorkerPool& p = *pool;
    MutexLock lock(p.mu_);
    p.results_.resize(num_devices);
    p.next_ticket_.assign(num_devices, 0);
  }
  if (o.result_capacity == 0) o.result_capacity = 2 * num_devices * static_cast<size_t>(o.workers_per_device);

  pool->workers_.resize(num_devices * static_cast<size_t>(o.workers_per_device));
  std::vector<Status> errors(pool->workers_.size());
  std::vector<std::thread> loaders;
  for (size_t w = 0; w < pool->workers_.size(); ++w) {
    pool->workers_[w].device = w / static_cast<size_t>(o.workers_per_device);
    loaders.emplace_back([&, w] {
      const std::string& device = o.devices[pool->workers_[w].device];
      detect::DetectorOptions dopt = o.detector;
      dopt.engine.device = device;
      StatusOr<std::unique_ptr<detect::Detector>> d =
          o.load_detector ? o.load_detector(device, w) : detect::Detector::Load(o.model_path, dopt);
      if (d.ok()) {
        pool->workers_[w].detector = std::move(*d);
      } else {
        errors[w] = d.status();
      }
    });
  }
  for (std::thread& t : loaders) t.join();
  for (const Status& st : errors) {
    if (!st.ok()) return st;
  }
  return pool;
}

WorkerPool::~WorkerPool() {
  Close();
  if (started_ && !joined_) Join();
}

void WorkerPool::Start(Sink sink, BeforeDetect before_detect, OnWorkerStart on_worker_start,
                       std::function<void()> on_sink_start) {
  sink_ = std::move(sink);
  before_detect_ = std::move(before_detect);
  on_worker_start_ = std::move(on_worker_start);
  on_sink_start_ = std::move(on_sink_start);
  started_ = true;
  {
    MutexLock lock(mu_);
    workers_running_ = workers_.size();
  }
  for (size_t w = 0; w < workers_.size(); ++w) {
    workers_[w].thread = std::thread([this, w] { WorkerLoop(w); });
  }
  sink_thread_ = std::thread([this] { SinkLoop(); });
}

bool WorkerPool::Push(size_t stream, WorkItem item) {
  item.stream = stream;
  return batchers_[stream_device_[stream]]->Push(stream, std::move(item));
}

void WorkerPool::Close() {
  for (auto& b : batchers_) b->Close();
}

std::vector<WorkItem> WorkerPool::CloseAndTakeQueued() {
  std::vector<WorkItem> out;
  for (auto& b : batchers_) {
    std::vector<WorkItem> taken = b->CloseAndTake();
    std::move(taken.begin(), taken.end(), std::back_inserter(out));
  }
  return out;
}

void WorkerPool::Join() {
  if (!started_ || joined_) return;
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
  }
  if (sink_thread_.joinable()) sink_thread_.join();
  joined_ = true;
}

size_t WorkerPool::queued() const {
  size_t n = 0;
  for (const auto& b : batchers_) n += b->depth();
  return n;
}

BatchResult WorkerPool::RunBatch(size_t w, std::vector<WorkItem>& batch) {
  const detect::Detector& detector = *workers_[w].detector;
  BatchResult r;
  r.device = workers_[w].device;
  r.worker = w;
  r.started_ns = SteadyNs();
  StatusOr<std::vector<std::vector<detect::Detection>>> dets = absl::UnknownError("not run");
  std::vector<detect::Image> images;  // the host path's pictures (their pixels moved in from the frames)
  if (Status refused = before_detect_ ? before_detect_(batch, r.device) : absl::OkStatus(); !refused.ok()) {
    dets = refused;
  } else if (detector.uses_gpu_stages()) {
    // Frames are read where they are (host BGR uploaded, NVDEC frames in place); device frames' surfaces
    // stay held by `batch` until DetectFrames has waited for the GPU.
    std::vector<detect::FrameRef> frames(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) frames[i] = FrameRefOf(batch[i].frame);
    dets = detector.DetectFrames(frames, &r.timing, options_.keep_device_rows ? &r.device_rows : nullptr);
  } else {
    images.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      video::Frame& f = batch[i].frame;
      if (f.device) {  // a device frame for a Detector without GPU stages: read back
        if (Status st = video::DownloadBgr(f); !st.ok()) spdlog::warn("{}", std::string(st.message()));
      }
      images[i].width = f.width;
      images[i].height = f.height;
      images[i].bgr = std::move(f.bgr);
    }
    dets = detector.Detect(images, &r.timing);
  }
  r.detected_ns = SteadyNs();
  if (dets.ok()) {
    r.detections = std::move(*dets);
  } else {
    r.status = dets.status();
    r.timing.clear();
    r.device_rows.clear();
  }
  for (size_t i = 0; i < batch.size(); ++i) {  // the pictures are read: surfaces back to their pools, pixels freed
    WorkItem& item = batch[i];
    if (item.stream < options_.keep_pictures.size() && options_.keep_pictures[item.stream]) {
      if (i < images.size() && item.frame.bgr.empty()) item.frame.bgr = std::move(images[i].bgr);  // given back
      continue;
    }
    item.frame.bgr = {};
    item.frame.device.reset();
  }
  r.items = std::move(batch);
  return r;
}

void WorkerPool::WorkerLoop(size_t w) {
  const size_t device = workers_[w].device;
  if (on_worker_start_) on_worker_start_(device, w);
  Batcher<WorkItem>& batcher = *batchers_[device];
  std::vector<WorkItem> batch;
  for (;;) {
    uint64_t ticket = 0;
    const Batcher<WorkItem>::Result got = batcher.NextBatch(&batch, milliseconds(200), &ticket);
    if (got == Batcher<WorkItem>::Result::kClosed) break;
    if (got != Batcher<WorkItem>::Result::kBatch) continue;
    Deliver(device, ticket, RunBatch(w, batch));
    batch = {};
  }
  MutexLock lock(mu_);
  --workers_running_;
  cv_.NotifyAll();
}

void WorkerPool::Deliver(size_t device, uint64_t ticket, BatchResult result) {
  MutexLock lock(mu_);
  // The result the sink waits for next is always let in: otherwise results after it could fill the
  // queue while it waits for room, and nothing would move again.
  while (!(held_ < options_.result_capacity || ticket == next_ticket_[device])) cv_.Wait(lock);
  results_[device].emplace(ticket, std::move(result));
  ++held_;
  cv_.NotifyAll();
}

void WorkerPool::SinkLoop() {
  if (on_sink_start_) on_sink_start_();
  MutexLock lock(mu_);
  size_t last_device = results_.size() - 1;
  for (;;) {
    // The next result in batch order of some device, if it is there.
    // Devices take turns (starting after the last one served), so one busy device cannot starve another.
    BatchResult* ready = nullptr;
    size_t device = 0;
    for (size_t k = 1; k <= results_.size() && ready == nullptr; ++k) {
      const size_t d = (last_device + k) % results_.size();
      auto it = results_[d].find(next_ticket_[d]);
      if (it != results_[d].end()) {
        ready = &it->second;
        device = d;
      }
    }
    if (ready == nullptr) {
      if (workers_running_ == 0) break;  // every worker ended and every result was handed over
      cv_.Wait(lock);
      continue;
    }
    last_device = device;
    BatchResult r = std::move(*ready);
    results_[device].erase(next_ticket_[device]);
    ++next_ticket_[device];
    --held_;
    cv_.NotifyAll();
    lock.Unlock();
    sink_(r);
    lock.Lock();
  }
  done_ = true;
  cv_.NotifyAll();
}

bool WorkerPool::WaitDone(std::chrono::milliseconds timeout) {
  // The deadline is read from options_.clock; the CondVar sleeps for the time left by it.
  Clock* const clock = options_.clock;
  const int64_t deadline = clock->SteadyNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  MutexLock lock(mu_);
  while (!done_) {
    const int64_t left = deadline - clock->SteadyNs();
    if (left <= 0) return false;
    cv_.WaitFor(lock, std::chrono::nanoseconds(left));
  }
  return true;
}

}  // namespace vigil::pipeline
