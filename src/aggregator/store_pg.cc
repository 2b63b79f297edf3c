// The PostgreSQL engine of aggregator::Store (store.h), over libpq.
//
// Three connections, as SQLite's engine has: the writer (Admit, Apply, Prune; one thread), the reader
// (Events, Stats; read_mu) and the push connection (the outbox; push_mu). Statements are prepared once per
// connection (keyed by their text's address) and take text parameters; a batch goes in as arrays
// (`unnest($1::bigint[], …)`), so Apply costs about ten round trips whatever the batch size.
// A connection found broken is reset before its next statement, never inside a transaction: the
// transaction fails, is rolled back by the server, and the caller retries (the aggregator closes the
// batch's sessions and the edges re-send).
#include <libpq-fe.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "aggregator/schema.h"
#include "aggregator/store_backend.h"
#include "aggregator/store_pg_conn.h"
#include "vigil/common/mutex.h"

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::ReportKind;

// The schema and its migrations: schema.h (one description for both engines; integers are BIGINT, uint64 by bit
// pattern, floats DOUBLE PRECISION). The libpq layer (Conn, results, parameters): store_pg_conn.h.

// The event columns every event query selects (EventFromRow reads them in this order).
#define VIGIL_PG_EVENT_COLUMNS VIGIL_EVENT_COLUMNS

using pg::Array;
using pg::BytesOf;
using pg::Conn;
using pg::HexBytes;
using pg::Int;
using pg::P;
using pg::PgRow;
using pg::Real;
using pg::Result;
using pg::Text;
using pg::U64;

// Fills the detections of `events` (one query for all).
template <typename T, typename Get>
Status ReadDetections(Conn& c, std::vector<T>& items, Get&& event_of) {
  if (items.empty()) return absl::OkStatus();
  Array ids;
  std::unordered_map<int64_t, std::vector<StoredEvent*>> by_id;
  for (T& item : items) {
    StoredEvent& ev = event_of(item);
    ids.Add(ev.id);
    by_id[ev.id].push_back(&ev);
  }
  static constexpr const char* kSql =
      "SELECT event_id, class_id, label, score, x1, y1, x2, y2, track_id, second_label, second_score FROM detections "
      "WHERE event_id = ANY($1::bigint[]) ORDER BY event_id, idx";
  VIGIL_ASSIGN_OR_RETURN(Result r, c.Run(kSql, {ids.Done()}, "read detections"));
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    const StoredDetection d{static_cast<int32_t>(Int(r.get(), i, 1)), Text(r.get(), i, 2),
                            static_cast<float>(Real(r.get(), i, 3)),  static_cast<float>(Real(r.get(), i, 4)),
                            static_cast<float>(Real(r.get(), i, 5)),  static_cast<float>(Real(r.get(), i, 6)),
                            static_cast<float>(Real(r.get(), i, 7)),  Int(r.get(), i, 8),
                            Text(r.get(), i, 9),                      static_cast<float>(Real(r.get(), i, 10))};
    for (StoredEvent* ev : by_id[Int(r.get(), i, 0)]) ev->detections.push_back(d);
  }
  return absl::OkStatus();
}

class PgBackend final : public StoreBackend {
 public:
  PgBackend(std::unique_ptr<Conn> w, std::unique_ptr<Conn> r, std::unique_ptr<Conn> p, std::vector<PushRoute> routes)
      : w_(std::move(w)), r_(std::move(r)), p_(std::move(p)), routes_(std::move(routes)) {}

  StatusOr<Grant> Admit(const std::string& edge, uint64_t held_epoch, bool promote,
                        std::span<const transport::HelloStream> streams, int64_t now_ns) override {
    Grant g;
    Status st = w_->InTransaction([&]() -> Status {
      // The row first (epoch 0: never granted), then its lock: two aggregators admitting one edge serialize here.
      static constexpr const char* kPlaceholder =
          "INSERT INTO edges(edge, epoch, first_seen_ns, last_seen_ns, granted_ns) VALUES($1, 0, $2, $2, 0) "
          "ON CONFLICT (edge) DO NOTHING";
      VIGIL_RETURN_IF_ERROR(w_->Run(kPlaceholder, {edge, P(now_ns)}, "admit: add the edge").status());
      static constexpr const char* kLock = "SELECT epoch FROM edges WHERE edge = $1 FOR UPDATE";
      VIGIL_ASSIGN_OR_RETURN(Result cur, w_->Run(kLock, {edge}, "admit: lock the edge's epoch"));
      VIGIL_ASSIGN_OR_RETURN(g, DecideGrant(held_epoch, promote, U64(cur.get(), 0, 0)));
      if (g.kind == Grant::kNew) {
        static constexpr const char* kGrant =
            "UPDATE edges SET epoch = $2, last_seen_ns = $3, granted_ns = $3 WHERE edge = $1";
        VIGIL_RETURN_IF_ERROR(w_->Run(kGrant, {edge, P(g.epoch), P(now_ns)}, "admit: grant").status());
      } else if (g.kind == Grant::kReadmitted) {
        VIGIL_RETURN_IF_ERROR(w_->Run(kTouchEdge, {edge, P(now_ns)}, "admit: readmit").status());
      } else {
        return absl::OkStatus();
      }
      static constexpr const char* kStored =
          "SELECT (SELECT contiguous_through FROM runs WHERE stream_id = s.id AND run = $3), "
          "(SELECT max(seq) FROM frames WHERE stream_id = s.id AND run = $3) FROM streams s "
          "WHERE s.edge = $1 AND s.stream = $2";
      g.streams.reserve(streams.size());
      for (const transport::HelloStream& hs : streams) {
        transport::WelcomeStream& ws = g.streams.emplace_back();
        ws.stream = hs.stream;
        ws.run = hs.run;
        VIGIL_ASSIGN_OR_RETURN(Result r, w_->Run(kStored, {edge, hs.stream, P(hs.run)}, "admit: what is stored"));
        if (PQntuples(r.get()) == 0) continue;
        if (!PQgetisnull(r.get(), 0, 0)) ws.contiguous_through = Int(r.get(), 0, 0);
        if (!PQgetisnull(r.get(), 0, 1)) ws.highest_seq = Int(r.get(), 0, 1);
      }
      return absl::OkStatus();
    });
    if (!st.ok()) {
      DropCaches();
      return Annotate(st, StrCat("admit edge ", edge, " (held epoch ", held_epoch, ")"));
    }
    return g;
  }

  StatusOr<std::vector<ApplyResult>> Apply(std::span<const PendingReport> batch, int64_t now_ns,
                                           std::span<const EventDecision> decisions, DecisionResult& decided) override {
    std::vector<ApplyResult> results(batch.size());
    Status st = ApplyBatch(batch, now_ns, decisions, decided, results);  // BEGIN … COMMIT
    if (!st.ok()) {
      w_->Rollback();
      DropCaches();  // the caches may hold rolled-back rows
      decided = {};
      decided.applied.assign(decisions.size(), 0);
      return Annotate(st, StrCat("store a batch of ", batch.size(), " reports and ", decisions.size(), " decisions"));
    }
    return results;
  }

  StatusOr<std::vector<StoredEvent>> Events(const EventQuery& q) const override {
    MutexLock lock(read_mu_);
#define VIGIL_PG_EVENTS_WHERE                                                                                   \
  "SELECT " VIGIL_PG_EVENT_COLUMNS ", " VIGIL_EVENT_SNAPSHOT_COUNT                                               \
  " FROM events e JOIN streams s ON s.id = e.stream_id WHERE e.id > $1 AND e.id < $6 AND e.capture_ns >= $2 AND " \
  "($3 = '' OR s.edge = $3) AND ($4 = '' OR s.stream = $4) AND ($8 = '' OR e.severity = $8) AND ($7 = '' OR "    \
  "EXISTS (SELECT 1 FROM detections d WHERE d.event_id = e.id AND d.label = $7)) AND ($9::int = 0 OR "          \
  "(e.run = $10::bigint AND e.seq = $11::bigint)) AND ($12 = '' OR e.state = $12) "
    static constexpr const char* kAsc = VIGIL_PG_EVENTS_WHERE "ORDER BY e.id LIMIT $5";
    static constexpr const char* kDesc = VIGIL_PG_EVENTS_WHERE "ORDER BY e.id DESC LIMIT $5";
#undef VIGIL_PG_EVENTS_WHERE
    VIGIL_ASSIGN_OR_RETURN(Result r, r_->Run(q.newest_first ? kDesc : kAsc,
                                             {P(q.since_id), P(q.since_ns), q.edge, q.stream, P(q.limit),
                                              P(q.before_id), q.label, q.severity, P(q.by_frame ? 1 : 0),
                                              P(q.run), P(q.seq), q.state},
                                             "query events"));
    std::vector<StoredEvent> out;
    for (int i = 0; i < PQntuples(r.get()); ++i) {
      out.push_back(EventFromRow(PgRow{r.get(), i}, 0));
      out.back().snapshots = static_cast<uint32_t>(Int(r.get(), i, kEventColumnCount));
    }
    VIGIL_RETURN_IF_ERROR(ReadDetections(*r_, out, [](StoredEvent& e) -> StoredEvent& { return e; }));
    return out;
  }

  StatusOr<uint64_t> PutSnapshots(std::span<const PendingSnapshot> batch, int64_t now_ns) override {
    static constexpr const char* kSql =
        "INSERT INTO snapshots(edge, stream, run, seq, box, x, y, width, height, out_width, out_height, stored_ns, "
        "jpeg) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::bytea) ON CONFLICT DO NOTHING";
    std::vector<Conn::Step> steps;
    steps.reserve(batch.size());
    const std::string now = P(now_ns);
    for (const PendingSnapshot& p : batch) {
      const transport::Snapshot& x = *p.snapshot;
      steps.push_back({kSql,
                       {*p.edge, x.stream, P(x.run), P(x.seq), P(static_cast<int64_t>(x.box)), P(int64_t{x.x}),
                        P(int64_t{x.y}), P(int64_t{x.width}), P(int64_t{x.height}), P(int64_t{x.out_width}),
                        P(int64_t{x.out_height}), now, HexBytes(x.jpeg)},
                       "store a snapshot"});
    }
    StatusOr<std::vector<Result>> r = w_->Pipeline(steps, /*begin=*/true, /*commit=*/true);
    if (!r.ok()) {
      w_->Rollback();
      return Annotate(r.status(), StrCat("store a batch of ", batch.size(), " snapshots"));
    }
    uint64_t stored = 0;
    for (const Result& res : *r) stored += std::strtoull(PQcmdTuples(res.get()), nullptr, 10);
    return stored;
  }

  StatusOr<std::vector<StoredSnapshot>> Snapshots(const std::string& edge, const std::string& stream, uint64_t run,
                                                  uint64_t seq, bool with_jpeg) const override {
    MutexLock lock(read_mu_);
    static constexpr const char* kWith = "SELECT " VIGIL_SNAPSHOT_COLUMNS
                                         ", jpeg FROM snapshots WHERE edge = $1 AND stream = $2 AND run = $3 AND "
                                         "seq = $4 ORDER BY box";
    static constexpr const char* kMeta = "SELECT " VIGIL_SNAPSHOT_COLUMNS
                                         " FROM snapshots WHERE edge = $1 AND stream = $2 AND run = $3 AND seq = $4 "
                                         "ORDER BY box";
    VIGIL_ASSIGN_OR_RETURN(Result r, r_->Run(with_jpeg ? kWith : kMeta, {edge, stream, P(run), P(seq)},
                                             "query snapshots"));
    return ReadSnapshots(r.get(), with_jpeg);
  }

  StatusOr<std::optional<StoredSnapshot>> LatestSnapshot(const std::string& edge,
                                                         const std::string& stream) const override {
    MutexLock lock(read_mu_);
    static constexpr const char* kSql = "SELECT " VIGIL_SNAPSHOT_COLUMNS
                                        ", jpeg FROM snapshots WHERE edge = $1 AND stream = $2 AND box = -1 "
                                        "ORDER BY stored_ns DESC LIMIT 1";
    VIGIL_ASSIGN_OR_RETURN(Result r, r_->Run(kSql, {edge, stream}, "query the latest snapshot"));
    std::vector<StoredSnapshot> v = ReadSnapshots(r.get(), true);
    if (v.empty()) return std::optional<StoredSnapshot>();
    return std::optional<StoredSnapshot>(std::move(v.front()));
  }

  static std::vector<StoredSnapshot> ReadSnapshots(const PGresult* r, bool with_jpeg) {
    std::vector<StoredSnapshot> out;
    for (int i = 0; i < PQntuples(r); ++i) {
      out.push_back(SnapshotFromRow(PgRow{r, i}));
      if (with_jpeg) out.back().jpeg = BytesOf(r, i, 12);
    }
    return out;
  }

  StatusOr<int64_t> MaxTrackId() const override {
    MutexLock lock(read_mu_);
    static constexpr const char* kSql = "SELECT COALESCE(MAX(track_id), 0) FROM detections WHERE track_id > 0";
    VIGIL_ASSIGN_OR_RETURN(Result r, r_->Run(kSql, {}, "largest track id"));
    return Int(r.get(), 0, 0);
  }
  StatusOr<StoreStats> Stats(size_t max_gaps_per_run) const override {
    MutexLock lock(read_mu_);
    StoreStats out;
    // One snapshot, so the numbers agree with each other.
    Status st = r_->InTransaction(
        [&]() -> Status {
          read_mu_.AssertHeld();  // run by InTransaction, under the lock above
          static constexpr const char* kStreams =
              "SELECT id, edge, stream, epoch, duplicates, stale_rejected FROM streams ORDER BY edge, stream";
          VIGIL_ASSIGN_OR_RETURN(Result s, r_->Run(kStreams, {}, "stats: streams"));
          std::unordered_map<int64_t, size_t> index;
          for (int i = 0; i < PQntuples(s.get()); ++i) {
            index[Int(s.get(), i, 0)] = out.streams.size();
            StreamStats& ss = out.streams.emplace_back();
            ss.edge = Text(s.get(), i, 1);
            ss.stream = Text(s.get(), i, 2);
            ss.epoch = U64(s.get(), i, 3);
            ss.duplicates = U64(s.get(), i, 4);
            ss.stale_rejected = U64(s.get(), i, 5);
          }
          static constexpr const char* kRuns =
              "SELECT stream_id, run, frames, events, contiguous_through, dropped, lost FROM runs";
          VIGIL_ASSIGN_OR_RETURN(Result runs, r_->Run(kRuns, {}, "stats: runs"));
          for (int i = 0; i < PQntuples(runs.get()); ++i) {
            auto it = index.find(Int(runs.get(), i, 0));
            if (it == index.end()) continue;
            RunStats& r = out.streams[it->second].runs.emplace_back();
            r.run = U64(runs.get(), i, 1);
            r.frames = U64(runs.get(), i, 2);
            r.events = U64(runs.get(), i, 3);
            r.contiguous_through = Int(runs.get(), i, 4);
            r.dropped = U64(runs.get(), i, 5);
            r.lost = U64(runs.get(), i, 6);
          }
          static constexpr const char* kGaps =
              "SELECT seq FROM frames WHERE stream_id = $1 AND run = $2 AND seq > $3 ORDER BY seq";
          for (const auto& [id, at] : index) {
            StreamStats& ss = out.streams[at];
            std::sort(ss.runs.begin(), ss.runs.end(), [](const RunStats& a, const RunStats& b) { return a.run < b.run; });
            for (RunStats& r : ss.runs) {
              // Gaps lie above the contiguous prefix: walk only the frames stored there.
              GapWalk walk(r, max_gaps_per_run);
              VIGIL_ASSIGN_OR_RETURN(Result g, r_->Run(kGaps, {P(id), P(r.run), P(r.contiguous_through)}, "stats: gaps"));
              for (int i = 0; i < PQntuples(g.get()); ++i) walk.Seq(U64(g.get(), i, 0));
            }
          }
          static constexpr const char* kEdges =
              "SELECT edge, epoch, first_seen_ns, last_seen_ns, granted_ns FROM edges ORDER BY edge";
          VIGIL_ASSIGN_OR_RETURN(Result e, r_->Run(kEdges, {}, "stats: edges"));
          std::map<std::string, EdgeStats> edges;
          for (int i = 0; i < PQntuples(e.get()); ++i) {
            EdgeStats& es = edges[Text(e.get(), i, 0)];
            es.epoch = U64(e.get(), i, 1);
            es.first_seen_ns = Int(e.get(), i, 2);
            es.last_seen_ns = Int(e.get(), i, 3);
            es.granted_ns = Int(e.get(), i, 4);
          }
          SumStats(out, std::move(edges));
          return absl::OkStatus();
        },
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    if (!st.ok()) return st;
    return out;
  }

  StatusOr<RetentionResult> Prune(const RetentionPolicy& policy, int64_t now_ns) override;

  StatusOr<std::vector<OutboxItem>> PushDue(const std::string& sink, int64_t now_ns, int limit) const override {
    MutexLock lock(push_mu_);
    static constexpr const char* kSql =
        "SELECT o.id, o.attempts, " VIGIL_PG_EVENT_COLUMNS
        " FROM push_outbox o JOIN events e ON e.id = o.event_id JOIN streams s ON s.id = e.stream_id "
        "WHERE o.sink = $1 AND o.next_ns <= $2 ORDER BY o.next_ns, o.event_id LIMIT $3";
    VIGIL_ASSIGN_OR_RETURN(Result r, p_->Run(kSql, {sink, P(now_ns), P(limit)}, "push outbox: due rows"));
    std::vector<OutboxItem> out;
    for (int i = 0; i < PQntuples(r.get()); ++i) {
      out.push_back({Int(r.get(), i, 0), static_cast<int>(Int(r.get(), i, 1)), EventFromRow(PgRow{r.get(), i}, 2)});
    }
    VIGIL_RETURN_IF_ERROR(ReadDetections(*p_, out, [](OutboxItem& o) -> StoredEvent& { return o.event; }));
    return out;
  }
  StatusOr<std::optional<int64_t>> PushNextDue(const std::string& sink) const override {
    MutexLock lock(push_mu_);
    static constexpr const char* kSql = "SELECT MIN(next_ns) FROM push_outbox WHERE sink = $1";
    VIGIL_ASSIGN_OR_RETURN(Result r, p_->Run(kSql, {sink}, "push outbox: next due"));
    if (PQgetisnull(r.get(), 0, 0)) return std::optional<int64_t>();
    return std::optional<int64_t>(Int(r.get(), 0, 0));
  }
  StatusOr<uint64_t> PushDepth(const std::string& sink) const override {
    MutexLock lock(push_mu_);
    static constexpr const char* kSql = "SELECT COUNT(*) FROM push_outbox WHERE sink = $1";
    VIGIL_ASSIGN_OR_RETURN(Result r, p_->Run(kSql, {sink}, "push outbox: depth"));
    return U64(r.get(), 0, 0);
  }
  Status PushDelivered(std::span<const int64_t> outbox_ids) override {
    MutexLock lock(push_mu_);
    Array ids;
    for (int64_t id : outbox_ids) ids.Add(id);
    static constexpr const char* kSql = "DELETE FROM push_outbox WHERE id = ANY($1::bigint[])";
    return p_->Run(kSql, {ids.Done()}, "push outbox: delete delivered rows").status();
  }
  Status PushRetry(int64_t outbox_id, int attempts, int64_t next_ns, const std::string& error) override {
    MutexLock lock(push_mu_);
    static constexpr const char* kSql =
        "UPDATE push_outbox SET attempts = $2, next_ns = $3, last_error = $4 WHERE id = $1";
    return p_->Run(kSql, {P(outbox_id), P(attempts), P(next_ns), Clean(error)}, "push outbox: record a failed delivery")
        .status();
  }
  Status PushDead(int64_t outbox_id, int attempts, const std::string& error, int64_t now_ns) override {
    MutexLock lock(push_mu_);
    return p_->InTransaction([&]() -> Status {
      push_mu_.AssertHeld();  // run by InTransaction, under the lock above
      static constexpr const char* kBury =
          "INSERT INTO push_dead_letters(sink, event_id, attempts, last_error, dead_ns) "
          "SELECT sink, event_id, $2, $3, $4 FROM push_outbox WHERE id = $1 ON CONFLICT (sink, event_id) DO UPDATE "
          "SET attempts = excluded.attempts, last_error = excluded.last_error, dead_ns = excluded.dead_ns";
      VIGIL_RETURN_IF_ERROR(
          p_->Run(kBury, {P(outbox_id), P(attempts), Clean(error), P(now_ns)}, "push outbox: bury a row").status());
      return p_->Run(kDeleteOutbox, {P(outbox_id)}, "push outbox: delete a buried row").status();
    });
  }
  StatusOr<std::vector<DeadLetter>> DeadLetters(const std::string& sink, int limit) const override {
    MutexLock lock(push_mu_);
    static constexpr const char* kSql =
        "SELECT d.sink, d.attempts, d.last_error, d.dead_ns, " VIGIL_PG_EVENT_COLUMNS
        " FROM push_dead_letters d JOIN events e ON e.id = d.event_id JOIN streams s ON s.id = e.stream_id "
        "WHERE ($1 = '' OR d.sink = $1) ORDER BY d.id DESC LIMIT $2";
    VIGIL_ASSIGN_OR_RETURN(Result r, p_->Run(kSql, {sink, P(limit)}, "dead letters"));
    std::vector<DeadLetter> out;
    for (int i = 0; i < PQntuples(r.get()); ++i) {
      out.push_back({Text(r.get(), i, 0), static_cast<int>(Int(r.get(), i, 1)), Text(r.get(), i, 2),
                     Int(r.get(), i, 3), EventFromRow(PgRow{r.get(), i}, 4)});
    }
    VIGIL_RETURN_IF_ERROR(ReadDetections(*p_, out, [](DeadLetter& l) -> StoredEvent& { return l.event; }));
    return out;
  }
  StatusOr<uint64_t> ReplayDeadLetters(const std::string& sink, int64_t now_ns) override {
    MutexLock lock(push_mu_);
    uint64_t n = 0;
    Status st = p_->InTransaction([&]() -> Status {
      push_mu_.AssertHeld();  // run by InTransaction, under the lock above
      static constexpr const char* kRevive =
          "INSERT INTO push_outbox(sink, event_id, attempts, next_ns) SELECT sink, event_id, 0, $2 "
          "FROM push_dead_letters WHERE sink = $1 ON CONFLICT (sink, event_id) DO NOTHING";
      VIGIL_ASSIGN_OR_RETURN(Result r, p_->Run(kRevive, {sink, P(now_ns)}, "revive dead letters"));
      n = std::strtoull(PQcmdTuples(r.get()), nullptr, 10);
      static constexpr const char* kForget = "DELETE FROM push_dead_letters WHERE sink = $1";
      return p_->Run(kForget, {sink}, "forget revived dead letters").status();
    });
    if (!st.ok()) return Annotate(st, StrCat("push sink '", sink, "': replay the dead letters"));
    return n;
  }

 private:
  friend class PgRetention;
  static constexpr const char* kTouchEdge = "UPDATE edges SET last_seen_ns = $2 WHERE edge = $1";
  static constexpr const char* kDeleteOutbox = "DELETE FROM push_outbox WHERE id = $1";

  // An error text cut to 1000 bytes without splitting a UTF-8 sequence (PostgreSQL refuses invalid UTF-8).
  static std::string Clean(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size() && out.size() < 1000;) {
      const auto c = static_cast<unsigned char>(s[i]);
      const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
      bool ok = len > 0 && c != 0 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (ok) {
        out.append(s, i, len);
        i += len;
      } else {
        out += '?';
        ++i;
      }
    }
    return out;
  }

  struct StreamState {
    int64_t id;
    uint64_t epoch;
  };
  struct RunState {
    int64_t through = -1;  // contiguous prefix
    int64_t highest = -1;  // highest stored seq
  };
  void DropCaches() {
    streams_.clear();
    runs_.clear();
  }

  StatusOr<StreamState*> StreamFor(const std::string& edge, const std::string& stream) {
    auto key = std::make_pair(edge, stream);
    if (auto it = streams_.find(key); it != streams_.end()) return &it->second;
    static constexpr const char* kSql =
        "INSERT INTO streams(edge, stream, epoch) VALUES($1, $2, 0) ON CONFLICT (edge, stream) "
        "DO UPDATE SET epoch = streams.epoch RETURNING id, epoch";
    VIGIL_ASSIGN_OR_RETURN(Result r, w_->Run(kSql, {edge, stream}, "find or add a stream"));
    return &streams_.emplace(key, StreamState{Int(r.get(), 0, 0), U64(r.get(), 0, 1)}).first->second;
  }

  StatusOr<RunState*> RunFor(int64_t stream_id, uint64_t run) {
    auto key = std::make_pair(stream_id, run);
    if (auto it = runs_.find(key); it != runs_.end()) return &it->second;
    static constexpr const char* kSql =
        "SELECT (SELECT contiguous_through FROM runs WHERE stream_id = $1 AND run = $2), "
        "(SELECT max(seq) FROM frames WHERE stream_id = $1 AND run = $2)";
    VIGIL_ASSIGN_OR_RETURN(Result r, w_->Run(kSql, {P(stream_id), P(run)}, "a run's prefix"));
    RunState st;
    if (!PQgetisnull(r.get(), 0, 0)) st.through = Int(r.get(), 0, 0);
    if (!PQgetisnull(r.get(), 0, 1)) st.highest = Int(r.get(), 0, 1);
    st.highest = std::max(st.highest, st.through);
    return &runs_.emplace(key, st).first->second;
  }

  Status ApplyBatch(std::span<const PendingReport> batch, int64_t now_ns, std::span<const EventDecision> decisions,
                    DecisionResult& decided, std::vector<ApplyResult>& results);

  std::unique_ptr<Conn> w_;                                // the writer thread's
  std::unique_ptr<Conn> r_ VIGIL_PT_GUARDED_BY(read_mu_);  // the readers' (HTTP API, confirmation's queries)
  std::unique_ptr<Conn> p_ VIGIL_PT_GUARDED_BY(push_mu_);  // the pushers' and the dead-letter routes'
  std::vector<PushRoute> routes_;
  // Writer caches of committed rows (writer thread only); dropped whenever a transaction fails.
  std::map<std::pair<std::string, std::string>, StreamState> streams_;
  std::map<std::pair<int64_t, uint64_t>, RunState> runs_;
  mutable Mutex read_mu_;
  mutable Mutex push_mu_;
};

Status PgBackend::ApplyBatch(std::span<const PendingReport> batch, int64_t now_ns,
                             std::span<const EventDecision> decisions, DecisionResult& decided,
                             std::vector<ApplyResult>& results) {
  const std::string now = P(now_ns);
  // 1. The senders' current epochs, read under a share lock inside this transaction: fencing at commit.
  std::vector<std::string> edges;
  for (const PendingReport& p : batch) {
    if (std::find(edges.begin(), edges.end(), p.report->edge) == edges.end()) edges.push_back(p.report->edge);
  }
  Array edge_list;
  for (const std::string& e : edges) edge_list.AddText(e);
  static constexpr const char* kEpochs = "SELECT edge, epoch FROM edges WHERE edge = ANY($1::text[]) FOR SHARE";
  // Round trips: this (with the BEGIN), the frames, the events, then the rest with the COMMIT (Conn::Pipeline).
  VIGIL_ASSIGN_OR_RETURN(std::vector<Result> head,
                         w_->Pipeline({{kEpochs, {edge_list.Done()}, "read the edges' epochs"}}, true, false));
  const Result& er = head[0];
  std::vector<Conn::Step> tail;
  std::map<std::string, uint64_t> epochs;
  for (int i = 0; i < PQntuples(er.get()); ++i) epochs[Text(er.get(), i, 0)] = U64(er.get(), i, 1);

  // 2. Which frames are new: not at or below a prefix, not earlier in this batch; the rest are duplicates.
  struct StreamDelta {
    const StreamState* stream = nullptr;
    uint64_t duplicates = 0, stale = 0;
    bool epoch_changed = false;
  };
  std::map<int64_t, StreamDelta> deltas;  // stream id →
  std::vector<StreamState*> stream_of(batch.size(), nullptr);
  using Key = std::tuple<int64_t, uint64_t, uint64_t>;  // (stream id, run, seq)
  std::set<Key> in_batch;
  std::vector<std::pair<size_t, Key>> candidates;  // (report, frame)
  Array f_stream, f_run, f_seq, f_kind, f_epoch;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Report& r = *batch[i].report;
    ApplyResult& res = results[i];
    VIGIL_ASSIGN_OR_RETURN(StreamState * st, StreamFor(r.edge, r.stream));
    stream_of[i] = st;
    deltas[st->id].stream = st;
    auto e = epochs.find(r.edge);
    res.edge_epoch = e == epochs.end() ? 0 : e->second;
    if (res.edge_epoch == 0 || r.epoch != res.edge_epoch) {
      res.kind = ApplyResult::kStale;
      ++deltas[st->id].stale;
      continue;
    }
    if (r.epoch > st->epoch) {
      st->epoch = r.epoch;
      deltas[st->id].epoch_changed = true;
    }
    VIGIL_ASSIGN_OR_RETURN(RunState * run, RunFor(st->id, r.run));
    for (uint64_t seq = r.seq_first; seq <= r.seq_last; ++seq) {
      Key key{st->id, r.run, seq};
      if (static_cast<int64_t>(seq) <= run->through || !in_batch.insert(key).second) {
        ++res.duplicate_frames;
        continue;
      }
      candidates.emplace_back(i, key);
      f_stream.Add(st->id);
      f_run.Add(r.run);
      f_seq.Add(seq);
      f_kind.Add(static_cast<int>(r.kind));
      f_epoch.Add(r.epoch);
    }
  }

  // 3. The frame rows; a conflict is a frame stored by an earlier batch.
  std::set<Key> inserted;
  if (!candidates.empty()) {
    static constexpr const char* kFrames =
        "INSERT INTO frames(stream_id, run, seq, kind, epoch, stored_ns) SELECT s, r, q, k, e, $6 FROM "
        "unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::smallint[], $5::bigint[]) AS t(s, r, q, k, e) "
        "ON CONFLICT DO NOTHING RETURNING stream_id, run, seq";
    VIGIL_ASSIGN_OR_RETURN(Result fr, w_->Run(kFrames,
                                              {f_stream.Done(), f_run.Done(), f_seq.Done(), f_kind.Done(),
                                               f_epoch.Done(), now},
                                              "insert frames"));
    for (int i = 0; i < PQntuples(fr.get()); ++i) {
      inserted.emplace(Int(fr.get(), i, 0), U64(fr.get(), i, 1), U64(fr.get(), i, 2));
    }
  }
  std::map<std::pair<int64_t, uint64_t>, uint64_t> highest_new;  // (stream id, run) → the batch's highest new seq
  std::vector<std::vector<uint64_t>> report_new(batch.size());    // each report's new seqs
  for (const auto& [i, key] : candidates) {
    ApplyResult& res = results[i];
    if (!inserted.contains(key)) {
      ++res.duplicate_frames;
      continue;
    }
    const ReportKind kind = batch[i].report->kind;
    ++(kind == ReportKind::kDropped ? res.dropped_frames : kind == ReportKind::kLost ? res.lost_frames : res.new_frames);
    const auto [it, first] = highest_new.try_emplace({std::get<0>(key), std::get<1>(key)}, std::get<2>(key));
    if (!first) it->second = std::max(it->second, std::get<2>(key));
    report_new[i].push_back(std::get<2>(key));
  }

  // 4. Events (an event report's one frame is new), their detections and outbox rows.
  Array e_stream, e_run, e_seq, e_epoch, e_capture, e_pts, e_publish, e_severity, e_rule, e_width, e_height, e_state,
      e_reason, e_decided;
  std::vector<size_t> event_reports;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Report& r = *batch[i].report;
    if (results[i].kind == ApplyResult::kStale || r.kind != ReportKind::kEvent || results[i].new_frames != 1) continue;
    event_reports.push_back(i);
    e_stream.Add(stream_of[i]->id);
    e_run.Add(r.run);
    e_seq.Add(r.seq_first);
    e_epoch.Add(r.epoch);
    e_capture.Add(r.capture_ns);
    e_pts.Add(r.pts_ns);
    e_publish.Add(r.publish_ns);
    e_severity.AddText(transport::ToString(r.severity));
    e_rule.AddText(r.rule);
    e_width.Add(static_cast<int64_t>(r.width));
    e_height.Add(static_cast<int64_t>(r.height));
    const EventState state = batch[i].verdict != nullptr ? batch[i].verdict->state : EventState::kConfirmed;
    e_state.AddText(ToString(state));
    e_reason.AddText(batch[i].verdict != nullptr ? batch[i].verdict->reason : "");
    e_decided.Add(state == EventState::kPending ? int64_t{0} : now_ns);
  }
  if (!event_reports.empty()) {
    static constexpr const char* kEvents =
        "INSERT INTO events(stream_id, run, seq, epoch, capture_ns, pts_ns, publish_ns, stored_ns, severity, rule, "
        "width, height, state, state_reason, decided_ns) SELECT a, b, c, d, f, g, h, $12, i, j, k, l, m, n, o FROM "
        "unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], "
        "$8::text[], $9::text[], $10::bigint[], $11::bigint[], $13::text[], $14::text[], $15::bigint[]) "
        "AS t(a, b, c, d, f, g, h, i, j, k, l, m, n, o) RETURNING id, stream_id, run, seq";
    VIGIL_ASSIGN_OR_RETURN(
        Result ev, w_->Run(kEvents,
                           {e_stream.Done(), e_run.Done(), e_seq.Done(), e_epoch.Done(), e_capture.Done(), e_pts.Done(),
                            e_publish.Done(), e_severity.Done(), e_rule.Done(), e_width.Done(), e_height.Done(), now,
                            e_state.Done(), e_reason.Done(), e_decided.Done()},
                           "insert events"));
    std::map<Key, int64_t> event_ids;
    for (int i = 0; i < PQntuples(ev.get()); ++i) {
      event_ids[{Int(ev.get(), i, 1), U64(ev.get(), i, 2), U64(ev.get(), i, 3)}] = Int(ev.get(), i, 0);
    }
    Array d_event, d_idx, d_class, d_label, d_score, d_x1, d_y1, d_x2, d_y2, d_track, o_sink, o_event;
    for (size_t i : event_reports) {
      const Report& r = *batch[i].report;
      const int64_t id = event_ids.at({stream_of[i]->id, r.run, r.seq_first});
      std::vector<std::string> labels;
      labels.reserve(r.detections.size());
      for (size_t k = 0; k < r.detections.size(); ++k) {
        const transport::ReportDetection& d = r.detections[k];
        const auto class_id = static_cast<int64_t>(d.class_id);  // ValidateReport: an integer in [0, 2^24)
        labels.push_back(LabelOf(batch[i].class_names, class_id));
        d_event.Add(id);
        d_idx.Add(static_cast<int64_t>(k));
        d_class.Add(class_id);
        d_label.AddText(labels.back());
        d_score.Add(static_cast<double>(d.score));
        d_x1.Add(static_cast<double>(d.x1));
        d_y1.Add(static_cast<double>(d.y1));
        d_x2.Add(static_cast<double>(d.x2));
        d_y2.Add(static_cast<double>(d.y2));
        const EventVerdict* v = batch[i].verdict;
        d_track.Add(v != nullptr && !v->track_ids.empty() ? v->track_ids[k] : int64_t{0});
      }
      // The push outbox, in the event's transaction: stored ⇔ queued for every sink that takes it.
      const std::string severity(transport::ToString(r.severity));
      const EventState state = batch[i].verdict != nullptr ? batch[i].verdict->state : EventState::kConfirmed;
      for (const PushRoute& route : routes_) {
        if (!QueuesWhenStored(route, state, batch[i].verdict != nullptr && batch[i].verdict->new_track) ||
            !RouteMatches(route, r.edge, r.stream, severity, labels)) {
          continue;
        }
        o_sink.AddText(route.sink);
        o_event.Add(id);
        ++results[i].pushes_queued;
      }
      results[i].event_stored = true;
    }
    if (!d_event.empty()) {
      static constexpr const char* kDetections =
          "INSERT INTO detections(event_id, idx, class_id, label, score, x1, y1, x2, y2, track_id) SELECT * FROM "
          "unnest($1::bigint[], $2::int[], $3::int[], $4::text[], $5::float8[], $6::float8[], $7::float8[], "
          "$8::float8[], $9::float8[], $10::bigint[])";
      tail.push_back({kDetections,
                      {d_event.Done(), d_idx.Done(), d_class.Done(), d_label.Done(), d_score.Done(), d_x1.Done(),
                       d_y1.Done(), d_x2.Done(), d_y2.Done(), d_track.Done()},
                      "insert detections"});
    }
    if (!o_sink.empty()) {
      static constexpr const char* kOutbox =
          "INSERT INTO push_outbox(sink, event_id, attempts, next_ns) SELECT s, e, 0, $3 FROM "
          "unnest($1::text[], $2::bigint[]) AS t(s, e) ON CONFLICT (sink, event_id) DO NOTHING";
      tail.push_back({kOutbox, {o_sink.Done(), o_event.Done(), now}, "queue pushes"});
    }
  }

  // 5. Each touched run's prefix and counts.
  struct RunDelta {
    uint64_t frames = 0, events = 0, dropped = 0, lost = 0;
  };
  std::map<std::pair<int64_t, uint64_t>, RunDelta> run_deltas;
  for (size_t i = 0; i < batch.size(); ++i) {
    ApplyResult& res = results[i];
    if (res.kind == ApplyResult::kStale) continue;
    const int64_t sid = stream_of[i]->id;
    if (res.duplicate_frames > 0) deltas[sid].duplicates += res.duplicate_frames;
    if (res.new_frames + res.dropped_frames + res.lost_frames == 0) {
      res.kind = ApplyResult::kDuplicate;
      continue;
    }
    RunDelta& rd = run_deltas[{sid, batch[i].report->run}];
    rd.frames += res.new_frames;
    rd.events += res.event_stored ? 1 : 0;
    rd.dropped += res.dropped_frames;
    rd.lost += res.lost_frames;
  }
  // The prefix moves report by report (each report's answer says what is stored once it is), over the
  // report's new seqs and the frames earlier batches stored above it.
  std::map<std::pair<int64_t, uint64_t>, std::set<uint64_t>> avail;  // (stream id, run) → seqs stored above
  for (const auto& [key, highest] : highest_new) {
    RunState& run = runs_.at(key);
    if (run.highest > run.through) {
      static constexpr const char* kAbove =
          "SELECT seq FROM frames WHERE stream_id = $1 AND run = $2 AND seq > $3 AND seq <= $4 ORDER BY seq";
      VIGIL_ASSIGN_OR_RETURN(Result above, w_->Run(kAbove, {P(key.first), P(key.second), P(run.through), P(run.highest)},
                                                   "frames above a run's prefix"));
      std::set<uint64_t>& a = avail[key];
      for (int i = 0; i < PQntuples(above.get()); ++i) {
        const uint64_t seq = U64(above.get(), i, 0);
        if (!inserted.contains({key.first, key.second, seq})) a.insert(seq);  // not this batch's
      }
    }
    run.highest = std::max(run.highest, static_cast<int64_t>(highest));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (results[i].kind == ApplyResult::kStale) continue;
    const std::pair<int64_t, uint64_t> key{stream_of[i]->id, batch[i].report->run};
    RunState& run = runs_.at(key);
    if (!report_new[i].empty()) {
      std::set<uint64_t>& a = avail[key];
      a.insert(report_new[i].begin(), report_new[i].end());
      for (auto it = a.begin(); it != a.end() && static_cast<int64_t>(*it) <= run.through + 1;) {
        if (static_cast<int64_t>(*it) == run.through + 1) ++run.through;
        it = a.erase(it);
      }
    }
    results[i].contiguous_through = run.through;
  }
  Array r_stream, r_run, r_frames, r_events, r_through, r_dropped, r_lost;
  for (const auto& [key, rd] : run_deltas) {
    r_stream.Add(key.first);
    r_run.Add(key.second);
    r_frames.Add(rd.frames);
    r_events.Add(rd.events);
    r_through.Add(runs_.at(key).through);
    r_dropped.Add(rd.dropped);
    r_lost.Add(rd.lost);
  }
  if (!r_stream.empty()) {
    static constexpr const char* kRuns =
        "INSERT INTO runs(stream_id, run, frames, events, contiguous_through, first_stored_ns, last_stored_ns, "
        "dropped, lost) SELECT s, r, f, e, c, $8, $8, d, l FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], "
        "$4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[]) AS t(s, r, f, e, c, d, l) "
        "ON CONFLICT (stream_id, run) DO UPDATE SET frames = runs.frames + excluded.frames, "
        "events = runs.events + excluded.events, dropped = runs.dropped + excluded.dropped, "
        "lost = runs.lost + excluded.lost, contiguous_through = excluded.contiguous_through, "
        "last_stored_ns = excluded.last_stored_ns";
    tail.push_back({kRuns,
                    {r_stream.Done(), r_run.Done(), r_frames.Done(), r_events.Done(), r_through.Done(),
                     r_dropped.Done(), r_lost.Done(), now},
                    "update runs"});
  }

  // 6. Per-stream counters and epochs; the senders' last_seen_ns.
  Array s_id, s_epoch, s_dups, s_stale;
  for (const auto& [sid, d] : deltas) {
    if (d.duplicates == 0 && d.stale == 0 && !d.epoch_changed) continue;
    s_id.Add(sid);
    s_epoch.Add(d.stream->epoch);
    s_dups.Add(d.duplicates);
    s_stale.Add(d.stale);
  }
  if (!s_id.empty()) {
    static constexpr const char* kStreams =
        "UPDATE streams SET epoch = u.e, duplicates = streams.duplicates + u.d, "
        "stale_rejected = streams.stale_rejected + u.s FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], "
        "$4::bigint[]) AS u(i, e, d, s) WHERE streams.id = u.i";
    tail.push_back({kStreams, {s_id.Done(), s_epoch.Done(), s_dups.Done(), s_stale.Done()}, "update streams"});
  }
  static constexpr const char* kTouch = "UPDATE edges SET last_seen_ns = $2 WHERE edge = ANY($1::text[])";
  tail.push_back({kTouch, {edge_list.Done(), now}, "touch the senders"});
  if (decisions.empty()) return w_->Pipeline(tail, false, true).status();
  VIGIL_RETURN_IF_ERROR(w_->Pipeline(tail, false, false).status());

  // 7. Decisions on pending events (after this batch's events and detections): the second model's words on their
  // detections first (a relabel changes the labels the routes match), then the states, then the pushes they confirm.
  Array x_edge, x_stream, x_run, x_seq, x_idx, x_label, x_second, x_score;
  for (const EventDecision& d : decisions) {
    for (const DetectionUpdate& u : d.detections) {
      x_edge.AddText(d.edge);
      x_stream.AddText(d.stream);
      x_run.Add(d.run);
      x_seq.Add(d.seq);
      x_idx.Add(static_cast<int64_t>(u.index));
      x_label.AddText(u.label);
      x_second.AddText(u.second_label);
      x_score.Add(static_cast<double>(u.second_score));
    }
  }
  if (!x_edge.empty()) {
    static constexpr const char* kSecond =
        "UPDATE detections d SET label = CASE WHEN u.lb = '' THEN d.label ELSE u.lb END, second_label = u.sl, "
        "second_score = u.ss FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::int[], $6::text[], "
        "$7::text[], $8::float8[]) AS u(ed, st, rn, sq, ix, lb, sl, ss) JOIN streams s ON s.edge = u.ed AND "
        "s.stream = u.st JOIN events e ON e.stream_id = s.id AND e.run = u.rn AND e.seq = u.sq AND "
        "e.state = 'pending' WHERE d.event_id = e.id AND d.idx = u.ix";
    VIGIL_RETURN_IF_ERROR(w_->Run(kSecond,
                                  {x_edge.Done(), x_stream.Done(), x_run.Done(), x_seq.Done(), x_idx.Done(),
                                   x_label.Done(), x_second.Done(), x_score.Done()},
                                  "store the second model's classes")
                              .status());
  }
  Array u_edge, u_stream, u_run, u_seq, u_state, u_reason;
  for (const EventDecision& d : decisions) {
    u_edge.AddText(d.edge);
    u_stream.AddText(d.stream);
    u_run.Add(d.run);
    u_seq.Add(d.seq);
    u_state.AddText(ToString(d.state));
    u_reason.AddText(d.reason);
  }
  static constexpr const char* kDecide =
      "WITH u AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[]) "
      "WITH ORDINALITY AS t(ed, st, rn, sq, state, reason, ix)), done AS (UPDATE events e SET state = u.state, "
      "state_reason = u.reason, decided_ns = $7 FROM u JOIN streams s ON s.edge = u.ed AND s.stream = u.st WHERE "
      "e.stream_id = s.id AND e.run = u.rn AND e.seq = u.sq AND e.state = 'pending' RETURNING e.id, e.state, "
      "e.severity, s.edge, s.stream, u.ix) "
      "SELECT done.id, done.state, done.severity, done.edge, done.stream, d.label, done.ix FROM done LEFT JOIN "
      "detections d ON d.event_id = done.id ORDER BY done.id, d.idx";
  VIGIL_ASSIGN_OR_RETURN(Result dr, w_->Run(kDecide,
                                            {u_edge.Done(), u_stream.Done(), u_run.Done(), u_seq.Done(),
                                             u_state.Done(), u_reason.Done(), now},
                                            "decide pending events"));
  struct Decided {
    bool confirmed = false;
    std::string severity, edge, stream;
    std::vector<std::string> labels;
    size_t index = 0;  // its decision
  };
  std::map<int64_t, Decided> done;
  for (int i = 0; i < PQntuples(dr.get()); ++i) {
    Decided& d = done[Int(dr.get(), i, 0)];
    d.confirmed = Text(dr.get(), i, 1) == "confirmed";
    d.severity = Text(dr.get(), i, 2);
    d.edge = Text(dr.get(), i, 3);
    d.stream = Text(dr.get(), i, 4);
    if (!PQgetisnull(dr.get(), i, 5)) d.labels.push_back(Text(dr.get(), i, 5));
    const int64_t ix = Int(dr.get(), i, 6);  // 1-based: WITH ORDINALITY
    if (ix >= 1 && static_cast<size_t>(ix) <= decided.applied.size()) {
      decided.applied[static_cast<size_t>(ix - 1)] = 1;
      d.index = static_cast<size_t>(ix - 1);
    }
  }
  decided.skipped = decisions.size() - done.size();
  Array o_sink, o_event;
  for (const auto& [id, d] : done) {
    if (!d.confirmed) {
      ++decided.rejected;
      continue;
    }
    ++decided.confirmed;
    for (const PushRoute& route : routes_) {
      if (!QueuesWhenDecided(route, decisions[d.index]) || !RouteMatches(route, d.edge, d.stream, d.severity, d.labels)) {
        continue;
      }
      o_sink.AddText(route.sink);
      o_event.Add(id);
      ++decided.pushes_queued;
    }
  }
  std::vector<Conn::Step> last;
  if (!o_sink.empty()) {
    static constexpr const char* kOutbox =
        "INSERT INTO push_outbox(sink, event_id, attempts, next_ns) SELECT s, e, 0, $3 FROM "
        "unnest($1::text[], $2::bigint[]) AS t(s, e) ON CONFLICT (sink, event_id) DO NOTHING";
    last.push_back({kOutbox, {o_sink.Done(), o_event.Done(), now}, "queue the confirmed events' pushes"});
  }
  return w_->Pipeline(last, false, true).status();
}

// Retention's statements on the writer connection.
class PgRetention final : public RetentionOps {
 public:
  explicit PgRetention(Conn& c) : c_(c) {}
  StatusOr<uint64_t> CountEvents() override {
    static constexpr const char* kSql = "SELECT COUNT(*) FROM events";
    VIGIL_ASSIGN_OR_RETURN(Result r, c_.Run(kSql, {}, "retention: count events"));
    return U64(r.get(), 0, 0);
  }
  StatusOr<std::vector<Row>> OldestEvents(int limit) override {
    static constexpr const char* kSql =
        "SELECT e.id, e.stored_ns FROM events e WHERE NOT EXISTS (SELECT 1 FROM push_outbox o WHERE o.event_id = "
        "e.id) ORDER BY e.id LIMIT $1";
    return Rows(kSql, {P(limit)}, "retention: oldest events");
  }
  StatusOr<Deleted> DeleteEvents(const std::vector<int64_t>& ids) override {
    Array list;
    for (int64_t id : ids) list.Add(id);
    const std::string l = list.Done();
    Deleted out;
    Status st = c_.InTransaction([&]() -> Status {
      static constexpr const char* kDetections = "DELETE FROM detections WHERE event_id = ANY($1::bigint[])";
      static constexpr const char* kDead = "DELETE FROM push_dead_letters WHERE event_id = ANY($1::bigint[])";
      static constexpr const char* kSnapshots =
          "DELETE FROM snapshots WHERE (edge, stream, run, seq) IN (SELECT s.edge, s.stream, e.run, e.seq FROM events "
          "e JOIN streams s ON s.id = e.stream_id WHERE e.id = ANY($1::bigint[]))";
      static constexpr const char* kEvents = "DELETE FROM events WHERE id = ANY($1::bigint[])";
      VIGIL_RETURN_IF_ERROR(c_.Run(kDetections, {l}, "retention: delete detections").status());
      VIGIL_ASSIGN_OR_RETURN(Result r, c_.Run(kDead, {l}, "retention: delete dead letters"));
      out.dead_letters = std::strtoull(PQcmdTuples(r.get()), nullptr, 10);
      VIGIL_ASSIGN_OR_RETURN(Result sn, c_.Run(kSnapshots, {l}, "retention: delete snapshots"));
      out.snapshots = std::strtoull(PQcmdTuples(sn.get()), nullptr, 10);
      return c_.Run(kEvents, {l}, "retention: delete events").status();
    });
    if (!st.ok()) return st;
    return out;
  }
  StatusOr<uint64_t> DeleteOrphanSnapshots(int64_t before_ns) override {
    static constexpr const char* kSql =
        "DELETE FROM snapshots p WHERE p.stored_ns < $1 AND NOT EXISTS (SELECT 1 FROM events e JOIN streams s ON "
        "s.id = e.stream_id WHERE s.edge = p.edge AND s.stream = p.stream AND e.run = p.run AND e.seq = p.seq)";
    VIGIL_ASSIGN_OR_RETURN(Result r, c_.Run(kSql, {P(before_ns)}, "retention: delete orphan snapshots"));
    return std::strtoull(PQcmdTuples(r.get()), nullptr, 10);
  }
  StatusOr<uint64_t> KeptForPush(int64_t cutoff_ns) override {
    static constexpr const char* kSql =
        "SELECT COUNT(DISTINCT o.event_id) FROM push_outbox o JOIN events e ON e.id = o.event_id "
        "WHERE e.stored_ns < $1";
    VIGIL_ASSIGN_OR_RETURN(Result r, c_.Run(kSql, {P(cutoff_ns)}, "retention: events kept for push"));
    return U64(r.get(), 0, 0);
  }
  StatusOr<std::vector<RunRef>> PrefixRuns() override {
    static constexpr const char* kSql = "SELECT stream_id, run, contiguous_through FROM runs WHERE contiguous_through >= 0";
    VIGIL_ASSIGN_OR_RETURN(Result r, c_.Run(kSql, {}, "retention: runs"));
    std::vector<RunRef> runs;
    for (int i = 0; i < PQntuples(r.get()); ++i) runs.push_back({Int(r.get(), i, 0), Int(r.get(), i, 1), Int(r.get(), i, 2)});
    return runs;
  }
  StatusOr<std::vector<Row>> OldestFrames(const RunRef& run, int limit) override {
    static constexpr const char* kSql =
        "SELECT seq, stored_ns FROM frames WHERE stream_id = $1 AND run = $2 AND seq <= $3 ORDER BY seq LIMIT $4";
    return Rows(kSql, {P(run.stream_id), P(run.run), P(run.through), P(limit)}, "retention: oldest frames");
  }
  Status DeleteFrames(const RunRef& run, int64_t through_seq) override {
    static constexpr const char* kSql = "DELETE FROM frames WHERE stream_id = $1 AND run = $2 AND seq <= $3";
    return c_.Run(kSql, {P(run.stream_id), P(run.run), P(through_seq)}, "retention: delete frames").status();
  }

 private:
  StatusOr<std::vector<Row>> Rows(const char* sql, const std::vector<std::string>& params, std::string_view what) {
    VIGIL_ASSIGN_OR_RETURN(Result r, c_.Run(sql, params, what));
    std::vector<Row> rows;
    for (int i = 0; i < PQntuples(r.get()); ++i) rows.push_back({Int(r.get(), i, 0), Int(r.get(), i, 1)});
    return rows;
  }
  Conn& c_;
};

StatusOr<RetentionResult> PgBackend::Prune(const RetentionPolicy& policy, int64_t now_ns) {
  PgRetention ops(*w_);
  return RunRetention(ops, policy, now_ns);
}

}  // namespace

StatusOr<std::unique_ptr<StoreBackend>> OpenPostgresBackend(const std::string& target, const std::string& shown,
                                                            const StoreOptions& options) {
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Conn> w, Conn::Open(target, options.password, shown, "writer"));
  // Migrations under an advisory lock: two aggregators starting at once migrate once.
  int64_t version = 0;
  Status st = w->InTransaction([&]() -> Status {
    VIGIL_RETURN_IF_ERROR(w->Simple("SELECT pg_advisory_xact_lock(7368426)", "lock the schema"));
    VIGIL_RETURN_IF_ERROR(
        w->Simple("CREATE TABLE IF NOT EXISTS vigil_schema(version INTEGER NOT NULL)", "create the version table"));
    static constexpr const char* kVersion = "SELECT version FROM vigil_schema";
    VIGIL_ASSIGN_OR_RETURN(Result r, w->Run(kVersion, {}, "read the schema version"));
    if (PQntuples(r.get()) == 0) {
      VIGIL_RETURN_IF_ERROR(w->Simple("INSERT INTO vigil_schema VALUES(0)", "start the version table"));
    } else {
      version = Int(r.get(), 0, 0);
    }
    if (version > Store::kSchemaVersion) {
      return absl::FailedPreconditionError(StrCat("postgresql ", shown, ": schema version ", version,
                                                  " is newer than this vigil supports (", Store::kSchemaVersion, ")"));
    }
    for (int64_t v = version; v < Store::kSchemaVersion; ++v) {
      const std::string sql = schema::MigrationSql(schema::Dialect::kPostgres, static_cast<int>(v));
      if (sql.empty()) {  // the schema description lacks a step this vigil's version asks for: record nothing
        return absl::InternalError(StrCat("postgresql ", shown, ": no schema step ", v, " → ", v + 1,
                                          " in the schema description (aggregator/schema.cc)"));
      }
      VIGIL_RETURN_IF_ERROR(w->Simple(sql.c_str(), StrCat("migrate schema ", v, " → ", v + 1).c_str()));
      VIGIL_RETURN_IF_ERROR(w->Simple(StrCat("UPDATE vigil_schema SET version = ", v + 1).c_str(), "set the version"));
    }
    return absl::OkStatus();
  });
  if (!st.ok()) {
    if (absl::IsFailedPrecondition(st)) return st;
    return absl::UnavailableError(st.message());
  }
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Conn> r, Conn::Open(target, options.password, shown, "reader"));
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Conn> p, Conn::Open(target, options.password, shown, "push"));
  return std::unique_ptr<StoreBackend>(new PgBackend(std::move(w), std::move(r), std::move(p), options.routes));
}

}  // namespace vigil::aggregator
