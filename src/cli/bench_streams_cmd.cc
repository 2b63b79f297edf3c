// `vigil bench streams` — how many live camera streams one or more devices hold in real time
// (issue #4's pipeline benchmark, issue #6's scaling run), from pre-decoded frames in host memory or, with
// --video, from streams that each decode a video file.
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
// CPU ms per frame: the process's CPU time (getrusage user + system) over the measured window / frames served.
//
// Frames: --frame FILE.npy (H×W×3 uint8 BGR, e.g. a 1920×1080 picture) or a synthetic gradient of
// --width × --height. Up to 16 copies are made (in page-locked memory with --memory pinned, the default
// when every device is a GPU) and the streams take turns over them, so uploads do not all read one
// cache-hot buffer.
//
// Or, in builds with video (the `vigil` binary; not `vigil-engine`), --video FILE: every stream decodes
// the file itself (looped), like a camera whose encoded frame k arrives when it is due. Each stream has
// its own video::Source (opened anew for every stream count, and primed before the clock starts: each decodes
// its first picture, not delivered, so that starting all decoders at once, which takes seconds with NVDEC, is
// reported as decoder_start_s instead of showing as latency) and its
// own decoding thread, as the edge's StreamReaders do; the thread waits until frame k is due, then decodes it
// (Source::Next, realtime off: the stream clock paces) and queues it for its device, so decode time is
// part of the latency. Decoding that falls behind makes frames late, never skipped. --hwaccel cuda
// decodes on the GPU of the stream's device (NVDEC, SourceOptions::hwaccel "cuda:N"; a CPU device: GPU 0),
// and NV12 pictures stay in GPU memory and go to that device's Detector in place when it has GPU stages
// (pipeline::FrameRefOf); where NVDEC cannot be used the stream decodes on the CPU and the report says so
// (per trial: streams by StreamStats::hwaccel, e.g. "cuda:0" or "cpu (reason)"). --hwaccel cpu: CPU
// decode to BGR host frames. A decoded frame holds its picture (a GPU surface from FFmpeg's frame pool)
// until its detections are back, so a stream has at most kMaxFramesInFlight frames decoded and not yet
// detected: it waits for one to finish before decoding the next (the wait counts as latency). FFmpeg's
// CUDA pool grows on demand (ffmpeg_source.cc MakeDeviceFrame), so the bound is on GPU memory:
// 4 × 1.5 bytes per coded pixel, ~12 MB per 1080p stream. Also reported: decode errors, the decode time
// per frame (Frame::decode_ns) of the frames due in the measured window, and the video's frame size
// (JSON: "decode" in each trial, "video" and "frame" in the summary).
// A file that does not open fails the run (exit 2, naming the file); a stream that fails during a trial
// ends that trial with its error (naming the stream), which then does not hold.
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
#if VIGIL_HAVE_FFMPEG
#include <map>
#include <set>

#include "vigil/pipeline/frame_ref.h"
#include "vigil/video/source.h"
#endif
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
  std::string video;             // --video: decode this file in every stream (builds with video only)
  std::string hwaccel = "cuda";  // --video: "cuda" (NVDEC on the stream's device) or "cpu"
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
#if VIGIL_HAVE_FFMPEG
  video::Frame frame;  // --video: the decoded picture (a device frame holds its GPU surface)
#endif
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
  // --video.
  std::map<std::string, int> streams_by_hwaccel;  // StreamStats::hwaccel ("cpu" when not requested) -> streams
  int64_t decoded = 0;                             // frames due in the window that were decoded
  int64_t decode_errors = 0;                       // StreamStats::decode_errors, summed over the trial
  Latency decode;                                  // Frame::decode_ns of the decoded frames, ms
  double decoder_start_s = 0;                      // opening every Source and decoding its first picture
};

// How the streams of one device decode (--video).
struct DecodePlan {
  std::string hwaccel;         // SourceOptions::hwaccel
  bool device_frames = false;  // SourceOptions::deliver_device_frames
};

constexpr int kMaxFramesInFlight = 4;  // --video, per stream: decoded, not yet detected (header comment)

#if VIGIL_HAVE_FFMPEG
video::SourceOptions SourceOptionsFor(const std::string& file, const DecodePlan& plan, const std::string& id) {
  video::SourceOptions o;
  o.uri = file;
  o.stream_id = id;
  o.loop = true;
  o.realtime = false;
  o.hwaccel = plan.hwaccel;
  o.deliver_device_frames = plan.device_frames;
  return o;
}

// One decoding stream of a trial.
struct VideoStream {
  std::unique_ptr<video::Source> source;
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;  // frames decoded and not yet detected; under mu
  std::vector<double> decode_ms;
  int64_t decoded = 0;
  std::string error;
};
#endif

// What the streams read: pre-decoded frames, or (--video) a file each stream decodes.
struct Input {
  const std::vector<FrameBuffer>* frames = nullptr;
  int width = 0, height = 0;
  std::vector<DecodePlan> plans;  // --video: by device; empty: pre-decoded frames
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
                     const Input& input) {
  TrialResult r;
  r.streams = n;
  r.offered_fps = n * a.fps;
  std::vector<DeviceQueue> queues(num_devices);
  std::atomic<bool> stop{false};
  const bool decode = !input.plans.empty();
#if VIGIL_HAVE_FFMPEG
  // --video: the streams' Sources, opened before the clock starts.
  std::vector<VideoStream> streams(decode ? static_cast<size_t>(n) : 0);
  for (int s = 0; s < static_cast<int>(streams.size()); ++s) {
    auto source = video::OpenSource(
        SourceOptionsFor(a.video, input.plans[static_cast<size_t>(s) % num_devices], StrCat("stream ", s)));
    if (!source.ok()) {
      r.error = std::string(source.status().message());  // names the stream and the file
      return r;
    }
    streams[static_cast<size_t>(s)].source = std::move(*source);
  }
  // Every stream decodes its first picture (not delivered) before the clock starts: the cameras of a running
  // system are already streaming, and starting all decoders at once (probing, NVDEC decoder creation) takes
  // seconds that are not steady-state latency. Reported as decoder_start_s.
  const auto priming = Clock::now();
  std::vector<std::thread> primers;
  std::mutex prime_mu;
  for (VideoStream& vs : streams) {
    primers.emplace_back([&] {
      StatusOr<std::optional<video::Frame>> first = vs.source->Next();
      if (!first.ok() || !first->has_value()) {
        std::lock_guard<std::mutex> lock(prime_mu);
        if (r.error.empty()) r.error = first.ok() ? StrCat(a.video, ": no frame") : std::string(first.status().message());
      }
    });
  }
  for (std::thread& t : primers) t.join();
  r.decoder_start_s = std::chrono::duration<double>(Clock::now() - priming).count();
  if (!r.error.empty()) return r;
#endif
  auto stop_all = [&] {
    stop = true;
#if VIGIL_HAVE_FFMPEG
    for (VideoStream& vs : streams) {
      vs.source->Interrupt();
      std::lock_guard<std::mutex> lock(vs.mu);
      vs.cv.notify_all();
    }
#endif
    for (DeviceQueue& q : queues) {
      std::lock_guard<std::mutex> lock(q.mu);
      q.cv.notify_all();
    }
  };
  const auto t0 = Clock::now() + std::chrono::milliseconds(50);
  const auto measure_from = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.warmup_s));
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
  const detect::FrameMemory memory = a.memory == "pinned" ? detect::FrameMemory::kPinnedHost : detect::FrameMemory::kHost;
  // Frame j of the set is due at t0 + j / (n · fps), from stream j mod n: stream s's frame k at
  // t0 + (k · n + s) / (n · fps).
  const double spacing_s = 1.0 / (n * a.fps);
  auto due_at = [&](int64_t j) {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(j * spacing_s));
  };

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
            taken.push_back(std::move(q.items.front()));
            q.items.pop_front();
          }
        }
        refs.clear();
        for (const Item& it : taken) {
#if VIGIL_HAVE_FFMPEG
          if (decode) {
            refs.push_back(pipeline::FrameRefOf(it.frame));
            continue;
          }
#endif
          refs.push_back({.bgr = (*input.frames)[static_cast<size_t>(it.stream) % input.frames->size()].data,
                          .width = input.width, .height = input.height, .pitch = 0, .memory = memory});
        }
        const auto start = Clock::now();
        auto result = worker.detector->DetectFrames(refs);
        const auto done = Clock::now();
        if (!result.ok()) {
          me.error = std::string(result.status().message());
          stop_all();
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
#if VIGIL_HAVE_FFMPEG
        // The pictures are read (DetectFrames has waited for the GPU): give their surfaces back.
        for (Item& it : taken) {
          if (!decode) break;
          it.frame = video::Frame();
          VideoStream& vs = streams[static_cast<size_t>(it.stream)];
          std::lock_guard<std::mutex> lock(vs.mu);
          --vs.in_flight;
          vs.cv.notify_one();
        }
#endif
      }
    });
  }
  auto enqueue = [&](Item item) {
    DeviceQueue& q = queues[static_cast<size_t>(item.stream) % num_devices];
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.items.push_back(std::move(item));
    }
    q.cv.notify_one();
  };
  double cpu0 = -1;  // process CPU time at the start of the measured window (the warm-up is not counted)
#if VIGIL_HAVE_FFMPEG
  // --video: one decoding thread per stream, the camera model of the header comment.
  for (int s = 0; s < static_cast<int>(streams.size()); ++s) {
    threads.emplace_back([&, s] {
      VideoStream& vs = streams[static_cast<size_t>(s)];
      for (int64_t k = 0;; ++k) {
        const auto due = due_at(k * n + s);
        if (due >= end) return;
        {
          std::unique_lock<std::mutex> lock(vs.mu);
          vs.cv.wait(lock, [&] { return stop.load() || vs.in_flight < kMaxFramesInFlight; });
        }
        if (stop.load()) return;
        std::this_thread::sleep_until(due);
        auto frame = vs.source->Next();
        if (stop.load()) return;  // interrupted at the end of the trial
        if (!frame.ok() || !frame->has_value()) {
          vs.error = frame.ok() ? StrCat("stream ", s, ": ", a.video, " delivered no frame (empty file?)")
                                : std::string(frame.status().message());
          stop_all();
          return;
        }
        if (due >= measure_from) {
          vs.decode_ms.push_back(static_cast<double>((*frame)->decode_ns) / 1e6);
          ++vs.decoded;
        }
        {
          std::lock_guard<std::mutex> lock(vs.mu);
          ++vs.in_flight;
        }
        enqueue({.stream = s, .due = due, .frame = std::move(**frame)});
      }
    });
  }
#endif
  // The clock of the pre-decoded frames (--video streams keep their own).
  for (int64_t j = 0; !decode; ++j) {
    const auto due = due_at(j);
    if (due >= end || stop.load()) break;
    std::this_thread::sleep_until(due);
    if (cpu0 < 0 && due >= measure_from) cpu0 = ProcessCpuMs();
    enqueue({.stream = static_cast<int>(j % n), .due = due});
  }
  if (cpu0 < 0) {
    std::this_thread::sleep_until(measure_from);
    cpu0 = ProcessCpuMs();
  }
  std::this_thread::sleep_until(end);
  const double cpu_ms = ProcessCpuMs() - cpu0;
  // Let the last frames finish: a real-time pipeline has the budget to do so.
  std::this_thread::sleep_until(end + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double, std::milli>(a.budget_ms)));
  stop_all();
  for (DeviceQueue& q : queues) {
    std::lock_guard<std::mutex> lock(q.mu);
    for (const Item& it : q.items) r.unserved += it.due >= measure_from && it.due < end;
  }
  for (std::thread& t : threads) t.join();
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
#if VIGIL_HAVE_FFMPEG
  std::vector<double> decode_ms;
  for (VideoStream& vs : streams) {
    if (!vs.error.empty() && r.error.empty()) r.error = vs.error;
    const video::StreamStats stats = vs.source->Stats();
    ++r.streams_by_hwaccel[stats.hwaccel.empty() ? "cpu" : stats.hwaccel];
    r.decode_errors += static_cast<int64_t>(stats.decode_errors);
    r.decoded += vs.decoded;
    decode_ms.insert(decode_ms.end(), vs.decode_ms.begin(), vs.decode_ms.end());
  }
  r.decode = Summarize(std::move(decode_ms));
#endif
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

nlohmann::json ToJson(const TrialResult& r, bool decode) {
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
  if (decode) {
    j["decode"] = {{"hwaccel", r.streams_by_hwaccel}, {"frames", r.decoded}, {"errors", r.decode_errors},
                   {"decoder_start_s", r.decoder_start_s},
                   {"ms", {{"mean", r.decode.mean}, {"p50", r.decode.p50}, {"p99", r.decode.p99}, {"max", r.decode.max}}}};
  }
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
  if (!a.video.empty() && a.hwaccel != "cuda" && a.hwaccel != "cpu") {
    std::fprintf(stderr, "vigil bench streams: --hwaccel '%s' is not 'cuda' or 'cpu'\n", a.hwaccel.c_str());
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
  if (!a.video.empty()) args.memory = "as decoded";  // --memory is for pre-decoded frames (excluded with --video)
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
  const bool decode = !a.video.empty();
  // The frame (pre-decoded), or for --video how each device's streams decode.
  int width = a.width, height = a.height;
  std::vector<uint8_t> base;
  std::vector<DecodePlan> plans;
#if VIGIL_HAVE_FFMPEG
  // The file must open (checked before the models load); NVDEC's GPUs get their primary contexts from
  // FFmpeg before the Detectors' CUDA runtime touches them (video/source.h, "GPU decode").
  std::vector<std::shared_ptr<void>> decode_devices;
  if (decode) {
    video::SourceOptions probe;
    probe.uri = a.video;
    probe.stream_id = "probe";
    if (auto source = video::OpenSource(std::move(probe)); !source.ok()) {
      std::fprintf(stderr, "vigil bench streams: --video: %s\n", std::string(source.status().message()).c_str());
      return 2;
    }
    std::set<int> gpus;
    for (const std::string& device : devices) {
      DecodePlan plan{.hwaccel = "cpu"};
      if (a.hwaccel == "cuda") {
        const StatusOr<std::optional<int>> gpu = video::ParseHwaccel(device);  // "cuda:N" -> N, "cpu" -> none
        const int n = gpu.ok() && *gpu ? **gpu : 0;                           // a CPU device's streams: GPU 0
        plan.hwaccel = StrCat("cuda:", n);
        gpus.insert(n);
      }
      plans.push_back(plan);
    }
    for (int gpu : gpus) {
      StatusOr<std::shared_ptr<void>> held = video::RetainCudaDecodeDevice(gpu);
      if (held.ok()) {
        decode_devices.push_back(std::move(*held));
      } else {
        std::fprintf(stderr, "vigil bench streams: %s; its streams decode on the CPU\n",
                     std::string(held.status().message()).c_str());
      }
    }
  }
#endif
  if (!decode && !a.frame.empty()) {
    auto t = ReadNpy(a.frame);
    if (!t.ok() || t->dtype() != DType::kUInt8 || t->rank() != 3 || t->dim(2) != 3) {
      std::fprintf(stderr, "vigil bench streams: --frame %s: %s\n", a.frame.c_str(),
                   t.ok() ? "not an H x W x 3 uint8 array" : std::string(t.status().message()).c_str());
      return 2;
    }
    height = static_cast<int>(t->dim(0));
    width = static_cast<int>(t->dim(1));
    base.assign(t->data<uint8_t>(), t->data<uint8_t>() + t->numel());
  } else if (!decode) {
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
  const size_t copies =
      decode ? 0 : std::min<size_t>(16, static_cast<size_t>(*std::max_element(counts.begin(), counts.end())));
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
  // Warm every worker (first runs: eager, then CUDA graph capture) on a frame as its streams deliver them.
  for (size_t w = 0; w < workers.size(); ++w) {
    detect::FrameRef ref{.bgr = decode ? nullptr : frames[0].data, .width = width, .height = height};
#if VIGIL_HAVE_FFMPEG
    std::optional<video::Frame> first;
    if (decode) {
      DecodePlan& plan = plans[workers[w].device];
      // NV12 pictures stay on the GPU when the device's Detector reads them there (its GPU is the decoder's).
      plan.device_frames = a.hwaccel == "cuda" && workers[w].detector->uses_gpu_stages() &&
                           video::ParseHwaccel(devices[workers[w].device]).value_or(std::nullopt).has_value();
      auto source = video::OpenSource(SourceOptionsFor(a.video, plan, StrCat("warm-up ", w)));
      StatusOr<std::optional<video::Frame>> frame = source.ok() ? (*source)->Next() : source.status();
      if (!frame.ok() || !frame->has_value()) {
        std::fprintf(stderr, "vigil bench streams: --video: %s\n",
                     frame.ok() ? StrCat(a.video, ": no frame").c_str() : std::string(frame.status().message()).c_str());
        return 2;
      }
      first = std::move(*frame);
      ref = pipeline::FrameRefOf(*first);
      width = ref.width;
      height = ref.height;
    }
#endif
    for (int i = 0; i < 3; ++i) {
      auto r = workers[w].detector->DetectFrames({&ref, 1});
      if (!r.ok()) {
        std::fprintf(stderr, "vigil bench streams: %s\n", std::string(r.status().message()).c_str());
        return 1;
      }
    }
  }
  const Input input{.frames = &frames, .width = width, .height = height, .plans = plans};
  const detect::Detector& d0 = *workers[0].detector;
  nlohmann::json trials = nlohmann::json::array();
  int holding = 0;
  if (!a.json) {
    if (decode) {
      std::printf("%s: %s, %dx%d, decoded per stream (--hwaccel %s) at %.0f FPS, %zu device(s) x %d workers, batch %lld, "
                  "GPU stages %s\n",
                  a.model.c_str(), a.video.c_str(), width, height, a.hwaccel.c_str(), a.fps, devices.size(),
                  a.workers_per_device, static_cast<long long>(d0.model().batch), d0.uses_gpu_stages() ? "on" : "off");
    } else {
      std::printf("%s: %dx%d frames at %.0f FPS per stream, %zu device(s) x %d workers, batch %lld, %s frames, GPU stages %s\n",
                  a.model.c_str(), width, height, a.fps, devices.size(), a.workers_per_device,
                  static_cast<long long>(d0.model().batch), a.memory.c_str(), d0.uses_gpu_stages() ? "on" : "off");
    }
    std::printf("%8s %10s %10s %9s %9s %9s %9s %8s %10s %6s%s\n", "streams", "offered/s", "served/s", "p50 ms", "p99 ms",
                "max ms", "unserved", "batch", "cpu ms/fr", "holds", decode ? "  dec ms  dec p99  dec errors" : "");
  }
  for (int n : counts) {
    TrialResult r = RunTrial(a, n, workers, devices.size(), input);
    if (r.holds) holding = std::max(holding, n);
    trials.push_back(ToJson(r, decode));
    if (!a.json) {
      std::printf("%8d %10.0f %10.0f %9.2f %9.2f %9.2f %9lld %8.1f %10.2f %6s", n, r.offered_fps, r.served_fps,
                  r.latency.p50, r.latency.p99, r.latency.max, static_cast<long long>(r.unserved), r.mean_batch,
                  r.cpu_ms_per_frame, r.holds ? "yes" : "no");
      if (decode) {
        std::printf(" %7.2f %8.2f %11lld\n  decoded on:", r.decode.mean, r.decode.p99,
                    static_cast<long long>(r.decode_errors));
        for (const auto& [where, streams] : r.streams_by_hwaccel) std::printf(" %s: %d stream(s);", where.c_str(), streams);
      }
      std::printf("\n");
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
  out["frame"] = {{"width", width}, {"height", height}, {"memory", a.memory}, {"file", decode ? a.video : a.frame}};
  if (decode) {
    out["video"] = {{"file", a.video}, {"hwaccel", a.hwaccel}, {"max_frames_in_flight_per_stream", kMaxFramesInFlight}};
  }
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
#if VIGIL_HAVE_FFMPEG
  const char* what = "Largest number of live streams a device holds in real time (pre-decoded frames or, with "
                     "--video, each stream decoding a video file; see --help)";
#else
  const char* what = "Largest number of live streams a device holds in real time (pre-decoded frames; see --help)";
#endif
  CLI::App* cmd = bench.add_subcommand("streams", what);
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
#if VIGIL_HAVE_FFMPEG
  CLI::Option* video =
      cmd->add_option("--video", a->video, "every stream decodes this video file (looped) instead of pre-decoded frames")
          ->check(CLI::ExistingFile)
          ->excludes("--frame")
          ->excludes("--width")
          ->excludes("--height")
          ->excludes("--memory");
  cmd->add_option("--hwaccel", a->hwaccel, "--video: decode on the stream's GPU with NVDEC ('cuda') or on the CPU ('cpu')")
      ->needs(video)
      ->capture_default_str();
#endif
  cmd->callback([a, exit_code] { *exit_code = BenchStreams(*a); });
}

}  // namespace vigil::cli
