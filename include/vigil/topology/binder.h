// vigil/topology/binder.h — applies a plan on this machine: thread CPU binding and NUMA-local host
// buffers, with read-back of both. The only code in vigil that binds (docs/architecture.md).
//
// Binding is off when the option says so (`placement: {bind: false}`), when the environment has
// DISABLE_NUMA_BIND=1, on a single-NUMA machine (nothing to gain), and when this machine's topology
// cannot be read; the Binder then says why once in the log (spdlog, info level) and every call is a
// successful no-op: threads keep their affinity, buffers are plain page-aligned memory. A binding
// failure is returned as a Status and logged (warn), never fatal: callers go on unbound.
//
// Pinning for CUDA (cudaHostRegister) is the pinned pool's job; it takes these buffers.
//
// Thread-safety: all methods may be called concurrently (hwloc binding and query calls on a loaded
// topology are thread-safe). HostBuffer is a move-only owner, used by one thread at a time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/topology/hwloc_handle.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {

struct BindOptions {
  bool enabled = true;  // false: `placement: {bind: false}`. Default: true (DISABLE_NUMA_BIND=1 also turns it off)
  // Bind even on a machine with a single NUMA node. Default: false (binding gains nothing there);
  // tests set it to exercise binding on such a machine.
  bool bind_single_numa = false;
};

// Page-aligned host memory from Binder::AllocateHostBuffer; unmapped on destruction.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }  // bytes, as requested
  size_t mapped() const { return mapped_; }    // bytes mapped: size rounded up to pages (2 MiB with huge pages)
  int numa_node() const { return numa_node_; }  // OS index its pages are bound to; -1 not bound
  bool huge_pages() const { return huge_pages_; }  // MADV_HUGEPAGE accepted for the mapping

 private:
  friend class Binder;
  HostBuffer(void* data, size_t size, size_t mapped) : data_(data), size_(size), mapped_(mapped) {}
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  int numa_node_ = -1;
  bool huge_pages_ = false;
};

// How an address range's memory is placed, as the kernel reports it.
struct MemoryPlacement {
  std::string policy;          // "default", "firsttouch", "bind", "interleave", "nexttouch", "mixed"
  std::vector<int> policy_nodes;  // NUMA nodes (OS indexes) the policy names
  std::vector<int> location;      // NUMA nodes holding the range's pages now (empty: none touched)
};

class Binder {
 public:
  // Reads this machine's topology and decides whether binding applies. Never fails.
  explicit Binder(BindOptions options = {});

  bool active() const { return active_; }
  const std::string& skip_reason() const { return skip_reason_; }  // "" when active
  int numa_nodes() const { return numa_nodes_; }                   // 0 when the topology is unreadable

  // Binds the calling thread to `cpus` (PU OS indexes, e.g. DevicePlan::worker_cpus); `what` names
  // the thread in messages ("gpu0 worker"). OK without effect when inactive. Errors: empty set, PUs
  // outside the allowed cpuset, or the OS refusing.
  Status BindCurrentThread(const CpuList& cpus, std::string_view what);
  // The calling thread's CPU affinity (read back from the OS, also when inactive).
  StatusOr<CpuList> CurrentThreadCpus() const;

  // `bytes` of zero-filled, page-aligned memory, its pages bound to `numa_node` (OS index) and
  // faulted in there. numa_node -1, or an inactive binder: unbound memory. A bind failure is logged
  // and gives an unbound buffer (numa_node() -1): the caller goes on. huge_pages: for bytes >= 2 MiB,
  // the mapping is 2 MiB-aligned, rounded up to 2 MiB and advised MADV_HUGEPAGE before it is faulted
  // in (transparent huge pages; HostBuffer::huge_pages() says whether the advice was taken). Error
  // only when the memory cannot be mapped at all, or for an unknown node.
  StatusOr<HostBuffer> AllocateHostBuffer(size_t bytes, int numa_node, bool huge_pages = false);
  // The policy and location of [data, data + bytes). Error when unreadable (inactive and unreadable topology).
  StatusOr<MemoryPlacement> QueryMemory(const void* data, size_t bytes) const;

 private:
  internal::HwlocTopologyPtr topo_;  // nullptr when unreadable
  bool active_ = false;
  std::string skip_reason_;
  int numa_nodes_ = 0;
};

}  // namespace vigil::topology
