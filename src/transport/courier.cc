#include "vigil/transport/courier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace vigil::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long the sender waits for new messages before it looks at its session again (stop, broken).
constexpr milliseconds kSenderPoll{20};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class CourierImpl final : public Courier {
 public:
  CourierImpl(CourierOptions o, Outbox* outbox, CourierHandler* handler)
      : opt_(std::move(o)), outbox_(outbox), handler_(handler) {
    sender_ = std::thread([this] { SenderLoop(); });
  }
  ~CourierImpl() override { Close(); }

  CourierStats Stats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

  void Close() override {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      stop_ = true;
      if (live_) live_->Close();
      cv_.notify_all();
    }
    if (sender_.joinable()) sender_.join();
  }

 private:
  // What one session's reader thread tells the sender.
  struct SessionState {
    std::atomic<bool> broken{false};     // the reader ended: the session is lost
    std::atomic<bool> delivered{false};  // an Ack or Reject arrived
  };

  bool stopping() const {
    std::lock_guard lock(mu_);
    return stop_ || stats_.fenced;
  }

  void SetError(const Status& st) {
    std::lock_guard lock(mu_);
    stats_.last_error = std::string(st.message());
  }

  // Records fencing and calls OnFenced once; `link` (when set) is closed so the sender stops at once.
  void Fence(const Status& why, Link* link) {
    {
      std::lock_guard lock(mu_);
      if (stats_.fenced) return;
      stats_.fenced = true;
      stats_.last_error = std::string(why.message());
      cv_.notify_all();
    }
    if (link) link->Close();
    spdlog::error("courier {}: fenced, stopping: {}", opt_.edge, std::string(why.message()));
    handler_->OnFenced(why);
  }

  void SenderLoop() {
    Backoff backoff(opt_.backoff_initial, opt_.backoff_max, std::random_device{}());
    bool failing = false;  // in a streak of failed opens (logged once)
    while (!stopping()) {
      bool delivered = false, opened = false;
      for (size_t i = 0; i < opt_.links.size() && !stopping(); ++i) {
        Link& link = *opt_.links[i];
        Hello hello = handler_->MakeHello();
        hello.edge = opt_.edge;
        hello.protocol_version = kProtocolVersion;
        {
          std::lock_guard lock(mu_);
          hello.epoch = stats_.epoch;
          if (stop_) break;
          live_ = &link;  // Close() interrupts the handshake
        }
        StatusOr<Welcome> welcome = link.Open(hello, opt_.connect_timeout);
        if (!welcome.ok()) {
          {
            std::lock_guard lock(mu_);
            live_ = nullptr;
          }
          if (welcome.status().code() == absl::StatusCode::kPermissionDenied) {
            Fence(welcome.status(), nullptr);
            return;
          }
          if (!failing) {
            spdlog::warn("courier {}: {} link {}: {}", opt_.edge, link.kind(), link.target(),
                         std::string(welcome.status().message()));
          }
          std::lock_guard lock(mu_);
          ++stats_.open_failures;
          stats_.last_error = std::string(welcome.status().message());
          continue;
        }
        failing = false;
        opened = true;
        delivered = RunSession(i, link, *welcome);
        break;  // the next session tries the preferred link first again (fail-back)
      }
      if (!opened) failing = true;
      if (delivered) {
        backoff.Reset();
        continue;
      }
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, backoff.Next(), [&] { return stop_ || stats_.fenced; });
    }
  }

  // Runs one admitted session on `link` until it breaks, the courier stops or the edge is fenced.
  // Returns whether the aggregator answered anything of it.
  bool RunSession(size_t index, Link& link, const Welcome& welcome) {
    {
      std::lock_guard lock(mu_);
      if (stop_) {
        live_ = nullptr;
        link.Close();
        return false;
      }
      ++stats_.sessions;
      if (last_link_ != SIZE_MAX && last_link_ != index) ++stats_.link_switches;
      last_link_ = index;
      stats_.epoch = welcome.epoch;
      stats_.link = std::string(link.kind());
      stats_.connected = true;
    }
    spdlog::info("courier {}: session on {} link {} (epoch {})", opt_.edge, link.kind(), link.target(), welcome.epoch);
    handler_->OnWelcome(welcome, link.kind());

    SessionState state;
    std::thread reader([&] { ReaderLoop(link, state); });
    Status st = SendLoop(link, state);
    link.Close();
    reader.join();
    std::lock_guard lock(mu_);
    live_ = nullptr;
    stats_.connected = false;
    stats_.link.clear();
    if (!stop_ && !stats_.fenced) {
      ++stats_.disconnects;
      if (!st.ok()) stats_.last_error = std::string(st.message());
      spdlog::warn("courier {}: session on {} lost: {}", opt_.edge, link.target(), stats_.last_error);
    }
    return state.delivered.load();
  }

  // Sends every pending message from the oldest on, then new ones, with heartbeats when idle.
  Status SendLoop(Link& link, SessionState& state) {
    uint64_t send_id = outbox_->front_id();  // re-send everything unacknowledged
    auto last_write = Clock::now();
    std::vector<const OutboxMessage*> batch;
    for (;;) {
      if (stopping()) return absl::OkStatus();
      if (state.broken.load()) return absl::OkStatus();  // the reader recorded why
      const uint64_t next = outbox_->next_id();
      std::vector<std::shared_ptr<const OutboxMessage>> msgs = outbox_->PendingFrom(send_id, opt_.max_batch);
      if (msgs.empty()) {
        send_id = std::max(send_id, next);  // everything below `next` is completed
        const auto heartbeat_at = last_write + opt_.heartbeat_interval;
        if (Clock::now() >= heartbeat_at) {
          VIGIL_RETURN_IF_ERROR(link.SendHeartbeat(NowNs(), opt_.peer_timeout));
          last_write = Clock::now();
          continue;
        }
        const auto until_heartbeat = std::chrono::duration_cast<milliseconds>(heartbeat_at - Clock::now());
        outbox_->WaitBeyond(send_id, std::clamp(until_heartbeat, milliseconds(1), kSenderPoll));
        continue;
      }
      batch.clear();
      for (const auto& m : msgs) batch.push_back(m.get());
      const uint64_t after = batch.back()->id + 1;
      Status st = link.Send(batch, opt_.peer_timeout);
      if (st.code() == absl::StatusCode::kInternal) {
        st = SendOneByOne(link, &batch);  // find the payload that does not download; send the others
      }
      VIGIL_RETURN_IF_ERROR(st);
      last_write = Clock::now();
      send_id = after;
      std::lock_guard lock(mu_);
      for (const OutboxMessage* m : batch) {
        ++stats_.sent;
        if (m->id < sent_high_) ++stats_.resent;
      }
      sent_high_ = std::max(sent_high_, send_id);
    }
  }

  // Sends `batch` one message at a time; a message whose device rows cannot be downloaded is completed
  // as refused (it can never be sent) and reported to the handler as Reject(kInvalid).
  // `batch` keeps the messages that were sent.
  Status SendOneByOne(Link& link, std::vector<const OutboxMessage*>* batch) {
    std::vector<const OutboxMessage*> sent;
    for (const OutboxMessage* m : *batch) {
      Status st = link.Send(std::span<const OutboxMessage* const>(&m, 1), opt_.peer_timeout);
      if (st.code() != absl::StatusCode::kInternal) {
        VIGIL_RETURN_IF_ERROR(st);
        sent.push_back(m);
        continue;
      }
      spdlog::error("courier {}: message {} cannot be sent, dropped: {}", opt_.edge, m->id, std::string(st.message()));
      const Report& r = m->report;
      Reject reject{RejectReason::kInvalid, r.stream, r.run, r.seq_first, r.seq_last, 0,
                    StrCat("not sent: ", st.message())};
      {
        std::lock_guard lock(mu_);
        reject.epoch = stats_.epoch;
      }
      if (outbox_->Complete(r.stream, r.run, r.seq_first, false)) handler_->OnReject(reject);
    }
    batch->swap(sent);
    return absl::OkStatus();
  }

  void ReaderLoop(Link& link, SessionState& state) {
    Status st;
    while (st.ok() && !stopping()) {
      StatusOr<std::optional<Message>> m = link.Receive(opt_.peer_timeout);
      if (!m.ok()) {
        st = m.status();
        break;
      }
      if (!m->has_value()) {
        st = absl::UnavailableError(
            StrCat(link.target(), ": nothing heard from the aggregator for ", opt_.peer_timeout.count(), " ms"));
        break;
      }
      st = Handle(link, **m, state);
    }
    if (!st.ok() && !stopping()) SetError(st);
    state.broken = true;
    link.Close();  // unblocks a Send waiting on an aggregator that stopped reading
  }

  Status Handle(Link& link, const Message& m, SessionState& state) {
    if (const Ack* a = std::get_if<Ack>(&m)) {
      state.delivered = true;
      // The handler (the ledger's acknowledged cursor) learns of the ack before the outbox lets go of the
      // report: whoever waits for an empty outbox then sees every cursor already advanced. Acks are read on
      // this one thread, so the message is still pending when Complete runs.
      if (outbox_->IsPending(a->stream, a->run, a->seq_first)) {
        handler_->OnAck(*a);
        outbox_->Complete(a->stream, a->run, a->seq_first, true);
      }
      return absl::OkStatus();
    }
    if (const Reject* r = std::get_if<Reject>(&m)) {
      state.delivered = true;
      if (r->reason == RejectReason::kFenced) {
        const Status why = absl::PermissionDeniedError(
            StrCat(link.target(), ": the aggregator fenced edge '", opt_.edge, "' (a newer instance holds epoch ",
                   r->epoch, "): ", r->detail));
        Fence(why, &link);
        return why;
      }
      if (r->stream.empty()) {
        return absl::FailedPreconditionError(
            StrCat(link.target(), ": the aggregator closed the session (", ToString(r->reason), "): ", r->detail));
      }
      if (outbox_->Complete(r->stream, r->run, r->seq_first, false)) {
        spdlog::error("courier {}: report {}/{} seq {}..{} refused ({}): {}", opt_.edge, r->stream, r->run,
                      r->seq_first, r->seq_last, ToString(r->reason), r->detail);
        handler_->OnReject(*r);
      }
      return absl::OkStatus();
    }
    return absl::OkStatus();  // a Heartbeat echo: the aggregator is alive
  }

  const CourierOptions opt_;
  Outbox* const outbox_;
  CourierHandler* const handler_;
  mutable std::mutex mu_;
  std::condition_variable cv_;    // stop or fenced (backoff waits)
  bool stop_ = false;             // GUARDED_BY(mu_)
  Link* live_ = nullptr;          // GUARDED_BY(mu_) the link opening or in session, for Close
  size_t last_link_ = SIZE_MAX;   // GUARDED_BY(mu_) index of the previous session's link
  uint64_t sent_high_ = 0;        // GUARDED_BY(mu_) one past the highest message id ever sent
  CourierStats stats_;            // GUARDED_BY(mu_)
  std::thread sender_;
};

}  // namespace

StatusOr<std::unique_ptr<Courier>> Courier::Start(CourierOptions o, Outbox* outbox, CourierHandler* handler) {
  auto bad = [](std::string_view what) { return absl::InvalidArgumentError(StrCat("courier options: ", what)); };
  if (outbox == nullptr || handler == nullptr) return bad("outbox and handler are required");
  if (o.edge.empty() || o.edge.size() > 65535) return bad("edge: the id must be 1..65535 bytes");
  if (o.links.empty()) return bad("links: at least one is required");
  for (size_t i = 0; i < o.links.size(); ++i) {
    if (!o.links[i]) return bad(StrCat("links[", i, "] is null"));
  }
  if (o.backoff_initial.count() <= 0) return bad("backoff_initial must be > 0");
  if (o.backoff_max < o.backoff_initial) return bad("backoff_max must be ≥ backoff_initial");
  if (o.connect_timeout.count() <= 0) return bad("connect_timeout must be > 0");
  if (o.heartbeat_interval.count() <= 0) return bad("heartbeat_interval must be > 0");
  if (o.peer_timeout <= o.heartbeat_interval) return bad("peer_timeout must be longer than heartbeat_interval");
  if (o.max_batch == 0) return bad("max_batch must be at least 1");
  return std::unique_ptr<Courier>(new CourierImpl(std::move(o), outbox, handler));
}

Backoff::Backoff(milliseconds initial, milliseconds max, uint64_t seed) : initial_(initial), max_(max), rng_(seed) {}

milliseconds Backoff::Next() {
  const int64_t cap = max_.count();
  int64_t d = initial_.count();
  for (int i = 0; i < attempt_ && d < cap; ++i) d *= 2;
  d = std::min(d, cap);
  if (d < cap) ++attempt_;
  std::uniform_int_distribution<int64_t> dist(d / 2, d);
  return milliseconds(dist(rng_));
}

}  // namespace vigil::transport
