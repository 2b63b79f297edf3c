// The SQLite engine of aggregator::Store (store.h).
#include "aggregator/schema.h"
#include "aggregator/store_backend.h"
#include "vigil/common/mutex.h"

#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <utility>

#include <spdlog/spdlog.h>

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::ReportKind;

// The event columns every event query selects (EventFromRow reads them in this order).
constexpr const char* kEventColumnsForPrepare = VIGIL_EVENT_COLUMNS;

// An event's detections in order (ReadDetections reads them).
constexpr const char* kDetectionsSql =
    "SELECT class_id, label, score, x1, y1, x2, y2, track_id, second_label, second_score FROM detections WHERE "
    "event_id = ?1 ORDER BY idx";

// The schema and its migrations: schema.h (one description for both engines).

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbCloser>;
struct StmtFinalizer {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};

Status SqlError(sqlite3* db, std::string_view what) {
  return absl::InternalError(StrCat("sqlite ", sqlite3_db_filename(db, "main"), ": ", what, ": ", sqlite3_errmsg(db)));
}

Status Exec(sqlite3* db, const char* sql, std::string_view what) {
  return sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK ? absl::OkStatus() : SqlError(db, what);
}

// Bytes bound as a BLOB (not copied: they must outlive the statement's step).
struct BlobParam {
  std::string_view bytes;
};

// A prepared statement, reset after every use. Integers bind as int64 (uint64 by bit pattern).
class Stmt {
 public:
  Stmt() = default;
  static StatusOr<Stmt> Prepare(sqlite3* db, const char* sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr) != SQLITE_OK) {
      return SqlError(db, StrCat("prepare '", sql, "'"));
    }
    Stmt st;
    st.s_.reset(s);
    return st;
  }
  // Binds parameters ?1, ?2, ... in order.
  template <typename... Args>
  Stmt& Bind(const Args&... args) {
    sqlite3_reset(s_.get());
    sqlite3_clear_bindings(s_.get());
    [[maybe_unused]] int i = 0;
    (BindOne(++i, args), ...);
    return *this;
  }
  // true: a row is available; false: done (the statement is reset).
  StatusOr<bool> Step() {
    const int rc = sqlite3_step(s_.get());
    if (rc == SQLITE_ROW) return true;
    sqlite3_reset(s_.get());
    if (rc == SQLITE_DONE) return false;
    return SqlError(sqlite3_db_handle(s_.get()), StrCat("'", sqlite3_sql(s_.get()), "'"));
  }
  Status Run() {
    StatusOr<bool> r = Step();
    if (!r.ok()) return r.status();
    sqlite3_reset(s_.get());
    return absl::OkStatus();
  }
  int64_t Int(int col) const { return sqlite3_column_int64(s_.get(), col); }
  uint64_t U64(int col) const { return static_cast<uint64_t>(Int(col)); }
  double Real(int col) const { return sqlite3_column_double(s_.get(), col); }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_.get(), col);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(sqlite3_column_bytes(s_.get(), col)))
             : std::string();
  }
  std::string Blob(int col) const {
    const void* b = sqlite3_column_blob(s_.get(), col);
    return b ? std::string(static_cast<const char*>(b), static_cast<size_t>(sqlite3_column_bytes(s_.get(), col)))
             : std::string();
  }
  void Reset() { sqlite3_reset(s_.get()); }

 private:
  void BindOne(int i, int64_t v) { sqlite3_bind_int64(s_.get(), i, v); }
  void BindOne(int i, uint64_t v) { sqlite3_bind_int64(s_.get(), i, static_cast<int64_t>(v)); }
  void BindOne(int i, int v) { sqlite3_bind_int64(s_.get(), i, v); }
  void BindOne(int i, uint32_t v) { sqlite3_bind_int64(s_.get(), i, v); }
  void BindOne(int i, double v) { sqlite3_bind_double(s_.get(), i, v); }
  void BindOne(int i, float v) { sqlite3_bind_double(s_.get(), i, v); }
  void BindOne(int i, const std::string& v) {
    sqlite3_bind_text(s_.get(), i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void BindOne(int i, std::string_view v) {
    sqlite3_bind_text(s_.get(), i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void BindOne(int i, const BlobParam& v) {
    sqlite3_bind_blob(s_.get(), i, v.bytes.data(), static_cast<int>(v.bytes.size()), SQLITE_STATIC);
  }
  std::unique_ptr<sqlite3_stmt, StmtFinalizer> s_;
};

StatusOr<DbPtr> OpenDb(const std::string& path) {
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  DbPtr db(raw);
  if (rc != SQLITE_OK) {
    return absl::UnavailableError(
        StrCat("sqlite ", path, ": cannot open: ", raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  }
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, 5000);
  return db;
}

StatusOr<int64_t> QueryInt(sqlite3* db, const char* sql) {
  VIGIL_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db, sql));
  VIGIL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return SqlError(db, StrCat("'", sql, "' returned no row"));
  const int64_t v = s.Int(0);
  s.Reset();
  return v;
}

struct SqliteImpl {
  DbPtr wdb, rdb;  // writer (one thread), reader (read_mu)

  // Writer statements and caches (writer thread only).
  Stmt begin, commit, rollback, find_stream, insert_stream, set_epoch, add_stale, add_duplicates, insert_frame,
      insert_event, insert_detection, upsert_run, get_contiguous, highest_seq, seqs_after, get_edge_epoch,
      grant_edge, touch_edge, insert_outbox, insert_snapshot, find_pending, event_labels, decide_event,
      update_detection;
  // Retention (writer thread).
  Stmt prune_peek_events, prune_count_events, prune_detections, prune_dead, prune_event, prune_runs, prune_peek_frames,
      prune_frames, prune_kept, prune_event_snapshots, prune_orphan_snapshots;
  std::vector<PushRoute> routes;
  struct StreamState {
    int64_t id;
    uint64_t epoch;
  };
  // Caches of committed rows, writer thread only; dropped whenever a transaction fails.
  std::map<std::pair<std::string, std::string>, StreamState> streams;  // (edge, stream)
  std::map<std::pair<int64_t, uint64_t>, int64_t> contiguous;          // (stream id, run) → through
  // edge → current granted epoch (0: none), read inside the batch's transaction (BEGIN IMMEDIATE holds the
  // write lock, so no other aggregator's Admit can change it before the commit) and kept for that batch only.
  std::map<std::string, uint64_t> edge_epochs;

  void DropCaches() {
    streams.clear();
    contiguous.clear();
    edge_epochs.clear();
  }

  // The push connection (Pushers' threads, the API's dead letters), serialized by push_mu.
  DbPtr pdb;
  mutable Mutex push_mu;
  mutable Stmt push_due VIGIL_GUARDED_BY(push_mu), push_detections VIGIL_GUARDED_BY(push_mu),
      push_next VIGIL_GUARDED_BY(push_mu), push_depth VIGIL_GUARDED_BY(push_mu), push_delete VIGIL_GUARDED_BY(push_mu),
      push_retry VIGIL_GUARDED_BY(push_mu), push_bury VIGIL_GUARDED_BY(push_mu), push_begin VIGIL_GUARDED_BY(push_mu),
      push_commit VIGIL_GUARDED_BY(push_mu), push_rollback VIGIL_GUARDED_BY(push_mu),
      dead_letters VIGIL_GUARDED_BY(push_mu), revive VIGIL_GUARDED_BY(push_mu), forget_dead VIGIL_GUARDED_BY(push_mu);

  // The reader connection (HTTP API, confirmation's queries), serialized by read_mu.
  mutable Mutex read_mu;
  mutable Stmt events_query VIGIL_GUARDED_BY(read_mu), events_query_desc VIGIL_GUARDED_BY(read_mu),
      detections_query VIGIL_GUARDED_BY(read_mu), streams_query VIGIL_GUARDED_BY(read_mu),
      runs_query VIGIL_GUARDED_BY(read_mu), gap_query VIGIL_GUARDED_BY(read_mu), edges_query VIGIL_GUARDED_BY(read_mu),
      snapshots_query VIGIL_GUARDED_BY(read_mu), snapshots_meta_query VIGIL_GUARDED_BY(read_mu),
      latest_snapshot_query VIGIL_GUARDED_BY(read_mu), max_track_query VIGIL_GUARDED_BY(read_mu);

  Status Prepare() {
    // At Open, before any other thread sees the store: the locks only say that the statements are theirs.
    MutexLock push_lock(push_mu);
    MutexLock read_lock(read_mu);
    sqlite3* w = wdb.get();
    const std::pair<Stmt*, const char*> writer[] = {
        {&begin, "BEGIN IMMEDIATE"},
        {&commit, "COMMIT"},
        {&rollback, "ROLLBACK"},
        {&find_stream, "SELECT id, epoch FROM streams WHERE edge = ?1 AND stream = ?2"},
        {&insert_stream, "INSERT INTO streams(edge, stream, epoch) VALUES(?1, ?2, 0)"},
        {&set_epoch, "UPDATE streams SET epoch = ?2 WHERE id = ?1"},
        {&add_stale, "UPDATE streams SET stale_rejected = stale_rejected + 1 WHERE id = ?1"},
        {&add_duplicates, "UPDATE streams SET duplicates = duplicates + ?2 WHERE id = ?1"},
        {&insert_frame,
         "INSERT OR IGNORE INTO frames(stream_id, run, seq, kind, epoch, stored_ns) VALUES(?1, ?2, ?3, ?4, ?5, ?6)"},
        {&insert_event,
         "INSERT INTO events(stream_id, run, seq, epoch, capture_ns, pts_ns, publish_ns, stored_ns, severity, rule, "
         "width, height, state, state_reason, decided_ns) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
         "?13, ?14, ?15)"},
        {&insert_detection,
         "INSERT INTO detections(event_id, idx, class_id, label, score, x1, y1, x2, y2, track_id) "
         "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"},
        {&find_pending,
         "SELECT e.id, e.severity FROM events e JOIN streams s ON s.id = e.stream_id WHERE s.edge = ?1 AND "
         "s.stream = ?2 AND e.run = ?3 AND e.seq = ?4 AND e.state = 'pending'"},
        {&event_labels, "SELECT label FROM detections WHERE event_id = ?1 ORDER BY idx"},
        {&decide_event, "UPDATE events SET state = ?2, state_reason = ?3, decided_ns = ?4 WHERE id = ?1"},
        {&update_detection,
         "UPDATE detections SET label = CASE WHEN ?3 = '' THEN label ELSE ?3 END, second_label = ?4, "
         "second_score = ?5 WHERE event_id = ?1 AND idx = ?2"},
        {&upsert_run,
         "INSERT INTO runs(stream_id, run, frames, events, contiguous_through, first_stored_ns, last_stored_ns, "
         "dropped, lost) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8) ON CONFLICT(stream_id, run) DO UPDATE SET "
         "frames = frames + excluded.frames, events = events + excluded.events, "
         "dropped = dropped + excluded.dropped, lost = lost + excluded.lost, "
         "contiguous_through = excluded.contiguous_through, last_stored_ns = excluded.last_stored_ns"},
        {&get_contiguous, "SELECT contiguous_through FROM runs WHERE stream_id = ?1 AND run = ?2"},
        {&highest_seq, "SELECT seq FROM frames WHERE stream_id = ?1 AND run = ?2 ORDER BY seq DESC LIMIT 1"},
        {&seqs_after, "SELECT seq FROM frames WHERE stream_id = ?1 AND run = ?2 AND seq > ?3 ORDER BY seq"},
        {&get_edge_epoch, "SELECT epoch FROM edges WHERE edge = ?1"},
        {&grant_edge,
         "INSERT INTO edges(edge, epoch, first_seen_ns, last_seen_ns, granted_ns) VALUES(?1, ?2, ?3, ?3, ?3) "
         "ON CONFLICT(edge) DO UPDATE SET epoch = excluded.epoch, last_seen_ns = excluded.last_seen_ns, "
         "granted_ns = excluded.granted_ns"},
        {&touch_edge, "UPDATE edges SET last_seen_ns = ?2 WHERE edge = ?1"},
        {&insert_outbox, "INSERT OR IGNORE INTO push_outbox(sink, event_id, attempts, next_ns) VALUES(?1, ?2, 0, ?3)"},
        {&insert_snapshot,
         "INSERT OR IGNORE INTO snapshots(edge, stream, run, seq, box, x, y, width, height, out_width, out_height, "
         "stored_ns, jpeg) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"},
        {&prune_event_snapshots,
         "DELETE FROM snapshots WHERE (edge, stream, run, seq) IN (SELECT s.edge, s.stream, e.run, e.seq FROM events e "
         "JOIN streams s ON s.id = e.stream_id WHERE e.id = ?1)"},
        {&prune_orphan_snapshots,
         "DELETE FROM snapshots WHERE stored_ns < ?1 AND NOT EXISTS (SELECT 1 FROM events e JOIN streams s ON s.id = "
         "e.stream_id WHERE s.edge = snapshots.edge AND s.stream = snapshots.stream AND e.run = snapshots.run AND "
         "e.seq = snapshots.seq)"},
        {&prune_peek_events,
         "SELECT e.id, e.stored_ns FROM events e WHERE NOT EXISTS (SELECT 1 FROM push_outbox o WHERE o.event_id = "
         "e.id) ORDER BY e.id LIMIT ?1"},
        {&prune_count_events, "SELECT COUNT(*) FROM events"},
        {&prune_detections, "DELETE FROM detections WHERE event_id = ?1"},
        {&prune_dead, "DELETE FROM push_dead_letters WHERE event_id = ?1"},
        {&prune_event, "DELETE FROM events WHERE id = ?1"},
        {&prune_runs, "SELECT stream_id, run, contiguous_through FROM runs WHERE contiguous_through >= 0"},
        {&prune_peek_frames,
         "SELECT seq, stored_ns FROM frames WHERE stream_id = ?1 AND run = ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4"},
        {&prune_frames, "DELETE FROM frames WHERE stream_id = ?1 AND run = ?2 AND seq <= ?3"},
        {&prune_kept,
         "SELECT COUNT(DISTINCT o.event_id) FROM push_outbox o JOIN events e ON e.id = o.event_id "
         "WHERE e.stored_ns < ?1"},
    };
    for (const auto& [stmt, sql] : writer) {
      VIGIL_ASSIGN_OR_RETURN(*stmt, Stmt::Prepare(w, sql));
    }
    sqlite3* r = rdb.get();
    const std::string events_where = StrCat(
        "SELECT ", kEventColumnsForPrepare, ", " VIGIL_EVENT_SNAPSHOT_COUNT " FROM events e JOIN streams s ON s.id = e.stream_id "
        "WHERE e.id > ?1 AND e.id < ?6 AND e.capture_ns >= ?2 AND (?3 = '' OR s.edge = ?3) AND "
        "(?4 = '' OR s.stream = ?4) AND (?8 = '' OR e.severity = ?8) AND (?7 = '' OR EXISTS (SELECT 1 FROM "
        "detections d WHERE d.event_id = e.id AND d.label = ?7)) AND (?9 = 0 OR (e.run = ?10 AND e.seq = ?11)) AND "
        "(?12 = '' OR e.state = ?12) ");
    const std::string events_sql = events_where + "ORDER BY e.id LIMIT ?5";
    const std::string events_desc_sql = events_where + "ORDER BY e.id DESC LIMIT ?5";
    const std::pair<Stmt*, const char*> reader[] = {
        {&events_query, events_sql.c_str()},
        {&events_query_desc, events_desc_sql.c_str()},
        {&detections_query, kDetectionsSql},
        {&streams_query,
         "SELECT id, edge, stream, epoch, duplicates, stale_rejected FROM streams ORDER BY edge, stream"},
        {&runs_query,
         "SELECT run, frames, events, contiguous_through, dropped, lost FROM runs WHERE stream_id = ?1"},
        {&gap_query, "SELECT seq FROM frames WHERE stream_id = ?1 AND run = ?2 AND seq > ?3 ORDER BY seq"},
        {&edges_query, "SELECT edge, epoch, first_seen_ns, last_seen_ns, granted_ns FROM edges ORDER BY edge"},
        {&snapshots_query,
         "SELECT " VIGIL_SNAPSHOT_COLUMNS ", jpeg FROM snapshots WHERE edge = ?1 AND stream = ?2 AND run = ?3 AND "
         "seq = ?4 ORDER BY box"},
        {&snapshots_meta_query,
         "SELECT " VIGIL_SNAPSHOT_COLUMNS " FROM snapshots WHERE edge = ?1 AND stream = ?2 AND run = ?3 AND seq = ?4 "
         "ORDER BY box"},
        {&max_track_query, "SELECT COALESCE(MAX(track_id), 0) FROM detections WHERE track_id > 0"},
        {&latest_snapshot_query,
         "SELECT " VIGIL_SNAPSHOT_COLUMNS ", jpeg FROM snapshots WHERE edge = ?1 AND stream = ?2 AND box = -1 "
         "ORDER BY stored_ns DESC LIMIT 1"},
    };
    for (const auto& [stmt, sql] : reader) {
      VIGIL_ASSIGN_OR_RETURN(*stmt, Stmt::Prepare(r, sql));
    }
    const std::string due = StrCat("SELECT o.id, o.attempts, ", kEventColumnsForPrepare,
                                   " FROM push_outbox o JOIN events e ON e.id = o.event_id JOIN streams s ON s.id = "
                                   "e.stream_id WHERE o.sink = ?1 AND o.next_ns <= ?2 ORDER BY o.next_ns, o.event_id "
                                   "LIMIT ?3");
    const std::string dead = StrCat("SELECT d.sink, d.attempts, d.last_error, d.dead_ns, ", kEventColumnsForPrepare,
                                    " FROM push_dead_letters d JOIN events e ON e.id = d.event_id JOIN streams s ON "
                                    "s.id = e.stream_id WHERE (?1 = '' OR d.sink = ?1) ORDER BY d.id DESC LIMIT ?2");
    sqlite3* pc = pdb.get();
    const std::pair<Stmt*, const char*> pusher[] = {
        {&push_due, due.c_str()},
        {&push_detections, kDetectionsSql},
        {&push_next, "SELECT MIN(next_ns) FROM push_outbox WHERE sink = ?1 HAVING COUNT(*) > 0"},
        {&push_depth, "SELECT COUNT(*) FROM push_outbox WHERE sink = ?1"},
        {&push_delete, "DELETE FROM push_outbox WHERE id = ?1"},
        {&push_retry, "UPDATE push_outbox SET attempts = ?2, next_ns = ?3, last_error = ?4 WHERE id = ?1"},
        {&push_bury,
         "INSERT OR REPLACE INTO push_dead_letters(sink, event_id, attempts, last_error, dead_ns) "
         "SELECT sink, event_id, ?2, ?3, ?4 FROM push_outbox WHERE id = ?1"},
        {&push_begin, "BEGIN IMMEDIATE"},
        {&push_commit, "COMMIT"},
        {&push_rollback, "ROLLBACK"},
        {&dead_letters, dead.c_str()},
        {&revive,
         "INSERT OR IGNORE INTO push_outbox(sink, event_id, attempts, next_ns) "
         "SELECT sink, event_id, 0, ?2 FROM push_dead_letters WHERE sink = ?1"},
        {&forget_dead, "DELETE FROM push_dead_letters WHERE sink = ?1"},
    };
    for (const auto& [stmt, sql] : pusher) {
      VIGIL_ASSIGN_OR_RETURN(*stmt, Stmt::Prepare(pc, sql));
    }
    return absl::OkStatus();
  }

  StatusOr<StreamState*> StreamFor(const Report& r) {
    auto key = std::make_pair(r.edge, r.stream);
    auto it = streams.find(key);
    if (it != streams.end()) return &it->second;
    VIGIL_ASSIGN_OR_RETURN(bool found, find_stream.Bind(r.edge, r.stream).Step());
    StreamState st{};
    if (found) {
      st = {find_stream.Int(0), find_stream.U64(1)};
      find_stream.Reset();
    } else {
      VIGIL_RETURN_IF_ERROR(insert_stream.Bind(r.edge, r.stream).Run());
      st = {sqlite3_last_insert_rowid(wdb.get()), 0};
    }
    return &streams.emplace(key, st).first->second;
  }

  StatusOr<int64_t*> ContiguousFor(int64_t stream_id, uint64_t run) {
    auto key = std::make_pair(stream_id, run);
    auto it = contiguous.find(key);
    if (it != contiguous.end()) return &it->second;
    VIGIL_ASSIGN_OR_RETURN(bool found, get_contiguous.Bind(stream_id, run).Step());
    const int64_t v = found ? get_contiguous.Int(0) : -1;
    get_contiguous.Reset();
    return &contiguous.emplace(key, v).first->second;
  }

  // The current granted epoch of `edge` (0: never granted), from the cache or the committed row.
  StatusOr<uint64_t> EdgeEpoch(const std::string& edge) {
    if (auto it = edge_epochs.find(edge); it != edge_epochs.end()) return it->second;
    VIGIL_ASSIGN_OR_RETURN(bool found, get_edge_epoch.Bind(edge).Step());
    const uint64_t epoch = found ? get_edge_epoch.U64(0) : 0;
    get_edge_epoch.Reset();
    edge_epochs.emplace(edge, epoch);
    return epoch;
  }

  StatusOr<ApplyResult> ApplyOne(const PendingReport& p, int64_t now_ns) {
    const Report& r = *p.report;
    ApplyResult res;
    VIGIL_ASSIGN_OR_RETURN(StreamState * st, StreamFor(r));
    // Fencing inside the transaction: only the edge's current granted epoch may store.
    VIGIL_ASSIGN_OR_RETURN(res.edge_epoch, EdgeEpoch(r.edge));
    if (res.edge_epoch == 0 || r.epoch != res.edge_epoch) {
      VIGIL_RETURN_IF_ERROR(add_stale.Bind(st->id).Run());
      res.kind = ApplyResult::kStale;
      return res;
    }
    if (r.epoch > st->epoch) {
      VIGIL_RETURN_IF_ERROR(set_epoch.Bind(st->id, r.epoch).Run());
      st->epoch = r.epoch;
    }
    uint64_t* counter = r.kind == ReportKind::kDropped ? &res.dropped_frames
                        : r.kind == ReportKind::kLost  ? &res.lost_frames
                                                       : &res.new_frames;
    VIGIL_ASSIGN_OR_RETURN(int64_t * through, ContiguousFor(st->id, r.run));
    for (uint64_t seq = r.seq_first; seq <= r.seq_last; ++seq) {
      // At or below the contiguous prefix every seq is stored (its row may be gone to retention).
      if (static_cast<int64_t>(seq) <= *through) {
        ++res.duplicate_frames;
        continue;
      }
      VIGIL_RETURN_IF_ERROR(insert_frame.Bind(st->id, r.run, seq, static_cast<int>(r.kind), r.epoch, now_ns).Run());
      if (sqlite3_changes(wdb.get()) > 0)
        ++*counter;
      else
        ++res.duplicate_frames;
    }
    if (r.kind == ReportKind::kEvent && res.new_frames == 1) {
      const EventState state = p.verdict != nullptr ? p.verdict->state : EventState::kConfirmed;
      VIGIL_RETURN_IF_ERROR(insert_event
                                .Bind(st->id, r.run, r.seq_first, r.epoch, r.capture_ns, r.pts_ns, r.publish_ns, now_ns,
                                      std::string(transport::ToString(r.severity)), r.rule, r.width, r.height,
                                      std::string(ToString(state)), p.verdict != nullptr ? p.verdict->reason : "",
                                      state == EventState::kPending ? int64_t{0} : now_ns)
                                .Run());
      const int64_t event_id = sqlite3_last_insert_rowid(wdb.get());
      std::vector<std::string> labels;
      labels.reserve(r.detections.size());
      for (size_t i = 0; i < r.detections.size(); ++i) {
        const transport::ReportDetection& d = r.detections[i];
        const auto class_id = static_cast<int64_t>(d.class_id);  // ValidateReport: an integer in [0, 2^24)
        labels.push_back(LabelOf(p.class_names, class_id));
        const int64_t track =
            p.verdict != nullptr && !p.verdict->track_ids.empty() ? p.verdict->track_ids[i] : int64_t{0};
        VIGIL_RETURN_IF_ERROR(insert_detection
                                  .Bind(event_id, static_cast<int64_t>(i), class_id, labels.back(), d.score, d.x1, d.y1,
                                        d.x2, d.y2, track)
                                  .Run());
      }
      // The push outbox, in the event's transaction: stored ⇔ queued for every sink that takes it.
      const std::string severity(transport::ToString(r.severity));
      for (const PushRoute& route : routes) {
        if (!QueuesWhenStored(route, state, p.verdict != nullptr && p.verdict->new_track) ||
            !RouteMatches(route, r.edge, r.stream, severity, labels)) {
          continue;
        }
        VIGIL_RETURN_IF_ERROR(insert_outbox.Bind(route.sink, event_id, now_ns).Run());
        ++res.pushes_queued;
      }
      res.event_stored = true;
    }
    if (res.duplicate_frames > 0) VIGIL_RETURN_IF_ERROR(add_duplicates.Bind(st->id, res.duplicate_frames).Run());
    if (res.new_frames + res.dropped_frames + res.lost_frames > 0) {
      // New frames can extend the contiguous prefix only if they cover its next seq; then the
      // prefix runs on through frames stored earlier above them.
      const uint64_t next = static_cast<uint64_t>(*through + 1);
      if (r.seq_first <= next && next <= r.seq_last) {
        int64_t c = static_cast<int64_t>(r.seq_last);
        seqs_after.Bind(st->id, r.run, c);
        for (;;) {
          VIGIL_ASSIGN_OR_RETURN(bool row, seqs_after.Step());
          if (!row || seqs_after.Int(0) != c + 1) break;
          ++c;
        }
        seqs_after.Reset();
        *through = c;
      }
      VIGIL_RETURN_IF_ERROR(upsert_run
                                .Bind(st->id, r.run, res.new_frames, res.event_stored ? 1 : 0, *through, now_ns,
                                      res.dropped_frames, res.lost_frames)
                                .Run());
    } else {
      res.kind = ApplyResult::kDuplicate;
    }
    res.contiguous_through = *through;
    return res;
  }

  // Decides a pending event (store.h, Event states); a confirmation queues it for the routes waiting for one.
  Status DecideOne(const EventDecision& d, int64_t now_ns, DecisionResult& out) {
    find_pending.Bind(d.edge, d.stream, d.run, d.seq);
    VIGIL_ASSIGN_OR_RETURN(bool row, find_pending.Step());
    if (!row) {
      find_pending.Reset();
      ++out.skipped;
      return absl::OkStatus();
    }
    const int64_t event_id = find_pending.Int(0);
    const std::string severity = find_pending.Text(1);
    find_pending.Reset();
    VIGIL_RETURN_IF_ERROR(decide_event.Bind(event_id, std::string(ToString(d.state)), d.reason, now_ns).Run());
    for (const DetectionUpdate& u : d.detections) {
      VIGIL_RETURN_IF_ERROR(update_detection
                                .Bind(event_id, static_cast<int64_t>(u.index), u.label, u.second_label,
                                      static_cast<double>(u.second_score))
                                .Run());
    }
    if (d.state != EventState::kConfirmed) {
      ++out.rejected;
      return absl::OkStatus();
    }
    ++out.confirmed;
    if (std::none_of(routes.begin(), routes.end(), [](const PushRoute& r) { return r.on_confirmed; })) {
      return absl::OkStatus();
    }
    std::vector<std::string> labels;
    event_labels.Bind(event_id);
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(bool more, event_labels.Step());
      if (!more) break;
      labels.push_back(event_labels.Text(0));
    }
    event_labels.Reset();
    for (const PushRoute& route : routes) {
      if (!QueuesWhenDecided(route, d) || !RouteMatches(route, d.edge, d.stream, severity, labels)) continue;
      VIGIL_RETURN_IF_ERROR(insert_outbox.Bind(route.sink, event_id, now_ns).Run());
      ++out.pushes_queued;
    }
    return absl::OkStatus();
  }
};

class SqliteBackend final : public StoreBackend {
 public:
  SqliteBackend(std::string shown, std::unique_ptr<SqliteImpl> impl) : path_(std::move(shown)), impl_(std::move(impl)) {}
  StatusOr<Grant> Admit(const std::string& edge, uint64_t held_epoch, bool promote,
                        std::span<const transport::HelloStream> streams, int64_t now_ns) override;
  StatusOr<std::vector<ApplyResult>> Apply(std::span<const PendingReport> batch, int64_t now_ns,
                                           std::span<const EventDecision> decisions, DecisionResult& decided) override;
  StatusOr<std::vector<StoredEvent>> Events(const EventQuery& query) const override;
  StatusOr<uint64_t> PutSnapshots(std::span<const PendingSnapshot> batch, int64_t now_ns) override;
  StatusOr<std::vector<StoredSnapshot>> Snapshots(const std::string& edge, const std::string& stream, uint64_t run,
                                                  uint64_t seq, bool with_jpeg) const override;
  StatusOr<std::optional<StoredSnapshot>> LatestSnapshot(const std::string& edge,
                                                         const std::string& stream) const override;
  StatusOr<StoreStats> Stats(size_t max_gaps_per_run) const override;
  StatusOr<int64_t> MaxTrackId() const override {
    MutexLock lock(impl_->read_mu);
    VIGIL_ASSIGN_OR_RETURN(bool row, impl_->max_track_query.Bind().Step());
    const int64_t v = row ? impl_->max_track_query.Int(0) : 0;
    impl_->max_track_query.Reset();
    return v;
  }
  StatusOr<RetentionResult> Prune(const RetentionPolicy& policy, int64_t now_ns) override;
  StatusOr<std::vector<OutboxItem>> PushDue(const std::string& sink, int64_t now_ns, int limit) const override;
  StatusOr<std::optional<int64_t>> PushNextDue(const std::string& sink) const override;
  StatusOr<uint64_t> PushDepth(const std::string& sink) const override;
  Status PushDelivered(std::span<const int64_t> outbox_ids) override;
  Status PushRetry(int64_t outbox_id, int attempts, int64_t next_ns, const std::string& error) override;
  Status PushDead(int64_t outbox_id, int attempts, const std::string& error, int64_t now_ns) override;
  StatusOr<std::vector<DeadLetter>> DeadLetters(const std::string& sink, int limit) const override;
  StatusOr<uint64_t> ReplayDeadLetters(const std::string& sink, int64_t now_ns) override;

 private:
  std::string path_;
  std::unique_ptr<SqliteImpl> impl_;
};

}  // namespace

StatusOr<std::unique_ptr<StoreBackend>> OpenSqliteBackend(const std::string& path, const std::string& shown,
                                                          const StoreOptions& options) {
  auto impl = std::make_unique<SqliteImpl>();
  VIGIL_ASSIGN_OR_RETURN(impl->wdb, OpenDb(path));
  sqlite3* w = impl->wdb.get();
  StatusOr<int64_t> version = QueryInt(w, "PRAGMA user_version");
  if (!version.ok()) return absl::UnavailableError(StrCat("sqlite ", path, ": ", version.status().message()));
  if (*version > Store::kSchemaVersion) {
    return absl::FailedPreconditionError(StrCat("sqlite ", path, ": schema version ", *version,
                                                " is newer than this vigil supports (", Store::kSchemaVersion, ")"));
  }
  {
    VIGIL_ASSIGN_OR_RETURN(Stmt wal, Stmt::Prepare(w, "PRAGMA journal_mode=WAL"));
    VIGIL_ASSIGN_OR_RETURN(bool row, wal.Step());
    if (!row || wal.Text(0) != "wal") {
      return absl::UnavailableError(
          StrCat("sqlite ", path, ": cannot switch to WAL journal mode (got '", row ? wal.Text(0) : "", "')"));
    }
  }
  VIGIL_RETURN_IF_ERROR(
      Exec(w, options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", "set synchronous"));
  VIGIL_RETURN_IF_ERROR(Exec(w, "PRAGMA foreign_keys=ON", "enable foreign keys"));
  for (int64_t v = *version; v < Store::kSchemaVersion; ++v) {
    const std::string step = schema::MigrationSql(schema::Dialect::kSqlite, static_cast<int>(v));
    if (step.empty()) {  // the schema description lacks a step this vigil's version asks for: record nothing
      return absl::InternalError(StrCat("sqlite ", path, ": no schema step ", v, " → ", v + 1,
                                        " in the schema description (aggregator/schema.cc)"));
    }
    const std::string sql = StrCat("BEGIN IMMEDIATE;", step, "PRAGMA user_version=", v + 1, ";COMMIT;");
    if (sqlite3_exec(w, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
      Status st = SqlError(w, StrCat("migrate schema ", v, " → ", v + 1));
      (void)Exec(w, "ROLLBACK", "rollback");
      return st;
    }
  }
  VIGIL_ASSIGN_OR_RETURN(impl->rdb, OpenDb(path));
  VIGIL_RETURN_IF_ERROR(Exec(impl->rdb.get(), "PRAGMA query_only=1", "make the read connection read-only"));
  VIGIL_ASSIGN_OR_RETURN(impl->pdb, OpenDb(path));
  VIGIL_RETURN_IF_ERROR(Exec(impl->pdb.get(), options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
                             "set synchronous (push connection)"));
  impl->routes = options.routes;
  VIGIL_RETURN_IF_ERROR(impl->Prepare());
  return std::unique_ptr<StoreBackend>(new SqliteBackend(shown, std::move(impl)));
}

StatusOr<Grant> SqliteBackend::Admit(const std::string& edge, uint64_t held_epoch, bool promote,
                             std::span<const transport::HelloStream> streams, int64_t now_ns) {
  SqliteImpl& d = *impl_;
  VIGIL_RETURN_IF_ERROR(d.begin.Run());
  Grant g;
  auto body = [&]() -> Status {
    // Read the committed value, not the cache: this is the authority's decision.
    VIGIL_ASSIGN_OR_RETURN(bool found, d.get_edge_epoch.Bind(edge).Step());
    const uint64_t previous = found ? d.get_edge_epoch.U64(0) : 0;
    d.get_edge_epoch.Reset();
    VIGIL_ASSIGN_OR_RETURN(g, DecideGrant(held_epoch, promote, previous));
    if (g.kind == Grant::kNew) {
      VIGIL_RETURN_IF_ERROR(d.grant_edge.Bind(edge, g.epoch, now_ns).Run());
    } else if (g.kind == Grant::kReadmitted) {
      VIGIL_RETURN_IF_ERROR(d.touch_edge.Bind(edge, now_ns).Run());
    } else {
      return absl::OkStatus();
    }
    g.streams.reserve(streams.size());
    for (const transport::HelloStream& hs : streams) {
      transport::WelcomeStream& ws = g.streams.emplace_back();
      ws.stream = hs.stream;
      ws.run = hs.run;
      VIGIL_ASSIGN_OR_RETURN(bool known, d.find_stream.Bind(edge, hs.stream).Step());
      if (!known) continue;
      const int64_t stream_id = d.find_stream.Int(0);
      d.find_stream.Reset();
      VIGIL_ASSIGN_OR_RETURN(bool has_run, d.get_contiguous.Bind(stream_id, hs.run).Step());
      if (has_run) ws.contiguous_through = d.get_contiguous.Int(0);
      d.get_contiguous.Reset();
      VIGIL_ASSIGN_OR_RETURN(bool has_seq, d.highest_seq.Bind(stream_id, hs.run).Step());
      if (has_seq) ws.highest_seq = d.highest_seq.Int(0);
      d.highest_seq.Reset();
    }
    return absl::OkStatus();
  };
  Status st = body();
  if (st.ok()) st = d.commit.Run();
  if (!st.ok()) {
    (void)d.rollback.Run();
    d.DropCaches();
    return Annotate(st, StrCat("admit edge ", edge, " (held epoch ", held_epoch, ")"));
  }
  return g;
}

StatusOr<std::vector<ApplyResult>> SqliteBackend::Apply(std::span<const PendingReport> batch, int64_t now_ns,
                                                        std::span<const EventDecision> decisions,
                                                        DecisionResult& decided) {
  SqliteImpl& d = *impl_;
  VIGIL_RETURN_IF_ERROR(d.begin.Run());
  d.edge_epochs.clear();  // fencing reads the committed epochs in this transaction
  std::vector<ApplyResult> results;
  results.reserve(batch.size());
  Status st;
  std::vector<const std::string*> edges;  // distinct senders of the batch: their last_seen_ns moves
  for (const PendingReport& p : batch) {
    StatusOr<ApplyResult> res = d.ApplyOne(p, now_ns);
    if (!res.ok()) {
      st = res.status();
      break;
    }
    results.push_back(*res);
    const std::string& edge = p.report->edge;
    if (std::none_of(edges.begin(), edges.end(), [&](const std::string* e) { return *e == edge; })) {
      edges.push_back(&edge);
    }
  }
  for (size_t i = 0; st.ok() && i < edges.size(); ++i) st = d.touch_edge.Bind(*edges[i], now_ns).Run();
  for (size_t i = 0; st.ok() && i < decisions.size(); ++i) {
    const uint64_t before = decided.confirmed + decided.rejected;
    st = d.DecideOne(decisions[i], now_ns, decided);
    decided.applied[i] = decided.confirmed + decided.rejected > before ? 1 : 0;
  }
  if (st.ok()) st = d.commit.Run();
  if (!st.ok()) {
    (void)d.rollback.Run();
    d.DropCaches();  // the caches may hold rolled-back rows
    decided = {};
    decided.applied.assign(decisions.size(), 0);
    return Annotate(st, StrCat("store a batch of ", batch.size(), " reports and ", decisions.size(), " decisions"));
  }
  return results;
}

namespace {

// Fills `ev`'s detections with `det` (kDetectionsSql).
Status ReadDetections(Stmt& det, StoredEvent& ev) {
  det.Bind(ev.id);
  for (;;) {
    VIGIL_ASSIGN_OR_RETURN(bool row, det.Step());
    if (!row) return absl::OkStatus();
    ev.detections.push_back({static_cast<int32_t>(det.Int(0)), det.Text(1), static_cast<float>(det.Real(2)),
                             static_cast<float>(det.Real(3)), static_cast<float>(det.Real(4)),
                             static_cast<float>(det.Real(5)), static_cast<float>(det.Real(6)), det.Int(7),
                             det.Text(8), static_cast<float>(det.Real(9))});
  }
}

}  // namespace

StatusOr<std::vector<StoredEvent>> SqliteBackend::Events(const EventQuery& q) const {
  MutexLock lock(impl_->read_mu);
  Stmt& e = q.newest_first ? impl_->events_query_desc : impl_->events_query;
  std::vector<StoredEvent> out;
  e.Bind(q.since_id, q.since_ns, q.edge, q.stream, q.limit, q.before_id, q.label, q.severity, q.by_frame ? 1 : 0,
         q.run, q.seq, q.state);
  for (;;) {
    VIGIL_ASSIGN_OR_RETURN(bool row, e.Step());
    if (!row) break;
    out.push_back(EventFromRow(e, 0));
    out.back().snapshots = static_cast<uint32_t>(e.Int(kEventColumnCount));
  }
  for (StoredEvent& ev : out) VIGIL_RETURN_IF_ERROR(ReadDetections(impl_->detections_query, ev));
  return out;
}

StatusOr<uint64_t> SqliteBackend::PutSnapshots(std::span<const PendingSnapshot> batch, int64_t now_ns) {
  SqliteImpl& d = *impl_;
  uint64_t stored = 0;
  VIGIL_RETURN_IF_ERROR(d.begin.Run());
  Status st;
  for (const PendingSnapshot& p : batch) {
    const transport::Snapshot& s = *p.snapshot;
    st = d.insert_snapshot
             .Bind(*p.edge, s.stream, s.run, s.seq, static_cast<int64_t>(s.box), s.x, s.y, s.width, s.height,
                   s.out_width, s.out_height, now_ns, BlobParam{s.jpeg})
             .Run();
    if (!st.ok()) break;
    stored += static_cast<uint64_t>(sqlite3_changes(d.wdb.get()));
  }
  if (st.ok()) st = d.commit.Run();
  if (!st.ok()) {
    (void)d.rollback.Run();
    return Annotate(st, StrCat("store a batch of ", batch.size(), " snapshots"));
  }
  return stored;
}

namespace {
StatusOr<std::vector<StoredSnapshot>> ReadSnapshots(Stmt& q, bool with_jpeg) {
  std::vector<StoredSnapshot> out;
  for (;;) {
    VIGIL_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return out;
    out.push_back(SnapshotFromRow(q));
    if (with_jpeg) out.back().jpeg = q.Blob(12);
  }
}
}  // namespace

StatusOr<std::vector<StoredSnapshot>> SqliteBackend::Snapshots(const std::string& edge, const std::string& stream,
                                                               uint64_t run, uint64_t seq, bool with_jpeg) const {
  MutexLock lock(impl_->read_mu);
  Stmt& q = with_jpeg ? impl_->snapshots_query : impl_->snapshots_meta_query;
  q.Bind(edge, stream, run, seq);
  return ReadSnapshots(q, with_jpeg);
}

StatusOr<std::optional<StoredSnapshot>> SqliteBackend::LatestSnapshot(const std::string& edge,
                                                                      const std::string& stream) const {
  MutexLock lock(impl_->read_mu);
  impl_->latest_snapshot_query.Bind(edge, stream);
  VIGIL_ASSIGN_OR_RETURN(std::vector<StoredSnapshot> v, ReadSnapshots(impl_->latest_snapshot_query, true));
  if (v.empty()) return std::optional<StoredSnapshot>();
  return std::optional<StoredSnapshot>(std::move(v.front()));
}

StatusOr<std::vector<OutboxItem>> SqliteBackend::PushDue(const std::string& sink, int64_t now_ns, int limit) const {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  std::vector<OutboxItem> out;
  d.push_due.Bind(sink, now_ns, limit);
  for (;;) {
    VIGIL_ASSIGN_OR_RETURN(bool row, d.push_due.Step());
    if (!row) break;
    out.push_back({d.push_due.Int(0), static_cast<int>(d.push_due.Int(1)), EventFromRow(d.push_due, 2)});
  }
  for (OutboxItem& item : out) VIGIL_RETURN_IF_ERROR(ReadDetections(d.push_detections, item.event));
  return out;
}

StatusOr<std::optional<int64_t>> SqliteBackend::PushNextDue(const std::string& sink) const {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  VIGIL_ASSIGN_OR_RETURN(bool row, d.push_next.Bind(sink).Step());
  std::optional<int64_t> next;
  if (row) next = d.push_next.Int(0);
  d.push_next.Reset();
  return next;
}

StatusOr<uint64_t> SqliteBackend::PushDepth(const std::string& sink) const {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  VIGIL_ASSIGN_OR_RETURN(bool row, d.push_depth.Bind(sink).Step());
  const uint64_t n = row ? d.push_depth.U64(0) : 0;
  d.push_depth.Reset();
  return n;
}

Status SqliteBackend::PushDelivered(std::span<const int64_t> outbox_ids) {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  Status st = d.push_begin.Run();
  for (size_t i = 0; st.ok() && i < outbox_ids.size(); ++i) st = d.push_delete.Bind(outbox_ids[i]).Run();
  if (st.ok()) st = d.push_commit.Run();
  if (!st.ok()) (void)d.push_rollback.Run();
  return Annotate(st, "push outbox: delete delivered rows");
}

Status SqliteBackend::PushRetry(int64_t outbox_id, int attempts, int64_t next_ns, const std::string& error) {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  return Annotate(d.push_retry.Bind(outbox_id, attempts, next_ns, error.substr(0, 1000)).Run(),
                  "push outbox: record a failed delivery");
}

Status SqliteBackend::PushDead(int64_t outbox_id, int attempts, const std::string& error, int64_t now_ns) {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  Status st = d.push_begin.Run();
  if (st.ok()) st = d.push_bury.Bind(outbox_id, attempts, error.substr(0, 1000), now_ns).Run();
  if (st.ok()) st = d.push_delete.Bind(outbox_id).Run();
  if (st.ok()) st = d.push_commit.Run();
  if (!st.ok()) (void)d.push_rollback.Run();
  return Annotate(st, "push outbox: move a row to the dead letters");
}

StatusOr<uint64_t> SqliteBackend::ReplayDeadLetters(const std::string& sink, int64_t now_ns) {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  Status st = d.push_begin.Run();
  uint64_t n = 0;
  if (st.ok()) st = d.revive.Bind(sink, now_ns).Run();
  if (st.ok()) n = static_cast<uint64_t>(sqlite3_changes(d.pdb.get()));
  if (st.ok()) st = d.forget_dead.Bind(sink).Run();
  if (st.ok()) st = d.push_commit.Run();
  if (!st.ok()) {
    (void)d.push_rollback.Run();
    return Annotate(st, StrCat("push sink '", sink, "': replay the dead letters"));
  }
  return n;
}

StatusOr<std::vector<DeadLetter>> SqliteBackend::DeadLetters(const std::string& sink, int limit) const {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.push_mu);
  std::vector<DeadLetter> out;
  d.dead_letters.Bind(sink, limit);
  for (;;) {
    VIGIL_ASSIGN_OR_RETURN(bool row, d.dead_letters.Step());
    if (!row) break;
    out.push_back({d.dead_letters.Text(0), static_cast<int>(d.dead_letters.Int(1)), d.dead_letters.Text(2),
                   d.dead_letters.Int(3), EventFromRow(d.dead_letters, 4)});
  }
  for (DeadLetter& l : out) VIGIL_RETURN_IF_ERROR(ReadDetections(d.push_detections, l.event));
  return out;
}

StatusOr<StoreStats> SqliteBackend::Stats(size_t max_gaps_per_run) const {
  SqliteImpl& d = *impl_;
  MutexLock lock(d.read_mu);
  StoreStats out;
  // One read transaction, so the numbers agree with each other.
  VIGIL_RETURN_IF_ERROR(Exec(d.rdb.get(), "BEGIN", "begin read"));
  auto body = [&]() -> Status {
    d.read_mu.AssertHeld();  // called below, under the lock
    std::vector<int64_t> ids;
    d.streams_query.Bind();
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(bool row, d.streams_query.Step());
      if (!row) break;
      ids.push_back(d.streams_query.Int(0));
      StreamStats& s = out.streams.emplace_back();
      s.edge = d.streams_query.Text(1);
      s.stream = d.streams_query.Text(2);
      s.epoch = d.streams_query.U64(3);
      s.duplicates = d.streams_query.U64(4);
      s.stale_rejected = d.streams_query.U64(5);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      StreamStats& s = out.streams[i];
      d.runs_query.Bind(ids[i]);
      for (;;) {
        VIGIL_ASSIGN_OR_RETURN(bool row, d.runs_query.Step());
        if (!row) break;
        RunStats& r = s.runs.emplace_back();
        r.run = d.runs_query.U64(0);
        r.frames = d.runs_query.U64(1);
        r.events = d.runs_query.U64(2);
        r.contiguous_through = d.runs_query.Int(3);
        r.dropped = d.runs_query.U64(4);
        r.lost = d.runs_query.U64(5);
      }
      std::sort(s.runs.begin(), s.runs.end(), [](const RunStats& a, const RunStats& b) { return a.run < b.run; });
      for (RunStats& r : s.runs) {
        // Gaps lie above the contiguous prefix: walk only the frames stored there.
        GapWalk walk(r, max_gaps_per_run);
        d.gap_query.Bind(ids[i], r.run, r.contiguous_through);
        for (;;) {
          VIGIL_ASSIGN_OR_RETURN(bool row, d.gap_query.Step());
          if (!row) break;
          walk.Seq(d.gap_query.U64(0));
        }
      }
    }
    std::map<std::string, EdgeStats> edges;
    d.edges_query.Bind();
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(bool row, d.edges_query.Step());
      if (!row) break;
      EdgeStats& e = edges[d.edges_query.Text(0)];
      e.epoch = d.edges_query.U64(1);
      e.first_seen_ns = d.edges_query.Int(2);
      e.last_seen_ns = d.edges_query.Int(3);
      e.granted_ns = d.edges_query.Int(4);
    }
    SumStats(out, std::move(edges));
    return absl::OkStatus();
  };
  Status st = body();
  (void)Exec(d.rdb.get(), "COMMIT", "end read");
  if (!st.ok()) return st;
  return out;
}

namespace {

// Retention's statements on the writer connection.
class SqliteRetention final : public RetentionOps {
 public:
  explicit SqliteRetention(SqliteImpl& d) : d_(d) {}
  StatusOr<uint64_t> CountEvents() override {
    VIGIL_ASSIGN_OR_RETURN(bool row, d_.prune_count_events.Bind().Step());
    const uint64_t n = row ? d_.prune_count_events.U64(0) : 0;
    d_.prune_count_events.Reset();
    return n;
  }
  StatusOr<std::vector<Row>> OldestEvents(int limit) override {
    return Rows(d_.prune_peek_events.Bind(limit));
  }
  StatusOr<Deleted> DeleteEvents(const std::vector<int64_t>& ids) override {
    Deleted out;
    Status st = InTransaction([&]() -> Status {
      for (int64_t id : ids) {
        VIGIL_RETURN_IF_ERROR(d_.prune_detections.Bind(id).Run());
        VIGIL_RETURN_IF_ERROR(d_.prune_dead.Bind(id).Run());
        out.dead_letters += static_cast<uint64_t>(sqlite3_changes(d_.wdb.get()));
        VIGIL_RETURN_IF_ERROR(d_.prune_event_snapshots.Bind(id).Run());
        out.snapshots += static_cast<uint64_t>(sqlite3_changes(d_.wdb.get()));
        VIGIL_RETURN_IF_ERROR(d_.prune_event.Bind(id).Run());
      }
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    return out;
  }
  StatusOr<uint64_t> DeleteOrphanSnapshots(int64_t before_ns) override {
    uint64_t n = 0;
    Status st = InTransaction([&]() -> Status {
      VIGIL_RETURN_IF_ERROR(d_.prune_orphan_snapshots.Bind(before_ns).Run());
      n = static_cast<uint64_t>(sqlite3_changes(d_.wdb.get()));
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    return n;
  }
  StatusOr<uint64_t> KeptForPush(int64_t cutoff_ns) override {
    VIGIL_ASSIGN_OR_RETURN(bool row, d_.prune_kept.Bind(cutoff_ns).Step());
    const uint64_t n = row ? d_.prune_kept.U64(0) : 0;
    d_.prune_kept.Reset();
    return n;
  }
  StatusOr<std::vector<RunRef>> PrefixRuns() override {
    std::vector<RunRef> runs;
    d_.prune_runs.Bind();
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(bool row, d_.prune_runs.Step());
      if (!row) return runs;
      runs.push_back({d_.prune_runs.Int(0), d_.prune_runs.Int(1), d_.prune_runs.Int(2)});
    }
  }
  StatusOr<std::vector<Row>> OldestFrames(const RunRef& run, int limit) override {
    return Rows(d_.prune_peek_frames.Bind(run.stream_id, run.run, run.through, limit));
  }
  Status DeleteFrames(const RunRef& run, int64_t through_seq) override {
    return InTransaction([&] { return d_.prune_frames.Bind(run.stream_id, run.run, through_seq).Run(); });
  }

 private:
  static StatusOr<std::vector<Row>> Rows(Stmt& s) {
    std::vector<Row> rows;
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) return rows;
      rows.push_back({s.Int(0), s.Int(1)});
    }
  }
  template <typename Body>
  Status InTransaction(Body&& body) {
    VIGIL_RETURN_IF_ERROR(d_.begin.Run());
    Status st = body();
    if (st.ok()) st = d_.commit.Run();
    if (!st.ok()) (void)d_.rollback.Run();
    return Annotate(st, "retention");
  }
  SqliteImpl& d_;
};

}  // namespace

StatusOr<RetentionResult> SqliteBackend::Prune(const RetentionPolicy& policy, int64_t now_ns) {
  SqliteRetention ops(*impl_);
  return RunRetention(ops, policy, now_ns);
}

}  // namespace vigil::aggregator
