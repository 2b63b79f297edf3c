// The framed Link (link.h): protocol frames over a Connection made by a Dialer (TCP, TLS, UCX).
#include <absl/strings/match.h>

#include <algorithm>
#include <vector>

#include "ring_writer.h"
#include "vigil/common/deadline.h"
#include "vigil/common/mutex.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/link.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;

constexpr size_t kReadBufferBytes = 64 << 10;

milliseconds Left(Deadline deadline) {
  return std::chrono::duration_cast<milliseconds>(deadline.left());
}

class FramedLink final : public Link {
 public:
  FramedLink(std::shared_ptr<Dialer> dialer, LinkOptions options)
      : dialer_(std::move(dialer)), opt_(std::move(options)) {}
  ~FramedLink() override { Close(); }

  std::string_view kind() const override { return opt_.kind; }
  std::string target() const override { return dialer_->target(); }
  std::string transports() const override {
    MutexLock lock(mu_);
    if (ring_) return ring_->transports();
    return conn_ ? conn_->transports() : std::string();
  }

  StatusOr<Welcome> Open(const Hello& hello_in, milliseconds timeout) override {
    Close();
    Hello hello = hello_in;
    hello.nonce = RandomNonce();
    VIGIL_RETURN_IF_ERROR(ValidateHello(hello));
    const auto deadline = Deadline::After(timeout);
    StatusOr<std::unique_ptr<Connection>> dialed = dialer_->Dial(timeout);
    if (!dialed.ok()) return Annotate(dialed.status(), target());
    std::shared_ptr<Connection> conn = std::move(*dialed);
    {
      MutexLock lock(mu_);
      conn_ = conn;
      epoch_ = 0;
      link_seq_ = 0;
      edge_ = hello.edge;
    }
    decoder_ = FrameDecoder();
    std::shared_ptr<RingWriter> ring;
    StatusOr<Welcome> welcome = Handshake(*conn, hello, deadline, &ring);
    MutexLock lock(mu_);
    if (!welcome.ok() || conn_ != conn) {  // failed, or Close ran meanwhile
      conn->Shutdown();
      if (conn_ == conn) conn_.reset();
      if (welcome.ok()) return absl::UnavailableError(StrCat(target(), ": link closed during the handshake"));
      return welcome.status();
    }
    epoch_ = welcome->epoch;
    ring_ = std::move(ring);
    return welcome;
  }

  Status Send(std::span<const OutboxMessage* const> messages, milliseconds timeout) override {
    std::shared_ptr<Connection> conn;
    std::string edge;
    uint64_t epoch = 0, link_seq = 0;
    {
      MutexLock lock(mu_);
      conn = conn_;
      edge = edge_;
      epoch = epoch_;
      link_seq = link_seq_;
    }
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    if (std::shared_ptr<RingWriter> ring = current_ring()) {
      uint64_t seq = link_seq;
      Status st = ring->Write(messages, edge, epoch, &seq, Deadline::After(timeout));
      MutexLock lock(mu_);
      if (conn_ == conn) link_seq_ = seq;
      return st;
    }
    const auto deadline = Deadline::After(timeout);
    // Rows a connection sends from where they live (ucx with CUDA transports): the frames before them go
    // first, then the rows' own message; the numbers are taken, so a failure ends the session (as a failed
    // write does: the next one starts again from 0).
    if (std::any_of(messages.begin(), messages.end(), [&](const OutboxMessage* m) {
          return m->device && m->device->count > 0 && conn->takes_rows_from(m->device->device);
        })) {
      return SendRowsApart(*conn, messages, edge, epoch, link_seq, deadline);
    }
    // Encode the whole batch first: a payload that fails to download leaves nothing of it sent (and
    // takes no link_seq).
    out_.clear();
    uint64_t next_seq = link_seq;
    for (const OutboxMessage* m : messages) {
      if (!m->device || m->device->count == 0 || !m->report.detections.empty()) {  // host rows (or a host copy)
        AppendReportFrame(m->report, edge, epoch, next_seq++, m->report.detections, &out_);
        continue;
      }
      // The message carries no host rows: check the downloaded ones on a copy of its header (rows that do
      // not validate would make the aggregator drop the whole session).
      Report checked = m->report;
      checked.detections.swap(staging_);  // reuse the staging buffer's capacity
      checked.detections.resize(m->device->count);
      Status st = m->device->download(checked.detections.data());
      if (st.ok()) st = ValidateReportFields(checked);
      if (st.ok()) AppendReportFrame(checked, edge, epoch, next_seq++, checked.detections, &out_);
      checked.detections.swap(staging_);
      if (!st.ok()) return DownloadFailed(*m, st);
    }
    // The numbers are taken whatever the write does: a failed write ends the session, and the next one
    // starts again from 0.
    {
      MutexLock lock(mu_);
      if (conn_ == conn) link_seq_ = next_seq;
    }
    return conn->Write(out_, Left(deadline));
  }

  Status SendHeartbeat(int64_t sent_ns, milliseconds timeout) override {
    std::shared_ptr<Connection> conn = current();
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    return conn->Write(EncodeFrame(Heartbeat{sent_ns}), timeout);
  }

  Status SendAside(const Message& m, milliseconds timeout) override {
    std::shared_ptr<Connection> conn = current();
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    return conn->Write(EncodeFrame(m), timeout);
  }

  StatusOr<std::optional<Message>> Receive(milliseconds timeout) override {
    std::shared_ptr<Connection> conn = current();
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    const auto deadline = Deadline::After(timeout);
    for (;;) {
      StatusOr<std::optional<Message>> m = decoder_.Next();
      if (!m.ok()) return Annotate(m.status(), StrCat(target(), ": from the aggregator"));
      if (m->has_value()) {
        const Message& msg = **m;
        if (!std::holds_alternative<Ack>(msg) && !std::holds_alternative<Reject>(msg) &&
            !std::holds_alternative<Heartbeat>(msg)) {
          return absl::InvalidArgumentError(StrCat(
              target(), ": the aggregator sent a message type it may not send in a session (", MessageName(msg), ")"));
        }
        return m;
      }
      StatusOr<size_t> n = conn->Read(buf_.data(), buf_.size(), Left(deadline));
      if (!n.ok()) {
        if (n.status().code() == absl::StatusCode::kDeadlineExceeded) return std::optional<Message>();
        return n.status();
      }
      decoder_.Feed(std::string_view(buf_.data(), *n));
    }
  }

  void Close() override {
    MutexLock lock(mu_);
    if (conn_) conn_->Shutdown();
    conn_.reset();
    if (ring_) ring_->Abort();  // a Send in progress holds it; the last holder unmaps
    ring_.reset();
  }

 private:
  std::shared_ptr<Connection> current() const {
    MutexLock lock(mu_);
    return conn_;
  }
  std::shared_ptr<RingWriter> current_ring() const {
    MutexLock lock(mu_);
    return ring_;
  }

  static Status DownloadFailed(const OutboxMessage& m, const Status& st) {
    return absl::InternalError(StrCat("message ", m.id, " (", m.report.stream, " seq ", m.report.seq_first,
                                      "): device rows on cuda:", m.device->device, ": ", st.message()));
  }

  // Send for a batch with rows that `conn` takes from where they live (Connection::WriteReport).
  Status SendRowsApart(Connection& conn, std::span<const OutboxMessage* const> messages, const std::string& edge,
                       uint64_t epoch, uint64_t link_seq, Deadline deadline) {
    uint64_t next_seq = link_seq;
    auto take_numbers = [&] {
      MutexLock lock(mu_);
      if (conn_.get() == &conn) link_seq_ = next_seq;
    };
    out_.clear();
    for (const OutboxMessage* m : messages) {
      const bool apart = m->device && m->device->count > 0 && conn.takes_rows_from(m->device->device);
      if (apart) {
        std::string frame;
        AppendReportFrame(m->report, edge, epoch, next_seq, {}, &frame);  // the header; the rows go beside it
        Status st = absl::OkStatus();
        if (!out_.empty()) st = conn.Write(out_, Left(deadline));
        out_.clear();
        if (st.ok()) st = conn.WriteReport(frame, *m->device, Left(deadline));
        if (st.ok()) {
          ++next_seq;
          continue;
        }
        if (st.code() != absl::StatusCode::kOutOfRange) {
          take_numbers();
          return st;
        }
        // Too large a header to go beside the rows: this one goes downloaded, as on any link.
      }
      if (!m->device || m->device->count == 0 || !m->report.detections.empty()) {  // host rows (or a host copy)
        AppendReportFrame(m->report, edge, epoch, next_seq++, m->report.detections, &out_);
        continue;
      }
      Report checked = m->report;
      checked.detections.resize(m->device->count);
      Status st = m->device->download(checked.detections.data());
      if (st.ok()) st = ValidateReportFields(checked);
      if (!st.ok()) {
        take_numbers();
        return DownloadFailed(*m, st);
      }
      AppendReportFrame(checked, edge, epoch, next_seq++, checked.detections, &out_);
    }
    take_numbers();
    if (out_.empty()) return absl::OkStatus();
    return conn.Write(out_, Left(deadline));
  }

  // cuda_ipc: the aggregator's RingOffer (after Auth, before the Welcome): maps it and answers RingAccept.
  StatusOr<std::shared_ptr<RingWriter>> OpenRing(Connection& conn, const RingOffer& offer, Deadline deadline) {
    StatusOr<std::unique_ptr<RingWriter>> w = RingWriter::Open(offer, opt_.ring_device, opt_.ring_linger_us);
    if (!w.ok()) return absl::UnavailableError(StrCat(target(), ": ", w.status().message()));
    Status st = conn.Write(EncodeFrame(RingAccept{}), Left(deadline));
    if (!st.ok()) return absl::UnavailableError(StrCat(target(), ": sending RingAccept: ", st.message()));
    return std::shared_ptr<RingWriter>(std::move(*w));
  }

  // The next message of the handshake, waiting until `deadline`; `what` names what we wait for.
  StatusOr<Message> HandshakeMessage(Connection& conn, Deadline deadline, std::string_view what) {
    for (;;) {
      StatusOr<std::optional<Message>> m = decoder_.Next();
      if (!m.ok()) {
        return absl::UnavailableError(StrCat(target(), ": waiting for ", what, ": ", m.status().message()));
      }
      if (m->has_value()) {
        if (std::holds_alternative<Heartbeat>(**m)) continue;  // an echo; harmless
        return std::move(**m);
      }
      StatusOr<size_t> n = conn.Read(buf_.data(), buf_.size(), Left(deadline));
      if (!n.ok()) return absl::UnavailableError(StrCat(target(), ": waiting for ", what, ": ", n.status().message()));
      decoder_.Feed(std::string_view(buf_.data(), *n));
    }
  }

  // The aggregator's Reject of our Hello as a status: kUnauthenticated → Unauthenticated, kFenced →
  // PermissionDenied, anything else → FailedPrecondition.
  Status Refused(const Hello& hello, const Reject& r) const {
    const std::string what = StrCat(target(), ": the aggregator refused the Hello of edge '", hello.edge, "' epoch ",
                                    hello.epoch, " (", ToString(r.reason), ", its epoch ", r.epoch, "): ", r.detail);
    if (r.reason == RejectReason::kFenced) return absl::PermissionDeniedError(what);
    if (r.reason == RejectReason::kUnauthenticated) {
      return absl::UnauthenticatedError(
          StrCat(what, opt_.key.empty() ? " (this edge has no key: set transport.key_file or VIGIL_EDGE_KEY)"
                                        : " (check that the aggregator's keys_file has this edge's key)"));
    }
    return absl::FailedPreconditionError(what);
  }

  // Hello → Challenge → Auth → (cuda_ipc: RingOffer → RingAccept) → Welcome or Reject, until `deadline`.
  StatusOr<Welcome> Handshake(Connection& conn, const Hello& hello, Deadline deadline,
                              std::shared_ptr<RingWriter>* ring) {
    Status st = conn.Write(EncodeFrame(hello), Left(deadline));
    if (!st.ok()) return absl::UnavailableError(StrCat(target(), ": sending Hello: ", st.message()));
    StatusOr<Message> first = HandshakeMessage(conn, deadline, "Challenge");
    if (!first.ok() && absl::StrContains(first.status().message(), "peer closed")) {
      // An aggregator closes a connection from outside its allow-list without a word.
      return absl::UnavailableError(StrCat(first.status().message(),
                                           " (closed before any answer: is this address in the aggregator's allow?)"));
    }
    VIGIL_ASSIGN_OR_RETURN(Message m, std::move(first));
    if (const Reject* r = std::get_if<Reject>(&m)) return Refused(hello, *r);
    const Challenge* c = std::get_if<Challenge>(&m);
    if (c == nullptr) {
      return absl::UnavailableError(
          StrCat(target(), ": the aggregator answered Hello with ", MessageName(m), ", not Challenge"));
    }
    Auth auth;
    if (!opt_.key.empty()) {
      // Mutual: an aggregator that cannot prove it knows our key gets nothing more from us.
      if (c->proof.empty()) {
        return absl::UnauthenticatedError(
            StrCat(target(), ": the aggregator did not authenticate itself (it runs without keys); this edge has a "
                             "key and reports only to an aggregator that proves it knows it"));
      }
      if (!ProofMatches(AggregatorProof(opt_.key, hello, c->nonce), c->proof)) {
        return absl::UnauthenticatedError(
            StrCat(target(), ": the aggregator's proof does not match this edge's key: its keys_file has another key "
                             "for edge '",
                   hello.edge, "', or none (then add this edge's key there), or this is not the aggregator"));
      }
      auth.proof = EdgeProof(opt_.key, hello, c->nonce);
    }
    st = conn.Write(EncodeFrame(auth), Left(deadline));
    if (!st.ok()) return absl::UnavailableError(StrCat(target(), ": sending Auth: ", st.message()));
    VIGIL_ASSIGN_OR_RETURN(m, HandshakeMessage(conn, deadline, opt_.kind == "cuda_ipc" ? "RingOffer" : "Welcome"));
    if (const RingOffer* offer = std::get_if<RingOffer>(&m)) {
      if (opt_.kind != "cuda_ipc") {
        return absl::UnavailableError(StrCat(target(), ": the aggregator offered a ring on a ", opt_.kind, " link"));
      }
      VIGIL_ASSIGN_OR_RETURN(*ring, OpenRing(conn, *offer, deadline));  // failing: we hang up, nothing granted
      VIGIL_ASSIGN_OR_RETURN(m, HandshakeMessage(conn, deadline, "Welcome"));
    } else if (opt_.kind == "cuda_ipc" && std::holds_alternative<Welcome>(m)) {
      return absl::UnavailableError(
          StrCat(target(), ": the aggregator admitted the session without offering a ring (not a cuda_ipc listener?)"));
    }
    if (Welcome* w = std::get_if<Welcome>(&m)) return std::move(*w);
    if (const Reject* r = std::get_if<Reject>(&m)) return Refused(hello, *r);
    return absl::UnavailableError(
        StrCat(target(), ": the aggregator answered Auth with ", MessageName(m), ", neither Welcome nor Reject"));
  }

  const std::shared_ptr<Dialer> dialer_;
  const LinkOptions opt_;
  mutable Mutex mu_;
  std::shared_ptr<Connection> conn_ VIGIL_GUARDED_BY(mu_);  // the session's connection; null when none
  std::shared_ptr<RingWriter> ring_ VIGIL_GUARDED_BY(mu_);  // cuda_ipc: the session's ring; null otherwise
  std::string edge_ VIGIL_GUARDED_BY(mu_);                  // from the session's Hello
  uint64_t epoch_ VIGIL_GUARDED_BY(mu_) = 0;                // from the session's Welcome
  uint64_t link_seq_ VIGIL_GUARDED_BY(mu_) = 0;             // the next Report's link_seq
  // Used by the Receive (and Open) thread only:
  FrameDecoder decoder_;
  std::vector<char> buf_ = std::vector<char>(kReadBufferBytes);
  // Used by the Send thread only:
  std::string out_;
  std::vector<ReportDetection> staging_;  // device rows downloaded for encoding
};

}  // namespace

std::unique_ptr<Link> MakeFramedLink(std::shared_ptr<Dialer> dialer, LinkOptions options) {
  return std::make_unique<FramedLink>(std::move(dialer), std::move(options));
}

}  // namespace vigil::transport
