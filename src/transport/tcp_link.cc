// The TCP Link (link.h): protocol frames over a Connection made by a Dialer.
#include <mutex>
#include <vector>

#include "vigil/transport/link.h"

namespace vigil::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kReadBufferBytes = 64 << 10;

milliseconds Left(Clock::time_point deadline) {
  return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

// The report header of `m` stamped with the session's edge id and epoch, without its detection rows.
class TcpLink final : public Link {
 public:
  explicit TcpLink(std::shared_ptr<Dialer> dialer) : dialer_(std::move(dialer)) {}
  ~TcpLink() override { Close(); }

  std::string_view kind() const override { return "tcp"; }
  std::string target() const override { return dialer_->target(); }

  StatusOr<Welcome> Open(const Hello& hello, milliseconds timeout) override {
    Close();
    VIGIL_RETURN_IF_ERROR(ValidateHello(hello));
    const auto deadline = Clock::now() + timeout;
    StatusOr<std::unique_ptr<Connection>> dialed = dialer_->Dial(timeout);
    if (!dialed.ok()) return Annotate(dialed.status(), target());
    std::shared_ptr<Connection> conn = std::move(*dialed);
    {
      std::lock_guard lock(mu_);
      conn_ = conn;
      epoch_ = 0;
      edge_ = hello.edge;
    }
    decoder_ = FrameDecoder();
    StatusOr<Welcome> welcome = Handshake(*conn, hello, deadline);
    std::lock_guard lock(mu_);
    if (!welcome.ok() || conn_ != conn) {  // failed, or Close ran meanwhile
      conn->Shutdown();
      if (conn_ == conn) conn_.reset();
      if (welcome.ok()) return absl::UnavailableError(StrCat(target(), ": link closed during the handshake"));
      return welcome.status();
    }
    epoch_ = welcome->epoch;
    return welcome;
  }

  Status Send(std::span<const OutboxMessage* const> messages, milliseconds timeout) override {
    std::shared_ptr<Connection> conn;
    std::string edge;
    uint64_t epoch = 0;
    {
      std::lock_guard lock(mu_);
      conn = conn_;
      edge = edge_;
      epoch = epoch_;
    }
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    // Encode the whole batch first: a payload that fails to download leaves nothing of it sent.
    out_.clear();
    for (const OutboxMessage* m : messages) {
      if (!m->device || m->device->count == 0) {
        AppendReportFrame(m->report, edge, epoch, m->report.detections, &out_);
        continue;
      }
      // The message carries no host rows: check the downloaded ones on a copy of its header (rows that do
      // not validate would make the aggregator drop the whole session).
      Report checked = m->report;
      checked.detections.swap(staging_);  // reuse the staging buffer's capacity
      checked.detections.resize(m->device->count);
      Status st = m->device->download(checked.detections.data());
      if (st.ok()) st = ValidateReportFields(checked);
      if (st.ok()) AppendReportFrame(checked, edge, epoch, checked.detections, &out_);
      checked.detections.swap(staging_);
      if (!st.ok()) {
        return absl::InternalError(StrCat("message ", m->id, " (", m->report.stream, " seq ", m->report.seq_first,
                                          "): device rows on cuda:", m->device->device, ": ", st.message()));
      }
    }
    return conn->Write(out_, timeout);
  }

  Status SendHeartbeat(int64_t sent_ns, milliseconds timeout) override {
    std::shared_ptr<Connection> conn = current();
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    return conn->Write(EncodeFrame(Heartbeat{sent_ns}), timeout);
  }

  StatusOr<std::optional<Message>> Receive(milliseconds timeout) override {
    std::shared_ptr<Connection> conn = current();
    if (!conn) return absl::UnavailableError(StrCat(target(), ": no open session"));
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      StatusOr<std::optional<Message>> m = decoder_.Next();
      if (!m.ok()) return Annotate(m.status(), StrCat(target(), ": from the aggregator"));
      if (m->has_value()) {
        const Message& msg = **m;
        if (!std::holds_alternative<Ack>(msg) && !std::holds_alternative<Reject>(msg) &&
            !std::holds_alternative<Heartbeat>(msg)) {
          return absl::InvalidArgumentError(
              StrCat(target(), ": the aggregator sent a message type it may not send in a session (",
                     msg.index() == 0 ? "Hello" : msg.index() == 1 ? "Welcome" : "Report", ")"));
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
    std::lock_guard lock(mu_);
    if (conn_) conn_->Shutdown();
    conn_.reset();
  }

 private:
  std::shared_ptr<Connection> current() const {
    std::lock_guard lock(mu_);
    return conn_;
  }

  // Sends `hello` and waits for its answer until `deadline`.
  StatusOr<Welcome> Handshake(Connection& conn, const Hello& hello, Clock::time_point deadline) {
    Status st = conn.Write(EncodeFrame(hello), Left(deadline));
    if (!st.ok()) return absl::UnavailableError(StrCat(target(), ": sending Hello: ", st.message()));
    for (;;) {
      StatusOr<std::optional<Message>> m = decoder_.Next();
      if (!m.ok()) {
        return absl::UnavailableError(StrCat(target(), ": the answer to Hello does not decode: ", m.status().message()));
      }
      if (!m->has_value()) {
        StatusOr<size_t> n = conn.Read(buf_.data(), buf_.size(), Left(deadline));
        if (!n.ok()) return absl::UnavailableError(StrCat(target(), ": waiting for Welcome: ", n.status().message()));
        decoder_.Feed(std::string_view(buf_.data(), *n));
        continue;
      }
      Message& msg = **m;
      if (Welcome* w = std::get_if<Welcome>(&msg)) return std::move(*w);
      if (const Reject* r = std::get_if<Reject>(&msg)) {
        const std::string what = StrCat(target(), ": the aggregator refused the Hello of edge '", hello.edge,
                                        "' epoch ", hello.epoch, " (", ToString(r->reason), ", its epoch ", r->epoch,
                                        "): ", r->detail);
        if (r->reason == RejectReason::kFenced) return absl::PermissionDeniedError(what);
        return absl::FailedPreconditionError(what);
      }
      if (std::holds_alternative<Heartbeat>(msg)) continue;  // an echo; harmless
      return absl::UnavailableError(StrCat(target(), ": the aggregator answered Hello with neither Welcome nor Reject"));
    }
  }

  const std::shared_ptr<Dialer> dialer_;
  mutable std::mutex mu_;
  std::shared_ptr<Connection> conn_;  // GUARDED_BY(mu_) the session's connection; null when none
  std::string edge_;                  // GUARDED_BY(mu_) from the session's Hello
  uint64_t epoch_ = 0;                // GUARDED_BY(mu_) from the session's Welcome
  // Used by the Receive (and Open) thread only:
  FrameDecoder decoder_;
  std::vector<char> buf_ = std::vector<char>(kReadBufferBytes);
  // Used by the Send thread only:
  std::string out_;
  std::vector<ReportDetection> staging_;  // device rows downloaded for encoding
};

}  // namespace

std::unique_ptr<Link> MakeTcpLink(std::shared_ptr<Dialer> dialer) { return std::make_unique<TcpLink>(std::move(dialer)); }

}  // namespace vigil::transport
