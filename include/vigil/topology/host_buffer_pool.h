// vigil/topology/host_buffer_pool.h — fixed-size host buffers for frames and results, placed on one
// NUMA node and optionally page-locked for a device.
//
//   Binder binder;                                               // binder.h: decides whether to bind
//   StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = 1920 * 1080 * 3,
//       .buffers = 8, .numa_node = plan.devices[d].numa_node, .pinner = &cuda_pinner, .name = "gpu0 staging"});
//   StatusOr<PooledBuffer> b = pool->Acquire(std::chrono::milliseconds(5));   // b->data(): buffer_bytes bytes
//   ...                                                          // b goes back to the pool when destroyed
//
// Memory: one slab of buffers × stride bytes (stride = buffer_bytes rounded up to whole pages, so each
// buffer starts on a page boundary), mapped and bound to `numa_node` by the Binder
// (Binder::AllocateHostBuffer: hwloc_set_area_membind, MEMBIND_BIND | STRICT) and faulted in at
// creation, so no frame pays for a page fault. An inactive Binder (DISABLE_NUMA_BIND=1,
// `placement: {bind: false}`, a single-NUMA machine) gives unbound memory; a bind failure is logged
// and the pool goes on unbound (stats().numa_node == -1). huge_pages asks for transparent huge pages
// (madvise(MADV_HUGEPAGE), Linux Documentation/admin-guide/mm/transhuge.rst) on a 2 MiB-aligned slab
// of at least 2 MiB; the kernel may still use 4 KiB pages (THP "never", fragmentation).
//
// Pinning: with a pinner (common/host_memory_pinner.h) the whole slab is pinned once at creation and
// unpinned when the slab is released. A pinning failure is logged (warn) and the pool goes on with
// pageable memory (stats().pinned false): never fatal.
//
// Ownership: the pool's state is shared by the pool object and every outstanding PooledBuffer, so a
// buffer may outlive the pool object; the slab is unpinned and unmapped when the last of them goes.
// The pinner must outlive that.
// Thread-safety: Acquire, stats and PooledBuffer release may be called from any thread concurrently.
// A PooledBuffer is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "vigil/common/host_memory_pinner.h"
#include "vigil/common/status.h"
#include "vigil/topology/binder.h"

namespace vigil::topology {

struct HostBufferPoolOptions {
  size_t buffer_bytes = 0;             // usable bytes per buffer (> 0)
  size_t buffers = 0;                  // number of buffers (> 0)
  int numa_node = -1;                  // OS index of the node to bind to; -1 = no binding. Default: -1
  bool huge_pages = false;             // transparent huge pages for a slab of >= 2 MiB. Default: false
  HostMemoryPinner* pinner = nullptr;  // page-locks the slab; not owned. Default: none (pageable)
  std::string name = "host buffers";   // names the pool in logs and errors
};

struct HostBufferPoolStats {
  size_t capacity = 0;      // buffers
  size_t in_use = 0;        // buffers acquired and not yet released
  size_t peak_in_use = 0;   // highest in_use so far
  uint64_t acquired = 0;    // successful acquires
  uint64_t waits = 0;       // acquires that found the pool exhausted and waited (then succeeded or not)
  uint64_t failures = 0;    // acquires that returned no buffer: exhausted at the deadline
  size_t buffer_bytes = 0;  // as requested
  size_t stride = 0;        // bytes from one buffer's start to the next (whole pages)
  size_t slab_bytes = 0;    // bytes mapped
  int numa_node = -1;       // node the slab is bound to; -1 unbound
  bool pinned = false;      // the pinner accepted the slab
  bool huge_pages = false;  // MADV_HUGEPAGE was applied (the kernel decides whether it uses them)
};

namespace internal {
struct HostBufferPoolState;
}

// One buffer of a pool, returned to it on destruction or Release(). Move-only.
class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(PooledBuffer&& other) noexcept;
  PooledBuffer& operator=(PooledBuffer&& other) noexcept;
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  ~PooledBuffer() { Release(); }

  void* data() const { return data_; }      // page-aligned; nullptr when empty
  size_t size() const { return size_; }     // the pool's buffer_bytes
  size_t index() const { return index_; }   // 0 .. capacity - 1, position in the slab
  bool empty() const { return data_ == nullptr; }
  void Release();                           // gives the buffer back now; idempotent

 private:
  friend class HostBufferPool;
  std::shared_ptr<internal::HostBufferPoolState> pool_;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t index_ = 0;
};

class HostBufferPool {
 public:
  HostBufferPool(HostBufferPool&&) noexcept = default;
  HostBufferPool& operator=(HostBufferPool&&) noexcept = default;
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // Maps, binds (through `binder`), faults in and pins the slab. Errors: InvalidArgument for a zero
  // size or count, a size overflow, or a node that does not exist here; ResourceExhausted when the
  // memory cannot be mapped. Binding and pinning failures are not errors (see above).
  static StatusOr<HostBufferPool> Create(Binder& binder, HostBufferPoolOptions options);

  // A free buffer, waiting up to `timeout` for one when all are in use (0: do not wait). Buffers are
  // handed out most recently released first (its cache lines are likeliest still warm). Errors:
  // ResourceExhausted naming the pool when none became free in time (counted in failures).
  StatusOr<PooledBuffer> Acquire(std::chrono::nanoseconds timeout = std::chrono::nanoseconds(0));

  HostBufferPoolStats stats() const;
  const void* slab() const;  // the slab's start, e.g. for Binder::QueryMemory
  const std::string& name() const;

 private:
  explicit HostBufferPool(std::shared_ptr<internal::HostBufferPoolState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::HostBufferPoolState> state_;
};

}  // namespace vigil::topology
