// aggregator/confirmation.h — the aggregator's confirmation wiring (internal to src/aggregator): the tracker
// (aggregator/confirm.h's Confirmer, on the CPU or confirm.association's device), the second model
// (aggregator/classifier.h's SecondStage on a thread of its own) and what joins them to storage:
//  - at Start the tracker of every stream with events left pending by the previous run is rebuilt from its stored
//    events, and what that decides at once is stored;
//  - in a report batch (ConfirmHook, called by aggregator/ingest.h on the storage thread) each event gets its
//    verdict and the decisions on earlier events go into the same transaction; tracker confirmations go to the
//    second model instead (stored pending, "awaiting the second model") when it is configured; confirmed events
//    whose track confirmed nothing before are marked new_track (once_per_track sinks);
//  - between batches streams silent for idle_s end their tracks (ExpireTracks) and the second model's decisions
//    are stored (StoreSecondModel), each in a transaction of its own; a failed one rolls the tracker back and is
//    tried again.
// Decisions that decided their event go to the live channel (aggregator/live_feed.h); it counts everything in the
// registry (vigil_aggregator_event_states_total, _events_pending, _tracks, _association_*, _confirm_seconds,
// _second_model_total).
//
// Ownership: the aggregator owns it; it owns the Confirmer, the Classifier, the SecondStage and the classifier
// thread (started by Run, joined by Stop or the destructor). Threads: the storage thread calls everything but
// Stop (the controlling thread); the classifier thread runs SecondStage::Step and wakes storage (wake_storage).
// Thread-safety: not thread-safe apart from that split (one mutex, for the classifier thread's wait).
// Errors: Start fails on an invalid confirm: section, an unloadable second model, a named association device that
// cannot be had, or a store that cannot be read; later storage failures go to storage_failed and are retried.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/ingest.h"
#include "aggregator/live_feed.h"
#include "vigil/aggregator/confirm.h"
#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/metrics/registry.h"

namespace vigil::aggregator {

struct ConfirmationOptions {
  ConfirmConfig config;  // the aggregator's confirm: section (enabled)
  // What confirm.association.device "auto" means here: the cuda:N detection rows arrive on, or "cpu".
  std::string auto_device = "cpu";
  Store* store = nullptr;                 // required; not owned
  LiveFeed* live = nullptr;               // required; not owned
  metrics::Registry* registry = nullptr;  // required; not owned
  Clock* clock = SystemClock();
  std::function<void()> wake_push;               // decisions queued pushes. Required
  std::function<void()> wake_storage;            // the second model has decisions. Required
  std::function<void(const Status&)> storage_failed;  // a transaction of its own failed. Required
};

class Confirmation final : public ConfirmHook {
 public:
  // Validates the config, loads the second model and resumes the pending events (storing what that decides).
  static StatusOr<std::unique_ptr<Confirmation>> Start(ConfirmationOptions options);
  // Starts the second model's thread (if configured): call once wake_storage's target exists. Once.
  void Run();
  ~Confirmation() override;

  // ConfirmHook (storage thread).
  void Observe(const std::vector<ObservedReport>& observed, std::vector<PendingReport>& reports,
               BatchConfirmation& plan) override;
  void Committed(BatchConfirmation& plan, const std::vector<PendingReport>& reports,
                 const std::vector<ApplyResult>& results, const DecisionResult& decided, int64_t now_ns) override;
  void RolledBack(BatchConfirmation& plan) override;

  // Storage thread, between batches.
  void ExpireTracks();
  // Whether the second model has decisions to store (or a failed store to retry), and storing them.
  bool SecondModelPending() const;
  void StoreSecondModel();
  // Set while the second model's decisions wait (the storage loop wakes for it).
  const std::atomic<bool>* second_ready() const;
  // How often ExpireTracks should run: a tenth of idle_s.
  int64_t expire_interval_ns() const;

  // Controlling thread: the classifier thread ends (what it has not decided stays pending). Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Confirmation(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::aggregator
