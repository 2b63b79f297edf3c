// CudaHostPinner (infer/cuda/host_pinner.h).
#include <cuda_runtime.h>

#include <spdlog/spdlog.h>

#include "vigil/infer/cuda_host_pinner.h"

namespace vigil::cuda {

Status CudaHostPinner::Pin(void* data, size_t bytes) {
  const cudaError_t st = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (st == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the sticky-free error so that later calls do not report it again
  return absl::InternalError(StrCat("cudaHostRegister of ", bytes, " bytes at ", data, ": ", cudaGetErrorString(st)));
}

void CudaHostPinner::Unpin(void* data) {
  const cudaError_t st = cudaHostUnregister(data);
  if (st != cudaSuccess) {
    cudaGetLastError();
    spdlog::warn("cuda: cudaHostUnregister of {}: {}", data, cudaGetErrorString(st));
  }
}

}  // namespace vigil::cuda
