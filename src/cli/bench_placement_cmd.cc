// `vigil bench placement`: what NUMA placement of host buffers is worth for a batch of frames.
//
//   vigil bench placement [--frames 8] [--size 1920x1080] [--iters 30] [--warmup 3] [--gpu 0] [--json]
//
// Host side (every machine): the measuring thread is bound to the cores of the home node (the GPU's NUMA
// node when a GPU is known, else the first node with CPUs); it copies the batch (frames × width × height ×
// 3 bytes, 8-bit BGR) with memcpy into a buffer bound to the home node, from a pageable buffer (malloc,
// first touch by this thread), from a buffer bound to the home node, and from one bound to each other
// node with memory (remote). Time per copy with std::chrono::steady_clock.
// Device side (a CUDA build with a device): host→device copies of the batch (infer/cuda/copy_timing.h)
// from pageable memory, pinned memory (HostBufferPool + CudaHostPinner, not NUMA-bound), pinned memory
// bound to the GPU's node, and pinned memory bound to each other node. Without CUDA or a device the
// device side is skipped, saying why; the exit code stays 0.
// Reported per source: median bandwidth (bytes / median time, GB/s = 1e9 bytes/s) and p50/p99 time per
// copy (nearest rank). Binding is forced on here (also on a single-NUMA machine) unless
// DISABLE_NUMA_BIND=1, which the output then says.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"

#ifdef VIGIL_HAVE_HWLOC
#include "vigil/common/clock.h"
#include "vigil/topology/binder.h"
#include "vigil/topology/host_buffer_pool.h"
#include "vigil/topology/topology.h"
#endif
#ifdef VIGIL_HAVE_CUDA
#include "vigil/infer/cuda_copy_timing.h"
#include "vigil/infer/cuda_device.h"
#include "vigil/infer/cuda_host_pinner.h"
#endif

namespace vigil::cli {

#ifdef VIGIL_HAVE_HWLOC
namespace {

struct PlacementArgs {
  int frames = 8;
  std::string size = "1920x1080";
  int iters = 30;
  int warmup = 3;
  int gpu = 0;
  bool json = false;
};

struct Row {
  std::string source;
  int node = -1;  // NUMA node the source memory is bound to; -1 none
  double gbps = 0, p50_ms = 0, p99_ms = 0;
  std::string note;  // why it was not measured; "" when it was
};

Row Summarize(std::string source, int node, size_t bytes, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto rank = [&](double p) { return ms[std::min(ms.size() - 1, static_cast<size_t>(std::ceil(p * ms.size())) - 1)]; };
  return {std::move(source), node, static_cast<double>(bytes) / (rank(0.5) * 1e-3) / 1e9, rank(0.5), rank(0.99), ""};
}

std::vector<double> TimeMemcpy(void* dst, const void* src, size_t bytes, int warmup, int iters) {
  std::vector<double> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = SteadyNow();
    std::memcpy(dst, src, bytes);
    const auto t1 = SteadyNow();
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return ms;
}

std::string Table(const std::vector<Row>& rows) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "  %-34s %5s %9s %9s %9s\n", "source", "node", "GB/s", "p50 ms", "p99 ms");
  out += line;
  for (const Row& r : rows) {
    const std::string node = r.node < 0 ? "-" : std::to_string(r.node);
    if (!r.note.empty()) std::snprintf(line, sizeof line, "  %-34s %5s   not measured: %s\n", r.source.c_str(), node.c_str(), r.note.c_str());
    else std::snprintf(line, sizeof line, "  %-34s %5s %9.2f %9.3f %9.3f\n", r.source.c_str(), node.c_str(), r.gbps, r.p50_ms, r.p99_ms);
    out += line;
  }
  return out;
}

nlohmann::json RowsJson(const std::vector<Row>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json o = {{"source", r.source}, {"node", r.node < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.node)}};
    if (r.note.empty()) {
      o["gbps"] = r.gbps;
      o["p50_ms"] = r.p50_ms;
      o["p99_ms"] = r.p99_ms;
    } else {
      o["not_measured"] = r.note;
    }
    j.push_back(std::move(o));
  }
  return j;
}

int RunPlacementBench(const PlacementArgs& a) {
  int w = 0, h = 0;
  char tail = 0;
  if (std::sscanf(a.size.c_str(), "%dx%d%c", &w, &h, &tail) != 2 || w <= 0 || h <= 0) {
    std::fprintf(stderr, "vigil bench placement: --size '%s': expected WIDTHxHEIGHT, e.g. 1920x1080\n", a.size.c_str());
    return 2;
  }
  const size_t bytes = static_cast<size_t>(a.frames) * static_cast<size_t>(w) * static_cast<size_t>(h) * 3;
  StatusOr<topology::Topology> topo = topology::Discover({});
  if (!topo.ok()) {
    std::fprintf(stderr, "vigil bench placement: %s\n", std::string(topo.status().message()).c_str());
    return 2;
  }
  topology::Binder binder({.enabled = true, .bind_single_numa = true});
  std::vector<int> nodes;  // nodes with memory and allowed CPUs come first in the home choice
  int home = -1;
  for (const topology::NumaNode& n : topo->numa_nodes) {
    if (!n.allowed || n.memory_bytes == 0) continue;
    nodes.push_back(n.os_index);
    if (home < 0 && !topology::Intersect(n.cpus, topo->allowed_cpus).empty()) home = n.os_index;
  }
  std::string gpu_note;
  int gpu_node = -1;
#ifdef VIGIL_HAVE_CUDA
  std::string cuda_error;
  const std::vector<cuda::DeviceInfo> devices = cuda::ListDevices(&cuda_error);
  if (a.gpu < 0 || a.gpu >= static_cast<int>(devices.size())) {
    gpu_note = devices.empty() ? StrCat("no CUDA device (", cuda_error, ")")
                               : StrCat("no CUDA device ", a.gpu, " (", devices.size(), " present)");
  } else {
    StatusOr<std::string> bus = topology::NormalizePciBusId(devices[static_cast<size_t>(a.gpu)].pci_bus_id);
    for (const topology::Gpu& g : topo->gpus) {
      if (bus.ok() && g.pci.bus_id == *bus && !g.pci.numa_nodes.empty()) gpu_node = g.pci.numa_nodes.front();
    }
    if (gpu_node >= 0) home = gpu_node;
  }
#else
  gpu_note = "built without CUDA (VIGIL_WITH_CUDA)";
#endif
  if (home < 0) {
    std::fprintf(stderr, "vigil bench placement: no NUMA node with memory and allowed CPUs\n");
    return 2;
  }
  const topology::NumaNode* home_node = topo->FindNumaNode(home);
  const topology::CpuList home_cpus = topology::Intersect(home_node->cpus, topo->allowed_cpus);
  (void)binder.BindCurrentThread(home_cpus, "benchmark thread");

  // Host side.
  std::vector<Row> host;
  StatusOr<topology::HostBuffer> dst = binder.AllocateHostBuffer(bytes, home);
  if (!dst.ok()) {
    std::fprintf(stderr, "vigil bench placement: %s\n", std::string(dst.status().message()).c_str());
    return 2;
  }
  {
    std::vector<uint8_t> pageable(bytes, 1);
    host.push_back(Summarize("pageable (malloc, first touch)", -1, bytes, TimeMemcpy(dst->data(), pageable.data(), bytes, a.warmup, a.iters)));
  }
  for (int n : nodes) {
    StatusOr<topology::HostBuffer> src = binder.AllocateHostBuffer(bytes, n);
    if (!src.ok()) return 2;
    const std::string what = StrCat("bound to node ", n, n == home ? " (local)" : " (remote)");
    if (src->numa_node() != n) {
      host.push_back({what, n, 0, 0, 0, binder.active() ? "binding failed" : binder.skip_reason()});
      continue;
    }
    host.push_back(Summarize(what, n, bytes, TimeMemcpy(dst->data(), src->data(), bytes, a.warmup, a.iters)));
  }
  if (nodes.size() < 2) host.push_back({"bound to a remote node", -1, 0, 0, 0, "this machine has one NUMA node"});

  // Device side.
  std::vector<Row> device;
#ifdef VIGIL_HAVE_CUDA
  if (gpu_note.empty()) {
    cuda::CudaHostPinner pinner;
    auto h2d = [&](const std::string& what, int node, const void* p) {
      StatusOr<std::vector<double>> ms = cuda::TimeHostToDevice(p, bytes, a.gpu, a.warmup, a.iters);
      device.push_back(ms.ok() ? Summarize(what, node, bytes, *ms) : Row{what, node, 0, 0, 0, std::string(ms.status().message())});
    };
    {
      std::vector<uint8_t> pageable(bytes, 1);
      h2d("pageable (malloc)", -1, pageable.data());
    }
    std::vector<std::pair<std::string, int>> kinds{{"pinned (not NUMA-bound)", -1}};
    for (int n : nodes) kinds.push_back({StrCat("pinned, node ", n, n == gpu_node ? " (GPU-local)" : " (remote)"), n});
    for (const auto& [what, node] : kinds) {
      StatusOr<topology::HostBufferPool> pool =
          topology::HostBufferPool::Create(binder, {.buffer_bytes = bytes, .buffers = 1, .numa_node = node, .pinner = &pinner, .name = what});
      if (!pool.ok()) {
        device.push_back({what, node, 0, 0, 0, std::string(pool.status().message())});
        continue;
      }
      if (!pool->stats().pinned || pool->stats().numa_node != node) {
        device.push_back({what, node, 0, 0, 0, pool->stats().pinned ? "NUMA binding failed" : "cudaHostRegister failed"});
        continue;
      }
      StatusOr<topology::PooledBuffer> b = pool->Acquire();
      if (b.ok()) h2d(what, node, b->data());
    }
    if (gpu_node < 0) gpu_note = "the GPU's NUMA node is unknown: no row is GPU-local";
    if (nodes.size() < 2) device.push_back({"pinned, remote node", -1, 0, 0, 0, "this machine has one NUMA node"});
  }
#endif

  if (a.json) {
    nlohmann::json j = {{"frames", a.frames}, {"width", w}, {"height", h}, {"bytes", bytes}, {"iters", a.iters},
                        {"home_node", home}, {"home_cpus", home_cpus}, {"numa_nodes", nodes},
                        {"binding", binder.active() ? std::string("on") : binder.skip_reason()}, {"host_memcpy", RowsJson(host)}};
    j["host_to_device"] = {{"gpu", a.gpu}, {"gpu_numa_node", gpu_node < 0 ? nlohmann::json(nullptr) : nlohmann::json(gpu_node)},
                           {"rows", RowsJson(device)}};
    if (!gpu_note.empty()) j["host_to_device"]["note"] = gpu_note;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("batch: %d frames of %dx%d BGR = %.1f MiB; %d timed copies after %d warm-up\n", a.frames, w, h,
              static_cast<double>(bytes) / (1 << 20), a.iters, a.warmup);
  std::printf("thread on node %d, PUs %s; binding %s\n", home, topology::FormatCpuList(home_cpus).c_str(),
              binder.active() ? "on" : binder.skip_reason().c_str());
  std::printf("host memcpy into a buffer on node %d:\n%s", home, Table(host).c_str());
  std::printf("host -> device (CUDA device %d%s):\n", a.gpu, gpu_node >= 0 ? StrCat(", NUMA node ", gpu_node).c_str() : "");
  if (!device.empty()) std::printf("%s", Table(device).c_str());
  if (!gpu_note.empty()) std::printf("  %s\n", gpu_note.c_str());
  return 0;
}

}  // namespace

void AddBenchPlacementCommand(CLI::App& bench, int* exit_code) {
  auto args = std::make_shared<PlacementArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "placement", "Copy bandwidth and latency of a frame batch from pageable, pinned and NUMA-placed host memory");
  cmd->add_option("--frames", args->frames, "frames per batch")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--size", args->size, "frame size WIDTHxHEIGHT, pixels (8-bit BGR)")->capture_default_str();
  cmd->add_option("--iters", args->iters, "timed copies per source")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "untimed copies first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpu", args->gpu, "CUDA device ordinal")->capture_default_str();
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args, exit_code] { *exit_code = RunPlacementBench(*args); });
}

#else  // built without hwloc

void AddBenchPlacementCommand(CLI::App& bench, int* exit_code) {
  CLI::App* cmd = bench.add_subcommand("placement", "placement benchmark (not built: needs hwloc)");
  cmd->allow_extras();
  cmd->callback([exit_code] {
    std::fprintf(stderr, "vigil bench placement: needs hwloc 2.x (Debian libhwloc-dev) at configure time\n");
    *exit_code = 2;
  });
}

#endif

}  // namespace vigil::cli
