// The cuda_ipc ring (ring.h): shared memory, the host-memory backend, backend dispatch.
#include "ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "vigil/transport/auth.h"

namespace vigil::transport::ring {
namespace {

std::string RandomName(std::string_view what) {
  const Nonce n = RandomNonce();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (int i = 0; i < 12; ++i) {
    hex += kHex[n[i] >> 4];
    hex += kHex[n[i] & 15];
  }
  return StrCat("/vigil-", hex, "-", what);
}

class HostRingMemory final : public RingMemory {
 public:
  explicit HostRingMemory(std::unique_ptr<SharedMemory> shm) : shm_(std::move(shm)), copy_(shm_->size()) {}
  std::string memory() const override { return "host"; }
  std::string device() const override { return ""; }
  std::string handle() const override { return shm_->name(); }
  StatusOr<const char*> Read(size_t offset, size_t bytes) override {
    if (offset + bytes > shm_->size()) return absl::InternalError("ring read beyond its end");
    std::memcpy(copy_.data() + offset, shm_->data() + offset, bytes);  // validated on this copy only
    return copy_.data() + offset;
  }
  Status Poke(size_t offset, std::string_view bytes) override {
    if (offset + bytes.size() > shm_->size()) return absl::InternalError("ring poke beyond its end");
    std::memcpy(shm_->data() + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  void Unlink() override { shm_->Unlink(); }

 private:
  std::unique_ptr<SharedMemory> shm_;
  std::vector<char> copy_;
};

class HostRingMapping final : public RingMapping {
 public:
  HostRingMapping(std::unique_ptr<SharedMemory> slots, char* control)
      : slots_(std::move(slots)), control_(control), staging_(slots_->size()) {}
  char* staging(size_t offset) override { return staging_.data() + offset; }
  Status Put(size_t offset, size_t bytes) override {
    std::memcpy(slots_->data() + offset, staging_.data() + offset, bytes);
    return absl::OkStatus();
  }
  Status PutDevice(size_t, const void*, size_t, int, void*) override {
    return absl::UnimplementedError("a host-memory ring takes no device memory");
  }
  bool takes_device_memory() const override { return false; }
  Status Signal(size_t offset, uint64_t value) override {
    Word(control_, offset).store(value, std::memory_order_release);  // after the slot's bytes
    return absl::OkStatus();
  }
  Status Drain() override { return absl::OkStatus(); }
  std::string transports() const override { return "shm"; }

 private:
  std::unique_ptr<SharedMemory> slots_;
  char* control_;
  std::vector<char> staging_;
};

}  // namespace

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(std::string_view what, size_t bytes) {
  const std::string name = RandomName(what);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(StrCat("shared memory ", name, ": shm_open: ", std::strerror(errno)));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::UnavailableError(StrCat("shared memory ", name, ": ", bytes, " bytes: ", std::strerror(err)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return absl::UnavailableError(StrCat("shared memory ", name, ": mmap: ", std::strerror(err)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, static_cast<char*>(p), bytes, true));
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& name, size_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200) {
    return absl::InvalidArgumentError(StrCat("shared memory name '", name.substr(0, 200), "' is not /NAME"));
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(StrCat("shared memory ", name, ": shm_open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat("shared memory ", name, ": smaller than the ", bytes, " bytes offered"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return absl::UnavailableError(StrCat("shared memory ", name, ": mmap: ", std::strerror(err)));
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, static_cast<char*>(p), bytes, false));
}

SharedMemory::~SharedMemory() {
  Unlink();
  ::munmap(data_, bytes_);
}

void SharedMemory::Unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

StatusOr<std::unique_ptr<RingMemory>> AllocateRing(const std::string& device, size_t bytes) {
  if (device == "host") {
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> shm, SharedMemory::Create("slots", bytes));
    return std::unique_ptr<RingMemory>(new HostRingMemory(std::move(shm)));
  }
  if (device.rfind("cuda:", 0) == 0) {
    const std::string n = device.substr(5);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
      return absl::InvalidArgumentError(StrCat("ring device '", device, "': expected host or cuda:N"));
    }
    return AllocateCudaRing(std::stoi(n), bytes);
  }
  return absl::InvalidArgumentError(StrCat("ring device '", device, "': expected host or cuda:N"));
}

StatusOr<std::unique_ptr<RingMapping>> MapRing(const RingOffer& offer, char* control, size_t control_bytes,
                                               int edge_device) {
  const size_t bytes = static_cast<size_t>(offer.slots) * offer.slot_bytes;
  if (offer.memory == "host") {
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> slots, SharedMemory::Open(offer.handle, bytes));
    return std::unique_ptr<RingMapping>(new HostRingMapping(std::move(slots), control));
  }
  if (offer.memory == "cuda") return MapCudaRing(offer, control, control_bytes, edge_device);
  return absl::InvalidArgumentError(StrCat("ring memory '", offer.memory.substr(0, 100), "': expected cuda or host"));
}

}  // namespace vigil::transport::ring
