// vigil/pipeline/placement.h — the edge's placement: its threads planned from the machine's topology
// (topology/planner.h), bound by the Binder (topology/binder.h), reported for `vigil topo --check`, and
// the NUMA and per-thread CPU metrics at /metrics.
//
// Threads (named with pthread_setname_np so that ps, top and the check can tell them apart; threads they
// create — OpenMP workers, FFmpeg decoder threads — inherit the name and the binding):
//   vigil-dec-<i>   stream i's reading/decoding thread   → decode PUs of the stream's device
//   vigil-feed-<i>  stream i's feeder into the batcher    → decode PUs of the stream's device
//   vigil-worker    an inference worker (workers.h: model.workers per device, each its own Detector); every
//                   worker takes the union of the devices' worker PUs; its OpenMP team inherits them
//   vigil-sink      the worker pool's sink: rules and the stream ledger, on the same PUs as the workers
// While inference runs on the CPU, the plan is the planner's machine-without-GPUs plan, one CPU worker
// group per NUMA node: streams spread over the nodes, and each stream's threads stay on its node's
// cores (use_gpus false). When it runs on CUDA device N (the Detector's GPU stages), the plan has that
// GPU only (matched by PCI bus id; PCI order when the topology has no CUDA ordinals): every thread on
// the cores of the GPU's NUMA node. The GPU stages' page-locked staging buffers are allocated by the
// bound inference thread at its first batch, so first-touch places them on that node too.
//
// Binding is skipped — with one line in the log, never an error — when placement.bind is false,
// DISABLE_NUMA_BIND=1 is set, the machine has one NUMA node (unless bind_single_numa), the plan comes
// from a topology file (another machine), or the topology cannot be read or planned. A thread that
// cannot be bound goes on unbound (the Binder logs it).
//
// Thread-safety: PlaceThread and Report may be called from any thread concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/infer/graph.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/topology/binder.h"
#include "vigil/topology/placement_check.h"
#include "vigil/topology/planner.h"
#include "vigil/video/source.h"

namespace vigil::pipeline {

// Model cost of one frame, GFLOP: 2 × the multiply-accumulates of the Conv, vigil.FusedConv,
// ConvTranspose, MatMul and Gemm nodes at the graph's static shapes (after shape inference), divided
// by the batch (dim 0 of the first input). This is how Ultralytics reports model GFLOPs (thop's MACs × 2;
// YOLOv8n at 640×640: 8.7) and YOLOX its FLOPs (YOLOX-Nano at 416: 1.08); elementwise ops, pooling and
// resizing are left out there too.
double ModelGflopsPerFrame(const infer::Graph& graph);

// The planner's input for each configured stream, in config order: size and fps from the stream's
// placement keys, else what the opened source probed (`probed[i]`, zeros when unknown), else 1920×1080
// at 25 fps; fps is capped by target_fps. `notes` gets one sentence per stream that fell back to a default.
std::vector<topology::StreamSpec> PlanStreams(const EdgeConfig& config, const std::vector<video::Source::Probe>& probed,
                                              double gflop_per_frame, std::vector<std::string>* notes);

// The topology the edge plans on: `topo` itself when inference runs on its GPUs (use_gpus), else `topo`
// without its GPUs, so that the planner makes CPU worker groups per NUMA node. With use_gpus and
// cuda_ordinal >= 0 (one Detector on that CUDA device) only that GPU stays: the one whose
// Gpu::cuda_ordinal matches, else the one whose index (PCI bus order) does, renumbered GPU 0 of the
// plan (the note names its machine number and bus id); none → a CPU plan, said in the topology's notes. The edge plans with MakePlan(PlanningTopology(topo, use_gpus, ordinal),
// PlanStreams(...), {}) and so does `vigil topo --plan`.
topology::Topology PlanningTopology(topology::Topology topo, bool use_gpus, int cuda_ordinal = -1);

enum class ThreadRole { kDecode, kFeed, kWorker, kSink };

class EdgePlacement {
 public:
  // Reads the topology (placement.topology or this machine), plans `streams` (GPU devices only when
  // use_gpus), decides binding and logs what it decided, once. `state_dir` (may be "") receives
  // placement.json, the PlacementReport: at construction (replacing a previous run's), then after threads are
  // placed, written by a thread of this object's own (see PlaceThread). Never fails.
  // cuda_ordinal: the CUDA device inference runs on (use_gpus), -1 for every GPU of the topology.
  EdgePlacement(const PlacementConfig& config, const std::vector<topology::StreamSpec>& streams, bool use_gpus,
                std::string state_dir, int cuda_ordinal = -1);
  // Writes the last placed threads' report, if it is not written yet, and stops the report's writer.
  ~EdgePlacement();
  EdgePlacement(const EdgePlacement&) = delete;
  EdgePlacement& operator=(const EdgePlacement&) = delete;

  // Names the calling thread for `role` (stream index for decode/feed) and binds it to its planned PUs.
  // Costs the caller a bind and a lock, never a file write: placement.json is rewritten by the report's
  // writer thread, once for every burst of placements (a takeover starts ~260 threads at 128 cameras; each
  // writing the growing report itself, fsynced, under the lock, delayed the first batch by ~130 ms).
  void PlaceThread(ThreadRole role, size_t stream = 0) VIGIL_EXCLUDES(mu_);

  // Blocks until placement.json holds every thread placed so far (no-op without a state dir). For tests and
  // for a clean stop; a running edge never needs to call it.
  void FlushReport() VIGIL_EXCLUDES(mu_);

  const topology::Plan* plan() const { return plan_ ? &*plan_ : nullptr; }
  bool binding() const { return binder_ && binder_->active(); }
  topology::PlacementReport Report() const VIGIL_EXCLUDES(mu_);

 private:
  void Decide(const PlacementConfig& config, bool use_gpus, int cuda_ordinal);  // topology, plan, binder, note; logs
  topology::PlacementReport ReportLocked() const VIGIL_REQUIRES(mu_);
  void WriteReport(const topology::PlacementReport& report) const;  // to report_path_, when set
  void WriterLoop() VIGIL_EXCLUDES(mu_);  // the report's writer thread: writes whenever threads_ changed since its last write

  const std::vector<topology::StreamSpec> streams_;
  const std::string report_path_;
  std::optional<topology::Topology> topo_;
  std::optional<topology::Plan> plan_;
  std::optional<topology::Binder> binder_;
  std::string note_;  // why nothing is bound; "" when binding
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<topology::PlacedThread> threads_ VIGIL_GUARDED_BY(mu_);
  uint64_t placed_ VIGIL_GUARDED_BY(mu_) = 0;   // threads placed so far
  uint64_t written_ VIGIL_GUARDED_BY(mu_) = 0;  // of them, in the file
  bool stopping_ VIGIL_GUARDED_BY(mu_) = false;
  std::thread writer_;                           // WriterLoop, when report_path_ is set
};

// Discovers this machine's topology now (once per process; EdgePlacement then reuses it): a hot standby calls it
// before it waits, so its takeover does not pay for it. No-op cost afterwards; an XML topology is not cached.
void PrewarmPlacement(const PlacementConfig& config);

// A collect hook on `registry` that samples at every scrape (names are the contract):
//   vigil_process_numa_memory_bytes{node}          gauge: this process's resident bytes per NUMA node (numa_maps)
//   vigil_numastat_pages_total{node,counter}       counter: the system's numastat counters (numa_hit, numa_miss,
//                                                  numa_foreign, interleave_hit, local_node, other_node) since the call
//   vigil_thread_cpu_seconds_total{thread}         counter: CPU time of this process's threads by name, threads that
//                                                  exited included (vigil-worker counts its OpenMP team)
// The remote share of allocations is other_node / (local_node + other_node).
void RegisterNumaMetrics(metrics::Registry& registry);

}  // namespace vigil::pipeline
