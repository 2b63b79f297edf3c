// The UCX link's user side (ucx.h): the Connection over a connected endpoint (Read, Write, WriteReport,
// Shutdown: they post to the Worker's progress thread and wait on the ConnState's condition variable) and the
// Dialer (MakeUcxDialer).
#include <algorithm>
#include <cstring>
#include <utility>

#include "sockaddr.h"
#include "transport/ucx_worker.h"
#include "vigil/transport/outbox.h"

namespace vigil::transport {
namespace ucx {
namespace {

using net::AddrInfoPtr;
using net::FormatAddress;
using net::Resolve;

class UcxConnection final : public Connection {
 public:
  UcxConnection(std::shared_ptr<Worker> worker, std::shared_ptr<ConnState> conn)
      : worker_(std::move(worker)), c_(std::move(conn)) {}

  ~UcxConnection() override {
    Shutdown();
    MutexLock lock(c_->mu);
    // Wait until the peer has everything we wrote (it acknowledged our FIN), unless it cannot read any
    // more anyway (it sent its own FIN, or failed), or we wrote nothing. (CondVar deadlines.)
    const bool wrote = c_->next_send_seq > 0;
    const auto linger_until = Deadline::After(c_->options.linger);
    while (wrote && !c_->fin_acked && !c_->peer_fin && c_->failure.ok() && !c_->closed &&
           c_->cv.WaitUntil(lock, linger_until)) {
    }
    const bool force = !c_->failure.ok() || (wrote && !c_->fin_acked && !c_->peer_fin);
    lock.Unlock();
    worker_->Post([w = worker_.get(), c = c_, force] { w->BeginClose(c, force); });
    lock.Lock();
    const auto close_until = Deadline::After(kCloseTimeout);
    while (!c_->closed && c_->cv.WaitUntil(lock, close_until)) {
    }
    // Past the timeout the worker still owns the state and releases it when UCX finishes (or when the
    // worker stops, which for a dialed connection is right after this).
  }

  Status Write(std::string_view bytes, milliseconds timeout) override {
    const auto deadline = Deadline::After(timeout);
    MutexLock lock(c_->mu);
    while (!bytes.empty()) {
      if (c_->shut) return absl::UnavailableError(StrCat(c_->peer, ": connection shut down"));
      if (!c_->failure.ok()) return c_->failure;
      if (c_->peer_fin) return absl::UnavailableError(StrCat(c_->peer, ": peer closed the connection"));
      const uint64_t unconsumed = c_->sent_bytes - c_->peer_consumed;
      const uint64_t credit = c_->peer_window > unconsumed ? c_->peer_window - unconsumed : 0;
      SendSlot* slot = nullptr;
      for (SendSlot& s : c_->slots) {
        if (!c_->slot_busy[s.index]) {
          slot = &s;
          break;
        }
      }
      if (credit > 0 && slot != nullptr) {
        const size_t n = std::min<uint64_t>({bytes.size(), c_->options.max_message_bytes, credit});
        std::memcpy(slot->data, bytes.data(), n);
        slot->len = n;
        c_->slot_busy[slot->index] = true;
        slot->header.seq = c_->next_send_seq++;
        c_->sent_bytes += n;
        bytes.remove_prefix(n);
        // Posted under the lock: commands run in order, so sends reach UCX in sequence order and a FIN
        // (Shutdown) never overtakes them.
        worker_->Post([w = worker_.get(), keep = c_, slot] { w->SendData(slot); });
        continue;
      }
      if (deadline.passed()) {
        return absl::DeadlineExceededError(
            StrCat(c_->peer, ": send blocked for ", timeout.count(), " ms (the peer is not reading)"));
      }
      c_->cv.WaitUntil(lock, deadline);
    }
    return absl::OkStatus();
  }

  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    const auto deadline = Deadline::After(timeout);
    MutexLock lock(c_->mu);
    for (;;) {
      if (c_->shut) return absl::UnavailableError(StrCat(c_->peer, ": connection shut down"));
      size_t n = 0;
      uint64_t drained = 0;  // wire bytes of the chunks drained completely (a rows chunk grew into a frame)
      for (auto it = c_->rx.begin(); n < max && it != c_->rx.end() && it->first == c_->next_read_seq &&
                                     it->second.ready;) {
        Chunk& ch = it->second;
        const size_t take = std::min(max - n, ch.size - ch.offset);
        std::memcpy(buf + n, ch.bytes.get() + ch.offset, take);
        n += take;
        ch.offset += take;
        if (ch.offset < ch.size) break;
        drained += ch.wire;
        it = c_->rx.erase(it);
        ++c_->next_read_seq;
      }
      if (n > 0) {
        c_->consumed += drained;
        const uint64_t threshold = std::max<uint64_t>(1, c_->options.receive_window_bytes / 4);
        if (c_->consumed - c_->consumed_reported >= threshold) {
          c_->consumed_reported = c_->consumed;
          worker_->Post([w = worker_.get(), keep = c_, total = c_->consumed] {
            w->SendControl(keep.get(), ControlType::kCredit, total);
          });
        }
        return n;
      }
      if (c_->peer_fin && c_->next_read_seq >= c_->peer_fin_count) {
        return absl::UnavailableError(StrCat(c_->peer, ": peer closed the connection"));
      }
      if (!c_->failure.ok()) return c_->failure;
      if (deadline.passed()) {
        return absl::DeadlineExceededError(StrCat(c_->peer, ": nothing received for ", timeout.count(), " ms"));
      }
      c_->cv.WaitUntil(lock, deadline);
    }
  }

  void Shutdown() override {
    MutexLock lock(c_->mu);
    if (c_->shut) return;
    c_->shut = true;
    c_->cv.NotifyAll();
    if (c_->fin_sent || !c_->failure.ok()) return;
    c_->fin_sent = true;
    worker_->Post([w = worker_.get(), keep = c_, count = c_->next_send_seq] {
      w->SendControl(keep.get(), ControlType::kFin, count);
    });
  }

  std::string peer() const override { return c_->peer; }

  std::string transports() const override {
    MutexLock lock(c_->mu);
    return c_->transports;
  }

  bool takes_rows_from(int device) const override { return device < 0 || worker_->cuda_memory(); }

  Status WriteReport(std::string_view frame, const DevicePayload& rows, milliseconds timeout) override {
    if (!takes_rows_from(rows.device)) {
      return absl::UnimplementedError(StrCat(c_->peer, ": this UCX has no CUDA memory transports (rows on cuda:",
                                             rows.device, " go another way)"));
    }
    if (sizeof(RowsHeader) + frame.size() > worker_->max_am_header()) {
      return absl::OutOfRangeError(StrCat(c_->peer, ": a report header of ", frame.size(),
                                          " bytes is more than UCX takes beside rows (", worker_->max_am_header(),
                                          ")"));
    }
    if (rows.count > kMaxDetections || (rows.count > 0 && rows.device_rows == nullptr)) {
      return absl::InvalidArgumentError(StrCat(c_->peer, ": ", rows.count, " rows at ", rows.device_rows));
    }
    if (rows.device >= 0) VIGIL_RETURN_IF_ERROR(device_memory::WaitReady(rows.ready_event));
    const auto deadline = Deadline::After(timeout);
    auto m = std::make_shared<Worker::PendingRows>();
    m->conn = c_.get();
    m->rows = rows.device_rows;
    m->row_bytes = rows.count * kRowBytes;
    m->device = rows.device;
    m->keepalive = rows.keepalive;
    RowsHeader h{0, rows.count, static_cast<uint32_t>(frame.size())};
    const uint64_t wire = frame.size() + m->row_bytes;
    MutexLock lock(c_->mu);
    for (;;) {
      if (c_->shut) return absl::UnavailableError(StrCat(c_->peer, ": connection shut down"));
      if (!c_->failure.ok()) return c_->failure;
      if (c_->peer_fin) return absl::UnavailableError(StrCat(c_->peer, ": peer closed the connection"));
      const uint64_t unconsumed = c_->sent_bytes - c_->peer_consumed;
      // All at once (a message is not split); a message larger than the whole window goes when it is empty.
      if (unconsumed == 0 || (c_->peer_window > unconsumed && c_->peer_window - unconsumed >= wire)) break;
      if (deadline.passed()) {
        return absl::DeadlineExceededError(
            StrCat(c_->peer, ": send blocked for ", timeout.count(), " ms (the peer is not reading)"));
      }
      c_->cv.WaitUntil(lock, deadline);
    }
    h.seq = c_->next_send_seq++;
    c_->sent_bytes += wire;
    m->header.assign(reinterpret_cast<const char*>(&h), sizeof h);
    m->header.append(frame);
    // Posted under the lock, as Write's: in sequence order, never after a FIN.
    worker_->Post([w = worker_.get(), keep = c_, m] { w->SendRows(m); });
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<Worker> worker_;
  const std::shared_ptr<ConnState> c_;
};

class UcxDialer final : public Dialer {
 public:
  UcxDialer(std::string host, uint16_t port, UcxOptions options)
      : host_(std::move(host)), port_(port), options_(std::move(options)) {}

  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    VIGIL_RETURN_IF_ERROR(ValidateOptions(options_));
    const auto deadline = Deadline::After(timeout);
    VIGIL_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host_, port_, false));
    StatusOr<std::shared_ptr<Worker>> started = Worker::Start(options_);
    if (!started.ok()) return Annotate(started.status(), StrCat("connect to ", target()));
    std::shared_ptr<Worker> worker = *std::move(started);
    std::string last_error = "no address";
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      sockaddr_storage addr{};
      std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
      auto conn = std::make_shared<ConnState>(worker.get(), FormatAddress(a->ai_addr, a->ai_addrlen), options_);
      Status st = worker->Call<Status>([&] { return worker->Connect(conn, addr); });
      if (!st.ok()) {
        last_error = StrCat(conn->peer, ": ", st.message());
        continue;
      }
      MutexLock lock(conn->mu);
      while (!conn->connected && conn->failure.ok() && conn->cv.WaitUntil(lock, deadline)) {
      }
      if (conn->connected && conn->failure.ok()) {
        lock.Unlock();
        return std::unique_ptr<Connection>(new UcxConnection(std::move(worker), std::move(conn)));
      }
      last_error = conn->failure.ok() ? StrCat(conn->peer, ": no answer within ", timeout.count(), " ms")
                                      : std::string(conn->failure.message());
      lock.Unlock();
      worker->Post([w = worker.get(), conn] { w->BeginClose(conn, /*force=*/true); });
      if (deadline.passed()) break;
    }
    return absl::UnavailableError(StrCat("connect to ", target(), ": ", last_error));
  }

  std::string target() const override { return StrCat("ucx://", host_, ":", port_); }

 private:
  const std::string host_;
  const uint16_t port_;
  const UcxOptions options_;
};

}  // namespace

std::unique_ptr<Connection> MakeConnection(std::shared_ptr<Worker> worker, std::shared_ptr<ConnState> conn) {
  return std::unique_ptr<Connection>(new UcxConnection(std::move(worker), std::move(conn)));
}

}  // namespace ucx

std::unique_ptr<Dialer> MakeUcxDialer(std::string host, uint16_t port, UcxOptions options) {
  return std::make_unique<ucx::UcxDialer>(std::move(host), port, std::move(options));
}

}  // namespace vigil::transport
