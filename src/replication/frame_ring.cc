// The hot standby's same-host picture ring (replication/frame_ring.h).
#include "vigil/common/deadline.h"
#include "vigil/replication/frame_ring.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <thread>

#include "vigil/common/mutex.h"
#include "vigil/transport/device_memory.h"
#include "vigil/transport/shared_memory.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/unix_socket.h"

namespace vigil::replication {
namespace {

using std::chrono::milliseconds;
using transport::SharedMemory;

constexpr uint64_t kRingMagic = 0x314d524652474956ull;  // "VIGRFRM1"
constexpr uint32_t kSlotMagic = 0x5446524d;              // "MRFT"
constexpr uint32_t kFormatBgr24 = 1, kFormatNv12 = 2;
constexpr uint32_t kMemoryHost = 0, kMemoryCuda = 1;
constexpr size_t kGpuHostSlot = 4096;  // a ring in GPU memory: the host slots hold only the headers
constexpr uint32_t kHelloMagic = 0x52464756;              // "VGFR"
constexpr uint32_t kVersion = 1;
constexpr size_t kSignals = 256;                          // the signal words' offset in the control block
constexpr size_t kMaxStream = 128;
constexpr uint32_t kMaxSide = 16384;

struct Control {
  uint64_t magic;
  uint32_t slots, memory;  // memory: kMemoryHost, or kMemoryCuda (pixels in the GPU slots)
  uint64_t slot_bytes;     // host slots
  uint64_t gpu_slot_bytes;  // GPU slots (memory cuda)
  alignas(64) uint64_t consumed;  // slots released by the standby (a count)
  alignas(64) uint64_t closed;    // 1: the standby is gone; the primary stops writing
};
static_assert(sizeof(Control) <= kSignals);

struct FrameSlot {
  uint32_t magic, format;
  uint64_t ring_seq;  // the slot's sequence number in the ring (a stale slot has another)
  uint64_t run, seq;
  int64_t capture_ns, pts_ns;
  uint32_t width, height, stride, stream_len;
  uint64_t bytes;
  uint32_t matrix, full_range;  // NV12: video::YuvMatrix, 1 = full range
  char stream[kMaxStream];
};
constexpr size_t kSlotHeader = (sizeof(FrameSlot) + 63) & ~size_t{63};

size_t SlotsOffset(uint32_t slots) { return (kSignals + 8 * size_t{slots} + 4095) & ~size_t{4095}; }
size_t RingBytes(uint32_t slots, size_t slot_bytes) { return SlotsOffset(slots) + size_t{slots} * slot_bytes; }
std::atomic_ref<uint64_t> Word(char* base, size_t offset) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + offset));
}
size_t SignalOf(uint64_t seq, uint32_t slots) { return kSignals + 8 * (seq % slots); }

bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Reads exactly n bytes before `deadline`.
Status ReadExactly(transport::Connection& c, char* out, size_t n, Deadline deadline) {
  size_t got = 0;
  while (got < n) {
    if (deadline.passed()) return absl::DeadlineExceededError("timed out");
    const auto left = std::chrono::ceil<milliseconds>(deadline.left());
    VIGIL_ASSIGN_OR_RETURN(size_t k, c.Read(out + got, n - got, left));
    got += k;
  }
  return absl::OkStatus();
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The standby's hello: magic, version, token, slots, slot_bytes, memory, gpu_slot_bytes, the lengths of the
// shared-memory name, the GPU's PCI bus id and its IPC handle; then those three.
struct Hello {
  std::string token;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  uint32_t memory = kMemoryHost;
  uint64_t gpu_slot_bytes = 0;
  std::string name, bus_id, handle;
};
constexpr size_t kHelloFixed = 4 + 4 + kFrameTokenBytes + 4 + 8 + 4 + 8 + 2 + 2 + 2;

class Publisher final : public FramePublisher {
 public:
  Publisher(std::unique_ptr<transport::UnixListener> listener, std::string socket)
      : listener_(std::move(listener)), socket_(std::move(socket)) {
    thread_ = std::thread([this] { Serve(); });
  }
  ~Publisher() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  const std::string& socket() const override { return socket_; }

  std::string NewToken() override {
    std::string t;
    while (t.size() < kFrameTokenBytes) {
      const transport::Nonce n = transport::RandomNonce();
      t.append(reinterpret_cast<const char*>(n.data()), std::min(n.size(), kFrameTokenBytes - t.size()));
    }
    MutexLock lock(mu_);
    token_ = t;
    EndSession("a new standby pairs");
    return t;
  }

  bool active() const override {
    MutexLock lock(mu_);
    return ring_ != nullptr;
  }

  Status Write(const MirroredFrame& f, const uint8_t* bgr, size_t stride) override {
    MutexLock lock(mu_);
    VIGIL_RETURN_IF_ERROR(Usable());
    const size_t bytes = size_t{f.height} * stride;
    if (f.stream.size() > kMaxStream || f.width == 0 || f.height == 0 || f.width > kMaxSide || f.height > kMaxSide ||
        stride < size_t{f.width} * 3 || stride > size_t{kMaxSide} * 4 ||
        (gpu_ ? bytes > gpu_slot_bytes_ : kSlotHeader + bytes > slot_bytes_)) {
      ++stats_.too_large;
      return absl::InvalidArgumentError(StrCat("frame ring: picture ", f.width, "x", f.height, " (stream '",
                                               f.stream.substr(0, 64), "') does not fit a slot of ",
                                               gpu_ ? gpu_slot_bytes_ : slot_bytes_, " bytes"));
    }
    VIGIL_RETURN_IF_ERROR(HaveFreeSlot());
    if (gpu_) {  // uploaded as it is (a picture decoded on the CPU)
      Status st = transport::device_memory::Copy2D(GpuSlot(), stride, bgr, stride, stride, f.height, gpu_device_);
      if (!st.ok()) return Lost(st);
    }
    return Commit(f, kFormatBgr24, static_cast<uint32_t>(stride), bytes, 0, false, gpu_ ? nullptr : bgr);
  }

  Status WriteDevice(const MirroredFrame& f, const FramePublisher::DevicePicture& p) override {
    MutexLock lock(mu_);
    VIGIL_RETURN_IF_ERROR(Usable());
    if (!gpu_) return absl::FailedPreconditionError("frame ring: the standby's ring is in host memory");
    const size_t bytes = PackedNv12Bytes(f.width, f.height);
    const size_t uv_row = 2 * size_t{(f.width + 1) / 2};
    if (f.stream.size() > kMaxStream || f.width == 0 || f.height == 0 || f.width > kMaxSide || f.height > kMaxSide ||
        p.y_pitch < f.width || p.uv_pitch < uv_row || bytes > gpu_slot_bytes_) {
      ++stats_.too_large;
      return absl::InvalidArgumentError(StrCat("frame ring: NV12 picture ", f.width, "x", f.height, " (stream '",
                                               f.stream.substr(0, 64), "') does not fit a GPU slot of ",
                                               gpu_slot_bytes_, " bytes"));
    }
    VIGIL_RETURN_IF_ERROR(HaveFreeSlot());
    auto* dst = static_cast<uint8_t*>(GpuSlot());
    Status st = transport::device_memory::Copy2D(dst, f.width, p.y, p.y_pitch, f.width, f.height, p.device);
    if (st.ok()) {
      st = transport::device_memory::Copy2D(dst + size_t{f.width} * f.height, uv_row, p.uv, p.uv_pitch, uv_row,
                                            (f.height + 1) / 2, p.device);
    }
    if (!st.ok()) return Lost(st);
    return Commit(f, kFormatNv12, f.width, bytes, static_cast<uint32_t>(p.matrix), p.full_range, nullptr);
  }

  bool in_gpu_memory() const override {
    MutexLock lock(mu_);
    return gpu_ != nullptr;
  }

  size_t slot_capacity() const override {
    MutexLock lock(mu_);
    if (ring_ == nullptr) return 0;
    return gpu_ ? gpu_slot_bytes_ : slot_bytes_ - kSlotHeader;
  }

 private:
  // The helpers below REQUIRE mu_.
  Status Usable() VIGIL_REQUIRES(mu_) {
    if (ring_ == nullptr) return absl::UnavailableError("frame ring: no standby ring mapped");
    if (Word(ring_->data(), offsetof(Control, closed)).load(std::memory_order_acquire) != 0) {
      EndSession("the standby closed its ring");
      return absl::UnavailableError("frame ring: the standby closed its ring");
    }
    return absl::OkStatus();
  }
  Status HaveFreeSlot() VIGIL_REQUIRES(mu_) {
    const uint64_t consumed = Word(ring_->data(), offsetof(Control, consumed)).load(std::memory_order_acquire);
    if (next_ - consumed >= slots_) {
      ++stats_.ring_full;
      return absl::ResourceExhaustedError(StrCat("frame ring: all ", slots_, " slots unread (the standby is behind)"));
    }
    return absl::OkStatus();
  }
  void* GpuSlot() const VIGIL_REQUIRES(mu_) { return static_cast<char*>(gpu_->data()) + (next_ % slots_) * gpu_slot_bytes_; }
  Status Lost(const Status& st) VIGIL_REQUIRES(mu_) {  // a CUDA error: the session is not trusted any more
    const std::string why = StrCat("frame ring: copy into the standby's GPU ring: ", st.message());
    EndSession(why.c_str());
    return absl::UnavailableError(why);
  }
  // The slot's header (and, host memory, its pixels from `host_pixels`), then its signal.
  Status Commit(const MirroredFrame& f, uint32_t format, uint32_t stride, size_t bytes, uint32_t matrix,
                bool full_range, const uint8_t* host_pixels) VIGIL_REQUIRES(mu_) {
    char* base = ring_->data();
    char* slot = base + SlotsOffset(slots_) + (next_ % slots_) * slot_bytes_;
    FrameSlot h{};
    h.magic = kSlotMagic;
    h.format = format;
    h.ring_seq = next_;
    h.run = f.run;
    h.seq = f.seq;
    h.capture_ns = f.capture_ns;
    h.pts_ns = f.pts_ns;
    h.width = f.width;
    h.height = f.height;
    h.stride = stride;
    h.stream_len = static_cast<uint32_t>(f.stream.size());
    h.bytes = bytes;
    h.matrix = matrix;
    h.full_range = full_range ? 1 : 0;
    std::memcpy(h.stream, f.stream.data(), f.stream.size());
    std::memcpy(slot, &h, sizeof h);
    if (host_pixels != nullptr) std::memcpy(slot + kSlotHeader, host_pixels, bytes);
    if (corrupt_next_ > 0) {
      --corrupt_next_;
      reinterpret_cast<FrameSlot*>(slot)->stride = 1;  // the test hook: a header that fails its check
    }
    Word(base, SignalOf(next_, slots_)).store(next_ + 1, std::memory_order_release);
    ++next_;
    ++stats_.written;
    stats_.bytes += bytes;
    return absl::OkStatus();
  }


 public:
  FramePublisherStats stats() const override {
    MutexLock lock(mu_);
    FramePublisherStats s = stats_;
    s.active = ring_ != nullptr;
    return s;
  }

  void CorruptNextSlotsForTesting(int n) override {
    MutexLock lock(mu_);
    corrupt_next_ = n;
  }

 private:
  void EndSession(const char* why) VIGIL_REQUIRES(mu_) {
    if (ring_ == nullptr) return;
    spdlog::info("frame ring {}: session ends: {}", socket_, why);
    ring_.reset();
    gpu_.reset();
    if (conn_) conn_->Shutdown();
    conn_.reset();
  }

  void Refuse(transport::Connection& c, const std::string& why) {
    {
      MutexLock lock(mu_);
      ++stats_.refused;
      stats_.last_refusal = why;
    }
    spdlog::warn("frame ring {}: {} refused: {}", socket_, c.peer(), why);
    std::string reply;
    Put<uint8_t>(&reply, 1);
    const std::string text = why.substr(0, 1000);
    Put<uint16_t>(&reply, static_cast<uint16_t>(text.size()));
    reply += text;
    (void)c.Write(reply, milliseconds(200));
  }

  // One connection: the hello, the token, the ring; the session on success.
  void Admit(std::unique_ptr<transport::Connection> c) {
    const auto deadline = Deadline::After(milliseconds(2000));
    char fixed[kHelloFixed];
    if (Status st = ReadExactly(*c, fixed, sizeof fixed, deadline); !st.ok()) {
      Refuse(*c, StrCat("no hello: ", st.message()));
      return;
    }
    Hello h;
    uint32_t magic = 0, version = 0;
    uint16_t name_len = 0;
    const char* p = fixed;
    std::memcpy(&magic, p, 4);
    std::memcpy(&version, p + 4, 4);
    h.token.assign(p + 8, kFrameTokenBytes);
    std::memcpy(&h.slots, p + 8 + kFrameTokenBytes, 4);
    std::memcpy(&h.slot_bytes, p + 12 + kFrameTokenBytes, 8);
    uint16_t bus_len = 0, handle_len = 0;
    std::memcpy(&h.memory, p + 20 + kFrameTokenBytes, 4);
    std::memcpy(&h.gpu_slot_bytes, p + 24 + kFrameTokenBytes, 8);
    std::memcpy(&name_len, p + 32 + kFrameTokenBytes, 2);
    std::memcpy(&bus_len, p + 34 + kFrameTokenBytes, 2);
    std::memcpy(&handle_len, p + 36 + kFrameTokenBytes, 2);
    if (magic != kHelloMagic || version != kVersion) {
      Refuse(*c, "not a frame-ring hello (or another version)");
      return;
    }
    std::string expected;
    {
      MutexLock lock(mu_);
      expected = token_;
    }
    if (!SameToken(h.token, expected)) {  // before anything else of the peer's is looked at
      Refuse(*c, "wrong token (only the standby paired over the replication channel may map a ring)");
      return;
    }
    if (name_len == 0 || name_len > 200 || bus_len > 64 || handle_len > 256) {
      Refuse(*c, "bad shared-memory name, bus id or handle length");
      return;
    }
    h.name.resize(name_len);
    h.bus_id.resize(bus_len);
    h.handle.resize(handle_len);
    for (std::string* part : {&h.name, &h.bus_id, &h.handle}) {
      if (Status st = ReadExactly(*c, part->data(), part->size(), deadline); !st.ok()) {
        Refuse(*c, StrCat("a short hello: ", st.message()));
        return;
      }
    }
    const bool cuda = h.memory == kMemoryCuda;
    if (h.slots < 2 || h.slots > 4096 || (h.memory != kMemoryHost && !cuda) ||
        (cuda ? h.slot_bytes != kGpuHostSlot || h.gpu_slot_bytes < (64u << 10) ||
                    h.gpu_slot_bytes > (size_t{1} << 30) || h.gpu_slot_bytes % 8 != 0
              : h.slot_bytes < (64u << 10) || h.slot_bytes > (size_t{1} << 30) || h.slot_bytes % 8 != 0)) {
      Refuse(*c, StrCat(h.slots, " slots of ", cuda ? h.gpu_slot_bytes : h.slot_bytes, " bytes (memory ", h.memory,
                        ") is outside the limits"));
      return;
    }
    StatusOr<std::unique_ptr<SharedMemory>> ring = SharedMemory::Open(h.name, RingBytes(h.slots, h.slot_bytes));
    if (!ring.ok()) {
      Refuse(*c, std::string(ring.status().message()));
      return;
    }
    const auto* ctl = reinterpret_cast<const Control*>((*ring)->data());
    if (Word((*ring)->data(), 0).load(std::memory_order_acquire) != kRingMagic || ctl->slots != h.slots ||
        ctl->slot_bytes != h.slot_bytes || ctl->memory != h.memory || ctl->gpu_slot_bytes != h.gpu_slot_bytes) {
      Refuse(*c, "the ring's control block does not match the hello");
      return;
    }
    std::unique_ptr<transport::device_memory::IpcMemory> gpu;
    int gpu_device = -1;
    if (cuda) {
      gpu_device = transport::device_memory::DeviceOfBusId(h.bus_id);
      if (gpu_device < 0) {
        Refuse(*c, StrCat("the ring's GPU ", h.bus_id, " is not visible to the primary (CUDA_VISIBLE_DEVICES, or a build "
                          "without CUDA)"));
        return;
      }
      StatusOr<std::unique_ptr<transport::device_memory::IpcMemory>> opened =
          transport::device_memory::OpenIpc(h.handle, gpu_device);
      if (!opened.ok()) {
        Refuse(*c, std::string(opened.status().message()));
        return;
      }
      gpu = std::move(*opened);
    }
    std::string ok;
    Put<uint8_t>(&ok, 0);
    Put<uint16_t>(&ok, 0);
    MutexLock lock(mu_);
    if (!SameToken(h.token, token_)) return;  // a new pairing came meanwhile
    EndSession("another ring mapped");
    if (!c->Write(ok, milliseconds(1000)).ok()) return;
    ring_ = std::move(*ring);
    gpu_ = std::move(gpu);
    gpu_device_ = gpu_device;
    gpu_slot_bytes_ = h.gpu_slot_bytes;
    conn_ = std::move(c);
    slots_ = h.slots;
    slot_bytes_ = h.slot_bytes;
    next_ = Word(ring_->data(), offsetof(Control, consumed)).load(std::memory_order_acquire);
    ++stats_.sessions;
    spdlog::info("frame ring {}: mapped the standby's ring {} ({} slots of {} KiB in {}) for {}", socket_, h.name,
                 slots_, (cuda ? gpu_slot_bytes_ : slot_bytes_) >> 10,
                 cuda ? StrCat("GPU memory on ", h.bus_id) : std::string("host memory"), conn_->peer());
  }

  void Serve() {
    while (!stop_.load()) {
      StatusOr<std::unique_ptr<transport::Connection>> c = listener_->Accept(milliseconds(50));
      if (c.ok()) {
        Admit(std::move(*c));
      } else if (absl::IsPermissionDenied(c.status())) {
        MutexLock lock(mu_);
        ++stats_.refused;
        stats_.last_refusal = std::string(c.status().message());
      }
      // The session's socket: the standby's process gone shows as its end.
      MutexLock lock(mu_);
      if (conn_) {
        char b;
        StatusOr<size_t> n = conn_->Read(&b, 1, milliseconds(0));
        if (!n.ok() && !absl::IsDeadlineExceeded(n.status())) EndSession("the standby's socket closed");
      }
    }
    MutexLock lock(mu_);
    EndSession("stopping");
  }

  std::unique_ptr<transport::UnixListener> listener_;
  const std::string socket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable Mutex mu_;
  std::string token_ VIGIL_GUARDED_BY(mu_);
  std::unique_ptr<SharedMemory> ring_ VIGIL_GUARDED_BY(mu_);
  std::unique_ptr<transport::device_memory::IpcMemory> gpu_ VIGIL_GUARDED_BY(mu_);  // the GPU slots (memory cuda)
  int gpu_device_ VIGIL_GUARDED_BY(mu_) = -1;
  size_t gpu_slot_bytes_ VIGIL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<transport::Connection> conn_ VIGIL_GUARDED_BY(mu_);
  uint32_t slots_ VIGIL_GUARDED_BY(mu_) = 0;
  size_t slot_bytes_ VIGIL_GUARDED_BY(mu_) = 0;
  uint64_t next_ VIGIL_GUARDED_BY(mu_) = 0;
  int corrupt_next_ VIGIL_GUARDED_BY(mu_) = 0;
  FramePublisherStats stats_ VIGIL_GUARDED_BY(mu_);
};

class Ring final : public FrameRing {
 public:
  Ring(FrameRingOptions o, std::unique_ptr<SharedMemory> shm,
       std::unique_ptr<transport::device_memory::ExportedMemory> gpu, std::unique_ptr<transport::Connection> conn)
      : opt_(std::move(o)), shm_(std::move(shm)), gpu_(std::move(gpu)), conn_(std::move(conn)),
        host_slot_(gpu_ ? kGpuHostSlot : opt_.slot_bytes) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        if (ReadAvailable(/*all=*/false) == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    });
  }
  ~Ring() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    Word(shm_->data(), offsetof(Control, closed)).store(1, std::memory_order_release);
    conn_->Shutdown();
  }
  void Drain() override { ReadAvailable(/*all=*/true); }
  FrameRingStats stats() const override {
    MutexLock lock(mu_);
    return stats_;
  }

 private:
  // Whether the reader thread takes the complete slots now (batch_hold): half the ring complete, or the oldest
  // complete slot seen batch_hold ago.
  bool BatchDue(char* base) VIGIL_REQUIRES(mu_) {
    if (opt_.batch_hold.count() <= 0) return true;
    uint32_t complete = 0;
    while (complete < opt_.slots &&
           Word(base, SignalOf(next_ + complete, opt_.slots)).load(std::memory_order_acquire) == next_ + complete + 1) {
      ++complete;
    }
    if (complete == 0) {
      oldest_seen_ns_ = 0;
      return false;
    }
    const int64_t now = clock_->SteadyNs();
    if (oldest_seen_ns_ == 0) oldest_seen_ns_ = now;
    if (2 * complete < opt_.slots &&
        now - oldest_seen_ns_ < std::chrono::duration_cast<std::chrono::nanoseconds>(opt_.batch_hold).count()) {
      return false;
    }
    oldest_seen_ns_ = 0;
    return true;
  }

  // Takes every complete slot (the reader thread: once BatchDue; Drain: at once); returns how many. In batches
  // of the slots complete now: a picture already acknowledged (opt_.wanted false) is released uncopied; a GPU
  // ring's copies are all queued, then waited for once (on a GPU the primary keeps busy, each wait is a time slice
  // of the other process's context: one per batch, not one per picture), then the pictures handed over and the
  // slots released in order (a slot is released only once its copy is done: the primary cannot overwrite it
  // mid-copy).
  size_t ReadAvailable(bool all) {
    MutexLock lock(mu_);
    char* base = shm_->data();
    if (!all && !BatchDue(base)) return 0;
    size_t n = 0;
    struct Taken {
      uint64_t seq;
      FrameSlot h;
      std::string bad;
      bool unwanted = false;
      MirroredFrame f;
    };
    std::vector<Taken> batch;
    for (;;) {
      batch.clear();
      bool queued = false;  // device copies queued on this thread's stream
      for (uint64_t seq = next_; batch.size() < opt_.slots; ++seq) {
        if (Word(base, SignalOf(seq, opt_.slots)).load(std::memory_order_acquire) != seq + 1) break;
        Taken& t = batch.emplace_back();
        t.seq = seq;
        const char* slot = base + SlotsOffset(opt_.slots) + (seq % opt_.slots) * host_slot_;
        std::memcpy(&t.h, slot, sizeof t.h);  // a private copy: the primary shares the memory
        t.bad = Check(t.h, seq);
        if (!t.bad.empty()) continue;
        t.f.stream.assign(t.h.stream, t.h.stream_len);
        t.f.run = t.h.run;
        t.f.seq = t.h.seq;
        t.f.capture_ns = t.h.capture_ns;
        t.f.pts_ns = t.h.pts_ns;
        t.f.width = t.h.width;
        t.f.height = t.h.height;
        t.unwanted = opt_.wanted && !opt_.wanted(t.f);
        if (!t.unwanted) t.bad = TakePixels(t.h, seq, slot, &t.f, &queued);
      }
      if (batch.empty()) return n;
      if (queued) {
        if (Status st = transport::device_memory::SynchronizeThread(gpu_->device()); !st.ok()) {
          for (Taken& t : batch) {
            if (t.bad.empty() && t.f.gpu) t.bad = std::string(st.message());
          }
        }
      }
      for (Taken& t : batch) {
        if (!t.bad.empty()) {
          ++stats_.rejected;
          spdlog::warn("frame ring: slot {} rejected: {} (that picture is not kept)", t.seq, t.bad);
        } else if (t.unwanted) {
          ++stats_.unwanted;
        } else {
          ++stats_.received;
          stats_.bytes += t.h.bytes;
          if (opt_.on_frame) opt_.on_frame(std::move(t.f));
        }
        next_ = t.seq + 1;
        Word(base, offsetof(Control, consumed)).store(next_, std::memory_order_release);
        ++n;
      }
    }
  }

  // The slot's pixels into `f` (a private copy; a GPU picture's copy is queued on this thread's stream and
  // *queued set: complete after SynchronizeThread); "" or why not.
  std::string TakePixels(const FrameSlot& h, uint64_t seq, const char* slot, MirroredFrame* f, bool* queued) {
    f->stride = h.stride;
    if (!gpu_) {
      f->bgr.assign(reinterpret_cast<const uint8_t*>(slot) + kSlotHeader,
                    reinterpret_cast<const uint8_t*>(slot) + kSlotHeader + h.bytes);
      return {};
    }
    const int device = gpu_->device();
    const char* src = static_cast<const char*>(gpu_->data()) + (seq % opt_.slots) * opt_.slot_bytes;
    if (h.format == kFormatBgr24) {  // a picture the primary decoded on the CPU: kept in host memory
      f->bgr.resize(h.bytes);
      Status st = transport::device_memory::CopyToHost(f->bgr.data(), src, h.bytes, device);
      return st.ok() ? std::string() : std::string(st.message());
    }
    StatusOr<std::unique_ptr<transport::device_memory::Buffer>> buf =
        transport::device_memory::AllocatePooled(device, h.bytes);
    if (!buf.ok()) return std::string(buf.status().message());
    Status st = transport::device_memory::CopyAsync((*buf)->data(), src, h.bytes, device);
    if (!st.ok()) return std::string(st.message());
    *queued = true;
    auto pic = std::make_shared<MirroredGpuPicture>();
    pic->device = device;
    pic->data = static_cast<const uint8_t*>((*buf)->data());
    pic->bytes = h.bytes;
    pic->matrix = static_cast<int>(h.matrix);
    pic->full_range = h.full_range != 0;
    pic->owner = std::shared_ptr<transport::device_memory::Buffer>(std::move(*buf));
    f->gpu = std::move(pic);
    return {};
  }

  std::string Check(const FrameSlot& h, uint64_t seq) const {
    if (h.magic != kSlotMagic || (h.format != kFormatBgr24 && h.format != kFormatNv12) ||
        (h.format == kFormatNv12 && !gpu_)) {
      return "bad slot magic or format";
    }
    if (h.ring_seq != seq) return StrCat("slot of ring seq ", h.ring_seq, ", expected ", seq);
    if (h.width == 0 || h.height == 0 || h.width > kMaxSide || h.height > kMaxSide) {
      return StrCat("picture size ", h.width, "x", h.height);
    }
    const size_t room = gpu_ ? opt_.slot_bytes : opt_.slot_bytes - kSlotHeader;
    const bool sizes_ok =
        h.format == kFormatNv12
            ? h.stride == h.width && h.bytes == PackedNv12Bytes(h.width, h.height) && h.matrix <= 4 && h.full_range <= 1
            : h.stride >= size_t{h.width} * 3 && h.bytes == uint64_t{h.height} * h.stride;
    if (!sizes_ok || h.bytes > room) {
      return StrCat("stride ", h.stride, " and ", h.bytes, " bytes do not match ", h.width, "x", h.height,
                    " in a slot of ", room);
    }
    if (h.stream_len == 0 || h.stream_len > kMaxStream) return "bad stream id length";
    for (uint32_t i = 0; i < h.stream_len; ++i) {
      if (h.stream[i] < 0x20 || h.stream[i] > 0x7e) return "a stream id with unprintable characters";
    }
    return {};
  }

  const FrameRingOptions opt_;
  vigil::Clock* const clock_ = opt_.clock != nullptr ? opt_.clock : SystemClock();
  std::unique_ptr<SharedMemory> shm_;
  std::unique_ptr<transport::device_memory::ExportedMemory> gpu_;  // memory cuda: the pixels' slots
  std::unique_ptr<transport::Connection> conn_;
  const size_t host_slot_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable Mutex mu_;
  uint64_t next_ VIGIL_GUARDED_BY(mu_) = 0;
  FrameRingStats stats_ VIGIL_GUARDED_BY(mu_);
  int64_t oldest_seen_ns_ VIGIL_GUARDED_BY(mu_) = 0;  // clock_->SteadyNs() slot next_ was first seen complete; 0: not yet
};

}  // namespace

StatusOr<std::unique_ptr<FramePublisher>> FramePublisher::Listen(FramePublisherOptions options) {
  transport::UnixListenOptions uo;
  uo.kind = "frame_ring";
  uo.allow_uids = options.allow_uids;
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<transport::UnixListener> l,
                         transport::UnixListener::Listen(options.socket, uo));
  return std::unique_ptr<FramePublisher>(new Publisher(std::move(l), options.socket));
}

StatusOr<std::unique_ptr<FrameRing>> FrameRing::Connect(FrameRingOptions o, milliseconds timeout) {
  if (o.slots < 2 || o.slots > 4096) return absl::InvalidArgumentError(StrCat("frame ring: ", o.slots, " slots (2..4096)"));
  if (o.batch_hold.count() < 0 || o.batch_hold > std::chrono::seconds(10)) {
    return absl::InvalidArgumentError(StrCat("frame ring: batch_hold ", o.batch_hold.count(), " ms (0..10000)"));
  }
  if (o.slot_bytes < (64u << 10) || o.slot_bytes > (size_t{1} << 30) || o.slot_bytes % 8 != 0) {
    return absl::InvalidArgumentError(StrCat("frame ring: slot_bytes ", o.slot_bytes, " (64 KiB..1 GiB, a multiple of 8)"));
  }
  if (o.token.size() != kFrameTokenBytes) return absl::InvalidArgumentError("frame ring: the token is not 32 bytes");
  std::unique_ptr<transport::device_memory::ExportedMemory> gpu;
  std::string bus_id;
  if (o.memory != "host") {
    const std::string n = o.memory.rfind("cuda:", 0) == 0 ? o.memory.substr(5) : "";
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
      return absl::InvalidArgumentError(StrCat("frame ring memory '", o.memory, "': host or cuda:N"));
    }
    VIGIL_ASSIGN_OR_RETURN(gpu, transport::device_memory::AllocateExported(std::stoi(n), size_t{o.slots} * o.slot_bytes));
    bus_id = transport::device_memory::BusIdOf(gpu->device());
  }
  const size_t host_slot = gpu ? kGpuHostSlot : o.slot_bytes;
  const auto deadline = Deadline::After(timeout);
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> shm, SharedMemory::Create("frames", RingBytes(o.slots, host_slot)));
  std::memset(shm->data(), 0, SlotsOffset(o.slots));
  auto* ctl = reinterpret_cast<Control*>(shm->data());
  ctl->slots = o.slots;
  ctl->memory = gpu ? kMemoryCuda : kMemoryHost;
  ctl->slot_bytes = host_slot;
  ctl->gpu_slot_bytes = gpu ? o.slot_bytes : 0;
  Word(shm->data(), 0).store(kRingMagic, std::memory_order_release);
  std::unique_ptr<transport::Dialer> dialer = transport::MakeUnixDialer(o.socket);
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<transport::Connection> c, dialer->Dial(timeout));
  std::string hello;
  Put<uint32_t>(&hello, kHelloMagic);
  Put<uint32_t>(&hello, kVersion);
  hello += o.token;
  Put<uint32_t>(&hello, o.slots);
  Put<uint64_t>(&hello, host_slot);
  Put<uint32_t>(&hello, gpu ? kMemoryCuda : kMemoryHost);
  Put<uint64_t>(&hello, gpu ? o.slot_bytes : 0);
  const std::string handle = gpu ? gpu->handle() : std::string();
  Put<uint16_t>(&hello, static_cast<uint16_t>(shm->name().size()));
  Put<uint16_t>(&hello, static_cast<uint16_t>(bus_id.size()));
  Put<uint16_t>(&hello, static_cast<uint16_t>(handle.size()));
  hello += shm->name();
  hello += bus_id;
  hello += handle;
  const auto left = [&] { return std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline.left())); };
  VIGIL_RETURN_IF_ERROR(c->Write(hello, left()));
  char head[3];
  if (Status st = ReadExactly(*c, head, sizeof head, deadline); !st.ok()) {
    return absl::UnavailableError(StrCat("frame ring ", o.socket, ": no answer: ", st.message()));
  }
  uint16_t len = 0;
  std::memcpy(&len, head + 1, 2);
  if (head[0] != 0) {
    std::string why(len, '\0');
    (void)ReadExactly(*c, why.data(), len, deadline);
    return absl::UnavailableError(StrCat("frame ring ", o.socket, ": refused: ", why));
  }
  shm->Unlink();  // mapped by both: the name is no longer needed, the memory goes with the last mapping
  return std::unique_ptr<FrameRing>(new Ring(std::move(o), std::move(shm), std::move(gpu), std::move(c)));
}

}  // namespace vigil::replication
