// TimeHostToDevice (infer/cuda/copy_timing.h).
#include <cuda_runtime.h>

#include "vigil/infer/cuda_copy_timing.h"

namespace vigil::cuda {
namespace {

// Frees what was created, in reverse order, whatever path leaves the function.
struct Resources {
  void* device_buffer = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Resources() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
    if (stream) cudaStreamDestroy(stream);
    if (device_buffer) cudaFree(device_buffer);
  }
};

}  // namespace

StatusOr<std::vector<double>> TimeHostToDevice(const void* host, size_t bytes, int device, int warmup, int iterations) {
  Resources r;
  auto fail = [](const char* what, cudaError_t e) {
    cudaGetLastError();
    return absl::InternalError(StrCat(what, ": ", cudaGetErrorString(e)));
  };
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return fail("cudaSetDevice", e);
  if ((e = cudaMalloc(&r.device_buffer, bytes)) != cudaSuccess) return fail("cudaMalloc", e);
  if ((e = cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking)) != cudaSuccess) return fail("cudaStreamCreate", e);
  if ((e = cudaEventCreate(&r.start)) != cudaSuccess || (e = cudaEventCreate(&r.stop)) != cudaSuccess) {
    return fail("cudaEventCreate", e);
  }
  std::vector<double> ms;
  for (int i = 0; i < warmup + iterations; ++i) {
    if ((e = cudaEventRecord(r.start, r.stream)) != cudaSuccess) return fail("cudaEventRecord", e);
    if ((e = cudaMemcpyAsync(r.device_buffer, host, bytes, cudaMemcpyHostToDevice, r.stream)) != cudaSuccess) {
      return fail("cudaMemcpyAsync", e);
    }
    if ((e = cudaEventRecord(r.stop, r.stream)) != cudaSuccess) return fail("cudaEventRecord", e);
    if ((e = cudaEventSynchronize(r.stop)) != cudaSuccess) return fail("cudaEventSynchronize", e);
    float elapsed = 0;
    if ((e = cudaEventElapsedTime(&elapsed, r.start, r.stop)) != cudaSuccess) return fail("cudaEventElapsedTime", e);
    if (i >= warmup) ms.push_back(elapsed);
  }
  return ms;
}

}  // namespace vigil::cuda
