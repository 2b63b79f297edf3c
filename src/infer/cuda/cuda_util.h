// cuda_util.h — error conversion and RAII owners for the CUDA backend (host code).
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

#include "vigil/common/status.h"

namespace vigil::cuda {

inline Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  std::string msg = StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}
inline Status CudnnStatus(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": ", cudnnGetErrorString(s)));
}
inline Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": ", cublasGetStatusString(s)));
}

#define VIGIL_CUDA(call) VIGIL_RETURN_IF_ERROR(::vigil::cuda::CudaStatus((call), #call))
#define VIGIL_CUDNN(call) VIGIL_RETURN_IF_ERROR(::vigil::cuda::CudnnStatus((call), #call))
#define VIGIL_CUBLAS(call) VIGIL_RETURN_IF_ERROR(::vigil::cuda::CublasStatus((call), #call))

// Device memory (cudaMalloc: 256-byte aligned).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  static StatusOr<DeviceBuffer> Allocate(size_t bytes, const std::string& what) {
    DeviceBuffer b;
    if (bytes == 0) return b;
    cudaError_t e = cudaMalloc(&b.ptr_, bytes);
    if (e != cudaSuccess) {
      b.ptr_ = nullptr;
      return CudaStatus(e, StrCat("cudaMalloc(", bytes, " bytes) for ", what).c_str());
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

// Page-locked host memory (cudaMallocHost), for asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  static StatusOr<PinnedBuffer> Allocate(size_t bytes, const std::string& what) {
    PinnedBuffer b;
    if (bytes == 0) return b;
    cudaError_t e = cudaMallocHost(&b.ptr_, bytes);
    if (e != cudaSuccess) {
      b.ptr_ = nullptr;
      return CudaStatus(e, StrCat("cudaMallocHost(", bytes, " bytes) for ", what).c_str());
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

}  // namespace vigil::cuda
