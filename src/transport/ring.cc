// The cuda_ipc ring (ring.h): the host-memory backend, backend dispatch.
#include "ring.h"

#include <cstddef>
#include <string>

namespace vigil::transport::ring {
namespace {

// Memory "host": the mirror in the shared block is the ring; the producer's CPU writes it.
class HostRingMapping final : public RingMapping {
 public:
  explicit HostRingMapping(char* shared) : shared_(shared) {}
  Status Publish(uint64_t seq, size_t, size_t, const void* rows, size_t, size_t row_bytes, void*, size_t signal_offset,
                 uint64_t value) override {
    if (rows != nullptr && row_bytes > 0) return absl::UnimplementedError("a host-memory ring takes no device rows");
    Word(shared_, signal_offset).store(value, std::memory_order_release);  // after the slot's bytes
    Word(shared_, offsetof(ControlHeader, ring_ready)).store(seq + 1, std::memory_order_release);
    return absl::OkStatus();
  }
  bool takes_device_rows(int) const override { return false; }
  Status Drain() override { return absl::OkStatus(); }
  std::string transports() const override { return "shm"; }

 private:
  char* shared_;
};

}  // namespace

StatusOr<std::unique_ptr<RingMemory>> AllocateRing(const std::string& device, size_t bytes) {
  const std::string n = device.rfind("cuda:", 0) == 0 ? device.substr(5) : "";
  if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(StrCat("ring device '", device, "': expected cuda:N"));
  }
  return AllocateCudaRing(std::stoi(n), bytes);
}

StatusOr<std::unique_ptr<RingMapping>> MapRing(const RingOffer& offer, char* shared, size_t shared_bytes,
                                               int edge_device, uint32_t linger_us) {
  if (offer.memory == "host") return std::unique_ptr<RingMapping>(new HostRingMapping(shared));
  if (offer.memory == "cuda") return MapCudaRing(offer, shared, shared_bytes, edge_device, linger_us);
  return absl::InvalidArgumentError(StrCat("ring memory '", offer.memory.substr(0, 100), "': expected cuda or host"));
}

std::atomic<uint64_t>& PublisherLaunches() {
  static std::atomic<uint64_t> launches{0};
  return launches;
}

}  // namespace vigil::transport::ring
