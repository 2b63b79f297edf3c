// Internal: the cuda_ipc ring's publish kernels (ring.h). Device code in vigil_cuda; called from
// transport/cuda_ring.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace vigil::transport::ring {

// On `stream`, one block: copies `row_bytes` bytes from `rows` (device memory) to mirror + rows_offset (the
// slot in the host mirror, a device pointer of registered host memory) and, after a system-wide fence, stores
// `value` into `*signal` (unless null); then copies `host_bytes` bytes from `mirror` to `ring` (the slot in
// the GPU ring; null: no GPU ring) and the rows to ring + rows_offset, and after another fence stores
// `ring_value` into `*ring_ready` (device pointers of registered host memory). The host consumer, which reads
// the mirror, waits for no ring copy.
// REQUIRES: the offsets and sizes multiples of 8, the pointers 8-byte aligned. Returns the launch error.
cudaError_t LaunchPublishSlot(char* ring, char* mirror, size_t host_bytes, const char* rows, size_t rows_offset,
                              size_t row_bytes, unsigned long long* signal, unsigned long long value,
                              unsigned long long* ring_ready, unsigned long long ring_value, cudaStream_t stream);

// One publish of LaunchPublishSlot's arguments, posted by the host for the resident publisher. 80 bytes, in
// pinned host memory mapped for the device (the publisher reads it over PCIe, one word per lane).
struct PublishJob {
  char* ring;
  char* mirror;
  const char* rows;
  unsigned long long* signal;      // null: the CPU signalled the slot already
  unsigned long long* ring_ready;
  unsigned long long host_words, rows_offset, row_words, value, ring_value;
};

// The handshake between the host and the resident publisher, in pinned host memory mapped for the device.
// Words written by one side only: `posted` and `stop` by the host, `done` and `state` by the kernel.
struct PublisherControl {
  unsigned long long posted;  // jobs posted (job n lives at jobs[n % capacity])
  unsigned long long done;    // jobs published
  unsigned long long state;   // generation << 1 | 1 while that launch runs; generation << 1 once it left
  unsigned long long stop;    // 1: leave once every posted job is done
};

// On `stream`, one block that stays resident: publishes jobs[done % capacity] for every job posted (as
// LaunchPublishSlot would, in order), and leaves after `linger_ns` without one, or on `stop`; `generation`
// numbers this launch in `state`. The host launches a successor when it posts a job and finds the latest
// launch gone (state == generation << 1): both sides write, fence (seq_cst) and read the other's word, so
// a posted job is never left without a publisher. REQUIRES: capacity ≥ the jobs ever outstanding, one
// publisher per control block, launches on one stream. Returns the launch error.
cudaError_t LaunchPublisher(PublisherControl* control, const PublishJob* jobs, unsigned capacity,
                            unsigned long long generation, unsigned long long linger_ns, cudaStream_t stream);

}  // namespace vigil::transport::ring
