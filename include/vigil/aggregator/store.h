// vigil/aggregator/store.h — the aggregator's storage: edges, streams, runs, frames, events, detections,
// the push outbox. Two engines with one schema and one behaviour: SQLite (the default: a file) and
// PostgreSQL (libpq; a postgresql:// URL), chosen by Store::Open's target.
//
// Accounting: every frame a stream reports is one row in `frames`, keyed (stream, run, seq) — the
// PRIMARY KEY is what makes a re-sent frame count once (INSERT OR IGNORE), so "every seq 0..N-1 of a
// run is accounted exactly once" is a property of the table, and the first report of a frame wins
// (a frame stored as progress stays progress if an edge later re-sends it as an event). A frame row's
// kind is its report's (1 event, 2 progress, 3 dropped, 4 lost: transport::ReportKind): dropped and lost
// frames are stored rows like the others, so the contiguous prefix moves over them and they are never
// gaps; they are counted apart (RunStats::dropped / lost) from the processed frames (RunStats::frames).
// Events and their detections are stored only with a newly inserted frame row; a detection's label is
// the admitting Hello's class name for its class id ("class N" when the id is out of range).
// Epochs (fencing tokens): the Store is the authority. Admit() grants an edge id its epochs in a committed
// transaction of its own (edges.epoch is the current granted epoch; it only grows and survives restarts),
// before the aggregator sends the Welcome. Apply() accepts a report only when its epoch is the current
// granted epoch of its edge, checked inside the report's transaction, so a report of an older session
// that commits after a newer grant is refused (kStale) and counted, never stored.
// Durability (SQLite): WAL journal; synchronous=NORMAL by default (a committed transaction survives a process
// crash — SIGKILL — but the last ones may roll back on power loss or an OS crash; choose FULL for
// that). PostgreSQL: the server's synchronous_commit decides (on by default: durable at commit). Apply()
// and Admit() commit before they return, so acknowledging after them is "durable before ack" and a granted
// epoch is never granted twice.
// PostgreSQL: Apply stores a batch in a few set-based statements (unnest arrays) instead of one per row, and
// reads the edges' epochs FOR SHARE inside the batch's transaction while Admit updates them FOR UPDATE, so
// a report is fenced correctly even if two aggregators share the database. Still, one aggregator writes to
// a database at a time (its caches of streams and prefixes are its own); any number may read it. The tables
// live in the connection's search_path schema (libpq's `options=-csearch_path=…` picks one); the schema
// version is the vigil_schema table's. The password never appears in logs or errors: give it in the URL, a
// libpq passfile (PGPASSFILE / `passfile=`) or PGPASSWORD.
// Schema: versioned (SQLite: PRAGMA user_version; PostgreSQL: the vigil_schema table); Open() applies the missing migrations in order and
// refuses a database newer than this code (kSchemaVersion). Version 2 adds per-run dropped/lost counts
// and the time of an edge's current grant; version 3 the push outbox and dead letters (push.h); version 4 the
// indexes retention (Prune) needs; version 5 the snapshots table; version 6 event states (confirmation) and
// detections' track ids.
// Event states (aggregator/confirm.h): an event is stored pending, confirmed or rejected (PendingReport::verdict; no
// verdict: confirmed) with its reason, and its detections with their track ids. A pending event is decided later by an
// EventDecision in a later Apply's transaction; a decided event never changes again (a decision on an event that is
// not pending, or not stored, is skipped and counted). Events stored before version 6 read as confirmed.
// Push routes (PushRoute::on_confirmed) queue an event when it is stored (any state), or only once it is confirmed
// (stored confirmed, or decided so) — in the transaction that stores or decides it.
// Snapshots (an event's pictures, transport::Snapshot): stored once per (edge, stream, run, seq, box), the first
// copy winning, whether or not the event is stored yet (a picture may arrive before its event); deleted with
// their event by retention, and a picture whose event never came is deleted by Prune after kOrphanSnapshotNs.
// Retention (Prune): events older than a maximum age or beyond a maximum count are deleted with their
// detections, oldest first, except those a push sink has not delivered yet; frame rows older than the age
// limit are deleted only at or below their run's contiguous prefix (Apply treats a seq at or below the
// prefix as a duplicate without looking for its row), so accounting and gaps stay exact; runs are kept.
// Integers: both engines store signed 64-bit; run and epoch (uint64) are stored as their bit pattern and
// read back unchanged; seq must stay below 2^63.
//
// Thread-safety: Admit, Apply and Prune from one writer thread (they share the writer connection and its
// caches); Events and Stats from any thread (a separate read connection, serialized by a mutex; WAL
// lets it read while the writer writes).
// Errors: Internal / Unavailable with the engine's message and the statement's purpose; on any error the
// failed transaction is rolled back (nothing of it is stored) and the writer's caches are dropped.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vigil/common/frame_key.h"
#include "vigil/common/status.h"
#include "vigil/transport/protocol.h"

namespace vigil::aggregator {

// Which events a push sink takes (aggregator/push.h): every listed condition must hold (an empty list: any).
struct PushRoute {
  std::string sink;                  // the sink's name (unique)
  std::vector<std::string> edges;    // edge ids
  std::vector<std::string> streams;  // stream ids
  std::vector<std::string> classes;  // labels: the event has a detection of one of them
  std::string min_severity;          // "" (any) / "info" / "warning" / "critical": the event's severity at least this
  bool on_confirmed = false;         // queue the event once it is confirmed (else: when it is stored, any state)
  // With on_confirmed: only the first event each track confirms (EventVerdict / EventDecision new_track): one alert
  // per object followed, not one per frame; an object that never confirms an event never alerts.
  bool once_per_track = false;
};

// Whether `route` takes an event of (edge, stream, severity) with detections labelled `labels`.
bool RouteMatches(const PushRoute& route, const std::string& edge, const std::string& stream,
                  const std::string& severity, const std::vector<std::string>& labels);

struct StoreOptions {
  bool synchronous_full = false;  // SQLite: PRAGMA synchronous=FULL instead of NORMAL. Default: false
  // PostgreSQL: the password, when not in the URL (it overrides one there). Never logged. Default: none (libpq's
  // own: PGPASSWORD, ~/.pgpass)
  std::string password;
  // Push sinks: Apply writes an outbox row for every (sink, stored event) its route takes, in the event's
  // transaction. Default: none.
  std::vector<PushRoute> routes;
};

// The outcome of Store::Admit for one Hello (transport/protocol.h: "Epochs").
struct Grant {
  enum Kind {
    kNew,         // a new epoch was granted (held 0, kHelloPromote, or a held epoch this store never granted)
    kReadmitted,  // held == the current epoch: the session continues it
    kFenced,      // held < the current epoch: a newer instance holds the edge id; nothing was granted
  };
  Kind kind = kNew;
  uint64_t epoch = 0;           // kNew / kReadmitted: the session's epoch (≥ 1); kFenced: the current epoch
  uint64_t previous_epoch = 0;  // the edge's current epoch before this call (0: never granted)
  bool held_unknown = false;    // kNew only: held > previous_epoch, an epoch this store never granted (e.g. a
                                // replaced database); granted max(held, previous) + 1 instead
  // kNew / kReadmitted: one entry per (stream, run) of the Hello, in its order, with what is stored
  // (contiguous_through, highest_seq; -1 when nothing). Empty when kFenced.
  std::vector<transport::WelcomeStream> streams;
};

// An event's state (events.state).
enum class EventState { kPending, kConfirmed, kRejected };
std::string_view ToString(EventState s);  // "pending", "confirmed", "rejected"
// Parses ToString's names. Returns false for anything else.
bool ParseEventState(std::string_view name, EventState* out);

// Confirmation's answer for an event report when it is stored (aggregator/confirm.h).
struct EventVerdict {
  EventState state = EventState::kConfirmed;
  std::string reason;              // why (stored as events.state_reason); may be empty
  std::vector<int64_t> track_ids;  // per detection of the report (same order), 0 = none; empty: none tracked.
                                   // REQUIRES: empty or one per detection
  int64_t confirmed_by = 0;        // confirmed: the track that confirmed it (0: none, e.g. not tracked)
  bool new_track = false;          // confirmed, and the first event its confirming track confirmed (once_per_track)
};

// What the second model said about one detection of an event (confirm.h, classifier).
struct DetectionUpdate {
  int32_t index = 0;          // the detection's index in its event
  std::string label;          // its new label (a relabel); "" = unchanged
  std::string second_label;   // the second model's class
  float second_score = 0;
};

// A later verdict on a stored pending event of (edge, stream, run, seq).
struct EventDecision {
  std::string edge, stream;
  uint64_t run = 0, seq = 0;
  EventState state = EventState::kConfirmed;  // REQUIRES: kConfirmed or kRejected
  std::string reason;
  std::vector<DetectionUpdate> detections;    // applied with the decision (before its push routes are matched)
  std::vector<int64_t> tracks;                // confirmed: the track that confirmed it (the aggregator's new_track)
  bool new_track = false;                     // the first event its confirming track confirmed (once_per_track)
  FrameKey key() const { return {edge, stream, run, seq}; }  // the event's frame
};

// What the decisions given to one Apply did.
struct DecisionResult {
  uint64_t confirmed = 0, rejected = 0;  // pending events decided
  uint64_t skipped = 0;                  // decisions on an event not stored or no longer pending (ignored)
  int pushes_queued = 0;                 // push_outbox rows written for the events confirmed
  std::vector<char> applied;             // per decision (same order): 1 when it decided its event
};

// One report of an Apply batch and the class names of the session that admitted it.
struct PendingReport {
  const transport::Report* report = nullptr;              // REQUIRES: non-null, passes ValidateReport
  const std::vector<std::string>* class_names = nullptr;  // index = class id (the Hello's); null = none
  const EventVerdict* verdict = nullptr;                  // an event's state and track ids; null = confirmed, none
};

// What happened to one report of an Apply batch.
struct ApplyResult {
  enum Kind { kStored, kDuplicate, kStale };
  Kind kind = kStored;              // kStored: at least one frame row was new
  uint64_t new_frames = 0;          // event/progress frame rows inserted
  uint64_t dropped_frames = 0;      // kDropped frame rows inserted
  uint64_t lost_frames = 0;         // kLost frame rows inserted
  uint64_t duplicate_frames = 0;    // frames already stored (ignored)
  bool event_stored = false;        // an event row (with detections) was inserted
  int pushes_queued = 0;            // push_outbox rows written for it (sinks whose route takes it)
  int64_t contiguous_through = -1;  // highest S with all of 0..S stored for (edge, stream, run); -1 none
  uint64_t edge_epoch = 0;          // the edge's current granted epoch (0: none); kStale: what to tell the edge
};

struct EventQuery {
  int64_t since_id = 0;  // events with id > since_id (the aggregator's event sequence)
  int64_t before_id = std::numeric_limits<int64_t>::max();  // and id < before_id
  int64_t since_ns = std::numeric_limits<int64_t>::min();   // and capture_ns >= since_ns
  std::string edge, stream;                                 // "" = any
  std::string label;                                        // "" = any; else: a detection with this label
  std::string severity;                                     // "" = any; else: exactly this severity
  std::string state;                                        // "" = any; else: "pending" / "confirmed" / "rejected"
  bool by_frame = false;      // only the event of frame (run, seq) of the stream(s) named
  uint64_t run = 0, seq = 0;  // with by_frame
  bool newest_first = false;  // order by id descending (the newest `limit`); default ascending
  int limit = 100;            // REQUIRES: > 0
};

// A stored detection: the report's row plus the label resolved from the admitting Hello's class names.
struct StoredDetection {
  int32_t class_id = 0;
  std::string label;  // class name; "class N" when the id was outside the Hello's class names
  float score = 0;
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // source-image pixels
  int64_t track_id = 0;                  // its track at the aggregator (confirm.h); 0 = none
  std::string second_label;              // the aggregator's second model on its crop ("" = not classified)
  float second_score = 0;                // that label's probability
  bool operator==(const StoredDetection&) const = default;
};

struct StoredEvent {
  int64_t id = 0;  // ascending in storage order
  std::string edge, stream;
  uint64_t run = 0, seq = 0, epoch = 0;
  int64_t capture_ns = 0, pts_ns = 0, publish_ns = 0, stored_ns = 0;
  std::string severity, rule;
  uint32_t width = 0, height = 0;
  std::vector<StoredDetection> detections;
  uint32_t snapshots = 0;  // pictures stored for it (Events only; 0 from the push queries)
  EventState state = EventState::kConfirmed;
  std::string state_reason;
  int64_t decided_ns = 0;  // when it was stored confirmed / rejected or decided (wall ns); 0 while pending
  FrameKey key() const { return {edge, stream, run, seq}; }  // the event's frame
};

// One snapshot of a PutSnapshots batch, with the edge id of the session that sent it.
struct PendingSnapshot {
  const std::string* edge = nullptr;                 // REQUIRES: non-null, non-empty
  const transport::Snapshot* snapshot = nullptr;     // REQUIRES: non-null, passes ValidateSnapshot
};

// A stored picture of an event's frame (transport::Snapshot's fields and when it was stored).
struct StoredSnapshot {
  std::string edge, stream;
  uint64_t run = 0, seq = 0;
  int32_t box = -1;  // -1: the whole frame; else the event's detection index it crops
  uint32_t x = 0, y = 0, width = 0, height = 0;  // the source region it shows, source pixels
  uint32_t out_width = 0, out_height = 0;        // the JPEG's size
  int64_t stored_ns = 0;
  std::string jpeg;  // empty when the query did not ask for the bytes
  FrameKey key() const { return {edge, stream, run, seq}; }  // the event's frame it shows
};

struct SeqRange {
  uint64_t first = 0, last = 0;  // inclusive
  bool operator==(const SeqRange&) const = default;
};

struct RunStats {
  uint64_t run = 0;
  uint64_t frames = 0, events = 0;  // distinct processed (event/progress) frames stored, events stored
  uint64_t dropped = 0, lost = 0;   // distinct frames stored as dropped / lost (not in `frames`)
  int64_t contiguous_through = -1;
  uint64_t last_seq = 0;       // highest stored seq (any kind)
  std::vector<SeqRange> gaps;  // seqs below last_seq with no row of any kind, ascending (at most max_gaps)
  uint64_t missing = 0;        // all such seqs (also those beyond max_gaps); dropped/lost are not missing
};

struct StreamStats {
  std::string edge, stream;
  uint64_t epoch = 0;  // epoch of the newest report stored for the stream
  uint64_t frames = 0, events = 0, dropped = 0, lost = 0, duplicates = 0, stale_rejected = 0, missing = 0;
  std::vector<RunStats> runs;  // ascending run
};

struct EdgeStats {
  std::string edge;
  uint64_t epoch = 0;         // the current granted epoch (0: never granted, only seen through stale reports)
  int64_t first_seen_ns = 0;  // its first Hello, ns since the Unix epoch (the now_ns given to the Store)
  int64_t last_seen_ns = 0;   // its latest Hello or committed report batch (also stale or duplicate reports)
  int64_t granted_ns = 0;     // when the current epoch was granted (0: before schema 2)
  uint64_t streams = 0, frames = 0, events = 0, dropped = 0, lost = 0, duplicates = 0, stale_rejected = 0,
           missing = 0;  // Σ streams
};

struct StoreStats {
  std::vector<EdgeStats> edges;      // ascending edge id
  std::vector<StreamStats> streams;  // ascending (edge, stream)
};

// What Store::Prune deletes (aggregator config `retention:`). Zero: no limit of that kind.
struct RetentionPolicy {
  int64_t max_age_ns = 0;   // events and frame rows stored longer ago than this
  uint64_t max_events = 0;  // events beyond this many, the oldest first
  int chunk = 10000;        // rows deleted per transaction (how long the writer is held). REQUIRES: > 0
  bool any() const { return max_age_ns > 0 || max_events > 0; }
};

// What one Store::Prune deleted.
struct RetentionResult {
  uint64_t events = 0;        // events, with their detections
  uint64_t frames = 0;        // frame rows (at or below their run's contiguous prefix)
  uint64_t dead_letters = 0;  // dead letters of deleted events
  uint64_t kept_for_push = 0; // events past the limits kept because a sink still has them in its outbox
  uint64_t snapshots = 0;     // pictures of deleted events, and pictures whose event never came (kOrphanSnapshotNs)
};

// A push_outbox row that is due, with its event.
struct OutboxItem {
  int64_t id = 0;    // the row
  int attempts = 0;  // deliveries tried so far
  StoredEvent event;
};

// A push_dead_letters row, with its event.
struct DeadLetter {
  std::string sink;
  int attempts = 0;
  std::string last_error;
  int64_t dead_ns = 0;  // when it was given up (wall ns)
  StoredEvent event;
};

class StoreBackend;  // store_backend.h: an engine

class Store {
 public:
  static constexpr int kSchemaVersion = 6;
  // A snapshot stored this long (ns) without its event is deleted by Prune: 10 minutes.
  static constexpr int64_t kOrphanSnapshotNs = int64_t{600} * 1'000'000'000;

  // Opens (creating if needed) and migrates the database `target`: a PostgreSQL URL (postgresql://… or
  // postgres://…, libpq's syntax; the database must exist) or else a SQLite file path.
  // Errors: Unavailable (cannot open or connect / not a database), FailedPrecondition (schema newer than
  // ours), Unimplemented (a PostgreSQL URL and this vigil built without libpq).
  static StatusOr<std::unique_ptr<Store>> Open(const std::string& target, StoreOptions options = {});
  // The target without its password ("postgresql://vigil:***@host/db"), as logs and the API show it.
  static std::string Redacted(const std::string& target);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  int schema_version() const { return kSchemaVersion; }
  const std::string& path() const { return path_; }  // the target, Redacted
  const char* engine() const { return engine_; }      // "sqlite" / "postgresql"

  // Decides on the Hello of `edge` holding `held_epoch` (0 = a new instance), in one committed transaction:
  //   held 0 or `promote` → kNew: current + 1 (1 for an edge never seen), stored as the edge's epoch;
  //   held == current     → kReadmitted;
  //   held < current      → kFenced (nothing written);
  //   held > current      → kNew with held_unknown: max(held, current) + 1 (this store never granted held).
  // kNew / kReadmitted set the edge's last_seen_ns (and first_seen_ns for a new edge) to now_ns, and report
  // for each of `streams` what is stored of it. After it returns, Apply refuses reports of any other epoch
  // of `edge`. Errors: as Apply (nothing granted); OutOfRange when no larger epoch fits in 64 bits.
  StatusOr<Grant> Admit(const std::string& edge, uint64_t held_epoch, bool promote,
                        std::span<const transport::HelloStream> streams, int64_t now_ns);
  // Stores a batch of validated reports in one transaction, in order; one result per report. A report
  // whose epoch is not its edge's current granted epoch (or whose edge has none) is kStale: counted on its
  // stream (stale_rejected), nothing else stored. Sets the last_seen_ns of each sending edge that has been
  // admitted to now_ns (one UPDATE per distinct edge). Then, in the same transaction, `decisions` decide pending
  // events (in order; what they did goes to `decided` when non-null). On error nothing of the batch is stored and no
  // decision is applied.
  StatusOr<std::vector<ApplyResult>> Apply(std::span<const PendingReport> batch, int64_t now_ns,
                                           std::span<const EventDecision> decisions = {},
                                           DecisionResult* decided = nullptr);

  StatusOr<std::vector<StoredEvent>> Events(const EventQuery& query) const;

  // Stores a batch of snapshots in one transaction (a picture already stored is kept: the first copy wins);
  // returns how many were new. Writer thread. Errors: as Apply (nothing of the batch stored).
  StatusOr<uint64_t> PutSnapshots(std::span<const PendingSnapshot> batch, int64_t now_ns);
  // The pictures stored for the frame (edge, stream, run, seq), ascending box (-1, the frame, first); with the
  // JPEG bytes when `with_jpeg`. Any thread (the read connection).
  StatusOr<std::vector<StoredSnapshot>> Snapshots(const std::string& edge, const std::string& stream, uint64_t run,
                                                  uint64_t seq, bool with_jpeg) const;
  // The newest whole-frame picture (box -1) stored for (edge, stream), with its bytes; nullopt when none.
  StatusOr<std::optional<StoredSnapshot>> LatestSnapshot(const std::string& edge, const std::string& stream) const;
  StatusOr<StoreStats> Stats(size_t max_gaps_per_run = 100) const;
  // The largest track id stored with a detection (0: none). Any thread.
  StatusOr<int64_t> MaxTrackId() const;
  // Deletes what `policy` no longer keeps (see Retention above), in transactions of at most policy.chunk
  // rows of each table, from the writer thread (between Apply batches). Errors: the store's (what earlier
  // chunks deleted stays deleted).
  StatusOr<RetentionResult> Prune(const RetentionPolicy& policy, int64_t now_ns);

  // The push outbox (aggregator/push.h), on a connection of its own (any thread; serialized by a mutex).
  // Rows of `sink` due at `now_ns` (next_ns ≤ now_ns), by due time then event id, at most `limit`.
  StatusOr<std::vector<OutboxItem>> PushDue(const std::string& sink, int64_t now_ns, int limit) const;
  // When `sink`'s next row falls due (wall ns); nullopt when its outbox is empty.
  StatusOr<std::optional<int64_t>> PushNextDue(const std::string& sink) const;
  StatusOr<uint64_t> PushDepth(const std::string& sink) const;  // rows waiting
  Status PushDelivered(std::span<const int64_t> outbox_ids);    // deletes the rows (one transaction)
  Status PushRetry(int64_t outbox_id, int attempts, int64_t next_ns, const std::string& error);
  // Moves the row to push_dead_letters (one transaction).
  Status PushDead(int64_t outbox_id, int attempts, const std::string& error, int64_t now_ns);
  // Dead letters of `sink` ("" = every sink), newest first, at most `limit`.
  StatusOr<std::vector<DeadLetter>> DeadLetters(const std::string& sink, int limit) const;
  // Puts the dead letters of `sink` back into its outbox (attempts 0, due at now_ns) and removes them from the dead
  // letters, in one transaction: after the sink was fixed. Returns how many. Errors: the store's (nothing moved).
  StatusOr<uint64_t> ReplayDeadLetters(const std::string& sink, int64_t now_ns);

 private:
  Store(std::string path, const char* engine, std::unique_ptr<StoreBackend> backend);
  std::string path_;
  const char* engine_;
  std::unique_ptr<StoreBackend> backend_;
};

}  // namespace vigil::aggregator
