#include "vigil/pipeline/edge.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "vigil/common/npy.h"
#include "vigil/detect/detector.h"
#include "vigil/pipeline/frame_ref.h"
#include "vigil/pipeline/health.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/pipeline/mirror_window.h"
#include "vigil/pipeline/placement.h"
#include "vigil/pipeline/rules.h"
#include "vigil/pipeline/standby_gate.h"
#include "vigil/pipeline/takeover_timeline.h"
#include "vigil/pipeline/workers.h"
#include "vigil/replication/frame_ring.h"
#include "vigil/transport/device_memory.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/courier.h"
#include "vigil/pipeline/snapshotter.h"
#include "vigil/transport/http_access.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/ucx.h"
#include "vigil/video/jpeg.h"
#include "vigil/video/source.h"
#include "vigil/video/stream_reader.h"
#include "replication_role.h"

namespace vigil::pipeline {
namespace {

// A picture from a ring in GPU memory (MirroredFrame::gpu, packed NV12) as a device Frame: the planes stay where
// the standby copied them (`keepalive` holds them); copy_to_host lets DownloadBgr (snapshots, a CPU engine) read them.
video::Frame FrameOfGpu(const replication::MirroredFrame& m) {
  video::Frame frame;
  frame.width = static_cast<int>(m.width);
  frame.height = static_cast<int>(m.height);
  const std::shared_ptr<const replication::MirroredGpuPicture> pic = m.gpu;
  video::DeviceFrame d;
  d.device = pic->device;
  d.y = pic->data;
  d.uv = pic->data + static_cast<size_t>(m.width) * m.height;
  d.y_pitch = static_cast<int>(m.width);
  d.uv_pitch = static_cast<int>(2 * ((m.width + 1) / 2));
  d.matrix = static_cast<video::YuvMatrix>(pic->matrix);
  d.full_range = pic->full_range;
  d.keepalive = std::const_pointer_cast<replication::MirroredGpuPicture>(pic);
  d.copy_to_host = [pic](uint8_t* dst) {
    return transport::device_memory::CopyToHost(dst, pic->data, pic->bytes, pic->device);
  };
  frame.device = std::move(d);
  return frame;
}

// A ring's raw picture (MirroredFrame::bgr, rows of `stride`) as a host Frame of unpadded rows (identity and
// times set by the caller).
video::Frame FrameOfRaw(const replication::MirroredFrame& m) {
  video::Frame frame;
  frame.width = static_cast<int>(m.width);
  frame.height = static_cast<int>(m.height);
  frame.stride = static_cast<int>(m.width) * 3;
  frame.bgr.resize(static_cast<size_t>(frame.stride) * m.height);
  for (uint32_t y = 0; y < m.height; ++y) {
    std::memcpy(frame.bgr.data() + static_cast<size_t>(y) * frame.stride, m.bgr.data() + size_t{y} * m.stride,
                static_cast<size_t>(frame.stride));
  }
  return frame;
}


using std::chrono::milliseconds;

constexpr size_t kMaxUnackedTimes = 100000;  // frame times kept per stream for frame_to_ack

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

const char* const kDropReasons[] = {"queue_full", "detect_error", "backpressure", "shutdown", "mirror_error"};

struct Stream {
  StreamConfig config;
  std::unique_ptr<video::Source> source;        // opened, until its reader takes it
  std::unique_ptr<video::StreamReader> reader;  // null when the stream failed to open
  video::Source* read = nullptr;                // the reader's source (DoNotPaceThrough), while `reader` lives
  bool live = false;
  bool first_frame_seen = false;  // Feed's thread
  bool mirror_error_logged = false;  // the reader's thread
  bool ring_size_logged = false;     // the reader's thread
  uint64_t run = 0;  // set once the ledger is admitted, before the reader starts
  std::deque<std::pair<uint64_t, int64_t>> unacked;  // (seq, source_steady_ns) of reported frames; stats_mu_
  uint64_t frames = 0;               // GUARDED_BY(stats_mu_)
  uint64_t fps_frames = 0;          // main thread
  video::StreamStats last_stats;  // for counter deltas
  LedgerCounters last_counters;   // for counter deltas
  std::string decoder;  // the vigil_edge_stream_decoder series at 1 ("" before the first report)
  // Metric handles, looked up once.
  metrics::Counter* frames_total = nullptr;
  metrics::Counter* errors_total = nullptr;
  metrics::Counter* decode_errors = nullptr;
  metrics::Counter* reconnects = nullptr;
  metrics::Counter* lost_on_restart = nullptr;
  metrics::Counter* mirrored = nullptr;        // live pictures handed to the standby (primary)
  metrics::Counter* mirrored_bytes = nullptr;  // … their JPEG bytes
  metrics::Counter* mirror_skipped = nullptr;  // live pictures not mirrored: the JPEG failed or was too large
  metrics::Counter* unpaired_evicted = nullptr;  // kept raw with no standby paired, dropped for room unstored
  metrics::Counter* replayed = nullptr;        // the old primary's unstored pictures taken over (run or re-published)
  metrics::Counter* republished = nullptr;     // … of which re-published from the old primary's mirrored results
  metrics::Counter* results_mirrored = nullptr;  // processed pictures' detections handed to the channel (primary)
  std::vector<replication::MirroredFrame> replay;  // a takeover's mirrored pictures, fed before the source's
  metrics::Counter* dropped[std::size(kDropReasons)] = {};
  metrics::Counter* events[4] = {};  // by transport::Severity
  metrics::Gauge* fps = nullptr;
  metrics::Gauge* reader_depth = nullptr;
};

class Edge final : public transport::CourierHandler {
 public:
  Edge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& reg)
      : config_(config), stop_(stop), reg_(reg) {}
  ~Edge() override {
    StopHttp();  // a standby's server runs from before its wait (a Run that ended early left it up)
    // A warm standby's readers pass the gate: it lets a held one go, and they stop (joined) while it lives.
    if (!gate_) return;
    gate_->Close();
    for (Stream& s : streams_) {
      if (s.reader) s.reader->Stop();
    }
  }

  Status Run(const EdgeRunOptions& options);
  // This edge is (or becomes, at a takeover) the primary and serves `channel` (not owned; outlives Run): every
  // state its ledger persists is mirrored to the paired standby and, with replication.mirror_frames, every live
  // picture it numbers (as a JPEG, under the lock that orders it before the ledger states that count it), kept
  // by the channel until the aggregator acknowledges it.
  // Set before the ledger opens (before Run, or in after_load).
  void set_primary_channel(replication::PrimaryChannel* channel) { primary_channel_.store(channel); }
  // With replication.mirror_via shm: the primary's picture ring (not owned; outlives Run). While a standby has a
  // ring mapped, live pictures go there raw (under the same lock) instead of as JPEGs over the channel.
  void set_frame_publisher(replication::FramePublisher* frames) { frame_publisher_.store(frames); }
  // A standby's window of the primary's mirrored live pictures (filled while it waits): at the takeover those
  // the aggregator lacks are processed again. Set before Run.
  void set_mirror_window(std::shared_ptr<MirrorWindow> window) { window_ = std::move(window); }
  // A second Edge on the same registry (a fenced primary rejoining as standby) must not hook it again.
  void set_register_numa(bool on) { register_numa_ = on; }
  // A standby: the primary's last contact (steady ns) once it took over, 0 before. Each live stream's first
  // frame after it measures the camera time the takeover missed (frames no node numbered). Set before Run.
  void set_takeover_contact(std::shared_ptr<const std::atomic<int64_t>> contact) { takeover_contact_ = std::move(contact); }
  // A standby's takeover, step by step (the caller starts it and marks the steps before Run's own): logged and
  // exported (vigil_edge_takeover_phase_seconds) when the first report is stored.
  TakeoverTimeline& takeover_timeline() { return timeline_; }
  // A hot standby (set before Run): the streams are opened before options.after_load (the wait for the
  // primary to fail) and the replayable ones read through a StandbyGate up to the cursor FollowMirrored passes,
  // so the takeover resumes where the aggregator's cursor is instead of decoding from the start; with
  // `cameras`, the live ones too (every picture discarded), so the takeover finds them connected.
  void set_warm_standby(bool cameras) {
    warm_ = true;
    warm_cameras_ = cameras;
  }
  // The primary's ledger records as mirrored (any thread; before Run's after_load returns).
  void FollowMirrored(const std::vector<StreamRecord>& records) {
    std::lock_guard lock(gate_mu_);
    if (!gate_) return;
    for (const StreamRecord& r : records) {
      for (size_t i = 0; i < streams_.size(); ++i) {
        if (streams_[i].config.id != r.stream || streams_[i].config.source != r.source) continue;
        gate_->Raise(i, r.acked_through);
        if (r.acked_through && streams_[i].read) streams_[i].read->DoNotPaceThrough(*r.acked_through);
      }
    }
  }
  // Calls `f` once, on Run's thread, when this edge finds itself unhealthy (health.h: no inference batch
  // completed for bounds.stall_ms while frames wait for one, or bounds.errors batches in a row failed) with
  // why (a primary steps down). Set before Run.
  void set_on_unhealthy(std::function<void(const std::string& why)> f, HealthBounds bounds) {
    on_unhealthy_ = std::move(f);
    health_bounds_ = bounds;
  }
  // A handover's flush (any thread, while the Edge lives): publishes every mark the ledger still holds
  // (drop marks of failed batches, a progress range) and waits until the aggregator acknowledged everything
  // handed to the outbox so far, so the standby resumes after them instead of doing those frames again. What
  // is recorded meanwhile is not waited for. false: `timeout` passed (or the edge is not publishing).
  bool FlushForHandover(std::chrono::milliseconds timeout) {
    if (!publishing_.load(std::memory_order_acquire)) return false;
    ledger_->Tick(/*force=*/true);
    return ledger_->outbox().WaitCompleted(ledger_->outbox().next_id(), timeout);
  }

  // ---- transport::CourierHandler (courier threads) ----
  transport::Hello MakeHello() override {
    transport::Hello h;
    h.class_names = class_names_;
    h.streams = ledger_->ResumedStreams();
    return h;
  }
  void OnWelcome(const transport::Welcome& w, std::string_view link) override {
    timeline_.Mark(TakeoverTimeline::kWelcomed, SteadyNs());
    ledger_->Admit(w);  // with the state write that lets pictures be numbered
    timeline_.Mark(TakeoverTimeline::kDurable, SteadyNs());
    epoch_gauge_->Set(static_cast<double>(w.epoch));
    spdlog::info("edge '{}': admitted by the aggregator over {} with epoch {}", config_.edge, link, w.epoch);
  }
  void OnAck(const transport::Ack& a) override {
    ledger_->OnAck(a);
    if (timeline_.Seconds(TakeoverTimeline::kRepublished) &&
        !timeline_.Seconds(TakeoverTimeline::kRepublishedStored)) {
      std::lock_guard lock(takeover_mu_);
      if (first_republished_ && a.stream == first_republished_->stream && a.run == first_republished_->run &&
          a.seq_first <= first_republished_->seq && first_republished_->seq <= a.seq_last) {
        if (timeline_.Mark(TakeoverTimeline::kRepublishedStored, SteadyNs())) LogRepublishedStored();
      }
    }
    if (timeline_.started() && !timeline_.Seconds(TakeoverTimeline::kStored)) {
      // The takeover is complete when the first frame this node processed is stored (a lost or drop mark
      // stored before it is not a detection).
      std::unique_lock lock(takeover_mu_);
      if (first_processed_ && a.stream == first_processed_->stream && a.run == first_processed_->run &&
          a.seq_first <= first_processed_->seq && first_processed_->seq <= a.seq_last) {
        lock.unlock();
        if (timeline_.Mark(TakeoverTimeline::kStored, SteadyNs())) LogTakeoverTimeline();
      }
    }
    if (a.contiguous_through >= 0 && config_.replication.mirror_frames) {
      // The mirrored pictures the aggregator has now are not kept for a standby any longer: on the channel,
      // and those kept raw while none was paired.
      {
        std::lock_guard lock(mirror_mu_);
        for (size_t i = 0; i < unpaired_.size(); ++i) {
          if (streams_[i].config.id != a.stream) continue;
          std::erase_if(unpaired_[i], [&](const replication::MirroredFrame& m) {
            return m.run < a.run || (m.run == a.run && m.seq <= static_cast<uint64_t>(a.contiguous_through));
          });
        }
      }
      if (replication::PrimaryChannel* ch = primary_channel_.load()) {
        ch->Acknowledge(a.stream, a.run, static_cast<uint64_t>(a.contiguous_through));
      }
    }
    if (on_acked_) on_acked_(a);
  }
  void OnReject(const transport::Reject& r) override {
    rejected_->Inc();
    ledger_->Refused(r);  // a message the link could not send: its frames become a drop mark
    spdlog::error("edge '{}': report {}/{} seq {}..{} refused by the aggregator ({}): {}", config_.edge, r.stream,
                  r.run, r.seq_first, r.seq_last, transport::ToString(r.reason), r.detail);
  }
  void OnFenced(const Status& why) override {
    {
      std::lock_guard lock(fence_mu_);
      fence_reason_ = std::string(why.message());
    }
    fenced_ = true;
    fenced_gauge_->Set(1);
    // With a standby this is how a primary learns it was taken over (expected); a lone edge fenced means
    // another process runs its id: an error.
    if (config_.replication.role != ReplicationConfig::Role::kNone) {
      spdlog::warn("edge '{}': fenced, stopping: {}", config_.edge, std::string(why.message()));
    } else {
      spdlog::error("edge '{}': fenced, stopping: {}", config_.edge, std::string(why.message()));
    }
    ledger_->outbox().Close();  // nothing more leaves; a waiting Record returns at once
  }

 private:
  bool Stopping() const { return stop_.load() || fenced_.load(); }
  metrics::Histogram& Stage(const char* stage) {
    return reg_.GetHistogram("vigil_edge_stage_seconds", "Edge latency per pipeline stage, seconds",
                             metrics::LatencyBuckets(), {{"stage", stage}});
  }
  metrics::Counter& Dropped(Stream& s, std::string_view reason) {
    for (size_t r = 0; r < std::size(kDropReasons); ++r) {
      if (reason == kDropReasons[r]) return *s.dropped[r];
    }
    return *s.dropped[0];
  }
  Status OpenStreams();
  Status OpenLedger(const std::vector<std::string>& names);
  Status StartCourier();
  void FlushSnapshots(std::chrono::steady_clock::time_point until);
  bool WaitAdmitted();
  void Place();
  void StartReaders();
  video::SourceOptions SourceOptionsOf(size_t index) const;
  video::StreamReaderOptions ReaderOptionsOf(size_t index, bool gated);
  std::optional<replication::MirroredFrame> MirrorPicture(size_t index, const video::Frame& f);  // reader thread
  // The raw picture for the same-host ring (null: no ring mapped now, or not mirrored); a GPU picture downloaded.
  const video::Frame* RawForRing(size_t index, const video::Frame& f, video::Frame* downloaded);  // reader thread
  // Writes `m` (seq and run set) to the picture ring — host pixels `bgr`, or `device` (a ring in GPU memory) —
  // and counts the outcome. REQUIRES mirror_mu_.
  void WriteToRing(size_t index, const replication::MirroredFrame& m, const uint8_t* bgr, size_t stride,
                   const video::DeviceFrame* device = nullptr);
  void StartFollowing();  // a warm standby, before the takeover
  void WarmUpEngines();   // one batch of 1 and one of max_batch through every worker's detector
  void AssignDevices();
  Status LoadWorkers();
  void Feed(size_t index);
  bool FeedReplay(size_t index);  // false: stopped (what was left became drop marks)
  // A live picture copied raw for unpaired_ (a GPU one device to device, packed NV12); nullopt when the copy
  // failed (counted as mirror_skipped).
  std::optional<replication::MirroredFrame> RawCopy(size_t index, const video::Frame& f);
  bool Unpaired(size_t index) const;  // a live stream of a primary that mirrors, with no standby paired now
  void MirrorKept(std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> kept);
  bool PushToPool(size_t index, video::Frame frame);
  void OnBatch(BatchResult& r);
  // One processed (or re-published) frame's detections through the ledger, its metrics, and — a live stream of a
  // primary with replication.mirror_results — to the standby (the sink thread; FeedReplay for re-published ones).
  StreamLedger::Recorded RecordFrame(size_t index, const FrameInfo& info, std::span<const detect::Detection> dets,
                                     const detect::DeviceRows* rows, int64_t source_steady_ns);
  void SaveFrame(const Stream& s, const video::Frame& f);
  void Periodic(bool force);
  Status StartHttp();
  void StopHttp();
  void SampleLinks(const transport::CourierStats& cs);
  void WatchForStall(int64_t now, int active, const transport::OutboxStats& os, const transport::CourierStats& cs);
  void WatchHealth(int64_t now);
  void LogTakeoverTimeline();  // once the takeover's first report is stored
  void LogRepublishedStored();  // once the first re-published result is stored
  Status InjectFault();  // VIGIL_FAULT_INFERENCE, on a worker thread before each batch

  const EdgeConfig& config_;
  std::atomic<replication::PrimaryChannel*> primary_channel_{nullptr};  // set_primary_channel
  std::atomic<replication::FramePublisher*> frame_publisher_{nullptr};  // set_frame_publisher
  uint64_t ring_sessions_seen_ = 0, ring_refused_seen_ = 0;             // Periodic: its counters' last values
  std::mutex mirror_mu_;  // a live picture's Number + MirrorFrame against the ledger's PublishLedger (order)
  std::shared_ptr<MirrorWindow> window_;  // set_mirror_window (a standby)
  bool register_numa_ = true;
  const std::atomic<bool>& stop_;
  metrics::Registry& reg_;
  std::unique_ptr<WorkerPool> pool_;
  std::vector<std::string> class_names_;
  std::vector<std::shared_ptr<void>> decode_devices_;  // FFmpeg's CUDA contexts, held before the model loads
  std::vector<std::string> stream_hwaccel_;  // per stream: its hwaccel, "cuda" made its device's GPU (AssignDevices)
  std::vector<int> device_gpu_;  // per device: CUDA ordinal whose NVDEC frames its Detectors read in place; -1 none
  std::function<void(const BatchResult&)> on_detected_;  // EdgeRunOptions::on_detected
  std::function<void(const transport::Ack&)> on_acked_;   // EdgeRunOptions::on_acked
  std::mutex stats_mu_;          // Stream::unacked and Stream::frames (sink thread and main thread)
  std::unique_ptr<StreamLedger> ledger_;
  std::unique_ptr<transport::Courier> courier_;
  std::unique_ptr<Snapshotter> snapshotter_;  // set with courier_ when a stream has snapshots enabled
  std::atomic<bool> fenced_{false};
  std::mutex fence_mu_;
  std::string fence_reason_;  // GUARDED_BY(fence_mu_)
  std::unique_ptr<EdgePlacement> placement_;
  std::vector<Stream> streams_;
  std::atomic<int> active_{0};
  int64_t last_periodic_ns_ = 0, last_fps_ns_ = 0;
  uint64_t mirror_evicted_seen_ = 0;  // Periodic's thread: the channel's frames_evicted already counted
  uint64_t results_evicted_seen_ = 0;  // Periodic's thread: the channel's results_evicted already counted
  // WatchForStall (Periodic's thread):
  uint64_t stall_frames_ = 0;
  int64_t stall_since_ns_ = 0;
  bool stall_reported_ = false;
  // WatchHealth: the callback and its bounds (set before Run), what the pool did (sink and feeder threads).
  std::function<void(const std::string&)> on_unhealthy_;
  HealthBounds health_bounds_;
  bool unhealthy_reported_ = false;           // Periodic's thread
  std::atomic<int64_t> last_batch_ns_{0};     // the last batch result, or the first frame pushed to an idle pool
  std::atomic<uint64_t> frames_pushed_{0}, frames_done_{0};
  std::atomic<int> failed_in_row_{0};         // batches failed since the last one that did not
  std::mutex batch_error_mu_;
  std::string last_batch_error_;              // GUARDED_BY(batch_error_mu_)
  // Fault injection for the chaos tests (VIGIL_FAULT_INFERENCE; never set in production): the batch numbered
  // `after` (from 1) stalls `ms`, or every batch from `after` on fails.
  enum class FaultKind { kNone, kStall, kError };
  FaultKind fault_ = FaultKind::kNone;
  uint64_t fault_after_ = 0;
  int fault_ms_ = 0;
  std::atomic<uint64_t> batches_started_{0};
  std::shared_ptr<const std::atomic<int64_t>> takeover_contact_;  // set_takeover_contact
  TakeoverTimeline timeline_;                                       // takeover_timeline()
  // A primary's live pictures kept raw while no standby is paired, per stream in seq order until the aggregator
  // stored them (OnAck), at most mirror_window each: a standby that pairs gets those still unstored
  // (Periodic hands them to kept_flush_). GUARDED_BY(mirror_mu_).
  std::vector<std::deque<replication::MirroredFrame>> unpaired_;
  std::thread kept_flush_;  // Periodic's (Run's thread only)
  std::atomic<bool> kept_flush_running_{false};
  struct FrameId {
    std::string stream;
    uint64_t run = 0, seq = 0;
  };
  std::mutex takeover_mu_;
  std::optional<FrameId> first_processed_;  // GUARDED_BY(takeover_mu_) the takeover's first detected frame
  std::optional<FrameId> first_republished_;  // GUARDED_BY(takeover_mu_) … and its first re-published result
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  bool http_started_ = false;                // Run's thread: a standby's server runs from before its wait
  std::atomic<bool> publishing_{false};      // courier_ and ledger_ set (the HTTP thread reads them after)
  std::atomic<bool> placed_{false};          // placement_ set
  // A warm standby (set_warm_standby): the gate its readers pass before the takeover. streams_ is complete
  // before gate_ is set (FollowMirrored reads it once it sees the gate).
  bool warm_ = false, warm_cameras_ = false;
  std::mutex gate_mu_;  // gate_'s set-up against FollowMirrored
  std::unique_ptr<StandbyGate> gate_;
  int http_port_ = 0;
  // Edge-wide metric handles, looked up once (Run).
  struct Stages {
    metrics::Histogram *decode, *queue, *preprocess, *inference, *postprocess, *rules, *publish, *frame_to_ack, *mirror;
  } stages_{};
  metrics::Counter* engine_busy_ = nullptr;
  metrics::Histogram* batch_frames_ = nullptr;
  metrics::Histogram* frame_to_detection_ = nullptr;
  metrics::Gauge *batcher_depth_ = nullptr, *outbox_depth_ = nullptr, *streams_active_ = nullptr, *connected_ = nullptr;
  std::mutex link_metrics_mu_;
  transport::CourierStats last_courier_;  // GUARDED_BY(link_metrics_mu_) at the last SampleLinks
  transport::CudaIpcCounters last_ring_;   // GUARDED_BY(link_metrics_mu_) at the last SampleLinks
  transport::UcxCounters last_ucx_;         // GUARDED_BY(link_metrics_mu_) at the last SampleLinks
  std::map<std::string, std::string> link_transports_;  // GUARDED_BY(link_metrics_mu_) link → transports shown
  metrics::Gauge* epoch_gauge_ = nullptr;
  metrics::Gauge* fenced_gauge_ = nullptr;
  metrics::Counter* rejected_ = nullptr;
};

video::SourceOptions Edge::SourceOptionsOf(size_t index) const {
  const StreamConfig& sc = config_.streams[index];
  video::SourceOptions so;
  so.uri = sc.source;
  so.stream_id = sc.id;
  so.realtime = sc.realtime;
  so.loop = sc.loop;
  so.target_fps = sc.target_fps;
  so.hwaccel = stream_hwaccel_[index];
  // Frames decoded on the GPU of the stream's Detectors stay there (NV12 into the GPU letterbox);
  // save_frames needs host pixels, so such a stream gets host frames.
  const int gpu = device_gpu_[pool_->device_of(index)];
  const StatusOr<std::optional<int>> decode_gpu = video::ParseHwaccel(so.hwaccel);
  so.deliver_device_frames = gpu >= 0 && decode_gpu.ok() && *decode_gpu == gpu && sc.save_frames.empty();
  return so;
}

Status Edge::OpenStreams() {
  for (const StreamConfig& sc : config_.streams) {
    Stream s;
    s.config = sc;
    const metrics::Labels labels{{"stream", sc.id}};
    s.frames_total = &reg_.GetCounter("vigil_edge_frames_total", "Frames processed and reported", labels);
    s.errors_total = &reg_.GetCounter("vigil_edge_stream_errors_total", "Streams that failed to open or ended with an error", labels);
    s.decode_errors = &reg_.GetCounter("vigil_edge_decode_errors_total", "Corrupt packets, frames or images, per stream", labels);
    s.reconnects = &reg_.GetCounter("vigil_edge_reconnects_total", "Successful reconnects of network sources", labels);
    s.lost_on_restart = &reg_.GetCounter("vigil_edge_frames_lost_on_restart_total",
                                         "Seqs a previous instance numbered and never delivered (reported as lost)", labels);
    s.mirrored = &reg_.GetCounter("vigil_edge_mirror_frames_total",
                                  "Live pictures mirrored for the standby (replication.mirror_frames): as JPEG on the channel (sent to "
                                  "a paired one, kept until acknowledged for one that pairs later), or raw into a same-host standby's "
                                  "ring (mirror_via shm)", labels);
    s.mirrored_bytes = &reg_.GetCounter("vigil_edge_mirror_bytes_total",
                                        "Bytes of the live pictures mirrored: JPEG, or raw pixels into the ring", labels);
    s.mirror_skipped = &reg_.GetCounter(
        "vigil_edge_mirror_frames_skipped_total",
        "Live pictures not mirrored: the picture did not encode, its JPEG is larger than the channel carries, or the "
        "standby's ring had no free slot or too small a slot",
        labels);
    s.unpaired_evicted = &reg_.GetCounter(
        "vigil_edge_mirror_unpaired_evicted_total",
        "Live pictures kept raw while no standby was paired, dropped for room (mirror_window) before they were stored",
        labels);
    s.replayed = &reg_.GetCounter("vigil_edge_takeover_replayed_frames_total",
                                  "The old primary's mirrored frames the aggregator lacked, taken over after a takeover: "
                                  "processed again, or re-published from its mirrored results",
                                  labels);
    s.republished = &reg_.GetCounter("vigil_edge_takeover_republished_results_total",
                                     "Of the frames taken over, those whose detections were re-published from the old "
                                     "primary's mirrored results (replication.mirror_results) instead of processed again",
                                     labels);
    s.results_mirrored = &reg_.GetCounter("vigil_edge_mirror_results_total",
                                          "Processed live pictures whose detections were handed to the replication channel "
                                          "(replication.mirror_results; kept until stored, for a standby)",
                                          labels);
    for (size_t r = 0; r < std::size(kDropReasons); ++r) {
      s.dropped[r] = &reg_.GetCounter("vigil_edge_frames_dropped_total", "Frames numbered but not processed, by reason",
                                      {{"stream", sc.id}, {"reason", kDropReasons[r]}});
    }
    for (transport::Severity sev : {transport::Severity::kNone, transport::Severity::kInfo, transport::Severity::kWarning,
                                    transport::Severity::kCritical}) {
      s.events[static_cast<int>(sev)] = &reg_.GetCounter(
          "vigil_edge_events_total", "Events raised", {{"stream", sc.id}, {"severity", std::string(transport::ToString(sev))}});
    }
    s.fps = &reg_.GetGauge("vigil_edge_fps", "Frames processed per second, per stream", labels);
    s.reader_depth = &reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue",
                                    {{"queue", "reader"}, {"stream", sc.id}});
    video::SourceOptions so = SourceOptionsOf(streams_.size());
    if (!sc.save_frames.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(sc.save_frames, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            StrCat("stream '", sc.id, "': save_frames ", sc.save_frames, ": cannot create the folder: ", ec.message()));
      }
    }
    s.live = video::IsLiveUri(sc.source);
    StatusOr<std::unique_ptr<video::Source>> source = video::OpenSource(std::move(so));
    if (!source.ok()) {
      spdlog::error("{}", std::string(source.status().message()));  // the message names the stream
      s.errors_total->Inc();
    } else {
      s.live = (*source)->live();
      s.source = std::move(*source);
    }
    streams_.push_back(std::move(s));
  }
  std::lock_guard lock(mirror_mu_);
  unpaired_.resize(streams_.size());
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<std::shared_ptr<transport::Link>>> MakeEdgeLinks(const EdgeConfig& config) {
  std::string key;
  if (!config.key_file.empty()) {
    VIGIL_ASSIGN_OR_RETURN(key, transport::ReadKeyFile(config.key_file));
  } else if (const char* env = std::getenv("VIGIL_EDGE_KEY"); env != nullptr && *env != '\0') {
    VIGIL_ASSIGN_OR_RETURN(key, transport::ParseHexKey(env, "environment variable VIGIL_EDGE_KEY"));
  } else {
    spdlog::warn("edge '{}': no key (transport.key_file or VIGIL_EDGE_KEY): the links carry no proof, and this edge "
                 "cannot tell the aggregator from an impostor",
                 config.edge);
  }
  std::vector<std::shared_ptr<transport::Link>> links;
  for (const std::string& kind : config.links) {
    if (kind == "tcp") {
      std::unique_ptr<transport::Dialer> dialer = transport::MakeTcpDialer(config.aggregator_host, config.aggregator_port);
      if (config.tls) {
        transport::TlsOptions to;
        to.ca_file = config.tls_ca_file;
        to.cert_file = config.tls_cert_file;
        to.key_file = config.tls_key_file;
        to.server_name = config.tls_server_name;
        VIGIL_ASSIGN_OR_RETURN(std::shared_ptr<transport::TlsContext> tls, transport::TlsContext::Client(to));
        dialer = transport::MakeTlsDialer(std::move(dialer), std::move(tls), config.tls_server_name);
      }
      links.push_back(transport::MakeFramedLink(std::move(dialer), {"tcp", key}));
    } else if (kind == "ucx") {
#if !VIGIL_HAVE_UCX
      return absl::UnimplementedError("transport.links: ucx: this vigil was built without UCX (Debian libucx-dev)");
#endif
      const std::string host = config.ucx_host.empty() ? config.aggregator_host : config.ucx_host;
      links.push_back(transport::MakeFramedLink(transport::MakeUcxDialer(host, config.ucx_port, {}), {"ucx", key}));
    } else if (kind == "cuda_ipc") {
      // Ring slots are written from the edge's first GPU (where its detections are); -1: the ring's GPU.
      int device = -1;
      for (const std::string& d : config.devices) {
        if (device < 0) device = CudaOrdinal(d);
      }
      links.push_back(transport::MakeCudaIpcLink(config.cuda_ipc_socket, key, device,
                                                     static_cast<uint32_t>(config.cuda_ipc_linger_us)));
    } else {
      return absl::InvalidArgumentError(StrCat("transport.links: unknown link '", kind, "'"));
    }
  }
  return links;
}

WorkerPoolOptions EdgeWorkerOptions(const EdgeConfig& config, const std::function<bool()>& symbolic_batch, int cores) {
  WorkerPoolOptions wo;
  wo.model_path = config.model_path;
  wo.detector.engine.threads = config.threads;
  if (StatusOr<infer::Precision> p = infer::ParsePrecision(config.precision); p.ok()) wo.detector.engine.precision = *p;
  if (StatusOr<infer::Int8Activations> a = infer::ParseInt8Activations(config.int8_activations); a.ok()) {
    wo.detector.engine.int8_activations = *a;
  }
  wo.detector.engine.batch = config.model_batch;
  const bool all_gpus = std::all_of(config.devices.begin(), config.devices.end(),
                                    [](const std::string& d) { return CudaOrdinal(d) >= 0; });
  // On GPUs a model with a symbolic batch runs the cross-stream batches whole: one engine run per batch, not
  // one per frame (a fixed batch stays the model's). A partial batch is padded, which a GPU absorbs; on the
  // CPU padding costs in proportion, so there the engine batch stays 1 unless model.batch says.
  if (config.model_batch == 0 && config.max_batch > 1 && all_gpus && symbolic_batch()) {
    wo.detector.engine.batch = config.max_batch;
  }
  wo.detector.conf = static_cast<float>(config.conf);
  wo.detector.iou = static_cast<float>(config.iou);
  wo.detector.max_det = config.max_det;
  wo.devices = config.devices;
  wo.workers_per_device = config.workers_per_device > 0 ? config.workers_per_device : all_gpus ? 2 : 1;
  if (config.threads == 0 && wo.workers_per_device > 1 &&
      std::find(config.devices.begin(), config.devices.end(), "cpu") != config.devices.end()) {
    // Several CPU Detectors share the cores: each takes its part instead of all of them (oversubscribed
    // OpenMP teams spin against each other).
    wo.detector.engine.threads = std::max(1, std::max(cores, 1) / wo.workers_per_device);
  }
  wo.max_batch = static_cast<size_t>(config.max_batch);
  wo.max_wait = milliseconds(config.max_wait_ms);
  wo.streams = std::max<size_t>(config.streams.size(), 1);
  for (const StreamDevice& sd : AssignStreamDevices(config)) wo.stream_device.push_back(sd.device);
  if (wo.stream_device.empty()) wo.stream_device.push_back(0);
  // Links that can send rows from GPU memory (cuda_ipc; ucx where UCX has CUDA transports): GPU detectors
  // keep each batch's rows there too (one device-to-device copy per batch); every other link sends the host
  // copy the rules read anyway.
  wo.keep_device_rows = std::any_of(config.links.begin(), config.links.end(),
                                    [](const std::string& l) { return l == "cuda_ipc" || l == "ucx"; });
  // Streams with snapshots keep their pictures until the sink hands an event's frame to the Snapshotter.
  for (const StreamConfig& sc : config.streams) wo.keep_pictures.push_back(sc.snapshots.enabled);
  return wo;
}

namespace {

void Edge::AssignDevices() {
  for (StreamDevice& sd : AssignStreamDevices(config_)) {  // the device itself: pool_->device_of
    stream_hwaccel_.push_back(std::move(sd.hwaccel));
  }
}

// The Detectors, per device, after FFmpeg holds the decoding GPUs' contexts.
Status Edge::LoadWorkers() {
  // Streams decoded by NVDEC: FFmpeg must make each GPU's primary CUDA context (with its flags) before the
  // model's CUDA runtime touches that GPU; the runtime then shares it (video::RetainCudaDecodeDevice).
  std::set<int> decode_gpus, held_gpus;
  for (const std::string& hw : stream_hwaccel_) {
    if (StatusOr<std::optional<int>> d = video::ParseHwaccel(hw); d.ok() && *d) decode_gpus.insert(**d);
  }
  for (int gpu : decode_gpus) {
    StatusOr<std::shared_ptr<void>> held = video::RetainCudaDecodeDevice(gpu);
    if (held.ok()) {
      decode_devices_.push_back(std::move(*held));
      held_gpus.insert(gpu);
    } else {
      spdlog::warn("hwaccel: {}; its streams decode on the CPU", std::string(held.status().message()));
    }
  }
  // The model file is read for its batch dimension only when the answer changes the engine batch.
  const auto symbolic_batch = [&] {
    StatusOr<infer::ModelSummary> m = infer::InspectModel(config_.model_path);
    return m.ok() && !m->inputs.empty() && !m->inputs[0].dims.empty() && m->inputs[0].dims[0].value <= 0;
  };
  WorkerPoolOptions wo =
      EdgeWorkerOptions(config_, symbolic_batch, static_cast<int>(std::thread::hardware_concurrency()));
  VIGIL_ASSIGN_OR_RETURN(pool_, WorkerPool::Load(std::move(wo)));
  device_gpu_.assign(config_.devices.size(), -1);
  for (size_t w = 0; w < pool_->num_workers(); ++w) {
    const detect::Detector& d = pool_->detector(w);
    if (d.uses_gpu_stages() && held_gpus.count(d.engine().device_io()->device) > 0) {
      device_gpu_[pool_->worker_device(w)] = d.engine().device_io()->device;
    }
  }
  spdlog::info("edge '{}': {} worker(s) on each of {}", config_.edge, pool_->num_workers() / pool_->num_devices(),
               fmt::join(config_.devices, ", "));
  return absl::OkStatus();
}

Status Edge::OpenLedger(const std::vector<std::string>& names) {
  LedgerOptions lo;
  VIGIL_ASSIGN_OR_RETURN(lo.store, OpenStateDir(config_.state_dir));
  if (replication::PrimaryChannel* ch = primary_channel_.load()) lo.store = MirroringStore(std::move(lo.store), ch, &mirror_mu_);
  lo.max_outbox = static_cast<size_t>(config_.max_outbox);
  lo.progress_flush = milliseconds(config_.progress_flush_ms);
  std::vector<LedgerStream> specs;
  for (const StreamConfig& sc : config_.streams) {
    StatusOr<RuleEngine> rules = RuleEngine::Create(sc.rules, names);
    if (!rules.ok()) return Annotate(rules.status(), "stream '" + sc.id + "'");
    // Network sources (and live synthetic ones) are live: numbered after the high-water mark, never wait on
    // the outbox.
    specs.push_back({sc.id, sc.source, video::IsLiveUri(sc.source), std::move(*rules), std::nullopt});
  }
  if (window_) {
    // A standby's mirrored pictures of the run its last mirrored ledger state names (the state its store holds):
    // the ledger decides at Admit which the aggregator still lacks (StreamResume::replay), and takes them only
    // for the run it resumes.
    for (LedgerStream& spec : specs) {
      if (spec.live) spec.mirrored = window_->Held(spec.id);
    }
  }
  VIGIL_ASSIGN_OR_RETURN(ledger_, StreamLedger::Open(std::move(lo), std::move(specs)));
  return absl::OkStatus();
}

Status Edge::StartCourier() {
  transport::CourierOptions co;
  co.edge = config_.edge;
  // A Hello waits behind the reports queued at a busy aggregator before it is granted: give the Welcome time.
  co.connect_timeout = milliseconds(10000);
  co.probe_interval = milliseconds(config_.probe_interval_ms);
  co.ack_timeout = milliseconds(config_.ack_timeout_ms);
  VIGIL_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<transport::Link>> links, MakeEdgeLinks(config_));
  co.links = std::move(links);
  VIGIL_ASSIGN_OR_RETURN(courier_, transport::Courier::Start(std::move(co), &ledger_->outbox(), this));
  if (std::any_of(config_.streams.begin(), config_.streams.end(), [](const StreamConfig& sc) {
        return sc.snapshots.enabled;
      })) {
    snapshotter_ = std::make_unique<Snapshotter>(
        static_cast<size_t>(config_.snapshot_queue),
        [this](transport::Snapshot snap) { return courier_->OfferSnapshot(std::move(snap)); },
        [this](size_t stream, const char* outcome, uint64_t n) {
          reg_.GetCounter("vigil_edge_snapshots_total",
                          "Event pictures (snapshots): sent to the link, or why not (per event for queue_full)",
                          {{"stream", config_.streams[stream].id}, {"result", outcome}})
              .Inc(static_cast<double>(n));
        });
  }
  return absl::OkStatus();
}

// Lets the queued pictures go out before the courier closes (within `until`); what is left is counted dropped.
void Edge::FlushSnapshots(std::chrono::steady_clock::time_point until) {
  if (!snapshotter_) return;
  const auto left = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now()).count()));
  };
  snapshotter_->WaitIdle(left());
  snapshotter_->Close();
  while (courier_->Stats().snapshots_queued > 0 && courier_->Stats().connected && left() > 0) {
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// Waits for the aggregator to admit this instance (its epoch decides new runs). False: stopped or fenced.
bool Edge::WaitAdmitted() {
  spdlog::info("edge '{}': waiting for the aggregator at {}:{} to admit this instance", config_.edge,
               config_.aggregator_host, config_.aggregator_port);
  int64_t next_note = SteadyNs() + 10'000'000'000;
  while (!ledger_->WaitAdmitted(milliseconds(100))) {
    if (Stopping()) return false;
    if (SteadyNs() >= next_note) {
      const transport::CourierStats cs = courier_->Stats();
      spdlog::warn("edge '{}': still not admitted by the aggregator at {}:{} ({}); streams wait", config_.edge,
                   config_.aggregator_host, config_.aggregator_port, cs.last_error.empty() ? "no answer" : cs.last_error);
      next_note = SteadyNs() + 30'000'000'000;
    }
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    s.run = ledger_->run(i);
    const StreamResume r = ledger_->resume(i);
    s.lost_on_restart->Inc(static_cast<double>(r.lost));
    if (window_ && s.live) {
      // The old primary's pictures the aggregator lacks: Feed processes them before the camera's next ones.
      s.replay = window_->Take(s.config.id, s.run, r.replay);
      s.replayed->Inc(static_cast<double>(r.replay.size()));
      // This node's own standby (once one pairs) needs those the aggregator has not stored yet as much as this
      // node did: kept raw like this primary's own pictures (no work on the takeover's path). (A re-published
      // result goes to that standby as this node's own result: RecordFrame.)
      if (!s.replay.empty() && primary_channel_.load() != nullptr && config_.replication.mirror_frames) {
        std::lock_guard lock(mirror_mu_);
        for (const replication::MirroredFrame& m : s.replay) {
          if (m.has_picture()) unpaired_[i].push_back(m);
        }
      }
      if (!r.replay.empty()) {
        const size_t with_results = static_cast<size_t>(
            std::count_if(s.replay.begin(), s.replay.end(), [](const auto& m) { return m.result.has_value(); }));
        spdlog::warn("stream '{}': processing {} mirrored picture(s) of the old primary again (seqs {}..{}): {} with "
                     "the old primary's own results to re-publish, {} to run again",
                     s.config.id, r.replay.size(), r.replay.front(), r.replay.back(), with_results,
                     s.replay.size() - with_results);
      }
    }
  }
  return !fenced_.load();
}

void Edge::Place() {
  std::vector<video::Source::Probe> probed;
  for (const Stream& s : streams_) probed.push_back(s.source ? s.source->probed() : video::Source::Probe{});
  double gflop = config_.placement.gflop_per_frame;
  if (gflop <= 0) {
    gflop = ModelGflopsPerFrame(pool_->detector().engine().graph());
    spdlog::info("placement: model cost {:.2f} GFLOP per frame (counted from the model)", gflop);
  }
  std::vector<std::string> notes;
  std::vector<topology::StreamSpec> specs = PlanStreams(config_, probed, gflop, &notes);
  for (const std::string& n : notes) spdlog::info("placement: {}", n);
  // On one GPU, the plan keeps that GPU: threads (and the staging the workers allocate) on its node; on
  // several, every GPU of the machine.
  std::set<int> gpus;
  for (size_t w = 0; w < pool_->num_workers(); ++w) {
    const detect::Detector& d = pool_->detector(w);
    if (d.uses_gpu_stages()) gpus.insert(d.engine().device_io()->device);
  }
  placement_ = std::make_unique<EdgePlacement>(config_.placement, specs, /*use_gpus=*/!gpus.empty(), config_.state_dir,
                                               gpus.size() == 1 ? *gpus.begin() : -1);
  placed_.store(true, std::memory_order_release);
}

video::StreamReaderOptions Edge::ReaderOptionsOf(size_t i, bool gated) {
  video::StreamReaderOptions ro;
  ro.queue_capacity = static_cast<size_t>(std::max(4, config_.max_batch));
  ro.on_thread_start = [this, i] { placement_->PlaceThread(ThreadRole::kDecode, i); };
  // The ledger numbers every picture the Source delivers (and skips those a resumed file delivered); a warm
  // standby's picture passes its gate first (held or discarded until the takeover).
  ro.on_frame = [this, i, gated](video::Frame& f) {
    if (gated && gate_->Admit(i, streams_[i].live, f.seq) != StandbyGate::Verdict::kPass) return false;
    uint64_t seq = 0;
    // A standby on this host with a ring mapped (mirror_via shm) gets the raw picture: numbered and written to
    // the ring under mirror_mu_, like the channel's JPEG below.
    video::Frame downloaded;
    if (const video::Frame* raw = RawForRing(i, f, &downloaded)) {
      std::lock_guard lock(mirror_mu_);
      if (!ledger_->Number(i, f.seq, &seq)) return false;
      replication::MirroredFrame m;
      m.stream = streams_[i].config.id;
      m.run = streams_[i].run;
      m.seq = seq;
      m.capture_ns = f.capture_time_ns;
      m.pts_ns = f.pts_ns;
      m.width = static_cast<uint32_t>(raw->width);
      m.height = static_cast<uint32_t>(raw->height);
      WriteToRing(i, m, raw->bgr.data(), static_cast<size_t>(raw->stride), raw->device ? &*raw->device : nullptr);
      f.seq = seq;
      f.run = streams_[i].run;
      return true;
    }
    // A primary with a standby paired mirrors each live picture: encoded first (outside any lock), then numbered
    // and queued on the channel under mirror_mu_, which the ledger's mirrored states also take — so no state
    // that counts this seq reaches the standby before its picture.
    std::optional<replication::MirroredFrame> picture = MirrorPicture(i, f);
    if (!picture && Unpaired(i)) {
      // No standby paired: the picture kept raw (one copy, no encode) until stored, for one that pairs.
      std::optional<replication::MirroredFrame> raw = RawCopy(i, f);
      std::lock_guard lock(mirror_mu_);
      if (!ledger_->Number(i, f.seq, &seq)) return false;
      if (raw) {
        raw->run = streams_[i].run;
        raw->seq = seq;
        std::deque<replication::MirroredFrame>& kept = unpaired_[i];
        kept.push_back(std::move(*raw));
        while (kept.size() > static_cast<size_t>(std::max(1, config_.replication.mirror_window))) {
          kept.pop_front();
          streams_[i].unpaired_evicted->Inc();
        }
      }
      f.seq = seq;
      f.run = streams_[i].run;
      return true;
    }
    if (picture) {
      std::lock_guard lock(mirror_mu_);
      if (!ledger_->Number(i, f.seq, &seq)) return false;
      picture->run = streams_[i].run;
      picture->seq = seq;
      const double bytes = static_cast<double>(picture->jpeg.size());
      if (primary_channel_.load()->MirrorFrame(std::move(*picture))) {
        streams_[i].mirrored->Inc();
        streams_[i].mirrored_bytes->Inc(bytes);
      } else {
        streams_[i].mirror_skipped->Inc();  // larger than the channel carries
      }
    } else if (!ledger_->Number(i, f.seq, &seq)) {
      return false;
    }
    f.seq = seq;
    f.run = streams_[i].run;
    return true;
  };
  ro.on_drop = [this, i](const video::Frame& f, video::DropReason why) {
    // A live frame that will never be processed travels as a drop mark; a file's unprocessed frame is
    // re-read after a restart (it lies after the acknowledged cursor), so it is not marked.
    if (streams_[i].live) {
      // queue_full drops are counted from the reader's stats (Periodic); a stop's here.
      if (why != video::DropReason::kQueueFull) Dropped(streams_[i], "shutdown").Inc();
      ledger_->Dropped(i, f.seq, why == video::DropReason::kQueueFull ? "queue_full" : "shutdown");
    }
  };
  return ro;
}

const video::Frame* Edge::RawForRing(size_t i, const video::Frame& f, video::Frame* downloaded) {
  Stream& s = streams_[i];
  replication::FramePublisher* ring = frame_publisher_.load();
  if (!s.live || !config_.replication.mirror_frames || ring == nullptr || !ring->active()) return nullptr;
  // A picture larger than the standby's slots goes over the channel as a JPEG (said once per stream).
  const bool nv12 = f.device && ring->in_gpu_memory();
  const size_t w = static_cast<size_t>(f.width), h = static_cast<size_t>(f.height);
  const size_t need = nv12 ? replication::PackedNv12Bytes(w, h) : w * h * 3;
  const size_t room = ring->slot_capacity();
  if (room == 0) return nullptr;  // the ring went away since active(): the channel's path takes the picture
  if (need > room) {
    if (!std::exchange(s.ring_size_logged, true)) {
      spdlog::error("stream '{}': its {}x{} pictures ({} bytes) do not fit the standby's ring slots ({} bytes: raise "
                    "replication.mirror_slot_mb on the standby to at least {}); they go over the channel as JPEGs",
                    s.config.id, w, h, need, room, (need + 4096 + (1u << 20) - 1) >> 20);
    }
    return nullptr;
  }
  if (!f.device || nv12) return &f;  // a GPU picture into a GPU ring: device to device
  *downloaded = f;  // shares the GPU picture; the download fills a host copy
  if (Status st = video::DownloadBgr(*downloaded); !st.ok()) {
    s.mirror_skipped->Inc();
    if (!std::exchange(s.mirror_error_logged, true)) {
      spdlog::error("stream '{}': a picture cannot be mirrored to the standby: {}", s.config.id,
                    std::string(st.message()));
    }
    return nullptr;  // the channel's path tries (and counts) it
  }
  return downloaded;
}

void Edge::WriteToRing(size_t i, const replication::MirroredFrame& m, const uint8_t* bgr, size_t stride,
                       const video::DeviceFrame* device) {
  Stream& s = streams_[i];
  const int64_t t0 = SteadyNs();
  Status st;
  double bytes = static_cast<double>(stride) * m.height;
  if (device != nullptr) {
    replication::FramePublisher::DevicePicture p;
    p.device = device->device;
    p.y = device->y;
    p.uv = device->uv;
    p.y_pitch = static_cast<size_t>(device->y_pitch);
    p.uv_pitch = static_cast<size_t>(device->uv_pitch);
    p.matrix = static_cast<int>(device->matrix);
    p.full_range = device->full_range;
    st = frame_publisher_.load()->WriteDevice(m, p);
    bytes = static_cast<double>(m.width) * m.height * 1.5;
  } else {
    st = frame_publisher_.load()->Write(m, bgr, stride);
  }
  stages_.mirror->Observe(static_cast<double>(SteadyNs() - t0) * 1e-9);
  if (st.ok()) {
    s.mirrored->Inc();
    s.mirrored_bytes->Inc(bytes);
    return;
  }
  // Not mirrored (counted): a standby behind (every slot unread), gone, or a picture larger than its slots. A
  // takeover reports such a seq lost if the aggregator never stored it.
  s.mirror_skipped->Inc();
  // A full ring (the standby behind) and a session that ended (the ring's own log says so) are not this stream's
  // errors; a picture that does not fit, or a failed copy, is — logged once per stream.
  if (!absl::IsResourceExhausted(st) && !absl::IsUnavailable(st) && !std::exchange(s.mirror_error_logged, true)) {
    spdlog::error("stream '{}': a picture is not mirrored to the standby's ring: {}", s.config.id,
                  std::string(st.message()));
  }
}

bool Edge::Unpaired(size_t i) const {
  replication::PrimaryChannel* ch = primary_channel_.load();
  return streams_[i].live && config_.replication.mirror_frames && ch != nullptr && !ch->stats().standby_connected;
}

// `f`'s identity and times as a MirroredFrame of `stream` (pixels, run and seq left to the caller).
replication::MirroredFrame MirroredOf(const std::string& stream, const video::Frame& f) {
  replication::MirroredFrame m;
  m.stream = stream;
  m.capture_ns = f.capture_time_ns;
  m.pts_ns = f.pts_ns;
  m.width = static_cast<uint32_t>(f.width);
  m.height = static_cast<uint32_t>(f.height);
  return m;
}

std::optional<replication::MirroredFrame> Edge::RawCopy(size_t i, const video::Frame& f) {
  Stream& s = streams_[i];
  replication::MirroredFrame m = MirroredOf(s.config.id, f);
  const size_t w = m.width, h = m.height;
  const int64_t t0 = SteadyNs();
  Status st;
  if (f.device) {
    const video::DeviceFrame& d = *f.device;
    const size_t bytes = replication::PackedNv12Bytes(w, h), uv_row = 2 * ((w + 1) / 2);
    StatusOr<std::unique_ptr<transport::device_memory::Buffer>> buf =
        transport::device_memory::AllocatePooled(d.device, bytes);
    st = buf.status();
    if (st.ok()) {
      uint8_t* dst = static_cast<uint8_t*>((*buf)->data());
      st = transport::device_memory::Copy2D(dst, w, d.y, static_cast<size_t>(d.y_pitch), w, h, d.device);
      if (st.ok()) {
        st = transport::device_memory::Copy2D(dst + w * h, uv_row, d.uv, static_cast<size_t>(d.uv_pitch), uv_row,
                                              (h + 1) / 2, d.device);
      }
    }
    if (st.ok()) {
      auto pic = std::make_shared<replication::MirroredGpuPicture>();
      pic->device = d.device;
      pic->data = static_cast<const uint8_t*>((*buf)->data());
      pic->bytes = bytes;
      pic->matrix = static_cast<int>(d.matrix);
      pic->full_range = d.full_range;
      pic->owner = std::shared_ptr<transport::device_memory::Buffer>(std::move(*buf));
      m.gpu = std::move(pic);
    }
  } else {
    m.stride = static_cast<uint32_t>(w * 3);
    m.bgr.resize(size_t{m.stride} * h);
    for (size_t y = 0; y < h; ++y) {
      std::memcpy(m.bgr.data() + y * m.stride, f.bgr.data() + y * static_cast<size_t>(f.stride), m.stride);
    }
  }
  stages_.mirror->Observe(static_cast<double>(SteadyNs() - t0) * 1e-9);  // this primary's mirroring cost now
  if (st.ok()) return m;
  s.mirror_skipped->Inc();
  if (!std::exchange(s.mirror_error_logged, true)) {
    spdlog::error("stream '{}': a picture cannot be kept for a standby: {}", s.config.id, std::string(st.message()));
  }
  return std::nullopt;
}

// A live picture as the standby gets it (seq and run set by the caller), when this edge is a primary mirroring
// frames; nullopt otherwise. A picture that cannot be encoded is counted (mirror_skipped) and logged once per
// stream.
std::optional<replication::MirroredFrame> Edge::MirrorPicture(size_t i, const video::Frame& f) {
  Stream& s = streams_[i];
  replication::PrimaryChannel* ch = primary_channel_.load();
  if (!s.live || !config_.replication.mirror_frames || ch == nullptr) return std::nullopt;
  // Only while a standby is paired. Encoding every picture for one that may pair later cost a primary left
  // alone (its standby killed and restarting) a download and a JPEG encode per 1080p picture, ~15 ms of CPU:
  // at 32 cameras the whole machine, its inference starved for seconds (H200 run of issue 17). Unpaired, the
  // reader keeps the picture raw instead (RawCopy, unpaired_); a standby that pairs gets those still unstored
  // within a Periodic (MirrorKept): a kill in that ~100 ms reports their seqs lost.
  if (!ch->stats().standby_connected) return std::nullopt;
  const int64_t t0 = SteadyNs();
  StatusOr<std::string> jpeg = absl::InternalError("not encoded");
  if (f.device) {
    video::Frame host = f;  // shares the GPU picture; the download fills a host copy
    Status st = video::DownloadBgr(host);
    jpeg = st.ok() ? video::EncodeJpeg(host, config_.replication.jpeg_quality) : StatusOr<std::string>(st);
  } else {
    jpeg = video::EncodeJpeg(f, config_.replication.jpeg_quality);
  }
  if (!jpeg.ok()) {
    s.mirror_skipped->Inc();
    if (!std::exchange(s.mirror_error_logged, true)) {
      spdlog::error("stream '{}': a picture cannot be mirrored to the standby: {}", s.config.id,
                    std::string(jpeg.status().message()));
    }
    return std::nullopt;
  }
  stages_.mirror->Observe(static_cast<double>(SteadyNs() - t0) * 1e-9);
  replication::MirroredFrame m = MirroredOf(s.config.id, f);
  m.jpeg = std::move(*jpeg);
  return m;
}

// A warm standby, before after_load: every opened stream is read through the gate.
void Edge::StartFollowing() {
  {
    std::lock_guard lock(gate_mu_);
    gate_ = std::make_unique<StandbyGate>(streams_.size());
  }
  size_t files = 0, cameras = 0;
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    if (!s.source || (s.live && !warm_cameras_)) continue;  // a camera connects in its reader's first Next()
    (s.live ? cameras : files) += 1;
    s.read = s.source.get();
    s.reader = std::make_unique<video::StreamReader>(std::move(s.source), ReaderOptionsOf(i, /*gated=*/true));
  }
  spdlog::info("edge '{}' (standby): reading {} file stream(s) up to the primary's mirrored cursor and {} camera(s) "
               "while it waits",
               config_.edge, files, cameras);
}

// A standby's engines are loaded before it waits; their first run still creates what runs lazily (oneDNN's
// kernels, cuDNN's workspaces, CUDA graphs per batch size), which would otherwise land on the takeover's first
// frame. A mid-grey picture of the model's input size, alone and as a full batch, through each worker.
void Edge::WarmUpEngines() {
  const int64_t t0 = SteadyNs();
  for (size_t w = 0; w < pool_->num_workers(); ++w) {
    const detect::Detector& d = pool_->detector(w);
    detect::Image grey;
    grey.width = static_cast<int>(std::max<int64_t>(d.model().width, 32));
    grey.height = static_cast<int>(std::max<int64_t>(d.model().height, 32));
    grey.bgr.assign(static_cast<size_t>(grey.width) * grey.height * 3, 114);
    const std::vector<detect::Image> batch(static_cast<size_t>(std::max(1, config_.max_batch)), grey);
    auto run = [&](size_t n) {
      if (auto r = d.Detect(std::span<const detect::Image>(batch.data(), n)); !r.ok()) {
        spdlog::warn("edge '{}': warming worker {} up with {} picture(s) failed: {}", config_.edge, w, n,
                     std::string(r.status().message()));
      }
    };
    run(1);
    if (batch.size() > 1) run(batch.size());
    // A worker that reads NVDEC pictures in place runs them through other kernels (NV12 letterbox, the rows kept
    // on the device): those too, so a takeover's first batch of camera pictures loads nothing.
    if (const int gpu = device_gpu_[pool_->worker_device(w)]; gpu >= 0) {
      constexpr size_t kW = 1280, kH = 720;
      const size_t bytes = replication::PackedNv12Bytes(kW, kH);
      StatusOr<std::unique_ptr<transport::device_memory::Buffer>> buf = transport::device_memory::Allocate(gpu, bytes);
      const std::vector<uint8_t> mid_grey(bytes, 128);
      Status st = buf.ok() ? transport::device_memory::Copy2D((*buf)->data(), bytes, mid_grey.data(), bytes, bytes, 1, gpu)
                           : buf.status();
      if (st.ok()) {
        detect::FrameRef f;
        f.bgr = static_cast<const uint8_t*>((*buf)->data());
        f.width = static_cast<int>(kW);
        f.height = static_cast<int>(kH);
        f.pitch = static_cast<int64_t>(kW);
        f.memory = detect::FrameMemory::kDevice;
        f.format = detect::PixelFormat::kNv12;
        f.uv = f.bgr + kW * kH;
        f.uv_pitch = static_cast<int64_t>(kW);
        const std::vector<detect::FrameRef> frames(batch.size(), f);
        std::vector<detect::DeviceRows> kept;
        st = d.DetectFrames(frames, nullptr, &kept).status();
      }
      if (!st.ok()) {
        spdlog::warn("edge '{}': warming worker {} up with NV12 pictures on cuda:{} failed: {}", config_.edge, w, gpu,
                     std::string(st.message()));
      }
    }
  }
  spdlog::info("edge '{}': {} worker engine(s) warmed up in {} ms", config_.edge, pool_->num_workers(),
               (SteadyNs() - t0) / 1'000'000);
}

void Edge::StartReaders() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    const StreamResume r = ledger_->resume(i);
    if (s.reader && gate_ && !s.live) {
      // Read while this node was the standby: it resumes at the gate's position, which must not lie after the
      // first picture the aggregator lacks (it can, if the aggregator lost what it had acknowledged).
      const uint64_t resume_at = r.skip_through ? *r.skip_through + 1 : 0;
      const uint64_t at = gate_->next_position(i);
      if (at <= resume_at) {
        spdlog::info("stream '{}': resumes at position {} (read up to {} while standby; {} to skip)", s.config.id,
                     resume_at, at, resume_at - at);
      } else {
        spdlog::warn("stream '{}': the standby read up to position {} but the aggregator lacks {} on: reading the "
                     "input again from its start",
                     s.config.id, at, resume_at);
        gate_->Release(i);
        s.reader.reset();
        s.read = nullptr;
        StatusOr<std::unique_ptr<video::Source>> source = video::OpenSource(SourceOptionsOf(i));
        if (!source.ok()) {
          spdlog::error("{}", std::string(source.status().message()));
          s.errors_total->Inc();
          continue;
        }
        s.source = std::move(*source);
      }
    }
    if (!s.reader) {
      if (!s.source) continue;
      s.read = s.source.get();
      video::StreamReaderOptions ro = ReaderOptionsOf(i, /*gated=*/false);
      // A resumed file: what the ledger skips (reported already) is not paced in real time either.
      if (r.skip_through) s.read->DoNotPaceThrough(*r.skip_through);
      s.reader = std::make_unique<video::StreamReader>(std::move(s.source), ro);
      continue;
    }
    // Read while standby: its held picture was paced when it was decoded; the clock starts anew at the
    // takeover (a real-time file continues from now, the skipped pictures not paced).
    s.read->DoNotPaceThrough(r.skip_through.value_or(0));
  }
  if (gate_) gate_->Open();  // the ledger is admitted: held pictures go on to it
  timeline_.Mark(TakeoverTimeline::kResumed, SteadyNs());
}

// A standby just paired: the pictures this primary kept while it had none (its own and a takeover's replayed
// ones) that the aggregator has not stored yet, to its ring when one is mapped, else JPEG-encoded for the
// channel (~15 ms per 1080p picture: on its own thread, never on a reader's or the takeover's path).
void Edge::MirrorKept(std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> kept) {
  replication::PrimaryChannel* ch = primary_channel_.load();
  for (const auto& [i, frames] : kept) {
    Stream& s = streams_[i];
    for (const replication::MirroredFrame& m : frames) {
      if (Stopping() || ch == nullptr) return;
      if (const std::optional<uint64_t> stored = ledger_->acked_through(i); stored && *stored >= m.seq) continue;
      replication::FramePublisher* ring = frame_publisher_.load();
      if (ring != nullptr && ring->active() && (!m.bgr.empty() || (m.gpu && ring->in_gpu_memory()))) {
        const video::Frame g = m.gpu ? FrameOfGpu(m) : video::Frame{};
        std::lock_guard lock(mirror_mu_);
        WriteToRing(i, m, m.bgr.data(), m.stride, m.gpu ? &*g.device : nullptr);
        continue;
      }
      if (!ch->stats().standby_connected) {  // gone again: kept for the next one
        std::lock_guard lock(mirror_mu_);
        unpaired_[i].push_back(m);
        continue;
      }
      replication::MirroredFrame jpeg;
      if (m.jpeg.empty()) {  // a raw picture and no ring (or a host one) mapped now: the channel carries JPEGs
        video::Frame host = m.gpu ? FrameOfGpu(m) : FrameOfRaw(m);
        Status down = video::DownloadBgr(host);
        StatusOr<std::string> encoded =
            !down.ok() ? StatusOr<std::string>(down)
            : video::JpegAvailable() ? video::EncodeJpeg(host, config_.replication.jpeg_quality)
                                     : StatusOr<std::string>(absl::UnimplementedError("no libturbojpeg"));
        if (encoded.ok()) {
          jpeg = m;
          jpeg.bgr = {};
          jpeg.gpu.reset();
          jpeg.stride = 0;
          jpeg.jpeg = std::move(*encoded);
        }
      }
      const replication::MirroredFrame& out = m.jpeg.empty() ? jpeg : m;
      std::lock_guard lock(mirror_mu_);
      if (!out.jpeg.empty() && ch->MirrorFrame(out)) {
        s.mirrored->Inc();
        s.mirrored_bytes->Inc(static_cast<double>(out.jpeg.size()));
      } else {
        s.mirror_skipped->Inc();
      }
    }
  }
}

// A takeover's mirrored pictures (Stream::replay, seq order), decoded and pushed before the source's. One that
// does not decode becomes a drop mark (mirror_error): its seq was kept out of the lost ranges for it.
bool Edge::FeedReplay(size_t index) {
  Stream& s = streams_[index];
  std::vector<replication::MirroredFrame> replay = std::move(s.replay);
  s.replay.clear();
  size_t k = 0;
  uint64_t republished = 0;
  // The old primary's own results re-published (they need no engine), in seq order, as long as nothing of this
  // stream waits in the pool: the ledger takes a stream's frames in seq order. A result after a picture that must
  // run again (one the old primary dropped, or never processed) is re-published only when its picture is gone;
  // otherwise its picture runs again, behind the one before it.
  auto republish = [&](const replication::MirroredFrame& m) {
    std::vector<detect::Detection> dets;
    dets.reserve(m.result->detections.size());
    for (const replication::MirroredDetection& d : m.result->detections) {
      dets.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
    }
    const FrameInfo info{m.seq, m.result->capture_ns, m.result->pts_ns, m.result->width, m.result->height};
    if (timeline_.started() && republished == 0) {
      std::lock_guard lock(takeover_mu_);
      if (timeline_.Mark(TakeoverTimeline::kRepublished, SteadyNs())) {
        first_republished_ = FrameId{s.config.id, s.run, m.seq};
      }
    }
    RecordFrame(index, info, dets, nullptr, SteadyNs());
    ++republished;
  };
  for (; k < replay.size() && replay[k].result && !Stopping(); ++k) republish(replay[k]);
  for (; k < replay.size() && !Stopping(); ++k) {
    const replication::MirroredFrame& m = replay[k];
    if (!m.has_picture()) {
      if (m.result) republish(m);
      continue;
    }
    video::Frame frame;
    const int64_t t0 = SteadyNs();
    if (m.gpu) {  // from a ring in GPU memory: stays there (the engine's GPU stages read it)
      frame = FrameOfGpu(m);
    } else if (!m.bgr.empty()) {  // a raw picture from the same-host ring: nothing to decode
      frame = FrameOfRaw(m);
    } else if (Status st = video::DecodeJpeg(m.jpeg, &frame); !st.ok()) {
      spdlog::error("stream '{}': mirrored picture seq {} cannot be processed again: {}", s.config.id, m.seq,
                    std::string(st.message()));
      Dropped(s, "mirror_error").Inc();
      ledger_->Dropped(index, m.seq, "mirror_error");
      continue;
    }
    frame.stream_id = s.config.id;
    frame.run = s.run;
    frame.seq = m.seq;
    frame.pts_ns = m.pts_ns;
    frame.capture_time_ns = m.capture_ns;  // the old primary's capture: frame→stored includes the takeover
    frame.source_steady_ns = SteadyNs();
    frame.decode_ns = frame.source_steady_ns - t0;
    if (!PushToPool(index, std::move(frame))) break;
  }
  // Stopped, or the pool closed: what was not handed over becomes drop marks (its seqs are not reported lost).
  for (size_t rest = k; rest < replay.size(); ++rest) {
    Dropped(s, "shutdown").Inc();
    ledger_->Dropped(index, replay[rest].seq, "shutdown");
  }
  if (republished > 0) {
    ledger_->Tick(/*force=*/true);  // the aggregator learns of them at once (not after progress_flush)
    s.republished->Inc(static_cast<double>(republished));
    spdlog::info("stream '{}': re-published the old primary's own results for {} frame(s)", s.config.id, republished);
  }
  return k == replay.size();
}

// Hands `frame` to the pool; false when the pool is closed (the frame not taken). An idle pool's stall clock
// starts with the first frame that waits (a camera that took seconds to connect, or a file paused by pacing, is
// not a stalled inference).
bool Edge::PushToPool(size_t index, video::Frame frame) {
  if (frames_pushed_.load() == frames_done_.load()) last_batch_ns_ = SteadyNs();
  ++frames_pushed_;
  if (pool_->Push(index, {index, std::move(frame)})) {
    timeline_.Mark(TakeoverTimeline::kFed, SteadyNs());
    return true;
  }
  --frames_pushed_;
  return false;
}

void Edge::Feed(size_t index) {
  Stream& s = streams_[index];
  const bool fed = FeedReplay(index);
  while (fed && s.reader && !Stopping()) {
    video::Frame frame;
    const video::StreamReader::PopResult r = s.reader->Pop(&frame, milliseconds(100));
    if (r == video::StreamReader::PopResult::kTimeout) continue;
    if (r == video::StreamReader::PopResult::kEnd) {
      if (Status st = s.reader->final_status(); !st.ok()) {
        spdlog::error("{}", std::string(st.message()));  // the message names the stream
        s.errors_total->Inc();
      } else {
        const video::StreamStats stats = s.reader->Stats();
        spdlog::info("stream '{}': ended; decoded on {}, {} decode errors", s.config.id,
                     stats.hwaccel.empty() ? std::string("cpu") : stats.hwaccel, stats.decode_errors);
      }
      break;
    }
    const uint64_t seq = frame.seq;
    if (s.live && !std::exchange(s.first_frame_seen, true) && takeover_contact_ && takeover_contact_->load() > 0) {
      // Camera time no node saw: from the old primary's last contact to this node's first picture (its
      // numbered-but-unstored frames are reported apart, as lost_on_restart).
      const double gap_s = static_cast<double>(SteadyNs() - takeover_contact_->load()) * 1e-9;
      reg_.GetGauge("vigil_edge_takeover_camera_gap_seconds",
                    "Live camera time missed by the last takeover: the old primary's last contact to this node's "
                    "first frame",
                    {{"stream", s.config.id}})
          .Set(gap_s);
      spdlog::warn("stream '{}': {} ms of camera time missed in the takeover (the old primary's last contact to "
                   "this node's first frame, seq {})",
                   s.config.id, static_cast<int64_t>(gap_s * 1000), seq);
    }
    if (!PushToPool(index, std::move(frame))) {
      if (s.live) {
        Dropped(s, "shutdown").Inc();
        ledger_->Dropped(index, seq, "shutdown");
      }
      break;
    }
  }
  if (!s.reader) {  // a takeover's replay for a camera that did not open
    if (--active_ == 0) pool_->Close();
    return;
  }
  s.reader->Stop();
  if (s.live) {  // numbered and never processed: marked, so the next instance does not report them as lost
    video::Frame frame;
    while (s.reader->Pop(&frame, milliseconds(0)) == video::StreamReader::PopResult::kFrame) {
      Dropped(s, "shutdown").Inc();
      ledger_->Dropped(index, frame.seq, "shutdown");
    }
  }
  if (--active_ == 0) pool_->Close();
}

void Edge::SaveFrame(const Stream& s, const video::Frame& f) {
  Tensor pixels(DType::kUInt8, {f.height, f.width, 3});
  for (int y = 0; y < f.height; ++y) {
    std::copy_n(f.bgr.data() + static_cast<size_t>(y) * static_cast<size_t>(f.stride), static_cast<size_t>(f.width) * 3,
                pixels.data<uint8_t>() + static_cast<size_t>(y) * static_cast<size_t>(f.width) * 3);
  }
  char name[32];
  std::snprintf(name, sizeof(name), "%06llu.npy", static_cast<unsigned long long>(f.seq));
  const std::string path = (std::filesystem::path(s.config.save_frames) / name).string();
  if (Status st = WriteNpy(path, pixels); !st.ok()) {
    spdlog::warn("stream '{}': save_frames: {}", s.config.id, std::string(st.message()));
  }
}

// On the pool's sink thread, batches in the order they were taken (so each stream's frames in order).
void Edge::OnBatch(BatchResult& r) {
  frames_done_ += r.items.size();
  last_batch_ns_ = SteadyNs();
  failed_in_row_ = r.status.ok() ? 0 : failed_in_row_ + 1;  // the sink thread is the only writer
  if (!r.status.ok()) {
    {
      std::lock_guard lock(batch_error_mu_);
      last_batch_error_ = std::string(r.status.message());
    }
    spdlog::error("detection of a batch of {} frames on {} failed: {}", r.items.size(), config_.devices[r.device],
                  std::string(r.status.message()));
    for (const WorkItem& item : r.items) {
      Dropped(streams_[item.stream], "detect_error").Inc();
      ledger_->Dropped(item.stream, item.frame.seq, "detect_error");
    }
    return;
  }
  const bool first_after_takeover =
      timeline_.started() && !r.items.empty() && timeline_.Mark(TakeoverTimeline::kDetected, SteadyNs());
  if (first_after_takeover) {
    std::lock_guard lock(takeover_mu_);
    const video::Frame& f = r.items.front().frame;
    first_processed_ = FrameId{streams_[r.items.front().stream].config.id, f.run, f.seq};
    // Where the first batch's time went ("detected" is the takeover's slowest step): its wait in the queue, and
    // the worker's own stages.
    const detect::DetectTiming& t = r.timing.front();
    spdlog::info("takeover: first batch on worker {}: {} frames, waited {:.1f} ms in the queue, {:.1f} ms in the worker "
                 "(preprocess {:.1f}, inference {:.1f}, postprocess {:.1f} ms of its first frame)",
                 r.worker, r.items.size(), static_cast<double>(r.started_ns - f.source_steady_ns) * 1e-6,
                 static_cast<double>(r.detected_ns - r.started_ns) * 1e-6, static_cast<double>(t.preprocess_ns) * 1e-6,
                 static_cast<double>(t.inference_ns) * 1e-6, static_cast<double>(t.postprocess_ns) * 1e-6);
  }
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
  if (on_detected_) on_detected_(r);
  for (size_t i = 0; i < r.items.size(); ++i) {
    const video::Frame& f = r.items[i].frame;
    const size_t index = r.items[i].stream;
    Stream& s = streams_[index];
    const FrameInfo info{f.seq, f.capture_time_ns, f.pts_ns, static_cast<uint32_t>(f.width),
                         static_cast<uint32_t>(f.height)};
    const StreamLedger::Recorded rec = RecordFrame(index, info, r.detections[i],
                                                   i < r.device_rows.size() ? &r.device_rows[i] : nullptr,
                                                   f.source_steady_ns);
    if (rec.verdict.event && snapshotter_ && s.config.snapshots.enabled) {
      // The frame moves to the snapshot thread (nothing reads it after this): no copy on this thread.
      Snapshotter::Job job;
      job.stream = index;
      job.options = s.config.snapshots.options;
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

StreamLedger::Recorded Edge::RecordFrame(size_t index, const FrameInfo& info, std::span<const detect::Detection> dets,
                                         const detect::DeviceRows* rows, int64_t source_steady_ns) {
  Stream& s = streams_[index];
  const int64_t r0 = SteadyNs();
  StreamLedger::Recorded rec = ledger_->Record(index, info, dets, rows);
  const double took = static_cast<double>(SteadyNs() - r0) * 1e-9;
  stages_.rules->Observe(took);
  if (rec.published > 0) stages_.publish->Observe(took);
  if (rec.verdict.event) s.events[static_cast<int>(rec.verdict.severity)]->Inc();
  {
    std::lock_guard lock(stats_mu_);
    s.unacked.emplace_back(info.seq, source_steady_ns);
    if (s.unacked.size() > kMaxUnackedTimes) s.unacked.pop_front();  // acks stalled: forget the oldest
    ++s.frames;
  }
  s.frames_total->Inc();
  replication::PrimaryChannel* ch = primary_channel_.load();
  if (ch != nullptr && s.live && config_.replication.mirror_results) {
    replication::MirroredResult m{s.config.id, s.run, info.seq, info.capture_ns, info.pts_ns, info.width, info.height, {}};
    m.detections.reserve(dets.size());
    for (const detect::Detection& d : dets) m.detections.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
    if (ch->MirrorResult(std::move(m))) s.results_mirrored->Inc();
  }
  return rec;
}

namespace {
transport::SourceState SourceStateOf(video::StreamState s) {
  switch (s) {
    case video::StreamState::kIdle:
      return transport::SourceState::kIdle;
    case video::StreamState::kConnecting:
      return transport::SourceState::kConnecting;
    case video::StreamState::kStreaming:
      return transport::SourceState::kStreaming;
    case video::StreamState::kReconnecting:
      return transport::SourceState::kReconnecting;
    case video::StreamState::kEnded:
      return transport::SourceState::kEnded;
    case video::StreamState::kFailed:
      return transport::SourceState::kFailed;
    case video::StreamState::kStopped:
      return transport::SourceState::kStopped;
  }
  return transport::SourceState::kIdle;
}
}  // namespace

void Edge::Periodic(bool force) {
  const int64_t now = SteadyNs();
  if (!force && now - last_periodic_ns_ < 100'000'000) return;
  last_periodic_ns_ = now;
  // A standby paired: the pictures kept while there was none go to it (one flush at a time).
  if (replication::PrimaryChannel* ch = primary_channel_.load(); ch != nullptr && config_.replication.mirror_frames &&
                                                                  !kept_flush_running_.load() &&
                                                                  ch->stats().standby_connected) {
    std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> kept;
    {
      std::lock_guard lock(mirror_mu_);
      for (size_t i = 0; i < unpaired_.size(); ++i) {
        if (!unpaired_[i].empty()) kept.emplace_back(i, std::exchange(unpaired_[i], {}));
      }
    }
    if (!kept.empty()) {
      if (kept_flush_.joinable()) kept_flush_.join();  // the last flush: done (kept_flush_running_)
      kept_flush_running_ = true;
      kept_flush_ = std::thread([this, kept = std::move(kept)]() mutable {
        MirrorKept(std::move(kept));
        kept_flush_running_ = false;
      });
    }
  }
  if (replication::FramePublisher* ring = frame_publisher_.load()) {
    const replication::FramePublisherStats fs = ring->stats();
    reg_.GetGauge("vigil_edge_mirror_ring_mapped", "1 while a same-host standby's picture ring is mapped (mirror_via shm)")
        .Set(fs.active ? 1 : 0);
    metrics::Counter& sessions =
        reg_.GetCounter("vigil_edge_mirror_ring_sessions_total", "Standby picture rings mapped (authenticated standbys)");
    sessions.Inc(static_cast<double>(fs.sessions - std::exchange(ring_sessions_seen_, fs.sessions)));
    metrics::Counter& refused = reg_.GetCounter("vigil_edge_mirror_ring_refused_total",
                                                "Connections to the picture ring's socket refused (token, uid, ring)");
    refused.Inc(static_cast<double>(fs.refused - std::exchange(ring_refused_seen_, fs.refused)));
  }
  if (replication::PrimaryChannel* ch = primary_channel_.load(); ch != nullptr && config_.replication.mirror_frames) {
    // The mirrored pictures the channel keeps for a standby until the aggregator acknowledges them.
    const replication::PrimaryChannelStats cs = ch->stats();
    reg_.GetGauge("vigil_edge_mirror_retained_frames", "Mirrored pictures kept for the standby, not yet acknowledged")
        .Set(static_cast<double>(cs.frames_retained));
    reg_.GetGauge("vigil_edge_mirror_retained_bytes", "Their JPEG bytes").Set(static_cast<double>(cs.retained_bytes));
    metrics::Counter& evicted = reg_.GetCounter(
        "vigil_edge_mirror_frames_evicted_total",
        "Mirrored pictures dropped for room (mirror_window per stream) before the aggregator acknowledged them");
    if (cs.frames_evicted > mirror_evicted_seen_) {
      evicted.Inc(static_cast<double>(cs.frames_evicted - mirror_evicted_seen_));
      mirror_evicted_seen_ = cs.frames_evicted;
    }
    metrics::Counter& results_evicted = reg_.GetCounter(
        "vigil_edge_mirror_results_evicted_total",
        "Mirrored results dropped for room before the aggregator acknowledged them (a takeover runs their pictures "
        "again)");
    results_evicted.Inc(static_cast<double>(cs.results_evicted - std::exchange(results_evicted_seen_, cs.results_evicted)));
  }
  const bool fps_due = now - last_fps_ns_ >= 1'000'000'000;
  int active = 0;
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    uint64_t frames = 0;
    {
      std::lock_guard lock(stats_mu_);
      if (std::optional<uint64_t> acked = ledger_->acked_through(i)) {
        while (!s.unacked.empty() && s.unacked.front().first <= *acked) {
          stages_.frame_to_ack->Observe(static_cast<double>(now - s.unacked.front().second) * 1e-9);
          s.unacked.pop_front();
        }
      }
      frames = s.frames;
    }
    if (fps_due && last_fps_ns_ != 0) {
      s.fps->Set(static_cast<double>(frames - s.fps_frames) * 1e9 / static_cast<double>(now - last_fps_ns_));
    }
    if (fps_due) s.fps_frames = frames;
    const LedgerCounters c = ledger_->counters(i);
    Dropped(s, "backpressure").Inc(static_cast<double>(c.backpressure_drops - s.last_counters.backpressure_drops));
    s.last_counters = c;
    if (!s.reader) continue;
    const video::StreamStats st = s.reader->Stats();
    if (st.state != video::StreamState::kEnded && st.state != video::StreamState::kFailed &&
        st.state != video::StreamState::kStopped) {
      ++active;
    }
    s.reader_depth->Set(static_cast<double>(st.queue_depth));
    // Where the stream decodes, Prometheus' "info" pattern: 1 on the current decoder's series, 0 on an old one.
    // A stream with hwaccel reports nothing until its Source has decided (StreamStats::hwaccel, first picture).
    const bool gpu_requested = !s.config.hwaccel.empty() && s.config.hwaccel != "cpu";
    const std::string where = !st.hwaccel.empty() ? st.hwaccel : gpu_requested ? std::string() : std::string("cpu");
    if (!where.empty() && where != s.decoder) {
      auto decoder = [&](const std::string& d) -> metrics::Gauge& {
        return reg_.GetGauge("vigil_edge_stream_decoder", "1 on where the stream decodes now: cpu, cuda:N, cpu (why)",
                             {{"stream", s.config.id}, {"decoder", d}});
      };
      if (!s.decoder.empty()) decoder(s.decoder).Set(0);
      decoder(where).Set(1);
      s.decoder = where;
    }
    auto delta = [](uint64_t now_v, uint64_t before) { return static_cast<double>(now_v - before); };
    Dropped(s, "queue_full").Inc(delta(st.dropped_queue_full, s.last_stats.dropped_queue_full));
    s.decode_errors->Inc(delta(st.decode_errors, s.last_stats.decode_errors));
    s.reconnects->Inc(delta(st.reconnects, s.last_stats.reconnects));
    s.last_stats = st;
  }
  if (fps_due) last_fps_ns_ = now;
  // What the sources are doing, for the aggregator's view (the courier sends the list when it changes).
  transport::SourceStates states;
  for (const Stream& s : streams_) {
    if (s.reader) states.streams.push_back({s.config.id, SourceStateOf(s.last_stats.state)});
  }
  courier_->SetSourceStates(std::move(states));
  const transport::OutboxStats os = ledger_->outbox().Stats();
  const transport::CourierStats cs = courier_->Stats();
  batcher_depth_->Set(static_cast<double>(pool_->queued()));
  outbox_depth_->Set(static_cast<double>(os.pending));
  streams_active_->Set(active);
  connected_->Set(cs.connected ? 1 : 0);
  SampleLinks(cs);
  WatchForStall(now, active, os, cs);
  WatchHealth(now);
}

// The takeover's metrics and log lines (vigil_edge_takeover_seconds, _phase_seconds).
// The old primary's own results re-published and stored: said on its own (a takeover whose camera ended may never
// process a picture of its own, and then logs no timeline line).
void Edge::LogRepublishedStored() {
  for (const TakeoverTimeline::Phase p : {TakeoverTimeline::kRepublished, TakeoverTimeline::kRepublishedStored}) {
    reg_.GetGauge("vigil_edge_takeover_phase_seconds",
                  "The last takeover, step by step: seconds from the old primary's last contact to each step "
                  "(pipeline/takeover_timeline.h)",
                  {{"phase", TakeoverTimeline::Name(p)}})
        .Set(timeline_.Seconds(p).value_or(0));
  }
  spdlog::info("edge '{}': takeover: the old primary's own results re-published at {:.1f} ms and the first stored at "
               "{:.1f} ms after its last contact",
               config_.edge, timeline_.Seconds(TakeoverTimeline::kRepublished).value_or(0) * 1e3,
               timeline_.Seconds(TakeoverTimeline::kRepublishedStored).value_or(0) * 1e3);
}

void Edge::LogTakeoverTimeline() {
  for (size_t i = 0; i < TakeoverTimeline::kPhases; ++i) {
    const auto p = static_cast<TakeoverTimeline::Phase>(i);
    if (std::optional<double> s = timeline_.Seconds(p)) {
      reg_.GetGauge("vigil_edge_takeover_phase_seconds",
                    "The last takeover, step by step: seconds from the old primary's last contact to each step "
                    "(pipeline/takeover_timeline.h)",
                    {{"phase", TakeoverTimeline::Name(p)}})
          .Set(*s);
    }
  }
  const double stored_s = timeline_.Seconds(TakeoverTimeline::kStored).value_or(0);
  reg_.GetGauge("vigil_edge_takeover_seconds",
                "The primary's last contact to the first frame this edge processed stored, last takeover")
      .Set(stored_s);
  const std::optional<double> republished_s = timeline_.Seconds(TakeoverTimeline::kRepublishedStored);
  spdlog::warn("replication: takeover of edge '{}' complete: first report stored {} ms after the primary's last "
               "contact{}",
               config_.edge, static_cast<int64_t>(stored_s * 1000),
               republished_s ? StrCat(" (the old primary's own results, re-published, from ",
                                      static_cast<int64_t>(*republished_s * 1000), " ms)")
                             : std::string());
  spdlog::info("edge '{}': takeover timeline, ms after the old primary's last contact: {}", config_.edge,
               timeline_.Format());
}

// The edge's own health (a primary steps down on it): inference stalled with frames waiting, or failing
// batch after batch. Reported once per Run.
void Edge::WatchHealth(int64_t now) {
  if (!on_unhealthy_ || unhealthy_reported_) return;
  HealthSample sample;
  sample.now_ns = now;
  sample.last_batch_ns = last_batch_ns_.load();
  sample.frames_done = frames_done_.load();  // before pushed: a frame counted done was counted pushed
  sample.frames_pushed = frames_pushed_.load();
  sample.failed_in_row = failed_in_row_.load();
  {
    std::lock_guard lock(batch_error_mu_);
    sample.last_error = last_batch_error_;
  }
  const std::string why = UnhealthyReason(sample, health_bounds_);
  if (why.empty()) return;
  unhealthy_reported_ = true;
  reg_.GetCounter("vigil_edge_unhealthy_total", "Times this edge found its inference stalled or failing (replication)")
      .Inc();
  spdlog::error("edge '{}': unhealthy: {}", config_.edge, why);
  on_unhealthy_(why);
}

Status Edge::InjectFault() {
  if (fault_ == FaultKind::kNone) return absl::OkStatus();
  const uint64_t n = ++batches_started_;
  if (fault_ == FaultKind::kStall && n == fault_after_) {
    spdlog::warn("edge '{}': VIGIL_FAULT_INFERENCE: batch {} stalls {} ms", config_.edge, n, fault_ms_);
    std::this_thread::sleep_for(milliseconds(fault_ms_));
  }
  if (fault_ == FaultKind::kError && n >= fault_after_) {
    return absl::InternalError(StrCat("injected inference error (VIGIL_FAULT_INFERENCE), batch ", n));
  }
  return absl::OkStatus();
}

// No frame processed for kStallNs while streams are active: one warning per stall, with where things stand
// (what the reader queues, the batcher, the outbox and the link hold), and the count of stalls.
void Edge::WatchForStall(int64_t now, int active, const transport::OutboxStats& os, const transport::CourierStats& cs) {
  constexpr int64_t kStallNs = 10'000'000'000;
  uint64_t frames = 0;
  {
    std::lock_guard lock(stats_mu_);
    for (const Stream& s : streams_) frames += s.frames;
  }
  if (frames != stall_frames_ || active == 0 || stall_since_ns_ == 0) {
    stall_frames_ = frames;
    stall_since_ns_ = now;
    stall_reported_ = false;
    return;
  }
  if (stall_reported_ || now - stall_since_ns_ < kStallNs) return;
  stall_reported_ = true;
  reg_.GetCounter("vigil_edge_stalls_total", "Times no frame was processed for 10 s while streams were active").Inc();
  std::string readers;
  for (const Stream& s : streams_) {
    if (!s.reader) continue;
    const video::StreamStats st = s.reader->Stats();
    readers += StrCat(readers.empty() ? "" : ", ", s.config.id, ": ", video::StreamStateName(st.state), " queue ",
                      st.queue_depth, " decoded ", st.frames_decoded);
  }
  spdlog::warn("edge '{}': no frame processed for {} s with {} stream(s) active ({} frames so far); readers [{}]; "
               "batcher {} queued; outbox {} pending ({} pushed, {} acked); link {} {}, last error: {}",
               config_.edge, (now - stall_since_ns_) / 1'000'000'000, active, frames, readers, pool_->queued(),
               os.pending, os.pushed, os.acked, cs.link, cs.connected ? "connected" : "not connected", cs.last_error);
}

// Per link: sessions, messages and failed opens as counters; which link carries the session now; and
// whether a ucx link runs over TCP inside UCX (degraded: the fast path is not there).
void Edge::SampleLinks(const transport::CourierStats& cs) {
  auto delta = [](uint64_t now_v, uint64_t before) { return static_cast<double>(now_v - before); };
  std::lock_guard lock(link_metrics_mu_);  // scrapes and the final sample may overlap
  for (size_t i = 0; i < cs.links.size(); ++i) {
    const transport::CourierLinkStats& l = cs.links[i];
    const transport::CourierLinkStats before = i < last_courier_.links.size() ? last_courier_.links[i]
                                                                            : transport::CourierLinkStats{};
    const metrics::Labels labels{{"link", l.kind}};
    reg_.GetCounter("vigil_edge_link_sessions_total", "Sessions admitted, by link", labels)
        .Inc(delta(l.sessions, before.sessions));
    reg_.GetCounter("vigil_edge_link_messages_total", "Reports written, re-sends included, by link", labels)
        .Inc(delta(l.sent, before.sent));
    reg_.GetCounter("vigil_edge_link_open_failures_total", "Sessions that could not be opened, by link", labels)
        .Inc(delta(l.open_failures, before.open_failures));
    reg_.GetGauge("vigil_edge_link_active", "1 on the link that carries the session now", labels)
        .Set(cs.connected && cs.link == l.kind ? 1 : 0);
    // UCX may fall back to TCP inside itself (no shared memory, no RDMA): working, but not the fast path.
    const bool degraded = l.kind == "ucx" && !l.transports.empty() && l.transports.find("tcp") != std::string::npos &&
                          l.transports.find(',') == std::string::npos;
    reg_.GetGauge("vigil_edge_link_degraded", "1 when a ucx link's last session ran over TCP inside UCX", labels)
        .Set(degraded ? 1 : 0);
    // What carries the link underneath (UCX's selected transports), Prometheus' "info" pattern: 1 on the
    // current value, 0 on an old one.
    std::string& shown = link_transports_[l.kind];
    if (!l.transports.empty() && l.transports != shown) {
      auto info = [&](const std::string& t) -> metrics::Gauge& {
        return reg_.GetGauge("vigil_edge_link_transports", "1 on what carries the link underneath (UCX: its transports)",
                             {{"link", l.kind}, {"transports", t}});
      };
      if (!shown.empty()) info(shown).Set(0);
      info(l.transports).Set(1);
      shown = l.transports;
    }
  }
  reg_.GetCounter("vigil_edge_link_switches_total", "Sessions on another link than the previous one")
      .Inc(delta(cs.link_switches, last_courier_.link_switches));
  reg_.GetCounter("vigil_edge_link_fail_backs_total", "Moves back to a preferred link found by a probe")
      .Inc(delta(cs.fail_backs, last_courier_.fail_backs));
  reg_.GetCounter("vigil_edge_auth_failures_total", "Sessions refused for authentication (either side)")
      .Inc(delta(cs.auth_failures, last_courier_.auth_failures));
  reg_.GetCounter("vigil_edge_ack_timeouts_total", "Sessions replaced because an ack did not come in time")
      .Inc(delta(cs.ack_timeouts, last_courier_.ack_timeouts));
  const char* snap_help = "Snapshots the courier wrote (sent), refused for a full queue or at its close (dropped), "
                          "or lost with a broken session (lost)";
  reg_.GetCounter("vigil_edge_snapshot_link_total", snap_help, {{"result", "sent"}})
      .Inc(delta(cs.snapshots_sent, last_courier_.snapshots_sent));
  reg_.GetCounter("vigil_edge_snapshot_link_total", snap_help, {{"result", "dropped"}})
      .Inc(delta(cs.snapshots_dropped, last_courier_.snapshots_dropped));
  reg_.GetCounter("vigil_edge_snapshot_link_total", snap_help, {{"result", "lost"}})
      .Inc(delta(cs.snapshots_lost, last_courier_.snapshots_lost));
  last_courier_ = cs;
  // The cuda_ipc link's ring, edge side (process-wide counters; only with that link configured).
  if (std::find(config_.links.begin(), config_.links.end(), "cuda_ipc") != config_.links.end()) {
    const transport::CudaIpcCounters now = transport::GetCudaIpcCounters();
    const transport::CudaIpcCounters& was = last_ring_;
    reg_.GetCounter("vigil_edge_cuda_ipc_slots_total", "cuda_ipc ring slots published")
        .Inc(delta(now.slots_written, was.slots_written));
    reg_.GetCounter("vigil_edge_cuda_ipc_slot_waits_total", "Sends that found every ring slot in use and waited")
        .Inc(delta(now.slot_waits, was.slot_waits));
    reg_.GetCounter("vigil_edge_cuda_ipc_device_reports_total", "Reports sent from device memory without a host copy")
        .Inc(delta(now.device_rows_sent, was.device_rows_sent));
    reg_.GetCounter("vigil_edge_cuda_ipc_map_failures_total", "Ring offers that could not be mapped or carried an error")
        .Inc(delta(now.map_failures, was.map_failures));
    reg_.GetCounter("vigil_edge_cuda_ipc_publisher_launches_total",
                    "Launches of the resident publisher kernel (GPU rings; far fewer than slots under load)")
        .Inc(delta(now.publisher_launches, was.publisher_launches));
    last_ring_ = now;
  }
  // The ucx link's rows sent from GPU memory (process-wide counters; only with that link configured).
  if (std::find(config_.links.begin(), config_.links.end(), "ucx") != config_.links.end()) {
    const transport::UcxCounters now = transport::GetUcxCounters();
    reg_.GetCounter("vigil_edge_ucx_device_reports_total", "Reports whose rows UCX sent from GPU memory (no host copy)")
        .Inc(delta(now.rows_messages_sent_from_device, last_ucx_.rows_messages_sent_from_device));
    reg_.GetGauge("vigil_edge_ucx_cuda_memory", "1 when the UCX loaded takes CUDA memory (CUDA transports)")
        .Set(now.cuda_memory_workers > 0 ? 1 : 0);
    last_ucx_ = now;
  }
}

Status Edge::StartHttp() {
  if (config_.http_port == 0) return absl::OkStatus();
  transport::HttpAccess access;
  if (!config_.http_allow.empty()) {
    VIGIL_ASSIGN_OR_RETURN(transport::AllowList allow, transport::AllowList::Parse(config_.http_allow));
    access.allow = std::make_shared<const transport::AllowList>(std::move(allow));
  }
  VIGIL_ASSIGN_OR_RETURN(access.token, transport::ReadToken(config_.http_token_file, "VIGIL_HTTP_TOKEN"));
  access.cert_file = config_.http_cert_file;
  access.key_file = config_.http_key_file;
  metrics::Counter* by_address = &reg_.GetCounter("vigil_http_rejected_total", "HTTP requests refused",
                                                  {{"reason", "address"}});
  metrics::Counter* by_token = &reg_.GetCounter("vigil_http_rejected_total", "HTTP requests refused",
                                                {{"reason", "token"}});
  access.on_reject = [by_address, by_token](std::string_view reason, const std::string&) {
    (reason == "address" ? by_address : by_token)->Inc();
  };
  VIGIL_ASSIGN_OR_RETURN(http_, transport::MakeHttpServer(std::move(access)));
  http_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    if (!publishing_.load(std::memory_order_acquire)) {
      // A standby waiting for its primary (the server starts before the wait): healthy, not publishing.
      const nlohmann::json j = {{"status", "standby"}, {"edge", config_.edge}, {"epoch", 0},
                                {"aggregator_connected", false}, {"node", config_.replication.node}};
      res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
      return;
    }
    const transport::CourierStats cs = courier_->Stats();
    const transport::OutboxStats os = ledger_->outbox().Stats();
    nlohmann::json j = {{"status", fenced_.load() ? "fenced" : "ok"},
                        {"edge", config_.edge},
                        {"epoch", cs.epoch},
                        {"aggregator_connected", cs.connected},
                        {"link", cs.link},
                        {"outbox", os.pending}};
    res.status = fenced_.load() ? 503 : 200;
    res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(reg_.Render(), metrics::Registry::kContentType);
  });
  http_->Get("/api/placement", [this](const httplib::Request&, httplib::Response& res) {
    if (!placed_.load(std::memory_order_acquire)) {
      res.status = 503;
      res.set_content(R"json({"error":"not placed yet (a standby without warm sources places at the takeover)"})json",
                      "application/json");
      return;
    }
    res.set_content(topology::PlacementReportToJson(placement_->Report()), "application/json");
  });
  if (!http_->bind_to_port(config_.http_host, config_.http_port)) {
    spdlog::error("edge: cannot bind http {}:{}; /healthz and /metrics are off", config_.http_host,
                  config_.http_port);
    http_.reset();
    return absl::OkStatus();
  }
  http_port_ = config_.http_port;
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  spdlog::info("edge '{}': http on {}:{} (/healthz, /metrics, /api/placement)", config_.edge, config_.http_host,
               config_.http_port);
  return absl::OkStatus();
}

void Edge::StopHttp() {
  if (!http_ || !http_thread_.joinable()) return;
  // A stop() before the server thread is listening is lost: give it up to 2 s to get there.
  for (int i = 0; i < 2000 && !http_->is_running(); ++i) std::this_thread::sleep_for(milliseconds(1));
  http_->stop();
  http_thread_.join();
}

Status Edge::Run(const EdgeRunOptions& options) {
  // Fault injection for the chaos tests only: "stall:AFTER:MS" (batch AFTER stalls MS ms) or "error:AFTER"
  // (every batch from AFTER on fails).
  if (const char* f = std::getenv("VIGIL_FAULT_INFERENCE"); f != nullptr && *f != '\0') {
    unsigned long long after = 0;
    int ms = 0;
    if (std::sscanf(f, "stall:%llu:%d", &after, &ms) == 2 && after > 0 && ms > 0) {
      fault_ = FaultKind::kStall;
    } else if (std::sscanf(f, "error:%llu", &after) == 1 && after > 0) {
      fault_ = FaultKind::kError;
    } else {
      return absl::InvalidArgumentError(StrCat("VIGIL_FAULT_INFERENCE='", f, "': stall:AFTER:MS or error:AFTER"));
    }
    fault_after_ = after;
    fault_ms_ = ms;
    spdlog::warn("edge '{}': fault injection on (VIGIL_FAULT_INFERENCE={}): for tests only", config_.edge, f);
  }
  stages_ = {&Stage("decode"), &Stage("queue"),       &Stage("preprocess"), &Stage("inference"),
             &Stage("postprocess"), &Stage("rules"), &Stage("publish"),    &Stage("frame_to_ack"),
             &Stage("mirror")};
  frame_to_detection_ = &reg_.GetHistogram("vigil_edge_frame_to_detection_seconds",
                                           "Frame released by its source to its detections ready, seconds",
                                           metrics::LatencyBuckets());
  engine_busy_ = &reg_.GetCounter("vigil_edge_engine_busy_seconds_total", "Time the inference engine spent running batches");
  batch_frames_ = &reg_.GetHistogram("vigil_edge_batch_frames", "Frames per batch a worker ran",
                                     {1, 2, 4, 8, 16, 32, 64, 128, 256});
  batcher_depth_ = &reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue", {{"queue", "batcher"}});
  outbox_depth_ = &reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue", {{"queue", "outbox"}});
  streams_active_ = &reg_.GetGauge("vigil_edge_streams_active", "Streams still delivering frames");
  connected_ = &reg_.GetGauge("vigil_edge_aggregator_connected", "1 while a session with the aggregator is up");
  epoch_gauge_ = &reg_.GetGauge("vigil_edge_epoch", "Epoch granted by the aggregator to this instance (0: not yet)");
  fenced_gauge_ = &reg_.GetGauge("vigil_edge_fenced", "1 once a newer instance of this edge id was admitted");
  rejected_ = &reg_.GetCounter("vigil_edge_reports_rejected_total", "Reports the aggregator refused");
  AssignDevices();
  VIGIL_RETURN_IF_ERROR(LoadWorkers());
  on_detected_ = options.on_detected;
  on_acked_ = options.on_acked;
  for (int64_t c = 0; c < pool_->detector().model().num_classes; ++c) {
    class_names_.push_back(pool_->detector().ClassName(static_cast<int>(c)));
  }
  if (warm_) {
    // A warm standby reads its streams while it waits (StartFollowing); the state dir is the standby's (its
    // placement report goes there before the wait opens it).
    VIGIL_RETURN_IF_ERROR(OpenStreams());
    if (!config_.state_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(config_.state_dir, ec);
    }
    Place();
    StartFollowing();
  }
  if (options.after_load) {
    WarmUpEngines();  // a standby's first frame after the takeover pays no first run
    // A standby answers /healthz ("standby") and /metrics (its role, takeovers) while it waits.
    VIGIL_RETURN_IF_ERROR(StartHttp());
    http_started_ = true;
    VIGIL_RETURN_IF_ERROR(options.after_load());  // a standby waits here, engine warm
  }
  // The state dir is locked before anything else touches it: a second edge on it stops here.
  VIGIL_RETURN_IF_ERROR(OpenLedger(class_names_));
  timeline_.Mark(TakeoverTimeline::kLedger, SteadyNs());
  if (!warm_) VIGIL_RETURN_IF_ERROR(OpenStreams());
  if (!config_.streams.empty() && std::none_of(streams_.begin(), streams_.end(), [](const Stream& st) {
        return st.source != nullptr || st.reader != nullptr;
      })) {
    // Nothing to run: fail loudly so that a supervisor restarts or alerts (each reason was logged above).
    return absl::FailedPreconditionError(StrCat("none of the ", config_.streams.size(),
                                                " configured streams could be opened (see the errors above)"));
  }
  if (!warm_) Place();
  if (register_numa_) RegisterNumaMetrics(reg_);
  VIGIL_RETURN_IF_ERROR(StartCourier());
  publishing_.store(true, std::memory_order_release);  // courier_ and ledger_ are set: /healthz reads them
  if (Status st = http_started_ ? absl::OkStatus() : StartHttp(); !st.ok()) {
    courier_->Close();
    ledger_->Close();
    return st;
  }
  auto fenced_error = [&] {
    std::lock_guard lock(fence_mu_);
    return absl::AbortedError(StrCat("fenced: ", fence_reason_));
  };
  if (!WaitAdmitted()) {
    courier_->Close();
    ledger_->Close();
    StopHttp();
    if (fenced_.load()) return fenced_error();
    spdlog::info("edge '{}': stopped before the aggregator admitted it", config_.edge);
    return absl::OkStatus();
  }
  StartReaders();
  spdlog::info("edge '{}': epoch {}, {} streams, aggregator {}:{}", config_.edge, ledger_->epoch(), streams_.size(),
               config_.aggregator_host, config_.aggregator_port);
  if (options.on_started) options.on_started(static_cast<uint16_t>(http_port_));

  std::vector<std::thread> feeders;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].reader || !streams_[i].replay.empty()) ++active_;
  }
  // Inference on the pool's threads, each bound to its device's cores (its OpenMP team, created from it,
  // inherits that); the ledger and the rules on the sink thread.
  last_batch_ns_ = SteadyNs();
  if (on_unhealthy_) {  // scrapeable at 0 before the first time
    reg_.GetCounter("vigil_edge_unhealthy_total", "Times this edge found its inference stalled or failing (replication)");
  }
  pool_->Start([this](BatchResult& r) { OnBatch(r); },
               [this](std::vector<WorkItem>& batch, size_t) -> Status {
                 for (const WorkItem& item : batch) {
                   const Stream& s = streams_[item.stream];
                   if (!s.config.save_frames.empty() && !item.frame.device) SaveFrame(s, item.frame);
                 }
                 return InjectFault();
               },
               [this](size_t, size_t) { placement_->PlaceThread(ThreadRole::kWorker); },
               [this] { placement_->PlaceThread(ThreadRole::kSink); });
  if (active_ == 0) pool_->Close();
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].reader || !streams_[i].replay.empty()) {  // a camera that did not open still gets its replay
      feeders.emplace_back([this, i] {
        placement_->PlaceThread(ThreadRole::kFeed, i);
        Feed(i);
      });
    }
  }
  // This thread keeps the ledger's marks flowing and the sampled metrics current until every stream has
  // ended and every frame is through. A stop must not wait behind a file stream's wait for room in the
  // outbox (an aggregator that is down): the ledger's waits are cancelled once it is asked for.
  // Marks are published within about 1.5 progress_flush_ms: the ledger is ticked every half of it.
  const milliseconds tick(std::clamp(config_.progress_flush_ms / 2, 1, 50));
  bool discarded = false;
  while (!pool_->WaitDone(tick)) {
    ledger_->Tick();
    Periodic(false);
    if (stop_.load()) ledger_->CancelWaits();
    if (Stopping() && !discarded) {
      // A stop does not wait for the engine to get through the queues: a file's queued frames are read
      // again after a restart (they lie after the acknowledged cursor), a live stream's become drop marks.
      discarded = true;
      for (const WorkItem& item : pool_->CloseAndTakeQueued()) {
        if (streams_[item.stream].live) {
          Dropped(streams_[item.stream], "shutdown").Inc();
          ledger_->Dropped(item.stream, item.frame.seq, "shutdown");
        }
      }
    }
  }
  pool_->Join();
  for (std::thread& t : feeders) t.join();
  // Flush every mark, then wait for the acks (bounded), retrying marks held for lack of room.
  ledger_->Tick(/*force=*/true);
  bool flushed = fenced_.load();
  for (const auto deadline = std::chrono::steady_clock::now() + options.shutdown_timeout; !flushed;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    flushed = ledger_->outbox().WaitEmpty(std::min(left, milliseconds(100)));
    if (flushed || left <= milliseconds(100)) break;
    ledger_->Tick(/*force=*/true);
  }
  FlushSnapshots(std::chrono::steady_clock::now() + milliseconds(2000));
  Periodic(true);
  if (kept_flush_.joinable()) kept_flush_.join();  // Periodic's last (it returns at once once Stopping)
  const transport::OutboxStats os = ledger_->outbox().Stats();
  courier_->Close();
  ledger_->Close();  // the last state write
  if (!flushed) {
    spdlog::warn("edge '{}': {} reports not acknowledged within {} ms; a restart re-sends them", config_.edge,
                 os.pending, options.shutdown_timeout.count());
  }
  uint64_t frames = 0;
  for (const Stream& s : streams_) frames += s.frames;  // the sink thread has ended
  spdlog::info("edge '{}': done: {} frames, {} reports published, {} acknowledged, {} rejected", config_.edge,
               frames, os.pushed, os.acked, os.rejected);
  StopHttp();
  if (fenced_.load()) return fenced_error();
  return absl::OkStatus();
}

}  // namespace

Status RunEdge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& registry,
               const EdgeRunOptions& options) {
  const ReplicationConfig& rc = config.replication;
  if (rc.role == ReplicationConfig::Role::kNone) {
    Edge edge(config, stop, registry);
    return edge.Run(options);
  }
  VIGIL_ASSIGN_OR_RETURN(replication::PairDigest digest, PairDigestOf(config));
  if (rc.mirror_via == ReplicationConfig::MirrorVia::kShm && rc.mirror_memory != "host") {
    // The ring this node creates whenever it is the standby: its GPU must be there (said now, not at a pairing).
    // Only counted: a CUDA context made here, before FFmpeg's, would make NVDEC refuse the device.
    const int device = std::stoi(rc.mirror_memory.substr(5));
    const int visible = transport::device_memory::VisibleDevices();
    if (device >= visible) {
      return absl::FailedPreconditionError(
          StrCat("replication.mirror_memory ", rc.mirror_memory, ": no such GPU here (", visible, " visible",
                 transport::device_memory::Available() ? "" : "; this vigil was built without CUDA", ")"));
    }
  }
  auto role = [&registry](const char* r) -> metrics::Gauge& {
    return registry.GetGauge("vigil_edge_replication_role", "1 on this edge's current replication role", {{"role", r}});
  };
  metrics::Counter& takeovers = registry.GetCounter("vigil_edge_takeovers_total", "Takeovers of this standby");
  metrics::Counter& rejoins =
      registry.GetCounter("vigil_edge_rejoins_total", "Times this primary was fenced and rejoined as the standby");
  // vigil_edge_takeover_seconds and _phase_seconds: the Edge sets them (LogTakeoverTimeline); scrapeable at 0.
  registry.GetGauge("vigil_edge_takeover_seconds",
                    "The primary's last contact to the first frame this edge processed stored, last takeover");
  metrics::Counter& step_downs =
      registry.GetCounter("vigil_edge_step_downs_total", "Times this primary found itself unhealthy and handed over");
  bool standby = rc.role == ReplicationConfig::Role::kStandby;
  if (!standby) {
    // Restarted after the peer took over? Then the peer is the primary and this node its standby.
    VIGIL_ASSIGN_OR_RETURN(standby, PeerIsPrimary(config, digest));
    if (standby) spdlog::warn("replication: the peer at {} is the primary now: '{}' starts as its standby", rc.peer, rc.node);
  }
  for (int cycle = 0;; ++cycle) {
    Edge edge(config, stop, registry);
    edge.set_register_numa(cycle == 0);
    std::unique_ptr<replication::FramePublisher> frames;  // mirror_via shm: the standby's ring (before channel:
                                                           // the channel's offer uses it)
    std::unique_ptr<replication::PrimaryChannel> channel;
    // Serve the channel and mirror every persisted ledger state: before the ledger opens.
    auto become_primary = [&]() -> Status {
      if (rc.mirror_frames && rc.mirror_via == ReplicationConfig::MirrorVia::kShm && !frames) {
        VIGIL_ASSIGN_OR_RETURN(frames, ListenForFrameRing(config));
        edge.set_frame_publisher(frames.get());
      }
      VIGIL_ASSIGN_OR_RETURN(channel, StartPrimaryChannel(config, digest, frames.get()));
      edge.set_primary_channel(channel.get());
      role("primary").Set(1);
      role("standby").Set(0);
      return absl::OkStatus();
    };
    // The primary's own health: unhealthy with a standby paired, it hands over at once (Finished with the
    // reason; the standby's promotion then fences this node, which rejoins as the standby). Without a standby
    // it goes on: a degraded primary publishes more than none.
    std::thread stepping_down;
    edge.set_on_unhealthy(
        [&](const std::string& why) {
          if (!channel || !channel->stats().standby_connected) {
            spdlog::error("replication: '{}' is unhealthy ({}) but has no standby to hand over to: it goes on", rc.node,
                          why);
            return;
          }
          step_downs.Inc();
          spdlog::error("replication: '{}' steps down: {}; its standby takes over", rc.node, why);
          stepping_down = std::thread([ch = channel.get(), why, &edge, &rc] {
            // What this primary decided (the failed batches' drop marks) is stored before the standby
            // resumes from the aggregator's cursor; bounded: an unreachable aggregator must not hold the
            // handover (the standby needs it too, and would then re-process those frames instead).
            const auto bound = std::chrono::milliseconds(1000);
            if (!edge.FlushForHandover(bound)) {
              spdlog::warn("replication: '{}' hands over with reports not yet acknowledged after {} ms: the "
                           "standby processes their frames again",
                           rc.node, bound.count());
            }
            ch->Finish(/*streams_done=*/false, why);
          });
        },
        HealthBounds{rc.step_down_stall_ms, rc.step_down_errors});
    EdgeRunOptions o = options;
    if (!standby) {
      VIGIL_RETURN_IF_ERROR(become_primary());
    } else {
      role("primary").Set(0);
      role("standby").Set(1);
      // The primary's last contact once taken over (the takeover's and the camera gap's start).
      auto contact = std::make_shared<std::atomic<int64_t>>(0);
      edge.set_takeover_contact(contact);
      if (rc.warm_sources != ReplicationConfig::WarmSources::kNone) {
        edge.set_warm_standby(/*cameras=*/rc.warm_sources == ReplicationConfig::WarmSources::kAll);
      }
      // The primary's live pictures the aggregator has not acknowledged, to process again at the takeover.
      std::shared_ptr<MirrorWindow> window;
      if (rc.mirror_frames) {
        std::vector<std::string> ids;
        for (const StreamConfig& sc : config.streams) ids.push_back(sc.id);
        window = std::make_shared<MirrorWindow>(std::move(ids), static_cast<size_t>(rc.mirror_window));
        edge.set_mirror_window(window);
      }
      o.after_load = [&, contact, window]() -> Status {
        PrewarmPlacement(config.placement);  // the topology discovery is not left on the takeover's path
        std::function<void(replication::MirroredFrame&&)> on_frame;
        std::function<void(replication::MirroredResult&&)> on_result;
        std::function<bool(const replication::MirroredFrame&)> wanted;  // a ring copies no acknowledged picture
        if (window) {
          on_frame = [window](replication::MirroredFrame&& f) { window->Add(std::move(f)); };
          wanted = [window](const replication::MirroredFrame& f) { return window->Wanted(f); };
        }
        if (window && rc.mirror_results) {
          on_result = [window](replication::MirroredResult&& r) { window->AddResult(std::move(r)); };
        }
        VIGIL_ASSIGN_OR_RETURN(Takeover t, RunStandby(
                                               config, digest, stop,
                                               [&edge, window](const std::vector<StreamRecord>& r) {
                                                 if (window) window->Follow(r);
                                                 edge.FollowMirrored(r);
                                               },
                                               std::move(on_frame), std::move(on_result), std::move(wanted)));
        takeovers.Inc();
        contact->store(t.last_contact_ns);
        edge.takeover_timeline().Start(t.last_contact_ns);
        edge.takeover_timeline().Mark(TakeoverTimeline::kDecided, t.decided_ns);
        edge.takeover_timeline().Mark(TakeoverTimeline::kDrained, SteadyNs());
        spdlog::warn("replication: '{}' is now the primary of edge '{}' ({} ms after the primary's last contact)",
                     rc.node, config.edge, (t.decided_ns - t.last_contact_ns) / 1'000'000);
        // The takeover goes on even when the channel cannot be served: publishing matters more than a standby.
        if (Status served = become_primary(); !served.ok()) {
          spdlog::error("replication: '{}' publishes without a standby: {}", rc.node, std::string(served.message()));
          role("primary").Set(1);
          role("standby").Set(0);
        }
        edge.takeover_timeline().Mark(TakeoverTimeline::kServing, SteadyNs());
        return absl::OkStatus();
      };
    }
    Status st = edge.Run(o);
    if (stepping_down.joinable()) stepping_down.join();
    if (channel) {
      // Tell the standby why this primary ends: every stream done (nothing to take over), or a stop asked for
      // (it takes over at once). A failure says nothing: the standby sees the stream end and takes over.
      if (st.ok()) channel->Finish(/*streams_done=*/!stop.load());
      channel->Stop();
    }
    if (stop.load() && (absl::IsCancelled(st) || absl::IsAborted(st))) return absl::OkStatus();
    if (standby && !channel && absl::IsCancelled(st)) return absl::OkStatus();  // the primary finished: so do we
    if (absl::IsAborted(st)) {
      // Fenced: the aggregator admitted the peer's newer epoch (it took over while this node was paused or
      // cut off from it). Nothing of ours is published any more; follow the peer as its standby.
      spdlog::warn("replication: '{}' was fenced ({}); rejoining edge '{}' as the standby of {}", rc.node,
                   std::string(st.message()), config.edge, rc.peer);
      rejoins.Inc();
      standby = true;
      continue;
    }
    return st;
  }
}

}  // namespace vigil::pipeline
