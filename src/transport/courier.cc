#include "vigil/common/deadline.h"
#include "vigil/transport/courier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "vigil/common/mutex.h"
#include "vigil/transport/health.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;

// How long the sender waits for new messages before it looks at its session again (stop, broken).
constexpr milliseconds kSenderPoll{20};
// How long the reader waits for a frame before it looks at its session again.
constexpr milliseconds kReaderPoll{50};
// How long a session that ended waits for a probe in progress to finish (the probe may be why it ended).
constexpr milliseconds kProbeGrace{1000};

class CourierImpl final : public Courier {
 public:
  CourierImpl(CourierOptions o, Outbox* outbox, CourierHandler* handler)
      : opt_(std::move(o)), outbox_(outbox), handler_(handler), clock_(opt_.clock ? opt_.clock : SystemClock()) {
    for (const auto& l : opt_.links) stats_.links.push_back({std::string(l->kind()), l->target()});
    sender_ = std::thread([this] { SenderLoop(); });
  }
  ~CourierImpl() override { Close(); }

  CourierStats Stats() const override {
    MutexLock lock(mu_);
    CourierStats s = stats_;
    s.snapshots_queued = snapshots_.size();
    return s;
  }

  void SetSourceStates(SourceStates states) override {
    MutexLock lock(mu_);
    if (source_states_ && *source_states_ == states) return;
    source_states_ = std::move(states);
    ++source_states_version_;
  }

  bool OfferSnapshot(Snapshot snapshot) override {
    MutexLock lock(mu_);
    if (stop_ || stats_.fenced || snapshot_bytes_ + snapshot.jpeg.size() > opt_.max_snapshot_bytes) {
      ++stats_.snapshots_dropped;
      return false;
    }
    snapshot_bytes_ += snapshot.jpeg.size();
    snapshots_.push_back(std::move(snapshot));
    return true;
  }

  void Close() override {
    {
      MutexLock lock(mu_);
      if (stop_) return;
      stop_ = true;
      if (live_) live_->Close();
      if (probing_) probing_->Close();
      cv_.NotifyAll();
    }
    if (sender_.joinable()) sender_.join();
    MutexLock lock(mu_);
    stats_.snapshots_dropped += snapshots_.size();
    snapshots_.clear();
    snapshot_bytes_ = 0;
  }

 private:
  // A session a probe opened on a preferred link, to be run next.
  struct Opened {
    size_t index = 0;
    Welcome welcome;
  };
  // What one session's reader and prober threads tell the sender. (What the prober sets under mu_ is the
  // courier's: fail_back_ and session_done_, one session running at a time.)
  struct SessionState {
    std::atomic<bool> broken{false};     // the reader ended: the session is lost
    std::atomic<bool> delivered{false};  // an Ack or Reject arrived
    std::atomic<int64_t> heard_ns{0};    // steady time of the last frame received
  };

  int64_t Now() const { return clock_->SteadyNs(); }

  bool stopping() const VIGIL_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return stop_ || stats_.fenced;
  }

  void SetError(const Status& st) {
    MutexLock lock(mu_);
    stats_.last_error = std::string(st.message());
  }

  // Records fencing and calls OnFenced once; `link` (when set) is closed so the sender stops at once.
  void Fence(const Status& why, Link* link) {
    {
      MutexLock lock(mu_);
      if (stats_.fenced) return;
      stats_.fenced = true;
      stats_.last_error = std::string(why.message());
      cv_.NotifyAll();
    }
    if (link) link->Close();
    spdlog::error("courier {}: fenced, stopping: {}", opt_.edge, std::string(why.message()));
    handler_->OnFenced(why);
  }

  // Opens a session on link `i` (Hello with the epoch held). `slot` is where Close() finds the link to
  // interrupt the handshake (live_ for the sender, probing_ for the prober). Fencing ends the courier.
  StatusOr<Welcome> OpenLink(size_t i, Link* CourierImpl::*slot) {
    Link& link = *opt_.links[i];
    Hello hello = handler_->MakeHello();
    hello.edge = opt_.edge;
    hello.protocol_version = kProtocolVersion;
    {
      MutexLock lock(mu_);
      if (stop_ || stats_.fenced) return absl::CancelledError("courier closed");
      hello.epoch = stats_.epoch;
      this->*slot = &link;
    }
    StatusOr<Welcome> welcome = link.Open(hello, opt_.connect_timeout);
    MutexLock lock(mu_);
    this->*slot = nullptr;
    cv_.NotifyAll();
    if (welcome.ok()) return welcome;
    ++stats_.open_failures;
    ++stats_.links[i].open_failures;
    stats_.last_error = std::string(welcome.status().message());
    if (welcome.status().code() == absl::StatusCode::kUnauthenticated) ++stats_.auth_failures;
    return welcome.status();
  }

  void SenderLoop() {
    Backoff backoff(opt_.backoff_initial, opt_.backoff_max, std::random_device{}());
    bool failing = false;  // in a streak of failed opens (logged once)
    std::optional<Opened> next;
    while (!stopping()) {
      bool delivered = false, opened = false;
      if (next) {  // a probe found a preferred link up: go there at once
        Opened o = std::move(*next);
        next.reset();
        opened = true;
        delivered = RunSession(o.index, o.welcome, /*fail_back=*/true, &next);
      }
      for (size_t i = 0; !opened && i < opt_.links.size() && !stopping(); ++i) {
        StatusOr<Welcome> welcome = OpenLink(i, &CourierImpl::live_);
        if (!welcome.ok()) {
          if (welcome.status().code() == absl::StatusCode::kPermissionDenied) {
            Fence(welcome.status(), nullptr);
            return;
          }
          if (!failing || welcome.status().code() == absl::StatusCode::kUnauthenticated) {
            auto level = welcome.status().code() == absl::StatusCode::kUnauthenticated ? spdlog::level::err
                                                                                       : spdlog::level::warn;
            spdlog::log(level, "courier {}: {} link {}: {}", opt_.edge, opt_.links[i]->kind(),
                        opt_.links[i]->target(), std::string(welcome.status().message()));
          }
          continue;
        }
        failing = false;
        opened = true;
        delivered = RunSession(i, *welcome, /*fail_back=*/false, &next);
      }
      if (!opened) failing = true;
      if (delivered || next) {
        backoff.Reset();
        continue;
      }
      MutexLock lock(mu_);
      const Deadline deadline = Deadline::After(backoff.Next());
      while (!stop_ && !stats_.fenced && cv_.WaitUntil(lock, deadline)) {
      }
    }
  }

  // Runs one admitted session on link `index` until it breaks, the courier stops, the edge is fenced, or
  // a probe opened a preferred link (then *next is set). Returns whether the aggregator answered anything.
  bool RunSession(size_t index, const Welcome& welcome, bool fail_back, std::optional<Opened>* next) {
    Link& link = *opt_.links[index];
    {
      MutexLock lock(mu_);
      if (stop_ || stats_.fenced) {
        link.Close();
        return false;
      }
      live_ = &link;
      fail_back_.reset();
      session_done_ = false;
      ++stats_.sessions;
      ++stats_.links[index].sessions;
      stats_.links[index].transports = link.transports();
      if (last_link_ != SIZE_MAX && last_link_ != index) {
        ++stats_.link_switches;
        if (fail_back) ++stats_.fail_backs;
      }
      last_link_ = index;
      stats_.epoch = welcome.epoch;
      stats_.link = std::string(link.kind());
      stats_.connected = true;
    }
    const std::string transports = link.transports();
    // A session on a fallback link is worth a warning: the preferred path is down (the error was logged
    // just before); the move back is news too.
    spdlog::log(index > 0 && !fail_back ? spdlog::level::warn : spdlog::level::info,
                "courier {}: session on {} link {}{} (epoch {}){}", opt_.edge, link.kind(), link.target(),
                transports.empty() ? "" : StrCat(" over ", transports), welcome.epoch,
                fail_back   ? ": back on the preferred link"
                : index > 0 ? StrCat(": on a fallback link, ", opt_.links[0]->kind(),
                                     " unavailable (probing it every ", opt_.probe_interval.count(), " ms)")
                            : std::string());
    handler_->OnWelcome(welcome, link.kind());

    SessionState state;
    state.heard_ns = Now();
    std::thread reader([&] { ReaderLoop(link, state); });
    std::thread prober;
    if (index > 0) prober = std::thread([&] { ProbeLoop(index, state); });
    Status st = SendLoop(index, link, state);
    link.Close();
    reader.join();
    if (prober.joinable()) {
      // A probe that is opening a preferred link may be why this session ended (admitting it supersedes this
      // one at the aggregator): give it a moment to finish and use it, rather than open that link again.
      MutexLock lock(mu_);
      session_done_ = true;
      cv_.NotifyAll();
      const Deadline deadline = Deadline::After(std::min(opt_.connect_timeout, kProbeGrace));
      while (probing_ != nullptr && cv_.WaitUntil(lock, deadline)) {
      }
      if (probing_ != nullptr) probing_->Close();
      lock.Unlock();
      prober.join();
    }
    MutexLock lock(mu_);
    live_ = nullptr;
    stats_.connected = false;
    stats_.link.clear();
    if (fail_back_ && !stop_ && !stats_.fenced) {
      spdlog::info("courier {}: moving from {} link {} to the preferred {} link {}", opt_.edge, link.kind(),
                   link.target(), opt_.links[fail_back_->index]->kind(), opt_.links[fail_back_->index]->target());
      *next = std::exchange(fail_back_, std::nullopt);
      return state.delivered.load();
    }
    if (fail_back_) opt_.links[fail_back_->index]->Close();  // stopping: never used
    fail_back_.reset();
    if (!stop_ && !stats_.fenced) {
      ++stats_.disconnects;
      if (!st.ok()) stats_.last_error = std::string(st.message());
      spdlog::warn("courier {}: session on {} link {} lost: {}", opt_.edge, link.kind(), link.target(),
                   stats_.last_error);
    }
    return state.delivered.load();
  }

  // While the session on link `index` runs: every probe_interval, try the links before it in order.
  void ProbeLoop(size_t index, SessionState& state) {
    FailbackSchedule schedule(std::chrono::nanoseconds(opt_.probe_interval).count());
    schedule.SessionStarted(index, Now());
    for (;;) {
      {
        MutexLock lock(mu_);
        if (stop_ || stats_.fenced || session_done_) return;
        if (!schedule.ProbeDue(Now())) {
          const int64_t wait_ns = std::max<int64_t>(schedule.next_probe() - Now(), 1'000'000);
          cv_.WaitFor(lock, std::min(std::chrono::nanoseconds(wait_ns), std::chrono::nanoseconds(kSenderPoll)));
          continue;
        }
        ++stats_.probes;
      }
      for (size_t j = 0; j < index; ++j) {
        {
          MutexLock lock(mu_);
          if (session_done_ || stop_ || stats_.fenced) return;
        }
        StatusOr<Welcome> welcome = OpenLink(j, &CourierImpl::probing_);
        if (welcome.ok()) {
          MutexLock lock(mu_);
          if (stop_ || stats_.fenced) {  // stopping: the session is never used
            opt_.links[j]->Close();
            return;
          }
          fail_back_ = Opened{j, std::move(*welcome)};
          state.broken = true;  // the sender leaves this session now
          cv_.NotifyAll();
          return;
        }
        if (welcome.status().code() == absl::StatusCode::kPermissionDenied) {
          Fence(welcome.status(), opt_.links[index].get());
          return;
        }
      }
      schedule.Probed(Now());
    }
  }

  // Sends every pending message from the oldest on, then new ones, with heartbeats when idle; ends the
  // session when SessionHealth gives it up.
  Status SendLoop(size_t index, Link& link, SessionState& state) {
    uint64_t send_id = outbox_->front_id();  // re-send everything unacknowledged
    SessionHealth health({std::chrono::nanoseconds(opt_.heartbeat_interval).count(),
                          std::chrono::nanoseconds(opt_.peer_timeout).count(),
                          std::chrono::nanoseconds(opt_.ack_timeout).count()},
                         Now());
    std::vector<const OutboxMessage*> batch;
    uint64_t states_sent = 0;  // the source states' version this session sent (0: none yet)
    for (;;) {
      if (stopping()) return absl::OkStatus();
      if (state.broken.load()) return absl::OkStatus();  // the reader recorded why, or a probe moves us
      const int64_t now = Now();
      health.Heard(state.heard_ns.load());
      const uint64_t front = outbox_->front_id();
      health.Oldest(front, front < send_id, now);
      switch (health.Check(now)) {
        case SessionHealth::Verdict::kPeerSilent:
          return absl::UnavailableError(StrCat(link.target(), ": nothing heard from the aggregator for ",
                                               health.silent_for(now) / 1'000'000, " ms"));
        case SessionHealth::Verdict::kAckOverdue: {
          MutexLock lock(mu_);
          ++stats_.ack_timeouts;
          return absl::UnavailableError(StrCat(link.target(), ": message ", health.oldest_id(),
                                               " not acknowledged for ", health.oldest_unacked_for(now) / 1'000'000,
                                               " ms: re-sending in a new session"));
        }
        case SessionHealth::Verdict::kSendHeartbeat:
          VIGIL_RETURN_IF_ERROR(link.SendHeartbeat(clock_->WallNs(), opt_.peer_timeout));
          health.Wrote(now);
          continue;
        case SessionHealth::Verdict::kOk:
          break;
      }
      const uint64_t next = outbox_->next_id();
      std::vector<std::shared_ptr<const OutboxMessage>> msgs = outbox_->PendingFrom(send_id, opt_.max_batch);
      if (msgs.empty()) {
        send_id = std::max(send_id, next);  // everything below `next` is completed
        VIGIL_RETURN_IF_ERROR(SendSourceStates(link, &states_sent));
        bool sent = false;
        VIGIL_RETURN_IF_ERROR(SendSnapshot(link, &sent));
        if (sent) {
          health.Wrote(Now());
          continue;
        }
        const auto until = std::chrono::duration_cast<milliseconds>(std::chrono::nanoseconds(health.NextCheck(now) - now));
        outbox_->WaitBeyond(send_id, std::clamp(until, milliseconds(1), kSenderPoll));
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
      health.Wrote(Now());
      send_id = after;
      {
        MutexLock lock(mu_);
        for (const OutboxMessage* m : batch) {
          ++stats_.sent;
          ++stats_.links[index].sent;
          if (m->id < sent_high_) ++stats_.resent;
        }
        sent_high_ = std::max(sent_high_, send_id);
      }
      // Between batches (after the batch is counted as sent): the states if they changed, one picture — never
      // starved while reports keep coming, never ahead of them.
      VIGIL_RETURN_IF_ERROR(SendSourceStates(link, &states_sent));
      bool snapshot_sent = false;
      VIGIL_RETURN_IF_ERROR(SendSnapshot(link, &snapshot_sent));
    }
  }

  // Sends the newest source states when this session has not sent them yet.
  Status SendSourceStates(Link& link, uint64_t* sent_version) {
    std::optional<SourceStates> states;
    uint64_t version = 0;
    {
      MutexLock lock(mu_);
      if (!source_states_ || source_states_version_ == *sent_version) return absl::OkStatus();
      states = source_states_;
      version = source_states_version_;
    }
    VIGIL_RETURN_IF_ERROR(link.SendAside(*states, opt_.peer_timeout));
    *sent_version = version;
    MutexLock lock(mu_);
    ++stats_.source_states_sent;
    return absl::OkStatus();
  }

  // Sends the oldest queued snapshot, if any (*sent says whether one went). A failed write loses it (counted)
  // and ends the session.
  Status SendSnapshot(Link& link, bool* sent) {
    *sent = false;
    Snapshot snap;
    {
      MutexLock lock(mu_);
      if (snapshots_.empty()) return absl::OkStatus();
      snap = std::move(snapshots_.front());
      snapshots_.pop_front();
      snapshot_bytes_ -= snap.jpeg.size();
    }
    Status st = link.SendAside(snap, opt_.peer_timeout);
    MutexLock lock(mu_);
    if (!st.ok()) {
      ++stats_.snapshots_lost;
      return st;
    }
    ++stats_.snapshots_sent;
    *sent = true;
    return absl::OkStatus();
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
        MutexLock lock(mu_);
        reject.epoch = stats_.epoch;
      }
      if (outbox_->Complete(r.stream, r.run, r.seq_first, false)) handler_->OnReject(reject);
    }
    batch->swap(sent);
    return absl::OkStatus();
  }

  // Passes what the aggregator sends to the Outbox and the handler; silence is the sender's to judge
  // (SessionHealth), so this only polls.
  void ReaderLoop(Link& link, SessionState& state) {
    Status st;
    while (st.ok() && !stopping() && !state.broken.load()) {
      StatusOr<std::optional<Message>> m = link.Receive(kReaderPoll);
      if (!m.ok()) {
        st = m.status();
        break;
      }
      if (!m->has_value()) continue;
      state.heard_ns = Now();
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
  vigil::Clock* const clock_;
  mutable Mutex mu_;
  CondVar cv_;  // stop, fenced, session done or probe result
  bool stop_ VIGIL_GUARDED_BY(mu_) = false;
  Link* live_ VIGIL_GUARDED_BY(mu_) = nullptr;     // the link opening or in session, for Close
  Link* probing_ VIGIL_GUARDED_BY(mu_) = nullptr;  // the link a probe is opening, for Close
  size_t last_link_ VIGIL_GUARDED_BY(mu_) = SIZE_MAX;  // index of the previous session's link
  uint64_t sent_high_ VIGIL_GUARDED_BY(mu_) = 0;       // one past the highest message id ever sent
  CourierStats stats_ VIGIL_GUARDED_BY(mu_);
  std::deque<Snapshot> snapshots_ VIGIL_GUARDED_BY(mu_);  // waiting for the sender
  std::optional<SourceStates> source_states_ VIGIL_GUARDED_BY(mu_);  // the newest
  uint64_t source_states_version_ VIGIL_GUARDED_BY(mu_) = 0;  // bumped by each change (from 1)
  size_t snapshot_bytes_ VIGIL_GUARDED_BY(mu_) = 0;           // their JPEG bytes
  // The running session's (RunSession resets them; its prober is joined before the next session):
  std::optional<Opened> fail_back_ VIGIL_GUARDED_BY(mu_);  // set by the prober: a preferred link it opened
  bool session_done_ VIGIL_GUARDED_BY(mu_) = false;        // the session is over: the prober stops
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
  if (o.ack_timeout.count() <= 0) return bad("ack_timeout must be > 0");
  if (o.probe_interval.count() <= 0) return bad("probe_interval must be > 0");
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
