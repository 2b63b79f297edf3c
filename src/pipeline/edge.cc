#include "vigil/pipeline/edge.h"

#include <algorithm>
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

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "vigil/common/mutex.h"
#include "vigil/common/npy.h"
#include "vigil/detect/detector.h"
#include "vigil/pipeline/edge_http.h"
#include "vigil/pipeline/frame_ref.h"
#include "vigil/pipeline/health.h"
#include "vigil/pipeline/health_watch.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/pipeline/link_metrics.h"
#include "vigil/pipeline/mirror_window.h"
#include "vigil/pipeline/picture_mirror.h"
#include "vigil/pipeline/placement.h"
#include "vigil/pipeline/rules.h"
#include "vigil/pipeline/standby_gate.h"
#include "vigil/pipeline/stream_metrics.h"
#include "vigil/pipeline/takeover_controller.h"
#include "vigil/pipeline/takeover_timeline.h"
#include "vigil/common/frame_key.h"
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
#include "edge_node.h"
#include "replication_role.h"

namespace vigil::pipeline {
namespace {


using std::chrono::milliseconds;

constexpr size_t kMaxUnackedTimes = 100000;  // frame times kept per stream for frame_to_ack

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

struct Stream {
  StreamConfig config;
  std::unique_ptr<video::Source> source;        // opened, until its reader takes it
  std::unique_ptr<video::StreamReader> reader;  // null when the stream failed to open
  video::Source* read = nullptr;                // the reader's source (DoNotPaceThrough), while `reader` lives
  bool live = false;
  bool first_frame_seen = false;  // Feed's thread
  uint64_t run = 0;  // set once the ledger is admitted, before the reader starts
  std::unique_ptr<StreamMetrics> metrics;  // its metrics (stream_metrics.h)
  std::vector<replication::MirroredFrame> replay;  // a takeover's mirrored pictures, fed before the source's
};

class Edge final : public transport::CourierHandler, public EdgeNode {
 public:
  Edge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& reg)
      : config_(config), stop_(stop), reg_(reg), mirror_(PrimaryMirrorOptions{config.replication, &reg, SystemClock(),
                                                                            [this] { return Stopping(); }}) {}
  ~Edge() override {
    http_.Stop();  // a standby's server runs from before its wait (a Run that ended early left it up)
    // A warm standby's readers pass the gate: it lets a held one go, and they stop (joined) while it lives.
    if (!gate_) return;
    gate_->Close();
    for (Stream& s : streams_) {
      if (s.reader) s.reader->Stop();
    }
  }

  // ---- EdgeNode (edge_node.h) ----
  Status Run(const EdgeRunOptions& options) override;
  void set_primary_channel(replication::PrimaryChannel* channel) override { mirror_.set_channel(channel); }
  void set_frame_publisher(replication::FramePublisher* frames) override { mirror_.set_ring(frames); }
  void set_mirror_window(std::shared_ptr<MirrorWindow> window) override { window_ = std::move(window); }
  void set_register_numa(bool on) override { register_numa_ = on; }
  void set_takeover_contact(std::shared_ptr<const std::atomic<int64_t>> contact) override {
    takeover_.set_contact(std::move(contact));
  }
  TakeoverTimeline& takeover_timeline() override { return takeover_.timeline(); }
  void set_warm_standby(bool cameras) override {
    warm_ = true;
    warm_cameras_ = cameras;
  }
  void FollowMirrored(const std::vector<StreamRecord>& records) override {
    StandbyGate* gate = following_.load(std::memory_order_acquire);
    if (gate == nullptr) return;
    for (const StreamRecord& r : records) {
      for (size_t i = 0; i < streams_.size(); ++i) {
        if (streams_[i].config.id != r.stream || streams_[i].config.source != r.source) continue;
        gate->Raise(i, r.acked_through);
        if (r.acked_through && streams_[i].read) streams_[i].read->DoNotPaceThrough(*r.acked_through);
      }
    }
  }
  void set_on_unhealthy(std::function<void(const std::string& why)> f, HealthBounds bounds) override {
    health_.set_on_unhealthy(std::move(f), bounds);
  }
  bool FlushForHandover(std::chrono::milliseconds timeout) override {
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
    takeover_.Mark(TakeoverTimeline::kWelcomed);
    ledger_->Admit(w);  // with the state write that lets pictures be numbered
    takeover_.Mark(TakeoverTimeline::kDurable);
    epoch_gauge_->Set(static_cast<double>(w.epoch));
    spdlog::info("edge '{}': admitted by the aggregator over {} with epoch {}", config_.edge, link, w.epoch);
  }
  void OnAck(const transport::Ack& a) override {
    ledger_->OnAck(a);
    takeover_.OnAck(a);  // the takeover completes when its first frame is stored
    // The mirrored pictures the aggregator has now are not kept for a standby any longer (the channel's, and
    // those kept raw while none was paired): the Ack decides, the mirror observes.
    if (a.contiguous_through >= 0) mirror_.Stored(a.stream, a.run, static_cast<uint64_t>(a.contiguous_through));
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
      MutexLock lock(fence_mu_);
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
  Status OpenStreams();
  Status OpenLedger(const std::vector<std::string>& names);
  Status StartCourier();
  void FlushSnapshots(int64_t until_ns);  // a steady-clock deadline (SteadyNs)
  bool WaitAdmitted();
  void Place();
  void StartReaders();
  video::SourceOptions SourceOptionsOf(size_t index) const;
  video::StreamReaderOptions ReaderOptionsOf(size_t index, bool gated);
  void StartFollowing();  // a warm standby, before the takeover
  void WarmUpEngines();   // one batch of 1 and one of max_batch through every worker's detector
  void AssignDevices();
  Status LoadWorkers();
  void Feed(size_t index);
  bool FeedReplay(size_t index);  // false: stopped (what was left became drop marks)
  bool PushToPool(size_t index, video::Frame frame);
  void OnBatch(BatchResult& r);
  // One processed (or re-published) frame's detections through the ledger, its metrics, and — a live stream of a
  // primary with replication.mirror_results — to the standby (the sink thread; FeedReplay for re-published ones).
  StreamLedger::Recorded RecordFrame(size_t index, const FrameInfo& info, std::span<const detect::Detection> dets,
                                     const detect::DeviceRows* rows, int64_t source_steady_ns);
  void SaveFrame(const Stream& s, const video::Frame& f);
  void Periodic(bool force);
  EdgeHttpOptions HttpOptions();               // /healthz, /metrics, /api/placement of this edge
  std::pair<int, std::string> Healthz() const;  // GET /healthz: HTTP status, JSON (the server's threads)

  const EdgeConfig& config_;
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
  // Per stream, what the sink thread recorded and Run's thread reads (frame_to_ack, fps, stalls).
  struct Tally {
    std::deque<std::pair<uint64_t, int64_t>> unacked;  // (seq, source_steady_ns) of reported frames
    uint64_t frames = 0;                               // frames recorded
  };
  Mutex stats_mu_;
  std::vector<Tally> tallies_ VIGIL_GUARDED_BY(stats_mu_);  // per stream (OpenStreams)
  std::unique_ptr<StreamLedger> ledger_;
  std::unique_ptr<transport::Courier> courier_;
  std::unique_ptr<Snapshotter> snapshotter_;  // set with courier_ when a stream has snapshots enabled
  std::atomic<bool> fenced_{false};
  Mutex fence_mu_;
  std::string fence_reason_ VIGIL_GUARDED_BY(fence_mu_);
  std::unique_ptr<EdgePlacement> placement_;
  std::vector<Stream> streams_;
  std::atomic<int> active_{0};
  int64_t last_periodic_ns_ = 0, last_fps_ns_ = 0;
  EdgeHttp http_;  // a standby's server runs from before its wait (Run's thread starts and stops it)
  std::atomic<bool> publishing_{false};      // courier_ and ledger_ set (the HTTP thread reads them after)
  std::atomic<bool> placed_{false};          // placement_ set
  // A warm standby (set_warm_standby): the gate its readers pass before the takeover. streams_ is complete
  // before gate_ is set, and FollowMirrored sees the gate (following_) only after both.
  bool warm_ = false, warm_cameras_ = false;
  std::unique_ptr<StandbyGate> gate_;  // Run's thread sets it before the readers start
  std::atomic<StandbyGate*> following_{nullptr};  // gate_, published to FollowMirrored (any thread)
  // Edge-wide metric handles, looked up once (Run).
  struct Stages {
    metrics::Histogram *decode, *queue, *preprocess, *inference, *postprocess, *rules, *publish, *frame_to_ack;
  } stages_{};
  metrics::Counter* engine_busy_ = nullptr;
  metrics::Histogram* batch_frames_ = nullptr;
  metrics::Histogram* frame_to_detection_ = nullptr;
  metrics::Gauge *batcher_depth_ = nullptr, *outbox_depth_ = nullptr, *streams_active_ = nullptr, *connected_ = nullptr;
  LinkMetrics links_{reg_, config_.links};  // sampled from the courier (Periodic)
  metrics::Gauge* epoch_gauge_ = nullptr;
  metrics::Gauge* fenced_gauge_ = nullptr;
  metrics::Counter* rejected_ = nullptr;
  HealthWatch health_{HealthWatchOptions{config_.edge, &reg_, SystemClock(), {}}};  // step-down, stalls, faults
  TakeoverController takeover_{config_.edge, reg_};  // the takeover's steps, metrics and log lines
  PrimaryMirror mirror_;  // the primary's mirroring to the standby (picture_mirror.h); after what Stopping reads
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
    s.metrics = std::make_unique<StreamMetrics>(reg_, sc.id, sc.hwaccel);
    mirror_.AddStream(sc.id);  // its index: streams_.size()
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
      s.metrics->errors().Inc();
    } else {
      s.live = (*source)->live();
      s.source = std::move(*source);
    }
    streams_.push_back(std::move(s));
  }
  MutexLock lock(stats_mu_);
  tallies_.resize(streams_.size());
  return absl::OkStatus();
}


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
  if (replication::PrimaryChannel* ch = mirror_.channel()) lo.store = MirroringStore(std::move(lo.store), ch, mirror_.order());
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
void Edge::FlushSnapshots(int64_t until_ns) {
  if (!snapshotter_) return;
  const auto left = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, (until_ns - SteadyNs()) / 1'000'000));
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
    s.metrics->lost_on_restart().Inc(static_cast<double>(r.lost));
    if (window_ && s.live) {
      // The old primary's pictures the aggregator lacks: Feed processes them before the camera's next ones.
      s.replay = window_->Take(s.config.id, s.run, r.replay);
      s.metrics->replayed().Inc(static_cast<double>(r.replay.size()));
      // This node's own standby (once one pairs) needs those the aggregator has not stored yet as much as this
      // node did: kept raw like this primary's own pictures (no work on the takeover's path). (A re-published
      // result goes to that standby as this node's own result: RecordFrame.)
      mirror_.KeepTakenOver(i, s.replay);
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
    // Numbered by the ledger and, a live picture of a primary that mirrors, handed to the standby under the lock
    // that orders it before the ledger states that count it (picture_mirror.h).
    const uint64_t position = f.seq;
    return mirror_.Number(i, streams_[i].live, streams_[i].run, f,
                          [&](uint64_t* seq) { return ledger_->Number(i, position, seq); });
  };
  ro.on_drop = [this, i](const video::Frame& f, video::DropReason why) {
    // A live frame that will never be processed travels as a drop mark; a file's unprocessed frame is
    // re-read after a restart (it lies after the acknowledged cursor), so it is not marked.
    if (streams_[i].live) {
      // queue_full drops are counted from the reader's stats (Periodic); a stop's here.
      if (why != video::DropReason::kQueueFull) streams_[i].metrics->dropped("shutdown").Inc();
      ledger_->Dropped(i, f.seq, why == video::DropReason::kQueueFull ? "queue_full" : "shutdown");
    }
  };
  return ro;
}

// A warm standby, before after_load: every opened stream is read through the gate.
void Edge::StartFollowing() {
  {
    gate_ = std::make_unique<StandbyGate>(streams_.size());
    following_.store(gate_.get(), std::memory_order_release);
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
          s.metrics->errors().Inc();
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
  takeover_.Mark(TakeoverTimeline::kResumed);
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
    if (republished == 0) takeover_.Republishing(FrameKey{config_.edge, s.config.id, s.run, m.seq});
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
      s.metrics->dropped("mirror_error").Inc();
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
    s.metrics->dropped("shutdown").Inc();
    ledger_->Dropped(index, replay[rest].seq, "shutdown");
  }
  if (republished > 0) {
    ledger_->Tick(/*force=*/true);  // the aggregator learns of them at once (not after progress_flush)
    s.metrics->republished().Inc(static_cast<double>(republished));
    spdlog::info("stream '{}': re-published the old primary's own results for {} frame(s)", s.config.id, republished);
  }
  return k == replay.size();
}

// Hands `frame` to the pool; false when the pool is closed (the frame not taken). An idle pool's stall clock
// starts with the first frame that waits (a camera that took seconds to connect, or a file paused by pacing, is
// not a stalled inference).
bool Edge::PushToPool(size_t index, video::Frame frame) {
  health_.Pushing();
  if (pool_->Push(index, {index, std::move(frame)})) {
    takeover_.Mark(TakeoverTimeline::kFed);
    return true;
  }
  health_.PushRefused();
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
        s.metrics->errors().Inc();
      } else {
        const video::StreamStats stats = s.reader->Stats();
        spdlog::info("stream '{}': ended; decoded on {}, {} decode errors", s.config.id,
                     stats.hwaccel.empty() ? std::string("cpu") : stats.hwaccel, stats.decode_errors);
      }
      break;
    }
    const uint64_t seq = frame.seq;
    if (s.live && !std::exchange(s.first_frame_seen, true)) takeover_.FirstLiveFrame(s.config.id, seq);
    if (!PushToPool(index, std::move(frame))) {
      if (s.live) {
        s.metrics->dropped("shutdown").Inc();
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
      s.metrics->dropped("shutdown").Inc();
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
  health_.BatchDone(r.items.size(), r.status);
  if (!r.status.ok()) {
    spdlog::error("detection of a batch of {} frames on {} failed: {}", r.items.size(), config_.devices[r.device],
                  std::string(r.status.message()));
    for (const WorkItem& item : r.items) {
      streams_[item.stream].metrics->dropped("detect_error").Inc();
      ledger_->Dropped(item.stream, item.frame.seq, "detect_error");
    }
    return;
  }
  const bool first_after_takeover =
      !r.items.empty() && takeover_.FirstBatch(r, streams_[r.items.front().stream].config.id);
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
  if (rec.verdict.event) s.metrics->Event(rec.verdict.severity);
  {
    MutexLock lock(stats_mu_);
    Tally& t = tallies_[index];
    t.unacked.emplace_back(info.seq, source_steady_ns);
    if (t.unacked.size() > kMaxUnackedTimes) t.unacked.pop_front();  // acks stalled: forget the oldest
    ++t.frames;
  }
  s.metrics->frames().Inc();
  mirror_.MirrorResult(index, s.live, s.run, info, dets);
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
  mirror_.Periodic();  // the kept pictures to a standby that just paired; mirroring metrics
  const bool fps_due = now - last_fps_ns_ >= 1'000'000'000;
  int active = 0;
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    uint64_t frames = 0;
    {
      MutexLock lock(stats_mu_);
      Tally& t = tallies_[i];
      if (std::optional<uint64_t> acked = ledger_->acked_through(i)) {
        while (!t.unacked.empty() && t.unacked.front().first <= *acked) {
          stages_.frame_to_ack->Observe(static_cast<double>(now - t.unacked.front().second) * 1e-9);
          t.unacked.pop_front();
        }
      }
      frames = t.frames;
    }
    s.metrics->SampleFps(frames, now, last_fps_ns_, fps_due);
    s.metrics->SampleLedger(ledger_->counters(i));
    if (!s.reader) continue;
    const video::StreamStats st = s.reader->Stats();
    if (st.state != video::StreamState::kEnded && st.state != video::StreamState::kFailed &&
        st.state != video::StreamState::kStopped) {
      ++active;
    }
    s.metrics->SampleReader(st);
  }
  if (fps_due) last_fps_ns_ = now;
  // What the sources are doing, for the aggregator's view (the courier sends the list when it changes).
  transport::SourceStates states;
  for (const Stream& s : streams_) {
    if (s.reader) states.streams.push_back({s.config.id, SourceStateOf(s.metrics->last_stats().state)});
  }
  courier_->SetSourceStates(std::move(states));
  const transport::OutboxStats os = ledger_->outbox().Stats();
  const transport::CourierStats cs = courier_->Stats();
  batcher_depth_->Set(static_cast<double>(pool_->queued()));
  outbox_depth_->Set(static_cast<double>(os.pending));
  streams_active_->Set(active);
  connected_->Set(cs.connected ? 1 : 0);
  links_.Sample(cs);
  uint64_t frames = 0;
  {
    MutexLock lock(stats_mu_);
    for (const Tally& t : tallies_) frames += t.frames;
  }
  health_.WatchForStall(now, active, frames, [&] {
    std::string readers;
    for (const Stream& s : streams_) {
      if (!s.reader) continue;
      const video::StreamStats st = s.reader->Stats();
      readers += StrCat(readers.empty() ? "" : ", ", s.config.id, ": ", video::StreamStateName(st.state), " queue ",
                        st.queue_depth, " decoded ", st.frames_decoded);
    }
    return fmt::format("readers [{}]; batcher {} queued; outbox {} pending ({} pushed, {} acked); link {} {}, last "
                       "error: {}",
                       readers, pool_->queued(), os.pending, os.pushed, os.acked, cs.link,
                       cs.connected ? "connected" : "not connected", cs.last_error);
  });
  health_.CheckHealth(now);
}

EdgeHttpOptions Edge::HttpOptions() {
  EdgeHttpOptions o;
  o.edge = config_.edge;
  o.host = config_.http_host;
  o.port = config_.http_port;
  o.allow = config_.http_allow;
  o.token_file = config_.http_token_file;
  o.cert_file = config_.http_cert_file;
  o.key_file = config_.http_key_file;
  o.registry = &reg_;
  o.healthz = [this] { return Healthz(); };
  o.placement_json = [this]() -> std::optional<std::string> {
    if (!placed_.load(std::memory_order_acquire)) return std::nullopt;
    return topology::PlacementReportToJson(placement_->Report());
  };
  return o;
}

std::pair<int, std::string> Edge::Healthz() const {
  auto dump = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  if (!publishing_.load(std::memory_order_acquire)) {
    // A standby waiting for its primary (the server starts before the wait): healthy, not publishing.
    return {200, dump({{"status", "standby"}, {"edge", config_.edge}, {"epoch", 0}, {"aggregator_connected", false},
                       {"node", config_.replication.node}})};
  }
  const transport::CourierStats cs = courier_->Stats();
  const transport::OutboxStats os = ledger_->outbox().Stats();
  const bool fenced = fenced_.load();
  return {fenced ? 503 : 200, dump({{"status", fenced ? "fenced" : "ok"},
                                    {"edge", config_.edge},
                                    {"epoch", cs.epoch},
                                    {"aggregator_connected", cs.connected},
                                    {"link", cs.link},
                                    {"outbox", os.pending}})};
}

Status Edge::Run(const EdgeRunOptions& options) {
  // Fault injection for the chaos tests only (health_watch.h).
  VIGIL_RETURN_IF_ERROR(health_.SetFault(std::getenv("VIGIL_FAULT_INFERENCE")));
  stages_ = {&Stage("decode"), &Stage("queue"),       &Stage("preprocess"), &Stage("inference"),
             &Stage("postprocess"), &Stage("rules"), &Stage("publish"),    &Stage("frame_to_ack")};
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
    VIGIL_RETURN_IF_ERROR(http_.Start(HttpOptions()));
    VIGIL_RETURN_IF_ERROR(options.after_load());  // a standby waits here, engine warm
  }
  // The state dir is locked before anything else touches it: a second edge on it stops here.
  VIGIL_RETURN_IF_ERROR(OpenLedger(class_names_));
  takeover_.Mark(TakeoverTimeline::kLedger);
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
  if (Status st = http_.Start(HttpOptions()); !st.ok()) {  // (started already: nothing)
    courier_->Close();
    ledger_->Close();
    return st;
  }
  auto fenced_error = [&] {
    MutexLock lock(fence_mu_);
    return absl::AbortedError(StrCat("fenced: ", fence_reason_));
  };
  if (!WaitAdmitted()) {
    courier_->Close();
    ledger_->Close();
    http_.Stop();
    if (fenced_.load()) return fenced_error();
    spdlog::info("edge '{}': stopped before the aggregator admitted it", config_.edge);
    return absl::OkStatus();
  }
  StartReaders();
  spdlog::info("edge '{}': epoch {}, {} streams, aggregator {}:{}", config_.edge, ledger_->epoch(), streams_.size(),
               config_.aggregator_host, config_.aggregator_port);
  if (options.on_started) options.on_started(static_cast<uint16_t>(http_.port()));

  std::vector<std::thread> feeders;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].reader || !streams_[i].replay.empty()) ++active_;
  }
  // Inference on the pool's threads, each bound to its device's cores (its OpenMP team, created from it,
  // inherits that); the ledger and the rules on the sink thread.
  health_.Start();  // the stall clock starts now
  pool_->Start([this](BatchResult& r) { OnBatch(r); },
               [this](std::vector<WorkItem>& batch, size_t) -> Status {
                 for (const WorkItem& item : batch) {
                   const Stream& s = streams_[item.stream];
                   if (!s.config.save_frames.empty() && !item.frame.device) SaveFrame(s, item.frame);
                 }
                 return health_.BeforeBatch();
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
          streams_[item.stream].metrics->dropped("shutdown").Inc();
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
  for (const int64_t deadline = SteadyNs() + options.shutdown_timeout.count() * 1'000'000; !flushed;) {
    const milliseconds left((deadline - SteadyNs()) / 1'000'000);
    flushed = ledger_->outbox().WaitEmpty(std::min(left, milliseconds(100)));
    if (flushed || left <= milliseconds(100)) break;
    ledger_->Tick(/*force=*/true);
  }
  FlushSnapshots(SteadyNs() + 2'000'000'000);
  Periodic(true);
  mirror_.Join();  // Periodic's last flush (it returns at once once Stopping)
  const transport::OutboxStats os = ledger_->outbox().Stats();
  courier_->Close();
  ledger_->Close();  // the last state write
  if (!flushed) {
    spdlog::warn("edge '{}': {} reports not acknowledged within {} ms; a restart re-sends them", config_.edge,
                 os.pending, options.shutdown_timeout.count());
  }
  uint64_t frames = 0;
  {
    MutexLock lock(stats_mu_);  // the sink thread has ended
    for (const Tally& t : tallies_) frames += t.frames;
  }
  spdlog::info("edge '{}': done: {} frames, {} reports published, {} acknowledged, {} rejected", config_.edge,
               frames, os.pushed, os.acked, os.rejected);
  http_.Stop();
  if (fenced_.load()) return fenced_error();
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<EdgeNode> MakeEdgeNode(const EdgeConfig& config, const std::atomic<bool>& stop,
                                       metrics::Registry& registry) {
  return std::make_unique<Edge>(config, stop, registry);
}

}  // namespace vigil::pipeline
