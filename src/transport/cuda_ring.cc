// The cuda_ipc ring's CUDA backend (ring.h): slots in GPU memory exported with CUDA IPC; on the edge's
// stream a resident publisher kernel (or, with linger 0, one kernel per slot) fills the GPU ring and the
// host mirror and writes the signal word. Also the links' other CUDA calls (device_memory.h).
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>

#include "vigil/common/cuda_status.h"
#include "vigil/transport/device_memory.h"
#include "ring.h"
#include "transport/cuda/ring_kernels.h"

namespace vigil::transport::ring {
namespace {

using cuda::CudaStatus;

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
    // The edge's mapping (cudaIpcOpenMemHandle) keeps the allocation alive until it closes it.
    if (slots_ != nullptr) cudaFree(slots_);
    cudaGetLastError();
  }
  static StatusOr<std::unique_ptr<RingMemory>> Make(int device, size_t bytes) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat("ring on cuda:", device, ": no such GPU (", count, " visible)"));
    }
    auto m = std::unique_ptr<CudaRingMemory>(new CudaRingMemory());
    m->device_ = device;
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), StrCat("ring on cuda:", device, ": cudaSetDevice")));
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&m->slots_, bytes), StrCat("ring on cuda:", device, ": cudaMalloc ", bytes)));
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaMemset(m->slots_, 0, bytes), "ring: cudaMemset"));
    cudaIpcMemHandle_t h{};
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&h, m->slots_), "ring: cudaIpcGetMemHandle"));
    m->handle_.assign(reinterpret_cast<const char*>(&h), sizeof h);
    m->bus_id_ = BusId(device);
    return std::unique_ptr<RingMemory>(std::move(m));
  }
  std::string device() const override { return bus_id_; }
  std::string handle() const override { return handle_; }

 private:
  CudaRingMemory() = default;
  int device_ = 0;
  void* slots_ = nullptr;
  std::string handle_, bus_id_;
};

class CudaRingMapping final : public RingMapping {
 public:
  ~CudaRingMapping() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) {
      (void)Drain();
      cudaStreamDestroy(stream_);
    }
    if (publisher_ != nullptr) cudaFreeHost(publisher_);
    if (ring_ != nullptr) cudaIpcCloseMemHandle(ring_);
    if (registered_) cudaHostUnregister(shared_);
    cudaGetLastError();  // nothing of a failed teardown may leak into the caller's next CUDA call
  }
  static StatusOr<std::unique_ptr<RingMapping>> Make(const RingOffer& offer, char* shared, size_t shared_bytes,
                                                     int edge_device, uint32_t linger_us) {
    if (offer.handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError(StrCat("ring offer: a CUDA IPC handle of ", offer.handle.size(), " bytes"));
    }
    int ring_device = -1;
    if (cudaDeviceGetByPCIBusId(&ring_device, offer.device.c_str()) != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat("cuda_ipc: the ring's GPU ", offer.device.substr(0, 64),
                                           " is not visible to this process (another host, or CUDA_VISIBLE_DEVICES)"));
    }
    auto m = std::unique_ptr<CudaRingMapping>(new CudaRingMapping());
    m->device_ = edge_device >= 0 ? edge_device : ring_device;
    m->shared_ = shared;
    m->mirror_offset_ = MirrorOffset(offer.slots);
    const std::string where = StrCat("cuda_ipc (cuda:", m->device_, " → ring on ", offer.device, ")");
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m->device_), StrCat(where, ": cudaSetDevice")));
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
    e = cudaHostRegister(shared, shared_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat(where, ": cudaHostRegister of the shared block: ", cudaGetErrorName(e)));
    }
    m->registered_ = true;
    void* dev = nullptr;
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&dev, shared, 0), StrCat(where, ": shared block")));
    m->shared_dev_ = static_cast<char*>(dev);
    // The highest priority: under inference load the publisher's block is scheduled before the engine's.
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithPriority(&m->stream_, cudaStreamNonBlocking, greatest),
                                     StrCat(where, ": stream")));
    if (linger_us > 0) {
      m->capacity_ = offer.slots;  // RingWriter never has more slots outstanding than the ring holds
      m->linger_ns_ = uint64_t{linger_us} * 1000;
      const size_t bytes = sizeof(PublisherControl) + size_t{m->capacity_} * sizeof(PublishJob);
      void* block = nullptr;
      VIGIL_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&block, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                                       StrCat(where, ": the publisher's control block")));
      m->publisher_ = static_cast<char*>(block);
      std::memset(m->publisher_, 0, bytes);
      void* p = nullptr;
      VIGIL_RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&p, m->publisher_, 0), StrCat(where, ": publisher")));
      m->publisher_dev_ = static_cast<char*>(p);
      m->slots_ = offer.slots;
      m->slot_bytes_ = offer.slot_bytes;
      auto* words = reinterpret_cast<unsigned long long*>(m->shared_dev_);
      m->layout_ = PublisherLayout{static_cast<char*>(m->ring_), m->shared_dev_ + m->mirror_offset_,
                                   words + kSignalsOffset / 8, words + offsetof(ControlHeader, ring_ready) / 8,
                                   offer.slots, offer.slot_bytes};
    }
    return std::unique_ptr<RingMapping>(std::move(m));
  }
  Status Publish(uint64_t seq, size_t offset, size_t host_bytes, const void* rows, size_t rows_offset,
                 size_t row_bytes, void* ready_event, size_t signal_offset, uint64_t value) override {
    const bool cpu_signal = rows == nullptr || row_bytes == 0;
    if (cpu_signal) {
      // The mirror holds the whole slot: the consumer may take it now; the GPU ring's copy follows.
      Word(shared_, signal_offset).store(value, std::memory_order_release);
    } else if (ready_event != nullptr) {
      VIGIL_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready_event), 0),
                                 "cuda_ipc: wait for the rows"));
    }
    // The CPU's stores into the mirror happen before the launch (the kernel reads them).
    std::atomic_thread_fence(std::memory_order_release);
    auto* words = reinterpret_cast<unsigned long long*>(shared_dev_);
    if (publisher_ != nullptr) {
      // The publisher derives the slot's places from seq (one job per slot, in order) and puts the rows right
      // after the host part, as RingWriter lays a slot out.
      if (seq != posted_ || offset != (seq % slots_) * slot_bytes_ || signal_offset != SignalOffset(seq, slots_) ||
          (!cpu_signal && rows_offset != RoundUp8(host_bytes)) || host_bytes >= (size_t{1} << 27) ||
          row_bytes >= (size_t{1} << 27) || reinterpret_cast<uintptr_t>(rows) > kJobAddressMask) {
        return absl::InternalError(StrCat("cuda_ipc: slot ", seq, " does not fit the resident publisher's layout"));
      }
      const unsigned long long tag = JobTag(posted_, capacity_) << 48;
      const unsigned long long sizes = (RoundUp8(host_bytes) / 8) | (row_bytes / 8) << 24;
      return Post(value, (cpu_signal ? 0 : reinterpret_cast<uintptr_t>(rows)) | tag, sizes | tag,
                  cpu_signal ? nullptr : ready_event);
    }
    return CudaStatus(LaunchPublishSlot(static_cast<char*>(ring_) + offset, shared_dev_ + mirror_offset_ + offset,
                                  RoundUp8(host_bytes), static_cast<const char*>(rows), rows_offset, row_bytes,
                                  cpu_signal ? nullptr : words + signal_offset / 8, value,
                                  words + offsetof(ControlHeader, ring_ready) / 8, seq + 1, stream_),
                "cuda_ipc: publish kernel");
  }
  bool takes_device_rows(int device) const override { return device == device_; }
  Status Drain() override {
    if (publisher_ == nullptr) return CudaStatus(cudaStreamSynchronize(stream_), "cuda_ipc: drain");
    Ref(control()->stop).store(1, std::memory_order_seq_cst);  // the publisher leaves once every job is done
    Status st = CudaStatus(cudaStreamSynchronize(stream_), "cuda_ipc: drain");
    Ref(control()->stop).store(0, std::memory_order_seq_cst);  // every launch left (state: exited): the next
    return st;                                                  // Post launches again
  }
  std::string transports() const override { return "cuda_ipc"; }

 private:
  CudaRingMapping() = default;
  static std::atomic_ref<unsigned long long> Ref(unsigned long long& w) { return std::atomic_ref<unsigned long long>(w); }
  PublisherControl* control() const { return reinterpret_cast<PublisherControl*>(publisher_); }
  PublishJob* jobs() const { return reinterpret_cast<PublishJob*>(publisher_ + sizeof(PublisherControl)); }

  // Hands the next job to the resident publisher (its words as ring_kernels.h's PublishJob, tags included),
  // launching one when the last has left (ring_kernels.h).
  Status Post(unsigned long long value, unsigned long long rows, unsigned long long sizes, void* ready_event) {
    if (ready_event != nullptr) {
      // The resident kernel cannot wait for an event: the rows must be complete before the job is posted.
      // (The edge's rows are: its host copy was read after the same batch's synchronisation.)
      auto* ev = static_cast<cudaEvent_t>(ready_event);
      if (cudaEventQuery(ev) != cudaSuccess) {
        cudaGetLastError();
        VIGIL_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(ev), "cuda_ipc: wait for the rows"));
      }
    }
    PublisherControl* c = control();
    // Never more outstanding jobs than slots (RingWriter's flow control): no wait here in practice. A
    // publisher that stopped (a CUDA error ended it) is not waited for forever.
    for (int spins = 0; posted_ - Ref(c->done).load(std::memory_order_acquire) >= capacity_; ++spins) {
      if (spins >= 100000) {
        const cudaError_t q = cudaStreamQuery(stream_);
        if (q != cudaErrorNotReady) {
          cudaGetLastError();
          return absl::UnavailableError(StrCat("cuda_ipc: the publisher kernel left with every job slot in use (",
                                               q == cudaSuccess ? "its stream idle" : cudaGetErrorName(q), ")"));
        }
      }
      std::this_thread::yield();
    }
    PublishJob& j = jobs()[posted_ % capacity_];
    Ref(j.rows).store(rows, std::memory_order_relaxed);
    Ref(j.sizes).store(sizes, std::memory_order_relaxed);
    Ref(j.value).store(value, std::memory_order_release);  // last: with the mirror's host part before it
    Ref(c->posted).store(++posted_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // Dekker: our `posted` before reading its `state`
    if (Ref(c->state).load(std::memory_order_acquire) == generation_ << 1) {
      ++generation_;
      auto* dev = reinterpret_cast<PublisherControl*>(publisher_dev_);
      VIGIL_RETURN_IF_ERROR(CudaStatus(LaunchPublisher(dev, reinterpret_cast<const PublishJob*>(dev + 1), capacity_,
                                                       layout_, generation_, linger_ns_, stream_),
                                       "cuda_ipc: publisher kernel"));
      PublisherLaunches().fetch_add(1, std::memory_order_relaxed);
    }
    return absl::OkStatus();
  }

  int device_ = 0;
  char* shared_ = nullptr;
  char* shared_dev_ = nullptr;
  size_t mirror_offset_ = 0;
  bool registered_ = false;
  void* ring_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // The resident publisher (linger_us > 0): control block and jobs in pinned host memory.
  char* publisher_ = nullptr;
  char* publisher_dev_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t linger_ns_ = 0;
  PublisherLayout layout_{};
  uint64_t slots_ = 0, slot_bytes_ = 0;
  uint64_t posted_ = 0;      // jobs posted (the host's copy of control()->posted)
  uint64_t generation_ = 0;  // launches made
};

}  // namespace

StatusOr<std::unique_ptr<RingMemory>> AllocateCudaRing(int device, size_t bytes) {
  return CudaRingMemory::Make(device, bytes);
}

StatusOr<std::unique_ptr<RingMapping>> MapCudaRing(const RingOffer& offer, char* shared, size_t shared_bytes,
                                                   int edge_device, uint32_t linger_us) {
  return CudaRingMapping::Make(offer, shared, shared_bytes, edge_device, linger_us);
}

}  // namespace vigil::transport::ring

namespace vigil::transport::device_memory {
namespace {

// cudaMalloc'd (Allocate) or from the stream-ordered pool (AllocatePooled: freed with cudaFreeAsync, no
// device-wide synchronisation).
class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(int device, void* data, size_t bytes, bool pooled)
      : device_(device), data_(data), bytes_(bytes), pooled_(pooled) {}
  ~CudaBuffer() override {
    cudaSetDevice(device_);
    if (pooled_) {
      cudaFreeAsync(data_, cudaStreamPerThread);
    } else {
      cudaFree(data_);
    }
    cudaGetLastError();
  }
  void* data() const override { return data_; }
  size_t size() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  int device_;
  void* data_;
  size_t bytes_;
  bool pooled_;
};

class CudaIpcMemory final : public IpcMemory {
 public:
  CudaIpcMemory(int device, void* data) : device_(device), data_(data) {}
  ~CudaIpcMemory() override {
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(data_);
    cudaGetLastError();
  }
  void* data() const override { return data_; }

 private:
  int device_;
  void* data_;
};

class CudaExportedMemory final : public ExportedMemory {
 public:
  CudaExportedMemory(int device, void* data, size_t bytes, std::string handle)
      : device_(device), data_(data), bytes_(bytes), handle_(std::move(handle)) {}
  ~CudaExportedMemory() override {
    cudaSetDevice(device_);
    cudaFree(data_);
    cudaGetLastError();
  }
  void* data() const override { return data_; }
  size_t size() const override { return bytes_; }
  int device() const override { return device_; }
  std::string handle() const override { return handle_; }

 private:
  int device_;
  void* data_;
  size_t bytes_;
  std::string handle_;
};

}  // namespace

StatusOr<std::unique_ptr<Buffer>> AllocatePooled(int device, size_t bytes) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  // The default pool returns freed memory to the device at every synchronisation unless told to keep it:
  // pictures allocated and freed at 30 FPS per camera would map and unmap memory continuously. Once per device
  // (a bit each: no lock on this per-picture path).
  static std::atomic<uint64_t> raised{0};
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (raised.load(std::memory_order_relaxed) & bit) == 0 && (raised.fetch_or(bit) & bit) == 0) {
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();  // an older driver without the attribute: the pool works, only less well
  }
  void* p = nullptr;
  VIGIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaMallocAsync(&p, bytes, cudaStreamPerThread),
                                         StrCat("cudaMallocAsync ", bytes, " bytes on cuda:", device)));
  return std::unique_ptr<Buffer>(new CudaBuffer(device, p, bytes, /*pooled=*/true));
}

Status Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, int device) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  VIGIL_RETURN_IF_ERROR(cuda::CudaStatus(
      cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, cudaStreamPerThread), "cudaMemcpy2DAsync"));
  return cuda::CudaStatus(cudaStreamSynchronize(cudaStreamPerThread), "cudaMemcpy2DAsync (synchronize)");
}

Status CopyAsync(void* dst, const void* src, size_t bytes, int device) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  return cuda::CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread), "cudaMemcpyAsync");
}

Status SynchronizeThread(int device) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  return cuda::CudaStatus(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize (the copies queued)");
}

int DeviceOfBusId(const std::string& bus_id) {
  int d = -1;
  if (bus_id.empty() || cudaDeviceGetByPCIBusId(&d, bus_id.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

std::string BusIdOf(int device) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return id;
}

StatusOr<std::unique_ptr<IpcMemory>> OpenIpc(const std::string& handle, int device) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(StrCat("a CUDA IPC handle of ", handle.size(), " bytes"));
  }
  VIGIL_RETURN_IF_ERROR(Use(device));
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, handle.data(), sizeof h);
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(StrCat("cudaIpcOpenMemHandle on cuda:", device, ": ", cudaGetErrorName(e),
                                         " (a container needs --ipc=host and a shared PID namespace)"));
  }
  return std::unique_ptr<IpcMemory>(new CudaIpcMemory(device, p));
}

StatusOr<std::unique_ptr<ExportedMemory>> AllocateExported(int device, size_t bytes) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  void* p = nullptr;
  VIGIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaMalloc(&p, bytes), StrCat("cudaMalloc ", bytes, " bytes on cuda:", device)));
  cudaIpcMemHandle_t h{};
  if (Status st = cuda::CudaStatus(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle"); !st.ok()) {
    cudaFree(p);
    return st;
  }
  return std::unique_ptr<ExportedMemory>(
      new CudaExportedMemory(device, p, bytes, std::string(reinterpret_cast<const char*>(&h), sizeof h)));
}

bool Available() { return true; }

int VisibleDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

Status Use(int device) {
  return cuda::CudaStatus(cudaSetDevice(device), StrCat("cudaSetDevice(", device, ")"));
}

Status WaitReady(void* event) {
  if (event == nullptr) return absl::OkStatus();
  return cuda::CudaStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "waiting for device rows");
}

StatusOr<std::unique_ptr<Buffer>> Allocate(int device, size_t bytes) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  void* p = nullptr;
  VIGIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaMalloc(&p, bytes), StrCat("cudaMalloc ", bytes, " bytes on cuda:", device)));
  return std::unique_ptr<Buffer>(new CudaBuffer(device, p, bytes, /*pooled=*/false));
}

Status CopyToHost(void* dst, const void* src, size_t bytes, int device) {
  VIGIL_RETURN_IF_ERROR(Use(device));
  return cuda::CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copying device rows to the host");
}

}  // namespace vigil::transport::device_memory
