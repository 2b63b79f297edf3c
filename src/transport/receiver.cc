#include "vigil/transport/receiver.h"

#include <spdlog/spdlog.h>

#include <map>
#include <thread>
#include <vector>

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kAcceptPoll{100};  // how often the accept thread checks for Stop and reaps threads
constexpr size_t kReadBufferBytes = 64 << 10;

}  // namespace

// TEMP receiver shim (drop on merge): a minimal implementation of the v2 Session (admission, send queue,
// writer thread) so the aggregator builds and its tests run until the transport module's lands.

Session::Session(uint64_t id, std::shared_ptr<Connection> conn, Hello hello, size_t max_send_queue_bytes)
    : id_(id), conn_(std::move(conn)), hello_(std::move(hello)), max_queue_bytes_(max_send_queue_bytes) {}

uint64_t Session::epoch() const {
  std::lock_guard lock(mu_);
  return epoch_;
}

bool Session::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

void Session::Admit(const Welcome& welcome) {
  std::lock_guard lock(mu_);
  if (epoch_ != 0 || closed_ || closing_ || welcome.epoch == 0) return;
  epoch_ = welcome.epoch;
  std::string f = EncodeFrame(welcome);
  queue_bytes_ += f.size();
  queue_.push_back(std::move(f));
  cv_.notify_all();
}

void Session::Refuse(RejectReason reason, uint64_t epoch, std::string detail) {
  std::lock_guard lock(mu_);
  if (closed_ || closing_) return;
  std::string f = EncodeFrame(Reject{reason, "", 0, 0, 0, epoch, std::move(detail)});
  queue_bytes_ += f.size();
  queue_.push_back(std::move(f));
  closing_ = true;
  cv_.notify_all();
}

bool Session::Enqueue(std::string frames) {
  std::lock_guard lock(mu_);
  if (closed_ || closing_) return false;
  if (queue_bytes_ + frames.size() > max_queue_bytes_) {
    closed_ = true;
    conn_->Shutdown();
    cv_.notify_all();
    return false;
  }
  queue_bytes_ += frames.size();
  queue_.push_back(std::move(frames));
  cv_.notify_all();
  return true;
}

void Session::Close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  conn_->Shutdown();
  cv_.notify_all();
}

void Session::WriterLoop(std::chrono::milliseconds write_timeout) {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return closed_ || !queue_.empty() || closing_; });
    if (closed_) return;
    if (queue_.empty()) {  // closing_ and drained: the Reject is written
      closed_ = true;
      conn_->Shutdown();
      return;
    }
    std::string f = std::move(queue_.front());
    queue_.pop_front();
    queue_bytes_ -= f.size();
    lock.unlock();
    Status st = conn_->Write(f, write_timeout);
    lock.lock();
    if (!st.ok()) {
      closed_ = true;
      conn_->Shutdown();
      return;
    }
  }
}

struct TcpReceiver::Impl {
  struct Conn {
    std::shared_ptr<Connection> conn;
    std::thread thread;
    bool finished = false;
  };

  ReceiverOptions opt;
  ReceiverHandler* handler = nullptr;
  std::unique_ptr<TcpListener> listener;
  std::thread acceptor;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;
  std::map<uint64_t, Conn> conns;  // GUARDED_BY(mu)
  uint64_t next_id = 1;            // GUARDED_BY(mu)
  ReceiverStats stats;             // GUARDED_BY(mu)

  void AcceptLoop() {
    while (!stop.load()) {
      StatusOr<std::unique_ptr<Connection>> c = listener->Accept(kAcceptPoll);
      ReapFinished();
      if (!c.ok()) {
        if (c.status().code() != absl::StatusCode::kDeadlineExceeded) {
          spdlog::warn("receiver {}: {}", listener->address(), std::string(c.status().message()));
          std::this_thread::sleep_for(kAcceptPoll);  // e.g. out of file descriptors: do not spin
        }
        continue;
      }
      std::shared_ptr<Connection> conn = std::move(*c);
      std::lock_guard lock(mu);
      if (stats.active >= static_cast<uint64_t>(opt.max_connections)) {
        ++stats.refused;
        spdlog::warn("receiver {}: refusing {}: {} connections open", listener->address(), conn->peer(), stats.active);
        (void)conn->Write(EncodeFrame(Reject{RejectReason::kProtocolError, "", 0, 0, 0, 0, "too many connections"}),
                          opt.write_timeout);
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
      std::lock_guard lock(mu);
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
    bool draining = false;  // a violation queued a Reject: let the writer send it, then close
    const Status why = ServeFrames(id, conn, &session, &writer, &draining);
    if (session && !draining) session->Close();
    if (writer.joinable()) writer.join();
    conn->Shutdown();
    if (session) handler->OnClose(session, why);
    std::lock_guard lock(mu);
    --stats.active;
    if (auto it = conns.find(id); it != conns.end()) it->second.finished = true;  // absent once Stop took over
  }

  // Reads and dispatches frames until the connection ends; returns why it ended.
  Status ServeFrames(uint64_t id, const std::shared_ptr<Connection>& conn, std::shared_ptr<Session>* session,
                     std::thread* writer, bool* draining) {
    FrameDecoder decoder;
    std::string buf(kReadBufferBytes, '\0');
    auto violation = [&](RejectReason reason, const Status& st) {
      spdlog::warn("receiver: {}{}: closing the connection: {}", conn->peer(),
                   *session ? StrCat(" (edge ", (*session)->edge(), ")") : "", std::string(st.message()));
      if (*session) {
        (*session)->Refuse(reason, 0, std::string(st.message()));
        *draining = true;
      } else {
        (void)conn->Write(EncodeFrame(Reject{reason, "", 0, 0, 0, 0, std::string(st.message())}), opt.write_timeout);
      }
      std::lock_guard lock(mu);
      ++stats.protocol_errors;
      return st;
    };
    for (;;) {
      StatusOr<size_t> n = conn->Read(buf.data(), buf.size(), opt.peer_timeout);
      if (!n.ok()) {
        if (n.status().code() == absl::StatusCode::kDeadlineExceeded) {
          std::lock_guard lock(mu);
          ++stats.timeouts;
        }
        if (!stop.load() && decoder.pending() > 0) {
          return absl::DataLossError(StrCat(n.status().message(), " (", decoder.pending(), " bytes of a frame lost)"));
        }
        return n.status();
      }
      {
        std::lock_guard lock(mu);
        stats.bytes += *n;
      }
      decoder.Feed(std::string_view(buf.data(), *n));
      for (;;) {
        StatusOr<std::optional<Message>> m = decoder.Next();
        if (!m.ok()) {
          return violation(m.status().code() == absl::StatusCode::kUnimplemented ? RejectReason::kUnsupportedVersion
                                                                                 : RejectReason::kProtocolError,
                           m.status());
        }
        if (!m->has_value()) break;
        {
          std::lock_guard lock(mu);
          ++stats.frames;
        }
        Message& msg = **m;
        if (Hello* h = std::get_if<Hello>(&msg)) {
          if (*session) return violation(RejectReason::kProtocolError, absl::InvalidArgumentError("a second Hello"));
          if (h->protocol_version != kProtocolVersion) {
            return violation(RejectReason::kUnsupportedVersion,
                             absl::UnimplementedError(StrCat("Hello: protocol version ", h->protocol_version,
                                                             " not supported (this aggregator speaks ",
                                                             static_cast<int>(kProtocolVersion), ")")));
          }
          auto s = std::make_shared<Session>(id, conn, std::move(*h), opt.max_send_queue_bytes);
          *session = s;
          *writer = std::thread([s, timeout = opt.write_timeout] { s->WriterLoop(timeout); });
          Status st = handler->OnHello(s);
          if (!st.ok()) return violation(RejectReason::kProtocolError, st);
        } else if (!*session) {
          return violation(RejectReason::kProtocolError, absl::InvalidArgumentError("the first message must be Hello"));
        } else if (Report* r = std::get_if<Report>(&msg)) {
          if (r->edge != (*session)->edge()) {
            return violation(RejectReason::kProtocolError,
                             absl::InvalidArgumentError(StrCat("a report from edge '", r->edge,
                                                               "' on the connection of '", (*session)->edge(), "'")));
          }
          const uint64_t epoch = (*session)->epoch();
          if (epoch == 0) {
            return violation(RejectReason::kProtocolError,
                             absl::InvalidArgumentError("a report before the session was admitted"));
          }
          if (r->epoch != epoch) {
            {
              std::lock_guard lock(mu);
              ++stats.stale_reports;
            }
            (void)(*session)->Enqueue(EncodeFrame(Reject{RejectReason::kStaleEpoch, r->stream, r->run, r->seq_first,
                                                         r->seq_last, epoch,
                                                         StrCat("epoch ", r->epoch, " is not the session's ", epoch)}));
            continue;
          }
          handler->OnReport(*session, std::move(*r));
        } else if (std::holds_alternative<Heartbeat>(msg)) {
          (void)(*session)->Enqueue(EncodeFrame(msg));  // echo
        } else {
          return violation(RejectReason::kProtocolError,
                           absl::InvalidArgumentError("an edge may send only Hello, Report and Heartbeat"));
        }
      }
    }
  }
};

TcpReceiver::TcpReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpReceiver::~TcpReceiver() { Stop(); }

StatusOr<std::unique_ptr<TcpReceiver>> TcpReceiver::Start(ReceiverOptions options, ReceiverHandler* handler) {
  if (handler == nullptr) return absl::InvalidArgumentError("receiver: no handler");
  if (options.max_connections < 1) return absl::InvalidArgumentError("receiver: max_connections must be at least 1");
  if (options.peer_timeout.count() <= 0 || options.write_timeout.count() <= 0) {
    return absl::InvalidArgumentError("receiver: timeouts must be positive");
  }
  auto impl = std::make_unique<Impl>();
  VIGIL_ASSIGN_OR_RETURN(impl->listener, TcpListener::Listen(options.host, options.port));
  impl->opt = std::move(options);
  impl->handler = handler;
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->AcceptLoop(); });
  spdlog::info("receiver: listening on {}", raw->listener->address());
  return std::unique_ptr<TcpReceiver>(new TcpReceiver(std::move(impl)));
}

uint16_t TcpReceiver::port() const { return impl_->listener->port(); }
const std::string& TcpReceiver::address() const { return impl_->listener->address(); }

ReceiverStats TcpReceiver::Stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

void TcpReceiver::Stop() {
  if (impl_->stop.exchange(true)) return;
  impl_->acceptor.join();
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [id, c] : impl_->conns) c.conn->Shutdown();
  }
  std::map<uint64_t, Impl::Conn> conns;
  {
    std::lock_guard lock(impl_->mu);
    conns.swap(impl_->conns);
  }
  for (auto& [id, c] : conns) c.thread.join();
}

}  // namespace vigil::transport
