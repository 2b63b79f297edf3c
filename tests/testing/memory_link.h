// memory_link.h — an in-memory Link ("memory") and the fake aggregator it reaches, for tests of the
// modules above the transport (pipeline, edge) and of the Courier itself. Header-only; depends on the
// transport headers only.
//
// FakeAggregator follows protocol.h like the real one, without SQL or sockets:
//  - epochs per edge id: Hello epoch 0 or kHelloPromote → a new epoch, larger than any granted to that
//    edge (older sessions of the edge are evicted with Reject(kFenced)); the current epoch → re-admitted;
//    a lower one → Reject(kFenced, epoch = current); a higher one never granted → Reject(kProtocolError);
//  - a Report whose epoch is not its session's → Reject(kStaleEpoch, epoch = the session's);
//  - stores each (stream, run, seq) once; records the order in which reports first stored something
//    (StoredOrder) and counts reports that stored nothing new (duplicates); answers Ack with
//    contiguous_through of (edge, stream, run);
//  - Welcome lists contiguous_through / highest_seq for the (stream, run) pairs the Hello named.
// MemoryLink fault controls: FailOpen (Open returns Unavailable), BreakAfter (the session breaks after
// n more messages; the messages after the break are neither stored nor acked; optionally the link then
// stays down), DropAcks (stored, never acknowledged).
//
// Thread-safety: everything is thread-safe; a MemoryLink follows link.h (Send on one thread, Receive on
// another, Close from any).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/transport/link.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"

namespace vigil::testing {

// One session between a MemoryLink and the FakeAggregator: the aggregator's replies wait in `inbox`.
struct MemorySession {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<transport::Message> inbox;  // GUARDED_BY(mu) replies not yet received
  bool broken = false;                   // GUARDED_BY(mu) Close, a fault or an eviction; Receive drains, then fails
  std::string edge;                      // set at Open
  uint64_t epoch = 0;                    // set at Open

  void Push(transport::Message m) {
    std::lock_guard lock(mu);
    if (broken) return;
    inbox.push_back(std::move(m));
    cv.notify_all();
  }
  void Break() {
    std::lock_guard lock(mu);
    broken = true;
    cv.notify_all();
  }
};

class FakeAggregator {
 public:
  using Key = std::tuple<std::string, uint64_t, uint64_t>;  // stream, run, seq_first

  // Admits or refuses `hello` for `session` (Welcome, or Reject with an empty stream).
  transport::Message Hello(const transport::Hello& hello, const std::shared_ptr<MemorySession>& session) {
    std::vector<std::shared_ptr<MemorySession>> evicted;
    transport::Message answer;
    {
      std::lock_guard lock(mu_);
      ++hellos_;
      uint64_t& current = epochs_[hello.edge];
      uint64_t granted = 0;
      if (hello.epoch == 0 || (hello.flags & transport::kHelloPromote) != 0) {
        granted = ++current;
        for (auto& w : sessions_[hello.edge]) {
          if (auto s = w.lock()) evicted.push_back(std::move(s));
        }
        sessions_[hello.edge].clear();
      } else if (hello.epoch == current) {
        granted = current;
      } else if (hello.epoch < current) {
        return transport::Reject{transport::RejectReason::kFenced, "", 0, 0, 0, current,
                                 StrCat("edge ", hello.edge, " epoch ", hello.epoch, " < ", current)};
      } else {
        return transport::Reject{transport::RejectReason::kProtocolError, "", 0, 0, 0, current,
                                 StrCat("epoch ", hello.epoch, " was never granted")};
      }
      session->edge = hello.edge;
      session->epoch = granted;
      sessions_[hello.edge].push_back(session);
      transport::Welcome w{granted, {}};
      for (const transport::HelloStream& hs : hello.streams) {
        const auto it = stored_.find({hello.edge, hs.stream, hs.run});
        int64_t through = -1, highest = -1;
        if (it != stored_.end() && !it->second.empty()) {
          highest = static_cast<int64_t>(*it->second.rbegin());
          through = Through(it->second);
        }
        w.streams.push_back({hs.stream, hs.run, through, highest});
      }
      answer = std::move(w);
    }
    for (auto& s : evicted) {  // Reject(kFenced), then the connection closes
      s->Push(transport::Reject{transport::RejectReason::kFenced, "", 0, 0, 0, epochs_at(hello.edge), "evicted"});
      s->Break();
    }
    return answer;
  }

  // Stores `r` (sent on `session`) and returns the answer: Ack or Reject.
  transport::Message Deliver(const transport::Report& r, const MemorySession& session) {
    std::lock_guard lock(mu_);
    if (r.epoch != session.epoch || r.edge != session.edge) {
      ++stale_;
      return transport::Reject{transport::RejectReason::kStaleEpoch, r.stream, r.run, r.seq_first, r.seq_last,
                               session.epoch, "stale epoch"};
    }
    std::set<uint64_t>& have = stored_[{r.edge, r.stream, r.run}];
    bool fresh = false;
    for (uint64_t s = r.seq_first; s <= r.seq_last; ++s) fresh = have.insert(s).second || fresh;
    if (fresh) {
      order_.emplace_back(r.stream, r.run, r.seq_first);
      reports_.push_back(r);
    } else {
      ++duplicates_;
    }
    cv_.notify_all();
    return transport::Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, Through(have)};
  }

  // Keeps a snapshot sent on `session` (the aggregator stores a snapshot's first copy).
  void DeliverSnapshot(const transport::Snapshot& snap, const MemorySession& session) {
    std::lock_guard lock(mu_);
    snapshots_.emplace_back(session.edge, snap);
    cv_.notify_all();
  }
  std::vector<std::pair<std::string, transport::Snapshot>> Snapshots() const {
    std::lock_guard lock(mu_);
    return snapshots_;
  }
  void DeliverSourceStates(const transport::SourceStates& states, const MemorySession& session) {
    std::lock_guard lock(mu_);
    source_states_.emplace_back(session.edge, states);
    cv_.notify_all();
  }
  std::vector<std::pair<std::string, transport::SourceStates>> SourceStatesReceived() const {
    std::lock_guard lock(mu_);
    return source_states_;
  }

  // Reports that stored something new, in arrival order, keyed (stream, run, seq_first).
  std::vector<Key> StoredOrder() const {
    std::lock_guard lock(mu_);
    return order_;
  }
  std::vector<transport::Report> StoredReports() const {
    std::lock_guard lock(mu_);
    return reports_;
  }
  size_t duplicates() const {
    std::lock_guard lock(mu_);
    return duplicates_;
  }
  size_t stale() const {
    std::lock_guard lock(mu_);
    return stale_;
  }
  size_t hellos() const {
    std::lock_guard lock(mu_);
    return hellos_;
  }
  uint64_t epochs_at(const std::string& edge) const {
    std::lock_guard lock(mu_);
    auto it = epochs_.find(edge);
    return it == epochs_.end() ? 0 : it->second;
  }
  // Waits until `n` reports stored something new; false after `timeout`.
  bool WaitStored(size_t n, std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return order_.size() >= n; });
  }

 private:
  static int64_t Through(const std::set<uint64_t>& have) {
    int64_t through = -1;
    for (uint64_t s : have) {
      if (s != static_cast<uint64_t>(through + 1)) break;
      through = static_cast<int64_t>(s);
    }
    return through;
  }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // something stored
  std::map<std::string, uint64_t> epochs_;  // GUARDED_BY(mu_) current epoch per edge id
  std::map<std::string, std::vector<std::weak_ptr<MemorySession>>> sessions_;  // GUARDED_BY(mu_)
  std::map<std::tuple<std::string, std::string, uint64_t>, std::set<uint64_t>> stored_;  // GUARDED_BY(mu_)
  std::vector<Key> order_;                   // GUARDED_BY(mu_)
  std::vector<transport::Report> reports_;   // GUARDED_BY(mu_)
  size_t duplicates_ = 0, stale_ = 0, hellos_ = 0;  // GUARDED_BY(mu_)
  std::vector<std::pair<std::string, transport::Snapshot>> snapshots_;  // GUARDED_BY(mu_) (edge, snapshot)
  std::vector<std::pair<std::string, transport::SourceStates>> source_states_;  // GUARDED_BY(mu_)
};

class MemoryLink final : public transport::Link {
 public:
  MemoryLink(std::shared_ptr<FakeAggregator> aggregator, std::string name)
      : aggregator_(std::move(aggregator)), name_(std::move(name)) {}
  ~MemoryLink() override { Close(); }

  // Fault controls.
  void FailOpen(bool fail) { fail_open_ = fail; }
  // The current (or next) session breaks after `n` more messages (Reports and Heartbeats); with
  // `then_down`, Open fails afterwards until FailOpen(false).
  void BreakAfter(int64_t n, bool then_down = false) {
    std::lock_guard lock(mu_);
    break_after_ = n;
    down_after_break_ = then_down;
  }
  void DropAcks(bool drop) { drop_acks_ = drop; }
  int breaks() const { return breaks_.load(); }
  int opens() const { return opens_.load(); }

  std::string_view kind() const override { return "memory"; }
  std::string target() const override { return "memory://" + name_; }
  std::string transports() const override { return {}; }

  StatusOr<transport::Welcome> Open(const transport::Hello& hello, std::chrono::milliseconds) override {
    Close();
    if (fail_open_.load()) return absl::UnavailableError(target() + ": injected: cannot connect");
    VIGIL_RETURN_IF_ERROR(transport::ValidateHello(hello));
    auto session = std::make_shared<MemorySession>();
    transport::Message answer = aggregator_->Hello(hello, session);
    if (const transport::Reject* r = std::get_if<transport::Reject>(&answer)) {
      const std::string what = StrCat(target(), ": Hello refused (", transport::ToString(r->reason), "): ", r->detail);
      if (r->reason == transport::RejectReason::kFenced) return absl::PermissionDeniedError(what);
      return absl::FailedPreconditionError(what);
    }
    std::lock_guard lock(mu_);
    session_ = session;
    ++opens_;
    return std::get<transport::Welcome>(answer);
  }

  Status Send(std::span<const transport::OutboxMessage* const> messages, std::chrono::milliseconds) override {
    std::shared_ptr<MemorySession> s = current();
    if (!s) return absl::UnavailableError(target() + ": no open session");
    for (const transport::OutboxMessage* m : messages) {
      transport::Report r = m->report;
      r.edge = s->edge;
      r.epoch = s->epoch;
      if (m->device && m->device->count > 0 && r.detections.empty()) {  // no host copy: download
        r.detections.resize(m->device->count);
        Status st = m->device->download(r.detections.data());
        if (!st.ok()) return absl::InternalError(StrCat(target(), ": message ", m->id, ": ", st.message()));
      }
      VIGIL_RETURN_IF_ERROR(Spend(*s));
      // Decided before the report is stored: a test that saw it stored knows whether its Ack was dropped.
      const bool drop_ack = drop_acks_.load();
      transport::Message answer = aggregator_->Deliver(r, *s);
      if (!(drop_ack && std::holds_alternative<transport::Ack>(answer))) s->Push(std::move(answer));
    }
    return absl::OkStatus();
  }

  Status SendHeartbeat(int64_t sent_ns, std::chrono::milliseconds) override {
    std::shared_ptr<MemorySession> s = current();
    if (!s) return absl::UnavailableError(target() + ": no open session");
    VIGIL_RETURN_IF_ERROR(Spend(*s));
    s->Push(transport::Heartbeat{sent_ns});
    return absl::OkStatus();
  }

  Status SendAside(const transport::Message& m, std::chrono::milliseconds) override {
    std::shared_ptr<MemorySession> s = current();
    if (!s) return absl::UnavailableError(target() + ": no open session");
    VIGIL_RETURN_IF_ERROR(Spend(*s));
    if (const auto* snap = std::get_if<transport::Snapshot>(&m)) {
      VIGIL_RETURN_IF_ERROR(transport::ValidateSnapshot(*snap));
      aggregator_->DeliverSnapshot(*snap, *s);
    } else if (const auto* states = std::get_if<transport::SourceStates>(&m)) {
      VIGIL_RETURN_IF_ERROR(transport::ValidateSourceStates(*states));
      aggregator_->DeliverSourceStates(*states, *s);
    } else {
      return absl::InvalidArgumentError(StrCat(target(), ": SendAside takes Snapshot or SourceStates"));
    }
    return absl::OkStatus();
  }

  StatusOr<std::optional<transport::Message>> Receive(std::chrono::milliseconds timeout) override {
    std::shared_ptr<MemorySession> s = current();
    if (!s) return absl::UnavailableError(target() + ": no open session");
    std::unique_lock lock(s->mu);
    s->cv.wait_for(lock, timeout, [&] { return s->broken || !s->inbox.empty(); });
    if (!s->inbox.empty()) {
      transport::Message m = std::move(s->inbox.front());
      s->inbox.pop_front();
      return std::optional<transport::Message>(std::move(m));
    }
    if (s->broken) return absl::UnavailableError(target() + ": session broken");
    return std::optional<transport::Message>();
  }

  void Close() override {
    std::shared_ptr<MemorySession> s;
    {
      std::lock_guard lock(mu_);
      s = std::move(session_);
    }
    if (s) s->Break();
  }

 private:
  std::shared_ptr<MemorySession> current() const {
    std::lock_guard lock(mu_);
    return session_;
  }

  // Counts one message against BreakAfter; Unavailable once the session broke.
  Status Spend(MemorySession& s) {
    {
      std::lock_guard lock(s.mu);
      if (s.broken) return absl::UnavailableError(target() + ": session broken");
    }
    bool now_broken = false;
    {
      std::lock_guard lock(mu_);
      if (break_after_ == 0) {
        now_broken = true;
        break_after_ = -1;
        if (down_after_break_) fail_open_ = true;
      } else if (break_after_ > 0) {
        --break_after_;
      }
    }
    if (!now_broken) return absl::OkStatus();
    ++breaks_;
    s.Break();
    return absl::UnavailableError(target() + ": injected: session broken");
  }

  const std::shared_ptr<FakeAggregator> aggregator_;
  const std::string name_;
  mutable std::mutex mu_;
  std::shared_ptr<MemorySession> session_;  // GUARDED_BY(mu_) null when no session is open
  int64_t break_after_ = -1;                // GUARDED_BY(mu_) messages until the break; -1 never
  bool down_after_break_ = false;           // GUARDED_BY(mu_)
  std::atomic<bool> fail_open_{false};
  std::atomic<bool> drop_acks_{false};
  std::atomic<int> breaks_{0}, opens_{0};
};

}  // namespace vigil::testing
