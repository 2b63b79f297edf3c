// vigil/aggregator/store.h — the aggregator's SQLite storage: edges, streams, runs, frames, events,
// detections.
//
// Accounting: every frame a stream reports is one row in `frames`, keyed (stream, run, seq) — the
// PRIMARY KEY is what makes a re-sent frame count once (INSERT OR IGNORE), so "every seq 0..N-1 of a
// run is accounted exactly once" is a property of the table, and the first report of a frame wins
// (a frame stored as progress stays progress if an edge later re-sends it as an event). Events and
// their detections are stored only with a newly inserted frame row.
// Fencing: a stream's `epoch` is the newest report epoch seen for (edge, stream); a report with an
// older epoch is refused (kStale) and counted. It survives restarts (it is a column).
// Durability: WAL journal; synchronous=NORMAL by default (a committed transaction survives a process
// crash — SIGKILL — but the last ones may roll back on power loss or an OS crash; choose FULL for
// that). Apply() commits before it returns, so acknowledging after it is "durable before ack".
// Schema: versioned with PRAGMA user_version; Open() applies the missing migrations in order and
// refuses a database newer than this code (kSchemaVersion).
// Integers: SQLite stores signed 64-bit; run and epoch (uint64) are stored as their bit pattern and
// read back unchanged; seq must stay below 2^63.
//
// Thread-safety: Apply and RecordHello from one writer thread; Events and GetStats from any thread
// (a separate read connection, serialized by a mutex; WAL lets it read while the writer writes).
// Errors: Internal / Unavailable with SQLite's message and the statement's purpose.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/transport/protocol.h"

namespace vigil::aggregator {

struct StoreOptions {
  bool synchronous_full = false;  // PRAGMA synchronous=FULL instead of NORMAL. Default: false
};

// What happened to one report of an Apply batch.
struct ApplyResult {
  enum Kind { kStored, kDuplicate, kStale };
  Kind kind = kStored;              // kStored: at least one frame was new
  uint64_t new_frames = 0;          // frames inserted
  uint64_t duplicate_frames = 0;    // frames already stored (ignored)
  bool event_stored = false;        // an event row (with detections) was inserted
  int64_t contiguous_through = -1;  // highest S with all of 0..S stored for (edge, stream, run); -1 none
  uint64_t stream_epoch = 0;        // newest epoch of (edge, stream) after this report
};

struct EventQuery {
  int64_t since_id = 0;  // events with id > since_id (the aggregator's event sequence)
  int64_t since_ns = std::numeric_limits<int64_t>::min();  // and capture_ns >= since_ns
  std::string edge, stream;                                // "" = any
  int limit = 100;                                         // REQUIRES: > 0
};

struct StoredEvent {
  int64_t id = 0;  // ascending in storage order
  std::string edge, stream;
  uint64_t run = 0, seq = 0, epoch = 0;
  int64_t capture_ns = 0, pts_ns = 0, publish_ns = 0, stored_ns = 0;
  std::string severity, rule;
  uint32_t width = 0, height = 0;
  std::vector<transport::ReportDetection> detections;
};

struct SeqRange {
  uint64_t first = 0, last = 0;  // inclusive
  bool operator==(const SeqRange&) const = default;
};

struct RunStats {
  uint64_t run = 0;
  uint64_t frames = 0, events = 0;  // distinct frames stored, events stored
  int64_t contiguous_through = -1;
  uint64_t last_seq = 0;       // highest stored seq
  std::vector<SeqRange> gaps;  // missing seqs below last_seq, ascending (at most max_gaps)
  uint64_t missing = 0;        // all missing seqs below last_seq (also those beyond max_gaps)
};

struct StreamStats {
  std::string edge, stream;
  uint64_t epoch = 0;
  uint64_t frames = 0, events = 0, duplicates = 0, stale_rejected = 0, missing = 0;
  std::vector<RunStats> runs;  // ascending run
};

struct EdgeStats {
  std::string edge;
  uint64_t epoch = 0;  // from its latest Hello
  int64_t first_seen_ns = 0;  // its first Hello, ns since the Unix epoch (the now_ns given to the Store)
  int64_t last_seen_ns = 0;   // its latest Hello or committed report batch (also stale or duplicate reports)
  uint64_t streams = 0, frames = 0, events = 0, duplicates = 0, stale_rejected = 0, missing = 0;  // Σ streams
};

struct StoreStats {
  std::vector<EdgeStats> edges;      // ascending edge id
  std::vector<StreamStats> streams;  // ascending (edge, stream)
};

class Store {
 public:
  static constexpr int kSchemaVersion = 1;

  // Opens (creating if needed) and migrates the database at `path`.
  // Errors: Unavailable (cannot open / not a database), FailedPrecondition (schema newer than ours).
  static StatusOr<std::unique_ptr<Store>> Open(const std::string& path, StoreOptions options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  int schema_version() const { return kSchemaVersion; }
  const std::string& path() const { return path_; }

  // Records that `edge` said Hello with `epoch` (edges table).
  Status RecordHello(const std::string& edge, uint64_t epoch, int64_t now_ns);
  // Stores a batch of validated reports in one transaction, in order; one result per report. Sets the
  // last_seen_ns of each sending edge that has said Hello to now_ns (one UPDATE per distinct edge).
  // On error nothing of the batch is stored.
  StatusOr<std::vector<ApplyResult>> Apply(const std::vector<const transport::Report*>& batch, int64_t now_ns);

  StatusOr<std::vector<StoredEvent>> Events(const EventQuery& query) const;
  StatusOr<StoreStats> Stats(size_t max_gaps_per_run = 100) const;

 private:
  struct Impl;
  Store(std::string path, std::unique_ptr<Impl> impl);
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::aggregator
