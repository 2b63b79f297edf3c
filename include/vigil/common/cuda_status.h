// vigil/common/cuda_status.h — a CUDA runtime error as a vigil::Status (header-only; for code built with CUDA: the CUDA
// backend's vigil/infer/cuda_util.h, the cuda_ipc ring's transport/cuda_ring.cc).
//
// The Status names the call and CUDA's own message; out-of-memory becomes ResourceExhausted, everything else
// Internal. Thread-safety: pure.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "vigil/common/status.h"

namespace vigil::cuda {

inline Status CudaStatus(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  std::string msg = StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

#define VIGIL_CUDA(call) VIGIL_RETURN_IF_ERROR(::vigil::cuda::CudaStatus((call), #call))

}  // namespace vigil::cuda
