// The cuda_ipc ring's CUDA backend (ring.h): slots in GPU memory exported with CUDA IPC, signal words
// written by the edge's stream with cuStreamWriteValue64 into the host-mapped control block.
#include <cuda.h>  // CUdeviceptr, CUstream, CU_STREAM_WRITE_VALUE_DEFAULT: types only (no libcuda link)
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>

#include "ring.h"

namespace vigil::transport::ring {
namespace {

Status Cuda(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

using WriteValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

// cuStreamWriteValue64 from the driver, through the runtime's entry-point lookup (the CUDA runtime is
// linked statically and libcuda is the driver's: no link-time dependency). Null when unavailable.
WriteValue64Fn WriteValue64() {
  static WriteValue64Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<WriteValue64Fn>(nullptr);
    }
    return reinterpret_cast<WriteValue64Fn>(p);
  }();
  return fn;
}

std::string BusId(int device) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return id;
}

class CudaRingMemory final : public RingMemory {
 public:
  ~CudaRingMemory() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    // The edge's mapping (cudaIpcOpenMemHandle) keeps the allocation alive until it closes it.
    if (slots_ != nullptr) cudaFree(slots_);
    if (bounce_ != nullptr) cudaFreeHost(bounce_);
  }
  static StatusOr<std::unique_ptr<RingMemory>> Make(int device, size_t bytes) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat("ring on cuda:", device, ": no such GPU (", count, " visible)"));
    }
    auto m = std::unique_ptr<CudaRingMemory>(new CudaRingMemory());
    m->device_ = device;
    m->bytes_ = bytes;
    VIGIL_RETURN_IF_ERROR(Cuda(cudaSetDevice(device), StrCat("ring on cuda:", device, ": cudaSetDevice")));
    VIGIL_RETURN_IF_ERROR(Cuda(cudaMalloc(&m->slots_, bytes), StrCat("ring on cuda:", device, ": cudaMalloc ", bytes)));
    VIGIL_RETURN_IF_ERROR(Cuda(cudaMemset(m->slots_, 0, bytes), "ring: cudaMemset"));
    VIGIL_RETURN_IF_ERROR(Cuda(cudaMallocHost(&m->bounce_, bytes), "ring: cudaMallocHost"));
    VIGIL_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking), "ring: stream"));
    cudaIpcMemHandle_t h{};
    VIGIL_RETURN_IF_ERROR(Cuda(cudaIpcGetMemHandle(&h, m->slots_), "ring: cudaIpcGetMemHandle"));
    m->handle_.assign(reinterpret_cast<const char*>(&h), sizeof h);
    m->bus_id_ = BusId(device);
    return std::unique_ptr<RingMemory>(std::move(m));
  }
  std::string memory() const override { return "cuda"; }
  std::string device() const override { return bus_id_; }
  std::string handle() const override { return handle_; }
  StatusOr<const char*> Read(size_t offset, size_t bytes) override {
    if (offset + bytes > bytes_) return absl::InternalError("ring read beyond its end");
    cudaSetDevice(device_);
    char* dst = static_cast<char*>(bounce_) + offset;
    VIGIL_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(dst, static_cast<char*>(slots_) + offset, bytes,
                                               cudaMemcpyDeviceToHost, stream_),
                               "ring: copy of a slot to the host"));
    VIGIL_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "ring: copy of a slot to the host"));
    return dst;
  }
  Status Poke(size_t offset, std::string_view bytes) override {
    if (offset + bytes.size() > bytes_) return absl::InternalError("ring poke beyond its end");
    cudaSetDevice(device_);
    return Cuda(cudaMemcpy(static_cast<char*>(slots_) + offset, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
                "ring: poke");
  }

 private:
  CudaRingMemory() = default;
  int device_ = 0;
  size_t bytes_ = 0;
  void* slots_ = nullptr;
  void* bounce_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::string handle_, bus_id_;
};

class CudaRingMapping final : public RingMapping {
 public:
  ~CudaRingMapping() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (ring_ != nullptr) cudaIpcCloseMemHandle(ring_);
    if (registered_) cudaHostUnregister(control_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
    cudaGetLastError();  // nothing of a failed teardown may leak into the caller's next CUDA call
  }
  static StatusOr<std::unique_ptr<RingMapping>> Make(const RingOffer& offer, char* control, size_t control_bytes,
                                                     int edge_device) {
    if (offer.handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError(StrCat("ring offer: a CUDA IPC handle of ", offer.handle.size(), " bytes"));
    }
    if (WriteValue64() == nullptr) {
      return absl::UnavailableError("cuda_ipc: the driver has no cuStreamWriteValue64 (stream memory operations)");
    }
    int ring_device = -1;
    if (cudaDeviceGetByPCIBusId(&ring_device, offer.device.c_str()) != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat("cuda_ipc: the ring's GPU ", offer.device.substr(0, 64),
                                           " is not visible to this process (another host, or CUDA_VISIBLE_DEVICES)"));
    }
    auto m = std::unique_ptr<CudaRingMapping>(new CudaRingMapping());
    m->device_ = edge_device >= 0 ? edge_device : ring_device;
    m->control_ = control;
    m->bytes_ = static_cast<size_t>(offer.slots) * offer.slot_bytes;
    const std::string where = StrCat("cuda_ipc (cuda:", m->device_, " → ring on ", offer.device, ")");
    VIGIL_RETURN_IF_ERROR(Cuda(cudaSetDevice(m->device_), StrCat(where, ": cudaSetDevice")));
    if (m->device_ != ring_device) {
      int can = 0;
      cudaDeviceCanAccessPeer(&can, m->device_, ring_device);
      if (!can) return absl::UnavailableError(StrCat(where, ": no peer access between the two GPUs"));
    }
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, offer.handle.data(), sizeof h);
    cudaError_t e = cudaIpcOpenMemHandle(&m->ring_, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      m->ring_ = nullptr;
      return absl::UnavailableError(StrCat(where, ": cudaIpcOpenMemHandle: ", cudaGetErrorName(e),
                                           " (a container needs --ipc=host and a shared PID namespace)"));
    }
    e = cudaHostRegister(control, control_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat(where, ": cudaHostRegister of the control block: ", cudaGetErrorName(e)));
    }
    m->registered_ = true;
    void* dctl = nullptr;
    VIGIL_RETURN_IF_ERROR(Cuda(cudaHostGetDevicePointer(&dctl, control, 0), StrCat(where, ": control block")));
    m->control_dev_ = reinterpret_cast<CUdeviceptr>(dctl);
    VIGIL_RETURN_IF_ERROR(Cuda(cudaMallocHost(&m->staging_, m->bytes_), StrCat(where, ": staging")));
    VIGIL_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking), StrCat(where, ": stream")));
    return std::unique_ptr<RingMapping>(std::move(m));
  }
  char* staging(size_t offset) override { return static_cast<char*>(staging_) + offset; }
  Status Put(size_t offset, size_t bytes) override {
    return Cuda(cudaMemcpyAsync(static_cast<char*>(ring_) + offset, static_cast<char*>(staging_) + offset, bytes,
                                cudaMemcpyHostToDevice, stream_),
                "cuda_ipc: slot copy");
  }
  Status PutDevice(size_t offset, const void* src, size_t bytes, int src_device, void* ready_event) override {
    if (ready_event != nullptr) {
      VIGIL_RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready_event), 0),
                                 "cuda_ipc: wait for the rows"));
    }
    if (src_device == device_ || src_device < 0) {
      return Cuda(cudaMemcpyAsync(static_cast<char*>(ring_) + offset, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                  "cuda_ipc: rows copy");
    }
    return Cuda(cudaMemcpyPeerAsync(static_cast<char*>(ring_) + offset, device_, src, src_device, bytes, stream_),
                "cuda_ipc: rows copy from another GPU");
  }
  bool takes_device_memory() const override { return true; }
  Status Signal(size_t offset, uint64_t value) override {
    const CUresult r = WriteValue64()(reinterpret_cast<CUstream>(stream_), control_dev_ + offset, value,
                                      CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS) return absl::InternalError(StrCat("cuda_ipc: cuStreamWriteValue64 failed (CUresult ", r, ")"));
    return absl::OkStatus();
  }
  Status Drain() override { return Cuda(cudaStreamSynchronize(stream_), "cuda_ipc: drain"); }
  std::string transports() const override { return "cuda_ipc"; }

 private:
  CudaRingMapping() = default;
  int device_ = 0;
  size_t bytes_ = 0;
  char* control_ = nullptr;
  bool registered_ = false;
  CUdeviceptr control_dev_ = 0;
  void* ring_ = nullptr;
  void* staging_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

StatusOr<std::unique_ptr<RingMemory>> AllocateCudaRing(int device, size_t bytes) {
  return CudaRingMemory::Make(device, bytes);
}

StatusOr<std::unique_ptr<RingMapping>> MapCudaRing(const RingOffer& offer, char* control, size_t control_bytes,
                                                   int edge_device) {
  return CudaRingMapping::Make(offer, control, control_bytes, edge_device);
}

}  // namespace vigil::transport::ring
