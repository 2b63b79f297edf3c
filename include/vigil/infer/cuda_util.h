// vigil/infer/cuda_util.h — error conversion and RAII owners for the CUDA backend (host code).
//
// Errors: every CUDA runtime, cuDNN and cuBLAS status becomes a vigil::Status naming the call and the
// library's own message; out-of-memory becomes ResourceExhausted, everything else Internal.
// Ownership: DeviceBuffer / PinnedBuffer own one allocation each (cudaMalloc / cudaMallocHost) and
// free it on destruction; movable, not copyable. Thread-safety: none needed beyond CUDA's own.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "vigil/common/cuda_status.h"  // CudaStatus, VIGIL_CUDA
#include "vigil/common/status.h"

namespace vigil::cuda {

inline Status CudnnStatus(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": ", cudnnGetErrorString(s)));
}
inline Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": ", cublasGetStatusString(s)));
}

#define VIGIL_CUDNN(call) VIGIL_RETURN_IF_ERROR(::vigil::cuda::CudnnStatus((call), #call))
#define VIGIL_CUBLAS(call) VIGIL_RETURN_IF_ERROR(::vigil::cuda::CublasStatus((call), #call))

inline cudaError_t DeviceAlloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t PinnedAlloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }

// One CUDA allocation, freed on destruction. `kWhat` names the allocator in errors.
template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*), const char* kWhat>
class CudaMemory {
 public:
  CudaMemory() = default;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  CudaMemory(CudaMemory&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  CudaMemory& operator=(CudaMemory&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~CudaMemory() {
    if (ptr_) Free(ptr_);
  }
  static StatusOr<CudaMemory> Allocate(size_t bytes, const std::string& what) {
    CudaMemory b;
    if (bytes == 0) return b;
    cudaError_t e = Alloc(&b.ptr_, bytes);
    if (e != cudaSuccess) {
      b.ptr_ = nullptr;
      return CudaStatus(e, StrCat(kWhat, "(", bytes, " bytes) for ", what).c_str());
    }
    b.bytes_ = bytes;
    return b;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline constexpr char kCudaMalloc[] = "cudaMalloc";
inline constexpr char kCudaMallocHost[] = "cudaMallocHost";
// Device memory (cudaMalloc: 256-byte aligned).
using DeviceBuffer = CudaMemory<DeviceAlloc, cudaFree, kCudaMalloc>;
// Page-locked host memory (cudaMallocHost), for asynchronous copies.
using PinnedBuffer = CudaMemory<PinnedAlloc, cudaFreeHost, kCudaMallocHost>;

}  // namespace vigil::cuda
