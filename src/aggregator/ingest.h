// aggregator/ingest.h — the aggregator's sessions and ingest (internal to src/aggregator): the receivers' handler
// (Hellos, reports, snapshots, source states, closes), the one queue to storage, and what the storage thread does
// with it, as aggregator/aggregator.h describes:
//  - a Hello is decided by Store::Admit in a transaction of its own before any answer: refused (Reject kFenced with
//    the current epoch; kProtocolError for an epoch no grant can follow) or granted/re-admitted — first
//    superseding the same epoch's other sessions and telling every older epoch's session that it is fenced, then
//    the Welcome (Session::Admit). A Hello whose grant fails closes its connection.
//  - the reports up to the next Hello go into one Store::Apply transaction (with confirmation's verdicts and
//    decisions, through ConfirmHook); only after the commit is each one answered, Ack or Reject(kStaleEpoch), in one
//    frame batch per session. A failed transaction closes the batch's connections (their edges re-send).
//  - snapshots wait in a queue of their own (at most snapshot_queue_mb MiB; a picture that finds it full is
//    dropped and counted) and are stored between report batches, 256 pictures or 8 MiB at a time.
// It counts all of it in the registry (vigil_aggregator_{reports,hellos,evicted_sessions,snapshots,...}).
//
// Ownership: the aggregator owns the Ingest; it owns the queues and the session table, not the sessions (shared
// with the receivers) and not the storage thread: the aggregator's storage loop calls WaitForWork,
// ProcessSnapshots and ProcessNext. Threads: the receivers' connection threads call the ReceiverHandler methods
// (OnReport blocks while the queue holds queue_max items: backpressure); HTTP workers call the IngestView methods;
// the storage thread the rest; the controlling thread Close.
// Thread-safety: one mutex guards the queues, the session table and what /healthz and /api/stats read; the
// storage-thread-only state (stream metrics, current epochs, warned classes) is not locked.
// Errors: storage failures are logged, counted (vigil_aggregator_storage_errors_total) and kept for /healthz until
// the next successful transaction; nothing is thrown.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "aggregator/http_api.h"
#include "aggregator/live_feed.h"
#include "vigil/aggregator/confirm.h"
#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/metrics/registry.h"
#include "vigil/transport/receiver.h"

namespace vigil::aggregator {

// What confirmation puts into one report batch's transaction.
struct BatchConfirmation {
  std::vector<EventVerdict> verdicts;  // PendingReport::verdict points into it (reserved: never reallocated)
  std::vector<EventDecision> decisions;                   // on earlier events, stored with the batch
  std::vector<std::pair<EventDecision, size_t>> handoff;  // to the second model once committed (with box counts)
  std::vector<int64_t> marked;                            // tracks first confirmed by this batch
};

// Confirmation's part in a report batch (the aggregator's confirmation wiring implements it). Storage thread.
class ConfirmHook {
 public:
  virtual ~ConfirmHook() = default;
  // Before the transaction: `observed[i]` is `reports[i]` (with whether its epoch is its edge's current one);
  // sets reports[i].verdict and fills `plan`.
  virtual void Observe(const std::vector<ObservedReport>& observed, std::vector<PendingReport>& reports,
                       BatchConfirmation& plan) = 0;
  // After the commit (results[i] answers reports[i]; `decided` the plan's decisions) at wall time now_ns.
  virtual void Committed(BatchConfirmation& plan, const std::vector<PendingReport>& reports,
                         const std::vector<ApplyResult>& results, const DecisionResult& decided, int64_t now_ns) = 0;
  // After a failed transaction: nothing of `plan` was stored.
  virtual void RolledBack(BatchConfirmation& plan) = 0;
};

struct IngestOptions {
  Store* store = nullptr;                 // required; not owned
  metrics::Registry* registry = nullptr;  // required; not owned
  LiveFeed* live = nullptr;               // required; told when a commit stored an event; not owned
  ConfirmHook* confirm = nullptr;         // null: confirmation off (events stored confirmed); not owned
  std::function<void()> wake_push;        // a commit queued pushes. Default: nothing
  std::vector<PushRoute> push_routes;     // a route class an edge's model lacks is warned about once
  int queue_max = 16384;                  // Hellos and reports waiting for storage (OnReport blocks beyond)
  int batch_max = 512;                    // reports per transaction
  int snapshot_queue_mb = 64;             // pictures waiting for storage, MiB
  Clock* clock = SystemClock();           // wall ns for what is stored, steady ns for durations and waits
  int64_t failure_pause_ns = 100'000'000;  // after a failed transaction: no hot loop against a failing disk
  // How answers leave: frames queued on a session. Default: Session::Enqueue (a full queue closes the session).
  std::function<void(transport::Session&, std::string frames)> send;
};

class Ingest final : public transport::ReceiverHandler, public IngestView {
 public:
  explicit Ingest(IngestOptions options);

  // ---- ReceiverHandler (connection threads) ----
  Status OnHello(const std::shared_ptr<transport::Session>& s) override VIGIL_EXCLUDES(mu_);
  void OnReport(const std::shared_ptr<transport::Session>& s, transport::Report r) override VIGIL_EXCLUDES(mu_);
  void OnSnapshot(const std::shared_ptr<transport::Session>& s, transport::Snapshot snap) override
      VIGIL_EXCLUDES(mu_);
  void OnSourceStates(const std::shared_ptr<transport::Session>& s, transport::SourceStates states) override
      VIGIL_EXCLUDES(mu_);
  void OnClose(const std::shared_ptr<transport::Session>& s, const Status& why) override VIGIL_EXCLUDES(mu_);

  // ---- IngestView (HTTP workers) ----
  IngestHealth Health() const override VIGIL_EXCLUDES(mu_);
  IngestEdges Edges() const override VIGIL_EXCLUDES(mu_);

  // ---- the storage thread ----
  // Waits until something is queued, *also is true, Close ran, or the steady clock reaches wake_steady_ns
  // (INT64_MAX: no deadline). false: storage must end now (Close: the queue is empty, or crash) — the pictures
  // still queued are dropped and counted.
  bool WaitForWork(int64_t wake_steady_ns, const std::atomic<bool>* also) VIGIL_EXCLUDES(mu_);
  // Stores the queued pictures (one transaction; at most 256 pictures or 8 MiB).
  void ProcessSnapshots() VIGIL_EXCLUDES(mu_);
  // Takes a Hello alone, or the reports up to the next Hello (at most batch_max), and processes them.
  void ProcessNext() VIGIL_EXCLUDES(mu_);
  // A transaction of another part failed / succeeded: /healthz says so.
  void StorageFailed(const Status& st) VIGIL_EXCLUDES(mu_);
  void StorageHealthy() VIGIL_EXCLUDES(mu_);
  // Wakes the storage thread (the second model has decisions).
  void WakeStorage() VIGIL_EXCLUDES(mu_);

  // ---- the controlling thread ----
  // Reports arriving from now on are dropped unacked; storage ends once the queue is empty (crash: at once).
  void Close(bool crash) VIGIL_EXCLUDES(mu_);

 private:
  struct Item {
    std::shared_ptr<transport::Session> session;
    std::optional<transport::Report> report;  // nullopt: the session's Hello, to be granted or refused
  };
  struct PendingPicture {
    std::shared_ptr<transport::Session> session;
    transport::Snapshot snapshot;
  };
  struct StreamMetrics {
    metrics::Counter *frames, *events, *dropped, *lost, *duplicates, *stale;
    metrics::Histogram* frame_to_stored;
  };
  void ProcessHello(const std::shared_ptr<transport::Session>& s) VIGIL_EXCLUDES(mu_);
  void ProcessReports(std::vector<Item>& batch) VIGIL_EXCLUDES(mu_);
  StreamMetrics& MetricsFor(const transport::Report& r);
  metrics::Counter& Snapshots(const char* result);
  void Pause() const;

  const IngestOptions o_;
  metrics::Registry& registry_;

  mutable Mutex mu_;
  CondVar not_empty_, not_full_;
  std::deque<Item> queue_ VIGIL_GUARDED_BY(mu_);
  std::deque<PendingPicture> snapshot_queue_ VIGIL_GUARDED_BY(mu_);  // waiting for storage, apart from the reports
  size_t snapshot_queue_bytes_ VIGIL_GUARDED_BY(mu_) = 0;             // their JPEG bytes
  bool closing_ VIGIL_GUARDED_BY(mu_) = false;       // reports arriving now are dropped unacked
  bool stop_storage_ VIGIL_GUARDED_BY(mu_) = false;  // storage exits once the queue is empty
  bool drop_queue_ VIGIL_GUARDED_BY(mu_) = false;    // storage exits at once (Kill)
  std::string storage_error_ VIGIL_GUARDED_BY(mu_);  // the last failed transaction; "" when healthy
  // Open sessions past their Hello (admitted or not yet), by edge id: the storage thread evicts the older ones
  // when it grants a newer epoch.
  std::multimap<std::string, std::shared_ptr<transport::Session>> sessions_ VIGIL_GUARDED_BY(mu_);
  // Per edge id, its latest grant since this aggregator started, and when (wall ns): "new" (the first instance of
  // the id), "replaced" (a new instance after a granted epoch: a restart or a standby's takeover), "promote" (a
  // Hello with kHelloPromote) or "readmitted" (the same instance, a new session).
  std::map<std::string, std::pair<std::string, int64_t>> last_grant_ VIGIL_GUARDED_BY(mu_);
  // Per (edge, stream), what its source was doing at the edge's latest SourceStates.
  std::map<std::pair<std::string, std::string>, transport::SourceState> source_states_ VIGIL_GUARDED_BY(mu_);

  // Storage thread only.
  std::map<std::pair<std::string, std::string>, StreamMetrics> stream_metrics_;
  std::map<std::string, uint64_t> current_epochs_;  // edge → the epoch granted last (confirmation feeds only those)
  std::set<std::string> warned_classes_;            // push routes' classes an edge's model lacks, said once

  metrics::Counter& stored_reports_;
  metrics::Counter& duplicate_reports_;
  metrics::Counter& stale_reports_;
  metrics::Counter& superseded_reports_;
  metrics::Counter& hellos_granted_;
  metrics::Counter& hellos_readmitted_;
  metrics::Counter& hellos_fenced_;
  metrics::Counter& evicted_sessions_;
  metrics::Histogram& commit_seconds_;
  metrics::Counter& storage_errors_;
  metrics::Gauge& queue_depth_;
  metrics::Counter& snapshots_stored_;
  metrics::Counter& snapshots_duplicate_;
  metrics::Counter& snapshots_queue_full_;
  metrics::Counter& snapshots_superseded_;
  metrics::Counter& snapshots_stopping_;
  metrics::Counter& snapshots_failed_;
  metrics::Counter& snapshot_bytes_;
  metrics::Gauge& edges_connected_;
};

}  // namespace vigil::aggregator
