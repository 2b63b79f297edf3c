// `vigil bench streams` — how many camera streams the edge holds in real time: for each stream count N of
// --streams, the edge pipeline itself (pipeline::RunEdge: stream readers, the WorkerPool's per-device
// batchers and Detectors, the sink, the stream ledger, the courier) runs N streams against an aggregator
// in the same process (aggregator::Aggregator on 127.0.0.1, its SQLite database in a temporary folder),
// exactly as `vigil edge` and `vigil aggregator` run them; nothing is bypassed.
//
// Streams: N synthetic 1920×1080 sources (--width, --height) at --fps, played in real time (video/source.h,
// "synthetic:": a test pattern, no decoding cost), or with --video FILE N copies of that file played in
// real time at its own rate, looped, each decoding it itself — on the GPU of its device with --hwaccel
// cuda (NVDEC; NV12 frames stay in GPU memory for the Detector), or on the CPU (--hwaccel cpu); with --fps
// below the file's rate a stream keeps that many frames a second (target_fps). Stream s runs on device
// s mod D (--devices); each device has --workers-per-device Detectors (engine batch --batch, default the
// model's fixed batch, else 16) and batches of up to --batch frames with a --max-wait-ms deadline.
//
// Measured over --seconds after --warmup-s (the warm-up starts once the aggregator admitted the edge and
// every stream had a frame detected): for every frame due in the window — due = its stream's start + its pts, the
// time a camera would have sent it, so a pipeline that falls behind shows as latency, not as a slower
// clock — frame→detection (detections ready on the host, EdgeRunOptions::on_detected) and
// frame→stored (its report acknowledged by the aggregator after the commit, EdgeRunOptions::on_acked;
// frames without an event travel as progress marks, published every --progress-flush-ms). A frame due in
// the window and not detected within --budget-ms after the window's end is unserved. Frames the edge
// dropped (vigil_edge_frames_dropped_total) are reported. A count holds when nothing is unserved or
// dropped and p99 frame→detection <= --budget-ms; the sweep stops at the first count that does not hold.
// CPU ms per frame: the process's CPU time (edge and aggregator, getrusage) over the window / frames served.
//
// A model or --video file that does not open fails the run (exit 2, naming it); an edge that cannot start
// (e.g. the model on a device that is not there) fails it with exit 1 and its error; an edge that fails
// during a trial ends that trial with its error, which then does not hold. Exit codes as cli/commands.h. Output:
// a table, or with --json one object with a summary and one entry per stream count.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#ifdef VIGIL_HAVE_PIPELINE
#include "cli/bench_stats.h"
#include "vigil/aggregator/aggregator.h"
#include "vigil/transport/auth.h"
#include "vigil/infer/engine.h"
#include "vigil/pipeline/edge.h"
#include "vigil/video/source.h"
#endif

namespace vigil::cli {
#ifdef VIGIL_HAVE_PIPELINE
namespace {

namespace fs = std::filesystem;

struct BenchStreamsArgs {
  std::string model;
  std::string devices = "cuda:0";
  std::string precision = "fp16";
  std::string streams = "16,32,48,64,80,96,112,128,160";
  double fps = 30;
  bool fps_given = false;
  double seconds = 8;
  double warmup_s = 2;
  int64_t batch = 0;  // 0: 16 for a symbolic batch, else the model's fixed batch
  int workers_per_device = 2;
  int max_wait_ms = 2;
  int progress_flush_ms = 10;
  int width = 1920, height = 1080;
  double budget_ms = 25;
  bool json = false;
  std::string video;             // --video: every stream decodes this file
  std::string hwaccel = "cuda";  // --video: "cuda" (NVDEC on the stream's device) or "cpu"
};

int64_t NowNs() { return SystemClock()->SteadyNs(); }

// One stream's bookkeeping (the sink and courier threads write it, under Trial::mu).
struct StreamTrack {
  int64_t anchor_ns = INT64_MAX;   // its start: the smallest source_steady_ns − pts_ns seen
  std::map<uint64_t, int64_t> due;  // seq → due time of frames in the window detected and not yet acknowledged
  int64_t served = 0;               // frames due in the window and detected in time
};

struct TrialResult {
  int streams = 0;
  double offered_fps = 0, served_fps = 0, min_stream_fps = 0;
  Latency detection, stored;  // frame→detection, frame→stored (acknowledged), ms
  int64_t served = 0, unserved = 0, dropped = 0, not_stored = 0;
  double mean_batch = 0;
  double cpu_ms_per_frame = 0;
  double startup_s = 0;  // RunEdge called → every stream had a frame detected (model loads, admission, decoders)
  std::vector<double> served_fps_per_device;
  std::map<std::string, int> streams_by_decoder;  // vigil_edge_stream_decoder at 1: "cpu", "cuda:0", "cpu (why)"
  Latency decode;                                 // Frame::decode_ns of the frames served, ms
  int64_t decode_errors = 0;
  bool holds = false;
  bool started = false;  // the edge started its streams (else `error` says why it could not: model, device)
  std::string error;
};

StatusOr<std::vector<int>> ParseList(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      const int v = std::stoi(item);
      if (v < 1) throw std::out_of_range("< 1");
      out.push_back(v);
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(StrCat("--streams: '", item, "' is not a positive count"));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--streams is empty");
  return out;
}

std::string StreamId(int s) {
  char id[16];
  std::snprintf(id, sizeof id, "s%03d", s);
  return id;
}

double SumCounter(const std::string& text, const std::string& name, const std::string& label_filter) {
  // Sums the samples of counter `name` in Prometheus text whose label set contains label_filter.
  double total = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0 || line.find(label_filter) == std::string::npos) continue;
    total += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return total;
}

// What a stream of this run plays: its URI, target_fps and frame rate.
struct Play {
  std::string uri;
  double target_fps = 0;
  double fps = 0;  // frames per second each stream delivers
};

TrialResult RunTrial(const BenchStreamsArgs& a, int n, const std::vector<std::string>& devices, const Play& play,
                     const fs::path& work) {
  TrialResult r;
  r.streams = n;
  r.offered_fps = n * play.fps;
  const fs::path dir = work / StrCat("n", n);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  aggregator::AggregatorConfig ac;
  ac.listen_host = ac.http_host = "127.0.0.1";
  ac.listen_port = ac.http_port = 0;
  ac.db_path = (dir / "aggregator.db").string();
  ac.max_connections = 16;
  ac.queue_max = 1 << 20;
  // Authenticated, as shipped: a fresh key for this run's edge.
  const std::string key_hex = transport::NewKeyHex();
  ac.keys_file = (dir / "keys.yaml").string();
  std::ofstream(ac.keys_file) << "bench: " << key_hex << "\n";
  std::ofstream((dir / "edge.key").string()) << key_hex << "\n";
  fs::permissions(ac.keys_file, fs::perms::owner_read | fs::perms::owner_write, ec);
  fs::permissions(dir / "edge.key", fs::perms::owner_read | fs::perms::owner_write, ec);
  StatusOr<std::unique_ptr<aggregator::Aggregator>> agg = aggregator::Aggregator::Start(ac);
  if (!agg.ok()) {
    r.error = StrCat("aggregator: ", agg.status().message());
    return r;
  }

  pipeline::EdgeConfig cfg;
  cfg.edge = "bench";
  cfg.aggregator_host = "127.0.0.1";
  cfg.aggregator_port = (*agg)->listen_port();
  cfg.model_path = a.model;
  cfg.devices = devices;
  cfg.precision = a.precision;
  cfg.model_batch = static_cast<int>(a.batch);
  cfg.max_batch = static_cast<int>(a.batch);
  cfg.max_wait_ms = a.max_wait_ms;
  cfg.workers_per_device = a.workers_per_device;
  cfg.state_dir = (dir / "state").string();
  cfg.key_file = (dir / "edge.key").string();
  cfg.progress_flush_ms = a.progress_flush_ms;
  cfg.max_outbox = 1 << 20;
  for (int s = 0; s < n; ++s) {
    pipeline::StreamConfig sc;
    sc.id = StreamId(s);
    sc.source = play.uri;
    sc.realtime = true;
    sc.loop = true;
    sc.target_fps = play.target_fps;
    if (!a.video.empty()) {
      const int gpu = pipeline::CudaOrdinal(devices[static_cast<size_t>(s) % devices.size()]);
      sc.hwaccel = a.hwaccel == "cpu" ? "cpu" : StrCat("cuda:", gpu >= 0 ? gpu : 0);
    }
    cfg.streams.push_back(std::move(sc));
  }

  // mu guards tracks, the *_ms vectors, served_by_device, batches and batch_frames (local variables: the
  // analysis cannot annotate them).
  Mutex mu;
  std::vector<StreamTrack> tracks(static_cast<size_t>(n));
  std::map<std::string, size_t> index;
  for (int s = 0; s < n; ++s) index[StreamId(s)] = static_cast<size_t>(s);
  std::vector<double> detection_ms, stored_ms, decode_ms;
  std::vector<int64_t> served_by_device(devices.size(), 0);
  int64_t batches = 0, batch_frames = 0;
  std::atomic<int64_t> started_ns{0};
  std::atomic<int64_t> from_ns{INT64_MAX}, end_ns{INT64_MAX}, late_ns{INT64_MAX};
  const int64_t warmup_ns = static_cast<int64_t>(a.warmup_s * 1e9), window_ns = static_cast<int64_t>(a.seconds * 1e9);
  const int64_t budget_ns = static_cast<int64_t>(a.budget_ms * 1e6);

  pipeline::EdgeRunOptions options;
  options.shutdown_timeout = std::chrono::milliseconds(3000);
  options.on_started = [&](uint16_t) { started_ns = NowNs(); };
  options.on_detected = [&](const pipeline::BatchResult& b) {
    const int64_t from = from_ns.load(), end = end_ns.load(), late = late_ns.load();
    MutexLock lock(mu);
    int in_window = 0;
    for (const pipeline::WorkItem& it : b.items) {
      StreamTrack& t = tracks[it.stream];
      const video::Frame& f = it.frame;
      t.anchor_ns = std::min(t.anchor_ns, f.source_steady_ns - f.pts_ns);
      const int64_t due = t.anchor_ns + f.pts_ns;
      if (due < from || due >= end || !b.status.ok() || b.detected_ns > late) continue;
      ++in_window;
      ++t.served;
      ++served_by_device[b.device];
      detection_ms.push_back(static_cast<double>(b.detected_ns - due) / 1e6);
      decode_ms.push_back(static_cast<double>(f.decode_ns) / 1e6);
      t.due[f.seq] = due;
    }
    if (in_window > 0) {
      ++batches;
      batch_frames += static_cast<int64_t>(b.items.size());
    }
  };
  options.on_acked = [&](const transport::Ack& ack) {
    const int64_t now = NowNs();
    MutexLock lock(mu);
    auto i = index.find(ack.stream);
    if (i == index.end()) return;
    std::map<uint64_t, int64_t>& due = tracks[i->second].due;
    for (auto it = due.lower_bound(ack.seq_first); it != due.end() && it->first <= ack.seq_last; it = due.erase(it)) {
      stored_ms.push_back(static_cast<double>(now - it->second) / 1e6);
    }
  };

  metrics::Registry registry;
  std::atomic<bool> stop{false};
  Status result;
  std::atomic<bool> finished{false};
  const int64_t called_ns = NowNs();
  std::thread edge([&] {
    result = pipeline::RunEdge(cfg, stop, registry, options);
    finished = true;
  });
  // Until the streams start (model loads, admission): bounded, in case the edge never gets there.
  for (int i = 0; i < 6000 && started_ns.load() == 0 && !finished.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Then until every stream has a frame detected (decoders start one after another: NVDEC takes ~55 ms each).
  auto all_streaming = [&] {
    MutexLock lock(mu);
    return std::all_of(tracks.begin(), tracks.end(), [](const StreamTrack& t) { return t.anchor_ns != INT64_MAX; });
  };
  for (int i = 0; i < 6000 && started_ns.load() != 0 && !finished.load() && !all_streaming(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  double cpu_ms = 0;
  if (started_ns.load() != 0 && !finished.load()) {
    const int64_t now = NowNs();
    r.startup_s = static_cast<double>(now - called_ns) / 1e9;
    from_ns = now + warmup_ns;
    end_ns = now + warmup_ns + window_ns;
    late_ns = now + warmup_ns + window_ns + budget_ns;
    auto sleep_until_ns = [&](int64_t t) {
      while (!finished.load() && NowNs() < t) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    };
    sleep_until_ns(from_ns.load());
    const double cpu0 = ProcessCpuMs();
    sleep_until_ns(end_ns.load());
    cpu_ms = ProcessCpuMs() - cpu0;
    // The last frames' detections (the budget), then their acknowledgements (a little longer).
    sleep_until_ns(late_ns.load() + std::max<int64_t>(budget_ns, 2LL * a.progress_flush_ms * 1'000'000 + 200'000'000));
  }
  const std::string scrape = registry.Render();
  stop = true;
  edge.join();
  (*agg)->Stop();
  if (!result.ok()) r.error = std::string(result.message());
  r.started = started_ns.load() != 0;
  if (!r.started && r.error.empty()) r.error = "the edge did not start its streams within 300 s";

  r.dropped = static_cast<int64_t>(SumCounter(scrape, "vigil_edge_frames_dropped_total", "stream="));
  r.decode_errors = static_cast<int64_t>(SumCounter(scrape, "vigil_edge_decode_errors_total", "stream="));
  {
    std::istringstream in(scrape);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("vigil_edge_stream_decoder{", 0) != 0 || std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr) != 1) {
        continue;
      }
      const size_t at = line.find("decoder=\"") + 9;
      ++r.streams_by_decoder[line.substr(at, line.find('"', at) - at)];
    }
  }
  MutexLock lock(mu);
  const int64_t expected_per_stream = static_cast<int64_t>(std::llround(a.seconds * play.fps));
  r.min_stream_fps = 1e18;
  for (const StreamTrack& t : tracks) {
    r.served += t.served;
    r.unserved += std::max<int64_t>(0, expected_per_stream - t.served);
    r.not_stored += static_cast<int64_t>(t.due.size());
    r.min_stream_fps = std::min(r.min_stream_fps, static_cast<double>(t.served) / a.seconds);
  }
  for (int64_t d : served_by_device) r.served_fps_per_device.push_back(static_cast<double>(d) / a.seconds);
  r.served_fps = static_cast<double>(r.served) / a.seconds;
  r.detection = Summarize(std::move(detection_ms));
  r.stored = Summarize(std::move(stored_ms));
  r.decode = Summarize(std::move(decode_ms));
  r.mean_batch = batches > 0 ? static_cast<double>(batch_frames) / static_cast<double>(batches) : 0;
  r.cpu_ms_per_frame = r.served > 0 ? cpu_ms / static_cast<double>(r.served) : 0;
  r.holds = r.error.empty() && r.unserved == 0 && r.dropped == 0 && r.detection.p99 <= a.budget_ms;
  fs::remove_all(dir, ec);
  return r;
}

nlohmann::json LatencyJson(const Latency& l) {
  return {{"p50", l.p50}, {"p90", l.p90}, {"p99", l.p99}, {"mean", l.mean}, {"max", l.max}};
}

nlohmann::json ToJson(const TrialResult& r) {
  nlohmann::json j;
  j["streams"] = r.streams;
  j["offered_fps"] = r.offered_fps;
  j["served_fps"] = r.served_fps;
  j["min_stream_fps"] = r.min_stream_fps;
  j["served"] = r.served;
  j["unserved"] = r.unserved;
  j["dropped"] = r.dropped;
  j["latency_ms"] = LatencyJson(r.detection);
  j["stored_ms"] = LatencyJson(r.stored);
  j["not_stored"] = r.not_stored;
  j["mean_batch"] = r.mean_batch;
  j["cpu_ms_per_frame"] = r.cpu_ms_per_frame;
  j["served_fps_per_device"] = r.served_fps_per_device;
  j["startup_s"] = r.startup_s;
  j["decode"] = {{"decoders", r.streams_by_decoder}, {"errors", r.decode_errors}, {"ms", LatencyJson(r.decode)}};
  j["holds"] = r.holds;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

int BenchStreams(BenchStreamsArgs a) {
  auto counts = ParseList(a.streams);
  if (!counts.ok()) {
    std::fprintf(stderr, "vigil bench streams: %s\n", std::string(counts.status().message()).c_str());
    return 2;
  }
  if (!a.video.empty() && a.hwaccel != "cuda" && a.hwaccel != "cpu") {
    std::fprintf(stderr, "vigil bench streams: --hwaccel '%s' is not 'cuda' or 'cpu'\n", a.hwaccel.c_str());
    return 2;
  }
  if (auto p = infer::ParsePrecision(a.precision); !p.ok()) {
    std::fprintf(stderr, "vigil bench streams: --precision: %s\n", std::string(p.status().message()).c_str());
    return 2;
  }
  std::vector<std::string> devices;
  {
    std::stringstream ss(a.devices);
    std::string d;
    while (std::getline(ss, d, ',')) devices.push_back(d == "cuda" ? "cuda:0" : d);
  }
  for (const std::string& d : devices) {
    if (d != "cpu" && pipeline::CudaOrdinal(d) < 0) {
      std::fprintf(stderr, "vigil bench streams: --devices: '%s' is not cpu or cuda:N\n", d.c_str());
      return 2;
    }
  }
  if (devices.empty()) {
    std::fprintf(stderr, "vigil bench streams: --devices is empty\n");
    return 2;
  }
  // A model with a fixed batch runs it; a symbolic batch gets --batch (16 when not given).
  StatusOr<infer::ModelSummary> summary = infer::InspectModel(a.model);
  if (!summary.ok()) {
    std::fprintf(stderr, "vigil bench streams: %s\n", std::string(summary.status().message()).c_str());
    return 2;
  }
  if (!summary->inputs.empty() && !summary->inputs[0].dims.empty() && summary->inputs[0].dims[0].value > 0) {
    const int64_t fixed = summary->inputs[0].dims[0].value;
    if (a.batch > 0 && a.batch != fixed) {
      std::fprintf(stderr, "vigil bench streams: %s has a fixed batch of %lld; --batch %lld ignored\n", a.model.c_str(),
                   static_cast<long long>(fixed), static_cast<long long>(a.batch));
    }
    a.batch = fixed;
  }
  if (a.batch == 0) a.batch = 16;
  // What each stream plays.
  Play play;
  if (a.video.empty()) {
    play.uri = StrCat("synthetic:", a.width, "x", a.height, "?fps=", a.fps);
    play.fps = a.fps;
  } else {
    video::SourceOptions probe;
    probe.uri = a.video;
    probe.stream_id = "probe";
    StatusOr<std::unique_ptr<video::Source>> source = video::OpenSource(std::move(probe));
    StatusOr<std::optional<video::Frame>> first = source.ok() ? (*source)->Next() : source.status();
    if (!first.ok() || !first->has_value()) {
      std::fprintf(stderr, "vigil bench streams: --video: %s\n",
                   first.ok() ? StrCat(a.video, ": no frame").c_str() : std::string(first.status().message()).c_str());
      return 2;
    }
    a.width = (*first)->width;
    a.height = (*first)->height;
    const double native = (*source)->probed().fps > 0 ? (*source)->probed().fps : 30;
    play.uri = a.video;
    play.fps = native;
    if (a.fps_given && a.fps < native) {
      play.target_fps = a.fps;
      play.fps = a.fps;
    }
  }
  std::error_code ec;
  const char* tmp = std::getenv("TMPDIR");
  const fs::path work = fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / StrCat("vigil-bench-streams-", getpid());
  fs::create_directories(work, ec);
  if (ec) {
    std::fprintf(stderr, "vigil bench streams: %s: %s\n", work.c_str(), ec.message().c_str());
    return 1;
  }
  nlohmann::json trials = nlohmann::json::array();
  int holding = 0;
  if (!a.json) {
    std::printf("%s: %s, %dx%d at %.1f FPS per stream, %zu device(s) x %d workers, batch %lld (wait %d ms), "
                "edge + aggregator in this process\n",
                a.model.c_str(), a.video.empty() ? "synthetic frames" : (a.video + " (--hwaccel " + a.hwaccel + ")").c_str(),
                a.width, a.height, play.fps, devices.size(), a.workers_per_device, static_cast<long long>(a.batch),
                a.max_wait_ms);
    std::printf("%8s %10s %10s %9s %9s %9s %9s %9s %8s %8s %6s %10s %6s\n", "streams", "offered/s", "served/s", "det p50",
                "det p99", "stored p50", "stored p99", "unserved", "dropped", "batch", "min fps", "cpu ms/fr", "holds");
  }
  for (int n : *counts) {
    TrialResult r = RunTrial(a, n, devices, play, work);
    if (r.holds) holding = std::max(holding, n);
    trials.push_back(ToJson(r));
    if (!a.json) {
      std::printf("%8d %10.0f %10.0f %9.2f %9.2f %9.2f %9.2f %9lld %8lld %8.1f %6.1f %10.2f %6s\n", n, r.offered_fps,
                  r.served_fps, r.detection.p50, r.detection.p99, r.stored.p50, r.stored.p99,
                  static_cast<long long>(r.unserved), static_cast<long long>(r.dropped), r.mean_batch, r.min_stream_fps,
                  r.cpu_ms_per_frame, r.holds ? "yes" : "no");
      if (r.started) {
        std::printf("  decoded on:");
        for (const auto& [where, streams] : r.streams_by_decoder) std::printf(" %s: %d;", where.c_str(), streams);
        std::printf(" startup %.1f s\n", r.startup_s);
      }
      if (!r.error.empty()) std::printf("  error: %s\n", r.error.c_str());
      std::fflush(stdout);
    }
    if (!r.started) {
      // Not a measurement: the edge could not run at all (the model on that device, the state folder, ...).
      std::fprintf(stderr, "vigil bench streams: the edge did not start: %s%s\n", r.error.c_str(),
                   std::find(devices.begin(), devices.end(), "cpu") == devices.end() ? " (--devices cpu runs on the CPU)" : "");
      fs::remove_all(work, ec);
      return 1;
    }
    if (!r.holds) break;
  }
  fs::remove_all(work, ec);
  nlohmann::json out;
  out["model"] = a.model;
  out["devices"] = devices;
  out["precision"] = a.precision;
  out["batch"] = a.batch;
  out["max_wait_ms"] = a.max_wait_ms;
  out["workers_per_device"] = a.workers_per_device;
  out["progress_flush_ms"] = a.progress_flush_ms;
  out["frame"] = {{"width", a.width}, {"height", a.height}, {"source", play.uri}};
  if (!a.video.empty()) out["video"] = {{"file", a.video}, {"hwaccel", a.hwaccel}};
  out["fps_per_stream"] = play.fps;
  out["seconds"] = a.seconds;
  out["budget_ms"] = a.budget_ms;
  out["trials"] = trials;
  out["max_streams_holding"] = holding;
  if (a.json) {
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("largest stream count holding real time (p99 frame->detection <= %.0f ms, nothing unserved or dropped): %d\n",
                a.budget_ms, holding);
  }
  return 0;
}

}  // namespace

void AddBenchStreamsCommand(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<BenchStreamsArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "streams", "Largest number of real-time streams the edge pipeline holds, against an in-process aggregator "
                 "(synthetic frames or, with --video, each stream decoding a file). Latencies in ms; cpu ms/fr: "
                 "process CPU time per frame served");
  cmd->add_option("--model", a->model, "ONNX detection model")->required()->check(CLI::ExistingFile);
  cmd->add_option("--devices", a->devices, "comma-separated devices, e.g. cuda:0,cuda:1 (or cpu)")->capture_default_str();
  cmd->add_option("--precision", a->precision, "CUDA precision: fp32 or fp16")->capture_default_str();
  cmd->add_option("--streams", a->streams, "stream counts to try, in order")->capture_default_str();
  cmd->add_option("--fps", a->fps, "frames per second per stream (--video: at most the file's rate)")
      ->check(CLI::Range(0.1, 1000.0))
      ->capture_default_str()
      ->each([a](const std::string&) { a->fps_given = true; });
  cmd->add_option("--seconds", a->seconds, "measured seconds per stream count")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--warmup-s", a->warmup_s, "unmeasured seconds first")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--batch", a->batch, "engine batch and frames per batch at most (default: the model's fixed batch, else 16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-wait-ms", a->max_wait_ms, "a partial batch waits at most this long")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  cmd->add_option("--workers-per-device", a->workers_per_device, "Detectors per device")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--progress-flush-ms", a->progress_flush_ms, "the edge's progress_flush_ms (marks of frames without events)")
      ->check(CLI::Range(1, 60000))
      ->capture_default_str();
  cmd->add_option("--width", a->width, "synthetic frame width")->check(CLI::Range(1, 16384))->capture_default_str();
  cmd->add_option("--height", a->height, "synthetic frame height")->check(CLI::Range(1, 16384))->capture_default_str();
  cmd->add_option("--budget-ms", a->budget_ms, "p99 frame-to-detection budget")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object");
  CLI::Option* video =
      cmd->add_option("--video", a->video, "every stream decodes this video file (looped, in real time)")
          ->check(CLI::ExistingFile)
          ->excludes("--width")
          ->excludes("--height");
  cmd->add_option("--hwaccel", a->hwaccel, "--video: decode on the stream's GPU with NVDEC ('cuda') or on the CPU ('cpu')")
      ->needs(video)
      ->capture_default_str();
  cmd->callback([a, exit_code] { *exit_code = BenchStreams(*a); });
}
#else
void AddBenchStreamsCommand(CLI::App& bench, int* exit_code) {
  CLI::App* cmd = bench.add_subcommand("streams", "Stream benchmark (unavailable: this vigil was built without FFmpeg)");
  cmd->allow_extras();
  cmd->callback([exit_code] {
    std::fprintf(stderr, "vigil bench streams: this vigil was built without FFmpeg (video ingest); rebuild with it\n");
    *exit_code = 2;
  });
}
#endif

}  // namespace vigil::cli
