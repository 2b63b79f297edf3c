#include "aggregator/ingest.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include "vigil/common/deadline.h"

namespace vigil::aggregator {

using transport::RejectReason;
using transport::Report;
using transport::Session;

namespace {

IngestOptions WithDefaults(IngestOptions o) {
  if (!o.send) o.send = [](Session& s, std::string frames) { (void)s.Enqueue(std::move(frames)); };
  return o;
}

}  // namespace

Ingest::Ingest(IngestOptions options)
    : o_(WithDefaults(std::move(options))),
      registry_(*o_.registry),
      stored_reports_(registry_.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "stored"}})),
      duplicate_reports_(
          registry_.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "duplicate"}})),
      stale_reports_(registry_.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "stale"}})),
      superseded_reports_(
          registry_.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "superseded"}})),
      hellos_granted_(registry_.GetCounter("vigil_aggregator_hellos_total", "Hellos by decision", {{"result", "granted"}})),
      hellos_readmitted_(
          registry_.GetCounter("vigil_aggregator_hellos_total", "Hellos by decision", {{"result", "readmitted"}})),
      hellos_fenced_(registry_.GetCounter("vigil_aggregator_hellos_total", "Hellos by decision", {{"result", "fenced"}})),
      evicted_sessions_(registry_.GetCounter("vigil_aggregator_evicted_sessions_total",
                                             "Sessions fenced off because their edge id was granted a newer epoch")),
      commit_seconds_(registry_.GetHistogram("vigil_aggregator_commit_seconds", "Duration of one storage transaction",
                                             metrics::LatencyBuckets())),
      storage_errors_(registry_.GetCounter("vigil_aggregator_storage_errors_total", "Storage transactions that failed")),
      queue_depth_(registry_.GetGauge("vigil_aggregator_queue_depth", "Reports received and waiting for storage")),
      snapshots_stored_(Snapshots("stored")),
      snapshots_duplicate_(Snapshots("duplicate")),
      snapshots_queue_full_(Snapshots("dropped_queue_full")),
      snapshots_superseded_(Snapshots("dropped_superseded")),
      snapshots_stopping_(Snapshots("dropped_stopping")),
      snapshots_failed_(Snapshots("storage_failed")),
      snapshot_bytes_(registry_.GetCounter("vigil_aggregator_snapshot_bytes_total",
                                           "JPEG bytes of the snapshots given to storage (repeats of stored ones "
                                           "included)")),
      edges_connected_(registry_.GetGauge("vigil_aggregator_edges_connected", "Edge connections past their Hello")) {
  registry_.AddCollectHook([this] {  // read at every scrape
    MutexLock lock(mu_);
    queue_depth_.Set(static_cast<double>(queue_.size()));
  });
}

metrics::Counter& Ingest::Snapshots(const char* result) {
  return registry_.GetCounter("vigil_aggregator_snapshots_total", "Snapshots (event pictures) received, by outcome",
                              {{"result", result}});
}

void Ingest::Pause() const { std::this_thread::sleep_for(std::chrono::nanoseconds(o_.failure_pause_ns)); }

// The Hello is decided on the storage thread, in queue order with the reports (a report queued before it
// is stored or refused under the epochs as they were).
Status Ingest::OnHello(const std::shared_ptr<Session>& s) {
  spdlog::info("aggregator: edge {} connected from {} (holds epoch {}{})", s->edge(), s->peer(), s->hello().epoch,
               (s->hello().flags & transport::kHelloPromote) != 0 ? ", promote" : "");
  MutexLock lock(mu_);
  sessions_.emplace(s->edge(), s);
  edges_connected_.Set(static_cast<double>(sessions_.size()));
  if (!closing_) queue_.push_back({s, std::nullopt});  // closing: never answered; the receiver closes it
  not_empty_.NotifyOne();
  return absl::OkStatus();
}

void Ingest::OnReport(const std::shared_ptr<Session>& s, Report r) {
  MutexLock lock(mu_);
  while (!closing_ && queue_.size() >= static_cast<size_t>(o_.queue_max)) not_full_.Wait(lock);
  if (closing_) return;  // not acked: the edge re-sends it to the next aggregator
  queue_.push_back({s, std::move(r)});
  not_empty_.NotifyOne();
}

// Never blocks the connection: a picture that finds the queue full is dropped and counted.
void Ingest::OnSnapshot(const std::shared_ptr<Session>& s, transport::Snapshot snap) {
  MutexLock lock(mu_);
  if (closing_ || s->superseded()) {
    (closing_ ? snapshots_stopping_ : snapshots_superseded_).Inc();
    return;
  }
  if (snapshot_queue_bytes_ + snap.jpeg.size() > static_cast<size_t>(o_.snapshot_queue_mb) << 20) {
    snapshots_queue_full_.Inc();
    return;
  }
  snapshot_queue_bytes_ += snap.jpeg.size();
  snapshot_queue_.push_back({s, std::move(snap)});
  not_empty_.NotifyOne();
}

void Ingest::OnSourceStates(const std::shared_ptr<Session>& s, transport::SourceStates states) {
  MutexLock lock(mu_);
  if (s->superseded()) return;
  for (const transport::SourceStates::Entry& e : states.streams) source_states_[{s->edge(), e.stream}] = e.state;
}

void Ingest::OnClose(const std::shared_ptr<Session>& s, const Status& why) {
  spdlog::info("aggregator: edge {} ({}) disconnected: {}", s->edge(), s->peer(), std::string(why.message()));
  MutexLock lock(mu_);
  auto [first, last] = sessions_.equal_range(s->edge());
  for (auto it = first; it != last; ++it) {
    if (it->second == s) {
      sessions_.erase(it);
      break;
    }
  }
  edges_connected_.Set(static_cast<double>(sessions_.size()));
}

IngestHealth Ingest::Health() const {
  MutexLock lock(mu_);
  return {storage_error_, sessions_.size(), queue_.size()};
}

IngestEdges Ingest::Edges() const {
  IngestEdges e;
  MutexLock lock(mu_);
  for (const auto& [edge, session] : sessions_) {
    e.connected.insert(edge);
    if (session->admitted() && !session->superseded()) e.links[edge].insert(session->link());
  }
  e.last_grant = last_grant_;
  e.sources = source_states_;
  return e;
}

bool Ingest::WaitForWork(int64_t wake_steady_ns, const std::atomic<bool>* also) {
  MutexLock lock(mu_);
  // From the Clock seam's steady time (SystemClock()'s origin is the Deadline's).
  const Deadline deadline = Deadline::AtSteadyNs(wake_steady_ns);
  while (!stop_storage_ && queue_.empty() && snapshot_queue_.empty() && !(also != nullptr && also->load())) {
    if (wake_steady_ns == INT64_MAX) {
      not_empty_.Wait(lock);
    } else if (!not_empty_.WaitUntil(lock, deadline)) {
      break;
    }
  }
  if (drop_queue_ || (stop_storage_ && queue_.empty())) {
    snapshots_stopping_.Inc(static_cast<double>(snapshot_queue_.size()));  // never stored: counted
    snapshot_queue_.clear();
    snapshot_queue_bytes_ = 0;
    return false;
  }
  return true;
}

void Ingest::ProcessNext() {
  std::vector<Item> batch;
  {
    MutexLock lock(mu_);
    if (queue_.empty()) return;
    // A Hello alone, or the reports up to the next Hello: a grant commits between the transactions
    // of the reports queued before and after it.
    if (!queue_.front().report) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    } else {
      while (!queue_.empty() && queue_.front().report && batch.size() < static_cast<size_t>(o_.batch_max)) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    not_full_.NotifyAll();
  }
  if (batch.front().report) {
    ProcessReports(batch);
  } else {
    ProcessHello(batch.front().session);
  }
}

void Ingest::StorageFailed(const Status& st) {
  storage_errors_.Inc();
  MutexLock lock(mu_);
  storage_error_ = std::string(st.message());
}

void Ingest::StorageHealthy() {
  MutexLock lock(mu_);
  storage_error_.clear();
}

void Ingest::WakeStorage() {
  MutexLock lock(mu_);
  not_empty_.NotifyAll();
}

void Ingest::Close(bool crash) {
  MutexLock lock(mu_);
  closing_ = true;
  stop_storage_ = true;
  drop_queue_ = crash;
  not_empty_.NotifyAll();
  not_full_.NotifyAll();
}

// Storage thread: the queued snapshots in one transaction (at most 256 pictures or 8 MiB at a time: the writer is
// held briefly, and PostgreSQL's hex parameters stay small).
void Ingest::ProcessSnapshots() {
  std::vector<PendingPicture> batch;
  {
    MutexLock lock(mu_);
    size_t taken_bytes = 0;
    while (!snapshot_queue_.empty() && batch.size() < 256 &&
           (batch.empty() || taken_bytes + snapshot_queue_.front().snapshot.jpeg.size() <= (size_t{8} << 20))) {
      taken_bytes += snapshot_queue_.front().snapshot.jpeg.size();
      snapshot_queue_bytes_ -= snapshot_queue_.front().snapshot.jpeg.size();
      batch.push_back(std::move(snapshot_queue_.front()));
      snapshot_queue_.pop_front();
    }
  }
  if (batch.empty()) return;
  std::vector<PendingSnapshot> pending;
  size_t bytes = 0;
  for (const PendingPicture& p : batch) {
    if (p.session->superseded()) {  // its edge re-sends nothing of it: the picture goes, counted
      snapshots_superseded_.Inc();
      continue;
    }
    pending.push_back({&p.session->edge(), &p.snapshot});
    bytes += p.snapshot.jpeg.size();
  }
  StatusOr<uint64_t> stored = o_.store->PutSnapshots(pending, o_.clock->WallNs());
  if (!stored.ok()) {
    StorageFailed(stored.status());
    snapshots_failed_.Inc(static_cast<double>(pending.size()));
    spdlog::error("aggregator: {} snapshots not stored: {}", pending.size(), std::string(stored.status().message()));
    return;
  }
  snapshots_stored_.Inc(static_cast<double>(*stored));
  snapshots_duplicate_.Inc(static_cast<double>(pending.size() - *stored));
  snapshot_bytes_.Inc(static_cast<double>(bytes));
}

// Grants (durably, before the Welcome) or refuses the epoch of one Hello; evicts older sessions.
void Ingest::ProcessHello(const std::shared_ptr<Session>& s) {
  const transport::Hello& h = s->hello();
  // A push route's class the edge's model does not have can never match: said once per (sink, class, edge).
  for (const PushRoute& route : o_.push_routes) {
    for (const std::string& cls : route.classes) {
      if (std::find(h.class_names.begin(), h.class_names.end(), cls) == h.class_names.end() &&
          warned_classes_.insert(StrCat(route.sink, "\n", cls, "\n", h.edge)).second) {
        spdlog::warn("aggregator: push sink '{}': route class '{}' is not a class of edge {}'s model: its events never "
                     "match it",
                     route.sink, cls, h.edge);
      }
    }
  }
  StatusOr<Grant> g =
      o_.store->Admit(h.edge, h.epoch, (h.flags & transport::kHelloPromote) != 0, h.streams, o_.clock->WallNs());
  if (!g.ok()) {
    if (g.status().code() == absl::StatusCode::kOutOfRange) {  // an epoch no grant can follow
      s->Refuse(RejectReason::kProtocolError, 0, StrCat("edge ", h.edge, ": ", g.status().message()));
      return;
    }
    StorageFailed(g.status());
    spdlog::error("aggregator: edge {}: cannot grant an epoch, closing its connection so it says Hello again: {}",
                  h.edge, std::string(g.status().message()));
    s->Close();
    Pause();  // no hot loop against a failing disk
    return;
  }
  StorageHealthy();
  if (g->kind == Grant::kFenced) {
    hellos_fenced_.Inc();
    spdlog::warn("aggregator: edge {} ({}): refusing held epoch {}: the current epoch is {}", h.edge, s->peer(),
                 h.epoch, g->epoch);
    s->Refuse(RejectReason::kFenced, g->epoch,
              StrCat("edge ", h.edge, ": epoch ", h.epoch, " is older than ", g->epoch,
                     ", held by a newer instance"));
    return;
  }
  (g->kind == Grant::kNew ? hellos_granted_ : hellos_readmitted_).Inc();
  // Evict the sessions of older epochs first, so no Welcome coexists with an older admitted session.
  std::vector<std::shared_ptr<Session>> older, same;
  {
    MutexLock lock(mu_);
    auto [first, last] = sessions_.equal_range(h.edge);
    for (auto it = first; it != last; ++it) {
      const std::shared_ptr<Session>& o = it->second;
      if (o == s || !o->admitted()) continue;
      if (o->epoch() < g->epoch) older.push_back(o);
      if (o->epoch() == g->epoch) same.push_back(o);
    }
  }
  // The same instance came back (a new session after a break, or a move to a preferred link): its old
  // session ends, and what it still had queued is ignored — the edge re-sends it here, after what the old
  // session stored, so nothing is stored out of order.
  for (const std::shared_ptr<Session>& o : same) {
    spdlog::info("aggregator: edge {}: the session on {} ({}) is superseded by the new one on {} ({})", h.edge,
                 o->link(), o->peer(), s->link(), s->peer());
    o->Supersede();
  }
  for (const std::shared_ptr<Session>& o : older) {
    evicted_sessions_.Inc();
    spdlog::warn("aggregator: edge {}: evicting the session of epoch {} ({}): epoch {} was granted to {}", h.edge,
                 o->epoch(), o->peer(), g->epoch, s->peer());
    // The evicted session is told, but not cut: a zombie that wakes up reads why it was fenced instead of a
    // reset, and whatever it still sends is refused as stale (counted) until it closes, or until its
    // silence reaches peer_timeout.
    o_.send(*o, transport::EncodeFrame(transport::Reject{
        RejectReason::kFenced, "", 0, 0, 0, g->epoch,
        StrCat("edge ", h.edge, ": epoch ", o->epoch(), " was superseded by epoch ", g->epoch,
               ", granted to a newer instance (", s->peer(), ")")}));
  }
  spdlog::info("aggregator: edge {} ({}): {} epoch {}", h.edge, s->peer(),
               g->kind == Grant::kNew ? "granted" : "re-admitted", g->epoch);
  current_epochs_[h.edge] = g->epoch;
  {
    MutexLock lock(mu_);
    // "replaced": a new instance took the edge id over from a granted epoch — a restart, or a standby's takeover.
    last_grant_[h.edge] = {g->kind == Grant::kReadmitted                      ? "readmitted"
                          : (h.flags & transport::kHelloPromote) != 0 ? "promote"
                          : g->previous_epoch > 0                     ? "replaced"
                                                                       : "new",
                          o_.clock->WallNs()};
  }
  s->Admit(transport::Welcome{g->epoch, std::move(g->streams)});
}

Ingest::StreamMetrics& Ingest::MetricsFor(const Report& r) {
  auto key = std::make_pair(r.edge, r.stream);
  auto it = stream_metrics_.find(key);
  if (it != stream_metrics_.end()) return it->second;
  const metrics::Labels l{{"edge", r.edge}, {"stream", r.stream}};
  StreamMetrics m{
      &registry_.GetCounter("vigil_aggregator_frames_total", "New frames stored (events and progress)", l),
      &registry_.GetCounter("vigil_aggregator_events_total", "Events stored", l),
      &registry_.GetCounter("vigil_aggregator_dropped_frames_total", "Frames the edge numbered but did not process", l),
      &registry_.GetCounter("vigil_aggregator_lost_frames_total", "Frames lost when an edge instance died", l),
      &registry_.GetCounter("vigil_aggregator_duplicate_frames_total", "Re-sent frames ignored", l),
      &registry_.GetCounter("vigil_aggregator_stale_rejected_total", "Reports refused for a stale epoch", l),
      &registry_.GetHistogram("vigil_aggregator_frame_to_stored_seconds",
                             "Capture on the edge to committed at the aggregator", metrics::LatencyBuckets(), l)};
  return stream_metrics_.emplace(key, m).first->second;
}

// Stores a batch of reports (no Hello among them) in one transaction, then queues the answers: one
// Enqueue per session. No socket I/O here.
void Ingest::ProcessReports(std::vector<Item>& batch) {
  // Reports of a superseded session are not stored: the edge re-sends them on its new session.
  std::erase_if(batch, [this](const Item& item) {
    if (!item.session->superseded()) return false;
    superseded_reports_.Inc();
    return true;
  });
  if (batch.empty()) return;
  const int64_t now = o_.clock->WallNs();
  std::vector<PendingReport> reports;
  reports.reserve(batch.size());
  for (const Item& item : batch) reports.push_back({&*item.report, &item.session->hello().class_names});
  // Confirmation: each event's verdict and track ids go into the transaction that stores it, and so do the
  // decisions on earlier events its frame brought.
  BatchConfirmation plan;
  if (o_.confirm != nullptr) {
    std::vector<ObservedReport> observed;
    observed.reserve(batch.size());
    for (const Item& item : batch) {
      const Report& r = *item.report;
      auto ep = current_epochs_.find(r.edge);
      observed.push_back({&r, &item.session->hello().class_names,
                          ep != current_epochs_.end() && ep->second == r.epoch});
    }
    o_.confirm->Observe(observed, reports, plan);
  }
  const int64_t t0 = o_.clock->SteadyNs();
  DecisionResult decided;
  StatusOr<std::vector<ApplyResult>> results = o_.store->Apply(reports, now, plan.decisions, &decided);
  commit_seconds_.Observe(static_cast<double>(o_.clock->SteadyNs() - t0) * 1e-9);
  if (o_.confirm != nullptr) {
    if (results.ok()) {
      o_.confirm->Committed(plan, reports, *results, decided, now);
    } else {
      o_.confirm->RolledBack(plan);
    }
  }
  if (!results.ok()) {
    StorageFailed(results.status());
    spdlog::error("aggregator: storing {} reports failed, closing their connections so the edges re-send: {}",
                  reports.size(), std::string(results.status().message()));
    for (const Item& item : batch) item.session->Close();
    Pause();  // no hot loop against a failing disk
    return;
  }
  StorageHealthy();
  const int64_t committed = o_.clock->WallNs();
  std::map<Session*, std::pair<std::shared_ptr<Session>, std::string>> replies;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Report& r = *batch[i].report;
    const ApplyResult& res = (*results)[i];
    StreamMetrics& m = MetricsFor(r);
    auto& [session, frames] = replies[batch[i].session.get()];
    session = batch[i].session;
    if (res.kind == ApplyResult::kStale) {
      stale_reports_.Inc();
      m.stale->Inc();
      transport::AppendFrame(
          transport::Reject{RejectReason::kStaleEpoch, r.stream, r.run, r.seq_first, r.seq_last, res.edge_epoch,
                            res.edge_epoch == 0
                                ? StrCat("edge ", r.edge, ": no epoch granted")
                                : StrCat("edge ", r.edge, ": epoch ", r.epoch, " is not the current epoch ",
                                         res.edge_epoch, " (held by a newer instance)")},
          &frames);
      continue;
    }
    (res.kind == ApplyResult::kStored ? stored_reports_ : duplicate_reports_).Inc();
    m.frames->Inc(static_cast<double>(res.new_frames));
    m.dropped->Inc(static_cast<double>(res.dropped_frames));
    m.lost->Inc(static_cast<double>(res.lost_frames));
    m.duplicates->Inc(static_cast<double>(res.duplicate_frames));
    if (res.event_stored) m.events->Inc();
    if (res.new_frames > 0 && r.capture_ns > 0) {
      m.frame_to_stored->Observe(static_cast<double>(committed - r.capture_ns) * 1e-9);
    }
    transport::AppendFrame(transport::Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, res.contiguous_through},
                           &frames);
  }
  // A full or closed session is closed by Enqueue: its edge reconnects and re-sends.
  for (auto& [raw, reply] : replies) o_.send(*reply.first, std::move(reply.second));
  if (decided.pushes_queued > 0 ||
      std::any_of(results->begin(), results->end(), [](const ApplyResult& r) { return r.pushes_queued > 0; })) {
    if (o_.wake_push) o_.wake_push();
  }
  if (std::any_of(results->begin(), results->end(), [](const ApplyResult& r) { return r.event_stored; })) {
    o_.live->EventsStored();
  }
}

}  // namespace vigil::aggregator
