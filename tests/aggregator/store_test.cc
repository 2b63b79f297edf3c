#include "vigil/aggregator/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::ReportKind;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("vigil_store_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "agg.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Independent look at the file through the SQLite C API.
  int64_t Query(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    int64_t v = -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
  }

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
    r.detections = {{0, 0.91f, 10.5f, 20, 110, 220, "person"}, {16, 0.5f, 1, 2, 3, 4, "dog"}};
    return r;
  }

  std::vector<ApplyResult> Apply(Store& s, const std::vector<Report>& reports) {
    std::vector<const Report*> ptrs;
    for (const Report& r : reports) ptrs.push_back(&r);
    StatusOr<std::vector<ApplyResult>> res = s.Apply(ptrs, 1000);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : std::vector<ApplyResult>{};
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(StoreTest, CreatesAVersionedSchemaInWalMode) {
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(Query("PRAGMA user_version"), Store::kSchemaVersion);
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
  for (const char* table : {"edges", "streams", "runs", "frames", "events", "detections"}) {
    EXPECT_EQ(Query(StrCat("SELECT COUNT(*) FROM sqlite_schema WHERE type='table' AND name='", table, "'")), 1)
        << table;
  }
}

TEST_F(StoreTest, RefusesANewerSchemaAndNonDatabases) {
  Open().reset();
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  StatusOr<std::unique_ptr<Store>> s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(s.status().message()),
            StrCat("sqlite ", path_, ": schema version 99 is newer than this vigil supports (1)"));

  const std::string junk = (dir_ / "junk.db").string();
  std::ofstream(junk) << std::string(4096, 'x');
  s = Store::Open(junk);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(s.status().message()).find("file is not a database"), std::string::npos) << s.status();
}

TEST_F(StoreTest, AReSentReportIsStoredOnce) {
  auto s = Open();
  ASSERT_TRUE(s);
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

TEST_F(StoreTest, ContiguousPrefixAndGapsFollowOutOfOrderArrival) {
  auto s = Open();
  ASSERT_TRUE(s);
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

TEST_F(StoreTest, StaleEpochsAreRefusedAcrossRestarts) {
  auto s = Open();
  ASSERT_TRUE(s);
  Apply(*s, {Progress(0, 9, /*epoch=*/5)});
  std::vector<ApplyResult> r = Apply(*s, {Progress(10, 19, 4), Progress(10, 19, 6)});
  EXPECT_EQ(r[0].kind, ApplyResult::kStale);
  EXPECT_EQ(r[0].stream_epoch, 5u);
  EXPECT_EQ(r[1].kind, ApplyResult::kStored);
  EXPECT_EQ(r[1].stream_epoch, 6u);
  s.reset();
  s = Open();
  r = Apply(*s, {Progress(20, 29, 5), Progress(0, 0, 1, "cam1")});  // fencing is per (edge, stream)
  EXPECT_EQ(r[0].kind, ApplyResult::kStale);
  EXPECT_EQ(r[0].stream_epoch, 6u);
  EXPECT_EQ(r[1].kind, ApplyResult::kStored);
  StatusOr<StoreStats> st = s->Stats();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->streams.size(), 2u);
  EXPECT_EQ(st->streams[0].stale_rejected, 2u);
  EXPECT_EQ(st->streams[0].frames, 20u);
  EXPECT_EQ(st->streams[0].epoch, 6u);
  ASSERT_EQ(st->edges.size(), 1u);
  EXPECT_EQ(st->edges[0].streams, 2u);
  EXPECT_EQ(st->edges[0].frames, 21u);
  EXPECT_EQ(st->edges[0].stale_rejected, 2u);
}

TEST_F(StoreTest, EventsQueryFiltersAndReturnsDetections) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->RecordHello("edge-1", 1, 500).ok());
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
  EXPECT_EQ(e.detections[0], (transport::ReportDetection{0, 0.91f, 10.5f, 20, 110, 220, "person"}));
  EXPECT_EQ(e.detections[1].label, "dog");

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

  StatusOr<StoreStats> st = s->Stats();
  ASSERT_EQ(st->edges.size(), 1u);
  EXPECT_EQ(st->edges[0].first_seen_ns, 500);
  EXPECT_EQ(st->edges[0].events, 4u);
}

TEST_F(StoreTest, LastSeenFollowsHellosAndCommittedBatches) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->RecordHello("edge-1", 1, 500).ok());
  ASSERT_TRUE(s->RecordHello("edge-2", 1, 600).ok());
  auto seen = [&](size_t i) { return std::make_pair(s->Stats()->edges[i].first_seen_ns, s->Stats()->edges[i].last_seen_ns); };
  EXPECT_EQ(seen(0), std::make_pair(int64_t{500}, int64_t{500}));
  Report a = Progress(0, 4), b = Progress(5, 9);
  ASSERT_TRUE(s->Apply({&a, &b}, 2000).ok());  // edge-1 only: edge-2 stays where its Hello put it
  EXPECT_EQ(seen(0), std::make_pair(int64_t{500}, int64_t{2000}));
  EXPECT_EQ(seen(1), std::make_pair(int64_t{600}, int64_t{600}));
  Report c = Progress(0, 0, 1, "cam9");
  c.edge = "edge-2";
  Report dup = Progress(0, 4);  // a re-send is still a sign of life
  ASSERT_TRUE(s->Apply({&c, &dup}, 3000).ok());
  EXPECT_EQ(seen(0).second, 3000);
  EXPECT_EQ(seen(1).second, 3000);
  EXPECT_EQ(Query("SELECT last_seen_ns FROM edges WHERE edge = 'edge-2'"), 3000);
  Report stale = Progress(10, 10, /*epoch=*/0);
  ASSERT_TRUE(s->Apply({&stale}, 4000).ok());
  EXPECT_EQ(seen(0).second, 4000);
  // A report from an edge without a Hello creates no edge row.
  Report stranger = Progress(0, 0);
  stranger.edge = "edge-3";
  ASSERT_TRUE(s->Apply({&stranger}, 5000).ok());
  EXPECT_EQ(s->Stats()->edges.size(), 3u);  // edge-3 appears through its stream, with no Hello times
  EXPECT_EQ(s->Stats()->edges[2].last_seen_ns, 0);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM edges"), 2);
}

}  // namespace
}  // namespace vigil::aggregator
