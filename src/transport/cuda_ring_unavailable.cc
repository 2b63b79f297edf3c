// The cuda_ipc ring's CUDA backend and device_memory.h in a build without CUDA (cuda_ring.cc is the real one).
#include "vigil/transport/device_memory.h"
#include "ring.h"

namespace vigil::transport::ring {

StatusOr<std::unique_ptr<RingMemory>> AllocateCudaRing(int device, size_t) {
  return absl::UnimplementedError(
      StrCat("ring on cuda:", device, ": this vigil was built without CUDA (use device: host)"));
}

StatusOr<std::unique_ptr<RingMapping>> MapCudaRing(const RingOffer&, char*, size_t, int, uint32_t) {
  return absl::UnavailableError("the aggregator offers a ring in GPU memory; this vigil was built without CUDA");
}

}  // namespace vigil::transport::ring

namespace vigil::transport::device_memory {

namespace {
Status NoCuda() { return absl::UnimplementedError("device memory: this vigil was built without CUDA"); }
}  // namespace

bool Available() { return false; }
int VisibleDevices() { return 0; }
Status Use(int) { return NoCuda(); }
Status WaitReady(void* event) { return event == nullptr ? absl::OkStatus() : NoCuda(); }
StatusOr<std::unique_ptr<Buffer>> Allocate(int, size_t) { return NoCuda(); }
Status CopyToHost(void*, const void*, size_t, int) { return NoCuda(); }
StatusOr<std::unique_ptr<Buffer>> AllocatePooled(int, size_t) { return NoCuda(); }
Status Copy2D(void*, size_t, const void*, size_t, size_t, size_t, int) { return NoCuda(); }
Status CopyAsync(void*, const void*, size_t, int) { return NoCuda(); }
Status SynchronizeThread(int) { return NoCuda(); }
int DeviceOfBusId(const std::string&) { return -1; }
std::string BusIdOf(int) { return {}; }
StatusOr<std::unique_ptr<IpcMemory>> OpenIpc(const std::string&, int) {
  return absl::UnavailableError("device memory from another process: this vigil was built without CUDA");
}
StatusOr<std::unique_ptr<ExportedMemory>> AllocateExported(int, size_t) { return NoCuda(); }

}  // namespace vigil::transport::device_memory
