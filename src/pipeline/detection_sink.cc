// The edge's sink side (detection_sink.h).
#include "vigil/pipeline/detection_sink.h"

#include <string>
#include <utility>

#include <spdlog/spdlog.h>

namespace vigil::pipeline {

DetectionSink::DetectionSink(DetectionSinkOptions options)
    : options_(std::move(options)), reg_(*options_.registry), clock_(options_.clock) {
  stages_ = {&Stage("decode"), &Stage("queue"),       &Stage("preprocess"), &Stage("inference"),
             &Stage("postprocess"), &Stage("rules"), &Stage("publish"),    &Stage("frame_to_ack")};
  frame_to_detection_ = &reg_.GetHistogram("vigil_edge_frame_to_detection_seconds",
                                           "Frame released by its source to its detections ready, seconds",
                                           metrics::LatencyBuckets());
  engine_busy_ = &reg_.GetCounter("vigil_edge_engine_busy_seconds_total", "Time the inference engine spent running batches");
  batch_frames_ = &reg_.GetHistogram("vigil_edge_batch_frames", "Frames per batch a worker ran",
                                     {1, 2, 4, 8, 16, 32, 64, 128, 256});
}

metrics::Histogram& DetectionSink::Stage(const char* stage) {
  return reg_.GetHistogram("vigil_edge_stage_seconds", "Edge latency per pipeline stage, seconds",
                           metrics::LatencyBuckets(), {{"stage", stage}});
}

void DetectionSink::Open(std::vector<SinkStream> streams) {
  streams_ = std::move(streams);
  MutexLock lock(mu_);
  tallies_.resize(streams_.size());
}

// On the pool's sink thread, batches in the order they were taken (so each stream's frames in order).
void DetectionSink::OnBatch(BatchResult& r) {
  options_.health->BatchDone(r.items.size(), r.status);
  if (!r.status.ok()) {
    spdlog::error("detection of a batch of {} frames on {} failed: {}", r.items.size(), options_.devices[r.device],
                  std::string(r.status.message()));
    for (const WorkItem& item : r.items) {
      streams_[item.stream].metrics->dropped("detect_error").Inc();
      ledger_->Dropped(item.stream, item.frame.seq, "detect_error");
    }
    return;
  }
  const bool first_after_takeover =
      !r.items.empty() && options_.takeover->FirstBatch(r, streams_[r.items.front().stream].id);
  metrics::Histogram& decode_stage = *stages_.decode;
  metrics::Histogram& queue_stage = *stages_.queue;
  metrics::Histogram& preprocess_stage = *stages_.preprocess;
  metrics::Histogram& inference_stage = *stages_.inference;
  metrics::Histogram& postprocess_stage = *stages_.postprocess;
  double engine_ns = 0;
  for (size_t i = 0; i < r.items.size(); ++i) {
    const video::Frame& f = r.items[i].frame;
    const detect::DetectTiming& t = r.timing[i];
    decode_stage.Observe(static_cast<double>(f.decode_ns) * 1e-9);
    queue_stage.Observe(static_cast<double>(r.started_ns - f.source_steady_ns) * 1e-9);
    preprocess_stage.Observe(static_cast<double>(t.preprocess_ns) * 1e-9);
    inference_stage.Observe(static_cast<double>(t.inference_ns) * 1e-9);
    postprocess_stage.Observe(static_cast<double>(t.postprocess_ns) * 1e-9);
    frame_to_detection_->Observe(static_cast<double>(r.detected_ns - f.source_steady_ns) * 1e-9);
    engine_ns += static_cast<double>(t.inference_ns) / t.chunk_images;
  }
  engine_busy_->Inc(engine_ns * 1e-9);
  batch_frames_->Observe(static_cast<double>(r.items.size()));
  if (options_.on_detected) options_.on_detected(r);
  for (size_t i = 0; i < r.items.size(); ++i) {
    const video::Frame& f = r.items[i].frame;
    const size_t index = r.items[i].stream;
    const SinkStream& s = streams_[index];
    const FrameInfo info{f.seq, f.capture_time_ns, f.pts_ns, static_cast<uint32_t>(f.width),
                         static_cast<uint32_t>(f.height)};
    const StreamLedger::Recorded rec = RecordFrame(index, info, r.detections[i],
                                                   i < r.device_rows.size() ? &r.device_rows[i] : nullptr,
                                                   f.source_steady_ns);
    if (rec.verdict.event && snapshotter_ && s.snapshots) {
      // The frame moves to the snapshot thread (nothing reads it after this): no copy on this thread.
      Snapshotter::Job job;
      job.stream = index;
      job.options = s.snapshot_options;
      job.boxes.reserve(rec.verdict.detections.size());
      for (const detect::Detection& d : rec.verdict.detections) job.boxes.push_back({d.x1, d.y1, d.x2, d.y2});
      job.frame = std::move(r.items[i].frame);
      snapshotter_->Offer(std::move(job));
    }
  }
  // The takeover's first batch: its progress marks go out now, not after progress_flush (a frame without an event
  // waited up to that long in a pending range — 220 ms of a 275 ms takeover on the H200).
  if (first_after_takeover) ledger_->Tick(/*force=*/true);
}

StreamLedger::Recorded DetectionSink::RecordFrame(size_t index, const FrameInfo& info,
                                                  std::span<const detect::Detection> dets,
                                                  const detect::DeviceRows* rows, int64_t source_steady_ns) {
  const SinkStream& s = streams_[index];
  const int64_t r0 = clock_->SteadyNs();
  StreamLedger::Recorded rec = ledger_->Record(index, info, dets, rows);
  const double took = static_cast<double>(clock_->SteadyNs() - r0) * 1e-9;
  stages_.rules->Observe(took);
  if (rec.published > 0) stages_.publish->Observe(took);
  if (rec.verdict.event) s.metrics->Event(rec.verdict.severity);
  {
    MutexLock lock(mu_);
    Tally& t = tallies_[index];
    t.unacked.emplace_back(info.seq, source_steady_ns);
    if (t.unacked.size() > kMaxUnackedTimes) t.unacked.pop_front();  // acks stalled: forget the oldest
    ++t.frames;
  }
  s.metrics->frames().Inc();
  if (options_.mirror_result) options_.mirror_result(index, info, dets);
  return rec;
}

uint64_t DetectionSink::Acked(size_t stream, std::optional<uint64_t> acked, int64_t now) {
  MutexLock lock(mu_);
  Tally& t = tallies_[stream];
  if (acked) {
    while (!t.unacked.empty() && t.unacked.front().first <= *acked) {
      stages_.frame_to_ack->Observe(static_cast<double>(now - t.unacked.front().second) * 1e-9);
      t.unacked.pop_front();
    }
  }
  return t.frames;
}

uint64_t DetectionSink::frames() const {
  MutexLock lock(mu_);
  uint64_t frames = 0;
  for (const Tally& t : tallies_) frames += t.frames;
  return frames;
}

size_t DetectionSink::unacked(size_t stream) const {
  MutexLock lock(mu_);
  return tallies_[stream].unacked.size();
}

}  // namespace vigil::pipeline
