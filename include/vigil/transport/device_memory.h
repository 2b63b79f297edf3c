// vigil/transport/device_memory.h — the few CUDA runtime calls the links make outside the cuda_ipc ring (ucx.cc): waiting for a
// DevicePayload's ready event, a device buffer to receive rows into, and the copy to the host for storage; and
// those of the hot standby's picture ring in GPU memory (replication/frame_ring.h): a peer's memory opened
// from its IPC handle, 2-D copies, stream-ordered buffers.
// With CUDA: cuda_ring.cc; without: cuda_ring_unavailable.cc (Available() false, everything else
// Unimplemented), so ucx.cc compiles the same either way.
//
// Thread-safety: every function may be called from any thread; a Buffer is used by one thread at a time.
// Errors: Internal / ResourceExhausted (a CUDA error, named), Unimplemented (built without CUDA).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "vigil/common/status.h"

namespace vigil::transport::device_memory {

// Whether this build has CUDA (a GPU may still be absent).
bool Available();

// How many CUDA devices this process sees (0 without CUDA or a driver). Creates no CUDA context.
int VisibleDevices();

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

// Like Allocate, from the device's stream-ordered pool (cudaMallocAsync): freeing never synchronises the device
// (a buffer released while inference runs does not stall it). The pool keeps freed memory for reuse (its release
// threshold is raised once per device): steady allocation and release map and unmap nothing. Usable at once by
// work on the calling thread's
// stream (Copy2D from the same thread: in order) and, once that synchronised, by any stream.
StatusOr<std::unique_ptr<Buffer>> AllocatePooled(int device, size_t bytes);

// `bytes` from src to dst (device or host memory either side), queued on the calling thread's stream of `device`
// and not waited for: complete once SynchronizeThread(device) returned OK on the same thread. Errors: Internal
// (the copy could not be queued).
Status CopyAsync(void* dst, const void* src, size_t bytes, int device);
// Waits for the work queued on the calling thread's stream of `device` (CopyAsync, Copy2D, AllocatePooled).
Status SynchronizeThread(int device);

// A rectangle of `width` bytes × `rows`: dst (row pitch dpitch) ← src (row pitch spitch), host or device memory
// either side (unified addressing tells which), synchronously, on the calling thread's stream of `device`.
Status Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, int device);

// The visible CUDA device with PCI bus id `bus_id`, -1 when none is. The bus id of `device` ("" when none).
int DeviceOfBusId(const std::string& bus_id);
std::string BusIdOf(int device);

// Another process's device memory, opened from its cudaIpcMemHandle_t bytes on `device` (peer access enabled
// when it lives on another GPU); closed by the destructor. Errors: Unavailable naming the reason.
class IpcMemory {
 public:
  virtual ~IpcMemory() = default;
  virtual void* data() const = 0;
};
StatusOr<std::unique_ptr<IpcMemory>> OpenIpc(const std::string& handle, int device);

// `bytes` of device memory on `device` exported for another process (cudaIpcGetMemHandle): `handle` is the
// handle's bytes. Freed by the destructor (an opener's mapping keeps it alive until closed).
class ExportedMemory : public Buffer {
 public:
  virtual std::string handle() const = 0;
};
StatusOr<std::unique_ptr<ExportedMemory>> AllocateExported(int device, size_t bytes);

}  // namespace vigil::transport::device_memory
