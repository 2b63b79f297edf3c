#include "vigil/aggregator/aggregator.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_set>
#include <tuple>

#include "vigil/aggregator/store.h"
#include "vigil/common/config.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/http_access.h"
#include "aggregator/dashboard_assets.h"
#include "vigil/transport/receiver.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/ucx.h"
#if VIGIL_HAVE_TURBOJPEG
#include "vigil/video/snapshot.h"
#endif

namespace vigil::aggregator {
namespace {

using nlohmann::json;
using transport::RejectReason;
using transport::Report;
using transport::Session;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Client-supplied text (edge ids, labels) may be invalid UTF-8: replace, never throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// "cuda:N" → N; anything else → nullopt.
std::optional<int> ParseCudaDevice(const std::string& s) {
  if (s.rfind("cuda:", 0) != 0 || s.size() == 5 || s.size() > 9) return std::nullopt;
  int n = 0;
  for (size_t i = 5; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    n = n * 10 + (s[i] - '0');
  }
  return n;
}

// A secret from `<key>_file` (its first line) or the environment variable `<key>_env`; never logged.
void ReadSecret(ConfigMap& m, const std::string& key, std::string* out) {
  std::string path, env;
  m.Get(key + "_file", &path);
  m.Get(key + "_env", &env);
  if (!path.empty() && !env.empty()) m.Error(key + "_env", StrCat("give ", key, "_file or ", key, "_env, not both"));
  if (!path.empty()) {
    std::ifstream in(path);
    const int open_errno = in ? 0 : errno;
    std::getline(in, *out);
    if (!in && out->empty()) {
      m.Error(key + "_file", StrCat(path, ": cannot read it (", open_errno != 0 ? std::strerror(open_errno) : "empty",
                                    ")"));
    }
  } else if (!env.empty()) {
    const char* v = std::getenv(env.c_str());
    if (v == nullptr || *v == '\0') m.Error(key + "_env", StrCat("the environment variable ", env, " is not set"));
    if (v != nullptr) *out = v;
  }
}

StatusOr<AggregatorConfig> FromFile(const ConfigFile& file) {
  AggregatorConfig c;
  ConfigMap root = file.root();
  root.GetHostPort("listen", &c.listen_host, &c.listen_port);
  c.ucx_enabled = root.GetHostPort("ucx_listen", &c.ucx_host, &c.ucx_port);
  if (root.Get("ucx_device", &c.ucx_device) && c.ucx_device != "host" && !ParseCudaDevice(c.ucx_device)) {
    root.Error("ucx_device", StrCat("'", c.ucx_device, "': expected cuda:N or host"));
  }
  if (std::optional<ConfigMap> ipc = root.Map("cuda_ipc")) {
    c.cuda_ipc_enabled = true;
    ipc->Get("socket", &c.cuda_ipc_socket, ConfigMap::kRequired);
    if (ipc->Get("device", &c.cuda_ipc_device) && c.cuda_ipc_device != "host" &&
        c.cuda_ipc_device.rfind("cuda:", 0) != 0) {
      ipc->Error("device", StrCat("'", c.cuda_ipc_device, "': expected cuda:N or host"));
    }
    ipc->Get("slots", &c.cuda_ipc_slots, uint32_t{2}, uint32_t{65536});
    ipc->Get("slot_bytes", &c.cuda_ipc_slot_bytes, uint32_t{4096}, uint32_t{(1u << 24) - 8});
    std::vector<std::string> uids;
    if (ipc->Get("allow_uids", &uids)) {
      for (const std::string& u : uids) {
        char* end = nullptr;
        const unsigned long v = std::strtoul(u.c_str(), &end, 10);
        if (u.empty() || *end != '\0' || v > 0xFFFFFFFEul) {
          ipc->Error("allow_uids", StrCat("'", u, "' is not a numeric uid"));
        } else {
          c.cuda_ipc_allow_uids.push_back(static_cast<uint32_t>(v));
        }
      }
    }
  }
  if (std::optional<ConfigMap> tls = root.Map("tls")) {
    tls->Get("cert_file", &c.tls_cert_file, ConfigMap::kRequired);
    tls->Get("key_file", &c.tls_key_file, ConfigMap::kRequired);
    tls->Get("client_ca_file", &c.tls_client_ca_file);
  }
  root.Get("allow", &c.allow);
  if (std::optional<ConfigMap> auth = root.Map("auth")) {
    auth->Get("keys_file", &c.keys_file);
    auth->Get("required", &c.auth_required);
  }
  root.GetHostPort("http", &c.http_host, &c.http_port);
  if (std::optional<ConfigMap> tls = root.Map("http_tls")) {
    tls->Get("cert_file", &c.http_cert_file, ConfigMap::kRequired);
    tls->Get("key_file", &c.http_key_file, ConfigMap::kRequired);
  }
  root.Get("http_token_file", &c.http_token_file);
  if (root.Get("db", &c.db_path) && c.db_path.empty()) root.Error("db", "must name a file or a postgresql:// URL");
  ReadSecret(root, "db_password", &c.db_password);
  if (!c.db_password.empty() && !c.db_path.starts_with("postgres")) {
    root.Error("db_password_file", "a password is for a PostgreSQL database (db: postgresql://...)");
  }
  std::string sync;
  if (root.GetOneOf("db_synchronous", &sync, {"normal", "full"})) c.db_synchronous_full = sync == "full";
  if (std::optional<ConfigMap> ret = root.Map("retention")) {
    double hours = 0;
    if (ret->Get("max_age_hours", &hours, 1e-3, 87600.0)) c.retention.max_age_ns = static_cast<int64_t>(hours * 3.6e12);
    int64_t max_events = 0;
    if (ret->Get("max_events", &max_events, int64_t{1}, int64_t{1} << 50)) c.retention.max_events = static_cast<uint64_t>(max_events);
    ret->Get("interval_s", &c.retention_interval_s, 1, 86400);
  }
  root.Get("max_connections", &c.max_connections, 1, 65536);
  root.Get("batch_max", &c.batch_max, 1, 100000);
  root.Get("queue_max", &c.queue_max, 1, 10000000);
  root.Get("snapshot_queue_mb", &c.snapshot_queue_mb, 1, 4096);
  root.Get("peer_timeout_ms", &c.peer_timeout_ms, 100, 3600000);
  std::set<std::string> sink_names;
  for (ConfigMap& pm : root.Maps("push")) {
    PushSinkConfig sink;
    pm.Get("name", &sink.route.sink, ConfigMap::kRequired);
    if (!sink.route.sink.empty() && !sink_names.insert(sink.route.sink).second) {
      pm.Error("name", StrCat("'", sink.route.sink, "' names two push sinks"));
    }
    sink.webhook.sink = sink.mqtt.sink = sink.route.sink;
    std::optional<ConfigMap> w = pm.Map("webhook");
    std::optional<ConfigMap> q = pm.Map("mqtt");
    if (!w && !q) pm.Error("name", StrCat("push sink '", sink.route.sink, "' has no delivery: give a webhook: or an mqtt: section"));
    if (w && q) pm.Error("mqtt", "a push sink has one delivery: webhook or mqtt, not both");
    if (w) {
      if (w->Get("url", &sink.webhook.url, ConfigMap::kRequired) && sink.webhook.url.rfind("http://", 0) != 0 &&
          sink.webhook.url.rfind("https://", 0) != 0) {
        w->Error("url", StrCat("'", sink.webhook.url, "' is not an http:// or https:// URL"));
      }
      w->Get("timeout_ms", &sink.webhook.timeout_ms, int64_t{100}, int64_t{600000});
      w->Get("ca_file", &sink.webhook.ca_file);
      ReadSecret(*w, "token", &sink.webhook.token);
    }
    if (q) {
      sink.mqtt_sink = !w;
      uint16_t port = 1883;
      std::string broker;
      if (q->Get("broker", &broker) && broker.find("://") != std::string::npos) {
        q->Error("broker", StrCat("'", broker, "': give host:port, without a scheme (e.g. 10.0.0.5:1883; TLS: ca_file)"));
      } else {
        q->GetHostPort("broker", &sink.mqtt.host, &port, ConfigMap::kRequired);
      }
      sink.mqtt.port = port;
      if (q->Get("topic_prefix", &sink.mqtt.topic_prefix) &&
          (sink.mqtt.topic_prefix.empty() || sink.mqtt.topic_prefix.find_first_of("+#") != std::string::npos)) {
        q->Error("topic_prefix", "must be a topic without the wildcards + and #");
      }
      q->Get("client_id", &sink.mqtt.client_id);
      q->Get("username", &sink.mqtt.username);
      ReadSecret(*q, "password", &sink.mqtt.password);
      q->Get("ca_file", &sink.mqtt.ca_file);
      q->Get("timeout_ms", &sink.mqtt.timeout_ms, int64_t{100}, int64_t{600000});
    }
    if (std::optional<ConfigMap> r = pm.Map("route")) {
      r->Get("edges", &sink.route.edges);
      r->Get("streams", &sink.route.streams);
      r->Get("classes", &sink.route.classes);
      r->GetOneOf("min_severity", &sink.route.min_severity, {"info", "warning", "critical"});
    }
    std::string on;
    if (pm.GetOneOf("on", &on, {"stored", "confirmed"})) sink.route.on_confirmed = on == "confirmed";
    if (pm.Get("once_per_track", &sink.route.once_per_track) && sink.route.once_per_track && !sink.route.on_confirmed) {
      pm.Error("once_per_track", "needs on: confirmed (one alert per confirmed object)");
    }
    if (std::optional<ConfigMap> r = pm.Map("retry")) {
      r->Get("initial_ms", &sink.retry.initial_ms, int64_t{1}, int64_t{3600000});
      r->Get("max_ms", &sink.retry.max_ms, int64_t{1}, int64_t{86400000});
      r->Get("max_attempts", &sink.retry.max_attempts, 1, 1000000);
      if (sink.retry.max_ms < sink.retry.initial_ms) {
        r->Error("max_ms", StrCat(sink.retry.max_ms, " is below initial_ms (", sink.retry.initial_ms, ")"));
      }
    }
    c.push.push_back(std::move(sink));
  }
  if (std::optional<ConfigMap> cm = root.Map("confirm")) {
    ConfirmConfig& k = c.confirm;
    k.enabled = true;
    if (std::optional<ConfigMap> t = cm->Map("tracker")) {
      TrackerOptions& o = k.tracker;
      auto unit = [&](const char* key, float* out, double min) {
        double v = *out;
        if (t->Get(key, &v, min, 1.0)) *out = static_cast<float>(v);
      };
      unit("high_score", &o.high_score, 1e-6);
      unit("low_score", &o.low_score, 0.0);
      unit("new_track_score", &o.new_track_score, 0.0);
      unit("match_iou", &o.match_iou, 0.0);
      unit("low_match_iou", &o.low_match_iou, 0.0);
      t->Get("min_hits", &o.min_hits, 1, 1000);
      t->Get("max_lost_s", &o.max_lost_s, 0.0, 3600.0);
      if (Status st = ValidateTrackerOptions(o); !st.ok()) {
        // "tracker: low_score 0.5: must be in [0, high_score 0.3)": said at the key it names.
        std::string msg(st.message());
        if (msg.starts_with("tracker: ")) msg = msg.substr(9);
        t->Error(msg.substr(0, msg.find(' ')), msg);
      }
    }
    auto rules = [](const ConfigMap& m, TrackRules* r) {
      m.Get("k", &r->k, 1, 1000);
      m.Get("m", &r->m, 1, 1000);
      if (r->k > r->m) m.Error("k", StrCat(r->k, " is above m (", r->m, "): seen in k of the last m frames"));
      m.Get("min_duration_s", &r->min_duration_s, 0.0, 86400.0);
      m.Get("min_travel_px", &r->min_travel_px, 0.0, 1e6);
    };
    if (std::optional<ConfigMap> r = cm->Map("rules")) rules(*r, &k.rules);
    for (ConfigMap& om : cm->Maps("overrides")) {
      ConfirmRuleOverride o;
      o.rules = k.rules;  // what an override does not say, the defaults say
      om.Get("streams", &o.streams);
      om.Get("classes", &o.classes);
      rules(om, &o.rules);
      k.overrides.push_back(std::move(o));
    }
    cm->Get("idle_s", &k.idle_s, 0.1, 3600.0);
    if (std::optional<ConfigMap> as = cm->Map("association")) {
      if (as->Get("device", &k.association_device) && k.association_device != "auto" &&
          k.association_device != "cpu" && !ParseCudaDevice(k.association_device)) {
        as->Error("device", StrCat("'", k.association_device, "': expected auto, cpu or cuda:N"));
      }
      as->Get("max_streams", &k.association_limits.max_streams, uint32_t{1}, uint32_t{65536});
      as->Get("max_tracks", &k.association_limits.max_tracks, uint32_t{1}, uint32_t{4096});
      as->Get("max_detections", &k.association_limits.max_detections, uint32_t{1},
              static_cast<uint32_t>(transport::kMaxDetections));
    }
    if (std::optional<ConfigMap> cl = cm->Map("classifier")) {
      ClassifierConfig& x = k.classifier;
      k.classifier_enabled = true;
      if (cl->Get("model", &x.model, ConfigMap::kRequired) && !std::filesystem::is_regular_file(x.model)) {
        cl->Error("model", StrCat("'", x.model, "' is not a file"));
      }
      if (cl->Get("device", &x.device) && x.device != "cpu" && !x.device.starts_with("cuda")) {
        cl->Error("device", StrCat("'", x.device, "' is not cpu or cuda:N"));
      }
      cl->Get("threads", &x.threads, 0, 256);
      cl->Get("labels", &x.labels);
      std::string norm;
      if (cl->GetOneOf("normalize", &norm, {"unit", "imagenet"})) x.imagenet = norm == "imagenet";
      double min_score = x.min_score;
      if (cl->Get("min_score", &min_score, 0.0, 1.0)) x.min_score = static_cast<float>(min_score);
      cl->Get("confirm", &x.confirm);
      cl->Get("reject", &x.reject);
      if (std::optional<ConfigMap> re = cl->Map("relabel")) {
        for (const std::string& key : re->Keys()) {
          std::string to;
          if (re->Get(key, &to) && !to.empty()) x.relabel[key] = to;
        }
      }
      cl->Get("wait_s", &x.wait_s, 0.1, 600.0);
      for (const std::string& l : x.confirm) {
        if (std::find(x.reject.begin(), x.reject.end(), l) != x.reject.end()) {
          cl->Error("reject", StrCat("'", l, "' is in both confirm and reject"));
        }
      }
    }
  }
  if (c.auth_required && c.keys_file.empty()) {
    root.Error("auth", "keys_file is required (a YAML map `edge-id: hex key`; make a key with `openssl rand -hex 32`), "
                       "or `auth: {required: false}` to accept edges without authentication");
  }
  VIGIL_RETURN_IF_ERROR(file.Finish());
  return c;
}

// Parses an optional query parameter; *error names it when malformed.
bool ParamInt(const httplib::Request& req, const char* name, int64_t min, int64_t max, int64_t* out,
              std::string* error) {
  if (!req.has_param(name)) return true;
  const std::string v = req.get_param_value(name);
  int64_t x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < min || x > max) {
    *error = StrCat(name, ": '", v, "' is not an integer in [", min, ", ", max, "]");
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

StatusOr<AggregatorConfig> LoadAggregatorConfig(const std::string& path) {
  VIGIL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Load(path));
  return FromFile(file);
}

StatusOr<AggregatorConfig> ParseAggregatorConfig(std::string_view yaml, const std::string& name) {
  VIGIL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Parse(yaml, name));
  return FromFile(file);
}

struct Aggregator::Impl final : transport::ReceiverHandler {
  struct Item {
    std::shared_ptr<Session> session;
    std::optional<Report> report;  // nullopt: the session's Hello, to be granted or refused
  };
  struct StreamMetrics {
    metrics::Counter *frames, *events, *dropped, *lost, *duplicates, *stale;
    metrics::Histogram* frame_to_stored;
  };

  AggregatorConfig cfg;
  std::unique_ptr<Store> store;
  std::vector<std::unique_ptr<Pusher>> pushers;  // one per push sink
  std::vector<std::unique_ptr<transport::Receiver>> receivers;  // the tcp link first, then ucx
  metrics::Registry registry;
  std::unique_ptr<httplib::Server> http;
  int http_port = 0;
  std::thread http_thread, storage_thread;
  bool stopped = false;  // Stop/Kill ran (controlling thread only)

  std::mutex mu;
  std::condition_variable not_empty, not_full;
  std::deque<Item> queue;                // GUARDED_BY(mu)
  struct PendingPicture {
    std::shared_ptr<Session> session;
    transport::Snapshot snapshot;
  };
  std::deque<PendingPicture> snapshot_queue;  // GUARDED_BY(mu) waiting for storage, apart from the reports
  size_t snapshot_queue_bytes = 0;            // GUARDED_BY(mu) their JPEG bytes
  bool closing = false;                  // GUARDED_BY(mu) reports arriving now are dropped unacked
  bool stop_storage = false;             // GUARDED_BY(mu) storage exits once the queue is empty
  bool drop_queue = false;               // GUARDED_BY(mu) storage exits at once (Kill)
  std::string storage_error;             // GUARDED_BY(mu) the last failed transaction; "" when healthy
  // GUARDED_BY(mu) open sessions past their Hello (admitted or not yet), by edge id: the storage thread
  // evicts the older ones when it grants a newer epoch.
  std::multimap<std::string, std::shared_ptr<Session>> sessions;
  // GUARDED_BY(mu) per edge id, its latest grant since this aggregator started, and when (wall ns): "new" (the
  // first instance of the id), "replaced" (a new instance after a granted epoch: a restart or a standby's
  // takeover), "promote" (a Hello with kHelloPromote) or "readmitted" (the same instance, a new session).
  std::map<std::string, std::pair<std::string, int64_t>> last_grant;
  // GUARDED_BY(mu) per (edge, stream), what its source was doing at the edge's latest SourceStates.
  std::map<std::pair<std::string, std::string>, transport::SourceState> source_states;

  // Storage thread only.
  std::map<std::pair<std::string, std::string>, StreamMetrics> stream_metrics;
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
  std::map<std::string, uint64_t> current_epochs;  // edge → the epoch granted last (confirmation feeds only those)
  std::set<std::string> warned_classes;  // push routes' classes an edge's model lacks, said once

  // The second model (confirm.classifier): its own thread classifies crops; decisions come back to storage.
  std::unique_ptr<Classifier> classifier;
  std::unique_ptr<SecondStage> second;
  std::thread classifier_thread;
  std::mutex second_mu;
  std::condition_variable second_cv;
  bool second_stop = false;                  // GUARDED_BY(second_mu)
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
        std::unique_lock lock(second_mu);
        // Events waiting for crops are looked at every 100 ms; otherwise it sleeps until one is added.
        second_cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return second_stop || second->waiting() > 0; });
        if (second_stop) return;
      }
      if (second->Step(SteadyNowNs()) > 0) {
        second_ready = true;
        std::lock_guard lock(mu);
        not_empty.notify_all();
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
    std::lock_guard lock(second_mu);
    second_cv.notify_all();
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
      StorageFailed(r.status());
      spdlog::error("aggregator: storing {} decisions of the second model failed (tried again): {}",
                    second_unstored.size(), std::string(r.status().message()));
      second_ready = true;
      return;
    }
    PublishDecisions(second_unstored, decided, now_wall);
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
  metrics::Counter& stored_reports =
      registry.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "stored"}});
  metrics::Counter& duplicate_reports =
      registry.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "duplicate"}});
  metrics::Counter& stale_reports =
      registry.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "stale"}});
  metrics::Counter& superseded_reports =
      registry.GetCounter("vigil_aggregator_reports_total", "Reports by outcome", {{"result", "superseded"}});
  metrics::Counter& hellos_granted =
      registry.GetCounter("vigil_aggregator_hellos_total", "Hellos by decision", {{"result", "granted"}});
  metrics::Counter& hellos_readmitted =
      registry.GetCounter("vigil_aggregator_hellos_total", "Hellos by decision", {{"result", "readmitted"}});
  metrics::Counter& hellos_fenced =
      registry.GetCounter("vigil_aggregator_hellos_total", "Hellos by decision", {{"result", "fenced"}});
  metrics::Counter& evicted_sessions = registry.GetCounter(
      "vigil_aggregator_evicted_sessions_total", "Sessions fenced off because their edge id was granted a newer epoch");
  metrics::Histogram& commit_seconds = registry.GetHistogram(
      "vigil_aggregator_commit_seconds", "Duration of one storage transaction", metrics::LatencyBuckets());
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
  metrics::Counter& storage_errors =
      registry.GetCounter("vigil_aggregator_storage_errors_total", "Storage transactions that failed");
  metrics::Gauge& queue_depth =
      registry.GetGauge("vigil_aggregator_queue_depth", "Reports received and waiting for storage");
  metrics::Counter& Snapshots(const char* result) {
    return registry.GetCounter("vigil_aggregator_snapshots_total", "Snapshots (event pictures) received, by outcome",
                               {{"result", result}});
  }
  metrics::Counter& snapshots_stored = Snapshots("stored");
  metrics::Counter& snapshots_duplicate = Snapshots("duplicate");
  metrics::Counter& snapshots_queue_full = Snapshots("dropped_queue_full");
  metrics::Counter& snapshots_superseded = Snapshots("dropped_superseded");
  metrics::Counter& snapshots_stopping = Snapshots("dropped_stopping");
  metrics::Counter& snapshots_failed = Snapshots("storage_failed");
  metrics::Counter& snapshot_bytes =
      registry.GetCounter("vigil_aggregator_snapshot_bytes_total",
                          "JPEG bytes of the snapshots given to storage (repeats of stored ones included)");
  metrics::Gauge& edges_connected =
      registry.GetGauge("vigil_aggregator_edges_connected", "Edge connections past their Hello");

  // ---- ReceiverHandler (connection threads) ----

  // The Hello is decided on the storage thread, in queue order with the reports (a report queued before it
  // is stored or refused under the epochs as they were).
  Status OnHello(const std::shared_ptr<Session>& s) override {
    spdlog::info("aggregator: edge {} connected from {} (holds epoch {}{})", s->edge(), s->peer(), s->hello().epoch,
                 (s->hello().flags & transport::kHelloPromote) != 0 ? ", promote" : "");
    std::unique_lock lock(mu);
    sessions.emplace(s->edge(), s);
    edges_connected.Set(static_cast<double>(sessions.size()));
    if (!closing) queue.push_back({s, std::nullopt});  // closing: never answered; the receiver closes it
    not_empty.notify_one();
    return absl::OkStatus();
  }

  void OnReport(const std::shared_ptr<Session>& s, Report r) override {
    std::unique_lock lock(mu);
    not_full.wait(lock, [&] { return closing || queue.size() < static_cast<size_t>(cfg.queue_max); });
    if (closing) return;  // not acked: the edge re-sends it to the next aggregator
    queue.push_back({s, std::move(r)});
    not_empty.notify_one();
  }

  // Never blocks the connection: a picture that finds the queue full is dropped and counted.
  void OnSnapshot(const std::shared_ptr<Session>& s, transport::Snapshot snap) override {
    std::lock_guard lock(mu);
    if (closing || s->superseded()) {
      (closing ? snapshots_stopping : snapshots_superseded).Inc();
      return;
    }
    if (snapshot_queue_bytes + snap.jpeg.size() > static_cast<size_t>(cfg.snapshot_queue_mb) << 20) {
      snapshots_queue_full.Inc();
      return;
    }
    snapshot_queue_bytes += snap.jpeg.size();
    snapshot_queue.push_back({s, std::move(snap)});
    not_empty.notify_one();
  }

  void OnSourceStates(const std::shared_ptr<Session>& s, transport::SourceStates states) override {
    std::lock_guard lock(mu);
    if (s->superseded()) return;
    for (const transport::SourceStates::Entry& e : states.streams) source_states[{s->edge(), e.stream}] = e.state;
  }

  // Storage thread: the queued snapshots in one transaction (at most 256 pictures or 8 MiB at a time: the writer is
  // held briefly, and PostgreSQL's hex parameters stay small).
  void ProcessSnapshots() {
    std::vector<PendingPicture> batch;
    {
      std::lock_guard lock(mu);
      size_t taken_bytes = 0;
      while (!snapshot_queue.empty() && batch.size() < 256 &&
             (batch.empty() || taken_bytes + snapshot_queue.front().snapshot.jpeg.size() <= (size_t{8} << 20))) {
        taken_bytes += snapshot_queue.front().snapshot.jpeg.size();
        snapshot_queue_bytes -= snapshot_queue.front().snapshot.jpeg.size();
        batch.push_back(std::move(snapshot_queue.front()));
        snapshot_queue.pop_front();
      }
    }
    if (batch.empty()) return;
    std::vector<PendingSnapshot> pending;
    size_t bytes = 0;
    for (const PendingPicture& p : batch) {
      if (p.session->superseded()) {  // its edge re-sends nothing of it: the picture goes, counted
        snapshots_superseded.Inc();
        continue;
      }
      pending.push_back({&p.session->edge(), &p.snapshot});
      bytes += p.snapshot.jpeg.size();
    }
    StatusOr<uint64_t> stored = store->PutSnapshots(pending, NowNs());
    if (!stored.ok()) {
      StorageFailed(stored.status());
      snapshots_failed.Inc(static_cast<double>(pending.size()));
      spdlog::error("aggregator: {} snapshots not stored: {}", pending.size(), std::string(stored.status().message()));
      return;
    }
    snapshots_stored.Inc(static_cast<double>(*stored));
    snapshots_duplicate.Inc(static_cast<double>(pending.size() - *stored));
    snapshot_bytes.Inc(static_cast<double>(bytes));
  }

  void OnClose(const std::shared_ptr<Session>& s, const Status& why) override {
    spdlog::info("aggregator: edge {} ({}) disconnected: {}", s->edge(), s->peer(), std::string(why.message()));
    std::lock_guard lock(mu);
    auto [first, last] = sessions.equal_range(s->edge());
    for (auto it = first; it != last; ++it) {
      if (it->second == s) {
        sessions.erase(it);
        break;
      }
    }
    edges_connected.Set(static_cast<double>(sessions.size()));
  }

  // ---- storage thread ----

  void StorageLoop() {
    using Clock = std::chrono::steady_clock;
    const bool prunes = cfg.retention.any();
    Clock::time_point next_prune = prunes ? Clock::now() : Clock::time_point::max();
    Clock::time_point next_expire = confirmer ? Clock::now() : Clock::time_point::max();
    for (;;) {
      std::vector<Item> batch;
      {
        std::unique_lock lock(mu);
        not_empty.wait_until(lock, std::min(next_prune, next_expire),
                             [&] {
                               return stop_storage || !queue.empty() || !snapshot_queue.empty() || second_ready;
                             });
        if (drop_queue || (stop_storage && queue.empty())) {
          snapshots_stopping.Inc(static_cast<double>(snapshot_queue.size()));  // never stored: counted
          snapshot_queue.clear();
          snapshot_queue_bytes = 0;
          return;
        }
      }
      if (Clock::now() >= next_prune) {  // between batches: retention holds the writer for a chunk at a time
        Prune();
        next_prune = Clock::now() + std::chrono::seconds(cfg.retention_interval_s);
      }
      if (Clock::now() >= next_expire) {  // a tenth of idle_s late at most
        ExpireTracks();
        next_expire = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(cfg.confirm.idle_s * 100));
      }
      ProcessSnapshots();  // between report batches: pictures never hold up the reports for long
      if (second && (second_ready || !second_unstored.empty())) StoreSecondModel();
      {
        std::unique_lock lock(mu);
        if (queue.empty()) continue;
        // A Hello alone, or the reports up to the next Hello: a grant commits between the transactions
        // of the reports queued before and after it.
        if (!queue.front().report) {
          batch.push_back(std::move(queue.front()));
          queue.pop_front();
        } else {
          while (!queue.empty() && queue.front().report && batch.size() < static_cast<size_t>(cfg.batch_max)) {
            batch.push_back(std::move(queue.front()));
            queue.pop_front();
          }
        }
        not_full.notify_all();
      }
      if (batch.front().report) {
        ProcessReports(batch);
      } else {
        ProcessHello(batch.front().session);
      }
    }
  }

  static int64_t SteadyNowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
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
      StorageFailed(d.status());
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
      PublishDecisions(decisions, decided, now_wall);
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
      StorageFailed(r.status());
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

  void StorageFailed(const Status& st) {
    storage_errors.Inc();
    std::lock_guard lock(mu);
    storage_error = std::string(st.message());
  }
  void StorageHealthy() {
    std::lock_guard lock(mu);
    storage_error.clear();
  }

  // Grants (durably, before the Welcome) or refuses the epoch of one Hello; evicts older sessions.
  void ProcessHello(const std::shared_ptr<Session>& s) {
    const transport::Hello& h = s->hello();
    // A push route's class the edge's model does not have can never match: said once per (sink, class, edge).
    for (const PushSinkConfig& p : cfg.push) {
      for (const std::string& cls : p.route.classes) {
        if (std::find(h.class_names.begin(), h.class_names.end(), cls) == h.class_names.end() &&
            warned_classes.insert(StrCat(p.route.sink, "\n", cls, "\n", h.edge)).second) {
          spdlog::warn("aggregator: push sink '{}': route class '{}' is not a class of edge {}'s model: its events never "
                       "match it",
                       p.route.sink, cls, h.edge);
        }
      }
    }
    StatusOr<Grant> g =
        store->Admit(h.edge, h.epoch, (h.flags & transport::kHelloPromote) != 0, h.streams, NowNs());
    if (!g.ok()) {
      if (g.status().code() == absl::StatusCode::kOutOfRange) {  // an epoch no grant can follow
        s->Refuse(RejectReason::kProtocolError, 0, StrCat("edge ", h.edge, ": ", g.status().message()));
        return;
      }
      StorageFailed(g.status());
      spdlog::error("aggregator: edge {}: cannot grant an epoch, closing its connection so it says Hello again: {}",
                    h.edge, std::string(g.status().message()));
      s->Close();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // no hot loop against a failing disk
      return;
    }
    StorageHealthy();
    if (g->kind == Grant::kFenced) {
      hellos_fenced.Inc();
      spdlog::warn("aggregator: edge {} ({}): refusing held epoch {}: the current epoch is {}", h.edge, s->peer(),
                   h.epoch, g->epoch);
      s->Refuse(RejectReason::kFenced, g->epoch,
                StrCat("edge ", h.edge, ": epoch ", h.epoch, " is older than ", g->epoch,
                       ", held by a newer instance"));
      return;
    }
    (g->kind == Grant::kNew ? hellos_granted : hellos_readmitted).Inc();
    // Evict the sessions of older epochs first, so no Welcome coexists with an older admitted session.
    std::vector<std::shared_ptr<Session>> older, same;
    {
      std::lock_guard lock(mu);
      auto [first, last] = sessions.equal_range(h.edge);
      for (auto it = first; it != last; ++it) {
        const std::shared_ptr<Session>& o = it->second;
        if (o == s || !o->admitted()) continue;
        if (o->epoch() < g->epoch) older.push_back(o);
        if (o->epoch() == g->epoch) same.push_back(o);
      }
    }
    // The same instance came back (a new session after a break, or a move to a preferred link): its old
    // session ends, and what it still had queued is ignored — the edge re-sends it here, after what the old
    // session stored, so nothing is stored out of order.
    for (const std::shared_ptr<Session>& o : same) {
      spdlog::info("aggregator: edge {}: the session on {} ({}) is superseded by the new one on {} ({})", h.edge,
                   o->link(), o->peer(), s->link(), s->peer());
      o->Supersede();
    }
    for (const std::shared_ptr<Session>& o : older) {
      evicted_sessions.Inc();
      spdlog::warn("aggregator: edge {}: evicting the session of epoch {} ({}): epoch {} was granted to {}", h.edge,
                   o->epoch(), o->peer(), g->epoch, s->peer());
      // The evicted session is told, but not cut: a zombie that wakes up reads why it was fenced instead of a
      // reset, and whatever it still sends is refused as stale (counted) until it closes, or until its
      // silence reaches peer_timeout.
      (void)o->Enqueue(transport::EncodeFrame(transport::Reject{
          RejectReason::kFenced, "", 0, 0, 0, g->epoch,
          StrCat("edge ", h.edge, ": epoch ", o->epoch(), " was superseded by epoch ", g->epoch,
                 ", granted to a newer instance (", s->peer(), ")")}));
    }
    spdlog::info("aggregator: edge {} ({}): {} epoch {}", h.edge, s->peer(),
                 g->kind == Grant::kNew ? "granted" : "re-admitted", g->epoch);
    current_epochs[h.edge] = g->epoch;
    {
      std::lock_guard lock(mu);
      // "replaced": a new instance took the edge id over from a granted epoch — a restart, or a standby's takeover.
      last_grant[h.edge] = {g->kind == Grant::kReadmitted                      ? "readmitted"
                            : (h.flags & transport::kHelloPromote) != 0 ? "promote"
                            : g->previous_epoch > 0                     ? "replaced"
                                                                         : "new",
                            NowNs()};
    }
    s->Admit(transport::Welcome{g->epoch, std::move(g->streams)});
  }

  StreamMetrics& MetricsFor(const Report& r) {
    auto key = std::make_pair(r.edge, r.stream);
    auto it = stream_metrics.find(key);
    if (it != stream_metrics.end()) return it->second;
    const metrics::Labels l{{"edge", r.edge}, {"stream", r.stream}};
    StreamMetrics m{
        &registry.GetCounter("vigil_aggregator_frames_total", "New frames stored (events and progress)", l),
        &registry.GetCounter("vigil_aggregator_events_total", "Events stored", l),
        &registry.GetCounter("vigil_aggregator_dropped_frames_total", "Frames the edge numbered but did not process", l),
        &registry.GetCounter("vigil_aggregator_lost_frames_total", "Frames lost when an edge instance died", l),
        &registry.GetCounter("vigil_aggregator_duplicate_frames_total", "Re-sent frames ignored", l),
        &registry.GetCounter("vigil_aggregator_stale_rejected_total", "Reports refused for a stale epoch", l),
        &registry.GetHistogram("vigil_aggregator_frame_to_stored_seconds",
                               "Capture on the edge to committed at the aggregator", metrics::LatencyBuckets(), l)};
    return stream_metrics.emplace(key, m).first->second;
  }

  // Stores a batch of reports (no Hello among them) in one transaction, then queues the answers: one
  // Enqueue per session. No socket I/O here.
  void ProcessReports(std::vector<Item>& batch) {
    // Reports of a superseded session are not stored: the edge re-sends them on its new session.
    std::erase_if(batch, [this](const Item& item) {
      if (!item.session->superseded()) return false;
      superseded_reports.Inc();
      return true;
    });
    if (batch.empty()) return;
    const int64_t now = NowNs();
    std::vector<PendingReport> reports;
    reports.reserve(batch.size());
    for (const Item& item : batch) reports.push_back({&*item.report, &item.session->hello().class_names});
    // Confirmation: each event's verdict and track ids go into the transaction that stores it, and so do the
    // decisions on earlier events its frame brought.
    std::vector<EventVerdict> verdicts;
    std::vector<EventDecision> decisions;
    std::vector<std::pair<EventDecision, size_t>> handoff;  // to the second model once committed
    std::vector<int64_t> marked;                             // tracks first confirmed by this batch
    if (confirmer) {
      const auto c0 = std::chrono::steady_clock::now();
      confirmer->Begin();
      verdicts.reserve(batch.size());
      std::vector<ObservedReport> observed;
      observed.reserve(batch.size());
      for (const Item& item : batch) {
        const Report& r = *item.report;
        auto ep = current_epochs.find(r.edge);
        observed.push_back({&r, &item.session->hello().class_names,
                            ep != current_epochs.end() && ep->second == r.epoch});
      }
      std::vector<std::optional<EventVerdict>> got = confirmer->ObserveBatch(observed, SteadyNowNs());
      for (size_t i = 0; i < batch.size(); ++i) {
        if (got[i]) {
          verdicts.push_back(std::move(*got[i]));
          reports[i].verdict = &verdicts.back();  // reserved: never moves
        }
      }
      decisions = confirmer->TakeDecisions();
      RouteToSecondModel(reports, verdicts, decisions, &handoff);
      MarkNewTracks(verdicts, decisions, &marked);
      confirm_seconds.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    }
    const auto t0 = std::chrono::steady_clock::now();
    DecisionResult decided;
    StatusOr<std::vector<ApplyResult>> results = store->Apply(reports, now, decisions, &decided);
    commit_seconds.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (confirmer) {
      if (results.ok()) {
        confirmer->Commit();
        HandOff(handoff);
        for (size_t i = 0; i < batch.size(); ++i) {
          if (reports[i].verdict != nullptr && (*results)[i].event_stored) {
            EventStates(reports[i].verdict->state, "stored").Inc();
          }
        }
        CountDecided(decided);
        PublishDecisions(decisions, decided, now);
      } else {
        confirmer->Rollback();
        UnmarkTracks(marked);
      }
    }
    if (!results.ok()) {
      StorageFailed(results.status());
      spdlog::error("aggregator: storing {} reports failed, closing their connections so the edges re-send: {}",
                    reports.size(), std::string(results.status().message()));
      for (const Item& item : batch) item.session->Close();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // no hot loop against a failing disk
      return;
    }
    StorageHealthy();
    const int64_t committed = NowNs();
    std::map<Session*, std::pair<std::shared_ptr<Session>, std::string>> replies;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Report& r = *batch[i].report;
      const ApplyResult& res = (*results)[i];
      StreamMetrics& m = MetricsFor(r);
      auto& [session, frames] = replies[batch[i].session.get()];
      session = batch[i].session;
      if (res.kind == ApplyResult::kStale) {
        stale_reports.Inc();
        m.stale->Inc();
        transport::AppendFrame(
            transport::Reject{RejectReason::kStaleEpoch, r.stream, r.run, r.seq_first, r.seq_last, res.edge_epoch,
                              res.edge_epoch == 0
                                  ? StrCat("edge ", r.edge, ": no epoch granted")
                                  : StrCat("edge ", r.edge, ": epoch ", r.epoch, " is not the current epoch ",
                                           res.edge_epoch, " (held by a newer instance)")},
            &frames);
        continue;
      }
      (res.kind == ApplyResult::kStored ? stored_reports : duplicate_reports).Inc();
      m.frames->Inc(static_cast<double>(res.new_frames));
      m.dropped->Inc(static_cast<double>(res.dropped_frames));
      m.lost->Inc(static_cast<double>(res.lost_frames));
      m.duplicates->Inc(static_cast<double>(res.duplicate_frames));
      if (res.event_stored) m.events->Inc();
      if (res.new_frames > 0 && r.capture_ns > 0) {
        m.frame_to_stored->Observe(static_cast<double>(committed - r.capture_ns) * 1e-9);
      }
      transport::AppendFrame(transport::Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, res.contiguous_through},
                             &frames);
    }
    // A full or closed session is closed by Enqueue: its edge reconnects and re-sends.
    for (auto& [raw, reply] : replies) (void)reply.first->Enqueue(std::move(reply.second));
    if (decided.pushes_queued > 0 ||
        std::any_of(results->begin(), results->end(), [](const ApplyResult& r) { return r.pushes_queued > 0; })) {
      for (auto& p : pushers) p->Wake();
    }
    if (std::any_of(results->begin(), results->end(), [](const ApplyResult& r) { return r.event_stored; })) {
      std::lock_guard lock(live_mu);
      ++live_version;
      live_cv.notify_all();
    }
  }

  // ---- The live channel (/api/events/live): Server-Sent Events of each stored event ----

  std::mutex live_mu;
  std::condition_variable live_cv;
  uint64_t live_version = 0;   // GUARDED_BY(live_mu): bumped by every commit that stored an event or decided one
  // GUARDED_BY(live_mu) the newest decisions on pending events (JSON), numbered from 1: the live channel sends them
  // as `event: state` (the dashboard updates the row); the oldest go beyond kMaxDecidedFeed.
  std::deque<std::pair<uint64_t, std::string>> decided_feed;
  uint64_t decided_seq = 0;  // GUARDED_BY(live_mu)
  static constexpr size_t kMaxDecidedFeed = 4096;

  // After a commit: the decisions that decided their event go to the live channel.
  void PublishDecisions(const std::vector<EventDecision>& decisions, const DecisionResult& decided, int64_t at_ns) {
    std::lock_guard lock(live_mu);
    bool any = false;
    for (size_t i = 0; i < decisions.size() && i < decided.applied.size(); ++i) {
      if (!decided.applied[i]) continue;
      const EventDecision& d = decisions[i];
      json labels = json::array();
      for (const DetectionUpdate& u : d.detections) {
        labels.push_back({{"index", u.index}, {"label", u.label}, {"second_label", u.second_label},
                          {"second_score", u.second_score}});
      }
      const json j = {{"key", StrCat(d.edge, "/", d.stream, "/", d.run, "/", d.seq)},
                      {"edge", d.edge},
                      {"stream", d.stream},
                      {"run", d.run},
                      {"seq", d.seq},
                      {"state", ToString(d.state)},
                      {"state_reason", d.reason},
                      {"decided_ns", at_ns},
                      {"detections", std::move(labels)}};
      decided_feed.emplace_back(++decided_seq, j.dump(-1, ' ', false, json::error_handler_t::replace));
      if (decided_feed.size() > kMaxDecidedFeed) decided_feed.pop_front();
      any = true;
    }
    if (any) {
      ++live_version;
      live_cv.notify_all();
    }
  }
  bool live_closing = false;   // GUARDED_BY(live_mu)
  std::atomic<int> live_streams{0};
  static constexpr int kMaxLiveStreams = 8;  // each holds an HTTP worker thread

  void LiveEvents(const httplib::Request& req, httplib::Response& res) {
    int64_t since = -1;
    std::string error;
    if (!ParamInt(req, "since_seq", 0, INT64_MAX, &since, &error)) return Error(res, 400, error);
    if (since < 0) {  // from now on: after the newest stored event
      EventQuery newest;
      newest.newest_first = true;
      newest.limit = 1;
      StatusOr<std::vector<StoredEvent>> last = store->Events(newest);
      if (!last.ok()) return Error(res, 500, std::string(last.status().message()));
      since = last->empty() ? 0 : last->front().id;
    }
    if (live_streams.fetch_add(1) >= kMaxLiveStreams) {
      live_streams.fetch_sub(1);
      return Error(res, 503, StrCat("already ", kMaxLiveStreams, " live channels open: close one"));
    }
    res.set_header("Cache-Control", "no-cache");
    auto cursor = std::make_shared<int64_t>(since);
    auto decided_cursor = std::make_shared<uint64_t>(0);  // decisions from the connection on
    auto opened = std::make_shared<bool>(false);
    {
      std::lock_guard lock(live_mu);
      *decided_cursor = decided_seq;
    }
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, cursor, decided_cursor, opened](size_t, httplib::DataSink& sink) {
          if (!*opened) {  // says the channel is open: what is stored or decided from now on comes here
            *opened = true;
            static constexpr char kOpen[] = ": open\n\n";
            if (!sink.write(kOpen, sizeof kOpen - 1)) return false;
          }
          uint64_t version;
          {
            std::lock_guard lock(live_mu);
            if (live_closing) return false;
            version = live_version;
          }
          EventQuery q;
          q.since_id = *cursor;
          q.limit = 200;
          StatusOr<std::vector<StoredEvent>> events = store->Events(q);
          if (!events.ok()) return false;
          std::string out;
          for (const StoredEvent& e : *events) {
            out += StrCat("id: ", e.id, "\nevent: event\ndata: ", EventJson(e), "\n\n");
            *cursor = e.id;
          }
          {  // decisions on pending events (confirm.h): after the events, so a row exists before its update
            std::lock_guard lock(live_mu);
            for (const auto& [n, body] : decided_feed) {
              if (n <= *decided_cursor) continue;
              out += StrCat("event: state\ndata: ", body, "\n\n");
              *decided_cursor = n;
            }
          }
          if (out.empty()) {
            std::unique_lock lock(live_mu);
            live_cv.wait_for(lock, std::chrono::seconds(15),
                             [&] { return live_closing || live_version != version; });
            if (live_closing) return false;
            if (live_version == version) out = ": keepalive\n\n";  // idle: proves the channel is alive
          }
          return out.empty() || sink.write(out.data(), out.size());
        },
        [this](bool) { live_streams.fetch_sub(1); });
  }

  // The dashboard's files (src/aggregator/dashboard/, compiled in: no build step, nothing fetched).
  void Dashboard() {
    // Browsers ask for it on every page: an empty answer, not a refusal in the log.
    http->Get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
    for (size_t i = 0; i < kDashboardAssetCount; ++i) {
      const DashboardAsset& a = kDashboardAssets[i];
      const std::string path = std::string(a.path) == "/index.html" ? "/" : StrCat("/ui", a.path);
      http->Get(path, [a](const httplib::Request&, httplib::Response& res) {
        res.set_header("Cache-Control", "no-cache");
        res.set_header("Content-Security-Policy",
                       "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'");
        res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.mime);
      });
    }
  }

  // ---- HTTP ----

  void Routes() {
    http->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      json j;
      {
        std::lock_guard lock(mu);
        j = {{"status", storage_error.empty() ? "ok" : "degraded"},
             {"db", store->path()},
             {"db_engine", store->engine()},
             {"schema_version", store->schema_version()},
             {"edges_connected", sessions.size()},
             {"queue_depth", queue.size()}};
        if (!storage_error.empty()) j["error"] = storage_error;
      }
      res.status = j["status"] == "ok" ? 200 : 503;
      res.set_content(Dump(j), "application/json");
    });
    http->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      for (const auto& p : pushers) {  // the outbox depth, read at the scrape
        if (StatusOr<uint64_t> depth = store->PushDepth(p->sink()); depth.ok()) {
          registry.GetGauge("vigil_aggregator_push_outbox_depth", "Stored events waiting for a push sink",
                            {{"sink", p->sink()}})
              .Set(static_cast<double>(*depth));
        }
      }
      res.set_content(registry.Render(), metrics::Registry::kContentType);
    });
    http->Get("/api/dead_letters", [this](const httplib::Request& req, httplib::Response& res) { DeadLetters(req, res); });
    // POST /api/dead_letters/replay?sink=NAME: the sink's dead letters go back into its outbox (after it was fixed).
    http->Post("/api/dead_letters/replay", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string sink = req.get_param_value("sink");
      auto p = std::find_if(pushers.begin(), pushers.end(), [&](const auto& x) { return x->sink() == sink; });
      if (p == pushers.end()) return Error(res, 400, StrCat("sink: '", sink, "' is not a push sink of this aggregator"));
      StatusOr<uint64_t> n = store->ReplayDeadLetters(sink, NowNs());
      if (!n.ok()) return Error(res, 500, std::string(n.status().message()));
      spdlog::info("aggregator: push sink '{}': {} dead letter(s) queued again", sink, *n);
      (*p)->Wake();
      res.set_content(Dump({{"sink", sink}, {"replayed", *n}}), "application/json");
    });
    http->Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) { Events(req, res); });
    http->Get("/api/events/live",
              [this](const httplib::Request& req, httplib::Response& res) { LiveEvents(req, res); });
    http->Get(R"(/api/events/([^/]+)/snapshots)",
              [this](const httplib::Request& req, httplib::Response& res) { EventSnapshotList(req, res); });
    http->Get(R"(/api/events/([^/]+)/snapshot\.jpg)",
              [this](const httplib::Request& req, httplib::Response& res) { EventSnapshot(req, res); });
    http->Get("/api/streams/snapshot.jpg",
              [this](const httplib::Request& req, httplib::Response& res) { LatestStreamSnapshot(req, res); });
    Dashboard();
    http->Get("/api/stats", [this](const httplib::Request&, httplib::Response& res) { Stats(res); });
  }

  static void Error(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(Dump({{"error", message}}), "application/json");
  }

  void DeadLetters(const httplib::Request& req, httplib::Response& res) {
    int64_t limit = 100;
    std::string error;
    if (!ParamInt(req, "limit", 1, 10000, &limit, &error)) return Error(res, 400, error);
    StatusOr<std::vector<DeadLetter>> letters = store->DeadLetters(req.get_param_value("sink"), static_cast<int>(limit));
    if (!letters.ok()) return Error(res, 500, std::string(letters.status().message()));
    json list = json::array();
    for (const DeadLetter& l : *letters) {
      list.push_back({{"sink", l.sink},
                      {"attempts", l.attempts},
                      {"last_error", l.last_error},
                      {"dead_ns", l.dead_ns},
                      {"event", json::parse(EventJson(l.event))}});
    }
    res.set_content(Dump({{"dead_letters", std::move(list)}}), "application/json");
  }

  void Events(const httplib::Request& req, httplib::Response& res) {
    EventQuery q;
    int64_t limit = 100;
    std::string error;
    if (!ParamInt(req, "since_seq", 0, INT64_MAX, &q.since_id, &error) ||
        !ParamInt(req, "before_seq", 1, INT64_MAX, &q.before_id, &error) ||
        !ParamInt(req, "limit", 1, 10000, &limit, &error)) {
      return Error(res, 400, error);
    }
    const std::string order = req.get_param_value("order");
    if (order != "" && order != "asc" && order != "desc") {
      return Error(res, 400, StrCat("order: '", order, "' is not asc or desc"));
    }
    q.newest_first = order == "desc";
    q.label = req.get_param_value("class");
    q.severity = req.get_param_value("severity");
    if (!q.severity.empty() && q.severity != "none" && q.severity != "info" && q.severity != "warning" &&
        q.severity != "critical") {
      return Error(res, 400, StrCat("severity: '", q.severity, "' is not none, info, warning or critical"));
    }
    q.limit = static_cast<int>(limit);
    if (req.has_param("since_time")) {
      const std::string v = req.get_param_value("since_time");
      double seconds = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
      if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(seconds) || std::abs(seconds) > 9e9) {
        return Error(res, 400, StrCat("since_time: '", v, "' is not a Unix time in seconds (e.g. 1700000000.5)"));
      }
      q.since_ns = static_cast<int64_t>(std::llround(seconds * 1e9));
    }
    q.edge = req.get_param_value("edge");
    q.stream = req.get_param_value("stream");
    q.state = req.get_param_value("state");
    if (EventState ignored; !q.state.empty() && !ParseEventState(q.state, &ignored)) {
      return Error(res, 400, StrCat("state: '", q.state, "' is not pending, confirmed or rejected"));
    }
    StatusOr<std::vector<StoredEvent>> events = store->Events(q);
    if (!events.ok()) return Error(res, 500, std::string(events.status().message()));
    json list = json::array();
    for (const StoredEvent& e : *events) {
      json j = json::parse(EventJson(e));  // as a push sink gets it, and how many pictures it has
      j["snapshots"] = e.snapshots;
      list.push_back(std::move(j));
    }
    json body = {{"events", std::move(list)}};
    if (q.newest_first) {  // the next (older) page: before_seq = the oldest id of this one
      body["next_before_seq"] = events->empty() ? q.before_id : events->back().id;
    } else {
      body["next_since_seq"] = events->empty() ? q.since_id : events->back().id;
    }
    res.set_content(Dump(body), "application/json");
  }

  // The event named by the route's id (req.matches[1]); nullopt after answering 400/404/500.
  std::optional<StoredEvent> EventOf(const httplib::Request& req, httplib::Response& res) {
    int64_t id = 0;
    const std::string id_text = req.matches[1].str();
    auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
    if (ec != std::errc() || end != id_text.data() + id_text.size() || id < 1) {
      Error(res, 400, StrCat("event id '", id_text.substr(0, 40), "' is not an event id (1, 2, ...)"));
      return std::nullopt;
    }
    EventQuery q;
    q.since_id = id - 1;
    q.before_id = id + 1;
    q.limit = 1;
    StatusOr<std::vector<StoredEvent>> events = store->Events(q);
    if (!events.ok()) {
      Error(res, 500, std::string(events.status().message()));
      return std::nullopt;
    }
    if (events->empty()) {
      Error(res, 404, StrCat("event ", id, ": no such event"));
      return std::nullopt;
    }
    return std::move(events->front());
  }

  // GET /api/events/{id}/snapshots: the pictures stored for the event (without their bytes).
  void EventSnapshotList(const httplib::Request& req, httplib::Response& res) {
    std::optional<StoredEvent> ev = EventOf(req, res);
    if (!ev) return;
    StatusOr<std::vector<StoredSnapshot>> pics = store->Snapshots(ev->edge, ev->stream, ev->run, ev->seq, false);
    if (!pics.ok()) return Error(res, 500, std::string(pics.status().message()));
    json list = json::array();
    for (const StoredSnapshot& p : *pics) {
      list.push_back({{"box", p.box},
                      {"region", {p.x, p.y, p.width, p.height}},
                      {"width", p.out_width},
                      {"height", p.out_height},
                      {"stored_ns", p.stored_ns},
                      {"url", StrCat("/api/events/", ev->id, "/snapshot.jpg?box=", p.box)}});
    }
    res.set_content(Dump({{"event", ev->id}, {"snapshots", std::move(list)}}), "application/json");
  }

  // GET /api/events/{id}/snapshot.jpg?box=-1&boxes=0: one stored picture of the event (box -1: the frame; N: the
  // crop of detection N), with the event's boxes and labels drawn when boxes=1.
  void EventSnapshot(const httplib::Request& req, httplib::Response& res) {
    int64_t box = -1, boxes = 0;
    std::string error;
    if (!ParamInt(req, "box", -1, static_cast<int64_t>(transport::kMaxDetections) - 1, &box, &error) ||
        !ParamInt(req, "boxes", 0, 1, &boxes, &error)) {
      return Error(res, 400, error);
    }
    std::optional<StoredEvent> found = EventOf(req, res);
    if (!found) return;
    const StoredEvent& ev = *found;
    StatusOr<std::vector<StoredSnapshot>> pics = store->Snapshots(ev.edge, ev.stream, ev.run, ev.seq, true);
    if (!pics.ok()) return Error(res, 500, std::string(pics.status().message()));
    auto it = std::find_if(pics->begin(), pics->end(), [&](const StoredSnapshot& p) { return p.box == box; });
    if (it == pics->end()) {
      return Error(res, 404, StrCat("event ", ev.id, ": no ", box < 0 ? std::string("frame picture") : StrCat("crop of box ", box),
                                    " stored (", pics->size(), " pictures)"));
    }
    SendPicture(res, *it, boxes != 0 ? &ev : nullptr);
  }

  // GET /api/streams/snapshot.jpg?edge=E&stream=S&boxes=0: the newest frame picture of a stream.
  void LatestStreamSnapshot(const httplib::Request& req, httplib::Response& res) {
    const std::string edge = req.get_param_value("edge"), stream = req.get_param_value("stream");
    int64_t boxes = 0;
    std::string error;
    if (edge.empty() || stream.empty()) return Error(res, 400, "edge and stream are required");
    if (!ParamInt(req, "boxes", 0, 1, &boxes, &error)) return Error(res, 400, error);
    StatusOr<std::optional<StoredSnapshot>> pic = store->LatestSnapshot(edge, stream);
    if (!pic.ok()) return Error(res, 500, std::string(pic.status().message()));
    if (!pic->has_value()) {
      return Error(res, 404, StrCat(edge, "/", stream, ": no snapshot stored (an unknown stream, snapshots off for it, "
                                    "or no event yet)"));
    }
    const StoredSnapshot& p = **pic;
    std::optional<StoredEvent> ev;
    if (boxes != 0) {  // its event, by its frame (none yet: a picture may arrive before its event)
      EventQuery q;
      q.edge = edge;
      q.stream = stream;
      q.by_frame = true;
      q.run = p.run;
      q.seq = p.seq;
      q.limit = 1;
      StatusOr<std::vector<StoredEvent>> events = store->Events(q);
      if (!events.ok()) return Error(res, 500, std::string(events.status().message()));
      if (!events->empty()) ev = std::move(events->front());
    }
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Vigil-Frame", StrCat(p.run, "/", p.seq));
    SendPicture(res, p, ev ? &*ev : nullptr);
  }

  // The picture's JPEG, with `ev`'s detections drawn on it (in the picture's source region) when given.
  static void SendPicture(httplib::Response& res, const StoredSnapshot& p, const StoredEvent* ev) {
    if (ev == nullptr) return res.set_content(p.jpeg, "image/jpeg");
#if VIGIL_HAVE_TURBOJPEG
    std::vector<video::LabeledBox> boxes;
    for (const StoredDetection& d : ev->detections) {
      boxes.push_back({d.x1 - static_cast<float>(p.x), d.y1 - static_cast<float>(p.y), d.x2 - static_cast<float>(p.x),
                       d.y2 - static_cast<float>(p.y), d.class_id, d.label, d.score});
    }
    StatusOr<std::string> drawn =
        video::DrawBoxes(p.jpeg, static_cast<int>(p.width), static_cast<int>(p.height), boxes, 85);
    if (!drawn.ok()) return Error(res, 500, StrCat("drawing the boxes: ", drawn.status().message()));
    res.set_content(*drawn, "image/jpeg");
#else
    Error(res, 501, "boxes=1: this vigil was built without libturbojpeg (it cannot draw on a JPEG)");
#endif
  }

  void Stats(httplib::Response& res) {
    StatusOr<StoreStats> s = store->Stats();
    if (!s.ok()) return Error(res, 500, std::string(s.status().message()));
    std::set<std::string> live;
    std::map<std::string, std::set<std::string>> links;  // edge → the links of its admitted sessions
    std::map<std::string, std::pair<std::string, int64_t>> grants;
    std::map<std::pair<std::string, std::string>, transport::SourceState> sources;
    {
      std::lock_guard lock(mu);
      for (const auto& [edge, session] : sessions) {
        live.insert(edge);
        if (session->admitted() && !session->superseded()) links[edge].insert(session->link());
      }
      grants = last_grant;
      sources = source_states;
    }
    json edges = json::array(), streams = json::array();
    for (const EdgeStats& e : s->edges) {
      edges.push_back({{"edge", e.edge},
                       {"epoch", e.epoch},
                       {"connected", live.count(e.edge) > 0},
                       {"links", links.count(e.edge) ? json(links[e.edge]) : json::array()},
                       {"last_grant", grants.count(e.edge) ? json{{"kind", grants[e.edge].first},
                                                                  {"at_ns", grants[e.edge].second}}
                                                           : json(nullptr)},
                       {"first_seen_ns", e.first_seen_ns},
                       {"last_seen_ns", e.last_seen_ns},
                       {"granted_ns", e.granted_ns},
                       {"streams", e.streams},
                       {"frames", e.frames},
                       {"events", e.events},
                       {"dropped", e.dropped},
                       {"lost", e.lost},
                       {"missing", e.missing},
                       {"duplicates", e.duplicates},
                       {"stale_rejected", e.stale_rejected}});
    }
    for (const StreamStats& st : s->streams) {
      json runs = json::array();
      for (const RunStats& r : st.runs) {
        json gaps = json::array();
        for (const SeqRange& g : r.gaps) gaps.push_back({g.first, g.last});
        runs.push_back({{"run", r.run},
                        {"frames", r.frames},
                        {"events", r.events},
                        {"dropped", r.dropped},
                        {"lost", r.lost},
                        {"contiguous_through", r.contiguous_through},
                        {"last_seq", r.last_seq},
                        {"missing", r.missing},
                        {"gaps", std::move(gaps)}});
      }
      auto src = sources.find({st.edge, st.stream});
      streams.push_back({{"edge", st.edge},
                         {"stream", st.stream},
                         {"source", src == sources.end() ? json(nullptr) : json(std::string(ToString(src->second)))},
                         {"epoch", st.epoch},
                         {"frames", st.frames},
                         {"events", st.events},
                         {"dropped", st.dropped},
                         {"lost", st.lost},
                         {"missing", st.missing},
                         {"duplicates", st.duplicates},
                         {"stale_rejected", st.stale_rejected},
                         {"runs", std::move(runs)}});
      sources.erase({st.edge, st.stream});
    }
    // Streams an edge runs that have stored nothing yet (a camera that never connected): listed with their source.
    for (const auto& [key, state] : sources) {
      streams.push_back({{"edge", key.first}, {"stream", key.second}, {"source", std::string(ToString(state))},
                         {"epoch", 0}, {"frames", 0}, {"events", 0}, {"dropped", 0}, {"lost", 0}, {"missing", 0},
                         {"duplicates", 0}, {"stale_rejected", 0}, {"runs", json::array()}});
    }
    res.set_content(Dump({{"edges", std::move(edges)}, {"streams", std::move(streams)}}), "application/json");
  }

  // The cuda_ipc link's ring counters (process-wide), mirrored at scrape time.
  void AddCudaIpcMetrics() {
    struct Mirror {
      std::mutex mu;
      transport::CudaIpcCounters last;  // GUARDED_BY(mu)
    };
    auto mirror = std::make_shared<Mirror>();
    auto counter = [&](const char* name, const char* help) { return &registry.GetCounter(name, help, {}); };
    metrics::Counter* offered = counter("vigil_cuda_ipc_rings_offered_total", "cuda_ipc sessions offered a ring");
    metrics::Counter* failed =
        counter("vigil_cuda_ipc_ring_failures_total", "cuda_ipc sessions whose ring could not be set up");
    metrics::Counter* slots = counter("vigil_cuda_ipc_slots_total", "cuda_ipc ring slots taken and checked");
    metrics::Counter* rejected =
        counter("vigil_cuda_ipc_slots_rejected_total", "cuda_ipc ring slots that failed a check (not stored)");
    metrics::Counter* device =
        counter("vigil_cuda_ipc_device_reports_total", "Reports whose rows came from the edge's device memory");
    metrics::Counter* bytes = counter("vigil_cuda_ipc_bytes_total", "cuda_ipc slot bytes copied to the host");
    registry.AddCollectHook([=] {
      const transport::CudaIpcCounters now = transport::GetCudaIpcCounters();
      std::lock_guard lock(mirror->mu);
      transport::CudaIpcCounters& last = mirror->last;
      auto delta = [](uint64_t a, uint64_t b) { return static_cast<double>(a - b); };
      offered->Inc(delta(now.rings_offered, last.rings_offered));
      failed->Inc(delta(now.ring_failures, last.ring_failures));
      slots->Inc(delta(now.slots_received, last.slots_received));
      rejected->Inc(delta(now.slots_rejected, last.slots_rejected));
      device->Inc(delta(now.device_reports, last.device_reports));
      bytes->Inc(delta(now.bytes_received, last.bytes_received));
      last = now;
    });
  }

  // The ucx link's rows messages (process-wide counters), mirrored at scrape time.
  void AddUcxMetrics() {
    struct Mirror {
      std::mutex mu;
      transport::UcxCounters last;  // GUARDED_BY(mu)
    };
    auto mirror = std::make_shared<Mirror>();
    auto counter = [&](const char* name, const char* help) { return &registry.GetCounter(name, help, {}); };
    metrics::Counter* rows = counter("vigil_ucx_rows_messages_total",
                                     "ucx Reports whose rows came apart from their frame (from the edge's GPU memory)");
    metrics::Counter* into_device =
        counter("vigil_ucx_rows_into_device_total", "… of them received into this aggregator's GPU memory (ucx_device)");
    metrics::Counter* rejected =
        counter("vigil_ucx_rows_rejected_total", "ucx rows messages that failed a check (not stored; session ended)");
    metrics::Gauge* cuda =
        &registry.GetGauge("vigil_ucx_cuda_memory", "1 when the UCX loaded takes CUDA memory (CUDA transports)", {});
    registry.AddCollectHook([=] {
      const transport::UcxCounters now = transport::GetUcxCounters();
      std::lock_guard lock(mirror->mu);
      transport::UcxCounters& last = mirror->last;
      auto delta = [](uint64_t a, uint64_t b) { return static_cast<double>(a - b); };
      rows->Inc(delta(now.rows_messages_received, last.rows_messages_received));
      into_device->Inc(delta(now.rows_received_into_device, last.rows_received_into_device));
      rejected->Inc(delta(now.rows_messages_rejected, last.rows_messages_rejected));
      cuda->Set(now.cuda_memory_workers > 0 ? 1 : 0);
      last = now;
    });
  }

  // Mirrors each receiver's counters into the registry at scrape time, labelled by link.
  void AddTransportMetrics(transport::Receiver* rx) {
    struct Mirror {
      std::mutex mu;
      transport::ReceiverStats last;  // GUARDED_BY(mu)
    };
    auto mirror = std::make_shared<Mirror>();
    const std::string link(rx->kind());
    const char* conn_help = "Edge connections by outcome";
    auto conn = [&](const char* result) -> metrics::Counter* {
      return &registry.GetCounter("vigil_transport_connections_total", conn_help, {{"link", link}, {"result", result}});
    };
    const char* disc_help = "Edge connections closed by the aggregator";
    auto disc = [&](const char* reason) -> metrics::Counter* {
      return &registry.GetCounter("vigil_transport_disconnects_total", disc_help, {{"link", link}, {"reason", reason}});
    };
    struct Counters {
      metrics::Counter *accepted, *refused, *authenticated, *protocol, *timeouts, *gaps, *repeated, *bytes, *frames;
    } c{conn("accepted"),
        conn("refused"),
        conn("authenticated"),
        disc("protocol_error"),
        disc("timeout"),
        disc("sequence_gap"),
        &registry.GetCounter("vigil_transport_repeated_reports_total", "Duplicated report frames ignored",
                             {{"link", link}}),
        &registry.GetCounter("vigil_transport_received_bytes_total", "Bytes received from edges", {{"link", link}}),
        &registry.GetCounter("vigil_transport_received_frames_total", "Protocol frames received", {{"link", link}})};
    // Every reason exists from the start (at 0), so a dashboard's rate() sees the first rejection.
    std::map<std::string, metrics::Counter*> rejected;
    for (const char* reason : {transport::kRejectAddress, transport::kRejectUnknownEdge, transport::kRejectBadProof,
                               transport::kRejectNoProof, transport::kRejectHandshakeTimeout,
                               transport::kRejectMalformed, transport::kRejectVersion, transport::kRejectTls,
                               transport::kRejectChallengeRefused, transport::kRejectPeerCredentials,
                               transport::kRejectRingUnavailable, transport::kRejectRingRefused}) {
      rejected[reason] = &registry.GetCounter("vigil_transport_rejected_total",
                                              "Connections refused before their session began, by reason",
                                              {{"link", link}, {"reason", reason}});
    }
    registry.AddCollectHook([=, this] {
      {
        std::lock_guard lock(mu);
        queue_depth.Set(static_cast<double>(queue.size()));
      }
      const transport::ReceiverStats now = rx->Stats();
      std::lock_guard lock(mirror->mu);
      transport::ReceiverStats& last = mirror->last;
      auto delta = [](uint64_t a, uint64_t b) { return static_cast<double>(a - b); };
      c.accepted->Inc(delta(now.accepted, last.accepted));
      c.refused->Inc(delta(now.refused, last.refused));
      c.authenticated->Inc(delta(now.authenticated, last.authenticated));
      c.protocol->Inc(delta(now.protocol_errors - now.sequence_gaps, last.protocol_errors - last.sequence_gaps));
      c.timeouts->Inc(delta(now.timeouts, last.timeouts));
      c.gaps->Inc(delta(now.sequence_gaps, last.sequence_gaps));
      c.repeated->Inc(delta(now.repeated_reports, last.repeated_reports));
      c.bytes->Inc(delta(now.bytes, last.bytes));
      c.frames->Inc(delta(now.frames, last.frames));
      for (const auto& [reason, n] : now.rejected) {
        auto it = rejected.find(reason);
        if (it == rejected.end()) continue;
        auto was = last.rejected.find(reason);
        it->second->Inc(delta(n, was == last.rejected.end() ? 0 : was->second));
      }
      last = now;
    });
  }

  void Shutdown(bool crash) {
    if (stopped) return;
    stopped = true;
    {
      std::lock_guard lock(mu);
      closing = true;
      stop_storage = true;
      drop_queue = crash;
      not_empty.notify_all();
      not_full.notify_all();
    }
    {
      std::lock_guard lock(live_mu);  // the live channels end (their HTTP threads are free for stop())
      live_closing = true;
      live_cv.notify_all();
    }
    if (crash) {  // cut the edges first: no ack for anything queued
      for (auto& rx : receivers) rx->Stop();
    }
    if (classifier_thread.joinable()) {  // what it has not decided stays pending: resumed at the next start
      {
        std::lock_guard lock(second_mu);
        second_stop = true;
        second_cv.notify_all();
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
        d.store.get(), p.route.sink, std::move(delivery), p.retry, SystemClock(),
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
  d.Routes();
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
                           transport::Receiver::Start(o, std::move(*listener), &d));
    d.AddTransportMetrics(rx.get());
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
    d.AddUcxMetrics();
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
    d.AddCudaIpcMetrics();
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
