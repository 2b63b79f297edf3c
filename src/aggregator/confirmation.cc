#include "aggregator/confirmation.h"

#include "aggregator/config.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "vigil/aggregator/association.h"
#include "vigil/aggregator/classifier.h"
#include "vigil/common/deadline.h"
#include "vigil/common/mutex.h"

namespace vigil::aggregator {

struct Confirmation::Impl {
  explicit Impl(ConfirmationOptions o)
      : cfg(std::move(o.config)),
        auto_device(std::move(o.auto_device)),
        store(o.store),
        live(o.live),
        registry(*o.registry),
        clock(o.clock),
        wake_push(std::move(o.wake_push)),
        wake_storage(std::move(o.wake_storage)),
        storage_failed(std::move(o.storage_failed)) {}

  const ConfirmConfig cfg;
  const std::string auto_device;
  Store* const store;
  LiveFeed* const live;
  metrics::Registry& registry;
  Clock* const clock;
  const std::function<void()> wake_push, wake_storage;
  const std::function<void(const Status&)> storage_failed;

  int64_t SteadyNowNs() const { return clock->SteadyNs(); }
  int64_t NowNs() const { return clock->WallNs(); }
  // Storage thread only.
  std::unique_ptr<Confirmer> confirmer;           // `confirm:` on
  std::vector<EventDecision> second_unstored;     // the second model's decisions not stored yet (a failed commit)
  // Tracks some confirmed event already carried (once_per_track sinks alert on the first), the newest kMaxAlerted.
  std::unordered_set<int64_t> alerted;
  std::deque<int64_t> alerted_order;
  static constexpr size_t kMaxAlerted = 100000;

  // Before a transaction: confirmed verdicts and decisions are marked new_track when the track that confirmed them
  // confirmed nothing before; `added` lists the tracks this marked (UnmarkTracks takes them back if it fails).
  void MarkNewTracks(std::vector<EventVerdict>& verdicts, std::vector<EventDecision>& decisions,
                     std::vector<int64_t>* added) {
    auto mark = [&](const std::vector<int64_t>& ids) {
      bool fresh = false;
      for (int64_t id : ids) {
        if (id == 0 || !alerted.insert(id).second) continue;
        fresh = true;
        added->push_back(id);
        alerted_order.push_back(id);
        if (alerted_order.size() > kMaxAlerted) {
          alerted.erase(alerted_order.front());
          alerted_order.pop_front();
        }
      }
      return fresh;
    };
    for (EventVerdict& v : verdicts) {
      if (v.state == EventState::kConfirmed) v.new_track = mark({v.confirmed_by});
    }
    for (EventDecision& d : decisions) {
      if (d.state == EventState::kConfirmed) d.new_track = mark(d.tracks);
    }
  }
  void UnmarkTracks(const std::vector<int64_t>& added) {
    // They are the newest entries of alerted_order (nothing was marked since): taken off its back, so a later
    // eviction of a stale entry cannot erase the same id marked again.
    for (auto it = added.rbegin(); it != added.rend(); ++it) {
      alerted.erase(*it);
      if (!alerted_order.empty() && alerted_order.back() == *it) alerted_order.pop_back();
    }
  }

  // The second model (confirm.classifier): its own thread classifies crops; decisions come back to storage.
  std::unique_ptr<Classifier> classifier;
  std::unique_ptr<SecondStage> second;
  std::thread classifier_thread;
  Mutex second_mu;
  CondVar second_cv;
  bool second_stop VIGIL_GUARDED_BY(second_mu) = false;
  std::atomic<bool> second_ready{false};     // decisions wait in `second`
  SecondStageStats second_counted;           // storage thread: what the metrics have
  metrics::Counter& SecondModel(const char* result) {
    return registry.GetCounter("vigil_aggregator_second_model_total",
                               "Events the second model decided, by outcome (crops: crops classified / failed)",
                               {{"result", result}});
  }

  void ClassifierLoop() {
    for (;;) {
      {
        MutexLock lock(second_mu);
        // Events waiting for crops are looked at every 100 ms; otherwise it sleeps until one is added.
        const Deadline deadline = Deadline::AtSteadyNs(clock->SteadyNs() + 100'000'000);
        while (!second_stop && second->waiting() == 0) {
          if (!second_cv.WaitUntil(lock, deadline)) break;
        }
        if (second_stop) return;
      }
      if (second->Step(SteadyNowNs()) > 0) {
        second_ready = true;
        wake_storage();
      }
    }
  }

  // Storage thread: tracker confirmations go to the second model instead of being stored confirmed. `verdicts` of
  // the batch's event reports (state confirmed → pending, "awaiting the second model"); `decisions` (confirmed ones
  // removed). What to hand to the second model after the commit goes to `handoff` (with each event's box count).
  void RouteToSecondModel(std::vector<PendingReport>& reports, std::vector<EventVerdict>& verdicts,
                          std::vector<EventDecision>& decisions,
                          std::vector<std::pair<EventDecision, size_t>>* handoff) {
    if (!second) return;
    std::map<FrameKey, size_t> in_batch;  // events not stored yet
    for (const PendingReport& p : reports) {
      const transport::Report& r = *p.report;
      if (r.kind == transport::ReportKind::kEvent) in_batch[r.first_frame()] = r.detections.size();
    }
    for (PendingReport& p : reports) {
      if (p.verdict == nullptr || p.verdict->state != EventState::kConfirmed || p.verdict->track_ids.empty()) continue;
      EventVerdict& v = verdicts[static_cast<size_t>(p.verdict - verdicts.data())];
      const transport::Report& r = *p.report;
      std::vector<int64_t> by;
      if (v.confirmed_by != 0) by.push_back(v.confirmed_by);
      handoff->push_back(
          {EventDecision{r.edge, r.stream, r.run, r.seq_first, EventState::kConfirmed, v.reason, {}, std::move(by)},
           r.detections.size()});
      v.state = EventState::kPending;
      v.reason = StrCat("awaiting the second model; ", v.reason);
    }
    std::vector<EventDecision> kept;
    for (EventDecision& d : decisions) {
      if (d.state != EventState::kConfirmed) {
        kept.push_back(std::move(d));
        continue;
      }
      size_t boxes = 0;  // 0: no crops to wait for
      if (auto it = in_batch.find(d.key()); it != in_batch.end()) {
        boxes = it->second;
      } else {
        EventQuery q;
        q.edge = d.edge;
        q.stream = d.stream;
        q.by_frame = true;
        q.run = d.run;
        q.seq = d.seq;
        q.limit = 1;
        StatusOr<std::vector<StoredEvent>> ev = store->Events(q);
        if (ev.ok() && !ev->empty()) boxes = ev->front().detections.size();
      }
      handoff->push_back({std::move(d), boxes});
    }
    decisions = std::move(kept);
  }
  void HandOff(std::vector<std::pair<EventDecision, size_t>>& handoff) {
    if (handoff.empty()) return;
    const int64_t now = SteadyNowNs();
    for (auto& [d, boxes] : handoff) second->Add(std::move(d), boxes, now);
    handoff.clear();
    MutexLock lock(second_mu);
    second_cv.NotifyAll();
  }

  // Storage thread: the second model's decisions, in a transaction of their own.
  void StoreSecondModel() {
    second_ready = false;
    std::vector<EventDecision> fresh = second->TakeDecisions();
    for (EventDecision& d : fresh) second_unstored.push_back(std::move(d));
    if (second_unstored.empty()) return;
    std::vector<EventVerdict> no_verdicts;
    std::vector<int64_t> marked;
    MarkNewTracks(no_verdicts, second_unstored, &marked);
    DecisionResult decided;
    const int64_t now_wall = NowNs();
    StatusOr<std::vector<ApplyResult>> r = store->Apply({}, now_wall, second_unstored, &decided);
    if (!r.ok()) {
      UnmarkTracks(marked);
      storage_failed(r.status());
      spdlog::error("aggregator: storing {} decisions of the second model failed (tried again): {}",
                    second_unstored.size(), std::string(r.status().message()));
      second_ready = true;
      return;
    }
    live->PublishDecisions(second_unstored, decided, now_wall);
    second_unstored.clear();
    CountDecided(decided);
    const SecondStageStats st = second->stats();
    SecondModel("confirmed").Inc(static_cast<double>(st.confirmed - second_counted.confirmed));
    SecondModel("rejected").Inc(static_cast<double>(st.rejected - second_counted.rejected));
    SecondModel("no_opinion").Inc(static_cast<double>(st.no_opinion - second_counted.no_opinion));
    SecondModel("no_crops").Inc(static_cast<double>(st.no_crops - second_counted.no_crops));
    SecondModel("crops").Inc(static_cast<double>(st.crops - second_counted.crops));
    SecondModel("crop_errors").Inc(static_cast<double>(st.crop_errors - second_counted.crop_errors));
    second_counted = st;
    if (decided.pushes_queued > 0) wake_push();
  }

  metrics::Counter& EventStates(EventState state, const char* at) {
    return registry.GetCounter("vigil_aggregator_event_states_total",
                               "Events by the state they were stored in / decided to", {{"state", std::string(ToString(state))}, {"at", at}});
  }
  metrics::Gauge& events_pending =
      registry.GetGauge("vigil_aggregator_events_pending", "Events waiting for their tracks to be decided");
  metrics::Gauge& live_tracks = registry.GetGauge("vigil_aggregator_tracks", "Live tracks of every stream");
  // Frames whose association came from an Associator (at: its place, "cuda:0") or fell back to the host.
  metrics::Counter& AssociationFrames(const std::string& at) {
    return registry.GetCounter("vigil_aggregator_association_frames_total",
                               "Tracker frames associated by confirm.association's device (at: where), or on the "
                               "host when it declined or failed (host_fallback)",
                               {{"at", at}});
  }
  metrics::Counter& association_failures = registry.GetCounter(
      "vigil_aggregator_association_failures_total", "Report batches confirm.association's device failed (the host "
                                                     "associated them)");
  ConfirmStats association_counted;
  metrics::Histogram& confirm_seconds = registry.GetHistogram(
      "vigil_aggregator_confirm_seconds", "Tracking a batch of reports", metrics::LatencyBuckets());

  // ---- ConfirmHook (storage thread): confirmation's part in a report batch's transaction ----

  void Observe(const std::vector<ObservedReport>& observed, std::vector<PendingReport>& reports,
               BatchConfirmation& plan) {
    const int64_t c0 = SteadyNowNs();
    confirmer->Begin();
    plan.verdicts.reserve(reports.size());
    std::vector<std::optional<EventVerdict>> got = confirmer->ObserveBatch(observed, SteadyNowNs());
    for (size_t i = 0; i < reports.size(); ++i) {
      if (got[i]) {
        plan.verdicts.push_back(std::move(*got[i]));
        reports[i].verdict = &plan.verdicts.back();  // reserved: never moves
      }
    }
    plan.decisions = confirmer->TakeDecisions();
    RouteToSecondModel(reports, plan.verdicts, plan.decisions, &plan.handoff);
    MarkNewTracks(plan.verdicts, plan.decisions, &plan.marked);
    confirm_seconds.Observe(static_cast<double>(SteadyNowNs() - c0) * 1e-9);
  }
  void Committed(BatchConfirmation& plan, const std::vector<PendingReport>& reports,
                 const std::vector<ApplyResult>& results, const DecisionResult& decided, int64_t now_ns) {
    confirmer->Commit();
    HandOff(plan.handoff);
    for (size_t i = 0; i < reports.size(); ++i) {
      if (reports[i].verdict != nullptr && results[i].event_stored) EventStates(reports[i].verdict->state, "stored").Inc();
    }
    CountDecided(decided);
    live->PublishDecisions(plan.decisions, decided, now_ns);
  }
  void RolledBack(BatchConfirmation& plan) {
    confirmer->Rollback();
    UnmarkTracks(plan.marked);
  }

  void CountDecided(const DecisionResult& d) {
    if (d.confirmed > 0) EventStates(EventState::kConfirmed, "decided").Inc(static_cast<double>(d.confirmed));
    if (d.rejected > 0) EventStates(EventState::kRejected, "decided").Inc(static_cast<double>(d.rejected));
    UpdateConfirmGauges();
  }
  void UpdateConfirmGauges() {
    const ConfirmStats st = confirmer->stats();
    events_pending.Set(static_cast<double>(st.pending));
    live_tracks.Set(static_cast<double>(st.tracks));
    const std::string where = confirmer->association_where();
    if (st.associated > association_counted.associated) {
      AssociationFrames(where).Inc(static_cast<double>(st.associated - association_counted.associated));
    }
    if (st.association_fallbacks > association_counted.association_fallbacks) {
      AssociationFrames("host_fallback")
          .Inc(static_cast<double>(st.association_fallbacks - association_counted.association_fallbacks));
    }
    if (st.association_failures > association_counted.association_failures) {
      association_failures.Inc(
          static_cast<double>(st.association_failures - association_counted.association_failures));
    }
    association_counted = st;
  }

  // confirm.association.device: auto takes the GPU detection rows arrive on (cuda_ipc's device, else ucx_device's)
  // and falls back to the CPU with a warning; a named cuda:N that cannot be had fails the start. Null: the CPU.
  StatusOr<std::unique_ptr<Associator>> MakeAssociator() const {
    const std::string& want = cfg.association_device;
    std::string dev = want;
    if (want == "auto") {
      dev = auto_device;
    }
    if (dev == "cpu") return std::unique_ptr<Associator>();
    DeviceAssociatorOptions o = cfg.association_limits;
    o.device = *ParseCudaDevice(dev);
    StatusOr<std::unique_ptr<Associator>> a = MakeDeviceAssociator(o);
    if (a.ok()) return a;
    if (want != "auto") return Annotate(a.status(), StrCat("confirm.association.device ", want));
    spdlog::warn("aggregator: confirm.association.device auto: {} unavailable, associating on the CPU: {}", dev,
                 std::string(a.status().message()));
    return std::unique_ptr<Associator>();
  }

  // At start: the tracker for every stream with events left pending by the previous run is rebuilt from its stored
  // events (the few before its first pending one, then every later one), so they are decided as if it had not
  // stopped; what that already decides is stored at once.
  Status StartConfirmation() {
    VIGIL_RETURN_IF_ERROR(ValidateConfirmConfig(cfg));
    VIGIL_ASSIGN_OR_RETURN(int64_t max_track, store->MaxTrackId());
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Associator> associator, MakeAssociator());
    confirmer = std::make_unique<Confirmer>(cfg, max_track + 1, std::move(associator));
    spdlog::info("aggregator: confirmation associates tracks on {}", confirmer->association_where() == "host"
                                                                          ? std::string("the CPU")
                                                                          : confirmer->association_where());
    if (cfg.classifier_enabled) {
      VIGIL_ASSIGN_OR_RETURN(classifier, Classifier::Load(cfg.classifier));
      spdlog::info("aggregator: second model {} on {} ({}x{}, {} classes)", cfg.classifier.model,
                   cfg.classifier.device, classifier->width(), classifier->height(), classifier->labels().size());
      Store* st = store;
      second = std::make_unique<SecondStage>(
          cfg.classifier, [c = classifier.get()](std::string_view jpeg) { return c->Classify(jpeg); },
          [st](const std::string& edge, const std::string& stream, uint64_t run, uint64_t seq) {
            return st->Snapshots(edge, stream, run, seq, /*with_jpeg=*/true);
          });
    }
    int window = cfg.rules.m;
    for (const ConfirmRuleOverride& o : cfg.overrides) window = std::max(window, o.rules.m);
    std::map<std::pair<std::string, std::string>, int64_t> first_pending;  // (edge, stream) → its oldest pending id
    EventQuery pq;
    pq.state = "pending";
    pq.limit = 10000;
    for (;;) {
      VIGIL_ASSIGN_OR_RETURN(std::vector<StoredEvent> page, store->Events(pq));
      for (const StoredEvent& e : page) first_pending.try_emplace({e.edge, e.stream}, e.id);
      if (page.size() < static_cast<size_t>(pq.limit)) break;
      pq.since_id = page.back().id;
    }
    if (first_pending.empty()) return absl::OkStatus();
    const int64_t now = SteadyNowNs();
    uint64_t resumed = 0;
    confirmer->Begin();
    for (const auto& [key, first] : first_pending) {
      EventQuery before;
      before.edge = key.first;
      before.stream = key.second;
      before.before_id = first;
      before.newest_first = true;
      before.limit = window;
      VIGIL_ASSIGN_OR_RETURN(std::vector<StoredEvent> earlier, store->Events(before));
      for (auto it = earlier.rbegin(); it != earlier.rend(); ++it) confirmer->Resume(*it, now);
      EventQuery after;
      after.edge = key.first;
      after.stream = key.second;
      after.since_id = first - 1;
      after.limit = 10000;
      for (;;) {
        VIGIL_ASSIGN_OR_RETURN(std::vector<StoredEvent> page, store->Events(after));
        for (const StoredEvent& e : page) {
          confirmer->Resume(e, now);
          resumed += e.state == EventState::kPending ? 1 : 0;
        }
        if (page.size() < static_cast<size_t>(after.limit)) break;
        after.since_id = page.back().id;
      }
    }
    VIGIL_ASSIGN_OR_RETURN(DecisionResult decided, StoreConfirmerDecisions());
    spdlog::info("aggregator: confirmation resumed {} pending events of {} streams: {} confirmed, {} rejected at once",
                 resumed, first_pending.size(), decided.confirmed, decided.rejected);
    return absl::OkStatus();
  }

  // Between batches: streams silent for idle_s end their tracks; the decisions are stored in a transaction of their
  // own (a failure rolls the tracker back: it is tried again at the next tick).
  void ExpireTracks() {
    confirmer->Begin();
    confirmer->Expire(SteadyNowNs());
    StatusOr<DecisionResult> d = StoreConfirmerDecisions();
    if (!d.ok()) {
      storage_failed(d.status());
      spdlog::error("aggregator: storing decisions on pending events failed (tried again): {}",
                    std::string(d.status().message()));
    }
  }

  // The Confirmer's decisions outside a report batch (after its Begin): routed to the second model, marked for
  // once-per-track sinks, stored in a transaction of their own, then committed — or, when that fails, rolled back.
  StatusOr<DecisionResult> StoreConfirmerDecisions() {
    std::vector<EventDecision> decisions = confirmer->TakeDecisions();
    std::vector<PendingReport> none;
    std::vector<EventVerdict> no_verdicts;
    std::vector<std::pair<EventDecision, size_t>> handoff;
    RouteToSecondModel(none, no_verdicts, decisions, &handoff);
    std::vector<int64_t> marked;
    MarkNewTracks(no_verdicts, decisions, &marked);
    DecisionResult decided;
    if (!decisions.empty()) {
      const int64_t now_wall = NowNs();
      StatusOr<std::vector<ApplyResult>> r = store->Apply({}, now_wall, decisions, &decided);
      if (!r.ok()) {
        confirmer->Rollback();
        UnmarkTracks(marked);
        return r.status();
      }
      live->PublishDecisions(decisions, decided, now_wall);
    }
    confirmer->Commit();
    HandOff(handoff);
    CountDecided(decided);  // and the gauges: tracks may have ended without a decision
    if (decided.pushes_queued > 0) wake_push();
    return decided;
  }
};

StatusOr<std::unique_ptr<Confirmation>> Confirmation::Start(ConfirmationOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Impl& d = *impl;
  std::unique_ptr<Confirmation> c(new Confirmation(std::move(impl)));
  VIGIL_RETURN_IF_ERROR(d.StartConfirmation());
  return c;
}

void Confirmation::Run() {
  Impl& d = *impl_;
  if (d.second && !d.classifier_thread.joinable()) d.classifier_thread = std::thread([&d] { d.ClassifierLoop(); });
}

Confirmation::Confirmation(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Confirmation::~Confirmation() { Stop(); }

void Confirmation::Stop() {
  Impl& d = *impl_;
  if (!d.classifier_thread.joinable()) return;
  {
    MutexLock lock(d.second_mu);
    d.second_stop = true;
    d.second_cv.NotifyAll();
  }
  d.classifier_thread.join();
}

void Confirmation::Observe(const std::vector<ObservedReport>& observed, std::vector<PendingReport>& reports,
                           BatchConfirmation& plan) {
  impl_->Observe(observed, reports, plan);
}
void Confirmation::Committed(BatchConfirmation& plan, const std::vector<PendingReport>& reports,
                             const std::vector<ApplyResult>& results, const DecisionResult& decided, int64_t now_ns) {
  impl_->Committed(plan, reports, results, decided, now_ns);
}
void Confirmation::RolledBack(BatchConfirmation& plan) { impl_->RolledBack(plan); }
void Confirmation::ExpireTracks() { impl_->ExpireTracks(); }
bool Confirmation::SecondModelPending() const {
  return impl_->second && (impl_->second_ready || !impl_->second_unstored.empty());
}
void Confirmation::StoreSecondModel() { impl_->StoreSecondModel(); }
const std::atomic<bool>* Confirmation::second_ready() const { return &impl_->second_ready; }
int64_t Confirmation::expire_interval_ns() const { return static_cast<int64_t>(impl_->cfg.idle_s * 100) * 1'000'000; }

}  // namespace vigil::aggregator
