// The store's schema (schema.h) and the SQL generated from it for each engine.
#include "aggregator/schema.h"

#include <algorithm>

namespace vigil::aggregator::schema {
namespace {

using T = ColumnType;

std::vector<Table> Describe() {
  // Version 1: edges, streams, runs, frames, events, detections. 2: epochs are granted by the aggregator
  // (edges.epoch is the current granted epoch, set by Store::Admit, granted_ns when); frames.kind also takes 3
  // (dropped) and 4 (lost), counted per run apart from runs.frames (which counts events and progress). 3: the push
  // outbox (aggregator/push.h): one row per (sink, stored event) its route takes, written in the event's
  // transaction, deleted once delivered; given-up rows move to push_dead_letters. 4: retention (Store::Prune)
  // counts the events past its age still in an outbox (by stored time) and finds an event's outbox rows and dead
  // letters by its id. 5: snapshots (an event's pictures), keyed like the frame they show, stored before or after
  // their event. 6: event states (confirmation: store.h, Event states) and detections' track ids; events stored
  // before read as confirmed; the partial index finds the pending events (few) at start.
  return {
      {.name = "edges",
       .columns = {{.name = "edge", .type = T::kText, .primary_key = true},
                   {.name = "epoch"},  // the current granted epoch
                   {.name = "first_seen_ns"},
                   {.name = "last_seen_ns"},
                   {.name = "granted_ns", .since = 2, .default_sql = "0"}},  // when edges.epoch was granted
       .without_rowid = true},
      {.name = "streams",
       .columns = {{.name = "id", .type = T::kRowId},
                   {.name = "edge", .type = T::kText},
                   {.name = "stream", .type = T::kText},
                   {.name = "epoch"},  // newest report epoch: the fencing token
                   {.name = "duplicates", .default_sql = "0"},
                   {.name = "stale_rejected", .default_sql = "0"}},
       .unique = {{"edge", "stream"}}},
      {.name = "runs",
       .columns = {{.name = "stream_id", .references = "streams(id)"},
                   {.name = "run"},
                   {.name = "frames"},
                   {.name = "events"},
                   {.name = "contiguous_through"},
                   {.name = "first_stored_ns"},
                   {.name = "last_stored_ns"},
                   {.name = "dropped", .since = 2, .default_sql = "0"},
                   {.name = "lost", .since = 2, .default_sql = "0"}},
       .primary_key = {"stream_id", "run"},
       .without_rowid = true},
      {.name = "frames",
       .columns = {{.name = "stream_id", .references = "streams(id)"},
                   {.name = "run"},
                   {.name = "seq"},
                   // transport::ReportKind: 1 event, 2 progress, 3 dropped, 4 lost
                   {.name = "kind", .type = T::kSmallInt},
                   {.name = "epoch"},
                   {.name = "stored_ns"}},
       .primary_key = {"stream_id", "run", "seq"},
       .without_rowid = true},
      {.name = "events",
       .columns = {{.name = "id", .type = T::kRowIdNeverReused},  // never reused: the since_seq cursor of /api/events
                   {.name = "stream_id", .references = "streams(id)"},
                   {.name = "run"},
                   {.name = "seq"},
                   {.name = "epoch"},
                   {.name = "capture_ns"},
                   {.name = "pts_ns"},
                   {.name = "publish_ns"},
                   {.name = "stored_ns"},
                   {.name = "severity", .type = T::kText},
                   {.name = "rule", .type = T::kText},
                   {.name = "width"},
                   {.name = "height"},
                   {.name = "state",
                    .type = T::kText,
                    .since = 6,
                    .default_sql = "'confirmed'",
                    .check = "state IN ('pending', 'confirmed', 'rejected')"},
                   {.name = "state_reason", .type = T::kText, .since = 6, .default_sql = "''"},
                   {.name = "decided_ns", .since = 6, .default_sql = "0"}},
       .unique = {{"stream_id", "run", "seq"}},
       .indexes = {{.name = "events_capture", .columns = {"capture_ns"}},
                   {.name = "events_stored", .columns = {"stored_ns"}, .since = 4},
                   {.name = "events_pending",
                    .columns = {"stream_id", "run", "seq"},
                    .since = 6,
                    .where = "state = 'pending'"}}},
      {.name = "detections",
       .columns = {{.name = "event_id", .references = "events(id)"},
                   {.name = "idx", .type = T::kInt},
                   {.name = "class_id", .type = T::kInt},
                   {.name = "label", .type = T::kText},
                   {.name = "score", .type = T::kReal},
                   {.name = "x1", .type = T::kReal},  // x1, y1, x2, y2: source pixels
                   {.name = "y1", .type = T::kReal},
                   {.name = "x2", .type = T::kReal},
                   {.name = "y2", .type = T::kReal},
                   {.name = "track_id", .since = 6, .default_sql = "0"},
                   {.name = "second_label", .type = T::kText, .since = 6, .default_sql = "''"},
                   {.name = "second_score", .type = T::kReal, .since = 6, .default_sql = "0"}},
       .primary_key = {"event_id", "idx"},
       .indexes = {{.name = "detections_track", .columns = {"track_id"}, .since = 6, .where = "track_id > 0"}},
       .without_rowid = true},
      {.name = "push_outbox",
       .since = 3,
       .columns = {{.name = "id", .type = T::kRowId, .since = 3},
                   {.name = "sink", .type = T::kText, .since = 3},
                   {.name = "event_id", .since = 3, .references = "events(id)"},
                   {.name = "attempts", .type = T::kInt, .since = 3, .default_sql = "0"},
                   {.name = "next_ns", .since = 3},  // due (wall ns)
                   {.name = "last_error", .type = T::kText, .since = 3, .default_sql = "''"}},
       .unique = {{"sink", "event_id"}},
       .indexes = {{.name = "push_outbox_due", .columns = {"sink", "next_ns", "event_id"}, .since = 3},
                   {.name = "push_outbox_event", .columns = {"event_id"}, .since = 4}}},
      {.name = "push_dead_letters",
       .since = 3,
       .columns = {{.name = "id", .type = T::kRowId, .since = 3},
                   {.name = "sink", .type = T::kText, .since = 3},
                   {.name = "event_id", .since = 3, .references = "events(id)"},
                   {.name = "attempts", .type = T::kInt, .since = 3},
                   {.name = "last_error", .type = T::kText, .since = 3},
                   {.name = "dead_ns", .since = 3}},
       .unique = {{"sink", "event_id"}},
       .indexes = {{.name = "push_dead_letters_event", .columns = {"event_id"}, .since = 4}}},
      {.name = "snapshots",
       .since = 5,
       .columns = {{.name = "edge", .type = T::kText, .since = 5},
                   {.name = "stream", .type = T::kText, .since = 5},
                   {.name = "run", .since = 5},
                   {.name = "seq", .since = 5},
                   // -1: the whole frame; else the event's detection index
                   {.name = "box", .type = T::kInt, .since = 5},
                   {.name = "x", .since = 5},                     // x, y, width, height: the source region
                   {.name = "y", .since = 5},
                   {.name = "width", .since = 5},
                   {.name = "height", .since = 5},
                   {.name = "out_width", .since = 5},
                   {.name = "out_height", .since = 5},
                   {.name = "stored_ns", .since = 5},
                   {.name = "jpeg", .type = T::kBytes, .since = 5}},
       .primary_key = {"edge", "stream", "run", "seq", "box"},
       .indexes = {{.name = "snapshots_latest", .columns = {"edge", "stream", "box", "stored_ns"}, .since = 5},
                   {.name = "snapshots_stored", .columns = {"stored_ns"}, .since = 5}},
       .without_rowid = true},
  };
}

std::string_view TypeSql(Dialect d, ColumnType t) {
  const bool pg = d == Dialect::kPostgres;
  switch (t) {
    case T::kSmallInt: return pg ? "SMALLINT" : "INTEGER";
    case T::kInt: return "INTEGER";
    case T::kBigInt: return pg ? "BIGINT" : "INTEGER";
    case T::kReal: return pg ? "DOUBLE PRECISION" : "REAL";
    case T::kText: return "TEXT";
    case T::kBytes: return pg ? "BYTEA" : "BLOB";
    case T::kRowId: return pg ? "BIGINT GENERATED BY DEFAULT AS IDENTITY" : "INTEGER";
    case T::kRowIdNeverReused: return pg ? "BIGINT GENERATED BY DEFAULT AS IDENTITY" : "INTEGER";
  }
  return "";
}

std::string Join(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

std::string CreateTableSql(Dialect d, const Table& t) {
  std::vector<std::string> parts;
  for (const Column& c : t.columns) {
    if (c.since == t.since) parts.push_back(ColumnSql(d, c));
  }
  if (!t.primary_key.empty()) parts.push_back("PRIMARY KEY(" + Join(t.primary_key) + ")");
  for (const auto& u : t.unique) parts.push_back("UNIQUE(" + Join(u) + ")");
  std::string out = "CREATE TABLE " + std::string(t.name) + "(\n";
  for (size_t i = 0; i < parts.size(); ++i) out += "  " + parts[i] + (i + 1 < parts.size() ? ",\n" : "\n");
  out += ")";
  if (d == Dialect::kSqlite && t.without_rowid) out += " WITHOUT ROWID";
  return out + ";\n";
}

std::string CreateIndexSql(const Table& t, const Index& ix) {
  std::string out =
      "CREATE INDEX " + std::string(ix.name) + " ON " + std::string(t.name) + "(" + Join(ix.columns) + ")";
  if (!ix.where.empty()) out += " WHERE " + std::string(ix.where);
  return out + ";\n";
}

}  // namespace

const std::vector<Table>& Tables() {
  static const std::vector<Table> tables = Describe();
  return tables;
}

int LatestVersion() {
  int v = 0;
  for (const Table& t : Tables()) {
    v = std::max(v, t.since);
    for (const Column& c : t.columns) v = std::max(v, c.since);
    for (const Index& ix : t.indexes) v = std::max(v, ix.since);
  }
  return v;
}

std::string ColumnSql(Dialect d, const Column& c) {
  std::string out = std::string(c.name) + " " + std::string(TypeSql(d, c.type));
  if (c.type == T::kRowId || c.type == T::kRowIdNeverReused || c.primary_key) {
    out += " PRIMARY KEY";
    if (c.type == T::kRowIdNeverReused && d == Dialect::kSqlite) out += " AUTOINCREMENT";
  } else {
    out += " NOT NULL";
  }
  if (!c.default_sql.empty()) out += " DEFAULT " + std::string(c.default_sql);
  if (!c.check.empty()) out += " CHECK (" + std::string(c.check) + ")";
  if (!c.references.empty()) out += " REFERENCES " + std::string(c.references);
  return out;
}

std::string MigrationSql(Dialect d, int version) {
  const int to = version + 1;
  std::string out;
  for (const Table& t : Tables()) {  // the tables this version creates, each with its indexes of this version
    if (t.since != to) continue;
    out += CreateTableSql(d, t);
    for (const Index& ix : t.indexes) {
      if (ix.since == to) out += CreateIndexSql(t, ix);
    }
  }
  for (const Table& t : Tables()) {  // the columns it adds to older tables
    if (t.since >= to) continue;
    for (const Column& c : t.columns) {
      if (c.since == to) out += "ALTER TABLE " + std::string(t.name) + " ADD COLUMN " + ColumnSql(d, c) + ";\n";
    }
  }
  for (const Table& t : Tables()) {  // then the indexes it adds to older tables (they may cover the new columns)
    if (t.since >= to) continue;
    for (const Index& ix : t.indexes) {
      if (ix.since == to) out += CreateIndexSql(t, ix);
    }
  }
  return out;
}

}  // namespace vigil::aggregator::schema
