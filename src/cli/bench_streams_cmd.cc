// `vigil bench streams` — how many live camera streams one or more devices hold in real time
// (issue #4's pipeline benchmark, issue #6's scaling run), from pre-decoded frames in host memory.
//
// N streams at --fps each deliver a frame every 1/fps s, their phases spread evenly (frame j of the
// whole set is due at t0 + j / (N · fps), from stream j mod N). Stream s goes to device s mod D
// (equal streams: the planner's balanced assignment). Each device has its own queue and
// --workers-per-device Detectors (each its own engine, CUDA stream and graph; batch: the model's fixed
// batch, else --batch, default 16); a worker takes whatever frames are queued, up to the batch, and runs
// Detector::DetectFrames on them —
// the whole detection path: upload (page-locked frames: DMA; pageable: staging copy), GPU letterbox,
// model, decode, NMS, detections copied back to the host. Frame-to-detection latency = the time the
// detections are on the host − the time the frame was due. After --warmup-s, --seconds are measured;
// frames still queued one budget after the end are counted as unserved. A stream count "holds" when no
// frame is unserved and p99 latency <= --budget-ms. The sweep stops at the first count that does not hold.
//
// Frames: --frame FILE.npy (H×W×3 uint8 BGR, e.g. a 1920×1080 picture) or a synthetic gradient of
// --width × --height. Up to 16 copies are made (in page-locked memory with --memory pinned, the default
// when every device is a GPU) and the streams take turns over them, so uploads do not all read one
// cache-hot buffer.
// Exit codes as cli/commands.h. Output: a table, or with --json one object per stream count and a
// summary object.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/bench_stats.h"
#include "cli/commands.h"
#include "vigil/common/npy.h"
#include "vigil/detect/detector.h"
#if VIGIL_HAVE_CUDA
#include "infer/cuda/cuda_util.h"
#endif

namespace vigil::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchStreamsArgs {
  std::string model;
  std::string devices = "cuda:0";
  std::string precision = "fp16";
  std::string streams = "16,32,48,64,80,96,112,128,160";
  double fps = 30;
  double seconds = 8;
  double warmup_s = 2;
  int64_t batch = 0;  // 0: 16 for a symbolic batch, else the model's fixed batch
  int workers_per_device = 2;
  std::string frame;
  int width = 1920, height = 1080;
  std::string memory = "auto";
  double budget_ms = 25;
  bool json = false;
};

// One frame buffer the streams share (page-locked or not).
struct FrameBuffer {
  std::vector<uint8_t> pageable;
#if VIGIL_HAVE_CUDA
  cuda::PinnedBuffer pinned;
#endif
  const uint8_t* data = nullptr;
};

struct Item {
  int stream = 0;
  Clock::time_point due;
};

struct DeviceQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> items;
};

struct Worker {
  std::unique_ptr<detect::Detector> detector;
  size_t device = 0;
};

struct TrialResult {
  int streams = 0;
  double offered_fps = 0, served_fps = 0;
  Latency latency;
  int64_t served = 0, unserved = 0;
  double mean_batch = 0;
  double cpu_ms_per_frame = 0;
  std::vector<double> served_fps_per_device;
  std::vector<double> busy_per_worker;  // fraction of the measured window inside DetectFrames
  bool holds = false;
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

TrialResult RunTrial(const BenchStreamsArgs& a, int n, std::vector<Worker>& workers, size_t num_devices,
                     const std::vector<FrameBuffer>& frames, int width, int height) {
  TrialResult r;
  r.streams = n;
  r.offered_fps = n * a.fps;
  std::vector<DeviceQueue> queues(num_devices);
  std::atomic<bool> stop{false};
  const auto t0 = Clock::now() + std::chrono::milliseconds(50);
  const auto measure_from = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.warmup_s));
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
  const detect::FrameMemory memory = a.memory == "pinned" ? detect::FrameMemory::kPinnedHost : detect::FrameMemory::kHost;

  struct PerWorker {
    std::vector<double> latency_ms;
    int64_t batches = 0, frames = 0;
    double busy_s = 0;
    std::string error;
  };
  std::vector<PerWorker> per(workers.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers.size(); ++w) {
    threads.emplace_back([&, w] {
      Worker& worker = workers[w];
      DeviceQueue& q = queues[worker.device];
      const size_t batch = static_cast<size_t>(worker.detector->model().batch);
      std::vector<Item> taken;
      std::vector<detect::FrameRef> refs;
      PerWorker& me = per[w];
      for (;;) {
        taken.clear();
        {
          std::unique_lock<std::mutex> lock(q.mu);
          q.cv.wait(lock, [&] { return stop.load() || !q.items.empty(); });
          if (stop.load()) return;  // what is left is counted as unserved
          while (!q.items.empty() && taken.size() < batch) {
            taken.push_back(q.items.front());
            q.items.pop_front();
          }
        }
        refs.clear();
        for (const Item& it : taken) {
          refs.push_back({.bgr = frames[static_cast<size_t>(it.stream) % frames.size()].data, .width = width,
                          .height = height, .pitch = 0, .memory = memory});
        }
        const auto start = Clock::now();
        auto result = worker.detector->DetectFrames(refs);
        const auto done = Clock::now();
        if (!result.ok()) {
          me.error = std::string(result.status().message());
          stop = true;
          for (DeviceQueue& other : queues) other.cv.notify_all();
          return;
        }
        if (start >= measure_from && done <= end) me.busy_s += std::chrono::duration<double>(done - start).count();
        for (const Item& it : taken) {
          if (it.due >= measure_from && it.due < end) {
            me.latency_ms.push_back(std::chrono::duration<double, std::milli>(done - it.due).count());
            ++me.frames;
          }
        }
        if (!taken.empty() && taken.front().due >= measure_from) ++me.batches;
      }
    });
  }
  // The clock: frame j of the set is due at t0 + j / (n · fps), from stream j mod n.
  const double spacing_s = 1.0 / (n * a.fps);
  const double cpu0 = ProcessCpuMs();
  for (int64_t j = 0;; ++j) {
    const auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(j * spacing_s));
    if (due >= end || stop.load()) break;
    std::this_thread::sleep_until(due);
    const int s = static_cast<int>(j % n);
    DeviceQueue& q = queues[static_cast<size_t>(s) % num_devices];
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.items.push_back({s, due});
    }
    q.cv.notify_one();
  }
  // Let the last frames finish: a real-time pipeline has the budget to do so.
  std::this_thread::sleep_until(end + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double, std::milli>(a.budget_ms)));
  stop = true;
  for (DeviceQueue& q : queues) {
    std::lock_guard<std::mutex> lock(q.mu);
    for (const Item& it : q.items) r.unserved += it.due >= measure_from && it.due < end;
    q.cv.notify_all();
  }
  for (std::thread& t : threads) t.join();
  const double cpu_ms = ProcessCpuMs() - cpu0;
  std::vector<double> all;
  int64_t batches = 0;
  r.served_fps_per_device.assign(num_devices, 0);
  for (size_t w = 0; w < workers.size(); ++w) {
    if (!per[w].error.empty() && r.error.empty()) r.error = per[w].error;
    all.insert(all.end(), per[w].latency_ms.begin(), per[w].latency_ms.end());
    r.served += per[w].frames;
    batches += per[w].batches;
    r.served_fps_per_device[workers[w].device] += static_cast<double>(per[w].frames) / a.seconds;
    r.busy_per_worker.push_back(per[w].busy_s / a.seconds);
  }
  // Frames due in the window whose detections arrived after the grace period are unserved too.
  const int64_t expected = static_cast<int64_t>(std::llround(a.seconds * n * a.fps));
  r.unserved = std::max<int64_t>(r.unserved, expected - r.served);
  r.served_fps = static_cast<double>(r.served) / a.seconds;
  r.latency = Summarize(std::move(all));
  r.mean_batch = batches > 0 ? static_cast<double>(r.served) / static_cast<double>(batches) : 0;
  r.cpu_ms_per_frame = r.served > 0 ? cpu_ms / static_cast<double>(r.served) : 0;
  r.holds = r.error.empty() && r.unserved == 0 && r.latency.p99 <= a.budget_ms;
  return r;
}

nlohmann::json ToJson(const TrialResult& r) {
  nlohmann::json j;
  j["streams"] = r.streams;
  j["offered_fps"] = r.offered_fps;
  j["served_fps"] = r.served_fps;
  j["served"] = r.served;
  j["unserved"] = r.unserved;
  j["latency_ms"] = {{"p50", r.latency.p50}, {"p90", r.latency.p90}, {"p99", r.latency.p99},
                     {"mean", r.latency.mean}, {"max", r.latency.max}};
  j["mean_batch"] = r.mean_batch;
  j["cpu_ms_per_frame"] = r.cpu_ms_per_frame;
  j["served_fps_per_device"] = r.served_fps_per_device;
  j["busy_per_worker"] = r.busy_per_worker;
  j["holds"] = r.holds;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

// The sweep itself, with the arguments checked and resolved (memory, batch) by BenchStreams.
int RunSweep(const BenchStreamsArgs& a, const std::vector<std::string>& devices, const std::vector<int>& counts,
             infer::Precision precision);

int BenchStreams(const BenchStreamsArgs& a) {
  auto counts = ParseList(a.streams);
  if (!counts.ok()) {
    std::fprintf(stderr, "vigil bench streams: %s\n", std::string(counts.status().message()).c_str());
    return 2;
  }
  if (a.memory != "auto" && a.memory != "pinned" && a.memory != "host") {
    std::fprintf(stderr, "vigil bench streams: --memory '%s' is not 'auto', 'pinned' or 'host'\n", a.memory.c_str());
    return 2;
  }
  auto precision = infer::ParsePrecision(a.precision);
  if (!precision.ok()) {
    std::fprintf(stderr, "vigil bench streams: --precision: %s\n", std::string(precision.status().message()).c_str());
    return 2;
  }
  std::vector<std::string> devices;
  {
    std::stringstream ss(a.devices);
    std::string d;
    while (std::getline(ss, d, ',')) devices.push_back(d);
  }
  if (devices.empty()) {
    std::fprintf(stderr, "vigil bench streams: --devices is empty\n");
    return 2;
  }
  // Page-locked frames need the CUDA driver: "auto" takes them when every device is a GPU.
  BenchStreamsArgs args = a;
  const bool all_gpus = std::all_of(devices.begin(), devices.end(), [](const std::string& d) { return d.rfind("cuda", 0) == 0; });
  if (args.memory == "auto") args.memory = all_gpus ? "pinned" : "host";
  if (args.memory == "pinned" && !all_gpus) {
    std::fprintf(stderr, "vigil bench streams: --memory pinned needs CUDA devices only (got --devices %s)\n",
                 a.devices.c_str());
    return 2;
  }
  // A model with a fixed batch runs it; a symbolic batch gets --batch (16 when not given).
  if (StatusOr<infer::ModelSummary> summary = infer::InspectModel(a.model); summary.ok() && !summary->inputs.empty() &&
                                                                       !summary->inputs[0].dims.empty()) {
    const infer::Dim& d0 = summary->inputs[0].dims[0];
    if (d0.value > 0) {
      if (args.batch > 0 && args.batch != d0.value) {
        std::fprintf(stderr, "vigil bench streams: %s has a fixed batch of %lld; --batch %lld ignored\n", a.model.c_str(),
                     static_cast<long long>(d0.value), static_cast<long long>(args.batch));
      }
      args.batch = d0.value;
    }
  }
  if (args.batch == 0) args.batch = 16;
  return RunSweep(args, devices, *counts, *precision);
}

int RunSweep(const BenchStreamsArgs& a, const std::vector<std::string>& devices, const std::vector<int>& counts,
             infer::Precision precision) {
  // The frame.
  int width = a.width, height = a.height;
  std::vector<uint8_t> base;
  if (!a.frame.empty()) {
    auto t = ReadNpy(a.frame);
    if (!t.ok() || t->dtype() != DType::kUInt8 || t->rank() != 3 || t->dim(2) != 3) {
      std::fprintf(stderr, "vigil bench streams: --frame %s: %s\n", a.frame.c_str(),
                   t.ok() ? "not an H x W x 3 uint8 array" : std::string(t.status().message()).c_str());
      return 2;
    }
    height = static_cast<int>(t->dim(0));
    width = static_cast<int>(t->dim(1));
    base.assign(t->data<uint8_t>(), t->data<uint8_t>() + t->numel());
  } else {
    base.resize(static_cast<size_t>(width) * height * 3);
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        for (int c = 0; c < 3; ++c) base[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>((x + y * (c + 1)) & 255);
      }
    }
  }
  // Detectors, loaded in parallel (the CUDA backend's load compiles cuDNN engines on the CPU).
  std::vector<Worker> workers(devices.size() * static_cast<size_t>(a.workers_per_device));
  std::vector<std::string> load_errors(workers.size());
  const auto load_start = Clock::now();
  {
    std::vector<std::thread> loaders;
    for (size_t w = 0; w < workers.size(); ++w) {
      workers[w].device = w % devices.size();
      loaders.emplace_back([&, w] {
        detect::DetectorOptions o;
        o.engine.device = devices[workers[w].device];
        o.engine.precision = precision;
        o.engine.batch = a.batch;
        auto d = detect::Detector::Load(a.model, o);
        if (d.ok()) {
          workers[w].detector = std::move(*d);
        } else {
          load_errors[w] = std::string(d.status().message());
        }
      });
    }
    for (std::thread& t : loaders) t.join();
  }
  for (const std::string& e : load_errors) {
    if (!e.empty()) {
      std::fprintf(stderr, "vigil bench streams: %s\n", e.c_str());
      return 2;
    }
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  // Frame copies.
  const size_t copies = std::min<size_t>(16, static_cast<size_t>(*std::max_element(counts.begin(), counts.end())));
  std::vector<FrameBuffer> frames(copies);
  for (FrameBuffer& f : frames) {
#if VIGIL_HAVE_CUDA
    if (a.memory == "pinned") {
      auto p = cuda::PinnedBuffer::Allocate(base.size(), "bench frame");
      if (!p.ok()) {
        std::fprintf(stderr, "vigil bench streams: %s\n", std::string(p.status().message()).c_str());
        return 1;
      }
      f.pinned = std::move(*p);
      std::copy(base.begin(), base.end(), static_cast<uint8_t*>(f.pinned.get()));
      f.data = static_cast<const uint8_t*>(f.pinned.get());
      continue;
    }
#endif
    f.pageable = base;
    f.data = f.pageable.data();
  }
  // Warm every worker (first runs: eager, then CUDA graph capture).
  for (Worker& w : workers) {
    const detect::FrameRef ref{.bgr = frames[0].data, .width = width, .height = height};
    for (int i = 0; i < 3; ++i) {
      auto r = w.detector->DetectFrames({&ref, 1});
      if (!r.ok()) {
        std::fprintf(stderr, "vigil bench streams: %s\n", std::string(r.status().message()).c_str());
        return 1;
      }
    }
  }
  const detect::Detector& d0 = *workers[0].detector;
  nlohmann::json trials = nlohmann::json::array();
  int holding = 0;
  if (!a.json) {
    std::printf("%s: %dx%d frames at %.0f FPS per stream, %zu device(s) x %d workers, batch %lld, %s frames, GPU stages %s\n",
                a.model.c_str(), width, height, a.fps, devices.size(), a.workers_per_device,
                static_cast<long long>(d0.model().batch), a.memory.c_str(), d0.uses_gpu_stages() ? "on" : "off");
    std::printf("%8s %10s %10s %9s %9s %9s %9s %8s %10s %6s\n", "streams", "offered/s", "served/s", "p50 ms", "p99 ms",
                "max ms", "unserved", "batch", "cpu ms/fr", "holds");
  }
  for (int n : counts) {
    TrialResult r = RunTrial(a, n, workers, devices.size(), frames, width, height);
    if (r.holds) holding = std::max(holding, n);
    trials.push_back(ToJson(r));
    if (!a.json) {
      std::printf("%8d %10.0f %10.0f %9.2f %9.2f %9.2f %9lld %8.1f %10.2f %6s\n", n, r.offered_fps, r.served_fps,
                  r.latency.p50, r.latency.p99, r.latency.max, static_cast<long long>(r.unserved), r.mean_batch,
                  r.cpu_ms_per_frame, r.holds ? "yes" : "no");
      if (!r.error.empty()) std::printf("  error: %s\n", r.error.c_str());
      std::fflush(stdout);
    }
    if (!r.holds) break;
  }
  nlohmann::json out;
  out["model"] = a.model;
  out["devices"] = devices;
  out["precision"] = a.precision;
  out["batch"] = d0.model().batch;
  out["workers_per_device"] = a.workers_per_device;
  out["frame"] = {{"width", width}, {"height", height}, {"memory", a.memory}, {"file", a.frame}};
  out["fps_per_stream"] = a.fps;
  out["seconds"] = a.seconds;
  out["budget_ms"] = a.budget_ms;
  out["gpu_stages"] = d0.uses_gpu_stages();
  out["load_s"] = load_s;
  out["trials"] = trials;
  out["max_streams_holding"] = holding;
  if (a.json) {
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("largest stream count holding real time (p99 <= %.0f ms, nothing unserved): %d\n", a.budget_ms, holding);
  }
  return 0;
}

}  // namespace

void AddBenchStreamsCommand(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<BenchStreamsArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "streams", "Largest number of live streams a device holds in real time (pre-decoded frames; see --help)");
  cmd->add_option("--model", a->model, "ONNX detection model")->required()->check(CLI::ExistingFile);
  cmd->add_option("--devices", a->devices, "comma-separated devices, e.g. cuda:0,cuda:1 (or cpu)")->capture_default_str();
  cmd->add_option("--precision", a->precision, "CUDA precision: fp32 or fp16")->capture_default_str();
  cmd->add_option("--streams", a->streams, "stream counts to try, in order")->capture_default_str();
  cmd->add_option("--fps", a->fps, "frames per second per stream")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seconds", a->seconds, "measured seconds per stream count")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--warmup-s", a->warmup_s, "unmeasured seconds first")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--batch", a->batch, "engine batch, frames per inference at most (default: the model's fixed batch, else 16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--workers-per-device", a->workers_per_device, "detectors per device")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--frame", a->frame, "H x W x 3 uint8 BGR .npy frame (default: synthetic)")->check(CLI::ExistingFile);
  cmd->add_option("--width", a->width, "synthetic frame width")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--height", a->height, "synthetic frame height")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--memory", a->memory, "frames in 'pinned' (page-locked) or 'host' (pageable) memory; 'auto': pinned for GPUs")
      ->capture_default_str();
  cmd->add_option("--budget-ms", a->budget_ms, "p99 frame-to-detection budget")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([a, exit_code] { *exit_code = BenchStreams(*a); });
}

}  // namespace vigil::cli
