// The store's schema description (aggregator/schema.h): the SQL it generates for each engine is the schema the
// engines wrote by hand before it (the literals below, copied from store_sqlite.cc and store_pg.cc as they were at
// schema version 6), a fresh database built from either has the same tables, columns, keys and indexes, and a
// database left at any older version still opens and migrates with its rows kept.
#include "aggregator/schema.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "testing/test_database.h"
#include "vigil/aggregator/store.h"

namespace vigil::aggregator {
namespace {

using schema::Dialect;

// ---- The schema as the engines wrote it by hand (versions 1..6). Never edit: these are the reference. ----

// SQLite (store_sqlite.cc before schema.h): kSqliteWritten[i] took user_version i to i + 1.
constexpr const char* kSqliteWritten[] = {
    R"sql(
CREATE TABLE edges(
  edge TEXT PRIMARY KEY,
  epoch INTEGER NOT NULL,           -- from the edge's latest Hello
  first_seen_ns INTEGER NOT NULL,
  last_seen_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE streams(
  id INTEGER PRIMARY KEY,
  edge TEXT NOT NULL,
  stream TEXT NOT NULL,
  epoch INTEGER NOT NULL,           -- newest report epoch: the fencing token
  duplicates INTEGER NOT NULL DEFAULT 0,
  stale_rejected INTEGER NOT NULL DEFAULT 0,
  UNIQUE(edge, stream)
);
CREATE TABLE runs(
  stream_id INTEGER NOT NULL REFERENCES streams(id),
  run INTEGER NOT NULL,
  frames INTEGER NOT NULL,
  events INTEGER NOT NULL,
  contiguous_through INTEGER NOT NULL,
  first_stored_ns INTEGER NOT NULL,
  last_stored_ns INTEGER NOT NULL,
  PRIMARY KEY(stream_id, run)
) WITHOUT ROWID;
CREATE TABLE frames(
  stream_id INTEGER NOT NULL REFERENCES streams(id),
  run INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  kind INTEGER NOT NULL,            -- 1 event, 2 progress (transport::ReportKind)
  epoch INTEGER NOT NULL,
  stored_ns INTEGER NOT NULL,
  PRIMARY KEY(stream_id, run, seq)
) WITHOUT ROWID;
CREATE TABLE events(
  id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the since_seq cursor of /api/events
  stream_id INTEGER NOT NULL REFERENCES streams(id),
  run INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  capture_ns INTEGER NOT NULL,
  pts_ns INTEGER NOT NULL,
  publish_ns INTEGER NOT NULL,
  stored_ns INTEGER NOT NULL,
  severity TEXT NOT NULL,
  rule TEXT NOT NULL,
  width INTEGER NOT NULL,
  height INTEGER NOT NULL,
  UNIQUE(stream_id, run, seq)
);
CREATE INDEX events_capture ON events(capture_ns);
CREATE TABLE detections(
  event_id INTEGER NOT NULL REFERENCES events(id),
  idx INTEGER NOT NULL,
  class_id INTEGER NOT NULL,
  label TEXT NOT NULL,
  score REAL NOT NULL,
  x1 REAL NOT NULL, y1 REAL NOT NULL, x2 REAL NOT NULL, y2 REAL NOT NULL,  -- source pixels
  PRIMARY KEY(event_id, idx)
) WITHOUT ROWID;
)sql",
    // 2: epochs are granted by the aggregator (edges.epoch is the current granted epoch, set by
    // Store::Admit); frames.kind also takes 3 (dropped) and 4 (lost), counted per run apart from
    // runs.frames (which counts events and progress).
    R"sql(
ALTER TABLE runs ADD COLUMN dropped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE edges ADD COLUMN granted_ns INTEGER NOT NULL DEFAULT 0;  -- when edges.epoch was granted
)sql",
    // 3: the push outbox (aggregator/push.h): one row per (sink, stored event) its route takes, written in the
    // event's transaction, deleted once delivered; given-up rows move to push_dead_letters.
    R"sql(
CREATE TABLE push_outbox(
  id INTEGER PRIMARY KEY,
  sink TEXT NOT NULL,
  event_id INTEGER NOT NULL REFERENCES events(id),
  attempts INTEGER NOT NULL DEFAULT 0,
  next_ns INTEGER NOT NULL,         -- due (wall ns)
  last_error TEXT NOT NULL DEFAULT '',
  UNIQUE(sink, event_id)
);
CREATE INDEX push_outbox_due ON push_outbox(sink, next_ns, event_id);
CREATE TABLE push_dead_letters(
  id INTEGER PRIMARY KEY,
  sink TEXT NOT NULL,
  event_id INTEGER NOT NULL REFERENCES events(id),
  attempts INTEGER NOT NULL,
  last_error TEXT NOT NULL,
  dead_ns INTEGER NOT NULL,
  UNIQUE(sink, event_id)
);
)sql",
    // 4: retention (Store::Prune) counts the events past its age still in an outbox (by stored time) and finds an
    // event's outbox rows and dead letters by its id.
    R"sql(
CREATE INDEX events_stored ON events(stored_ns);
CREATE INDEX push_outbox_event ON push_outbox(event_id);
CREATE INDEX push_dead_letters_event ON push_dead_letters(event_id);
)sql",
    // 5: snapshots (an event's pictures), keyed like the frame they show, stored before or after their event.
    R"sql(
CREATE TABLE snapshots(
  edge TEXT NOT NULL,
  stream TEXT NOT NULL,
  run INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  box INTEGER NOT NULL,             -- -1: the whole frame; else the event's detection index
  x INTEGER NOT NULL, y INTEGER NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL,  -- source region
  out_width INTEGER NOT NULL, out_height INTEGER NOT NULL,
  stored_ns INTEGER NOT NULL,
  jpeg BLOB NOT NULL,
  PRIMARY KEY(edge, stream, run, seq, box)
) WITHOUT ROWID;
CREATE INDEX snapshots_latest ON snapshots(edge, stream, box, stored_ns);
CREATE INDEX snapshots_stored ON snapshots(stored_ns);
)sql",
    // 6: event states (confirmation: store.h, Event states) and detections' track ids; events stored before read as
    // confirmed. The partial index finds the pending events (few) at start.
    R"sql(
ALTER TABLE events ADD COLUMN state TEXT NOT NULL DEFAULT 'confirmed'
  CHECK (state IN ('pending', 'confirmed', 'rejected'));
ALTER TABLE events ADD COLUMN state_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN decided_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE detections ADD COLUMN track_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE detections ADD COLUMN second_label TEXT NOT NULL DEFAULT '';
ALTER TABLE detections ADD COLUMN second_score REAL NOT NULL DEFAULT 0;
CREATE INDEX events_pending ON events(stream_id, run, seq) WHERE state = 'pending';
CREATE INDEX detections_track ON detections(track_id) WHERE track_id > 0;
)sql",
};

// PostgreSQL (store_pg.cc before schema.h): kPostgresWritten[i] took vigil_schema.version i to i + 1.
constexpr const char* kPostgresWritten[] = {
    R"sql(
CREATE TABLE edges(
  edge TEXT PRIMARY KEY,
  epoch BIGINT NOT NULL,
  first_seen_ns BIGINT NOT NULL,
  last_seen_ns BIGINT NOT NULL
);
CREATE TABLE streams(
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  edge TEXT NOT NULL,
  stream TEXT NOT NULL,
  epoch BIGINT NOT NULL,
  duplicates BIGINT NOT NULL DEFAULT 0,
  stale_rejected BIGINT NOT NULL DEFAULT 0,
  UNIQUE(edge, stream)
);
CREATE TABLE runs(
  stream_id BIGINT NOT NULL REFERENCES streams(id),
  run BIGINT NOT NULL,
  frames BIGINT NOT NULL,
  events BIGINT NOT NULL,
  contiguous_through BIGINT NOT NULL,
  first_stored_ns BIGINT NOT NULL,
  last_stored_ns BIGINT NOT NULL,
  PRIMARY KEY(stream_id, run)
);
CREATE TABLE frames(
  stream_id BIGINT NOT NULL REFERENCES streams(id),
  run BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  kind SMALLINT NOT NULL,
  epoch BIGINT NOT NULL,
  stored_ns BIGINT NOT NULL,
  PRIMARY KEY(stream_id, run, seq)
);
CREATE TABLE events(
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  stream_id BIGINT NOT NULL REFERENCES streams(id),
  run BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  epoch BIGINT NOT NULL,
  capture_ns BIGINT NOT NULL,
  pts_ns BIGINT NOT NULL,
  publish_ns BIGINT NOT NULL,
  stored_ns BIGINT NOT NULL,
  severity TEXT NOT NULL,
  rule TEXT NOT NULL,
  width BIGINT NOT NULL,
  height BIGINT NOT NULL,
  UNIQUE(stream_id, run, seq)
);
CREATE INDEX events_capture ON events(capture_ns);
CREATE TABLE detections(
  event_id BIGINT NOT NULL REFERENCES events(id),
  idx INTEGER NOT NULL,
  class_id INTEGER NOT NULL,
  label TEXT NOT NULL,
  score DOUBLE PRECISION NOT NULL,
  x1 DOUBLE PRECISION NOT NULL, y1 DOUBLE PRECISION NOT NULL,
  x2 DOUBLE PRECISION NOT NULL, y2 DOUBLE PRECISION NOT NULL,
  PRIMARY KEY(event_id, idx)
);
)sql",
    R"sql(
ALTER TABLE runs ADD COLUMN dropped BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lost BIGINT NOT NULL DEFAULT 0;
ALTER TABLE edges ADD COLUMN granted_ns BIGINT NOT NULL DEFAULT 0;
)sql",
    R"sql(
CREATE TABLE push_outbox(
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  sink TEXT NOT NULL,
  event_id BIGINT NOT NULL REFERENCES events(id),
  attempts INTEGER NOT NULL DEFAULT 0,
  next_ns BIGINT NOT NULL,
  last_error TEXT NOT NULL DEFAULT '',
  UNIQUE(sink, event_id)
);
CREATE INDEX push_outbox_due ON push_outbox(sink, next_ns, event_id);
CREATE TABLE push_dead_letters(
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  sink TEXT NOT NULL,
  event_id BIGINT NOT NULL REFERENCES events(id),
  attempts INTEGER NOT NULL,
  last_error TEXT NOT NULL,
  dead_ns BIGINT NOT NULL,
  UNIQUE(sink, event_id)
);
)sql",
    R"sql(
CREATE INDEX events_stored ON events(stored_ns);
CREATE INDEX push_outbox_event ON push_outbox(event_id);
CREATE INDEX push_dead_letters_event ON push_dead_letters(event_id);
)sql",
    R"sql(
CREATE TABLE snapshots(
  edge TEXT NOT NULL,
  stream TEXT NOT NULL,
  run BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  box INTEGER NOT NULL,
  x BIGINT NOT NULL, y BIGINT NOT NULL, width BIGINT NOT NULL, height BIGINT NOT NULL,
  out_width BIGINT NOT NULL, out_height BIGINT NOT NULL,
  stored_ns BIGINT NOT NULL,
  jpeg BYTEA NOT NULL,
  PRIMARY KEY(edge, stream, run, seq, box)
);
CREATE INDEX snapshots_latest ON snapshots(edge, stream, box, stored_ns);
CREATE INDEX snapshots_stored ON snapshots(stored_ns);
)sql",
    // 6: as SQLite's.
    R"sql(
ALTER TABLE events ADD COLUMN state TEXT NOT NULL DEFAULT 'confirmed'
  CHECK (state IN ('pending', 'confirmed', 'rejected'));
ALTER TABLE events ADD COLUMN state_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN decided_ns BIGINT NOT NULL DEFAULT 0;
ALTER TABLE detections ADD COLUMN track_id BIGINT NOT NULL DEFAULT 0;
ALTER TABLE detections ADD COLUMN second_label TEXT NOT NULL DEFAULT '';
ALTER TABLE detections ADD COLUMN second_score DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE INDEX events_pending ON events(stream_id, run, seq) WHERE state = 'pending';
CREATE INDEX detections_track ON detections(track_id) WHERE track_id > 0;
)sql",
};

static_assert(std::size(kSqliteWritten) == Store::kSchemaVersion);
static_assert(std::size(kPostgresWritten) == Store::kSchemaVersion);

// The statements of `sql`, each normalized (comments dropped, whitespace runs one space, none inside parentheses or
// before a comma or semicolon), sorted: a migration step's statements on different tables may come in any order.
std::vector<std::string> Statements(const std::string& sql) {
  std::string flat;
  for (size_t i = 0; i < sql.size(); ++i) {
    if (sql.compare(i, 2, "--") == 0) {
      while (i + 1 < sql.size() && sql[i + 1] != '\n') ++i;  // to the end of the line: whitespace, as below
      continue;
    }
    const char c = sql[i];
    const bool space = c == ' ' || c == '\n' || c == '\t';
    if (space) {
      if (!flat.empty() && flat.back() != ' ' && flat.back() != '(') flat += ' ';
      continue;
    }
    if ((c == ')' || c == ',' || c == ';') && !flat.empty() && flat.back() == ' ') flat.pop_back();
    flat += c;
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = flat.find(';', start)) != std::string::npos; start = end + 1) {
    std::string s = flat.substr(start, end - start);
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    if (!s.empty()) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SchemaTest, NormalizesStatements) {
  EXPECT_EQ(Statements("CREATE TABLE t(  -- note\n  a INTEGER ,\n  b TEXT\n) WITHOUT ROWID;\nCREATE INDEX i ON t(a);"),
            (std::vector<std::string>{"CREATE INDEX i ON t(a)", "CREATE TABLE t(a INTEGER, b TEXT) WITHOUT ROWID"}));
}

TEST(SchemaTest, DescriptionIsWellFormed) {
  EXPECT_EQ(schema::LatestVersion(), Store::kSchemaVersion);
  std::set<std::string_view> tables, indexes;
  for (const schema::Table& t : schema::Tables()) {
    SCOPED_TRACE(std::string(t.name));
    EXPECT_TRUE(tables.insert(t.name).second) << "table named twice";
    EXPECT_GE(t.since, 1);
    std::map<std::string_view, int> since;  // column -> its version
    int previous = t.since;
    for (const schema::Column& c : t.columns) {
      EXPECT_TRUE(since.emplace(c.name, c.since).second) << c.name << " named twice";
      EXPECT_GE(c.since, previous) << c.name << ": a column added later comes after the older ones (ALTER appends)";
      previous = c.since;
      const bool key = c.type == schema::ColumnType::kRowId || c.type == schema::ColumnType::kRowIdNeverReused;
      if (key || c.primary_key) {
        EXPECT_EQ(c.since, t.since) << c.name << ": a key column comes with its table";
        EXPECT_TRUE(t.primary_key.empty()) << c.name << ": two primary keys";
      }
      if (c.since > t.since) {
        EXPECT_FALSE(c.default_sql.empty()) << c.name << ": an added NOT NULL column needs a default";
      }
    }
    auto known = [&](const std::vector<std::string_view>& cols, int at) {
      for (std::string_view c : cols) {
        auto it = since.find(c);
        EXPECT_TRUE(it != since.end() && it->second <= at) << c << " is not a column of " << t.name << " at " << at;
      }
    };
    known(t.primary_key, t.since);
    for (const auto& u : t.unique) known(u, t.since);
    for (const schema::Index& ix : t.indexes) {
      EXPECT_TRUE(indexes.insert(ix.name).second) << ix.name << " named twice";
      EXPECT_GE(ix.since, t.since) << ix.name;
      known(ix.columns, ix.since);
    }
  }
}

TEST(SchemaTest, SqliteStepsAreTheWrittenOnes) {
  for (int v = 0; v < Store::kSchemaVersion; ++v) {
    SCOPED_TRACE("step " + std::to_string(v) + " -> " + std::to_string(v + 1));
    EXPECT_EQ(Statements(schema::MigrationSql(Dialect::kSqlite, v)), Statements(kSqliteWritten[v]));
  }
}

TEST(SchemaTest, PostgresStepsAreTheWrittenOnes) {
  for (int v = 0; v < Store::kSchemaVersion; ++v) {
    SCOPED_TRACE("step " + std::to_string(v) + " -> " + std::to_string(v + 1));
    EXPECT_EQ(Statements(schema::MigrationSql(Dialect::kPostgres, v)), Statements(kPostgresWritten[v]));
  }
}

TEST(SchemaTest, ColumnSqlPerDialect) {
  const schema::Column id{.name = "id", .type = schema::ColumnType::kRowIdNeverReused};
  EXPECT_EQ(schema::ColumnSql(Dialect::kSqlite, id), "id INTEGER PRIMARY KEY AUTOINCREMENT");
  EXPECT_EQ(schema::ColumnSql(Dialect::kPostgres, id), "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY");
  const schema::Column score{.name = "s", .type = schema::ColumnType::kReal, .since = 6, .default_sql = "0"};
  EXPECT_EQ(schema::ColumnSql(Dialect::kSqlite, score), "s REAL NOT NULL DEFAULT 0");
  EXPECT_EQ(schema::ColumnSql(Dialect::kPostgres, score), "s DOUBLE PRECISION NOT NULL DEFAULT 0");
  const schema::Column kind{.name = "kind", .type = schema::ColumnType::kSmallInt, .references = "t(id)"};
  EXPECT_EQ(schema::ColumnSql(Dialect::kSqlite, kind), "kind INTEGER NOT NULL REFERENCES t(id)");
  EXPECT_EQ(schema::ColumnSql(Dialect::kPostgres, kind), "kind SMALLINT NOT NULL REFERENCES t(id)");
}

// ---- SQLite: the structure a database has, read back through the engine's pragmas ----

struct Sqlite {
  sqlite3* db = nullptr;
  explicit Sqlite(const std::string& path) { EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK); }
  ~Sqlite() { sqlite3_close(db); }
  bool Exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "") << "\n" << sql;
    sqlite3_free(err);
    return rc == SQLITE_OK;
  }
  // Every row of `sql`, its columns joined with '|'.
  std::vector<std::string> Rows(const std::string& sql) {
    std::vector<std::string> out;
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db) << ": " << sql;
    while (s != nullptr && sqlite3_step(s) == SQLITE_ROW) {
      std::string row;
      for (int i = 0; i < sqlite3_column_count(s); ++i) {
        const unsigned char* t = sqlite3_column_text(s, i);
        row += (i ? "|" : "") + (t ? std::string(reinterpret_cast<const char*>(t)) : std::string("NULL"));
      }
      out.push_back(row);
    }
    sqlite3_finalize(s);
    return out;
  }
  // Tables (their SQL normalized, columns, foreign keys) and indexes (columns, uniqueness, origin, partial), sorted.
  std::vector<std::string> Structure() {
    std::vector<std::string> out;
    for (const std::string& row : Rows("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")) {
      const size_t a = row.find('|'), b = row.find('|', a + 1), c = row.find('|', b + 1);
      const std::string type = row.substr(0, a), name = row.substr(a + 1, b - a - 1);
      std::string sql;
      for (const std::string& s : Statements(row.substr(c + 1) + ";")) sql += s;
      out.push_back(type + " " + name + ": " + sql);
      if (type == "table") {
        for (const std::string& r : Rows("PRAGMA table_xinfo(" + name + ")")) out.push_back(name + " column " + r);
        for (const std::string& r : Rows("PRAGMA foreign_key_list(" + name + ")")) out.push_back(name + " fk " + r);
        for (const std::string& r : Rows("PRAGMA index_list(" + name + ")")) {
          const std::string ix = r.substr(r.find('|') + 1, r.find('|', r.find('|') + 1) - r.find('|') - 1);
          out.push_back(name + " index " + r.substr(r.find('|') + 1));  // without its position in the list
          for (const std::string& k : Rows("PRAGMA index_xinfo(" + ix + ")")) out.push_back(ix + " key " + k);
        }
      }
    }
    return out;
  }
};

class SchemaSqliteTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(db_.Create(testing::Engine::kSqlite)); }
  std::string File(const std::string& name) const { return (db_.dir() / name).string(); }
  testing::TestDatabase db_;
};

// At every version, a fresh database built from the generated steps has the structure of one built from the
// written ones.
TEST_F(SchemaSqliteTest, GeneratedDatabaseHasTheWrittenStructure) {
  for (int version = 1; version <= Store::kSchemaVersion; ++version) {
    SCOPED_TRACE("version " + std::to_string(version));
    Sqlite written(File("written" + std::to_string(version) + ".db"));
    Sqlite generated(File("generated" + std::to_string(version) + ".db"));
    for (int v = 0; v < version; ++v) {
      ASSERT_TRUE(written.Exec(kSqliteWritten[v]));
      ASSERT_TRUE(generated.Exec(schema::MigrationSql(Dialect::kSqlite, v)));
    }
    const std::vector<std::string> want = written.Structure();
    EXPECT_GT(want.size(), 20u);
    EXPECT_EQ(generated.Structure(), want);
  }
}

// Rows of a database at `version` (>= 1): an edge, its stream, a run of three frames, an event with a detection,
// and from version 3 an outbox row.
std::string OldRows(int version) {
  std::string sql =
      "INSERT INTO edges(edge, epoch, first_seen_ns, last_seen_ns) VALUES('edge-1', 3, 10, 20);"
      "INSERT INTO streams(id, edge, stream, epoch) VALUES(1, 'edge-1', 'cam0', 3);"
      "INSERT INTO runs(stream_id, run, frames, events, contiguous_through, first_stored_ns, last_stored_ns) "
      "VALUES(1, 7, 3, 1, 2, 10, 20);"
      "INSERT INTO frames(stream_id, run, seq, kind, epoch, stored_ns) VALUES(1, 7, 0, 2, 3, 10), (1, 7, 1, 1, 3, 15),"
      " (1, 7, 2, 2, 3, 20);"
      "INSERT INTO events(id, stream_id, run, seq, epoch, capture_ns, pts_ns, publish_ns, stored_ns, severity, rule, "
      "width, height) VALUES(1, 1, 7, 1, 3, 12, 13, 14, 15, 'critical', 'person', 640, 480);"
      "INSERT INTO detections(event_id, idx, class_id, label, score, x1, y1, x2, y2) "
      "VALUES(1, 0, 0, 'person', 0.5, 1, 2, 3, 4);";
  if (version >= 3) sql += "INSERT INTO push_outbox(sink, event_id, next_ns) VALUES('hook', 1, 0);";
  return sql;
}

// What Store reads of OldRows once migrated: the event (confirmed: stored before event states) and its detection.
void ExpectOldRows(Store& store, int version) {
  StatusOr<std::vector<StoredEvent>> events = store.Events(EventQuery{});
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  const StoredEvent& ev = events->front();
  EXPECT_EQ(ev.edge, "edge-1");
  EXPECT_EQ(ev.stream, "cam0");
  EXPECT_EQ(ev.run, 7u);
  EXPECT_EQ(ev.seq, 1u);
  EXPECT_EQ(ev.capture_ns, 12);
  EXPECT_EQ(ev.state, EventState::kConfirmed);
  EXPECT_EQ(ev.decided_ns, 0);
  ASSERT_EQ(ev.detections.size(), 1u);
  EXPECT_EQ(ev.detections[0].label, "person");
  EXPECT_EQ(ev.detections[0].track_id, 0);
  StatusOr<StoreStats> stats = store.Stats(8);
  ASSERT_TRUE(stats.ok()) << stats.status();
  StatusOr<uint64_t> depth = store.PushDepth("hook");
  ASSERT_TRUE(depth.ok()) << depth.status();
  EXPECT_EQ(*depth, version >= 3 ? 1u : 0u);
}

// A database the old code left at any version opens: the missing steps run, the rows stay, and the structure is a
// fresh database's.
TEST_F(SchemaSqliteTest, OlderDatabasesOpenAndMigrate) {
  Sqlite fresh(File("fresh.db"));
  for (int v = 0; v < Store::kSchemaVersion; ++v) ASSERT_TRUE(fresh.Exec(kSqliteWritten[v]));
  const std::vector<std::string> want = fresh.Structure();
  for (int version = 0; version <= Store::kSchemaVersion; ++version) {
    SCOPED_TRACE("from version " + std::to_string(version));
    const std::string path = File("old" + std::to_string(version) + ".db");
    {
      Sqlite old(path);
      for (int v = 0; v < version; ++v) ASSERT_TRUE(old.Exec(kSqliteWritten[v]));
      if (version >= 1) {
        ASSERT_TRUE(old.Exec(OldRows(version)));
      }
      ASSERT_TRUE(old.Exec("PRAGMA user_version=" + std::to_string(version)));
    }
    {
      StatusOr<std::unique_ptr<Store>> store = Store::Open(path);
      ASSERT_TRUE(store.ok()) << store.status();
      if (version >= 1) ExpectOldRows(**store, version);
    }
    EXPECT_EQ(testing::QuerySqliteInt(path, "PRAGMA user_version"), Store::kSchemaVersion);
    Sqlite migrated(path);
    // The store's own connection settings leave nothing in the schema; WAL leaves no table.
    EXPECT_EQ(migrated.Structure(), want);
  }
}

// ---- PostgreSQL: the catalog of a schema built from the written steps and one from the generated ones ----

#ifdef VIGIL_HAVE_POSTGRES
class SchemaPostgresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!db_.Create(testing::Engine::kPostgres)) {
      if (!IsSkipped()) FAIL() << "no database for this test";
    }
  }
  // Everything the catalog says of the tables and indexes in the test's schema, one line each, sorted; the schema's
  // own name taken out of index definitions.
  std::vector<std::string> Structure() {
    const std::string q =
        "SELECT string_agg(line, E'\\n' ORDER BY line) FROM ("
        " SELECT 'column ' || table_name || ' ' || ordinal_position || ' ' || column_name || ' ' || data_type || ' ' ||"
        "  is_nullable || ' ' || coalesce(column_default, '-') || ' ' || is_identity || ' ' ||"
        "  coalesce(identity_generation, '-') AS line"
        "  FROM information_schema.columns WHERE table_schema = current_schema() AND table_name <> 'vigil_schema'"
        " UNION ALL SELECT 'constraint ' || c.conrelid::regclass::text || ' ' || c.conname || ' ' || c.contype::text ||"
        "  ' ' ||"
        "  pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
        "  WHERE n.nspname = current_schema()"
        " UNION ALL SELECT 'index ' || indexname || ' ' || replace(indexdef, current_schema() || '.', '')"
        "  FROM pg_indexes WHERE schemaname = current_schema()) lines";
    PGconn* c = PQconnectdb(db_.target().c_str());
    PGresult* r = PQexec(c, q.c_str());
    EXPECT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQerrorMessage(c);
    std::string all = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    PQfinish(c);
    std::vector<std::string> out;
    for (size_t start = 0, end; start < all.size(); start = end + 1) {
      end = all.find('\n', start);
      if (end == std::string::npos) end = all.size();
      out.push_back(all.substr(start, end - start));
    }
    return out;
  }
  void DropTables() {
    ASSERT_TRUE(db_.Exec("DROP TABLE IF EXISTS snapshots, push_dead_letters, push_outbox, detections, events, frames, "
                         "runs, streams, edges, vigil_schema CASCADE"));
  }
  testing::TestDatabase db_;
};

// The generated steps build the catalog the written ones built, and a schema the old code left at any version
// opens through Store with its rows and ends with that catalog.
TEST_F(SchemaPostgresTest, GeneratedSchemaHasTheWrittenCatalogAndOlderSchemasMigrate) {
  if (IsSkipped() || HasFailure()) return;
  for (int v = 0; v < Store::kSchemaVersion; ++v) ASSERT_TRUE(db_.Exec(kPostgresWritten[v]));
  const std::vector<std::string> want = Structure();
  EXPECT_GT(want.size(), 60u);
  DropTables();
  for (int v = 0; v < Store::kSchemaVersion; ++v) ASSERT_TRUE(db_.Exec(schema::MigrationSql(Dialect::kPostgres, v)));
  EXPECT_EQ(Structure(), want);
  DropTables();

  for (int version = 0; version <= Store::kSchemaVersion; ++version) {
    SCOPED_TRACE("from version " + std::to_string(version));
    std::string old = "CREATE TABLE vigil_schema(version INTEGER NOT NULL); INSERT INTO vigil_schema VALUES(" +
                      std::to_string(version) + ");";
    for (int v = 0; v < version; ++v) old += kPostgresWritten[v];
    if (version >= 1) old += OldRows(version);
    ASSERT_TRUE(db_.Exec(old));
    {
      StatusOr<std::unique_ptr<Store>> store = Store::Open(db_.target());
      ASSERT_TRUE(store.ok()) << store.status();
      if (version >= 1) ExpectOldRows(**store, version);
    }
    EXPECT_EQ(db_.Query("SELECT version FROM vigil_schema"), Store::kSchemaVersion);
    EXPECT_EQ(Structure(), want);
    DropTables();
  }
}
#endif

}  // namespace
}  // namespace vigil::aggregator
