// The cuda_ipc ring's CUDA backend in a build without CUDA (cuda_ring.cc is the real one).
#include "ring.h"

namespace vigil::transport::ring {

StatusOr<std::unique_ptr<RingMemory>> AllocateCudaRing(int device, size_t) {
  return absl::UnimplementedError(
      StrCat("ring on cuda:", device, ": this vigil was built without CUDA (use device: host)"));
}

StatusOr<std::unique_ptr<RingMapping>> MapCudaRing(const RingOffer&, char*, size_t, int) {
  return absl::UnavailableError("the aggregator offers a ring in GPU memory; this vigil was built without CUDA");
}

}  // namespace vigil::transport::ring
