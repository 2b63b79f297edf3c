// aggregator::Store (store.h): picks the engine from the target and holds what both engines share.
#include "vigil/aggregator/store.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include <spdlog/spdlog.h>

#include "aggregator/store_backend.h"

namespace vigil::aggregator {
namespace {

bool IsPostgresUrl(const std::string& target) {
  return target.starts_with("postgresql://") || target.starts_with("postgres://");
}

}  // namespace

std::string Store::Redacted(const std::string& target) {
  if (!IsPostgresUrl(target)) return target;
  // scheme://[user[:password]@]host...: hide the password; a password=… query parameter too.
  std::string out = target;
  const size_t scheme_end = out.find("://") + 3;
  const size_t at = out.find('@', scheme_end);
  const size_t slash = out.find('/', scheme_end);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
    const size_t colon = out.find(':', scheme_end);
    if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
  }
  for (size_t p = out.find("password="); p != std::string::npos; p = out.find("password=", p + 1)) {
    if (p > 0 && out[p - 1] != '?' && out[p - 1] != '&') continue;
    const size_t end = std::min(out.find('&', p), out.size());
    out.replace(p + 9, end - p - 9, "***");
  }
  return out;
}

StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& target, StoreOptions options) {
  const std::string shown = Redacted(target);
  const bool pg = IsPostgresUrl(target);
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<StoreBackend> backend,
                         pg ? OpenPostgresBackend(target, shown, options) : OpenSqliteBackend(target, shown, options));
  return std::unique_ptr<Store>(new Store(shown, pg ? "postgresql" : "sqlite", std::move(backend)));
}

Store::Store(std::string path, const char* engine, std::unique_ptr<StoreBackend> backend)
    : path_(std::move(path)), engine_(engine), backend_(std::move(backend)) {}
Store::~Store() = default;

StatusOr<Grant> Store::Admit(const std::string& edge, uint64_t held_epoch, bool promote,
                             std::span<const transport::HelloStream> streams, int64_t now_ns) {
  StatusOr<Grant> g = backend_->Admit(edge, held_epoch, promote, streams, now_ns);
  if (g.ok() && g->held_unknown) {
    spdlog::warn("store {}: edge {} holds epoch {}, which this store never granted (its newest was {}): granted {}",
                 path_, edge, held_epoch, g->previous_epoch, g->epoch);
  }
  return g;
}
StatusOr<std::vector<ApplyResult>> Store::Apply(std::span<const PendingReport> batch, int64_t now_ns,
                                                std::span<const EventDecision> decisions, DecisionResult* decided) {
  for (const PendingReport& p : batch) {
    if (p.verdict != nullptr && !p.verdict->track_ids.empty() &&
        p.verdict->track_ids.size() != p.report->detections.size()) {
      return absl::InvalidArgumentError(StrCat("store: the verdict on ", p.report->edge, "/", p.report->stream, " seq ",
                                               p.report->seq_first, " has ", p.verdict->track_ids.size(),
                                               " track ids for ", p.report->detections.size(), " detections"));
    }
  }
  for (const EventDecision& d : decisions) {
    if (d.state == EventState::kPending) {
      return absl::InvalidArgumentError(StrCat("store: a decision on ", d.edge, "/", d.stream, " seq ", d.seq,
                                               " must confirm or reject, not leave it pending"));
    }
  }
  DecisionResult ignored;
  if (decided == nullptr) decided = &ignored;
  *decided = {};
  decided->applied.assign(decisions.size(), 0);
  StatusOr<std::vector<ApplyResult>> r = backend_->Apply(batch, now_ns, decisions, *decided);
  if (!r.ok()) decided->applied.assign(decisions.size(), 0);
  return r;
}

std::string_view ToString(EventState s) {
  switch (s) {
    case EventState::kPending:
      return "pending";
    case EventState::kConfirmed:
      return "confirmed";
    case EventState::kRejected:
      return "rejected";
  }
  return "?";
}

bool ParseEventState(std::string_view name, EventState* out) {
  for (EventState s : {EventState::kPending, EventState::kConfirmed, EventState::kRejected}) {
    if (name == ToString(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}
StatusOr<std::vector<StoredEvent>> Store::Events(const EventQuery& query) const { return backend_->Events(query); }
StatusOr<uint64_t> Store::PutSnapshots(std::span<const PendingSnapshot> batch, int64_t now_ns) {
  if (batch.empty()) return uint64_t{0};
  return backend_->PutSnapshots(batch, now_ns);
}
StatusOr<std::vector<StoredSnapshot>> Store::Snapshots(const std::string& edge, const std::string& stream, uint64_t run,
                                                       uint64_t seq, bool with_jpeg) const {
  return backend_->Snapshots(edge, stream, run, seq, with_jpeg);
}
StatusOr<std::optional<StoredSnapshot>> Store::LatestSnapshot(const std::string& edge, const std::string& stream) const {
  return backend_->LatestSnapshot(edge, stream);
}
StatusOr<StoreStats> Store::Stats(size_t max_gaps_per_run) const { return backend_->Stats(max_gaps_per_run); }
StatusOr<int64_t> Store::MaxTrackId() const { return backend_->MaxTrackId(); }
StatusOr<RetentionResult> Store::Prune(const RetentionPolicy& policy, int64_t now_ns) {
  return backend_->Prune(policy, now_ns);
}
StatusOr<std::vector<OutboxItem>> Store::PushDue(const std::string& sink, int64_t now_ns, int limit) const {
  return backend_->PushDue(sink, now_ns, limit);
}
StatusOr<std::optional<int64_t>> Store::PushNextDue(const std::string& sink) const {
  return backend_->PushNextDue(sink);
}
StatusOr<uint64_t> Store::PushDepth(const std::string& sink) const { return backend_->PushDepth(sink); }
Status Store::PushDelivered(std::span<const int64_t> outbox_ids) { return backend_->PushDelivered(outbox_ids); }
Status Store::PushRetry(int64_t outbox_id, int attempts, int64_t next_ns, const std::string& error) {
  return backend_->PushRetry(outbox_id, attempts, next_ns, error);
}
Status Store::PushDead(int64_t outbox_id, int attempts, const std::string& error, int64_t now_ns) {
  return backend_->PushDead(outbox_id, attempts, error, now_ns);
}
StatusOr<std::vector<DeadLetter>> Store::DeadLetters(const std::string& sink, int limit) const {
  return backend_->DeadLetters(sink, limit);
}
StatusOr<uint64_t> Store::ReplayDeadLetters(const std::string& sink, int64_t now_ns) {
  return backend_->ReplayDeadLetters(sink, now_ns);
}

// ---- Shared by both engines ----

std::string LabelOf(const std::vector<std::string>* names, int64_t id) {
  if (names != nullptr && id >= 0 && static_cast<uint64_t>(id) < names->size()) return (*names)[static_cast<size_t>(id)];
  return StrCat("class ", id);
}

StatusOr<Grant> DecideGrant(uint64_t held, bool promote, uint64_t current) {
  Grant g;
  g.previous_epoch = current;
  if (held == 0 || promote || held > current) {
    const uint64_t base = std::max(held, current);
    if (base == std::numeric_limits<uint64_t>::max()) {
      return absl::OutOfRangeError(StrCat("epoch ", base, " leaves no larger 64-bit epoch to grant"));
    }
    g.kind = Grant::kNew;
    g.epoch = base + 1;
    g.held_unknown = held > current;
  } else if (held == current) {
    g.kind = Grant::kReadmitted;
    g.epoch = current;
  } else {
    g.kind = Grant::kFenced;
    g.epoch = current;
  }
  return g;
}

void SumStats(StoreStats& out, std::map<std::string, EdgeStats> edges) {
  for (StreamStats& s : out.streams) {
    for (const RunStats& r : s.runs) {
      s.frames += r.frames;
      s.events += r.events;
      s.dropped += r.dropped;
      s.lost += r.lost;
      s.missing += r.missing;
    }
    EdgeStats& e = edges[s.edge];
    ++e.streams;
    e.frames += s.frames;
    e.events += s.events;
    e.dropped += s.dropped;
    e.lost += s.lost;
    e.duplicates += s.duplicates;
    e.stale_rejected += s.stale_rejected;
    e.missing += s.missing;
  }
  for (auto& [name, e] : edges) {
    e.edge = name;
    out.edges.push_back(e);
  }
}

StatusOr<RetentionResult> RunRetention(RetentionOps& ops, const RetentionPolicy& policy, int64_t now_ns) {
  RetentionResult out;
  if (!policy.any()) return out;
  const int64_t cutoff = policy.max_age_ns > 0 ? now_ns - policy.max_age_ns : std::numeric_limits<int64_t>::min();
  uint64_t over_count = 0;
  if (policy.max_events > 0) {
    VIGIL_ASSIGN_OR_RETURN(const uint64_t n, ops.CountEvents());
    over_count = n > policy.max_events ? n - policy.max_events : 0;
  }
  // A chunk of rows whose leading part is due; `due` says whether one is. Returns the leading due rows' count.
  auto leading = [](const std::vector<RetentionOps::Row>& rows, auto&& due) {
    size_t n = 0;
    while (n < rows.size() && due(rows[n])) ++n;
    return n;
  };
  for (;;) {
    VIGIL_ASSIGN_OR_RETURN(std::vector<RetentionOps::Row> rows, ops.OldestEvents(policy.chunk));
    uint64_t over = over_count;
    const size_t n = leading(rows, [&](const RetentionOps::Row& row) {
      if (row.stored_ns >= cutoff && over == 0) return false;
      if (over > 0) --over;
      return true;
    });
    if (n == 0) break;
    std::vector<int64_t> ids;
    ids.reserve(n);
    for (size_t i = 0; i < n; ++i) ids.push_back(rows[i].key);
    VIGIL_ASSIGN_OR_RETURN(const RetentionOps::Deleted deleted, ops.DeleteEvents(ids));
    out.events += n;
    out.dead_letters += deleted.dead_letters;
    out.snapshots += deleted.snapshots;
    over_count = over;
    if (n < rows.size() || rows.size() < static_cast<size_t>(policy.chunk)) break;
  }
  VIGIL_ASSIGN_OR_RETURN(const uint64_t orphans, ops.DeleteOrphanSnapshots(now_ns - Store::kOrphanSnapshotNs));
  out.snapshots += orphans;
  if (policy.max_age_ns <= 0) return out;
  VIGIL_ASSIGN_OR_RETURN(out.kept_for_push, ops.KeptForPush(cutoff));
  VIGIL_ASSIGN_OR_RETURN(const std::vector<RetentionOps::RunRef> runs, ops.PrefixRuns());
  for (const RetentionOps::RunRef& run : runs) {
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(std::vector<RetentionOps::Row> rows, ops.OldestFrames(run, policy.chunk));
      const size_t n = leading(rows, [&](const RetentionOps::Row& row) { return row.stored_ns < cutoff; });
      if (n == 0) break;
      VIGIL_RETURN_IF_ERROR(ops.DeleteFrames(run, rows[n - 1].key));
      out.frames += n;
      if (n < rows.size() || rows.size() < static_cast<size_t>(policy.chunk)) break;
    }
  }
  return out;
}

bool RouteMatches(const PushRoute& route, const std::string& edge, const std::string& stream,
                  const std::string& severity, const std::vector<std::string>& labels) {
  auto listed = [](const std::vector<std::string>& list, const std::string& v) {
    return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
  };
  if (!listed(route.edges, edge) || !listed(route.streams, stream)) return false;
  if (!route.classes.empty() && std::none_of(labels.begin(), labels.end(), [&](const std::string& l) {
        return listed(route.classes, l);
      })) {
    return false;
  }
  auto rank = [](const std::string& sev) {
    return sev == "critical" ? 3 : sev == "warning" ? 2 : sev == "info" ? 1 : 0;
  };
  return rank(severity) >= rank(route.min_severity);
}

}  // namespace vigil::aggregator
