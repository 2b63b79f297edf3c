#include "vigil/aggregator/aggregator.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <unordered_set>
#include <tuple>

#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/http_access.h"
#include "aggregator/config.h"
#include "aggregator/http_api.h"
#include "aggregator/ingest.h"
#include "aggregator/live_feed.h"
#include "aggregator/transport_metrics.h"
#include "vigil/transport/receiver.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/ucx.h"

namespace vigil::aggregator {
namespace {

using transport::RejectReason;
using transport::Report;
using transport::Session;

}  // namespace

struct Aggregator::Impl final : ConfirmHook {
  AggregatorConfig cfg;
  std::unique_ptr<Store> store;
  // Sessions, the queue to storage, Hellos and report batches (aggregator/ingest.h): the receivers' handler, so it
  // outlives them; the registry (declared after it) goes first, with its collect hook.
  std::unique_ptr<Ingest> ingest;
  std::vector<std::unique_ptr<Pusher>> pushers;  // one per push sink
  std::vector<std::unique_ptr<transport::Receiver>> receivers;  // the tcp link first, then ucx
  metrics::Registry registry;
  std::unique_ptr<httplib::Server> http;
  LiveFeed live;                  // the live channel's feed (aggregator/live_feed.h)
  std::unique_ptr<HttpApi> api;   // the routes registered on `http` (aggregator/http_api.h)
  int http_port = 0;
  std::thread http_thread, storage_thread;
  bool stopped = false;  // Stop/Kill ran (controlling thread only)

  Clock* clock = SystemClock();  // every time read (steady: intervals, waits; wall: timestamps stored)

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
        const auto deadline = SteadyDeadline(clock->SteadyNs() + 100'000'000);
        while (!second_stop && second->waiting() == 0) {
          if (!second_cv.WaitUntil(lock, deadline)) break;
        }
        if (second_stop) return;
      }
      if (second->Step(SteadyNowNs()) > 0) {
        second_ready = true;
        ingest->WakeStorage();
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
    std::map<std::tuple<std::string, std::string, uint64_t, uint64_t>, size_t> in_batch;  // events not stored yet
    for (const PendingReport& p : reports) {
      const transport::Report& r = *p.report;
      if (r.kind == transport::ReportKind::kEvent) in_batch[{r.edge, r.stream, r.run, r.seq_first}] = r.detections.size();
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
      if (auto it = in_batch.find({d.edge, d.stream, d.run, d.seq}); it != in_batch.end()) {
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
      ingest->StorageFailed(r.status());
      spdlog::error("aggregator: storing {} decisions of the second model failed (tried again): {}",
                    second_unstored.size(), std::string(r.status().message()));
      second_ready = true;
      return;
    }
    live.PublishDecisions(second_unstored, decided, now_wall);
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
    if (decided.pushes_queued > 0) {
      for (auto& p : pushers) p->Wake();
    }
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
  metrics::Counter& retention_events = registry.GetCounter(
      "vigil_aggregator_retention_deleted_total", "Rows retention deleted", {{"what", "events"}});
  metrics::Counter& retention_frames = registry.GetCounter(
      "vigil_aggregator_retention_deleted_total", "Rows retention deleted", {{"what", "frames"}});
  metrics::Counter& retention_dead_letters = registry.GetCounter(
      "vigil_aggregator_retention_deleted_total", "Rows retention deleted", {{"what", "dead_letters"}});
  metrics::Counter& retention_snapshots = registry.GetCounter(
      "vigil_aggregator_retention_deleted_total", "Rows retention deleted", {{"what", "snapshots"}});
  metrics::Gauge& retention_kept_for_push = registry.GetGauge(
      "vigil_aggregator_retention_kept_for_push",
      "Events past the age limit kept because a push sink has not delivered them (at the last pruning)");

  // ---- ReceiverHandler (connection threads) ----

  // ---- storage thread ----

  void StorageLoop() {
    constexpr int64_t kNever = INT64_MAX;  // steady ns
    const bool prunes = cfg.retention.any();
    int64_t next_prune = prunes ? clock->SteadyNs() : kNever;
    int64_t next_expire = confirmer ? clock->SteadyNs() : kNever;
    for (;;) {
      if (!ingest->WaitForWork(std::min(next_prune, next_expire), &second_ready)) return;
      if (clock->SteadyNs() >= next_prune) {  // between batches: retention holds the writer for a chunk at a time
        Prune();
        next_prune = clock->SteadyNs() + int64_t{cfg.retention_interval_s} * 1'000'000'000;
      }
      if (clock->SteadyNs() >= next_expire) {  // a tenth of idle_s late at most
        ExpireTracks();
        next_expire = clock->SteadyNs() + static_cast<int64_t>(cfg.confirm.idle_s * 100) * 1'000'000;
      }
      ingest->ProcessSnapshots();  // between report batches: pictures never hold up the reports for long
      if (second && (second_ready || !second_unstored.empty())) StoreSecondModel();
      ingest->ProcessNext();  // a Hello, or the reports up to the next one
    }
  }

  // ---- ConfirmHook (storage thread): confirmation's part in a report batch's transaction ----

  void Observe(const std::vector<ObservedReport>& observed, std::vector<PendingReport>& reports,
               BatchConfirmation& plan) override {
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
                 const std::vector<ApplyResult>& results, const DecisionResult& decided, int64_t now_ns) override {
    confirmer->Commit();
    HandOff(plan.handoff);
    for (size_t i = 0; i < reports.size(); ++i) {
      if (reports[i].verdict != nullptr && results[i].event_stored) EventStates(reports[i].verdict->state, "stored").Inc();
    }
    CountDecided(decided);
    live.PublishDecisions(plan.decisions, decided, now_ns);
  }
  void RolledBack(BatchConfirmation& plan) override {
    confirmer->Rollback();
    UnmarkTracks(plan.marked);
  }

  int64_t SteadyNowNs() const { return clock->SteadyNs(); }
  int64_t NowNs() const { return clock->WallNs(); }
  // A CondVar deadline on steady_clock from a steady time of the Clock seam (SystemClock's origin is steady_clock's).
  static std::chrono::steady_clock::time_point SteadyDeadline(int64_t steady_ns) {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(steady_ns));
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
    const std::string& want = cfg.confirm.association_device;
    std::string dev = want;
    if (want == "auto") {
      dev = cfg.cuda_ipc_enabled && ParseCudaDevice(cfg.cuda_ipc_device) ? cfg.cuda_ipc_device
            : cfg.ucx_enabled && ParseCudaDevice(cfg.ucx_device)        ? cfg.ucx_device
                                                                          : "cpu";
    }
    if (dev == "cpu") return std::unique_ptr<Associator>();
    DeviceAssociatorOptions o = cfg.confirm.association_limits;
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
    VIGIL_RETURN_IF_ERROR(ValidateConfirmConfig(cfg.confirm));
    VIGIL_ASSIGN_OR_RETURN(int64_t max_track, store->MaxTrackId());
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Associator> associator, MakeAssociator());
    confirmer = std::make_unique<Confirmer>(cfg.confirm, max_track + 1, std::move(associator));
    spdlog::info("aggregator: confirmation associates tracks on {}", confirmer->association_where() == "host"
                                                                          ? std::string("the CPU")
                                                                          : confirmer->association_where());
    if (cfg.confirm.classifier_enabled) {
      VIGIL_ASSIGN_OR_RETURN(classifier, Classifier::Load(cfg.confirm.classifier));
      spdlog::info("aggregator: second model {} on {} ({}x{}, {} classes)", cfg.confirm.classifier.model,
                   cfg.confirm.classifier.device, classifier->width(), classifier->height(), classifier->labels().size());
      Store* st = store.get();
      second = std::make_unique<SecondStage>(
          cfg.confirm.classifier, [c = classifier.get()](std::string_view jpeg) { return c->Classify(jpeg); },
          [st](const std::string& edge, const std::string& stream, uint64_t run, uint64_t seq) {
            return st->Snapshots(edge, stream, run, seq, /*with_jpeg=*/true);
          });
      classifier_thread = std::thread([this] { ClassifierLoop(); });
    }
    int window = cfg.confirm.rules.m;
    for (const ConfirmRuleOverride& o : cfg.confirm.overrides) window = std::max(window, o.rules.m);
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
      ingest->StorageFailed(d.status());
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
      live.PublishDecisions(decisions, decided, now_wall);
    }
    confirmer->Commit();
    HandOff(handoff);
    CountDecided(decided);  // and the gauges: tracks may have ended without a decision
    if (decided.pushes_queued > 0) {
      for (auto& p : pushers) p->Wake();
    }
    return decided;
  }

  void Prune() {
    StatusOr<RetentionResult> r = store->Prune(cfg.retention, NowNs());
    if (!r.ok()) {
      ingest->StorageFailed(r.status());
      spdlog::error("aggregator: retention failed (it tries again in {} s): {}", cfg.retention_interval_s,
                    std::string(r.status().message()));
      return;
    }
    retention_events.Inc(static_cast<double>(r->events));
    retention_frames.Inc(static_cast<double>(r->frames));
    retention_dead_letters.Inc(static_cast<double>(r->dead_letters));
    retention_snapshots.Inc(static_cast<double>(r->snapshots));
    retention_kept_for_push.Set(static_cast<double>(r->kept_for_push));
    if (r->events + r->frames + r->dead_letters > 0) {
      spdlog::info("aggregator: retention deleted {} events, {} frame rows, {} dead letters{}", r->events, r->frames,
                   r->dead_letters,
                   r->kept_for_push > 0 ? StrCat("; kept ", r->kept_for_push, " events a push sink still has to deliver")
                                        : std::string());
    }
  }

  // ---- IngestView (HTTP worker threads): what /healthz and /api/stats show of the sessions ----

  void Shutdown(bool crash) {
    if (stopped) return;
    stopped = true;
    ingest->Close(crash);
    live.Close();  // the live channels end (their HTTP threads are free for stop())
    if (crash) {  // cut the edges first: no ack for anything queued
      for (auto& rx : receivers) rx->Stop();
    }
    if (classifier_thread.joinable()) {  // what it has not decided stays pending: resumed at the next start
      {
        MutexLock lock(second_mu);
        second_stop = true;
        second_cv.NotifyAll();
      }
      classifier_thread.join();
    }
    storage_thread.join();  // clean: stores and acks everything queued first
    for (auto& p : pushers) p->Stop();  // what is not delivered stays in the outbox for the next start
    for (auto& rx : receivers) rx->Stop();
    http->stop();
    http_thread.join();
    spdlog::info("aggregator: {}", crash ? "killed" : "stopped");
  }
};

Aggregator::Aggregator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Aggregator::~Aggregator() { Stop(); }

StatusOr<std::unique_ptr<Aggregator>> Aggregator::Start(const AggregatorConfig& config) {
  auto impl = std::make_unique<Impl>();
  Impl& d = *impl;
  d.cfg = config;
  // Access control first: a misconfigured key, certificate or network fails the start, naming it.
  std::shared_ptr<const transport::AllowList> allow;
  if (!config.allow.empty()) {
    VIGIL_ASSIGN_OR_RETURN(transport::AllowList list, transport::AllowList::Parse(config.allow));
    allow = std::make_shared<const transport::AllowList>(std::move(list));
  }
  std::shared_ptr<const transport::KeyStore> keys;
  if (!config.keys_file.empty()) {
    VIGIL_ASSIGN_OR_RETURN(transport::KeyStore store, transport::KeyStore::Load(config.keys_file));
    keys = std::make_shared<const transport::KeyStore>(std::move(store));
  } else if (config.auth_required) {
    return absl::InvalidArgumentError("auth: keys_file is required (or auth: {required: false})");
  } else {
    spdlog::warn("aggregator: authentication is OFF (auth: {required: false}): any peer that reaches the report "
                 "ports can write events under any edge id");
  }
  VIGIL_ASSIGN_OR_RETURN(std::string token, transport::ReadToken(config.http_token_file, "VIGIL_HTTP_TOKEN"));
  metrics::Counter& http_address = d.registry.GetCounter("vigil_http_rejected_total", "HTTP requests refused",
                                                         {{"reason", "address"}});
  metrics::Counter& http_token = d.registry.GetCounter("vigil_http_rejected_total", "HTTP requests refused",
                                                       {{"reason", "token"}});
  transport::HttpAccess access{allow, token, config.http_cert_file, config.http_key_file,
                               [&http_address, &http_token](std::string_view reason, const std::string&) {
                                 (reason == "address" ? http_address : http_token).Inc();
                               }};
  access.public_paths = {"/", "/ui/", "/favicon.ico"};  // the dashboard's page and files: no data; it asks for the token
  VIGIL_ASSIGN_OR_RETURN(d.http, transport::MakeHttpServer(std::move(access)));
  StoreOptions so;
  so.synchronous_full = config.db_synchronous_full;
  so.password = config.db_password;
  for (const PushSinkConfig& p : config.push) so.routes.push_back(p.route);
  VIGIL_ASSIGN_OR_RETURN(d.store, Store::Open(config.db_path, so));
  IngestOptions io;
  io.store = d.store.get();
  io.registry = &d.registry;
  io.live = &d.live;
  io.confirm = config.confirm.enabled ? &d : nullptr;
  io.wake_push = [&d] {
    for (auto& p : d.pushers) p->Wake();
  };
  for (const PushSinkConfig& p : config.push) io.push_routes.push_back(p.route);
  io.queue_max = config.queue_max;
  io.batch_max = config.batch_max;
  io.snapshot_queue_mb = config.snapshot_queue_mb;
  io.clock = d.clock;
  d.ingest = std::make_unique<Ingest>(std::move(io));
  if (config.confirm.enabled) {
    VIGIL_RETURN_IF_ERROR(d.StartConfirmation());
    const TrackRules& r = config.confirm.rules;
    spdlog::info("aggregator: confirmation on: seen in {} of the last {} frames, {} s, {} px of travel ({} overrides), "
                 "tracks confirmed after {} frames, streams silent for {} s end their tracks",
                 r.k, r.m, r.min_duration_s, r.min_travel_px, config.confirm.overrides.size(),
                 config.confirm.tracker.min_hits, config.confirm.idle_s);
  }
  for (const PushSinkConfig& p : config.push) {
    if (p.route.on_confirmed && !config.confirm.enabled) {
      spdlog::warn("aggregator: push sink '{}' waits for confirmed events, but there is no confirm: section: every "
                   "event is stored confirmed, so it gets every event its route takes",
                   p.route.sink);
    }
  }
  for (const PushSinkConfig& p : config.push) {
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Delivery> delivery, p.mqtt_sink ? MakeMqtt(p.mqtt) : MakeWebhook(p.webhook));
    const metrics::Labels sink{{"sink", p.route.sink}};
    auto* delivered = &d.registry.GetCounter("vigil_aggregator_push_total", "Deliveries to push sinks by outcome",
                                             {{"sink", p.route.sink}, {"result", "delivered"}});
    auto* retried = &d.registry.GetCounter("vigil_aggregator_push_total", "Deliveries to push sinks by outcome",
                                           {{"sink", p.route.sink}, {"result", "retried"}});
    auto* dead = &d.registry.GetCounter("vigil_aggregator_push_total", "Deliveries to push sinks by outcome",
                                        {{"sink", p.route.sink}, {"result", "dead"}});
    auto* delay = &d.registry.GetHistogram("vigil_aggregator_push_delay_seconds",
                                           "Event stored to delivered to a push sink, seconds", metrics::LatencyBuckets(),
                                           sink);
    spdlog::info("aggregator: push sink '{}': {}{}", p.route.sink, delivery->describe(),
                 !p.webhook.token.empty() ? " (bearer token)" : !p.mqtt.username.empty() ? " (credentials)" : "");
    d.pushers.push_back(std::make_unique<Pusher>(
        d.store.get(), p.route.sink, std::move(delivery), p.retry, d.clock,
        [=](const DeliveryOutcome& out, bool is_dead, int64_t age_ns) {
          if (out.kind == DeliveryOutcome::kDelivered) {
            delivered->Inc();
            delay->Observe(static_cast<double>(age_ns) * 1e-9);
          } else {
            (is_dead ? dead : retried)->Inc();
          }
        }));
  }
  for (auto& p : d.pushers) p->Start();  // what an earlier run left in the outbox goes out now
  HttpApiOptions ao;
  ao.store = d.store.get();
  ao.ingest = d.ingest.get();
  ao.live = &d.live;
  ao.registry = &d.registry;
  for (const auto& p : d.pushers) ao.push_sinks.push_back(p->sink());
  ao.wake_push = [&d](const std::string& sink) {
    for (auto& p : d.pushers) {
      if (p->sink() == sink) p->Wake();
    }
  };
  d.api = std::make_unique<HttpApi>(std::move(ao));
  d.api->Register(*d.http);
  d.http_port = config.http_port == 0
                    ? d.http->bind_to_any_port(config.http_host)
                    : (d.http->bind_to_port(config.http_host, config.http_port) ? config.http_port : -1);
  if (d.http_port < 0) {
    return absl::UnavailableError(StrCat("http: cannot listen on ", config.http_host, ":", config.http_port));
  }
  d.http_thread = std::thread([&d] { d.http->listen_after_bind(); });
  // stop() is a no-op until the server runs: wait, so a Stop right after Start cannot hang.
  for (int i = 0; i < 5000 && !d.http->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto fail = [&d](const Status& st) {
    for (auto& rx : d.receivers) rx->Stop();
    d.http->stop();
    d.http_thread.join();
    return st;
  };
  transport::ReceiverOptions ro;
  ro.max_connections = config.max_connections;
  ro.peer_timeout = std::chrono::milliseconds(config.peer_timeout_ms);
  ro.keys = keys;
  ro.allow = allow;
  auto start_link = [&](StatusOr<std::unique_ptr<transport::Listener>> listener, bool ip_allow_list = true) -> Status {
    if (!listener.ok()) return listener.status();
    transport::ReceiverOptions o = ro;
    if (!ip_allow_list) o.allow = nullptr;
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<transport::Receiver> rx,
                           transport::Receiver::Start(o, std::move(*listener), d.ingest.get()));
    transport::Receiver* r = rx.get();
    MirrorReceiverStats(d.registry, std::string(r->kind()), [r] { return r->Stats(); });
    d.receivers.push_back(std::move(rx));
    return absl::OkStatus();
  };
  StatusOr<std::unique_ptr<transport::TcpListener>> tcp = transport::TcpListener::Listen(config.listen_host,
                                                                                         config.listen_port);
  if (!tcp.ok()) return fail(tcp.status());
  std::unique_ptr<transport::Listener> tcp_link = std::move(*tcp);
  if (!config.tls_cert_file.empty()) {
    StatusOr<std::shared_ptr<transport::TlsContext>> tls = transport::TlsContext::Server(
        {config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file, /*require_peer_cert=*/true, ""});
    if (!tls.ok()) return fail(tls.status());
    tcp_link = transport::MakeTlsListener(std::move(tcp_link), *tls);
  }
  Status st = start_link(std::move(tcp_link));
  if (!st.ok()) return fail(st);
  if (config.ucx_enabled) {
    transport::UcxOptions uo;
    if (std::optional<int> dev = ParseCudaDevice(config.ucx_device)) {
      // A GPU that cannot take the rows is a configuration error at start, not a failure per report.
      st = transport::CheckRingDevice(config.ucx_device);
      if (!st.ok()) return fail(Annotate(st, StrCat("ucx_device ", config.ucx_device)));
      uo.receive_device = *dev;
    }
    st = start_link(transport::UcxListen(config.ucx_host, config.ucx_port, uo));
    if (!st.ok()) return fail(Annotate(st, "ucx_listen"));
    MirrorUcxCounters(d.registry);
  }
  if (config.cuda_ipc_enabled) {
    // An explicit GPU that cannot hold rings is a configuration error, not a per-session surprise.
    st = transport::CheckRingDevice(config.cuda_ipc_device);
    if (!st.ok()) return fail(Annotate(st, StrCat("cuda_ipc.device ", config.cuda_ipc_device)));
    transport::CudaIpcListenOptions io;
    io.path = config.cuda_ipc_socket;
    io.device = config.cuda_ipc_device;
    io.slots = config.cuda_ipc_slots;
    io.slot_bytes = config.cuda_ipc_slot_bytes;
    io.allow_uids.assign(config.cuda_ipc_allow_uids.begin(), config.cuda_ipc_allow_uids.end());
    // The allow-list is of IP networks: a Unix-socket peer is checked by its uid (allow_uids) instead.
    st = start_link(transport::CudaIpcListen(io), /*ip_allow_list=*/false);
    if (!st.ok()) return fail(Annotate(st, "cuda_ipc"));
    MirrorCudaIpcCounters(d.registry);
  }
  d.storage_thread = std::thread([&d] { d.StorageLoop(); });
  std::string links;
  for (const auto& rx : d.receivers) {
    links += StrCat(links.empty() ? "" : ", ", rx->kind(), " ", rx->address(),
                    rx->kind() == "tcp" && !config.tls_cert_file.empty() ? " (TLS)" : "");
  }
  spdlog::info("aggregator: edges on {}; HTTP{} on {}:{}{}; database {} {} (schema {})", links,
               config.http_cert_file.empty() ? "" : "S", config.http_host, d.http_port,
               token.empty() ? "" : " (bearer token)", d.store->engine(), d.store->path(), d.store->schema_version());
  return std::unique_ptr<Aggregator>(new Aggregator(std::move(impl)));
}

uint16_t Aggregator::listen_port() const { return impl_->receivers[0]->port(); }
uint16_t Aggregator::ucx_port() const {
  for (const auto& rx : impl_->receivers) {
    if (rx->kind() == "ucx") return rx->port();
  }
  return 0;
}
uint16_t Aggregator::http_port() const { return static_cast<uint16_t>(impl_->http_port); }
metrics::Registry& Aggregator::metrics() { return impl_->registry; }
void Aggregator::Stop() { impl_->Shutdown(false); }
void Aggregator::Kill() { impl_->Shutdown(true); }

}  // namespace vigil::aggregator
