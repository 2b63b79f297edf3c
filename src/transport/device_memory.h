// Internal: the few CUDA runtime calls the links make outside the cuda_ipc ring (ucx.cc): waiting for a
// DevicePayload's ready event, a device buffer to receive rows into, and the copy to the host for storage.
// With CUDA: cuda_ring.cc; without: cuda_ring_unavailable.cc (Available() false, everything else
// Unimplemented), so ucx.cc compiles the same either way.
//
// Thread-safety: every function may be called from any thread; a Buffer is used by one thread at a time.
// Errors: Internal / ResourceExhausted (a CUDA error, named), Unimplemented (built without CUDA).
#pragma once

#include <cstddef>
#include <memory>

#include "vigil/common/status.h"

namespace vigil::transport::device_memory {

// Whether this build has CUDA (a GPU may still be absent).
bool Available();

// Makes CUDA device `device` current on the calling thread (its primary context).
Status Use(int device);

// Waits for `event` (a cudaEvent_t; null: returns at once).
Status WaitReady(void* event);

// `bytes` of device memory on `device`, freed by the destructor.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  virtual int device() const = 0;
};
StatusOr<std::unique_ptr<Buffer>> Allocate(int device, size_t bytes);

// Copies `bytes` from device memory `src` (on `device`) to host memory `dst`, synchronously.
Status CopyToHost(void* dst, const void* src, size_t bytes, int device);

}  // namespace vigil::transport::device_memory
