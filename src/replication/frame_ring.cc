// The hot standby's same-host picture ring (replication/frame_ring.h).
#include "vigil/replication/frame_ring.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <thread>

#include "transport/ring.h"  // SharedMemory
#include "vigil/transport/auth.h"
#include "vigil/transport/unix_socket.h"

namespace vigil::replication {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using transport::ring::SharedMemory;

constexpr uint64_t kRingMagic = 0x314d524652474956ull;  // "VIGRFRM1"
constexpr uint32_t kSlotMagic = 0x5446524d;              // "MRFT"
constexpr uint32_t kFormatBgr24 = 1;
constexpr uint32_t kHelloMagic = 0x52464756;              // "VGFR"
constexpr uint32_t kVersion = 1;
constexpr size_t kSignals = 256;                          // the signal words' offset in the control block
constexpr size_t kMaxStream = 128;
constexpr uint32_t kMaxSide = 16384;

struct Control {
  uint64_t magic;
  uint32_t slots, pad;
  uint64_t slot_bytes;
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
Status ReadExactly(transport::Connection& c, char* out, size_t n, Clock::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("timed out");
    VIGIL_ASSIGN_OR_RETURN(size_t k, c.Read(out + got, n - got, left));
    got += k;
  }
  return absl::OkStatus();
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The standby's hello: magic, version, token, slots, slot_bytes, the shared-memory name.
struct Hello {
  std::string token;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  std::string name;
};
constexpr size_t kHelloFixed = 4 + 4 + kFrameTokenBytes + 4 + 8 + 2;

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
    std::lock_guard lock(mu_);
    token_ = t;
    EndSession("a new standby pairs");
    return t;
  }

  bool active() const override {
    std::lock_guard lock(mu_);
    return ring_ != nullptr;
  }

  Status Write(const MirroredFrame& f, const uint8_t* bgr, size_t stride) override {
    std::lock_guard lock(mu_);
    if (ring_ == nullptr) return absl::UnavailableError("frame ring: no standby ring mapped");
    char* base = ring_->data();
    if (Word(base, offsetof(Control, closed)).load(std::memory_order_acquire) != 0) {
      EndSession("the standby closed its ring");
      return absl::UnavailableError("frame ring: the standby closed its ring");
    }
    const size_t bytes = size_t{f.height} * stride;
    if (f.stream.size() > kMaxStream || f.width == 0 || f.height == 0 || f.width > kMaxSide || f.height > kMaxSide ||
        stride < size_t{f.width} * 3 || stride > size_t{kMaxSide} * 4 || kSlotHeader + bytes > slot_bytes_) {
      ++stats_.too_large;
      return absl::InvalidArgumentError(StrCat("frame ring: picture ", f.width, "x", f.height, " (stream '",
                                               f.stream.substr(0, 64), "') does not fit a slot of ", slot_bytes_,
                                               " bytes"));
    }
    const uint64_t consumed = Word(base, offsetof(Control, consumed)).load(std::memory_order_acquire);
    if (next_ - consumed >= slots_) {
      ++stats_.ring_full;
      return absl::ResourceExhaustedError(StrCat("frame ring: all ", slots_, " slots unread (the standby is behind)"));
    }
    char* slot = base + SlotsOffset(slots_) + (next_ % slots_) * slot_bytes_;
    FrameSlot h{};
    h.magic = kSlotMagic;
    h.format = kFormatBgr24;
    h.ring_seq = next_;
    h.run = f.run;
    h.seq = f.seq;
    h.capture_ns = f.capture_ns;
    h.pts_ns = f.pts_ns;
    h.width = f.width;
    h.height = f.height;
    h.stride = static_cast<uint32_t>(stride);
    h.stream_len = static_cast<uint32_t>(f.stream.size());
    h.bytes = bytes;
    std::memcpy(h.stream, f.stream.data(), f.stream.size());
    std::memcpy(slot, &h, sizeof h);
    std::memcpy(slot + kSlotHeader, bgr, bytes);
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

  FramePublisherStats stats() const override {
    std::lock_guard lock(mu_);
    FramePublisherStats s = stats_;
    s.active = ring_ != nullptr;
    return s;
  }

  void CorruptNextSlotsForTesting(int n) override {
    std::lock_guard lock(mu_);
    corrupt_next_ = n;
  }

 private:
  void EndSession(const char* why) {  // REQUIRES mu_
    if (ring_ == nullptr) return;
    spdlog::info("frame ring {}: session ends: {}", socket_, why);
    ring_.reset();
    if (conn_) conn_->Shutdown();
    conn_.reset();
  }

  void Refuse(transport::Connection& c, const std::string& why) {
    {
      std::lock_guard lock(mu_);
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
    const auto deadline = Clock::now() + milliseconds(2000);
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
    std::memcpy(&name_len, p + 20 + kFrameTokenBytes, 2);
    if (magic != kHelloMagic || version != kVersion) {
      Refuse(*c, "not a frame-ring hello (or another version)");
      return;
    }
    std::string expected;
    {
      std::lock_guard lock(mu_);
      expected = token_;
    }
    if (!SameToken(h.token, expected)) {  // before anything else of the peer's is looked at
      Refuse(*c, "wrong token (only the standby paired over the replication channel may map a ring)");
      return;
    }
    if (name_len == 0 || name_len > 200) {
      Refuse(*c, "bad shared-memory name");
      return;
    }
    h.name.resize(name_len);
    if (Status st = ReadExactly(*c, h.name.data(), name_len, deadline); !st.ok()) {
      Refuse(*c, StrCat("no ring name: ", st.message()));
      return;
    }
    if (h.slots < 2 || h.slots > 4096 || h.slot_bytes < (64u << 10) || h.slot_bytes > (size_t{1} << 30) ||
        h.slot_bytes % 8 != 0) {
      Refuse(*c, StrCat(h.slots, " slots of ", h.slot_bytes, " bytes is outside the limits"));
      return;
    }
    StatusOr<std::unique_ptr<SharedMemory>> ring = SharedMemory::Open(h.name, RingBytes(h.slots, h.slot_bytes));
    if (!ring.ok()) {
      Refuse(*c, std::string(ring.status().message()));
      return;
    }
    const auto* ctl = reinterpret_cast<const Control*>((*ring)->data());
    if (Word((*ring)->data(), 0).load(std::memory_order_acquire) != kRingMagic || ctl->slots != h.slots ||
        ctl->slot_bytes != h.slot_bytes) {
      Refuse(*c, "the ring's control block does not match the hello");
      return;
    }
    std::string ok;
    Put<uint8_t>(&ok, 0);
    Put<uint16_t>(&ok, 0);
    std::lock_guard lock(mu_);
    if (!SameToken(h.token, token_)) return;  // a new pairing came meanwhile
    EndSession("another ring mapped");
    if (!c->Write(ok, milliseconds(1000)).ok()) return;
    ring_ = std::move(*ring);
    conn_ = std::move(c);
    slots_ = h.slots;
    slot_bytes_ = h.slot_bytes;
    next_ = Word(ring_->data(), offsetof(Control, consumed)).load(std::memory_order_acquire);
    ++stats_.sessions;
    spdlog::info("frame ring {}: mapped the standby's ring {} ({} slots of {} KiB) for {}", socket_, h.name, slots_,
                 slot_bytes_ >> 10, conn_->peer());
  }

  void Serve() {
    while (!stop_.load()) {
      StatusOr<std::unique_ptr<transport::Connection>> c = listener_->Accept(milliseconds(50));
      if (c.ok()) {
        Admit(std::move(*c));
      } else if (absl::IsPermissionDenied(c.status())) {
        std::lock_guard lock(mu_);
        ++stats_.refused;
        stats_.last_refusal = std::string(c.status().message());
      }
      // The session's socket: the standby's process gone shows as its end.
      std::lock_guard lock(mu_);
      if (conn_) {
        char b;
        StatusOr<size_t> n = conn_->Read(&b, 1, milliseconds(0));
        if (!n.ok() && !absl::IsDeadlineExceeded(n.status())) EndSession("the standby's socket closed");
      }
    }
    std::lock_guard lock(mu_);
    EndSession("stopping");
  }

  std::unique_ptr<transport::UnixListener> listener_;
  const std::string socket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::string token_;                       // GUARDED_BY(mu_)
  std::unique_ptr<SharedMemory> ring_;      // GUARDED_BY(mu_)
  std::unique_ptr<transport::Connection> conn_;  // GUARDED_BY(mu_)
  uint32_t slots_ = 0;                      // GUARDED_BY(mu_)
  size_t slot_bytes_ = 0;                   // GUARDED_BY(mu_)
  uint64_t next_ = 0;                       // GUARDED_BY(mu_)
  int corrupt_next_ = 0;                    // GUARDED_BY(mu_)
  FramePublisherStats stats_;               // GUARDED_BY(mu_)
};

class Ring final : public FrameRing {
 public:
  Ring(FrameRingOptions o, std::unique_ptr<SharedMemory> shm, std::unique_ptr<transport::Connection> conn)
      : opt_(std::move(o)), shm_(std::move(shm)), conn_(std::move(conn)) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        if (ReadAvailable() == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    });
  }
  ~Ring() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    Word(shm_->data(), offsetof(Control, closed)).store(1, std::memory_order_release);
    conn_->Shutdown();
  }
  void Drain() override { ReadAvailable(); }
  FrameRingStats stats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  // Takes every complete slot; returns how many.
  size_t ReadAvailable() {
    std::lock_guard lock(mu_);
    char* base = shm_->data();
    size_t n = 0;
    for (;; ++n) {
      if (Word(base, SignalOf(next_, opt_.slots)).load(std::memory_order_acquire) != next_ + 1) return n;
      const char* slot = base + SlotsOffset(opt_.slots) + (next_ % opt_.slots) * opt_.slot_bytes;
      FrameSlot h;
      std::memcpy(&h, slot, sizeof h);  // a private copy: the primary shares the memory
      const std::string bad = Check(h);
      if (!bad.empty()) {
        ++stats_.rejected;
        spdlog::warn("frame ring: slot {} rejected: {} (that picture is not kept)", next_, bad);
      } else {
        MirroredFrame f;
        f.stream.assign(h.stream, h.stream_len);
        f.run = h.run;
        f.seq = h.seq;
        f.capture_ns = h.capture_ns;
        f.pts_ns = h.pts_ns;
        f.width = h.width;
        f.height = h.height;
        f.stride = h.stride;
        f.bgr.assign(reinterpret_cast<const uint8_t*>(slot) + kSlotHeader,
                     reinterpret_cast<const uint8_t*>(slot) + kSlotHeader + h.bytes);
        ++stats_.received;
        stats_.bytes += h.bytes;
        if (opt_.on_frame) opt_.on_frame(std::move(f));
      }
      ++next_;
      Word(base, offsetof(Control, consumed)).store(next_, std::memory_order_release);
    }
  }

  std::string Check(const FrameSlot& h) const {
    if (h.magic != kSlotMagic || h.format != kFormatBgr24) return "bad slot magic or format";
    if (h.ring_seq != next_) return StrCat("slot of ring seq ", h.ring_seq, ", expected ", next_);
    if (h.width == 0 || h.height == 0 || h.width > kMaxSide || h.height > kMaxSide) {
      return StrCat("picture size ", h.width, "x", h.height);
    }
    if (h.stride < size_t{h.width} * 3 || h.bytes != uint64_t{h.height} * h.stride ||
        kSlotHeader + h.bytes > opt_.slot_bytes) {
      return StrCat("stride ", h.stride, " and ", h.bytes, " bytes do not match ", h.width, "x", h.height,
                    " in a slot of ", opt_.slot_bytes);
    }
    if (h.stream_len == 0 || h.stream_len > kMaxStream) return "bad stream id length";
    for (uint32_t i = 0; i < h.stream_len; ++i) {
      if (h.stream[i] < 0x20 || h.stream[i] > 0x7e) return "a stream id with unprintable characters";
    }
    return {};
  }

  const FrameRingOptions opt_;
  std::unique_ptr<SharedMemory> shm_;
  std::unique_ptr<transport::Connection> conn_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  uint64_t next_ = 0;     // GUARDED_BY(mu_)
  FrameRingStats stats_;  // GUARDED_BY(mu_)
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
  if (o.slot_bytes < (64u << 10) || o.slot_bytes > (size_t{1} << 30) || o.slot_bytes % 8 != 0) {
    return absl::InvalidArgumentError(StrCat("frame ring: slot_bytes ", o.slot_bytes, " (64 KiB..1 GiB, a multiple of 8)"));
  }
  if (o.token.size() != kFrameTokenBytes) return absl::InvalidArgumentError("frame ring: the token is not 32 bytes");
  const auto deadline = Clock::now() + timeout;
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> shm,
                         SharedMemory::Create("frames", RingBytes(o.slots, o.slot_bytes)));
  std::memset(shm->data(), 0, SlotsOffset(o.slots));
  auto* ctl = reinterpret_cast<Control*>(shm->data());
  ctl->slots = o.slots;
  ctl->slot_bytes = o.slot_bytes;
  Word(shm->data(), 0).store(kRingMagic, std::memory_order_release);
  std::unique_ptr<transport::Dialer> dialer = transport::MakeUnixDialer(o.socket);
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<transport::Connection> c, dialer->Dial(timeout));
  std::string hello;
  Put<uint32_t>(&hello, kHelloMagic);
  Put<uint32_t>(&hello, kVersion);
  hello += o.token;
  Put<uint32_t>(&hello, o.slots);
  Put<uint64_t>(&hello, o.slot_bytes);
  Put<uint16_t>(&hello, static_cast<uint16_t>(shm->name().size()));
  hello += shm->name();
  const auto left = [&] { return std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline - Clock::now())); };
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
  return std::unique_ptr<FrameRing>(new Ring(std::move(o), std::move(shm), std::move(c)));
}

}  // namespace vigil::replication
