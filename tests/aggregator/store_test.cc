#include "vigil/aggregator/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "testing/test_database.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

namespace vigil::aggregator {
namespace {

using transport::HelloStream;
using transport::Report;
using transport::ReportKind;
using transport::WelcomeStream;

class StoreTest : public ::testing::TestWithParam<testing::Engine> {
 protected:
  void SetUp() override {
    if (!db_.Create(GetParam())) {
      if (!IsSkipped()) FAIL() << "no database for this test";
      return;
    }
    path_ = db_.target();
  }
  bool sqlite() const { return GetParam() == testing::Engine::kSqlite; }
  int64_t Query(const std::string& sql) { return db_.Query(sql); }

  std::unique_ptr<Store> Open() {
    StatusOr<std::unique_ptr<Store>> s = Store::Open(path_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static Report Progress(uint64_t first, uint64_t last, uint64_t epoch = 1, const std::string& stream = "cam0") {
    Report r;
    r.edge = "edge-1";
    r.stream = stream;
    r.run = 1;
    r.seq_first = first;
    r.seq_last = last;
    r.epoch = epoch;
    return r;
  }
  static Report Event(uint64_t seq, int64_t capture_ns, uint64_t epoch = 1, const std::string& stream = "cam0") {
    Report r = Progress(seq, seq, epoch, stream);
    r.kind = ReportKind::kEvent;
    r.severity = transport::Severity::kCritical;
    r.rule = "person";
    r.capture_ns = capture_ns;
    r.width = 768;
    r.height = 576;
    r.detections = {{10.5f, 20, 110, 220, 0.91f, 0}, {1, 2, 3, 4, 0.5f, 16}};
    return r;
  }
  static Report Marks(ReportKind kind, uint64_t first, uint64_t last, uint64_t epoch = 1) {
    Report r = Progress(first, last, epoch);
    r.kind = kind;
    r.rule = kind == ReportKind::kLost ? "lost_on_restart" : "queue_full";
    return r;
  }

  // COCO's first classes up to "dog" (16).
  const std::vector<std::string> kNames = {"person", "bicycle", "car", "motorcycle", "airplane", "bus",
                                           "train", "truck", "boat", "traffic light", "fire hydrant",
                                           "stop sign", "parking meter", "bench", "bird", "cat", "dog"};

  std::vector<ApplyResult> Apply(Store& s, const std::vector<Report>& reports, int64_t now_ns = 1000) {
    std::vector<PendingReport> batch;
    for (const Report& r : reports) batch.push_back({&r, &kNames});
    StatusOr<std::vector<ApplyResult>> res = s.Apply(batch, now_ns);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : std::vector<ApplyResult>{};
  }

  // Admit and expect success.
  Grant Admit(Store& s, uint64_t held, bool promote = false, const std::string& edge = "edge-1",
              const std::vector<HelloStream>& streams = {}, int64_t now_ns = 500) {
    StatusOr<Grant> g = s.Admit(edge, held, promote, streams, now_ns);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : Grant{};
  }

  testing::TestDatabase db_;
  std::string path_;
};

TEST_P(StoreTest, CreatesAVersionedSchema) {
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->engine(), std::string(sqlite() ? "sqlite" : "postgresql"));
  const char* tables[] = {"edges", "streams", "runs", "frames", "events", "detections", "push_outbox",
                          "push_dead_letters", "snapshots"};
  if (sqlite()) {
    EXPECT_EQ(Query("PRAGMA user_version"), Store::kSchemaVersion);
    sqlite3* db = nullptr;
    sqlite3_open(path_.c_str(), &db);
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
    for (const char* table : tables) {
      EXPECT_EQ(Query(StrCat("SELECT COUNT(*) FROM sqlite_schema WHERE type='table' AND name='", table, "'")), 1)
          << table;
    }
  } else {
    EXPECT_EQ(Query("SELECT version FROM vigil_schema"), Store::kSchemaVersion);
    for (const char* table : tables) {
      EXPECT_EQ(Query(StrCat("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() "
                             "AND table_name = '", table, "'")), 1)
          << table;
    }
  }
  // Opening again migrates nothing and keeps what is stored.
  ASSERT_EQ(Admit(*s, 0).epoch, 1u);
  s.reset();
  s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(Admit(*s, 1).kind, Grant::kReadmitted);
}

TEST_P(StoreTest, RefusesANewerSchemaAndNonDatabases) {
  Open().reset();
  ASSERT_TRUE(db_.Exec(sqlite() ? "PRAGMA user_version=99" : "UPDATE vigil_schema SET version = 99"));
  StatusOr<std::unique_ptr<Store>> s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(s.status().message()),
            StrCat(sqlite() ? "sqlite " : "postgresql ", path_, ": schema version 99 is newer than this vigil supports (",
                   Store::kSchemaVersion, ")"));
  if (sqlite()) {
    const std::string junk = (db_.dir() / "junk.db").string();
    std::ofstream(junk) << std::string(4096, 'x');
    s = Store::Open(junk);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(std::string(s.status().message()).find("file is not a database"), std::string::npos) << s.status();
  } else {
    // Nobody listening: a clear error naming the database without its password.
    s = Store::Open("postgresql://vigil:secret@127.0.0.1:1/nowhere");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
    const std::string m(s.status().message());
    EXPECT_EQ(m.find("secret"), std::string::npos) << m;
    EXPECT_NE(m.find("postgresql postgresql://vigil:***@127.0.0.1:1/nowhere: cannot connect"), std::string::npos) << m;
  }
}

TEST_P(StoreTest, AReSentReportIsStoredOnce) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_EQ(Admit(*s, 0).epoch, 1u);
  std::vector<ApplyResult> r = Apply(*s, {Event(0, 5), Progress(1, 4)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].kind, ApplyResult::kStored);
  EXPECT_TRUE(r[0].event_stored);
  EXPECT_EQ(r[0].contiguous_through, 0);
  EXPECT_EQ(r[1].new_frames, 4u);
  EXPECT_EQ(r[1].contiguous_through, 4);

  r = Apply(*s, {Event(0, 5), Progress(1, 4)});  // the same two again (a re-send after a crash)
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].kind, ApplyResult::kDuplicate);
  EXPECT_FALSE(r[0].event_stored);
  EXPECT_EQ(r[1].kind, ApplyResult::kDuplicate);
  EXPECT_EQ(r[1].duplicate_frames, 4u);
  EXPECT_EQ(r[1].contiguous_through, 4);

  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 5);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 1);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM detections"), 2);
  EXPECT_EQ(Query("SELECT duplicates FROM streams"), 5);

  // Coalesced differently after an edge restart: 3..7 overlaps 3..4; the first report of a frame wins.
  r = Apply(*s, {Event(3, 9), Progress(3, 7)});
  EXPECT_EQ(r[0].kind, ApplyResult::kDuplicate);  // frame 3 is already progress
  EXPECT_EQ(r[1].new_frames, 3u);
  EXPECT_EQ(r[1].duplicate_frames, 2u);
  EXPECT_EQ(r[1].contiguous_through, 7);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 1);
  EXPECT_EQ(Query("SELECT kind FROM frames WHERE seq = 3"), 2);
}

TEST_P(StoreTest, ContiguousPrefixAndGapsFollowOutOfOrderArrival) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_EQ(Admit(*s, 0).epoch, 1u);
  EXPECT_EQ(Apply(*s, {Progress(5, 9)})[0].contiguous_through, -1);
  EXPECT_EQ(Apply(*s, {Progress(12, 12), Progress(15, 20)})[1].contiguous_through, -1);
  StatusOr<StoreStats> st = s->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->streams.size(), 1u);
  ASSERT_EQ(st->streams[0].runs.size(), 1u);
  const RunStats& before = st->streams[0].runs[0];
  EXPECT_EQ(before.frames, 12u);
  EXPECT_EQ(before.last_seq, 20u);
  EXPECT_EQ(before.gaps, (std::vector<SeqRange>{{0, 4}, {10, 11}, {13, 14}}));
  EXPECT_EQ(before.missing, 9u);

  EXPECT_EQ(Apply(*s, {Progress(0, 4)})[0].contiguous_through, 9);  // runs on through 5..9
  EXPECT_EQ(Apply(*s, {Progress(10, 11), Progress(13, 14)})[1].contiguous_through, 20);
  st = s->Stats(1);
  ASSERT_TRUE(st.ok());
  const RunStats& after = st->streams[0].runs[0];
  EXPECT_EQ(after.frames, 21u);
  EXPECT_EQ(after.contiguous_through, 20);
  EXPECT_TRUE(after.gaps.empty());
  EXPECT_EQ(after.missing, 0u);

  // The prefix survives a reopen (it is stored with the run).
  s.reset();
  s = Open();
  EXPECT_EQ(Apply(*s, {Progress(21, 21)})[0].contiguous_through, 21);
  EXPECT_EQ(Query("SELECT contiguous_through FROM runs"), 21);
}

TEST_P(StoreTest, GrantsNewEpochsReadmitsAndFences) {
  auto s = Open();
  ASSERT_TRUE(s);
  // A new instance (held 0) gets 1, 2, 3 …: strictly larger than any granted to the edge id.
  Grant g = Admit(*s, 0);
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.epoch, 1u);
  EXPECT_EQ(g.previous_epoch, 0u);
  EXPECT_FALSE(g.held_unknown);
  EXPECT_EQ(Admit(*s, 0).epoch, 2u);
  g = Admit(*s, 0);
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.epoch, 3u);
  EXPECT_EQ(g.previous_epoch, 2u);
  EXPECT_EQ(Query("SELECT epoch FROM edges WHERE edge = 'edge-1'"), 3);
  // The holder of the current epoch reconnects: re-admitted with it.
  g = Admit(*s, 3);
  EXPECT_EQ(g.kind, Grant::kReadmitted);
  EXPECT_EQ(g.epoch, 3u);
  // An older epoch is fenced, and nothing changes.
  g = Admit(*s, 2);
  EXPECT_EQ(g.kind, Grant::kFenced);
  EXPECT_EQ(g.epoch, 3u);
  EXPECT_TRUE(g.streams.empty());
  EXPECT_EQ(Query("SELECT epoch FROM edges WHERE edge = 'edge-1'"), 3);
  // A standby taking over (promote) gets a new epoch whatever it holds.
  g = Admit(*s, 3, /*promote=*/true);
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.epoch, 4u);
  g = Admit(*s, 1, /*promote=*/true);
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.epoch, 5u);
  // Epochs are per edge id.
  EXPECT_EQ(Admit(*s, 0, false, "edge-2").epoch, 1u);
  EXPECT_EQ(Admit(*s, 4).kind, Grant::kFenced);
}

TEST_P(StoreTest, AHeldEpochTheStoreNeverGrantedIsSucceeded) {
  auto s = Open();
  ASSERT_TRUE(s);
  // E.g. the database was replaced: the edge holds 7, this store granted nothing.
  Grant g = Admit(*s, 7);
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.epoch, 8u);
  EXPECT_TRUE(g.held_unknown);
  EXPECT_EQ(Admit(*s, 5).kind, Grant::kFenced);
  g = Admit(*s, 10);  // above the current 8
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.epoch, 11u);
  EXPECT_TRUE(g.held_unknown);
  EXPECT_EQ(Admit(*s, 11).kind, Grant::kReadmitted);
  // No epoch follows 2^64 - 1: refused, nothing granted.
  StatusOr<Grant> none = s->Admit("edge-1", std::numeric_limits<uint64_t>::max(), false, {}, 600);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Admit(*s, 11).kind, Grant::kReadmitted);
}

TEST_P(StoreTest, GrantedEpochsAreDurableAcrossReopen) {
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(Admit(*s, 0).epoch, 1u);
  EXPECT_EQ(Admit(*s, 0).epoch, 2u);
  s.reset();
  s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(Admit(*s, 1).kind, Grant::kFenced);
  EXPECT_EQ(Admit(*s, 2).kind, Grant::kReadmitted);
  EXPECT_EQ(Admit(*s, 0).epoch, 3u);  // never 1 or 2 again
  // Reports are fenced by the durable value too.
  s.reset();
  s = Open();
  std::vector<ApplyResult> r = Apply(*s, {Progress(0, 0, 2), Progress(0, 0, 3)});
  EXPECT_EQ(r[0].kind, ApplyResult::kStale);
  EXPECT_EQ(r[0].edge_epoch, 3u);
  EXPECT_EQ(r[1].kind, ApplyResult::kStored);
  StatusOr<StoreStats> st = s->Stats();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->edges.size(), 1u);
  EXPECT_EQ(st->edges[0].epoch, 3u);
  EXPECT_EQ(st->edges[0].granted_ns, 500);
}

TEST_P(StoreTest, WelcomeSaysWhatIsStoredOfEachResumedRun) {
  auto s = Open();
  ASSERT_TRUE(s);
  Admit(*s, 0);
  Report other_run = Progress(0, 2);
  other_run.run = 2;
  Apply(*s, {Progress(0, 4), Progress(7, 9), other_run});  // run 1: 0..4, gap 5..6, 7..9
  const std::vector<HelloStream> resumed = {{"cam0", 1}, {"cam0", 2}, {"cam0", 3}, {"cam7", 1}};
  Grant g = Admit(*s, 1, false, "edge-1", resumed);
  EXPECT_EQ(g.kind, Grant::kReadmitted);
  EXPECT_EQ(g.streams, (std::vector<WelcomeStream>{{"cam0", 1, 4, 9}, {"cam0", 2, 2, 2}, {"cam0", 3, -1, -1},
                                                   {"cam7", 1, -1, -1}}));
  g = Admit(*s, 0, false, "edge-1", resumed);  // a new instance is told the same
  EXPECT_EQ(g.kind, Grant::kNew);
  EXPECT_EQ(g.streams[0], (WelcomeStream{"cam0", 1, 4, 9}));
  EXPECT_TRUE(Admit(*s, 1, false, "edge-1", resumed).streams.empty());  // fenced: nothing
  // Another edge's streams of the same name are its own.
  EXPECT_EQ(Admit(*s, 0, false, "edge-2", resumed).streams[0], (WelcomeStream{"cam0", 1, -1, -1}));
}

TEST_P(StoreTest, AnOldSessionsReportCommittedAfterANewerGrantIsStale) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_EQ(Admit(*s, 0).epoch, 1u);
  Apply(*s, {Progress(0, 4, 1)});
  // A new instance is granted 2 while a report of the epoch-1 session is still queued: it commits later.
  ASSERT_EQ(Admit(*s, 0).epoch, 2u);
  std::vector<ApplyResult> r = Apply(*s, {Progress(5, 9, 1), Event(10, 5, 1), Progress(5, 6, 2)});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].kind, ApplyResult::kStale);
  EXPECT_EQ(r[0].edge_epoch, 2u);
  EXPECT_EQ(r[0].new_frames, 0u);
  EXPECT_EQ(r[1].kind, ApplyResult::kStale);
  EXPECT_FALSE(r[1].event_stored);
  EXPECT_EQ(r[2].kind, ApplyResult::kStored);
  EXPECT_EQ(r[2].contiguous_through, 6);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 7);  // 0..4 (epoch 1), 5..6 (epoch 2); nothing of 7..10
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames WHERE seq >= 7"), 0);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 0);
  EXPECT_EQ(Query("SELECT epoch FROM frames WHERE seq = 5"), 2);
  // A later epoch than granted is stale too (only the current one stores), and an edge never admitted
  // has no epoch at all.
  Report stranger = Progress(0, 0, 1);
  stranger.edge = "edge-9";
  r = Apply(*s, {Progress(11, 11, 3), stranger});
  EXPECT_EQ(r[0].kind, ApplyResult::kStale);
  EXPECT_EQ(r[0].edge_epoch, 2u);
  EXPECT_EQ(r[1].kind, ApplyResult::kStale);
  EXPECT_EQ(r[1].edge_epoch, 0u);
  StatusOr<StoreStats> st = s->Stats();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->streams.size(), 2u);
  EXPECT_EQ(st->streams[0].stale_rejected, 3u);
  EXPECT_EQ(st->streams[0].frames, 7u);
  EXPECT_EQ(st->streams[0].epoch, 2u);
  EXPECT_EQ(st->edges[0].stale_rejected, 3u);
  EXPECT_EQ(st->edges[1].edge, "edge-9");  // seen only through its stale report
  EXPECT_EQ(st->edges[1].epoch, 0u);
  EXPECT_EQ(st->edges[1].stale_rejected, 1u);
  EXPECT_EQ(st->edges[1].frames, 0u);
}

TEST_P(StoreTest, DroppedAndLostFramesAreAccountedNotMissing) {
  auto s = Open();
  ASSERT_TRUE(s);
  Admit(*s, 0);
  std::vector<ApplyResult> r = Apply(*s, {Progress(0, 3), Marks(ReportKind::kDropped, 4, 6), Progress(7, 9),
                                          Marks(ReportKind::kLost, 12, 14)});
  EXPECT_EQ(r[1].kind, ApplyResult::kStored);
  EXPECT_EQ(r[1].dropped_frames, 3u);
  EXPECT_EQ(r[1].new_frames, 0u);
  EXPECT_EQ(r[1].contiguous_through, 6);  // the cursor moves over dropped frames
  EXPECT_EQ(r[2].contiguous_through, 9);
  EXPECT_EQ(r[3].lost_frames, 3u);
  EXPECT_EQ(r[3].contiguous_through, 9);
  StatusOr<StoreStats> st = s->Stats();
  ASSERT_TRUE(st.ok());
  const RunStats& run = st->streams[0].runs[0];
  EXPECT_EQ(run.frames, 7u);
  EXPECT_EQ(run.dropped, 3u);
  EXPECT_EQ(run.lost, 3u);
  EXPECT_EQ(run.last_seq, 14u);
  EXPECT_EQ(run.gaps, (std::vector<SeqRange>{{10, 11}}));  // only 10..11 have no row
  EXPECT_EQ(run.missing, 2u);

  // 10..11 are lost too; a re-sent mark counts once.
  r = Apply(*s, {Marks(ReportKind::kLost, 10, 11), Marks(ReportKind::kDropped, 4, 6), Marks(ReportKind::kLost, 12, 12)});
  EXPECT_EQ(r[0].lost_frames, 2u);
  EXPECT_EQ(r[0].contiguous_through, 14);
  EXPECT_EQ(r[1].kind, ApplyResult::kDuplicate);
  EXPECT_EQ(r[1].dropped_frames, 0u);
  EXPECT_EQ(r[1].duplicate_frames, 3u);
  EXPECT_EQ(r[2].kind, ApplyResult::kDuplicate);
  st = s->Stats();
  ASSERT_TRUE(st.ok());
  const RunStats& after = st->streams[0].runs[0];
  EXPECT_EQ(after.dropped, 3u);
  EXPECT_EQ(after.lost, 5u);
  EXPECT_EQ(after.contiguous_through, 14);
  EXPECT_TRUE(after.gaps.empty());
  EXPECT_EQ(after.missing, 0u);
  EXPECT_EQ(st->streams[0].dropped, 3u);
  EXPECT_EQ(st->streams[0].lost, 5u);
  EXPECT_EQ(st->streams[0].missing, 0u);
  EXPECT_EQ(st->edges[0].dropped, 3u);
  EXPECT_EQ(st->edges[0].lost, 5u);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames WHERE kind = 3"), 3);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames WHERE kind = 4"), 5);
  EXPECT_EQ(Query("SELECT dropped FROM runs"), 3);
  EXPECT_EQ(Query("SELECT lost FROM runs"), 5);
  // The Welcome counts them as stored.
  EXPECT_EQ(Admit(*s, 1, false, "edge-1", {{"cam0", 1}}).streams[0], (WelcomeStream{"cam0", 1, 14, 14}));
}

TEST_P(StoreTest, LabelsComeFromTheAdmittingHellosClassNames) {
  auto s = Open();
  ASSERT_TRUE(s);
  Admit(*s, 0);
  Report e = Event(0, 100);
  e.detections = {{1, 2, 3, 4, 0.9f, 0}, {1, 2, 3, 4, 0.8f, 16}, {1, 2, 3, 4, 0.7f, 17}, {1, 2, 3, 4, 0.6f, 70000}};
  Report no_names = Event(1, 200);
  no_names.detections = {{1, 2, 3, 4, 0.5f, 2}};
  const std::vector<std::string> short_list = {"person"};
  const std::vector<PendingReport> batch = {{&e, &kNames}, {&no_names, nullptr}};
  ASSERT_TRUE(s->Apply(batch, 1000).ok());
  Report e2 = Event(2, 300);
  ASSERT_TRUE(s->Apply(std::vector<PendingReport>{{&e2, &short_list}}, 1000).ok());
  StatusOr<std::vector<StoredEvent>> ev = s->Events({});
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ(ev->size(), 3u);
  ASSERT_EQ((*ev)[0].detections.size(), 4u);
  EXPECT_EQ((*ev)[0].detections[0].label, "person");
  EXPECT_EQ((*ev)[0].detections[1].label, "dog");
  EXPECT_EQ((*ev)[0].detections[2].label, "class 17");
  EXPECT_EQ((*ev)[0].detections[3].label, "class 70000");
  EXPECT_EQ((*ev)[0].detections[3].class_id, 70000);
  EXPECT_EQ((*ev)[1].detections[0].label, "class 2");
  EXPECT_EQ((*ev)[2].detections[0].label, "person");
  EXPECT_EQ((*ev)[2].detections[1].label, "class 16");
}

TEST_P(StoreTest, MigratesASchema1Database) {
  // A version-1 database written before epochs were granted: edges.epoch was the edge's own claim.
  if (!sqlite()) GTEST_SKIP() << "schema-1 databases exist only in SQLite (PostgreSQL came with schema 4)";
  {
    auto s = Open();
    ASSERT_TRUE(s);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  // Emulate version 1: drop what migration 2 added.
  ASSERT_EQ(sqlite3_exec(db,
                         "ALTER TABLE runs DROP COLUMN dropped; ALTER TABLE runs DROP COLUMN lost; "
                         "ALTER TABLE edges DROP COLUMN granted_ns; DROP TABLE push_outbox; "
                         "DROP TABLE push_dead_letters; DROP INDEX events_stored; DROP TABLE snapshots; "
                         "DROP INDEX events_pending; DROP INDEX detections_track; ALTER TABLE events DROP COLUMN state; "
                         "ALTER TABLE events DROP COLUMN state_reason; ALTER TABLE events DROP COLUMN decided_ns; "
                         "ALTER TABLE detections DROP COLUMN track_id; ALTER TABLE detections DROP COLUMN second_label; "
                         "ALTER TABLE detections DROP COLUMN second_score; PRAGMA user_version=1; "
                         "INSERT INTO edges(edge, epoch, first_seen_ns, last_seen_ns) VALUES('edge-1', 6, 1, 2);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(Query("PRAGMA user_version"), Store::kSchemaVersion);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox"), 0) << "migration 3: the push outbox";
  EXPECT_EQ(Admit(*s, 5).kind, Grant::kFenced);
  EXPECT_EQ(Admit(*s, 6).kind, Grant::kReadmitted);
  EXPECT_EQ(Admit(*s, 0).epoch, 7u);
  EXPECT_EQ(Apply(*s, {Marks(ReportKind::kDropped, 0, 1, 7)})[0].dropped_frames, 2u);
  EXPECT_EQ(Query("SELECT dropped FROM runs"), 2);
}

// Event states (store.h): an event is stored in its verdict's state with its detections' track ids; a pending one is
// decided once, in a later batch's transaction or in its own; routes waiting for confirmation queue it only then.
TEST_P(StoreTest, EventStatesAreStoredAndDecidedOnceAndConfirmationQueuesItsPushes) {
  StoreOptions o;
  o.routes = {{.sink = "all"}, {.sink = "alarms", .classes = {"person"}, .on_confirmed = true}};
  StatusOr<std::unique_ptr<Store>> opened = Store::Open(path_, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Store& s = **opened;
  ASSERT_EQ(Admit(s, 0).epoch, 1u);
  EXPECT_EQ(*s.MaxTrackId(), 0);
  const Report e0 = Event(0, 100), e1 = Event(1, 110), e2 = Event(2, 120), p3 = Progress(3, 3), e4 = Event(4, 140);
  const EventVerdict pending{EventState::kPending, "track 5 (person): tentative", {5, 0}};
  const EventVerdict confirmed{EventState::kConfirmed, "track 6 (person): seen in 2 of the last 2 frames", {6, 9}};
  std::vector<PendingReport> batch = {{&e0, &kNames, &pending}, {&e1, &kNames, &confirmed}, {&e2, &kNames}};
  DecisionResult d;
  StatusOr<std::vector<ApplyResult>> r = s.Apply(batch, 1000, {}, &d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].pushes_queued, 1) << "pending: the stored route only";
  EXPECT_EQ((*r)[1].pushes_queued, 2);
  EXPECT_EQ((*r)[2].pushes_queued, 2) << "no verdict: confirmed";
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'alarms'"), 2);
  EXPECT_EQ(*s.MaxTrackId(), 9);

  EventQuery q;
  q.state = "pending";
  StatusOr<std::vector<StoredEvent>> got = s.Events(q);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].seq, 0u);
  EXPECT_EQ((*got)[0].state, EventState::kPending);
  EXPECT_EQ((*got)[0].state_reason, "track 5 (person): tentative");
  EXPECT_EQ((*got)[0].decided_ns, 0);
  ASSERT_EQ((*got)[0].detections.size(), 2u);
  EXPECT_EQ((*got)[0].detections[0].track_id, 5);
  EXPECT_EQ((*got)[0].detections[1].track_id, 0);
  q.state = "confirmed";
  got = s.Events(q);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].state_reason, "track 6 (person): seen in 2 of the last 2 frames");
  EXPECT_EQ((*got)[0].decided_ns, 1000);
  EXPECT_EQ((*got)[1].state_reason, "");
  EXPECT_EQ((*got)[1].detections[0].track_id, 0);

  // A later batch confirms seq 0; a decision on an event never stored is skipped.
  const std::vector<EventDecision> first = {
      {"edge-1", "cam0", 1, 0, EventState::kConfirmed, "track 5 (person): seen in 2 of the last 2 frames"},
      {"edge-1", "cam0", 1, 77, EventState::kRejected, "no such event"}};
  std::vector<PendingReport> next = {{&p3, &kNames}};
  r = s.Apply(next, 2000, first, &d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(d.confirmed, 1u);
  EXPECT_EQ(d.rejected, 0u);
  EXPECT_EQ(d.skipped, 1u);
  EXPECT_EQ(d.applied, (std::vector<char>{1, 0}));
  EXPECT_EQ(d.pushes_queued, 1);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'alarms'"), 3);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'all'"), 3) << "queued once, when stored";
  // Decided events never change again.
  r = s.Apply({}, 3000, std::vector<EventDecision>{{"edge-1", "cam0", 1, 0, EventState::kRejected, "late"}}, &d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(d.skipped, 1u);
  EXPECT_EQ(d.rejected, 0u);
  // An event stored pending and rejected in the same transaction: no push for the alarms.
  const EventVerdict pending4{EventState::kPending, "tentative", {11, 12}};
  next = {{&e4, &kNames, &pending4}};
  r = s.Apply(next, 4000,
              std::vector<EventDecision>{{"edge-1", "cam0", 1, 4, EventState::kRejected, "track 11 ended tentative"}},
              &d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(d.rejected, 1u);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'alarms'"), 3);
  q.state = "";
  q.by_frame = true;
  q.edge = "edge-1";
  q.stream = "cam0";
  q.run = 1;
  for (auto [seq, state, reason, decided] :
       std::vector<std::tuple<uint64_t, EventState, std::string, int64_t>>{
           {0, EventState::kConfirmed, "track 5 (person): seen in 2 of the last 2 frames", 2000},
           {4, EventState::kRejected, "track 11 ended tentative", 4000}}) {
    q.seq = seq;
    got = s.Events(q);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 1u) << seq;
    EXPECT_EQ((*got)[0].state, state) << seq;
    EXPECT_EQ((*got)[0].state_reason, reason) << seq;
    EXPECT_EQ((*got)[0].decided_ns, decided) << seq;
  }
  EXPECT_EQ(*s.MaxTrackId(), 12);

  // Shapes Store::Apply refuses (nothing stored).
  const Report e5 = Event(5, 150);
  const EventVerdict short_ids{EventState::kPending, "", {1}};
  next = {{&e5, &kNames, &short_ids}};
  EXPECT_EQ(s.Apply(next, 5000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Apply({}, 5000, std::vector<EventDecision>{{"edge-1", "cam0", 1, 0, EventState::kPending, ""}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 4);
}

// A route with once_per_track queues only confirmations marked new_track (the first confirmed event of a track), when
// stored or decided.
TEST_P(StoreTest, AOncePerTrackRouteQueuesOnlyTheFirstConfirmationOfATrack) {
  StoreOptions o;
  o.routes = {{.sink = "pager", .on_confirmed = true, .once_per_track = true}, {.sink = "all", .on_confirmed = true}};
  StatusOr<std::unique_ptr<Store>> opened = Store::Open(path_, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Store& s = **opened;
  ASSERT_EQ(Admit(s, 0).epoch, 1u);
  const Report e0 = Event(0, 100), e1 = Event(1, 110), e2 = Event(2, 120);
  EventVerdict first{EventState::kConfirmed, "track 3", {3, 0}};
  first.new_track = true;
  const EventVerdict again{EventState::kConfirmed, "track 3", {3, 0}};
  const EventVerdict pending{EventState::kPending, "track 4", {4, 0}};
  std::vector<PendingReport> batch = {{&e0, &kNames, &first}, {&e1, &kNames, &again}, {&e2, &kNames, &pending}};
  StatusOr<std::vector<ApplyResult>> r = s.Apply(batch, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].pushes_queued, 2);
  EXPECT_EQ((*r)[1].pushes_queued, 1) << "not the pager: its track was alerted";
  EXPECT_EQ((*r)[2].pushes_queued, 0);
  EventDecision decided{"edge-1", "cam0", 1, 2, EventState::kConfirmed, "track 4", {}, {4}};
  decided.new_track = true;
  DecisionResult d;
  r = s.Apply({}, 2000, std::vector<EventDecision>{decided}, &d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(d.pushes_queued, 2);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'pager'"), 2);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'all'"), 3);
}

TEST_P(StoreTest, EventsQueryFiltersAndReturnsDetections) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_EQ(Admit(*s, 0).epoch, 1u);  // at 500
  Apply(*s, {Event(0, 100), Progress(1, 1), Event(2, 300), Event(0, 200, 1, "cam1"), Event(3, 400)});
  StatusOr<std::vector<StoredEvent>> all = s->Events({});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  const StoredEvent& e = (*all)[0];
  EXPECT_EQ(e.edge, "edge-1");
  EXPECT_EQ(e.stream, "cam0");
  EXPECT_EQ(e.seq, 0u);
  EXPECT_EQ(e.capture_ns, 100);
  EXPECT_EQ(e.stored_ns, 1000);
  EXPECT_EQ(e.severity, "critical");
  EXPECT_EQ(e.rule, "person");
  EXPECT_EQ(e.width, 768u);
  ASSERT_EQ(e.detections.size(), 2u);
  EXPECT_EQ(e.detections[0], (StoredDetection{0, "person", 0.91f, 10.5f, 20, 110, 220}));
  EXPECT_EQ(e.detections[1].label, "dog");
  EXPECT_EQ(e.detections[1].class_id, 16);

  EventQuery q;
  q.since_id = (*all)[1].id;  // after the second
  StatusOr<std::vector<StoredEvent>> later = s->Events(q);
  ASSERT_EQ(later->size(), 2u);
  EXPECT_EQ((*later)[0].stream, "cam1");
  q = {};
  q.stream = "cam0";
  q.since_ns = 300;
  StatusOr<std::vector<StoredEvent>> cam0 = s->Events(q);
  ASSERT_EQ(cam0->size(), 2u);
  EXPECT_EQ((*cam0)[0].seq, 2u);
  EXPECT_EQ((*cam0)[1].seq, 3u);
  q = {};
  q.limit = 1;
  EXPECT_EQ(s->Events(q)->size(), 1u);
  q.edge = "other";
  EXPECT_TRUE(s->Events(q)->empty());

  // Newest first, paged with before_id; by label and severity (the dashboard's list).
  Report car = Event(4, 500);
  car.severity = transport::Severity::kWarning;
  car.detections = {{5, 5, 50, 50, 0.7f, 2}};  // "car"
  Apply(*s, {car});
  auto seqs = [](const StatusOr<std::vector<StoredEvent>>& r) {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const StoredEvent& ev : *r) out.emplace_back(ev.stream, ev.seq);
    return out;
  };
  using Seqs = std::vector<std::pair<std::string, uint64_t>>;
  q = {};
  q.newest_first = true;
  q.limit = 2;
  StatusOr<std::vector<StoredEvent>> page = s->Events(q);
  EXPECT_EQ(seqs(page), (Seqs{{"cam0", 4}, {"cam0", 3}}));
  q.before_id = page->back().id;
  EXPECT_EQ(seqs(s->Events(q)), (Seqs{{"cam1", 0}, {"cam0", 2}}));
  q = {};
  q.label = "car";
  EXPECT_EQ(seqs(s->Events(q)), (Seqs{{"cam0", 4}}));
  q.label = "dog";
  EXPECT_EQ(s->Events(q)->size(), 4u);
  q = {};
  q.severity = "critical";
  EXPECT_EQ(s->Events(q)->size(), 4u);
  q.severity = "warning";
  q.stream = "cam0";
  EXPECT_EQ(seqs(s->Events(q)), (Seqs{{"cam0", 4}}));
  q.label = "dog";
  EXPECT_TRUE(s->Events(q)->empty());

  StatusOr<StoreStats> st = s->Stats();
  ASSERT_EQ(st->edges.size(), 1u);
  EXPECT_EQ(st->edges[0].first_seen_ns, 500);
  EXPECT_EQ(st->edges[0].events, 5u);
}

TEST_P(StoreTest, LastSeenFollowsHellosAndCommittedBatches) {
  auto s = Open();
  ASSERT_TRUE(s);
  Admit(*s, 0, false, "edge-1", {}, 500);
  Admit(*s, 0, false, "edge-2", {}, 600);
  auto seen = [&](size_t i) { return std::make_pair(s->Stats()->edges[i].first_seen_ns, s->Stats()->edges[i].last_seen_ns); };
  EXPECT_EQ(seen(0), std::make_pair(int64_t{500}, int64_t{500}));
  EXPECT_EQ(Apply(*s, {Progress(0, 4), Progress(5, 9)}, 2000).size(), 2u);  // edge-1 only
  EXPECT_EQ(seen(0), std::make_pair(int64_t{500}, int64_t{2000}));
  EXPECT_EQ(seen(1), std::make_pair(int64_t{600}, int64_t{600}));
  Report c = Progress(0, 0, 1, "cam9");
  c.edge = "edge-2";
  Apply(*s, {c, Progress(0, 4)}, 3000);  // a re-send is still a sign of life
  EXPECT_EQ(seen(0).second, 3000);
  EXPECT_EQ(seen(1).second, 3000);
  EXPECT_EQ(Query("SELECT last_seen_ns FROM edges WHERE edge = 'edge-2'"), 3000);
  EXPECT_EQ(Apply(*s, {Progress(10, 10, /*epoch=*/7)}, 4000)[0].kind, ApplyResult::kStale);  // so is a stale one
  EXPECT_EQ(seen(0).second, 4000);
  // A re-admission is one too; the first Hello stays first.
  Admit(*s, 1, false, "edge-2", {}, 4500);
  EXPECT_EQ(seen(1), std::make_pair(int64_t{600}, int64_t{4500}));
  // A report from an edge never admitted creates no edge row.
  Report stranger = Progress(0, 0);
  stranger.edge = "edge-3";
  EXPECT_EQ(Apply(*s, {stranger}, 5000)[0].kind, ApplyResult::kStale);
  EXPECT_EQ(s->Stats()->edges.size(), 3u);  // edge-3 appears through its stream, with no Hello times
  EXPECT_EQ(s->Stats()->edges[2].last_seen_ns, 0);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM edges"), 2);
}

transport::Snapshot Picture(uint64_t seq, int32_t box, char fill, const std::string& stream = "cam0") {
  // Bytes 0..255 and a NUL inside: a blob, not text.
  std::string jpeg("\xFF\xD8\xFF", 3);
  for (int i = 0; i < 256; ++i) jpeg.push_back(static_cast<char>(i));
  jpeg.push_back(fill);
  return transport::Snapshot{stream, 1, seq, box, box < 0 ? 0u : 10u, box < 0 ? 0u : 20u, box < 0 ? 768u : 100u,
                             box < 0 ? 576u : 200u, box < 0 ? 640u : 100u, box < 0 ? 480u : 200u, jpeg};
}

TEST_P(StoreTest, SnapshotsAreStoredOnceFoundByTheirEventAndTheNewestFrameOfAStream) {
  auto sp = Open();
  ASSERT_TRUE(sp);
  Store& s = *sp;
  Admit(s, 0);
  const std::string edge = "edge-1";
  // A picture may come before its event; a repeat keeps the first copy.
  const transport::Snapshot f3 = Picture(3, -1, 'a'), c3 = Picture(3, 0, 'b'), again = Picture(3, -1, 'z');
  std::vector<PendingSnapshot> batch = {{&edge, &c3}, {&edge, &f3}, {&edge, &again}};
  StatusOr<uint64_t> n = s.PutSnapshots(batch, 2000);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2u);
  Apply(s, {Event(3, 100), Event(4, 110)});
  const transport::Snapshot f4 = Picture(4, -1, 'c');
  batch = {{&edge, &f4}};
  ASSERT_TRUE(s.PutSnapshots(batch, 3000).ok());

  StatusOr<std::vector<StoredSnapshot>> got = s.Snapshots(edge, "cam0", 1, 3, /*with_jpeg=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].box, -1);  // the frame first
  EXPECT_EQ((*got)[0].jpeg, f3.jpeg);
  EXPECT_EQ((*got)[0].out_width, 640u);
  EXPECT_EQ((*got)[0].stored_ns, 2000);
  EXPECT_EQ((*got)[1].box, 0);
  EXPECT_EQ((*got)[1].jpeg, c3.jpeg);
  EXPECT_EQ((*got)[1].x, 10u);
  EXPECT_EQ((*got)[1].y, 20u);
  EXPECT_EQ((*got)[1].width, 100u);
  EXPECT_EQ((*got)[1].height, 200u);
  got = s.Snapshots(edge, "cam0", 1, 3, /*with_jpeg=*/false);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  EXPECT_TRUE((*got)[0].jpeg.empty());
  got = s.Snapshots("other", "cam0", 1, 3, true);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());

  StatusOr<std::optional<StoredSnapshot>> latest = s.LatestSnapshot(edge, "cam0");
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->seq, 4u);
  EXPECT_EQ((*latest)->jpeg, f4.jpeg);
  latest = s.LatestSnapshot(edge, "nothing");
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());

  // The event list says how many pictures each event has.
  StatusOr<std::vector<StoredEvent>> events = s.Events({});
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].snapshots, 2u);
  EXPECT_EQ((*events)[1].snapshots, 1u);
  // An event found by its frame (the route that draws a stream's newest picture).
  EventQuery by_frame;
  by_frame.edge = edge;
  by_frame.stream = "cam0";
  by_frame.by_frame = true;
  by_frame.run = 1;
  by_frame.seq = 4;
  events = s.Events(by_frame);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].seq, 4u);
  by_frame.seq = 5;
  events = s.Events(by_frame);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());

  // Retention deletes an event's pictures with it, and pictures whose event never came once they are old.
  const transport::Snapshot orphan = Picture(9, -1, 'o'), fresh_orphan = Picture(10, -1, 'p');
  batch = {{&edge, &orphan}};
  ASSERT_TRUE(s.PutSnapshots(batch, 4000).ok());
  batch = {{&edge, &fresh_orphan}};
  ASSERT_TRUE(s.PutSnapshots(batch, 4000 + Store::kOrphanSnapshotNs).ok());
  RetentionPolicy keep_one;
  keep_one.max_events = 1;
  StatusOr<RetentionResult> pruned = s.Prune(keep_one, 4001 + Store::kOrphanSnapshotNs);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->events, 1u);
  EXPECT_EQ(pruned->snapshots, 3u);  // event 3's two, the old orphan
  got = s.Snapshots(edge, "cam0", 1, 3, false);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(Query("SELECT COUNT(*) FROM snapshots"), 2);  // event 4's, the recent orphan
}

TEST_P(StoreTest, RetentionDeletesOldEventsAndPrefixFramesButKeepsTheAccountingExact) {
  StoreOptions o;
  o.routes = {{.sink = "mes", .streams = {"cam1"}}};  // events of cam1 wait in an outbox
  StatusOr<std::unique_ptr<Store>> opened = Store::Open(path_, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Store& s = **opened;
  Admit(s, 0);
  // t=1000: seqs 0..4 and 6..7 (5 missing); t=5000: event 8; an event of cam1 waiting for its sink.
  Apply(s, {Event(0, 5), Progress(1, 4), Progress(6, 7)}, 1000);
  Apply(s, {Event(8, 9)}, 5000);
  Apply(s, {Event(0, 1, 1, "cam1")}, 1000);
  ASSERT_EQ(Query("SELECT COUNT(*) FROM frames"), 9);

  RetentionPolicy age;
  age.max_age_ns = 2000;
  age.chunk = 2;  // several chunks
  StatusOr<RetentionResult> pruned = s.Prune(age, 6000);  // cutoff 4000
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->events, 1u);  // cam0's event 0; cam1's waits for its sink
  EXPECT_EQ(pruned->kept_for_push, 1u);
  EXPECT_EQ(pruned->frames, 6u);  // cam0 0..4, cam1 0; not 6..7 above cam0's gap, not 8 (stored at 5000)
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 2);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM detections"), 4);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 3);

  // The counts and the gap are what they were.
  StatusOr<StoreStats> st = s.Stats();
  ASSERT_TRUE(st.ok());
  const RunStats& run = st->streams[0].runs[0];
  EXPECT_EQ(run.frames, 8u);
  EXPECT_EQ(run.events, 2u);
  EXPECT_EQ(run.contiguous_through, 4);
  EXPECT_EQ(run.gaps, (std::vector<SeqRange>{{5, 5}}));
  EXPECT_EQ(run.missing, 1u);
  // A re-send of pruned frames is a duplicate, not stored again; the missing one closes the gap.
  std::vector<ApplyResult> r = Apply(s, {Event(0, 5), Progress(1, 4), Progress(5, 5)}, 7000);
  EXPECT_EQ(r[0].kind, ApplyResult::kDuplicate);
  EXPECT_EQ(r[1].duplicate_frames, 4u);
  EXPECT_EQ(r[2].new_frames, 1u);
  EXPECT_EQ(r[2].contiguous_through, 8);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 4);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 2);

  // By count: the oldest beyond max_events go (never one still in an outbox).
  Apply(s, {Event(9, 1), Event(10, 1), Event(11, 1)}, 8000);
  RetentionPolicy count;
  count.max_events = 3;
  pruned = s.Prune(count, 8000);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->events, 2u);  // 5 events: 8 and 9 go, cam1's 0 stays
  StatusOr<std::vector<StoredEvent>> left = s.Events({});
  ASSERT_TRUE(left.ok());
  std::vector<std::pair<std::string, uint64_t>> kept;
  for (const StoredEvent& e : *left) kept.emplace_back(e.stream, e.seq);
  EXPECT_EQ(kept, (std::vector<std::pair<std::string, uint64_t>>{{"cam1", 0}, {"cam0", 10}, {"cam0", 11}}));
  EXPECT_EQ(s.Stats()->streams[0].runs[0].events, 5u);  // counted, though no longer kept
}

TEST_P(StoreTest, AFrameTwiceInOneBatchIsStoredOnceAsItsFirstReportSaysIt) {
  auto s = Open();
  ASSERT_TRUE(s);
  Admit(*s, 0);
  std::vector<ApplyResult> r = Apply(*s, {Progress(0, 2), Event(1, 7), Progress(2, 3)});
  EXPECT_EQ(r[0].new_frames, 3u);
  EXPECT_EQ(r[0].contiguous_through, 2);
  EXPECT_EQ(r[1].kind, ApplyResult::kDuplicate);
  EXPECT_FALSE(r[1].event_stored);
  EXPECT_EQ(r[2].new_frames, 1u);
  EXPECT_EQ(r[2].duplicate_frames, 1u);
  EXPECT_EQ(r[2].contiguous_through, 3);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 4);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 0);
  EXPECT_EQ(Query("SELECT duplicates FROM streams"), 2);
}

TEST_P(StoreTest, AReportIsFencedByAGrantAnotherAggregatorCommittedOnTheSameDatabase) {
  // Two aggregators on one database (a replaced aggregator not yet gone): the fencing check reads the
  // committed epoch in each batch's transaction, not what this process granted last.
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  ASSERT_EQ(Admit(*a, 0).epoch, 1u);
  EXPECT_EQ(Apply(*a, {Progress(0, 1, 1)})[0].kind, ApplyResult::kStored);
  ASSERT_EQ(Admit(*b, 0).epoch, 2u);  // the edge restarted against b
  std::vector<ApplyResult> r = Apply(*a, {Progress(2, 3, 1)});
  EXPECT_EQ(r[0].kind, ApplyResult::kStale);
  EXPECT_EQ(r[0].edge_epoch, 2u);
  EXPECT_EQ(Apply(*b, {Progress(2, 3, 2)})[0].kind, ApplyResult::kStored);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 4);
  EXPECT_EQ(Query("SELECT stale_rejected FROM streams"), 1);
}

TEST_P(StoreTest, AfterTheServerDroppedItsConnectionsTheStoreReconnectsAndAFailedBatchStoresNothing) {
  if (sqlite()) GTEST_SKIP() << "a database server's connection: PostgreSQL only";
  auto s = Open();
  ASSERT_TRUE(s);
  Admit(*s, 0);
  Apply(*s, {Progress(0, 4)});
  // The server drops every connection of the store (as a server restart or a failover does).
  EXPECT_EQ(Query(StrCat("SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE ",
                         "pid <> pg_backend_pid() AND application_name = '", db_.schema(), "'")),
            3)
      << "the writer, reader and push connections";
  // Between transactions: the next batch and the next read reconnect and go through.
  std::vector<ApplyResult> r = Apply(*s, {Progress(5, 9)}, 3000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].new_frames, 5u);
  EXPECT_EQ(r[0].contiguous_through, 9);
  StatusOr<std::vector<StoredEvent>> ev = s->Events({});
  EXPECT_TRUE(ev.ok()) << ev.status();
  StatusOr<StoreStats> st = s->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->streams[0].frames, 10u);
  // Inside a transaction the batch fails as a whole (the aggregator closes its sessions; the edges re-send).
  ASSERT_TRUE(db_.Exec("ALTER TABLE runs ADD CONSTRAINT small CHECK (contiguous_through < 12)"));
  Report big = Progress(10, 14);
  PendingReport p{&big, &kNames};
  StatusOr<std::vector<ApplyResult>> failed = s->Apply({&p, 1}, 4000);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(std::string(failed.status().message()).find("violates check constraint"), std::string::npos)
      << failed.status();
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 10) << "nothing of the failed batch";
  ASSERT_TRUE(db_.Exec("ALTER TABLE runs DROP CONSTRAINT small"));
  r = Apply(*s, {Progress(10, 14)}, 5000);
  EXPECT_EQ(r[0].new_frames, 5u);
  EXPECT_EQ(r[0].contiguous_through, 14);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 15);
}

INSTANTIATE_TEST_SUITE_P(Engines, StoreTest, ::testing::Values(testing::Engine::kSqlite, testing::Engine::kPostgres),
                         testing::EngineName);

}  // namespace
}  // namespace vigil::aggregator
