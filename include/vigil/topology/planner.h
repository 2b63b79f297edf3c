// vigil/topology/planner.h — placement as data: streams → devices, devices → cores, NUMA node and NIC.
//
// MakePlan is a pure function of a Topology (discovered, read from an hwloc XML export, or built in
// code), the streams and the options; the Binder (binder.h) applies the result.
//
// Units: a stream's model cost is GFLOP per frame (the model's forward pass at its input size, e.g.
// YOLOv8n at 640×640: 8.7 GFLOP, as Ultralytics' `model.info()` reports); a load is cost × fps in
// GFLOP/s; a device's capacity is the GFLOP/s it sustains for that model (measure it with
// `vigil bench engine`). Frame sizes are pixels, staging sizes bytes.
//
// Thread-safety: pure function over values. Errors: InvalidArgument naming the stream or option;
// FailedPrecondition when the topology has no allowed PU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {

struct StreamSpec {
  std::string id;              // camera / stream name, unique
  int width = 0, height = 0;   // frame size, pixels (> 0)
  double fps = 0;              // frames per second (> 0)
  double gflop_per_frame = 0;  // model cost of one frame, GFLOP (>= 0)
};

struct PlanOptions {
  int worker_threads_per_gpu = 1;     // inference workers per GPU (each owns CUDA streams). Default: 1
  int decode_threads_per_stream = 1;  // Default: 1 (one decode thread per stream)
  int decode_pool_threads = 0;        // > 0: a pool of this many decode threads per device replaces
                                      // the per-stream threads. Default: 0
  double gpu_capacity_gflops = 0;     // GFLOP/s one GPU sustains; 0 = unknown, no capacity check. Default: 0
  double cpu_capacity_gflops_per_core = 0;  // same for CPU workers, per core. Default: 0
  int staging_frames_per_stream = 2;  // host staging buffers per stream, one 8-bit 3-channel frame each. Default: 2
};

// One device: a GPU, or (on a machine without GPUs) the CPU workers of one NUMA node.
struct DevicePlan {
  int gpu = -1;        // index into Topology::gpus; -1 for a CPU worker group
  int numa_node = -1;  // OS index of the NUMA node for its threads and staging buffers: always a node
                       // with allowed CPUs; -1 when none is known (no memory binding then)
  std::vector<std::string> streams;  // stream ids, in assignment order
  double load_gflops = 0;            // Σ fps × GFLOP/frame of its streams
  double capacity_gflops = 0;        // 0 = unknown
  int worker_threads = 0;
  int decode_threads = 0;
  CpuList worker_cpus;  // PUs its worker threads bind to (allowed PUs of whole cores)
  CpuList decode_cpus;  // PUs its decode threads bind to
  bool shares_cores = false;       // some of its cores also serve another device (too few cores)
  uint64_t staging_bytes = 0;      // host staging buffers on numa_node: Σ width × height × 3 × frames
  int nic = -1;                    // index into Topology::nics, nearest NIC (NearestNic); -1 none
};

struct Plan {
  std::vector<DevicePlan> devices;  // GPUs in index order, or CPU groups in NUMA node order
  std::vector<int> stream_device;   // for each input stream (same order): index into devices
  bool fits = true;                 // every device's load within its capacity (true when unknown)
  std::vector<std::string> notes;   // plain sentences: overload, shared cores, fallbacks
};

// Streams are balanced by load: largest first onto the device with the least load (per core for CPU
// groups); ties go to the device with fewer streams, then the lower index.
//
// GPU cores: each GPU takes its home NUMA node — of the nodes of its PCI locality that have allowed
// PUs, the one with the fewest GPUs so far — and the GPUs of one node split that node's allowed
// cores into disjoint contiguous blocks. With fewer cores than GPUs, GPUs share cores round-robin and
// a note says so. Workers take the first cores of a block (all but one when the block has several,
// at most worker_threads_per_gpu), decode threads the rest (or the worker cores when none is left).
// A GPU whose locality has no allowed PU uses all allowed cores, with a note.
//
// No GPU: one CPU worker group per NUMA node with allowed PUs (workers = its cores); allowed PUs in no
// NUMA node (or in a node outside the allowed nodeset) form one more group with numa_node -1.
// Memory-only nodes get nothing.
StatusOr<Plan> MakePlan(const Topology& topo, const std::vector<StreamSpec>& streams, const PlanOptions& options);

}  // namespace vigil::topology
