// The cuda_ipc ring's publish kernels (ring_kernels.h).
#include "transport/cuda/ring_kernels.h"

namespace vigil::transport::ring {
namespace {

constexpr int kThreads = 512;
constexpr int kJobWords = sizeof(PublishJob) / 8;
static_assert(sizeof(PublishJob) % 8 == 0 && kJobWords <= 32, "a job is read by one warp, a word per lane");

// Publishes one slot (see LaunchPublishSlot) with every thread of the block. The host consumer reads only the
// mirror, so it is served first: the device rows into the mirror, a system-wide fence, the signal. Then the
// GPU ring (the slot's host part read back from the mirror over PCIe, the rows again from device memory), a
// fence, ring_ready — off the host consumer's path (a slot is reused only after ring_ready passed it, so the
// mirror still holds it).
__device__ void PublishOne(char* ring, char* mirror, size_t host_words, const char* rows, size_t rows_offset,
                           size_t row_words, unsigned long long* signal, unsigned long long value,
                           unsigned long long* ring_ready, unsigned long long ring_value) {
  const auto* r = reinterpret_cast<const unsigned long long*>(rows);
  if (row_words > 0) {
    auto* mirror_rows = reinterpret_cast<unsigned long long*>(mirror + rows_offset);
    for (size_t i = threadIdx.x; i < row_words; i += blockDim.x) mirror_rows[i] = r[i];
  }
  if (signal != nullptr) {
    __threadfence_system();  // this thread's mirror stores before the signal, for every observer
    __syncthreads();
    if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(signal) = value;
  }
  if (ring != nullptr) {
    const auto* src = reinterpret_cast<const unsigned long long*>(mirror);
    auto* dst = reinterpret_cast<unsigned long long*>(ring);
    for (size_t i = threadIdx.x; i < host_words; i += blockDim.x) dst[i] = src[i];
    auto* ring_rows = reinterpret_cast<unsigned long long*>(ring + rows_offset);
    for (size_t i = threadIdx.x; i < row_words; i += blockDim.x) ring_rows[i] = r[i];
  }
  __threadfence_system();  // the ring's stores before ring_ready
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(ring_ready) = ring_value;
}

__global__ void PublishSlot(char* ring, char* mirror, size_t host_words, const char* rows, size_t rows_offset,
                            size_t row_words, unsigned long long* signal, unsigned long long value,
                            unsigned long long* ring_ready, unsigned long long ring_value) {
  PublishOne(ring, mirror, host_words, rows, rows_offset, row_words, signal, value, ring_ready, ring_value);
}

__device__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The resident publisher: warp 0 polls the host's `posted` over PCIe; a posted job is read by one lane per
// word (one round trip), copied by the whole block, signalled, and counted in `done`. After `linger_ns`
// without a job it leaves by Dekker's handshake with PostJob's host side: state := exited, fence, look at
// `posted` once more (a job posted meanwhile is taken: the host may or may not have launched a successor,
// which, queued on the same stream, starts only after this one returns and finds nothing or the rest).
__global__ void Publisher(PublisherControl* control, const PublishJob* jobs, unsigned capacity,
                          unsigned long long generation, unsigned long long linger_ns) {
  __shared__ unsigned long long job[kJobWords];
  __shared__ int command;  // 0: a job in `job`; 1: leave
  volatile PublisherControl* c = control;
  const unsigned lane = threadIdx.x & 31u;
  unsigned long long done = c->done;
  if (threadIdx.x == 0) {
    c->state = generation << 1 | 1u;
    __threadfence_system();
  }
  unsigned long long idle_since = GlobalTimerNs();
  for (;;) {
    if (threadIdx.x < 32) {
      int cmd = -1;
      while (cmd < 0) {
        unsigned long long posted = 0, stop = 0;
        if (lane == 0) {
          posted = c->posted;
          stop = c->stop;
        }
        posted = __shfl_sync(0xffffffffu, posted, 0);
        stop = __shfl_sync(0xffffffffu, stop, 0);
        if (posted > done) {
          __threadfence_system();  // the job's words were written before `posted`: read them after it
          if (lane < kJobWords) {
            job[lane] = reinterpret_cast<const volatile unsigned long long*>(jobs + done % capacity)[lane];
          }
          cmd = 0;
        } else if (stop != 0) {
          if (lane == 0) c->state = generation << 1;
          cmd = 1;
        } else if (GlobalTimerNs() - idle_since > linger_ns) {
          if (lane == 0) {
            c->state = generation << 1;
            __threadfence_system();
            posted = c->posted;
          }
          posted = __shfl_sync(0xffffffffu, posted, 0);
          if (posted > done) {
            if (lane == 0) c->state = generation << 1 | 1u;  // a job came in the handshake: take it
          } else {
            cmd = 1;
          }
        }
        __syncwarp();
      }
      if (lane == 0) command = cmd;
    }
    __syncthreads();
    if (command == 1) return;
    const PublishJob& j = *reinterpret_cast<const PublishJob*>(job);
    PublishOne(j.ring, j.mirror, j.host_words, j.rows, j.rows_offset, j.row_words, j.signal, j.value, j.ring_ready,
               j.ring_value);
    ++done;
    if (threadIdx.x == 0) c->done = done;
    idle_since = GlobalTimerNs();
    __syncthreads();  // `job` is rewritten only after every thread has used it
  }
}

}  // namespace

cudaError_t LaunchPublishSlot(char* ring, char* mirror, size_t host_bytes, const char* rows, size_t rows_offset,
                              size_t row_bytes, unsigned long long* signal, unsigned long long value,
                              unsigned long long* ring_ready, unsigned long long ring_value, cudaStream_t stream) {
  PublishSlot<<<1, kThreads, 0, stream>>>(ring, mirror, host_bytes / 8, rows, rows_offset, row_bytes / 8, signal,
                                          value, ring_ready, ring_value);
  return cudaGetLastError();
}

cudaError_t LaunchPublisher(PublisherControl* control, const PublishJob* jobs, unsigned capacity,
                            unsigned long long generation, unsigned long long linger_ns, cudaStream_t stream) {
  Publisher<<<1, kThreads, 0, stream>>>(control, jobs, capacity, generation, linger_ns);
  return cudaGetLastError();
}

}  // namespace vigil::transport::ring
