// `vigil bench engine`: latency, throughput, memory and the per-op profile of one model on one device.
//
//   vigil bench engine --model yolov8n.onnx [--batch B] [--threads T] [--iters 50] [--warmup 5]
//                      [--imgsz H,W] [--reference-only] [--json]
//
// Method: Engine::Load, `warmup` untimed runs, then `iters` runs timed one by one with
// std::chrono::steady_clock (latency percentiles by nearest rank; throughput = batch·1000 / mean ms).
// CPU time per run (getrusage user + system over the timed runs / iters) is printed too: on a shared
// machine it shows what a run costs when wall time is inflated by other processes.
// Peak RSS (getrusage ru_maxrss) is read after the timed runs. The profile comes from a second engine
// loaded with profiling on (after the first is freed), so clock reads never touch the timed runs:
// one warm-up run, then kProfileIters runs whose per-node times are averaged. With --profile-range N (CUDA
// devices) that second load is skipped; instead N device-resident runs after the timed ones are bracketed by
// cudaProfilerStart/Stop, so `ncu --profile-from-start off` or `nsys --capture-range=cudaProfilerApi`
// records exactly those (scripts/gpu-check.sh's `profile` stage), not the load's cuDNN plan timing.
// The input is deterministic: uniform [0, 1) from std::mt19937 seeded with 0 (zeros for integer inputs).
// --json prints the same fields as one object, plus "nodes": every node's time per run in graph order.
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_stats.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "vigil/common/clock.h"
#include "vigil/infer/engine.h"
#if VIGIL_HAVE_CUDA
#include "vigil/infer/cuda_device.h"
#endif

namespace vigil::cli {
namespace {

constexpr int kProfileIters = 5;

struct BenchEngineArgs {
  std::string model;
  int64_t batch = 0;
  int threads = 0;
  int iters = 50;
  int warmup = 5;
  std::string imgsz;
  bool reference_only = false;
  bool json = false;
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string int8_activations = "quantized";
  bool no_cuda_graph = false;
  int profile_range = 0;  // > 0: that many device-resident runs inside cudaProfilerStart/Stop, no per-op profile
};

double PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

int CpusAvailable() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

std::vector<Tensor> MakeInputs(const infer::Engine& engine) {
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(0.f, 1.f);
  std::vector<Tensor> inputs;
  for (const infer::TensorInfo& info : engine.inputs()) {
    const bool is_float = info.dtype == DType::kFloat32 || info.dtype == DType::kFloat16;
    Tensor t(is_float ? DType::kFloat32 : info.dtype, info.shape);  // Run converts float32 for float16 models
    if (is_float) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

struct OpRow {
  std::string op_type, kernel;
  double ms = 0;  // per run
  int count = 0;  // nodes
};

struct BenchResult {
  std::string model, device = "cpu", precision = "fp32";
  bool cuda_graph = false;
  // Device backends: host-I/O latency (Engine::Run: input copy to the GPU, inference, output copy
  // back) next to the device-resident latency in `latency`; and pipelined throughput (`iters`
  // inferences enqueued back to back, one synchronisation at the end).
  Latency host_io_latency;
  double pipelined_throughput = 0;
  int64_t batch = 1;
  int threads = 1;
  bool onednn = true;
  double load_ms = 0;
  Latency latency;
  double cpu_ms = 0;  // process CPU time per timed run (all threads)
  double throughput = 0, peak_rss_mib = 0, arena_mib = 0;
  double profiled_ms = 0;  // sum of node times per profiled run
  std::vector<OpRow> ops;  // by descending time
  std::vector<OpRow> nodes;    // every node in graph order; op_type holds "node (op)"; count 1
  std::vector<OpRow> slowest;  // the 5 slowest of `nodes`
};

// Per-run node times between two Profile() snapshots taken `runs` runs apart.
void AddProfile(const std::vector<infer::NodeTiming>& before, const std::vector<infer::NodeTiming>& after, int runs,
                BenchResult* r) {
  std::map<std::pair<std::string, std::string>, OpRow> by_op;
  std::vector<OpRow> nodes;
  for (size_t i = 0; i < after.size() && i < before.size(); ++i) {
    const double ms = (after[i].total_ms - before[i].total_ms) / runs;
    OpRow& row = by_op[{after[i].op_type, after[i].kernel}];
    row.op_type = after[i].op_type, row.kernel = after[i].kernel, row.ms += ms, ++row.count;
    nodes.push_back({after[i].node_name + " (" + after[i].op_type + ")", after[i].kernel, ms, 1});
    r->profiled_ms += ms;
  }
  auto slower = [](const OpRow& a, const OpRow& b) { return a.ms > b.ms; };
  for (auto& [key, row] : by_op) r->ops.push_back(row);
  std::sort(r->ops.begin(), r->ops.end(), slower);
  r->nodes = nodes;
  std::sort(nodes.begin(), nodes.end(), slower);
  nodes.resize(std::min<size_t>(nodes.size(), 5));
  r->slowest = std::move(nodes);
}

nlohmann::json ToJson(const BenchResult& r) {
  nlohmann::json j;
  j["model"] = r.model;
  j["device"] = r.device;
  if (r.device != "cpu") {
    j["precision"] = r.precision;
    j["cuda_graph"] = r.cuda_graph;
    j["host_io_latency_ms"] = {{"p50", r.host_io_latency.p50}, {"p90", r.host_io_latency.p90},
                               {"p99", r.host_io_latency.p99}, {"mean", r.host_io_latency.mean}};
    j["pipelined_throughput_images_per_s"] = r.pipelined_throughput;
  }
  j["batch"] = r.batch;
  j["threads"] = r.threads;
  j["kernels"] = r.onednn ? "onednn" : "reference";
  j["load_ms"] = r.load_ms;
  j["latency_ms"] = {{"p50", r.latency.p50}, {"p90", r.latency.p90}, {"p99", r.latency.p99},
                     {"mean", r.latency.mean}, {"min", r.latency.min}, {"max", r.latency.max}};
  j["cpu_ms_per_run"] = r.cpu_ms;
  j["throughput_images_per_s"] = r.throughput;
  j["peak_rss_mib"] = r.peak_rss_mib;
  j["arena_mib"] = r.arena_mib;
  j["profiled_ms_per_run"] = r.profiled_ms;
  j["ops"] = nlohmann::json::array();
  for (const OpRow& o : r.ops) {
    j["ops"].push_back({{"op_type", o.op_type}, {"kernel", o.kernel}, {"ms_per_run", o.ms}, {"count", o.count},
                        {"percent", r.profiled_ms > 0 ? 100.0 * o.ms / r.profiled_ms : 0.0}});
  }
  j["slowest_nodes"] = nlohmann::json::array();
  for (const OpRow& n : r.slowest) j["slowest_nodes"].push_back({{"node", n.op_type}, {"kernel", n.kernel}, {"ms_per_run", n.ms}});
  j["nodes"] = nlohmann::json::array();
  for (const OpRow& n : r.nodes) j["nodes"].push_back({{"node", n.op_type}, {"kernel", n.kernel}, {"ms_per_run", n.ms}});
  return j;
}

void PrintTable(const BenchResult& r) {
  std::printf("model       : %s\n", r.model.c_str());
  std::printf("batch       : %lld\nthreads     : %d\nkernels     : %s\n", static_cast<long long>(r.batch), r.threads,
              r.onednn ? "onednn + reference" : "reference only");
  std::printf("load        : %.1f ms\n", r.load_ms);
  std::printf("latency ms  : p50 %.2f  p90 %.2f  p99 %.2f  mean %.2f  (min %.2f, max %.2f)\n", r.latency.p50,
              r.latency.p90, r.latency.p99, r.latency.mean, r.latency.min, r.latency.max);
  std::printf("cpu time    : %.2f ms per run (all threads)\n", r.cpu_ms);
  std::printf("throughput  : %.2f images/s\n", r.throughput);
  if (r.device != "cpu") {
    std::printf("device      : %s, %s, CUDA graph %s\n", r.device.c_str(), r.precision.c_str(), r.cuda_graph ? "on" : "off");
    std::printf("  (latency above: inputs already on the device; with host copies: p50 %.2f  p99 %.2f ms)\n",
                r.host_io_latency.p50, r.host_io_latency.p99);
    std::printf("pipelined   : %.1f images/s (back-to-back inferences, one sync)\n", r.pipelined_throughput);
  }
  std::printf("peak RSS    : %.1f MiB\narena       : %.1f MiB\n", r.peak_rss_mib, r.arena_mib);
  std::printf("\nper-op profile (%d profiled runs, %.2f ms per run summed over nodes)\n", kProfileIters, r.profiled_ms);
  std::printf("  %-24s %-10s %10s %7s %6s\n", "op", "kernel", "ms/run", "%", "nodes");
  for (const OpRow& o : r.ops) {
    std::printf("  %-24s %-10s %10.3f %6.1f%% %6d\n", o.op_type.c_str(), o.kernel.c_str(), o.ms,
                r.profiled_ms > 0 ? 100.0 * o.ms / r.profiled_ms : 0.0, o.count);
  }
  std::printf("slowest nodes\n");
  for (const OpRow& n : r.slowest) std::printf("  %-50s %-10s %10.3f ms\n", n.op_type.c_str(), n.kernel.c_str(), n.ms);
}

// "640" or "640,480" (H,W).
bool ParseImgsz(const std::string& text, infer::EngineOptions* options) {
  if (text.empty()) return true;
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  int64_t h = 0, w = 0;
  if (parts.size() > 2 || !absl::SimpleAtoi(parts[0], &h) || h <= 0) return false;
  w = h;
  if (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &w) || w <= 0)) return false;
  options->height = h, options->width = w;
  return true;
}

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(SteadyNow() - t).count(); }

int BenchEngine(const BenchEngineArgs& args) {
  infer::EngineOptions options;
  options.batch = args.batch;
  options.threads = args.threads;
  options.use_onednn = !args.reference_only;
  options.device = args.device;
  options.cuda_graph = !args.no_cuda_graph;
  if (StatusOr<infer::Precision> p = infer::ParsePrecision(args.precision); p.ok()) {
    options.precision = *p;
  } else {
    std::fprintf(stderr, "vigil bench engine: %s\n", std::string(p.status().message()).c_str());
    return 2;
  }
  if (StatusOr<infer::Int8Activations> a = infer::ParseInt8Activations(args.int8_activations); a.ok()) {
    options.int8_activations = *a;
  } else {
    std::fprintf(stderr, "vigil bench engine: --int8-activations: %s\n", std::string(a.status().message()).c_str());
    return 2;
  }
  if (!ParseImgsz(args.imgsz, &options)) {
    std::fprintf(stderr, "vigil bench engine: --imgsz '%s' is not H,W or one size in pixels\n", args.imgsz.c_str());
    return 2;
  }
  BenchResult r;
  r.model = args.model;
  r.threads = args.threads > 0 ? args.threads : CpusAvailable();
  r.onednn = options.use_onednn;
  r.device = args.device;
  r.precision = args.precision;
  r.cuda_graph = args.device != "cpu" && options.cuda_graph;
  std::vector<Tensor> inputs, outputs;
  {
    const auto start = SteadyNow();
    StatusOr<std::unique_ptr<infer::Engine>> engine = infer::Engine::Load(args.model, options);
    if (!engine.ok()) {
      std::fprintf(stderr, "vigil bench engine: %s\n", std::string(engine.status().message()).c_str());
      return 2;
    }
    r.load_ms = MsSince(start);
    const std::vector<infer::TensorInfo>& in = (*engine)->inputs();
    r.batch = !in.empty() && !in[0].shape.empty() ? in[0].shape[0] : 1;
    inputs = MakeInputs(**engine);
    std::vector<double> ms;
    double cpu_start = 0;
    for (int i = 0; i < args.warmup + args.iters; ++i) {
      if (i == args.warmup) cpu_start = ProcessCpuMs();
      const auto t = SteadyNow();
      Status st = (*engine)->Run(inputs, &outputs);
      if (!st.ok()) {
        std::fprintf(stderr, "vigil bench engine: %s: %s\n", args.model.c_str(), std::string(st.message()).c_str());
        return 1;
      }
      if (i >= args.warmup) ms.push_back(MsSince(t));
    }
    r.cpu_ms = (ProcessCpuMs() - cpu_start) / args.iters;
    r.latency = Summarize(ms);
    if ((*engine)->device_io() != nullptr) {  // the inputs are on the device now: time the engine alone
      r.host_io_latency = r.latency;
      ms.clear();
      for (int i = 0; i < args.warmup + args.iters; ++i) {
        const auto t = SteadyNow();
        Status st = (*engine)->EnqueueOnDevice();
        if (st.ok()) st = (*engine)->SynchronizeDevice();
        if (!st.ok()) {
          std::fprintf(stderr, "vigil bench engine: %s: %s\n", args.model.c_str(), std::string(st.message()).c_str());
          return 1;
        }
        if (i >= args.warmup) ms.push_back(MsSince(t));
      }
      r.latency = Summarize(ms);
      const auto t = SteadyNow();
      Status st;
      for (int i = 0; i < args.iters && st.ok(); ++i) st = (*engine)->EnqueueOnDevice();
      if (st.ok()) st = (*engine)->SynchronizeDevice();
      if (!st.ok()) {
        std::fprintf(stderr, "vigil bench engine: %s: %s\n", args.model.c_str(), std::string(st.message()).c_str());
        return 1;
      }
      r.pipelined_throughput = static_cast<double>(r.batch) * args.iters * 1000.0 / MsSince(t);
#if VIGIL_HAVE_CUDA
      if (args.profile_range > 0) {  // for an external profiler (ncu/nsys), after warm-up and timing
        std::string err = cuda::ProfilerStart();
        for (int i = 0; i < args.profile_range && st.ok() && err.empty(); ++i) {
          st = (*engine)->EnqueueOnDevice();
          if (st.ok()) st = (*engine)->SynchronizeDevice();
        }
        if (err.empty()) err = cuda::ProfilerStop();
        if (!st.ok() || !err.empty()) {
          std::fprintf(stderr, "vigil bench engine: profiler range: %s\n",
                       err.empty() ? std::string(st.message()).c_str() : err.c_str());
          return 1;
        }
      }
#endif
    }
    r.throughput = static_cast<double>(r.batch) * 1000.0 / r.latency.mean;
    r.peak_rss_mib = PeakRssMiB();
    r.arena_mib = static_cast<double>((*engine)->ArenaBytes()) / (1024.0 * 1024.0);
  }
  if (args.profile_range == 0) {  // with --profile-range the external profiler is the profile
    options.profile = true;
    StatusOr<std::unique_ptr<infer::Engine>> profiled = infer::Engine::Load(args.model, options);
    if (!profiled.ok() || !(*profiled)->Run(inputs, &outputs).ok()) {
      std::fprintf(stderr, "vigil bench engine: profiled run failed\n");
      return 1;
    }
    const std::vector<infer::NodeTiming> before = (*profiled)->Profile();
    for (int i = 0; i < kProfileIters; ++i) {
      if (Status st = (*profiled)->Run(inputs, &outputs); !st.ok()) {
        std::fprintf(stderr, "vigil bench engine: %s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    AddProfile(before, (*profiled)->Profile(), kProfileIters, &r);
  }
  if (args.json) {
    std::cout << ToJson(r).dump(2) << "\n";
  } else {
    PrintTable(r);
  }
  return 0;
}

}  // namespace

CLI::App* AddBenchCommands(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks with machine-readable output");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchEngineArgs>();
  CLI::App* engine = bench->add_subcommand(
      "engine", "Latency (p50/p90/p99/mean), throughput, peak RSS, arena size and per-op profile of one model");
  engine->add_option("--model", args->model, "ONNX model")->required()->check(CLI::ExistingFile);
  engine->add_option("--batch", args->batch, "batch size for a symbolic batch dimension (0 = the model's)")
      ->check(CLI::NonNegativeNumber);
  engine->add_option("--threads", args->threads, "kernel threads (0 = all CPUs of this process)")
      ->check(CLI::NonNegativeNumber);
  engine->add_option("--iters", args->iters, "timed runs")->check(CLI::PositiveNumber)->capture_default_str();
  engine->add_option("--warmup", args->warmup, "untimed runs first")->check(CLI::NonNegativeNumber)->capture_default_str();
  engine->add_option("--profile-range", args->profile_range,
                     "CUDA: after timing, run the engine this many times between cudaProfilerStart and Stop (for "
                     "`ncu --profile-from-start off` / `nsys --capture-range=cudaProfilerApi`) and skip the per-op "
                     "profile")
      ->check(CLI::NonNegativeNumber);
  engine->add_option("--imgsz", args->imgsz, "input size H,W (or one size) for symbolic H/W");
  engine->add_flag("--reference-only", args->reference_only, "reference kernels only (no oneDNN)");
  engine->add_flag("--json", args->json, "print one JSON object");
  engine->add_option("--device", args->device, "cpu, or cuda:N (latency then excludes host copies; see JSON)")
      ->capture_default_str();
  engine->add_option("--precision", args->precision, "CUDA compute precision: fp32 or fp16")->capture_default_str();
  engine->add_option("--int8-activations", args->int8_activations, kInt8ActivationsHelp)->capture_default_str();
  engine->add_flag("--no-cuda-graph", args->no_cuda_graph, "CUDA: enqueue kernels one by one instead of a graph");
  engine->callback([args, exit_code] { *exit_code = BenchEngine(*args); });
  return bench;
}

}  // namespace vigil::cli
