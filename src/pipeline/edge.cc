#include "vigil/pipeline/edge.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "vigil/common/mutex.h"
#include "vigil/pipeline/detection_sink.h"
#include "vigil/pipeline/edge_http.h"
#include "vigil/pipeline/health.h"
#include "vigil/pipeline/health_watch.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/pipeline/link_metrics.h"
#include "vigil/pipeline/mirror_window.h"
#include "vigil/pipeline/picture_mirror.h"
#include "vigil/pipeline/placement.h"
#include "vigil/pipeline/rules.h"
#include "vigil/pipeline/snapshotter.h"
#include "vigil/pipeline/stream_ingest.h"
#include "vigil/pipeline/takeover_controller.h"
#include "vigil/pipeline/takeover_timeline.h"
#include "vigil/pipeline/worker_setup.h"
#include "vigil/pipeline/workers.h"
#include "vigil/transport/courier.h"
#include "vigil/video/source.h"
#include "vigil/video/stream_reader.h"
#include "edge_node.h"
#include "replication_role.h"

namespace vigil::pipeline {
namespace {


using std::chrono::milliseconds;

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

// The ingest's frames into the worker pool (stream_ingest.h FrameIntake); the pool is loaded before any is pushed.
class PoolIntake final : public FrameIntake {
 public:
  explicit PoolIntake(const std::unique_ptr<WorkerPool>& pool) : pool_(pool) {}
  bool Push(size_t stream, video::Frame frame) override { return pool_->Push(stream, {stream, std::move(frame)}); }
  void Close() override { pool_->Close(); }

 private:
  const std::unique_ptr<WorkerPool>& pool_;
};

class Edge final : public transport::CourierHandler, public EdgeNode {
 public:
  Edge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& reg)
      : config_(config), stop_(stop), reg_(reg), mirror_(PrimaryMirrorOptions{config.replication, &reg, SystemClock(),
                                                                            [this] { return Stopping(); }}) {}
  // A standby's server runs from before its wait (a Run that ended early left it up); then ingest_, the last
  // member, closes a warm standby's gate and stops its readers.
  ~Edge() override { http_.Stop(); }

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
  void FollowMirrored(const std::vector<StreamRecord>& records) override { ingest_.FollowMirrored(records); }
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
  Status OpenStreams();  // the ingest's streams, and the sink's view of them
  Status OpenLedger(const std::vector<std::string>& names);
  Status StartCourier();
  void FlushSnapshots(int64_t until_ns);  // a steady-clock deadline (SteadyNs)
  bool WaitAdmitted();
  void Place();  // the placement plan for the opened streams (worker_setup.h PlaceEdge)
  void Periodic(bool force);
  EdgeHttpOptions HttpOptions();               // /healthz, /metrics, /api/placement of this edge
  std::pair<int, std::string> Healthz() const;  // GET /healthz: HTTP status, JSON (the server's threads)

  const EdgeConfig& config_;
  std::shared_ptr<MirrorWindow> window_;  // set_mirror_window (a standby)
  bool register_numa_ = true;
  const std::atomic<bool>& stop_;
  metrics::Registry& reg_;
  EdgeWorkers workers_;  // the pool and the streams' decoders (worker_setup.h)
  std::unique_ptr<WorkerPool>& pool_ = workers_.pool;  // (LoadEdgeWorkers sets it)
  std::vector<std::string> class_names_;
  std::function<void(const transport::Ack&)> on_acked_;   // EdgeRunOptions::on_acked
  std::unique_ptr<DetectionSink> sink_;  // made at the start of Run (it registers the stage metrics then)
  std::unique_ptr<StreamLedger> ledger_;
  std::unique_ptr<transport::Courier> courier_;
  std::unique_ptr<Snapshotter> snapshotter_;  // set with courier_ when a stream has snapshots enabled
  std::atomic<bool> fenced_{false};
  Mutex fence_mu_;
  std::string fence_reason_ VIGIL_GUARDED_BY(fence_mu_);
  std::unique_ptr<EdgePlacement> placement_;
  int64_t last_periodic_ns_ = 0, last_fps_ns_ = 0;
  EdgeHttp http_;  // a standby's server runs from before its wait (Run's thread starts and stops it)
  std::atomic<bool> publishing_{false};      // courier_ and ledger_ set (the HTTP thread reads them after)
  std::atomic<bool> placed_{false};          // placement_ set
  bool warm_ = false, warm_cameras_ = false;  // set_warm_standby: its streams are read while it waits
  // Edge-wide metric handles, looked up once (Run).
  metrics::Gauge *batcher_depth_ = nullptr, *outbox_depth_ = nullptr, *streams_active_ = nullptr, *connected_ = nullptr;
  LinkMetrics links_{reg_, config_.links};  // sampled from the courier (Periodic)
  metrics::Gauge* epoch_gauge_ = nullptr;
  metrics::Gauge* fenced_gauge_ = nullptr;
  metrics::Counter* rejected_ = nullptr;
  HealthWatch health_{HealthWatchOptions{config_.edge, &reg_, SystemClock(), {}}};  // step-down, stalls, faults
  TakeoverController takeover_{config_.edge, reg_};  // the takeover's steps, metrics and log lines
  PrimaryMirror mirror_;  // the primary's mirroring to the standby (picture_mirror.h); after what Stopping reads
  PoolIntake intake_{pool_};
  // The streams' sources, readers and feeders (stream_ingest.h); last: destroyed first (its threads use the above).
  StreamIngest ingest_{StreamIngestOptions{
      config_.edge, config_.streams, config_.max_batch, &reg_, SystemClock(), &mirror_, &takeover_, &health_, &intake_,
      [this] { return Stopping(); }, [this](ThreadRole role, size_t i) { placement_->PlaceThread(role, i); },
      [this](size_t i, const FrameInfo& info, std::span<const detect::Detection> dets, int64_t source_steady_ns) {
        sink_->RecordFrame(i, info, dets, nullptr, source_steady_ns);
      },
      nullptr}};
};

Status Edge::OpenStreams() {
  std::vector<StreamDecode> decode;
  for (size_t i = 0; i < config_.streams.size(); ++i) decode.push_back({workers_.stream_hwaccel[i], workers_.stream_gpu(i)});
  VIGIL_RETURN_IF_ERROR(ingest_.Open(std::move(decode)));
  std::vector<SinkStream> sink;
  for (size_t i = 0; i < ingest_.size(); ++i) {
    const StreamConfig& sc = ingest_.config(i);
    sink.push_back({sc.id, &ingest_.metrics(i), sc.snapshots.enabled, sc.snapshots.options});
  }
  sink_->Open(std::move(sink));
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
    sink_->set_snapshotter(snapshotter_.get());
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
  ingest_.Admitted(window_.get());
  return !fenced_.load();
}

void Edge::Place() {
  placement_ = PlaceEdge(config_, *pool_, ingest_.Probes());
  placed_.store(true, std::memory_order_release);
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
  for (size_t i = 0; i < ingest_.size(); ++i) {
    StreamMetrics& m = ingest_.metrics(i);
    const uint64_t frames = sink_->Acked(i, ledger_->acked_through(i), now);  // frame_to_ack
    m.SampleFps(frames, now, last_fps_ns_, fps_due);
    m.SampleLedger(ledger_->counters(i));
    if (!ingest_.reader(i)) continue;
    const video::StreamStats st = ingest_.reader(i)->Stats();
    if (st.state != video::StreamState::kEnded && st.state != video::StreamState::kFailed &&
        st.state != video::StreamState::kStopped) {
      ++active;
    }
    m.SampleReader(st);
  }
  if (fps_due) last_fps_ns_ = now;
  // What the sources are doing, for the aggregator's view (the courier sends the list when it changes).
  transport::SourceStates states;
  for (size_t i = 0; i < ingest_.size(); ++i) {
    if (ingest_.reader(i)) states.streams.push_back({ingest_.config(i).id, SourceStateOf(ingest_.metrics(i).last_stats().state)});
  }
  courier_->SetSourceStates(std::move(states));
  const transport::OutboxStats os = ledger_->outbox().Stats();
  const transport::CourierStats cs = courier_->Stats();
  batcher_depth_->Set(static_cast<double>(pool_->queued()));
  outbox_depth_->Set(static_cast<double>(os.pending));
  streams_active_->Set(active);
  connected_->Set(cs.connected ? 1 : 0);
  links_.Sample(cs);
  health_.WatchForStall(now, active, sink_->frames(), [&] {
    std::string readers;
    for (size_t i = 0; i < ingest_.size(); ++i) {
      if (!ingest_.reader(i)) continue;
      const video::StreamStats st = ingest_.reader(i)->Stats();
      readers += StrCat(readers.empty() ? "" : ", ", ingest_.config(i).id, ": ", video::StreamStateName(st.state), " queue ",
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
  // The sink registers the stage metrics (and the frame-to-detection, engine and batch ones) first.
  sink_ = std::make_unique<DetectionSink>(DetectionSinkOptions{
      config_.devices, &reg_, SystemClock(), &health_, &takeover_, options.on_detected,
      [this](size_t i, const FrameInfo& info, std::span<const detect::Detection> dets) {
        mirror_.MirrorResult(i, ingest_.live(i), ingest_.run(i), info, dets);
      }});
  batcher_depth_ = &reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue", {{"queue", "batcher"}});
  outbox_depth_ = &reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue", {{"queue", "outbox"}});
  streams_active_ = &reg_.GetGauge("vigil_edge_streams_active", "Streams still delivering frames");
  connected_ = &reg_.GetGauge("vigil_edge_aggregator_connected", "1 while a session with the aggregator is up");
  epoch_gauge_ = &reg_.GetGauge("vigil_edge_epoch", "Epoch granted by the aggregator to this instance (0: not yet)");
  fenced_gauge_ = &reg_.GetGauge("vigil_edge_fenced", "1 once a newer instance of this edge id was admitted");
  rejected_ = &reg_.GetCounter("vigil_edge_reports_rejected_total", "Reports the aggregator refused");
  VIGIL_ASSIGN_OR_RETURN(workers_, LoadEdgeWorkers(config_));
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
    ingest_.StartFollowing(warm_cameras_);
  }
  if (options.after_load) {
    WarmUpEngines(config_, workers_);  // a standby's first frame after the takeover pays no first run
    // A standby answers /healthz ("standby") and /metrics (its role, takeovers) while it waits.
    VIGIL_RETURN_IF_ERROR(http_.Start(HttpOptions()));
    VIGIL_RETURN_IF_ERROR(options.after_load());  // a standby waits here, engine warm
  }
  // The state dir is locked before anything else touches it: a second edge on it stops here.
  VIGIL_RETURN_IF_ERROR(OpenLedger(class_names_));
  ingest_.set_ledger(ledger_.get());
  sink_->set_ledger(ledger_.get());
  takeover_.Mark(TakeoverTimeline::kLedger);
  if (!warm_) VIGIL_RETURN_IF_ERROR(OpenStreams());
  if (!config_.streams.empty() && !ingest_.any_open()) {
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
  ingest_.StartReaders();
  spdlog::info("edge '{}': epoch {}, {} streams, aggregator {}:{}", config_.edge, ledger_->epoch(), ingest_.size(),
               config_.aggregator_host, config_.aggregator_port);
  if (options.on_started) options.on_started(static_cast<uint16_t>(http_.port()));

  const int active = ingest_.Activate();
  // Inference on the pool's threads, each bound to its device's cores (its OpenMP team, created from it,
  // inherits that); the ledger and the rules on the sink thread.
  health_.Start();  // the stall clock starts now
  pool_->Start([this](BatchResult& r) { sink_->OnBatch(r); },
               [this](std::vector<WorkItem>& batch, size_t) -> Status {
                 ingest_.SaveFrames(batch);
                 return health_.BeforeBatch();
               },
               [this](size_t, size_t) { placement_->PlaceThread(ThreadRole::kWorker); },
               [this] { placement_->PlaceThread(ThreadRole::kSink); });
  if (active == 0) pool_->Close();
  ingest_.StartFeeders();
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
      for (const WorkItem& item : pool_->CloseAndTakeQueued()) ingest_.DropQueued(item.stream, item.frame.seq);
    }
  }
  pool_->Join();
  ingest_.JoinFeeders();
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
  spdlog::info("edge '{}': done: {} frames, {} reports published, {} acknowledged, {} rejected", config_.edge,
               sink_->frames(), os.pushed, os.acked, os.rejected);
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
