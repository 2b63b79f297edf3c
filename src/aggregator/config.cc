#include "aggregator/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "vigil/aggregator/aggregator.h"
#include "vigil/common/config.h"

namespace vigil::aggregator {

std::optional<int> ParseCudaDevice(const std::string& s) {
  if (s.rfind("cuda:", 0) != 0 || s.size() == 5 || s.size() > 9) return std::nullopt;
  int n = 0;
  for (size_t i = 5; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    n = n * 10 + (s[i] - '0');
  }
  return n;
}

namespace {

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

}  // namespace


StatusOr<AggregatorConfig> LoadAggregatorConfig(const std::string& path) {
  VIGIL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Load(path));
  return FromFile(file);
}

StatusOr<AggregatorConfig> ParseAggregatorConfig(std::string_view yaml, const std::string& name) {
  VIGIL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Parse(yaml, name));
  return FromFile(file);
}

}  // namespace vigil::aggregator
