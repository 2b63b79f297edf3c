// vigil/infer/cuda_copy_timing.h — host→device copy timing for `vigil bench placement` (pageable vs pinned vs NUMA-local
// pinned host memory). Built only with VIGIL_HAVE_CUDA.
//
// Method (as NVIDIA's bandwidthTest sample): one device buffer of `bytes` (cudaMalloc on `device`), a
// non-blocking stream, `warmup` untimed copies, then `iterations` copies each bracketed by two CUDA events
// recorded on the stream (cudaMemcpyAsync host→device; from pageable memory the driver stages it through
// its own pinned buffer, from registered or cudaHostAlloc'ed memory it is one DMA), each synchronised
// before the next. CUDA Runtime API: cudaEventElapsedTime (resolution about 0.5 µs).
//
// Thread-safety: any thread; it sets the calling thread's current device. Errors: Internal with
// cudaGetErrorString (no device, out of memory); everything allocated is freed on every path.
#pragma once

#include <cstddef>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::cuda {

// Elapsed time of each timed copy, milliseconds. REQUIRES: bytes > 0, iterations > 0.
StatusOr<std::vector<double>> TimeHostToDevice(const void* host, size_t bytes, int device, int warmup, int iterations);

}  // namespace vigil::cuda
