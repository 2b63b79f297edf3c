// vigil/aggregator/confirm.h — second-stage confirmation at the aggregator (issue 20): every stored event gets a
// state (pending, confirmed, rejected) and a reason, decided by following its objects across the stream's frames.
//
// agg.yaml:
//   confirm:
//     tracker: {high_score, low_score, new_track_score, match_iou, low_match_iou, min_hits, max_lost_s}
//                                                  # tracking.h, TrackerOptions (the defaults there)
//     rules: {k, m, min_duration_s, min_travel_px} # TrackRules for every stream and class. Default: 1 of 1, 0 s, 0 px
//     overrides:                                   # the first that matches a (stream, class) wins over `rules`
//       - {streams: [..], classes: [..], k, m, min_duration_s, min_travel_px}   # a missing list: any
//     idle_s: 5                                    # a stream silent this long ends its tracks (0.1..3600). Default: 5
//     association:                                 # where the trackers' association runs (association.h)
//       device: auto                               # auto | cpu | cuda:N. auto: the GPU results arrive on (the
//                                                  # cuda_ipc listener's device: cuda:N), else the CPU
//       max_streams: 1024                          # device limits (association.h, DeviceAssociatorOptions)
//       max_tracks: 512
//       max_detections: 1024
//     classifier: {model, ...}                     # optional: the second model on the event's crops (classifier.h)
// Without `confirm:` every event is stored confirmed (an empty reason) and nothing is tracked. With `classifier:`
// what the tracker confirms is stored pending and decided by the second model (the aggregator's SecondStage).
//
// How an event is decided. Per stream one Tracker (tracking.h) is fed, in storage order, with the frames the edge
// reported: an event frame with its detections, a progress range as frames without any (the object was not
// reported there), dropped / lost frames not at all (nothing looked at them). Tracks continue across a new run of
// the same stream (an edge restart: frames are counted per stream). Time is the stream's own: the frames'
// presentation timestamps within a run (a file read faster than real time still moves its objects at their speed),
// the capture clock across runs and where a source has no timestamps; it never runs backwards. At its frame:
//   - a detection whose track is confirmed by the tracker (min_hits) and meets the rules of its (stream, class)
//     confirms the event (reason: the track and what it met);
//   - else an event with a tracked detection is pending: it is decided by a later frame — confirmed as soon as one
//     of its tracks is, rejected once all its tracks ended unconfirmed (the reason: what the last one missed);
//   - an event none of whose detections started or continued a track (every score below new_track_score, and no
//     track to continue) is rejected at once.
// A stream that sends nothing for idle_s (the aggregator's clock) ends its tracks, so nothing stays pending for
// ever. Reports of an epoch that is not the edge's current one (a fenced zombie), and re-sent frames at or below
// the highest frame already seen of their run, are not fed (a re-sent event stored for the first time is stored
// confirmed: "not tracked: re-sent after later frames").
//
// Transactions: a batch is Begin → ObserveBatch (or Observe…) → (Store::Apply with the verdicts and TakeDecisions())
// → Commit, or Rollback when the Apply failed (the tracker state returns to Begin's: the edges re-send those reports).
// With an Associator (association.h), ObserveBatch first walks the batch to find every frame each stream's tracker
// will be fed, has the Associator associate them all at once (a GPU: the streams in parallel), then feeds them in
// order with those associations; what it declines, or what fails, is associated on the host. Every verdict,
// decision, track id and reason is the one the host alone gives (the associations are equal bit for bit).
// After an aggregator restart, Resume() is fed the stored events of streams with pending events (the few frames
// before the first pending one too) to rebuild their tracks; their decisions follow as usual.
//
// Thread-safety: one thread (the aggregator's storage thread). Errors: configuration errors are the config
// loader's; Observe never fails (a frame the tracker refuses is stored confirmed, "not tracked: …", logged).
// Ownership: values; the verdicts returned are the caller's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "vigil/aggregator/association.h"
#include "vigil/aggregator/classifier.h"
#include "vigil/aggregator/store.h"
#include "vigil/aggregator/tracking.h"
#include "vigil/transport/protocol.h"

namespace vigil::aggregator {

struct ConfirmRuleOverride {
  std::vector<std::string> streams;  // stream ids; empty = any
  std::vector<std::string> classes;  // labels; empty = any
  TrackRules rules;
};

struct ConfirmConfig {
  bool enabled = false;  // `confirm:` present
  TrackerOptions tracker;
  TrackRules rules;
  std::vector<ConfirmRuleOverride> overrides;
  double idle_s = 5;  // (0.1, 3600]
  std::string association_device = "auto";  // association.device: "auto", "cpu" or "cuda:N"
  DeviceAssociatorOptions association_limits;  // association.max_*: the device's (its `device` is set from the above)
  bool classifier_enabled = false;  // `classifier:` present: the second model (classifier.h) decides what tracks confirm
  ClassifierConfig classifier;
};
// InvalidArgument naming the field (tracker options, rules, override index).
Status ValidateConfirmConfig(const ConfirmConfig& c);

// Counters since construction.
struct ConfirmStats {
  uint64_t frames = 0;          // frames fed to trackers (a progress range counts once)
  uint64_t skipped = 0;         // reports not fed (re-sent below the run's highest frame, older run, stale epoch)
  uint64_t stored_confirmed = 0, stored_pending = 0, stored_rejected = 0;  // verdicts given with events
  uint64_t decided_confirmed = 0, decided_rejected = 0;                   // pending events decided later
  uint64_t pending = 0;         // events pending now
  uint64_t tracks = 0;          // live tracks now
  // Association (with an Associator; work done, rolled-back batches too): frames fed with the Associator's
  // association, frames it declined or whose association failed its check (associated on the host), and batches
  // it failed (associated on the host).
  uint64_t associated = 0, association_fallbacks = 0, association_failures = 0;
};

// One report of a batch for ObserveBatch: `class_names` the edge's (its Hello), `current_epoch` as Observe's.
struct ObservedReport {
  const transport::Report* report = nullptr;
  const std::vector<std::string>* class_names = nullptr;
  bool current_epoch = true;
};

class Confirmer {
 public:
  // REQUIRES: ValidateConfirmConfig(config) is OK and config.enabled. Track ids are given from `first_track_id` on,
  // unique across streams (the aggregator starts past the largest stored: Store::MaxTrackId() + 1). `associator`:
  // where the batches' association runs (null: on this thread, frame by frame); after three failed batches in a row
  // it is dropped (logged) and the host associates from then on.
  explicit Confirmer(ConfirmConfig config, int64_t first_track_id = 1, std::unique_ptr<Associator> associator = nullptr);
  ~Confirmer();

  void Begin();     // starts a batch: what follows can be rolled back
  void Commit();    // the batch was stored
  void Rollback();  // the batch was not stored: the state returns to Begin's, its decisions are dropped

  // One report in storage order. `current_epoch`: whether its epoch is its edge's current one. `now_ns`: the
  // aggregator's clock (steady, ns; for idle_s). Returns the verdict to store with an event report (nullopt for
  // other kinds). Decisions on earlier events gather for TakeDecisions.
  std::optional<EventVerdict> Observe(const transport::Report& report, const std::vector<std::string>* class_names,
                                      bool current_epoch, int64_t now_ns);
  // The reports of a batch, in storage order: what Observe returns for each, in one call (the Associator's unit).
  std::vector<std::optional<EventVerdict>> ObserveBatch(std::span<const ObservedReport> reports, int64_t now_ns);
  // Ends the tracks of streams silent for idle_s at `now_ns` (same clock as Observe); their pending events are
  // decided (TakeDecisions). Call it between batches (inside Begin / Commit like a batch).
  void Expire(int64_t now_ns);
  // The decisions gathered since the last call (oldest first).
  std::vector<EventDecision> TakeDecisions();

  // After a restart: a stored event of a stream, in storage order per stream (the events before the stream's first
  // pending one first). A pending one is registered as pending; decisions follow through TakeDecisions.
  void Resume(const StoredEvent& event, int64_t now_ns);

  ConfirmStats stats() const;
  const ConfirmConfig& config() const { return config_; }
  // Where association runs now: "host" (no Associator, or it was dropped), or the Associator's ("cuda:0").
  std::string association_where() const;

 private:
  struct Stream;
  struct Fed;
  Stream& StreamOf(const std::string& edge, const std::string& stream, int64_t now_ns);
  uint64_t NextFrame(Stream& s, uint64_t frames);
  // Feeds frame number `frame` to the stream's tracker, with `association` when given; false when a given one was
  // refused (the host associated the frame instead).
  bool Feed(Stream& s, const std::string& edge, const std::string& stream, uint64_t run, uint64_t seq, uint64_t frame,
            int64_t time_ns, const std::vector<TrackInput>* detections, const std::vector<std::string>& labels,
            EventVerdict* verdict, bool resumed_pending, const std::vector<int>* association = nullptr);
  void AssociateAndFeed(std::vector<Fed>& fed, std::vector<std::optional<EventVerdict>>& out);
  const TrackRules& RulesFor(const std::string& stream, const std::string& label) const;

  ConfirmConfig config_;
  int window_ = 1;  // the largest m of the rules
  std::unique_ptr<int64_t> next_track_id_;  // every stream's tracker takes its ids here (a stable address)
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Stream>> streams_;
  // Begin's copies of the streams the batch touched (nullptr: the stream did not exist).
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Stream>> saved_;
  bool in_batch_ = false;
  std::vector<EventDecision> decisions_;
  ConfirmStats stats_, saved_stats_;
  uint64_t associated_ = 0, association_fallbacks_ = 0, association_failures_ = 0;  // not rolled back: work done
  std::unique_ptr<Associator> associator_;
  int associator_failures_in_row_ = 0;
  uint64_t next_stream_number_ = 1;  // Stream::number (the Associator's name for it)
};

}  // namespace vigil::aggregator
