// vigil/topology/topology.h — the machine's GPU / NUMA / CPU / NIC map, as plain data.
//
// Discover() reads it with hwloc (this system, or an hwloc XML export for tests and for planning
// another machine); everything else in this header is pure code over the data, so the planner and
// the reports can be tested on topologies built in code.
//
// Terms are hwloc's and Linux's: a PU is a hardware thread, named by its OS index (the Linux CPU
// number, as in /proc/cpuinfo and taskset); a core holds one or more PUs; a NUMA node is named by
// its OS index (as in /sys/devices/system/node/nodeN and numactl). A cpuset is a set of PUs.
// GPU-GPU and GPU-NIC relations use the codes of `nvidia-smi topo -m` (see Link).
//
// Thread-safety: the types are values; the functions are pure (Discover reads the system or a file)
// and may be called from any thread. Errors: Status values naming the file or the object and the
// reason; discovery of an odd machine (no NUMA info, offline CPUs, no GPUs) is not an error, it is
// described in Topology::notes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::topology {

// A set of PUs as sorted, unique OS indexes.
using CpuList = std::vector<int>;

// "0-7,16-23" (Linux cpulist format, as in /sys/.../cpulist and `taskset -c`); "" when empty.
// `sep` replaces the comma (Kubernetes label values allow no commas).
std::string FormatCpuList(const CpuList& cpus, char sep = ',');
// The PUs in both lists (inputs sorted and unique, as CpuList always is).
CpuList Intersect(const CpuList& a, const CpuList& b);

struct Package {
  int os_index = -1;
  CpuList cpus;                 // PUs present in the topology, allowed or not
  std::vector<int> numa_nodes;  // OS indexes of its NUMA nodes
};

struct NumaNode {
  int os_index = -1;
  uint64_t memory_bytes = 0;  // local memory, bytes (0 when the topology does not say)
  CpuList cpus;               // PUs local to the node; empty for a memory-only (CPU-less) node
  bool allowed = true;        // in the allowed nodeset (cgroup cpuset.mems)
  std::string kind;           // hwloc subtype when given ("GPUMemory", "MCDRAM", ...), else ""
};

struct Core {
  int os_index = -1;   // hwloc's core number (not unique across packages)
  int package = -1;    // OS index of its package, -1 when none
  int numa_node = -1;  // OS index of the NUMA node its PUs belong to, -1 when none is known
  CpuList cpus;        // its PUs, allowed or not
};

// Where a PCI device sits: its bus id, the bridges above it and its locality (the nearest
// non-I/O ancestor in hwloc: the package or group it hangs off, whose NUMA nodes are the device's).
struct PciLocation {
  std::string bus_id;              // "dddd:bb:dd.f", lower-case hex (NormalizePciBusId)
  std::vector<uint64_t> bridges;   // ids of the bridges above the device, topmost first
  bool under_host_bridge = false;  // bridges.front() is a PCI host bridge (a root complex)
  std::vector<int> numa_nodes;     // OS indexes of the locality's NUMA nodes; empty when unknown
  CpuList cpus;                    // PUs of the locality, allowed or not
};

// An NVIDIA GPU: PCI vendor 0x10de, class 0x0302 (3D controller) or 0x0300 (VGA).
struct Gpu {
  int index = -1;  // vigil's GPU number: position in PCI bus id order, the order of nvidia-smi and of
                   // CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID (not necessarily CUDA's default order)
  PciLocation pci;
  uint16_t device_id = 0;               // PCI device id (e.g. 0x1db8 for V100-SXM3)
  std::string model;                    // "Tesla V100-SXM3-32GB-H" when the topology names it, else ""
  std::vector<std::string> os_devices;  // OS devices hwloc found on it: "cuda0", "nvml3", "card0"
  int cuda_ordinal = -1;                // from a "cudaN" OS device or AssignCudaOrdinals; -1 unknown
  int nvml_index = -1;                  // from an "nvmlN" OS device; -1 unknown. Not the CUDA ordinal.
};

// A network adapter: a PCI device with a network or OpenFabrics (RDMA) OS device, or of PCI class
// 0x02 (network controller) without one.
struct Nic {
  std::string name;                     // OpenFabrics name ("mlx5_0") if any, else the first interface
                                        // ("eth0"), else the PCI bus id
  std::vector<std::string> os_devices;  // "ib0", "mlx5_0", "eth2"
  bool rdma = false;                    // has an OpenFabrics device (InfiniBand / RoCE verbs)
  std::string kind;                     // "InfiniBand", "Ethernet" or "network"
  PciLocation pci;
};

struct Topology {
  std::string source;           // "this system" or the XML file's path
  bool is_this_system = false;  // false for an XML export: binding calls on it do nothing
  std::vector<Package> packages;
  std::vector<NumaNode> numa_nodes;  // by OS index
  std::vector<Core> cores;           // hwloc's logical order
  CpuList cpus;                      // PUs present in the topology, allowed or not
  CpuList allowed_cpus;              // PUs this process may run on (cgroup cpuset, taskset)
  CpuList missing_cpus;              // PUs the machine has but the topology lacks (offline, hidden)
  std::vector<Gpu> gpus;             // by PCI bus id
  std::vector<Nic> nics;             // hwloc's PCI order
  int nvswitches = 0;                // NVIDIA NVSwitch bridges seen on PCI
  // nvlinks[a][b]: NVLink links between GPUs a and b (0: none), from hwloc's "NVLinkBandwidth"
  // matrix; empty when the topology carries none (XML exports without NVML, most live machines
  // whose hwloc lacks NVML support).
  std::vector<std::vector<int>> nvlinks;
  std::vector<std::string> notes;  // what discovery found odd or could not see, one sentence each

  const NumaNode* FindNumaNode(int os_index) const;  // nullptr when absent
};

// The connection between two devices, nearest first, in `nvidia-smi topo -m` terms.
enum class Link {
  kSelf,    // X: the device itself
  kNVLink,  // NV#: a bonded set of # NVLinks (directly or through NVSwitches)
  kPIX,     // at most one PCIe bridge (switch) between them
  kPXB,     // several PCIe bridges, without crossing a host bridge
  kPHB,     // through a PCIe host bridge (the CPU's root complex)
  kNODE,    // across host bridges within one NUMA node
  kSYS,     // across NUMA nodes / sockets (QPI, UPI, Infinity Fabric)
};
struct Relation {
  Link link = Link::kSYS;
  int nvlinks = 0;  // for kNVLink
};
std::string RelationCode(const Relation& r);  // "X", "NV6", "PIX", "PXB", "PHB", "NODE", "SYS"

// PCIe relation between two devices. Same host bridge: the deepest common bridge decides (the host
// bridge itself: PHB; else PIX when each device is at most one bridge below it, as two GPUs behind
// the downstream ports of one switch are; else PXB). Different host bridges: NODE when their
// localities share a NUMA node, else SYS.
Relation PciRelation(const PciLocation& a, const PciLocation& b);
// GPU indexes into topo.gpus: NV# when NVLink is known between them, else PciRelation.
Relation GpuRelation(const Topology& topo, int a, int b);
Relation GpuNicRelation(const Topology& topo, int gpu, int nic);
// The NIC nearest GPU `gpu` (index into topo.nics), -1 when the machine has none: nearest relation
// (PIX > PXB > PHB > NODE > SYS: same switch > same host bridge > same NUMA node > any); among
// equals an RDMA-capable one (GPUDirect RDMA), then the lowest index.
int NearestNic(const Topology& topo, int gpu);

// "0000:84:00.0" from "84:00.0", "00000000:84:00.0" (NVML) or upper case; error when not a bus id.
StatusOr<std::string> NormalizePciBusId(std::string_view bus_id);
// Sets Gpu::cuda_ordinal from (CUDA ordinal, PCI bus id) pairs, as cudaDeviceGetPCIBusId reports
// them (the NVML index and hwloc's order are not the CUDA ordinal: the bus id is the only sure
// match). Ordinals of GPUs not listed become -1. Error (topo unchanged) when a bus id is malformed
// or matches no GPU.
Status AssignCudaOrdinals(Topology* topo, const std::vector<std::pair<int, std::string>>& ordinals);

struct DiscoverOptions {
  // hwloc XML export (format 2.0) to read instead of this system. Default: "" = the file named by
  // the environment variable VIGIL_TOPOLOGY_XML when set, else this system.
  std::string xml_path;
};
// Reads the topology, keeping I/O objects (PCI bridges and devices, OS devices) and disallowed PUs
// and NUMA nodes (to report them). Errors: missing, unreadable or malformed file (the message
// names it), or a topology hwloc rejects (e.g. one without any NUMA node).
StatusOr<Topology> Discover(const DiscoverOptions& options = {});

}  // namespace vigil::topology
