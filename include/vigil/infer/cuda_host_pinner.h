// vigil/infer/cuda_host_pinner.h — page-locks host memory for CUDA: the CUDA implementation of the pinner hook
// (vigil/common/host_memory_pinner.h) that topology's HostBufferPool calls for its slab.
//
// Pin registers the range with cudaHostRegister(cudaHostRegisterPortable): the memory stays where it
// was allocated (NUMA-local when the pool bound it; cudaHostAlloc would allocate anew, wherever the
// driver chooses) and becomes page-locked for every CUDA context, so cudaMemcpyAsync from it runs by
// DMA and overlaps with kernels. Unpin is cudaHostUnregister. CUDA Runtime API reference,
// "Memory Management": cudaHostRegister, cudaHostUnregister.
//
// Thread-safety: thread-safe (the CUDA runtime serialises registration). Errors: Pin returns
// Internal with cudaGetErrorString (no driver, no device, out of pinned memory, already registered);
// the memory is then untouched and pageable. Unpin failures are logged (spdlog warn).
// Built only with VIGIL_HAVE_CUDA.
#pragma once

#include "vigil/common/host_memory_pinner.h"

namespace vigil::cuda {

class CudaHostPinner final : public HostMemoryPinner {
 public:
  Status Pin(void* data, size_t bytes) override;
  void Unpin(void* data) override;
  std::string_view name() const override { return "cuda"; }
};

}  // namespace vigil::cuda
