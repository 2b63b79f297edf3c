// The cuda_ipc ring's publish kernels (ring_kernels.h).
#include "transport/cuda/ring_kernels.h"

namespace vigil::transport::ring {
namespace {

constexpr int kThreads = 512;
static_assert(sizeof(PublishJob) == 32, "a job's words are read by lanes 0..2");

// Publishes one slot (see LaunchPublishSlot) with every thread of the block. The host consumer reads only the
// mirror, so it is served first: the device rows into the mirror, a system-wide fence, the signal. Then the
// GPU ring (the slot's host part read back from the mirror over PCIe, the rows again from device memory), a
// fence, ring_ready — off the host consumer's path (a slot is reused only after ring_ready passed it, so the
// mirror still holds it). The resident publisher reads the same rows buffer and mirror slots again and again:
// rows are read through L2 only and the mirror uncached, never from a stale L1 line.
__device__ void PublishOne(char* ring, char* mirror, size_t host_words, const char* rows, size_t rows_offset,
                           size_t row_words, unsigned long long* signal, unsigned long long value,
                           unsigned long long* ring_ready, unsigned long long ring_value) {
  const auto* r = reinterpret_cast<const unsigned long long*>(rows);
  if (row_words > 0) {
    auto* mirror_rows = reinterpret_cast<unsigned long long*>(mirror + rows_offset);
    for (size_t i = threadIdx.x; i < row_words; i += blockDim.x) mirror_rows[i] = __ldcg(r + i);
  }
  if (signal != nullptr) {
    __threadfence_system();  // this thread's mirror stores before the signal, for every observer
    __syncthreads();
    if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(signal) = value;
  }
  if (ring != nullptr) {
    const auto* src = reinterpret_cast<const unsigned long long*>(mirror);
    auto* dst = reinterpret_cast<unsigned long long*>(ring);
    for (size_t i = threadIdx.x; i < host_words; i += blockDim.x) dst[i] = __ldcv(src + i);
    auto* ring_rows = reinterpret_cast<unsigned long long*>(ring + rows_offset);
    for (size_t i = threadIdx.x; i < row_words; i += blockDim.x) ring_rows[i] = __ldcg(r + i);
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

__device__ unsigned long long LoadAcquireSystem(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The resident publisher: warp 0 polls job `done`'s three words over PCIe (one lane each, one round trip) and
// `stop`; a job whose three words carry its tag (ring_kernels.h, PublishJob) is copied by the whole block,
// signalled, and counted in `done`. After `linger_ns` without a job it leaves by Dekker's handshake with
// PostJob's host side: state := exited, fence, look at `posted` once more (a job posted meanwhile is taken:
// the host may or may not have launched a successor, which, queued on the same stream, starts only after this
// one returns and finds nothing or the rest). `stop` is obeyed only when `posted`, read after it, shows no job
// left: the host posts before it stops, and a job's words may be seen later than `stop`.
__global__ void Publisher(PublisherControl* control, const PublishJob* jobs, unsigned capacity,
                          PublisherLayout layout, unsigned long long generation, unsigned long long linger_ns) {
  __shared__ unsigned long long job[3];  // value, rows, sizes (tags stripped)
  __shared__ int command;                // 0: a job in `job`; 1: leave
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
      const PublishJob* j = jobs + done % capacity;
      const unsigned long long tag = JobTag(done, capacity);
      while (cmd < 0) {
        unsigned long long w = 0;
        if (lane == 0) {
          w = LoadAcquireSystem(&j->value);  // the mirror's host part, written before it, is read after it
        } else if (lane == 1) {
          w = reinterpret_cast<const volatile unsigned long long*>(j)[1];
        } else if (lane == 2) {
          w = reinterpret_cast<const volatile unsigned long long*>(j)[2];
        } else if (lane == 3) {
          w = c->stop;
        }
        const unsigned long long value = __shfl_sync(0xffffffffu, w, 0);
        const unsigned long long rows = __shfl_sync(0xffffffffu, w, 1);
        const unsigned long long sizes = __shfl_sync(0xffffffffu, w, 2);
        const unsigned long long stop = __shfl_sync(0xffffffffu, w, 3);
        if ((value >> 24) == ((done + 1) & ((1ull << 40) - 1)) && (rows >> 48) == tag && (sizes >> 48) == tag) {
          if (lane == 0) {
            job[0] = value;
            job[1] = rows & kJobAddressMask;
            job[2] = sizes & kJobAddressMask;
          }
          cmd = 0;
        } else if (stop != 0 || GlobalTimerNs() - idle_since > linger_ns) {
          unsigned long long posted = 0;
          if (lane == 0) {
            if (stop == 0) c->state = generation << 1;  // linger over: exited, then look once more
            __threadfence_system();
            posted = c->posted;
          }
          posted = __shfl_sync(0xffffffffu, posted, 0);
          if (posted > done) {
            if (lane == 0) c->state = generation << 1 | 1u;  // a job came (or is still to be seen): take it
            idle_since = GlobalTimerNs();
          } else {
            if (lane == 0 && stop != 0) c->state = generation << 1;
            cmd = 1;
          }
        }
        __syncwarp();
      }
      if (lane == 0) command = cmd;
    }
    __syncthreads();
    if (command == 1) return;
    const unsigned long long seq = done, slot = seq % layout.slots;
    const size_t host_words = job[2] & 0xffffffu, row_words = (job[2] >> 24) & 0xffffffu;
    const char* rows = reinterpret_cast<const char*>(job[1]);
    char* ring = layout.ring != nullptr ? layout.ring + slot * layout.slot_bytes : nullptr;
    PublishOne(ring, layout.mirror + slot * layout.slot_bytes, host_words, rows, host_words * 8,
               rows != nullptr ? row_words : 0, rows != nullptr ? layout.signals + slot : nullptr, job[0],
               layout.ring_ready, seq + 1);
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
                            const PublisherLayout& layout, unsigned long long generation, unsigned long long linger_ns,
                            cudaStream_t stream) {
  Publisher<<<1, kThreads, 0, stream>>>(control, jobs, capacity, layout, generation, linger_ns);
  return cudaGetLastError();
}

}  // namespace vigil::transport::ring
