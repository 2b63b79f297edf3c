// vigil/common/host_memory_pinner.h — the hook through which a device backend page-locks host memory
// that another module allocated.
//
// The topology module's HostBufferPool allocates NUMA-local host buffers; a device backend (CUDA:
// vigil/infer/cuda_host_pinner.h, cudaHostRegister) pins them so that its copies run by DMA at full speed
// without a bounce through the driver's own staging buffer. The interface lives here, in common, so
// that neither module depends on the other: whoever wires them (the edge pipeline, a benchmark) hands
// the pool a pinner.
//
// Ownership: the pinner never owns the memory; the caller keeps it mapped from Pin until Unpin.
// Thread-safety: implementations must allow calls from any thread.
#pragma once

#include <cstddef>
#include <string_view>

#include "vigil/common/status.h"

namespace vigil {

class HostMemoryPinner {
 public:
  virtual ~HostMemoryPinner() = default;

  // Page-locks [data, data + bytes) for the device. REQUIRES: data page-aligned, bytes > 0, the range
  // not pinned already. Errors name the backend and its reason (e.g. "cudaHostRegister: out of
  // memory"); the memory is then left as it was (pageable) and stays usable.
  virtual Status Pin(void* data, size_t bytes) = 0;
  // Undoes Pin(data, ...). REQUIRES: a successful Pin of exactly this address, not undone yet.
  virtual void Unpin(void* data) = 0;
  // The backend's name for messages and metrics ("cuda").
  virtual std::string_view name() const = 0;
};

}  // namespace vigil
