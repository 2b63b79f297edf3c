// The cuda_ipc ring's publish kernel (ring_kernels.h).
#include "transport/cuda/ring_kernels.h"

namespace vigil::transport::ring {
namespace {

constexpr int kThreads = 512;

__global__ void PublishSlot(char* ring, char* mirror, size_t host_words, const char* rows, size_t rows_offset,
                            size_t row_words, unsigned long long* signal, unsigned long long value,
                            unsigned long long* ring_ready, unsigned long long ring_value) {
  const auto* src = reinterpret_cast<const unsigned long long*>(mirror);
  auto* dst = reinterpret_cast<unsigned long long*>(ring);
  if (ring != nullptr) {
    for (size_t i = threadIdx.x; i < host_words; i += blockDim.x) dst[i] = src[i];
  }
  if (row_words > 0) {
    const auto* r = reinterpret_cast<const unsigned long long*>(rows);
    auto* ring_rows = reinterpret_cast<unsigned long long*>(ring + rows_offset);
    auto* mirror_rows = reinterpret_cast<unsigned long long*>(mirror + rows_offset);
    for (size_t i = threadIdx.x; i < row_words; i += blockDim.x) {
      const unsigned long long v = r[i];
      if (ring != nullptr) ring_rows[i] = v;
      mirror_rows[i] = v;
    }
  }
  __threadfence_system();  // this thread's ring and mirror stores before the signal, for every observer
  __syncthreads();
  if (threadIdx.x == 0) {
    if (signal != nullptr) *reinterpret_cast<volatile unsigned long long*>(signal) = value;
    *reinterpret_cast<volatile unsigned long long*>(ring_ready) = ring_value;
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

}  // namespace vigil::transport::ring
