#include "vigil/pipeline/edge.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "vigil/common/npy.h"
#include "vigil/detect/detector.h"
#include "vigil/pipeline/batcher.h"
#include "vigil/pipeline/edge_state.h"
#include "vigil/pipeline/frame_ref.h"
#include "vigil/pipeline/placement.h"
#include "vigil/pipeline/progress.h"
#include "vigil/pipeline/rules.h"
#include "vigil/transport/publisher.h"
#include "vigil/video/source.h"
#include "vigil/video/stream_reader.h"

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;

constexpr size_t kMaxUnackedTimes = 100000;  // frame times kept per stream for frame_to_ack

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Stream {
  StreamConfig config;
  StreamCursor saved;
  std::unique_ptr<video::Source> source;        // opened, until its reader takes it
  std::unique_ptr<video::StreamReader> reader;  // null when the stream failed to open
  bool live = false;
  std::optional<RuleEngine> rules;
  std::optional<ProgressCoalescer> progress;
  std::deque<std::pair<uint64_t, int64_t>> unacked;  // (seq, source_steady_ns) of reported frames
  uint64_t frames = 0, fps_frames = 0;
  video::StreamStats last_stats;  // for counter deltas
  std::string decoder;  // the vigil_edge_stream_decoder series at 1 ("" before the first report)
  metrics::Counter* frames_total = nullptr;
  metrics::Counter* errors_total = nullptr;
  metrics::Gauge* fps = nullptr;
};

struct Item {
  size_t stream = 0;
  video::Frame frame;
};

class Edge {
 public:
  Edge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& reg)
      : config_(config), stop_(stop), reg_(reg),
        batcher_(static_cast<size_t>(config.max_batch), milliseconds(config.max_wait_ms),
                 static_cast<size_t>(std::max(2 * config.max_batch, 4))) {}

  Status Run(const EdgeRunOptions& options);

 private:
  metrics::Histogram& Stage(const char* stage) {
    return reg_.GetHistogram("vigil_edge_stage_seconds", "Edge latency per pipeline stage, seconds",
                             metrics::LatencyBuckets(), {{"stage", stage}});
  }
  Status OpenStreams(const std::vector<std::string>& names);
  void Place();
  void StartReaders();
  void Feed(size_t index);
  void Process(std::vector<Item>& batch);
  void SaveFrame(const Stream& s, const video::Frame& f);
  void Publish(transport::Report report, const Stream& s);
  void Periodic(bool force);
  void StartHttp();

  const EdgeConfig& config_;
  const std::atomic<bool>& stop_;
  metrics::Registry& reg_;
  std::optional<EdgeState> state_;
  std::unique_ptr<detect::Detector> detector_;
  std::vector<std::shared_ptr<void>> decode_devices_;  // FFmpeg's CUDA contexts, held before the model loads
  int gpu_frames_device_ = -1;  // CUDA device whose NVDEC frames the Detector takes in place; -1 none
  std::unique_ptr<transport::Publisher> publisher_;
  std::unique_ptr<EdgePlacement> placement_;
  std::vector<Stream> streams_;
  Batcher<Item> batcher_;
  std::atomic<int> active_{0};
  int64_t last_periodic_ns_ = 0, last_fps_ns_ = 0;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int http_port_ = 0;
};

Status Edge::OpenStreams(const std::vector<std::string>& names) {
  for (const StreamConfig& sc : config_.streams) {
    Stream s;
    s.config = sc;
    const metrics::Labels labels{{"stream", sc.id}};
    s.frames_total = &reg_.GetCounter("vigil_edge_frames_total", "Frames processed and reported", labels);
    s.errors_total = &reg_.GetCounter("vigil_edge_stream_errors_total", "Streams that failed to open or ended with an error", labels);
    s.fps = &reg_.GetGauge("vigil_edge_fps", "Frames processed per second, per stream", labels);
    StatusOr<RuleEngine> rules = RuleEngine::Create(sc.rules, names);
    if (!rules.ok()) return Annotate(rules.status(), "stream '" + sc.id + "'");
    s.rules = std::move(*rules);
    StatusOr<std::optional<StreamCursor>> loaded = state_->Load(sc.id);
    if (!loaded.ok()) spdlog::warn("stream '{}': {}; starting a new run", sc.id, std::string(loaded.status().message()));
    video::SourceOptions so;
    if (loaded.ok() && *loaded && (*loaded)->source == sc.source) {
      s.saved = **loaded;
      so.start_after_seq = s.saved.cursor;
      spdlog::info("stream '{}': resuming run {} after seq {}", sc.id, s.saved.run,
                   s.saved.cursor ? std::to_string(*s.saved.cursor) : "none");
    } else {
      s.saved = {state_->epoch(), std::nullopt, sc.source};
      if (Status st = state_->Save(sc.id, s.saved); !st.ok()) spdlog::warn("stream '{}': {}", sc.id, std::string(st.message()));
      spdlog::info("stream '{}': new run {}", sc.id, s.saved.run);
    }
    so.uri = sc.source;
    so.stream_id = sc.id;
    so.run = s.saved.run;
    so.realtime = sc.realtime;
    so.loop = sc.loop;
    so.target_fps = sc.target_fps;
    so.hwaccel = sc.hwaccel;
    // Frames decoded on the Detector's GPU stay there (NV12 into the GPU letterbox); save_frames needs
    // host pixels, so such a stream gets host frames.
    const StatusOr<std::optional<int>> decode_gpu = video::ParseHwaccel(sc.hwaccel);
    so.deliver_device_frames = gpu_frames_device_ >= 0 && decode_gpu.ok() && *decode_gpu == gpu_frames_device_ &&
                               sc.save_frames.empty();
    s.progress.emplace(sc.id, s.saved.run);
    if (!sc.save_frames.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(sc.save_frames, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            StrCat("stream '", sc.id, "': save_frames ", sc.save_frames, ": cannot create the folder: ", ec.message()));
      }
    }
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
  return absl::OkStatus();
}

void Edge::Place() {
  std::vector<video::Source::Probe> probed;
  for (const Stream& s : streams_) probed.push_back(s.source ? s.source->probed() : video::Source::Probe{});
  double gflop = config_.placement.gflop_per_frame;
  if (gflop <= 0) {
    gflop = ModelGflopsPerFrame(detector_->engine().graph());
    spdlog::info("placement: model cost {:.2f} GFLOP per frame (counted from the model)", gflop);
  }
  std::vector<std::string> notes;
  std::vector<topology::StreamSpec> specs = PlanStreams(config_, probed, gflop, &notes);
  for (const std::string& n : notes) spdlog::info("placement: {}", n);
  // On a GPU, the plan keeps the Detector's GPU: threads (and the staging the worker allocates) on its node.
  const infer::DeviceIo* io = detector_->uses_gpu_stages() ? detector_->engine().device_io() : nullptr;
  placement_ = std::make_unique<EdgePlacement>(config_.placement, specs, /*use_gpus=*/io != nullptr,
                                               config_.state_dir, io != nullptr ? io->device : -1);
}

void Edge::StartReaders() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    if (!s.source) continue;
    video::StreamReaderOptions ro;
    ro.queue_capacity = static_cast<size_t>(std::max(4, config_.max_batch));
    ro.on_thread_start = [this, i] { placement_->PlaceThread(ThreadRole::kDecode, i); };
    s.reader = std::make_unique<video::StreamReader>(std::move(s.source), ro);
  }
}

void Edge::Feed(size_t index) {
  Stream& s = streams_[index];
  while (!stop_.load()) {
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
    if (!batcher_.Push({index, std::move(frame)})) break;
  }
  s.reader->Stop();
  if (--active_ == 0) batcher_.Close();
}

void Edge::Publish(transport::Report report, const Stream& s) {
  const int64_t t0 = SteadyNs();
  report.publish_ns = WallNs();
  for (;;) {
    const bool patient = !s.live && !stop_.load();
    Status st = publisher_->Publish(report, patient ? milliseconds(500) : milliseconds(0));
    if (st.ok()) break;
    if (absl::IsResourceExhausted(st) && patient) continue;
    reg_.GetCounter("vigil_edge_frames_dropped_total", "Frames dropped, by reason",
                    {{"stream", s.config.id}, {"reason", absl::IsResourceExhausted(st) ? "backpressure" : "publish_error"}})
        .Inc(static_cast<double>(report.seq_last - report.seq_first + 1));
    spdlog::warn("stream '{}': report of seq {}..{} not published: {}", s.config.id, report.seq_first,
                 report.seq_last, std::string(st.message()));
    break;
  }
  Stage("publish").Observe(static_cast<double>(SteadyNs() - t0) * 1e-9);
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

void Edge::Process(std::vector<Item>& batch) {
  const int64_t t0 = SteadyNs();
  std::vector<detect::DetectTiming> timing;
  StatusOr<std::vector<std::vector<detect::Detection>>> dets = absl::UnknownError("not run");
  if (detector_->uses_gpu_stages()) {
    // GPU stages: frames are read where they are (host BGR uploaded, NVDEC frames in place); the
    // device frames' surfaces stay held by `batch` until DetectFrames has waited for the GPU.
    std::vector<detect::FrameRef> frames(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const video::Frame& f = batch[i].frame;
      if (const Stream& s = streams_[batch[i].stream]; !s.config.save_frames.empty() && !f.device) SaveFrame(s, f);
      frames[i] = FrameRefOf(f);
    }
    dets = detector_->DetectFrames(frames, &timing);
  } else {
    std::vector<detect::Image> images(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      video::Frame& f = batch[i].frame;
      if (f.device) {  // not asked for (deliver_device_frames is off without GPU stages), but handled
        if (Status st = video::DownloadBgr(f); !st.ok()) spdlog::warn("{}", std::string(st.message()));
      }
      if (const Stream& s = streams_[batch[i].stream]; !s.config.save_frames.empty()) SaveFrame(s, f);
      images[i].width = f.width;
      images[i].height = f.height;
      images[i].bgr = std::move(f.bgr);
    }
    dets = detector_->Detect(images, &timing);
  }
  if (!dets.ok()) {
    spdlog::error("detection of a batch of {} frames failed: {}", batch.size(), std::string(dets.status().message()));
    for (const Item& item : batch) {
      reg_.GetCounter("vigil_edge_frames_dropped_total", "Frames dropped, by reason",
                      {{"stream", streams_[item.stream].config.id}, {"reason", "detect_error"}})
          .Inc();
    }
    return;
  }
  metrics::Histogram& decode_stage = Stage("decode");
  metrics::Histogram& queue_stage = Stage("queue");
  metrics::Histogram& preprocess_stage = Stage("preprocess");
  metrics::Histogram& inference_stage = Stage("inference");
  metrics::Histogram& postprocess_stage = Stage("postprocess");
  double engine_ns = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const video::Frame& f = batch[i].frame;
    const detect::DetectTiming& t = timing[i];
    decode_stage.Observe(static_cast<double>(f.decode_ns) * 1e-9);
    queue_stage.Observe(static_cast<double>(t0 - f.source_steady_ns) * 1e-9);
    preprocess_stage.Observe(static_cast<double>(t.preprocess_ns) * 1e-9);
    inference_stage.Observe(static_cast<double>(t.inference_ns) * 1e-9);
    postprocess_stage.Observe(static_cast<double>(t.postprocess_ns) * 1e-9);
    engine_ns += static_cast<double>(t.inference_ns) / t.chunk_images;
  }
  reg_.GetCounter("vigil_edge_engine_busy_seconds_total", "Time the inference engine spent running batches")
      .Inc(engine_ns * 1e-9);
  metrics::Histogram& rules_stage = Stage("rules");
  for (size_t i = 0; i < batch.size(); ++i) {
    const video::Frame& f = batch[i].frame;
    Stream& s = streams_[batch[i].stream];
    const int64_t r0 = SteadyNs();
    Verdict v = s.rules->Evaluate((*dets)[i], f.pts_ns);
    rules_stage.Observe(static_cast<double>(SteadyNs() - r0) * 1e-9);
    if (v.event) {
      if (std::optional<transport::Report> marks = s.progress->Take()) Publish(std::move(*marks), s);
      transport::Report r;
      r.stream = s.config.id;
      r.run = f.run;
      r.seq_first = r.seq_last = f.seq;
      r.kind = transport::ReportKind::kEvent;
      r.severity = v.severity;
      r.capture_ns = f.capture_time_ns;
      r.pts_ns = f.pts_ns;
      r.width = static_cast<uint32_t>(f.width);
      r.height = static_cast<uint32_t>(f.height);
      r.rule = "rules";
      for (const detect::Detection& d : v.detections) {
        r.detections.push_back({d.class_id, d.score, d.x1, d.y1, d.x2, d.y2, detector_->ClassName(d.class_id)});
      }
      reg_.GetCounter("vigil_edge_events_total", "Events raised",
                      {{"stream", s.config.id}, {"severity", std::string(transport::ToString(v.severity))}})
          .Inc();
      Publish(std::move(r), s);
    } else if (std::optional<transport::Report> marks =
                   s.progress->Add(f.seq, f.capture_time_ns, f.pts_ns, static_cast<uint32_t>(f.width),
                                   static_cast<uint32_t>(f.height), SteadyNs())) {
      Publish(std::move(*marks), s);
    }
    s.unacked.emplace_back(f.seq, f.source_steady_ns);
    if (s.unacked.size() > kMaxUnackedTimes) s.unacked.pop_front();  // acks stalled: forget the oldest
    ++s.frames;
    s.frames_total->Inc();
  }
}

void Edge::Periodic(bool force) {
  const int64_t now = SteadyNs();
  if (!force && now - last_periodic_ns_ < 100'000'000) return;
  last_periodic_ns_ = now;
  const bool fps_due = now - last_fps_ns_ >= 1'000'000'000;
  int active = 0;
  for (Stream& s : streams_) {
    if (std::optional<transport::Report> marks =
            s.progress->TakeIfOlder(now, int64_t{config_.progress_flush_ms} * 1'000'000)) {
      Publish(std::move(*marks), s);
    }
    std::optional<uint64_t> acked = publisher_->AckedThrough(s.config.id, s.saved.run);
    if (acked && acked != s.saved.cursor) {
      while (!s.unacked.empty() && s.unacked.front().first <= *acked) {
        Stage("frame_to_ack").Observe(static_cast<double>(now - s.unacked.front().second) * 1e-9);
        s.unacked.pop_front();
      }
      s.saved.cursor = acked;
      if (Status st = state_->Save(s.config.id, s.saved); !st.ok()) {
        spdlog::warn("stream '{}': cursor not saved: {}", s.config.id, std::string(st.message()));
      }
    }
    if (fps_due && last_fps_ns_ != 0) {
      s.fps->Set(static_cast<double>(s.frames - s.fps_frames) * 1e9 / static_cast<double>(now - last_fps_ns_));
    }
    if (fps_due) s.fps_frames = s.frames;
    if (!s.reader) continue;
    const video::StreamStats st = s.reader->Stats();
    if (st.state != video::StreamState::kEnded && st.state != video::StreamState::kFailed &&
        st.state != video::StreamState::kStopped) {
      ++active;
    }
    const metrics::Labels labels{{"stream", s.config.id}};
    reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue",
                  {{"queue", "reader"}, {"stream", s.config.id}})
        .Set(static_cast<double>(st.queue_depth));
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
    reg_.GetCounter("vigil_edge_frames_dropped_total", "Frames dropped, by reason",
                    {{"stream", s.config.id}, {"reason", "queue_full"}})
        .Inc(delta(st.dropped_queue_full, s.last_stats.dropped_queue_full));
    reg_.GetCounter("vigil_edge_decode_errors_total", "Corrupt packets, frames or images, per stream", labels)
        .Inc(delta(st.decode_errors, s.last_stats.decode_errors));
    reg_.GetCounter("vigil_edge_reconnects_total", "Successful reconnects of network sources", labels)
        .Inc(delta(st.reconnects, s.last_stats.reconnects));
    s.last_stats = st;
  }
  if (fps_due) last_fps_ns_ = now;
  const transport::PublisherStats ps = publisher_->Stats();
  reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue", {{"queue", "batcher"}})
      .Set(static_cast<double>(batcher_.depth()));
  reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue", {{"queue", "outbox"}})
      .Set(static_cast<double>(ps.outbox));
  reg_.GetGauge("vigil_edge_streams_active", "Streams still delivering frames").Set(active);
  reg_.GetGauge("vigil_edge_aggregator_connected", "1 while connected to the aggregator").Set(ps.connected ? 1 : 0);
}

void Edge::StartHttp() {
  if (config_.http_port == 0) return;
  http_ = std::make_unique<httplib::Server>();
  http_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    const transport::PublisherStats ps = publisher_->Stats();
    res.set_content(std::string("{\"status\":\"ok\",\"edge\":\"") + config_.edge + "\",\"epoch\":" +
                        std::to_string(state_->epoch()) + ",\"aggregator_connected\":" +
                        (ps.connected ? "true" : "false") + ",\"outbox\":" + std::to_string(ps.outbox) + "}",
                    "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(reg_.Render(), metrics::Registry::kContentType);
  });
  http_->Get("/api/placement", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(topology::PlacementReportToJson(placement_->Report()), "application/json");
  });
  if (!http_->bind_to_port(config_.http_host, config_.http_port)) {
    spdlog::error("edge: cannot bind http {}:{}; /healthz and /metrics are off", config_.http_host,
                  config_.http_port);
    http_.reset();
    return;
  }
  http_port_ = config_.http_port;
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
}

Status Edge::Run(const EdgeRunOptions& options) {
  VIGIL_ASSIGN_OR_RETURN(EdgeState state, EdgeState::Open(config_.state_dir));
  state_ = std::move(state);
  detect::DetectorOptions dopt;
  dopt.engine.threads = config_.threads;
  dopt.engine.device = config_.device;
  if (StatusOr<infer::Precision> p = infer::ParsePrecision(config_.precision); p.ok()) dopt.engine.precision = *p;
  dopt.engine.batch = config_.model_batch;
  dopt.conf = static_cast<float>(config_.conf);
  dopt.iou = static_cast<float>(config_.iou);
  dopt.max_det = config_.max_det;
  // Streams decoded by NVDEC: FFmpeg must make each GPU's primary CUDA context (with its flags) before the
  // model's CUDA runtime touches that GPU; the runtime then shares it (video::RetainCudaDecodeDevice).
  std::set<int> decode_gpus;
  for (const StreamConfig& sc : config_.streams) {
    if (StatusOr<std::optional<int>> d = video::ParseHwaccel(sc.hwaccel); d.ok() && *d) decode_gpus.insert(**d);
  }
  for (int gpu : decode_gpus) {
    StatusOr<std::shared_ptr<void>> held = video::RetainCudaDecodeDevice(gpu);
    if (held.ok()) {
      decode_devices_.push_back(std::move(*held));
    } else {
      spdlog::warn("hwaccel: {}; its streams decode on the CPU", std::string(held.status().message()));
    }
  }
  VIGIL_ASSIGN_OR_RETURN(detector_, detect::Detector::Load(config_.model_path, dopt));
  if (detector_->uses_gpu_stages() && !decode_devices_.empty()) gpu_frames_device_ = detector_->engine().device_io()->device;
  std::vector<std::string> names;
  for (int64_t c = 0; c < detector_->model().num_classes; ++c) names.push_back(detector_->ClassName(static_cast<int>(c)));
  transport::TcpPublisherOptions popt;
  popt.edge = config_.edge;
  popt.epoch = state_->epoch();
  popt.host = config_.aggregator_host;
  popt.port = config_.aggregator_port;
  VIGIL_ASSIGN_OR_RETURN(publisher_, transport::MakeTcpPublisher(popt));
  VIGIL_RETURN_IF_ERROR(OpenStreams(names));
  if (!config_.streams.empty() &&
      std::none_of(streams_.begin(), streams_.end(), [](const Stream& st) { return st.source != nullptr; })) {
    // Nothing to run: fail loudly so that a supervisor restarts or alerts (each reason was logged above).
    return absl::FailedPreconditionError(StrCat("none of the ", config_.streams.size(),
                                                " configured streams could be opened (see the errors above)"));
  }
  Place();
  RegisterNumaMetrics(reg_);
  StartReaders();
  spdlog::info("edge '{}': epoch {}, {} streams, aggregator {}:{}", config_.edge, state_->epoch(), streams_.size(),
               config_.aggregator_host, config_.aggregator_port);
  StartHttp();
  if (options.on_started) options.on_started(static_cast<uint16_t>(http_port_));

  std::vector<std::thread> feeders;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].reader) ++active_;
  }
  if (active_ == 0) batcher_.Close();
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].reader) {
      feeders.emplace_back([this, i] {
        placement_->PlaceThread(ThreadRole::kFeed, i);
        Feed(i);
      });
    }
  }
  // Inference on its own thread, so that its binding (and its OpenMP team's, created from it) is its own.
  std::thread worker([this] {
    placement_->PlaceThread(ThreadRole::kWorker);
    std::vector<Item> batch;
    for (;;) {
      const Batcher<Item>::Result r = batcher_.NextBatch(&batch, milliseconds(50));
      if (r == Batcher<Item>::Result::kClosed) break;
      if (r == Batcher<Item>::Result::kBatch) Process(batch);
      Periodic(false);
    }
  });
  worker.join();
  for (std::thread& t : feeders) t.join();
  for (Stream& s : streams_) {
    if (std::optional<transport::Report> marks = s.progress->Take()) Publish(std::move(*marks), s);
  }
  const bool flushed = publisher_->Flush(options.shutdown_timeout);
  Periodic(true);
  const transport::PublisherStats ps = publisher_->Stats();
  publisher_->Close();
  if (!flushed) {
    spdlog::warn("edge '{}': {} reports not acknowledged within {} ms; a restart re-sends them", config_.edge,
                 ps.outbox, options.shutdown_timeout.count());
  }
  uint64_t frames = 0;
  for (const Stream& s : streams_) frames += s.frames;
  spdlog::info("edge '{}': done: {} frames, {} reports published, {} acknowledged, {} rejected", config_.edge,
               frames, ps.published, ps.acked, ps.rejected);
  if (http_) {
    // A stop() before the server thread is listening is lost: give it up to 2 s to get there.
    for (int i = 0; i < 2000 && !http_->is_running(); ++i) std::this_thread::sleep_for(milliseconds(1));
    http_->stop();
    http_thread_.join();
  }
  return absl::OkStatus();
}

}  // namespace

Status RunEdge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& registry,
               const EdgeRunOptions& options) {
  Edge edge(config, stop, registry);
  return edge.Run(options);
}

}  // namespace vigil::pipeline
