// Internal: the cuda_ipc ring's publish kernel (ring.h). Device code in vigil_cuda; called from
// transport/cuda_ring.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace vigil::transport::ring {

// On `stream`, one block: copies `host_bytes` bytes from `mirror` (the slot in the host mirror, a device
// pointer of registered host memory) to `ring` (the slot in the GPU ring; null: no GPU ring), then
// `row_bytes` bytes from `rows` (device memory) to ring + rows_offset and mirror + rows_offset; then, after a
// system-wide fence, stores `value` into `*signal` (unless null) and `ring_value` into `*ring_ready` (device
// pointers of registered host memory).
// REQUIRES: the offsets and sizes multiples of 8, the pointers 8-byte aligned. Returns the launch error.
cudaError_t LaunchPublishSlot(char* ring, char* mirror, size_t host_bytes, const char* rows, size_t rows_offset,
                              size_t row_bytes, unsigned long long* signal, unsigned long long value,
                              unsigned long long* ring_ready, unsigned long long ring_value, cudaStream_t stream);

}  // namespace vigil::transport::ring
