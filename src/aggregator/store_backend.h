// src/aggregator/store_backend.h — internal to the aggregator: what a storage engine implements for
// aggregator::Store (store.h), and the decisions both engines share.
//
// Store::Open picks the engine from its target: a postgresql:// or postgres:// URL opens PostgreSQL
// (store_pg.cc, libpq), anything else is a SQLite file (store_sqlite.cc). Every method has the contract
// of the Store method of the same name (store.h), thread-safety included.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vigil/aggregator/store.h"

namespace vigil::aggregator {

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  virtual StatusOr<Grant> Admit(const std::string& edge, uint64_t held_epoch, bool promote,
                                std::span<const transport::HelloStream> streams, int64_t now_ns) = 0;
  // `decided` starts zeroed; Store::Apply checked the verdicts' and the decisions' shapes.
  virtual StatusOr<std::vector<ApplyResult>> Apply(std::span<const PendingReport> batch, int64_t now_ns,
                                                   std::span<const EventDecision> decisions,
                                                   DecisionResult& decided) = 0;
  virtual StatusOr<std::vector<StoredEvent>> Events(const EventQuery& query) const = 0;
  virtual StatusOr<uint64_t> PutSnapshots(std::span<const PendingSnapshot> batch, int64_t now_ns) = 0;
  virtual StatusOr<std::vector<StoredSnapshot>> Snapshots(const std::string& edge, const std::string& stream,
                                                          uint64_t run, uint64_t seq, bool with_jpeg) const = 0;
  virtual StatusOr<std::optional<StoredSnapshot>> LatestSnapshot(const std::string& edge,
                                                                 const std::string& stream) const = 0;
  virtual StatusOr<StoreStats> Stats(size_t max_gaps_per_run) const = 0;
  virtual StatusOr<int64_t> MaxTrackId() const = 0;
  virtual StatusOr<RetentionResult> Prune(const RetentionPolicy& policy, int64_t now_ns) = 0;
  virtual StatusOr<std::vector<OutboxItem>> PushDue(const std::string& sink, int64_t now_ns, int limit) const = 0;
  virtual StatusOr<std::optional<int64_t>> PushNextDue(const std::string& sink) const = 0;
  virtual StatusOr<uint64_t> PushDepth(const std::string& sink) const = 0;
  virtual Status PushDelivered(std::span<const int64_t> outbox_ids) = 0;
  virtual Status PushRetry(int64_t outbox_id, int attempts, int64_t next_ns, const std::string& error) = 0;
  virtual Status PushDead(int64_t outbox_id, int attempts, const std::string& error, int64_t now_ns) = 0;
  virtual StatusOr<std::vector<DeadLetter>> DeadLetters(const std::string& sink, int limit) const = 0;
  virtual StatusOr<uint64_t> ReplayDeadLetters(const std::string& sink, int64_t now_ns) = 0;
};

// `target` is a SQLite file path / a PostgreSQL URL; `shown` is how errors and logs name it (no password).
StatusOr<std::unique_ptr<StoreBackend>> OpenSqliteBackend(const std::string& target, const std::string& shown,
                                                          const StoreOptions& options);
// Errors: also Unimplemented when this vigil was built without libpq (VIGIL_WITH_POSTGRES=OFF).
StatusOr<std::unique_ptr<StoreBackend>> OpenPostgresBackend(const std::string& target, const std::string& shown,
                                                            const StoreOptions& options);

// ---- Shared by both engines ----

// The label of class `id` given the admitting Hello's class names ("class N" when out of range).
std::string LabelOf(const std::vector<std::string>* names, int64_t id);

// Whether `route` queues an event when it is stored in `state` (store.h, Push routes); a decision that confirms an
// event queues it for the routes with on_confirmed.
inline bool QueuesWhenStored(const PushRoute& route, EventState state, bool new_track) {
  if (route.once_per_track && !new_track) return false;
  return !route.on_confirmed || state == EventState::kConfirmed;
}
// Whether `route` queues an event a decision confirms.
inline bool QueuesWhenDecided(const PushRoute& route, const EventDecision& d) {
  return route.on_confirmed && (!route.once_per_track || d.new_track);
}

// The event columns every event query of both engines selects, in the order EventFromRow reads them (aliases: e the
// event, s its stream): VIGIL_EVENT_COLUMN_COUNT of them.
#define VIGIL_EVENT_COLUMNS                                                                                      \
  "e.id, s.edge, s.stream, e.run, e.seq, e.epoch, e.capture_ns, e.pts_ns, e.publish_ns, e.stored_ns, e.severity, " \
  "e.rule, e.width, e.height, e.state, e.state_reason, e.decided_ns"
inline constexpr int kEventColumnCount = 17;

// A stored event's columns from a result row of either engine (VIGIL_EVENT_COLUMNS) from column `at` on;
// detections are read apart. `row` has Int(col), U64(col) and Text(col).
template <typename Row>
StoredEvent EventFromRow(const Row& row, int at) {
  StoredEvent ev;
  ev.id = row.Int(at + 0);
  ev.edge = row.Text(at + 1);
  ev.stream = row.Text(at + 2);
  ev.run = row.U64(at + 3);
  ev.seq = row.U64(at + 4);
  ev.epoch = row.U64(at + 5);
  ev.capture_ns = row.Int(at + 6);
  ev.pts_ns = row.Int(at + 7);
  ev.publish_ns = row.Int(at + 8);
  ev.stored_ns = row.Int(at + 9);
  ev.severity = row.Text(at + 10);
  ev.rule = row.Text(at + 11);
  ev.width = static_cast<uint32_t>(row.Int(at + 12));
  ev.height = static_cast<uint32_t>(row.Int(at + 13));
  if (!ParseEventState(row.Text(at + 14), &ev.state)) ev.state = EventState::kConfirmed;  // the schema's CHECK holds
  ev.state_reason = row.Text(at + 15);
  ev.decided_ns = row.Int(at + 16);
  return ev;
}
// A stored snapshot's columns in the order every snapshot query selects them (SnapshotFromRow reads them), then the
// JPEG (read apart: the engines return bytes differently).
#define VIGIL_SNAPSHOT_COLUMNS "edge, stream, run, seq, box, x, y, width, height, out_width, out_height, stored_ns"
// The number of an event's snapshots, selected after the event columns by both engines' event queries (aliases: e
// the event, s its stream).
#define VIGIL_EVENT_SNAPSHOT_COUNT                                                                           \
  "(SELECT COUNT(*) FROM snapshots p WHERE p.edge = s.edge AND p.stream = s.stream AND p.run = e.run AND " \
  "p.seq = e.seq)"
template <typename Row>
StoredSnapshot SnapshotFromRow(const Row& row) {
  StoredSnapshot s;
  s.edge = row.Text(0);
  s.stream = row.Text(1);
  s.run = row.U64(2);
  s.seq = row.U64(3);
  s.box = static_cast<int32_t>(row.Int(4));
  s.x = static_cast<uint32_t>(row.Int(5));
  s.y = static_cast<uint32_t>(row.Int(6));
  s.width = static_cast<uint32_t>(row.Int(7));
  s.height = static_cast<uint32_t>(row.Int(8));
  s.out_width = static_cast<uint32_t>(row.Int(9));
  s.out_height = static_cast<uint32_t>(row.Int(10));
  s.stored_ns = row.Int(11);
  return s;
}

// The Admit decision for an edge whose current granted epoch is `current` (0: never granted), holding
// `held` (store.h, Store::Admit). Fills kind, epoch, previous_epoch and held_unknown of the Grant.
// Errors: OutOfRange when no larger 64-bit epoch is left to grant.
StatusOr<Grant> DecideGrant(uint64_t held, bool promote, uint64_t current);

// Walks the stored seqs of a run above its contiguous prefix, in ascending order, and records the gaps
// (RunStats::gaps, missing, last_seq). Start with r.contiguous_through set; call Seq for each stored seq.
class GapWalk {
 public:
  GapWalk(RunStats& r, size_t max_gaps)
      : r_(r), max_gaps_(max_gaps), expected_(static_cast<uint64_t>(r.contiguous_through + 1)) {
    r_.last_seq = static_cast<uint64_t>(r_.contiguous_through);
  }
  void Seq(uint64_t seq) {
    if (seq > expected_) {
      if (r_.gaps.size() < max_gaps_) r_.gaps.push_back({expected_, seq - 1});
      r_.missing += seq - expected_;
    }
    expected_ = seq + 1;
    r_.last_seq = seq;
  }

 private:
  RunStats& r_;
  size_t max_gaps_;
  uint64_t expected_;
};

// What retention (RunRetention) needs of an engine; each Delete* is one transaction of its own.
class RetentionOps {
 public:
  struct Row {
    int64_t key = 0;        // event id / frame seq
    int64_t stored_ns = 0;  // when it was stored
  };
  struct RunRef {
    int64_t stream_id = 0, run = 0, through = 0;  // run by bit pattern; through = its contiguous prefix (≥ 0)
  };
  virtual ~RetentionOps() = default;
  virtual StatusOr<uint64_t> CountEvents() = 0;
  // The oldest events (ascending id) no outbox row refers to, at most `limit`.
  virtual StatusOr<std::vector<Row>> OldestEvents(int limit) = 0;
  struct Deleted {
    uint64_t dead_letters = 0, snapshots = 0;
  };
  // Deletes the events with their detections, dead letters and snapshots; returns how many of those went.
  virtual StatusOr<Deleted> DeleteEvents(const std::vector<int64_t>& ids) = 0;
  // Deletes the snapshots stored before `before_ns` whose event is not stored; returns how many.
  virtual StatusOr<uint64_t> DeleteOrphanSnapshots(int64_t before_ns) = 0;
  virtual StatusOr<uint64_t> KeptForPush(int64_t cutoff_ns) = 0;  // events stored before cutoff still in an outbox
  virtual StatusOr<std::vector<RunRef>> PrefixRuns() = 0;          // runs whose prefix is not empty
  // The run's lowest frame rows at or below its prefix, ascending seq, at most `limit`.
  virtual StatusOr<std::vector<Row>> OldestFrames(const RunRef& run, int limit) = 0;
  virtual Status DeleteFrames(const RunRef& run, int64_t through_seq) = 0;  // its rows with seq ≤ through_seq
};

// Store::Prune over an engine's RetentionOps: events oldest first while past the age or count limit (skipping
// those still in an outbox), then each run's frame rows at or below its prefix while older than the age limit,
// in chunks of policy.chunk rows.
StatusOr<RetentionResult> RunRetention(RetentionOps& ops, const RetentionPolicy& policy, int64_t now_ns);

// Adds a stream's runs into its totals and the per-edge totals, and lists the edges (StoreStats):
// `edges` holds the edges table's rows (epoch and times), keyed by edge id.
void SumStats(StoreStats& out, std::map<std::string, EdgeStats> edges);

}  // namespace vigil::aggregator
