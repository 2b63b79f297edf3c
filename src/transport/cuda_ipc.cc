// The cuda_ipc link (cuda_ipc.h): the aggregator's ring connection and listener, the edge's ring writer.
#include "vigil/common/deadline.h"
#include "vigil/transport/cuda_ipc.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "ring.h"
#include "ring_writer.h"
#include "socket_connection.h"
#include "vigil/common/mutex.h"
#include "vigil/transport/unix_socket.h"

namespace vigil::transport {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

struct Counters {
  std::atomic<uint64_t> rings_offered{0}, ring_failures{0}, slots_received{0}, slots_rejected{0}, device_reports{0},
      bytes_received{0}, rings_mapped{0}, map_failures{0}, slots_written{0}, device_rows_sent{0}, slot_waits{0};
};
Counters& counters() {
  static Counters c;
  return c;
}
std::atomic<int> g_corrupt_slots{0};

// A spin-wait hint: the core backs off (and its hyper-thread sibling runs) between polls of the ring.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

constexpr microseconds kSpin{100};      // after traffic, poll without sleeping this long
constexpr microseconds kSocketEvery{20};  // while spinning, look at the socket this often
constexpr microseconds kFirstSleep{10};
constexpr microseconds kMaxSleep{200};  // the idle polling step (a first report after idle waits ≤ this)

// The aggregator's side of one cuda_ipc session: the Unix socket plus, after the RingAccept, the ring.
// ReadMessages returns the messages of both, each decoded and checked once (the receiver reads no bytes of it).
class RingConnection final : public Connection {
 public:
  RingConnection(std::unique_ptr<SocketConnection> sock, const CudaIpcListenOptions& opt)
      : sock_(std::move(sock)), opt_(opt) {}
  ~RingConnection() override {
    if (shared_) ring::Word(shared_->data(), offsetof(ring::ControlHeader, closed)).store(1);
  }

  Status Write(std::string_view bytes, milliseconds timeout) override { return sock_->Write(bytes, timeout); }
  void Shutdown() override {
    sock_->Shutdown();
    MutexLock lock(mu_);
    if (shared_) ring::Word(shared_->data(), offsetof(ring::ControlHeader, closed)).store(1);
  }
  std::string peer() const override { return sock_->peer(); }
  std::string transports() const override {
    MutexLock lock(mu_);
    return active_ ? (memory_ ? "cuda_ipc" : "shm") : "";
  }

  std::optional<SessionOffer> OfferSession() override {
    MutexLock lock(mu_);
    RingOffer offer;
    Status st = SetUp(&offer);
    if (!st.ok()) {
      ++counters().ring_failures;
      spdlog::warn("cuda_ipc {}: no ring for this session: {}", sock_->peer(), std::string(st.message()));
      offer = RingOffer{};
      offer.error = std::string(st.message());
      memory_.reset();
      shared_.reset();
      ring_ctl_ = nullptr;
      return SessionOffer{EncodeFrame(offer), false};
    }
    ++counters().rings_offered;
    return SessionOffer{EncodeFrame(offer), true};
  }

  bool decodes() const override { return true; }

  // Whole messages from the socket (decoded here) and the ring (a slot's frames decoded from the slot, a device
  // report's rows taken from it as they are), each checked once.
  StatusOr<size_t> ReadMessages(std::deque<StatusOr<Message>>* out, milliseconds timeout) override {
    if (!pending_error_.ok()) return std::exchange(pending_error_, absl::OkStatus());
    const auto deadline = Deadline::After(timeout);
    auto spin_until = Deadline::After(kSpin);
    microseconds sleep = kFirstSleep;
    const size_t had = out->size();
    size_t bytes = 0;
    for (;;) {
      if (polling_) {
        // While spinning, the ring alone for up to kSocketEvery (a pause between polls), then one look at the
        // socket: a report is seen within ~0.1 µs of its signal instead of after a recv and a yield.
        const Deadline look_until =
            spin_until.passed() ? Deadline::After(microseconds(0)) : Deadline::Earlier(Deadline::After(kSocketEvery), spin_until);
        for (;;) {
          Status polled = PollRing(out, &bytes);
          if (!polled.ok()) {
            if (out->size() == had) return polled;
            pending_error_ = polled;  // what came before the bad slot first
            return bytes;
          }
          if (out->size() > had) return bytes;
          if (bytes > 0) {  // a frame spanning slots is still incomplete: more is on its way
            spin_until = Deadline::After(kSpin);
            sleep = kFirstSleep;
          }
          if (look_until.passed()) break;
          CpuRelax();
        }
      }
      // The socket: at once when a ring is polled, else blocking for what is left.
      milliseconds wait(0);
      if (!polling_) wait = std::chrono::ceil<milliseconds>(deadline.left());
      StatusOr<size_t> n = sock_->Read(sock_buf_, sizeof sock_buf_, wait);
      if (n.ok()) {
        bytes += *n;
        TakeSocketBytes(std::string_view(sock_buf_, *n), out);
        if (out->size() > had) return bytes;
        continue;
      }
      if (n.status().code() != absl::StatusCode::kDeadlineExceeded) return n.status();
      if (deadline.passed()) return n.status();
      if (!polling_) continue;
      if (!spin_until.passed()) {
        std::this_thread::yield();
        continue;
      }
      // Idle: sleep on the socket (its data wakes us) for a growing step.
      pollfd p{sock_->fd(), POLLIN, 0};
      timespec ts{0, static_cast<long>(std::chrono::nanoseconds(sleep).count())};
      ::ppoll(&p, 1, &ts, nullptr);
      sleep = std::min(kMaxSleep, sleep * 2);
    }
  }

  StatusOr<size_t> Read(char*, size_t, milliseconds) override {
    return absl::UnimplementedError("a cuda_ipc connection hands over decoded messages (ReadMessages), not bytes");
  }

 private:
  Status SetUp(RingOffer* offer) VIGIL_REQUIRES(mu_) {
    if (opt_.device != "host") {
      VIGIL_ASSIGN_OR_RETURN(memory_,
                             ring::AllocateRing(opt_.device, static_cast<size_t>(opt_.slots) * opt_.slot_bytes));
    }
    VIGIL_ASSIGN_OR_RETURN(shared_, ring::SharedMemory::Create("ring", ring::SharedBytes(opt_.slots, opt_.slot_bytes)));
    std::memset(shared_->data(), 0, ring::MirrorOffset(opt_.slots));
    auto* h = reinterpret_cast<ring::ControlHeader*>(shared_->data());
    h->slots = opt_.slots;
    h->slot_bytes = opt_.slot_bytes;
    ring::Word(shared_->data(), 0).store(ring::kControlMagic, std::memory_order_release);
    copy_.resize(opt_.slot_bytes);
    offer->memory = memory_ ? "cuda" : "host";
    offer->device = memory_ ? memory_->device() : "";
    offer->handle = memory_ ? memory_->handle() : "";
    offer->control = shared_->name();
    ring_ctl_ = shared_->data();
    offer->slots = opt_.slots;
    offer->slot_bytes = opt_.slot_bytes;
    return absl::OkStatus();
  }

  // Socket bytes: whole messages (or the decoder's error) to `out`; a RingAccept also starts polling the ring.
  void TakeSocketBytes(std::string_view bytes, std::deque<StatusOr<Message>>* out) {
    if (sock_broken_) return;  // after an undecodable frame nothing on the socket is ours to read
    sock_decoder_.Feed(bytes);
    for (;;) {
      StatusOr<std::optional<Message>> m = sock_decoder_.Next();
      if (!m.ok()) {  // the receiver judges it (a Reject to the peer, then the end)
        sock_broken_ = true;
        out->push_back(m.status());
        return;
      }
      if (!m->has_value()) return;
      if (const Hello* h = std::get_if<Hello>(&**m); h != nullptr && classes_ == 0) {
        classes_ = h->class_names.size();  // the edge names every class of its model: device rows are checked
      }
      if (std::holds_alternative<RingAccept>(**m)) {
        MutexLock lock(mu_);
        if (shared_ && !active_) {  // the receiver judges a RingAccept out of place (it is passed on)
          shared_->Unlink();
          active_ = true;
          polling_ = true;
          spdlog::info("cuda_ipc {}: ring mapped by the edge ({} slots of {} bytes, {})", sock_->peer(), opt_.slots,
                       opt_.slot_bytes, memory_ ? StrCat("GPU memory on ", memory_->device()) : "host memory");
        }
      }
      out->push_back(std::move(**m));
    }
  }

  // Takes every complete slot from next_ on, its messages to `out` and its size to *bytes. An error: a slot that
  // fails a check (what earlier slots gave stays in `out`).
  Status PollRing(std::deque<StatusOr<Message>>* out, size_t* bytes) {
    char* ctl = ring_ctl_;
    for (size_t taken = 0; taken < (1u << 20);) {
      const uint64_t word = ring::Word(ctl, ring::SignalOffset(next_, opt_.slots)).load(std::memory_order_acquire);
      if ((word >> 24) != next_ + 1) break;
      const uint32_t used = static_cast<uint32_t>(word & 0xFFFFFF);
      VIGIL_RETURN_IF_ERROR(TakeSlot(used, out));
      ++next_;
      ring::Word(ctl, offsetof(ring::ControlHeader, consumed)).store(next_, std::memory_order_release);
      ++counters().slots_received;
      counters().bytes_received += used;
      *bytes += used;
      taken += used;
    }
    return absl::OkStatus();
  }

  Status Bad(std::string why) {
    ++counters().slots_rejected;
    const std::string what = StrCat("cuda_ipc ", sock_->peer(), ": slot ", next_, " rejected: ", why);
    spdlog::warn("{} (nothing of it is stored; the session ends and the edge re-sends)", what);
    return absl::DataLossError(what);
  }

  Status TakeSlot(uint32_t used, std::deque<StatusOr<Message>>* out) {
    if (used < sizeof(ring::SlotHeader) || used > opt_.slot_bytes) return Bad(StrCat("signalled ", used, " bytes"));
    // The slot's host mirror (written with the GPU ring by the edge's kernel). Everything is checked on private
    // copies (the header here, frames in the decoder's buffer, a device report's header in copy_ and its rows in
    // the Report): the edge shares the memory.
    const char* slot =
        ring_ctl_ + ring::MirrorOffset(opt_.slots) + static_cast<size_t>(next_ % opt_.slots) * opt_.slot_bytes;
    ring::SlotHeader h;
    std::memcpy(&h, slot, sizeof h);
    if (h.magic != ring::kSlotMagic) return Bad("bad slot magic");
    const size_t payload_bytes = used - sizeof h;
    if (h.kind == ring::kKindStream) {
      if (h.bytes != payload_bytes || h.rows != 0) return Bad("slot header does not match its size");
      ring_decoder_.Feed(std::string_view(slot + sizeof h, payload_bytes));
      const size_t had = out->size();
      for (;;) {
        StatusOr<std::optional<Message>> m = ring_decoder_.Next();
        if (!m.ok()) {
          out->erase(out->begin() + static_cast<std::ptrdiff_t>(had), out->end());  // nothing of a bad slot
          return Bad(std::string(m.status().message()));
        }
        if (!m->has_value()) return absl::OkStatus();
        out->push_back(std::move(**m));
      }
    }
    if (h.kind != ring::kKindDeviceReport) return Bad(StrCat("unknown slot kind ", h.kind));
    // A Report frame without rows, then the rows that came from device memory.
    if (ring_decoder_.pending() != 0) return Bad("a device report inside a frame");
    if (h.rows > kMaxDetections) return Bad(StrCat(h.rows, " rows, more than ", kMaxDetections));
    const size_t rows_at = ring::RoundUp8(h.bytes);
    if (rows_at + static_cast<size_t>(h.rows) * sizeof(ReportDetection) != payload_bytes) {
      return Bad("slot header does not match its size");
    }
    std::memcpy(copy_.data(), slot + sizeof h, h.bytes);
    StatusOr<Message> m = DecodeFrame(std::string_view(copy_.data(), h.bytes));
    if (!m.ok()) return Bad(std::string(m.status().message()));
    Report* r = std::get_if<Report>(&*m);
    if (r == nullptr || !r->detections.empty()) return Bad("a device-report slot without its Report header");
    r->detections.resize(h.rows);
    std::memcpy(r->detections.data(), slot + sizeof h + rows_at, h.rows * sizeof(ReportDetection));
    Status valid = ValidateReport(*r);  // finite boxes and scores, integral class ids, an event's rows
    if (!valid.ok()) return Bad(std::string(valid.message()));
    for (const ReportDetection& d : r->detections) {
      if (classes_ > 0 && d.class_id >= static_cast<float>(classes_)) {
        return Bad(StrCat("class ", d.class_id, " but the Hello named ", classes_, " classes"));
      }
    }
    out->push_back(std::move(*m));
    ++counters().device_reports;
    return absl::OkStatus();
  }

  const std::unique_ptr<SocketConnection> sock_;
  const CudaIpcListenOptions opt_;
  // The reader thread (the receiver's, which also calls OfferSession) sets these up; Shutdown and transports()
  // read them from other threads.
  mutable Mutex mu_;
  std::unique_ptr<ring::RingMemory> memory_ VIGIL_GUARDED_BY(mu_);   // the GPU ring; null for memory "host"
  std::unique_ptr<ring::SharedMemory> shared_ VIGIL_GUARDED_BY(mu_);  // control block, signals, host mirror
  bool active_ VIGIL_GUARDED_BY(mu_) = false;
  // Reader thread only:
  bool polling_ = false;        // active_, as the reader thread (its only writer) knows it: poll the ring
  char* ring_ctl_ = nullptr;    // shared_->data() while shared_ is set (the control block, then the mirror)
  uint64_t next_ = 0;
  size_t classes_ = 0;  // the Hello's class names (0: none named)
  std::vector<char> copy_;  // a device report's header, checked here
  FrameDecoder sock_decoder_;   // socket frames
  bool sock_broken_ = false;    // the socket gave an undecodable frame
  FrameDecoder ring_decoder_;   // ring frames (a frame may span slots); one that fails is a rejected slot
  Status pending_error_;        // a bad slot's, returned after the messages before it
  char sock_buf_[16 << 10];
};

class CudaIpcListener final : public Listener {
 public:
  CudaIpcListener(std::unique_ptr<UnixListener> unix, CudaIpcListenOptions opt)
      : unix_(std::move(unix)), opt_(std::move(opt)) {}
  std::string_view kind() const override { return "cuda_ipc"; }
  uint16_t port() const override { return 0; }
  const std::string& address() const override { return unix_->address(); }
  StatusOr<std::unique_ptr<Connection>> Accept(milliseconds timeout) override {
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> c, unix_->Accept(timeout));
    std::unique_ptr<SocketConnection> sock(static_cast<SocketConnection*>(c.release()));  // UnixListener's own type
    return std::unique_ptr<Connection>(new RingConnection(std::move(sock), opt_));
  }

 private:
  std::unique_ptr<UnixListener> unix_;
  CudaIpcListenOptions opt_;
};

}  // namespace

StatusOr<std::unique_ptr<Listener>> CudaIpcListen(CudaIpcListenOptions options) {
  if (options.slots < 2 || options.slots > (1u << 16)) {
    return absl::InvalidArgumentError(StrCat("cuda_ipc.slots: ", options.slots, " (2..65536)"));
  }
  if (options.slot_bytes < ring::kMinSlotBytes || options.slot_bytes > ring::kMaxSlotBytes) {
    return absl::InvalidArgumentError(
        StrCat("cuda_ipc.slot_bytes: ", options.slot_bytes, " (", ring::kMinSlotBytes, "..", ring::kMaxSlotBytes, ")"));
  }
  if (options.slot_bytes % 8 != 0) {
    return absl::InvalidArgumentError(StrCat("cuda_ipc.slot_bytes: ", options.slot_bytes, " is not a multiple of 8"));
  }
  if (options.device != "host" && options.device.rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError(StrCat("cuda_ipc.device: '", options.device, "' (host or cuda:N)"));
  }
  UnixListenOptions uo;
  uo.kind = "cuda_ipc";
  uo.allow_uids = options.allow_uids;
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<UnixListener> unix, UnixListener::Listen(options.path, uo));
  return std::unique_ptr<Listener>(new CudaIpcListener(std::move(unix), std::move(options)));
}

std::unique_ptr<Link> MakeCudaIpcLink(std::string path, std::string key, int device, uint32_t linger_us) {
  LinkOptions o;
  o.kind = "cuda_ipc";
  o.key = std::move(key);
  o.ring_device = device;
  o.ring_linger_us = linger_us;
  return MakeFramedLink(MakeUnixDialer(std::move(path)), std::move(o));
}

Status CheckRingDevice(const std::string& device) {
  if (device == "host") return absl::OkStatus();
  return ring::AllocateRing(device, ring::kMinSlotBytes).status();
}

CudaIpcCounters GetCudaIpcCounters() {
  const Counters& c = counters();
  CudaIpcCounters r;
  r.rings_offered = c.rings_offered.load();
  r.ring_failures = c.ring_failures.load();
  r.slots_received = c.slots_received.load();
  r.slots_rejected = c.slots_rejected.load();
  r.device_reports = c.device_reports.load();
  r.bytes_received = c.bytes_received.load();
  r.rings_mapped = c.rings_mapped.load();
  r.map_failures = c.map_failures.load();
  r.slots_written = c.slots_written.load();
  r.device_rows_sent = c.device_rows_sent.load();
  r.slot_waits = c.slot_waits.load();
  r.publisher_launches = ring::PublisherLaunches().load();
  return r;
}

void CorruptNextRingSlotsForTesting(int n) { g_corrupt_slots.store(n); }

// ---- the edge's writer ----------------------------------------------------------------------------

StatusOr<std::unique_ptr<RingWriter>> RingWriter::Open(const RingOffer& offer, int device, uint32_t linger_us) {
  auto fail = [](Status st) {
    ++counters().map_failures;
    return st;
  };
  if (!offer.error.empty()) {
    return fail(absl::UnavailableError(StrCat("the aggregator offers no ring: ", offer.error.substr(0, 500))));
  }
  if (offer.slots < 2 || offer.slots > (1u << 16) || offer.slot_bytes < ring::kMinSlotBytes ||
      offer.slot_bytes > ring::kMaxSlotBytes || offer.slot_bytes % 8 != 0) {
    return fail(absl::InvalidArgumentError(
        StrCat("ring offer: ", offer.slots, " slots of ", offer.slot_bytes, " bytes is outside the limits")));
  }
  auto w = std::unique_ptr<RingWriter>(new RingWriter());
  w->slots_ = offer.slots;
  w->slot_bytes_ = offer.slot_bytes;
  w->keep_.resize(offer.slots);
  StatusOr<std::unique_ptr<ring::SharedMemory>> control =
      ring::SharedMemory::Open(offer.control, ring::SharedBytes(offer.slots, offer.slot_bytes));
  if (!control.ok()) return fail(control.status());
  w->control_ = std::move(*control);
  const auto* h = reinterpret_cast<const ring::ControlHeader*>(w->control_->data());
  if (ring::Word(w->control_->data(), 0).load(std::memory_order_acquire) != ring::kControlMagic ||
      h->slots != offer.slots || h->slot_bytes != offer.slot_bytes) {
    return fail(absl::InvalidArgumentError("ring offer: the control block does not match the offer"));
  }
  StatusOr<std::unique_ptr<ring::RingMapping>> mapping =
      ring::MapRing(offer, w->control_->data(), w->control_->size(), device, linger_us);
  if (!mapping.ok()) return fail(mapping.status());
  w->mapping_ = std::move(*mapping);
  ++counters().rings_mapped;
  return w;
}

RingWriter::~RingWriter() {
  if (mapping_) (void)mapping_->Drain();
}

Status RingWriter::Acquire(Deadline deadline, bool* waited) {
  char* ctl = control_->data();
  microseconds sleep = kFirstSleep;
  for (;;) {
    if (aborted_.load()) return absl::UnavailableError("cuda_ipc: link closed");
    if (ring::Word(ctl, offsetof(ring::ControlHeader, closed)).load(std::memory_order_acquire) != 0) {
      return absl::UnavailableError("cuda_ipc: the aggregator closed the ring");
    }
    // A slot is free once the consumer released it and the GPU ring's copy of it is done (the CPU may signal
    // a slot before its kernel ran: ring.h, Publish).
    const uint64_t consumed = ring::Word(ctl, offsetof(ring::ControlHeader, consumed)).load(std::memory_order_acquire);
    const uint64_t ready = ring::Word(ctl, offsetof(ring::ControlHeader, ring_ready)).load(std::memory_order_acquire);
    if (seq_ - consumed < slots_ && seq_ - ready < slots_) {
      keep_[seq_ % slots_].reset();  // its copy finished: the aggregator saw the slot's signal
      return absl::OkStatus();
    }
    if (!*waited) {
      *waited = true;
      ++counters().slot_waits;
    }
    if (deadline.passed()) {
      return absl::DeadlineExceededError(StrCat("cuda_ipc: all ", slots_, " slots in use (the aggregator is behind)"));
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(kMaxSleep, sleep * 2);
  }
}

Status RingWriter::Publish(uint32_t kind, uint32_t payload_bytes, uint32_t rows, uint32_t used) {
  const size_t off = offset();
  char* s = mirror(off);
  const ring::SlotHeader h{ring::kSlotMagic, kind, payload_bytes, rows};
  std::memcpy(s, &h, sizeof h);
  const bool corrupt = g_corrupt_slots.load() > 0 && g_corrupt_slots.fetch_sub(1) > 0;
  if (corrupt) s[kind == ring::kKindStream ? used - 1 : sizeof h + payload_bytes - 1] ^= 0x5a;  // the test hook
  const size_t host_bytes = kind == ring::kKindStream ? used : sizeof h + ring::RoundUp8(payload_bytes);
  const DevicePayload* d = device_;
  Status st = mapping_->Publish(seq_, off, host_bytes, d ? d->device_rows : nullptr, host_bytes,
                                d ? d->count * sizeof(ReportDetection) : 0, d ? d->ready_event : nullptr,
                                ring::SignalOffset(seq_, slots_), ring::SignalValue(seq_, used));
  device_ = nullptr;
  if (!st.ok()) return absl::UnavailableError(st.message());
  ++seq_;
  ++counters().slots_written;
  return absl::OkStatus();
}

Status RingWriter::Write(std::span<const OutboxMessage* const> messages, std::string_view edge, uint64_t epoch,
                         uint64_t* link_seq, Deadline deadline) {
  // First encode every frame that goes through the host, so a payload that fails to download leaves
  // nothing of this call written.
  struct Item {
    size_t begin, end;                // host frame bytes in out_
    const OutboxMessage* device;      // rows copied device → ring (a Report frame without rows in out_)
  };
  std::vector<Item> items;
  items.reserve(messages.size());
  out_.clear();
  uint64_t next_seq = *link_seq;
  const size_t slot_payload = slot_bytes_ - sizeof(ring::SlotHeader);
  for (const OutboxMessage* m : messages) {
    const size_t begin = out_.size();
    if (!m->device || m->device->count == 0) {
      AppendReportFrame(m->report, edge, epoch, next_seq++, m->report.detections, &out_);
      items.push_back({begin, out_.size(), nullptr});
      continue;
    }
    const DevicePayload& d = *m->device;
    if (mapping_->takes_device_rows(d.device) && d.device_rows != nullptr) {
      AppendReportFrame(m->report, edge, epoch, next_seq, {}, &out_);
      if (ring::RoundUp8(out_.size() - begin) + d.count * sizeof(ReportDetection) <= slot_payload) {
        ++next_seq;
        items.push_back({begin, out_.size(), m});
        continue;
      }
      out_.resize(begin);  // too large for one slot: through the host
    }
    if (!m->report.detections.empty()) {  // the producer's host copy of the same rows: no download
      AppendReportFrame(m->report, edge, epoch, next_seq++, m->report.detections, &out_);
      items.push_back({begin, out_.size(), nullptr});
      continue;
    }
    Report checked = m->report;
    checked.detections.swap(staging_rows_);
    checked.detections.resize(d.count);
    Status st = d.download(checked.detections.data());
    if (st.ok()) st = ValidateReportFields(checked);
    if (st.ok()) AppendReportFrame(checked, edge, epoch, next_seq++, checked.detections, &out_);
    checked.detections.swap(staging_rows_);
    if (!st.ok()) {
      return absl::InternalError(StrCat("message ", m->id, " (", m->report.stream, " seq ", m->report.seq_first,
                                        "): device rows on cuda:", d.device, ": ", st.message()));
    }
    items.push_back({begin, out_.size(), nullptr});
  }
  *link_seq = next_seq;  // taken whatever happens below: a failure ends the session
  bool waited = false;
  for (const Item& it : items) {
    std::string_view bytes(out_.data() + it.begin, it.end - it.begin);
    if (it.device != nullptr) {
      if (fill_ > 0) VIGIL_RETURN_IF_ERROR(Publish(ring::kKindStream, fill_, 0, sizeof(ring::SlotHeader) + fill_));
      fill_ = 0;
      VIGIL_RETURN_IF_ERROR(Acquire(deadline, &waited));
      const DevicePayload& d = *it.device->device;
      std::memcpy(mirror(offset()) + sizeof(ring::SlotHeader), bytes.data(), bytes.size());
      const size_t rows_at = sizeof(ring::SlotHeader) + ring::RoundUp8(bytes.size());
      const size_t row_bytes = d.count * sizeof(ReportDetection);
      keep_[seq_ % slots_] = d.keepalive;
      device_ = &d;  // Publish copies the rows on the GPU
      VIGIL_RETURN_IF_ERROR(Publish(ring::kKindDeviceReport, static_cast<uint32_t>(bytes.size()), d.count,
                                    static_cast<uint32_t>(rows_at + row_bytes)));
      ++counters().device_rows_sent;
      continue;
    }
    while (!bytes.empty()) {
      if (fill_ == 0) VIGIL_RETURN_IF_ERROR(Acquire(deadline, &waited));
      const size_t n = std::min(bytes.size(), slot_payload - fill_);
      std::memcpy(mirror(offset()) + sizeof(ring::SlotHeader) + fill_, bytes.data(), n);
      fill_ += static_cast<uint32_t>(n);
      bytes.remove_prefix(n);
      if (fill_ == slot_payload) {
        VIGIL_RETURN_IF_ERROR(Publish(ring::kKindStream, fill_, 0, sizeof(ring::SlotHeader) + fill_));
        fill_ = 0;
      }
    }
  }
  if (fill_ > 0) VIGIL_RETURN_IF_ERROR(Publish(ring::kKindStream, fill_, 0, sizeof(ring::SlotHeader) + fill_));
  fill_ = 0;
  return absl::OkStatus();
}

}  // namespace vigil::transport
