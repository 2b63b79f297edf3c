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

// One publish for the resident publisher: job n (the ring's slot seq n) lives at jobs[n % capacity], in pinned
// host memory mapped for the device. Every word names its job (`value` holds n + 1, the others the tag of n's
// lap), so the publisher reads a job in one PCIe round trip (three lanes, one word each, no `posted` read
// first) and takes it only when all three words are job n's: the host writes `rows` and `sizes`, then `value`
// with release order; a word read before the host wrote it names an earlier job and the publisher reads again.
struct PublishJob {
  unsigned long long value;  // the slot's signal value, ((n + 1) << 24) | used bytes (ring.h)
  unsigned long long rows;   // device address of the rows (bits 0..47; 0: none, the CPU signalled the slot
                             // already) | JobTag(n, capacity) << 48
  unsigned long long sizes;  // the slot's host part in 8-byte words (bits 0..23; the rows follow it) | rows in
                             // 8-byte words (bits 24..47) | JobTag(n, capacity) << 48
  unsigned long long pad;
};
// The tag of job n: the lap of its entry, never 0 (zeroed memory is no job) and different from the lap before.
#ifdef __CUDACC__
__host__ __device__
#endif
inline unsigned long long JobTag(unsigned long long n, unsigned capacity) { return ((n / capacity) + 1) & 0xffffu; }
inline constexpr unsigned long long kJobAddressMask = (1ull << 48) - 1;

// Where job n's slot is: the GPU ring (null: none), the host mirror and the signal words (device pointers of
// registered host memory), ControlHeader::ring_ready, and the ring's shape.
struct PublisherLayout {
  char* ring;
  char* mirror;
  unsigned long long* signals;
  unsigned long long* ring_ready;
  unsigned long long slots, slot_bytes;
};

// The handshake between the host and the resident publisher, in pinned host memory mapped for the device.
// Words written by one side only: `posted` and `stop` by the host, `done` and `state` by the kernel.
struct PublisherControl {
  unsigned long long posted;  // jobs posted (job n lives at jobs[n % capacity])
  unsigned long long done;    // jobs published
  unsigned long long state;   // generation << 1 | 1 while that launch runs; generation << 1 once it left
  unsigned long long stop;    // 1: leave once every posted job is done
};

// On `stream`, one block that stays resident: publishes job n (slot seq n of `layout`) as LaunchPublishSlot
// would, in order, for every job posted, and leaves after `linger_ns` without one, or on `stop` once every
// posted job is done; `generation` numbers this launch in `state`. The host launches a successor when it
// posts a job and finds the latest launch gone (state == generation << 1): both sides write, fence (seq_cst)
// and read the other's word, so a posted job is never left without a publisher. REQUIRES: capacity ≥ the jobs ever outstanding, one
// publisher per control block, launches on one stream. Returns the launch error.
cudaError_t LaunchPublisher(PublisherControl* control, const PublishJob* jobs, unsigned capacity,
                            const PublisherLayout& layout, unsigned long long generation, unsigned long long linger_ns,
                            cudaStream_t stream);

}  // namespace vigil::transport::ring
