// vigil/pipeline/worker_setup.h — the edge's engines, set up before any stream is read (issue 41): which device
// and decoder each stream gets, the worker pool loaded on the configured devices, a standby's engines warmed up,
// and the placement plan of the edge's threads.
//
// Run's thread calls them in this order: LoadEdgeWorkers (AssignStreamDevices' hwaccel per stream; FFmpeg's CUDA
// contexts held for the decoding GPUs before the model's CUDA runtime touches them; WorkerPool::Load; which
// device's Detectors read NVDEC frames in place), then, a standby only, WarmUpEngines, and PlaceEdge once the
// streams are open (their probes). Log lines: "hwaccel: …; its streams decode on the CPU", "edge '…': N
// worker(s) on each of …", "edge '…': N worker engine(s) warmed up in … ms" (and a warning per failed warm-up
// run), "placement: model cost … GFLOP per frame (counted from the model)", "placement: <note>".
//
// Ownership: the Edge owns the EdgeWorkers (the pool, and the decode contexts, held while it lives) and the
// placement PlaceEdge returns. Threads: Run's thread only (the pool's own threads start later: WorkerPool::Start).
// Thread-safety: none needed (one thread). Errors: LoadEdgeWorkers returns WorkerPool::Load's (the model,
// the devices); a decoding GPU whose context cannot be held is logged and its streams decode on the CPU; warm-up
// failures are logged, never returned; PlaceEdge never fails.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/status.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/pipeline/placement.h"
#include "vigil/pipeline/workers.h"
#include "vigil/video/source.h"

namespace vigil::pipeline {

// The loaded engines and what the streams' decoders need to know of them.
struct EdgeWorkers {
  std::unique_ptr<WorkerPool> pool;
  std::vector<std::shared_ptr<void>> decode_devices;  // FFmpeg's CUDA contexts, held before the model loads
  std::vector<std::string> stream_hwaccel;  // per stream (config order): its hwaccel, "cuda" made its device's GPU
  std::vector<int> device_gpu;  // per device: CUDA ordinal whose NVDEC frames its Detectors read in place; -1 none

  // The CUDA ordinal whose NVDEC frames stream `stream`'s Detectors read in place; -1 none.
  int stream_gpu(size_t stream) const { return device_gpu[pool->device_of(stream)]; }
};

// The CUDA ordinals the streams' hwaccel values name (decoding on a GPU), ascending; malformed ones ignored.
std::set<int> DecodeGpus(const std::vector<std::string>& stream_hwaccel);

// Per device of `pool` (num_devices): the ordinal of the GPU its Detectors run their stages on when that GPU is in
// `held` (its decode context is held: NVDEC frames of it are read in place); -1 otherwise.
std::vector<int> DeviceGpus(const WorkerPool& pool, size_t devices, const std::set<int>& held);

// AssignStreamDevices, the decode contexts, then the pool (EdgeWorkerOptions). `load_detector`: tests' stand-in
// detectors (WorkerPoolOptions::load_detector; empty: the model file). Errors: WorkerPool::Load's.
using LoadDetector = decltype(WorkerPoolOptions::load_detector);
StatusOr<EdgeWorkers> LoadEdgeWorkers(const EdgeConfig& config, LoadDetector load_detector = nullptr);

// A standby's engines are loaded before it waits; their first run still creates what runs lazily (oneDNN's
// kernels, cuDNN's workspaces, CUDA graphs per batch size), which would otherwise land on the takeover's first
// frame. A mid-grey picture of the model's input size, alone and as a full batch (config.max_batch), through each
// worker, and NV12 pictures on the GPU where a worker reads NVDEC frames in place. Returns the Detect runs made
// (failed ones included). `clock`: the "warmed up in" time.
size_t WarmUpEngines(const EdgeConfig& config, const EdgeWorkers& workers, Clock* clock = SystemClock());

// The placement plan of the edge's threads for the opened streams (`probed`: per stream, what its source told;
// zeros for one that did not open). On one GPU the plan keeps that GPU (threads and staging on its node); on
// several, every GPU of the machine; none: CPU only.
std::unique_ptr<EdgePlacement> PlaceEdge(const EdgeConfig& config, const WorkerPool& pool,
                                         const std::vector<video::Source::Probe>& probed);

}  // namespace vigil::pipeline
