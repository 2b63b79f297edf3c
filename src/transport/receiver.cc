#include "vigil/common/deadline.h"
#include "vigil/transport/receiver.h"

#include <absl/strings/match.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <vector>

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kAcceptPoll{100};  // how often the accept thread checks for Stop and reaps threads
constexpr size_t kReadBufferBytes = 64 << 10;
constexpr size_t kMaxWriteBytes = 1 << 20;  // queued frames coalesced into one write, at most

}  // namespace

// ---- Session ----------------------------------------------------------------------------------------

Session::Session(uint64_t id, std::shared_ptr<Connection> conn, Hello hello, size_t max_send_queue_bytes,
                 std::string link)
    : id_(id),
      conn_(std::move(conn)),
      hello_(std::move(hello)),
      max_queue_bytes_(max_send_queue_bytes),
      link_(std::move(link)) {}

uint64_t Session::epoch() const {
  MutexLock lock(mu_);
  return epoch_;
}

void Session::Admit(const Welcome& welcome) {
  MutexLock lock(mu_);
  if (epoch_ != 0 || closed_ || closing_ || welcome.epoch == 0) return;
  epoch_ = welcome.epoch;
  std::string frame = EncodeFrame(welcome);
  queue_bytes_ += frame.size();
  queue_.push_back(std::move(frame));
  cv_.NotifyAll();
}

void Session::Refuse(RejectReason reason, uint64_t epoch, std::string detail) {
  MutexLock lock(mu_);
  if (closed_ || closing_) return;
  std::string frame = EncodeFrame(Reject{reason, "", 0, 0, 0, epoch, std::move(detail)});
  queue_bytes_ += frame.size();
  queue_.push_back(std::move(frame));
  closing_ = true;
  cv_.NotifyAll();
}

bool Session::Enqueue(std::string frames) {
  MutexLock lock(mu_);
  if (closed_ || closing_) return false;
  if (queue_bytes_ + frames.size() > max_queue_bytes_) {
    spdlog::warn("receiver: edge {} ({}): {} bytes queued and not written, over the limit of {}: closing the session",
                 hello_.edge, conn_->peer(), queue_bytes_ + frames.size(), max_queue_bytes_);
    closed_ = true;
    conn_->Shutdown();
    cv_.NotifyAll();
    return false;
  }
  queue_bytes_ += frames.size();
  queue_.push_back(std::move(frames));
  cv_.NotifyAll();
  return true;
}

void Session::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  conn_->Shutdown();
  cv_.NotifyAll();
}

bool Session::closed() const {
  MutexLock lock(mu_);
  return closed_ || closing_;
}

void Session::Supersede() {
  MutexLock lock(mu_);
  superseded_ = true;
  closed_ = true;
  conn_->Shutdown();
  cv_.NotifyAll();
}

bool Session::superseded() const {
  MutexLock lock(mu_);
  return superseded_;
}

void Session::WriterLoop(milliseconds write_timeout) {
  std::string batch;
  for (;;) {
    {
      MutexLock lock(mu_);
      while (!closed_ && queue_.empty() && !closing_) cv_.Wait(lock);
      if (closed_) return;
      if (queue_.empty()) {  // closing_ and everything written: the Reject went out
        closed_ = true;
        conn_->Shutdown();
        return;
      }
      batch.clear();
      while (!queue_.empty() && (batch.empty() || batch.size() + queue_.front().size() <= kMaxWriteBytes)) {
        batch += queue_.front();
        queue_bytes_ -= queue_.front().size();
        queue_.pop_front();
      }
    }
    Status st = conn_->Write(batch, write_timeout);  // not under mu_: Enqueue never waits on the socket
    if (!st.ok()) {
      if (st.code() == absl::StatusCode::kDeadlineExceeded) {
        spdlog::warn("receiver: edge {}: closing the session: {}", hello_.edge, std::string(st.message()));
      }
      Close();
      return;
    }
  }
}

// ---- Receiver ---------------------------------------------------------------------------------------

struct Receiver::Impl {
  struct Conn {
    std::shared_ptr<Connection> conn;
    std::thread thread;
    bool finished = false;
  };

  ReceiverOptions opt;
  ReceiverHandler* handler = nullptr;
  std::unique_ptr<Listener> listener;
  std::thread acceptor;
  std::atomic<bool> stop{false};
  mutable Mutex mu;
  std::map<uint64_t, Conn> conns VIGIL_GUARDED_BY(mu);
  uint64_t next_id VIGIL_GUARDED_BY(mu) = 1;
  ReceiverStats stats VIGIL_GUARDED_BY(mu);

  void AcceptLoop() {
    while (!stop.load()) {
      StatusOr<std::unique_ptr<Connection>> c = listener->Accept(kAcceptPoll);
      ReapFinished();
      if (!c.ok()) {
        if (c.status().code() == absl::StatusCode::kPermissionDenied) {  // a Unix-socket peer's uid
          spdlog::warn("receiver {}: refusing {}", listener->address(), std::string(c.status().message()));
          MutexLock lock(mu);
          ++stats.rejected[kRejectPeerCredentials];
          continue;
        }
        if (c.status().code() != absl::StatusCode::kDeadlineExceeded) {
          spdlog::warn("receiver {}: {}", listener->address(), std::string(c.status().message()));
          std::this_thread::sleep_for(kAcceptPoll);  // e.g. out of file descriptors: do not spin
        }
        continue;
      }
      std::shared_ptr<Connection> conn = std::move(*c);
      if (opt.allow && !opt.allow->Allows(conn->peer())) {
        // Nothing is sent: a peer that may not connect learns nothing, not even the protocol.
        spdlog::warn("receiver {}: refusing {}: not in the allow-list", listener->address(), conn->peer());
        conn->Shutdown();
        MutexLock lock(mu);
        ++stats.rejected[kRejectAddress];
        continue;
      }
      MutexLock lock(mu);
      if (stats.active >= static_cast<uint64_t>(opt.max_connections)) {
        ++stats.refused;
        spdlog::warn("receiver {}: refusing {}: {} connections open", listener->address(), conn->peer(), stats.active);
        // A fresh socket's send buffer takes this small frame at once: no wait under mu.
        (void)conn->Write(EncodeFrame(Reject{RejectReason::kProtocolError, "", 0, 0, 0, 0, "too many connections"}),
                          milliseconds(0));
        continue;  // closed by the destructor
      }
      ++stats.accepted;
      ++stats.active;
      const uint64_t id = next_id++;
      Conn& slot = conns[id];
      slot.conn = conn;
      slot.thread = std::thread([this, id, conn] { Serve(id, conn); });
    }
  }

  void ReapFinished() {
    std::vector<std::thread> done;
    {
      MutexLock lock(mu);
      for (auto it = conns.begin(); it != conns.end();) {
        if (it->second.finished) {
          done.push_back(std::move(it->second.thread));
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (std::thread& t : done) t.join();
  }

  void Serve(uint64_t id, const std::shared_ptr<Connection>& conn) {
    std::shared_ptr<Session> session;
    std::thread writer;
    const Status why = ServeFrames(id, conn, &session, &writer);
    if (session) {
      if (!session->closed()) session->Close();  // a Refuse in progress still writes its Reject
      writer.join();
    }
    conn->Shutdown();
    if (session) handler->OnClose(session, why);
    MutexLock lock(mu);
    --stats.active;
    if (auto it = conns.find(id); it != conns.end()) it->second.finished = true;  // absent once Stop took over
  }

  // Creates the session of an authenticated connection, starts its writer thread and hands the Hello to the
  // handler.
  template <typename Violation>
  Status BeginSession(uint64_t id, const std::shared_ptr<Connection>& conn, Hello hello,
                      std::shared_ptr<Session>* session, std::thread* writer, Violation& violation) {
    *session = std::make_shared<Session>(id, conn, std::move(hello), opt.max_send_queue_bytes,
                                         std::string(listener->kind()));
    Session* s = session->get();
    *writer = std::thread([s, timeout = opt.write_timeout] { s->WriterLoop(timeout); });
    Status st = handler->OnHello(*session);
    if (!st.ok()) return violation(RejectReason::kProtocolError, st);
    return absl::OkStatus();
  }

  // Refuses a connection before its session began: counted under `reason`, logged with the peer, answered
  // Reject(`wire_reason`, `wire_detail`) — which says no more than the peer may know.
  Status RefuseEarly(Connection& conn, const char* reason, RejectReason wire_reason, std::string_view wire_detail,
                     const Status& why) {
    spdlog::warn("receiver {}: {}: refused ({}): {}", listener->kind(), conn.peer(), reason, std::string(why.message()));
    (void)conn.Write(EncodeFrame(Reject{wire_reason, "", 0, 0, 0, 0, std::string(wire_detail)}), opt.write_timeout);
    MutexLock lock(mu);
    ++stats.rejected[reason];
    return why;
  }

  // Reads and dispatches frames until the connection ends; returns why it ended. Runs the handshake
  // (Hello → Challenge → Auth), then starts the session's writer thread (`writer`).
  Status ServeFrames(uint64_t id, const std::shared_ptr<Connection>& conn, std::shared_ptr<Session>* session,
                     std::thread* writer) {
    // Bytes through the decoder, or — a connection that decodes itself (a cuda_ipc ring) — its messages.
    const bool decodes = conn->decodes();
    FrameDecoder decoder;
    std::string buf(decodes ? 0 : kReadBufferBytes, '\0');
    std::deque<StatusOr<Message>> ready;
    auto next_message = [&]() -> StatusOr<std::optional<Message>> {
      if (!decodes) return decoder.Next();
      if (ready.empty()) return std::optional<Message>();
      StatusOr<Message> m = std::move(ready.front());
      ready.pop_front();
      if (!m.ok()) return m.status();
      return std::optional<Message>(std::move(*m));
    };
    const auto handshake_deadline = Deadline::After(opt.handshake_timeout);
    std::optional<Hello> hello;   // received, waiting for Auth
    Nonce nonce{};                // ours, sent in the Challenge
    const std::string* key = nullptr;
    bool awaiting_ring = false;  // cuda_ipc: authenticated, ring offered, RingAccept not yet received
    uint64_t next_link_seq = 0;
    // A protocol violation after authentication: Reject (empty stream) and close this connection only.
    auto violation = [&](RejectReason reason, const Status& st) {
      spdlog::warn("receiver: {} (edge {}): closing the connection: {}", conn->peer(), (*session)->edge(),
                   std::string(st.message()));
      (*session)->Refuse(reason, (*session)->epoch(), std::string(st.message()));
      MutexLock lock(mu);
      ++stats.protocol_errors;
      return st;
    };
    for (;;) {
      milliseconds wait = opt.peer_timeout;
      if (!*session) {
          wait = std::min(wait, std::chrono::duration_cast<milliseconds>(handshake_deadline.left()));
      }
      StatusOr<size_t> n = decodes ? conn->ReadMessages(&ready, wait) : conn->Read(buf.data(), buf.size(), wait);
      if (!n.ok()) {
        if (n.status().code() == absl::StatusCode::kDeadlineExceeded) {
          if (!*session) {
            return RefuseEarly(*conn, kRejectHandshakeTimeout, RejectReason::kUnauthenticated, "authentication failed",
                               absl::DeadlineExceededError(StrCat("no authenticated Hello within ",
                                                                  opt.handshake_timeout.count(), " ms")));
          }
          MutexLock lock(mu);
          ++stats.timeouts;
        }
        if (!*session && awaiting_ring && !stop.load()) {
          // The edge could not map the ring (no GPU of that bus id, no peer access, no CUDA): it hung up.
          spdlog::warn("receiver {}: {}: edge '{}' did not take the ring offered: {}", listener->kind(), conn->peer(),
                       hello->edge.substr(0, 200), std::string(n.status().message()));
          MutexLock lock(mu);
          ++stats.rejected[kRejectRingRefused];
          return n.status();
        }
        if (!*session && hello && !stop.load() && n.status().code() == absl::StatusCode::kUnavailable) {
          // The edge left between our Challenge and its Auth: an edge checks our proof first, so this is
          // what a key mismatch (or an id we have no key for) looks like from here.
          const char* reason = opt.keys && key == nullptr ? kRejectUnknownEdge : kRejectChallengeRefused;
          spdlog::warn("receiver {}: {}: edge '{}' hung up after the Challenge ({}): {}", listener->kind(), conn->peer(),
                       hello->edge.substr(0, 200), reason,
                       key == nullptr && opt.keys ? "this aggregator has no key for that edge id in its keys_file"
                                                  : "it could not verify our proof: its key differs from the one in "
                                                    "our keys_file (or it is not a vigil edge)");
          MutexLock lock(mu);
          ++stats.rejected[reason];
          return n.status();
        }
        if (!*session && !stop.load() && absl::StrContains(n.status().message(), "tls handshake with")) {
          // A peer without a certificate we trust, or one that does not speak TLS.
          spdlog::warn("receiver {}: {}: refused (tls): {}", listener->kind(), conn->peer(),
                       std::string(n.status().message()));
          MutexLock lock(mu);
          ++stats.rejected[kRejectTls];
          return n.status();
        }
        if (!stop.load() && decoder.pending() > 0) {
          return absl::DataLossError(StrCat(n.status().message(), " (", decoder.pending(), " bytes of a frame lost)"));
        }
        return n.status();
      }
      {
        MutexLock lock(mu);
        stats.bytes += *n;
      }
      if (!decodes) decoder.Feed(std::string_view(buf.data(), *n));
      for (;;) {
        StatusOr<std::optional<Message>> m = next_message();
        if (!m.ok()) {
          const bool version = m.status().code() == absl::StatusCode::kUnimplemented;
          const RejectReason reason = version ? RejectReason::kUnsupportedVersion : RejectReason::kProtocolError;
          if (!*session) {
            return RefuseEarly(*conn, version ? kRejectVersion : kRejectMalformed, reason, std::string(m.status().message()),
                               m.status());
          }
          return violation(reason, m.status());
        }
        if (!m->has_value()) break;
        {
          MutexLock lock(mu);
          ++stats.frames;
        }
        Message& msg = **m;
        if (!*session && awaiting_ring) {
          if (std::holds_alternative<Heartbeat>(msg)) continue;
          if (!std::holds_alternative<RingAccept>(msg)) {
            return RefuseEarly(*conn, kRejectMalformed, RejectReason::kProtocolError, "expected RingAccept",
                               absl::InvalidArgumentError(StrCat("edge '", hello->edge.substr(0, 200), "': ",
                                                                 MessageName(msg), " instead of RingAccept")));
          }
          awaiting_ring = false;
          VIGIL_RETURN_IF_ERROR(BeginSession(id, conn, std::move(*hello), session, writer, violation));
          continue;
        }
        if (!*session) {
          // The handshake. Until a valid Auth the peer gets the Challenge and, at the end, one Reject.
          if (!hello) {
            Hello* h = std::get_if<Hello>(&msg);
            if (h == nullptr) {
              return RefuseEarly(*conn, kRejectMalformed, RejectReason::kProtocolError, "the first message must be Hello",
                                 absl::InvalidArgumentError(StrCat("the first message was ", MessageName(msg))));
            }
            if (h->protocol_version != kProtocolVersion) {
              const std::string why = StrCat("Hello: protocol version ", h->protocol_version,
                                             " not supported (this aggregator speaks ",
                                             static_cast<int>(kProtocolVersion), ")");
              return RefuseEarly(*conn, kRejectVersion, RejectReason::kUnsupportedVersion, why,
                                 absl::UnimplementedError(why));
            }
            hello = std::move(*h);
            nonce = RandomNonce();
            Challenge challenge{nonce, {}};
            if (opt.keys) {
              key = opt.keys->Find(hello->edge);
              // An unknown edge id gets a proof that matches nothing, so a prober cannot tell ids apart.
              if (key != nullptr) {
                challenge.proof = AggregatorProof(*key, *hello, nonce);
              } else {
                const Nonce noise = RandomNonce();
                challenge.proof.assign(reinterpret_cast<const char*>(noise.data()), noise.size());
              }
            }
            Status st = conn->Write(EncodeFrame(challenge), opt.write_timeout);
            if (!st.ok()) return st;
            continue;
          }
          const Auth* auth = std::get_if<Auth>(&msg);
          if (auth == nullptr) {
            return RefuseEarly(*conn, kRejectMalformed, RejectReason::kProtocolError, "expected Auth",
                               absl::InvalidArgumentError(StrCat("edge '", hello->edge, "': ", MessageName(msg),
                                                                 " instead of Auth")));
          }
          if (opt.keys) {
            const char* reason = nullptr;
            if (key == nullptr) {
              reason = kRejectUnknownEdge;
            } else if (auth->proof.empty()) {
              reason = kRejectNoProof;
            } else if (!ProofMatches(EdgeProof(*key, *hello, nonce), auth->proof)) {
              reason = kRejectBadProof;
            }
            if (reason != nullptr) {
              return RefuseEarly(*conn, reason, RejectReason::kUnauthenticated, "authentication failed",
                                 absl::UnauthenticatedError(StrCat("edge '", hello->edge.substr(0, 200),
                                                                   "' failed authentication")));
            }
          }
          {
            MutexLock lock(mu);
            ++stats.authenticated;
          }
          if (std::optional<Connection::SessionOffer> offer = conn->OfferSession()) {
            // cuda_ipc: the ring first; the session begins once the edge mapped it (RingAccept).
            if (!offer->ok) {
              // Counted before the edge can read the refusal, so whoever saw it also sees the count.
              spdlog::warn("receiver {}: {}: edge '{}': no ring could be offered; closing", listener->kind(),
                           conn->peer(), hello->edge.substr(0, 200));
              {
                MutexLock lock(mu);
                ++stats.rejected[kRejectRingUnavailable];
              }
              (void)conn->Write(offer->frames, opt.write_timeout);
              return absl::UnavailableError("no ring for this session");
            }
            Status st = conn->Write(offer->frames, opt.write_timeout);
            if (!st.ok()) return st;
            awaiting_ring = true;
            continue;
          }
          VIGIL_RETURN_IF_ERROR(BeginSession(id, conn, std::move(*hello), session, writer, violation));
        } else if (Report* r = std::get_if<Report>(&msg)) {
          Session& s = **session;
          const uint64_t epoch = s.epoch();
          if (epoch == 0) {
            return violation(RejectReason::kProtocolError,
                             absl::FailedPreconditionError("a report before the session was admitted (no Welcome yet)"));
          }
          if (r->edge != s.edge()) {
            return violation(RejectReason::kProtocolError,
                             absl::InvalidArgumentError(
                                 StrCat("a report from edge '", r->edge, "' on the connection of '", s.edge(), "'")));
          }
          if (r->link_seq < next_link_seq) {  // a repeated frame: its first copy was taken
            MutexLock lock(mu);
            ++stats.repeated_reports;
            continue;
          }
          if (r->link_seq > next_link_seq) {
            {
              MutexLock lock(mu);
              ++stats.sequence_gaps;
            }
            return violation(RejectReason::kProtocolError,
                             absl::DataLossError(StrCat("report link_seq ", r->link_seq, " where ", next_link_seq,
                                                        " was due: a report was lost or reordered on the link")));
          }
          ++next_link_seq;
          if (r->epoch != epoch) {
            {
              MutexLock lock(mu);
              ++stats.stale_reports;
            }
            (void)s.Enqueue(EncodeFrame(Reject{RejectReason::kStaleEpoch, r->stream, r->run, r->seq_first, r->seq_last,
                                               epoch,
                                               StrCat("report epoch ", r->epoch, " is not the session's ", epoch)}));
            continue;
          }
          handler->OnReport(*session, std::move(*r));
        } else if (std::holds_alternative<Heartbeat>(msg)) {
          (void)(*session)->Enqueue(EncodeFrame(msg));  // echo, also before admission
        } else if (Snapshot* snap = std::get_if<Snapshot>(&msg)) {
          if ((*session)->epoch() == 0) {
            return violation(RejectReason::kProtocolError,
                             absl::FailedPreconditionError("a snapshot before the session was admitted (no Welcome yet)"));
          }
          handler->OnSnapshot(*session, std::move(*snap));
        } else if (SourceStates* states = std::get_if<SourceStates>(&msg)) {
          if ((*session)->epoch() == 0) {
            return violation(RejectReason::kProtocolError,
                             absl::FailedPreconditionError("source states before the session was admitted (no Welcome yet)"));
          }
          handler->OnSourceStates(*session, std::move(*states));
        } else {
          return violation(RejectReason::kProtocolError,
                           absl::InvalidArgumentError(StrCat("an edge may not send ", MessageName(msg),
                                                             " in a session (only Report, Snapshot, SourceStates and Heartbeat)")));
        }
      }
    }
  }
};

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Receiver::~Receiver() { Stop(); }

StatusOr<std::unique_ptr<Receiver>> Receiver::Start(ReceiverOptions options, std::unique_ptr<Listener> listener,
                                                    ReceiverHandler* handler) {
  auto bad = [](std::string_view what) { return absl::InvalidArgumentError(StrCat("receiver options: ", what)); };
  if (handler == nullptr) return bad("handler is required");
  if (listener == nullptr) return bad("listener is required");
  if (options.handshake_timeout.count() <= 0) return bad("handshake_timeout must be > 0");
  if (options.max_connections < 1) return bad("max_connections must be at least 1");
  if (options.peer_timeout.count() <= 0) return bad("peer_timeout must be > 0");
  if (options.write_timeout.count() <= 0) return bad("write_timeout must be > 0");
  if (options.max_send_queue_bytes < kHeaderBytes + kMaxBodyBytes) {
    return bad(StrCat("max_send_queue_bytes must hold one largest frame (", kHeaderBytes + kMaxBodyBytes, " bytes)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->listener = std::move(listener);
  impl->opt = std::move(options);
  impl->handler = handler;
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->AcceptLoop(); });
  spdlog::info("receiver: {} link listening on {}{}{}", raw->listener->kind(), raw->listener->address(),
               raw->opt.keys ? StrCat(", ", raw->opt.keys->size(), " edge keys") : ", WITHOUT authentication",
               raw->opt.allow ? StrCat(", ", raw->opt.allow->entries().size(), " allowed networks") : "");
  return std::unique_ptr<Receiver>(new Receiver(std::move(impl)));
}

uint16_t Receiver::port() const { return impl_->listener->port(); }
const std::string& Receiver::address() const { return impl_->listener->address(); }
std::string_view Receiver::kind() const { return impl_->listener->kind(); }

ReceiverStats Receiver::Stats() const {
  MutexLock lock(impl_->mu);
  return impl_->stats;
}

void Receiver::Stop() {
  if (impl_->stop.exchange(true)) return;
  impl_->acceptor.join();
  {
    MutexLock lock(impl_->mu);
    for (auto& [id, c] : impl_->conns) c.conn->Shutdown();
  }
  std::map<uint64_t, Impl::Conn> conns;
  {
    MutexLock lock(impl_->mu);
    conns.swap(impl_->conns);
  }
  for (auto& [id, c] : conns) c.thread.join();
}

}  // namespace vigil::transport
