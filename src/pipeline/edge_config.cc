#include "vigil/pipeline/edge_config.h"

#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include <absl/strings/str_join.h>

#include "vigil/common/config.h"
#include "vigil/transport/protocol.h"
#include "vigil/video/jpeg.h"
#include "vigil/video/source.h"

namespace vigil::pipeline {
namespace {

void ReadPolygon(const ConfigValue& v, Polygon* out) {
  std::vector<ConfigValue> points = v.Items();
  if (v.IsSequence() && points.size() < 3) v.Error("a polygon needs at least 3 points");
  for (const ConfigValue& p : points) {
    std::vector<ConfigValue> xy = p.Items();
    if (!p.IsSequence()) continue;
    if (xy.size() != 2) {
      p.Error("a point is [x, y]");
      continue;
    }
    Point pt;
    if (xy[0].As(&pt.x, -1e9, 1e9) && xy[1].As(&pt.y, -1e9, 1e9)) out->push_back(pt);
  }
}

void ReadRules(const ConfigMap& m, RulesConfig* r) {
  if (std::optional<ConfigValue> classes = m.Value("classes")) {
    for (const ConfigValue& c : classes->Items()) {
      std::string name;
      if (c.As(&name)) r->classes.push_back(name);
    }
  }
  m.Get("min_score", &r->min_score, 0.0, 1.0);
  if (std::optional<ConfigValue> roi = m.Value("roi")) {
    for (const ConfigValue& poly : roi->Items()) {
      Polygon p;
      ReadPolygon(poly, &p);
      if (p.size() >= 3) r->roi.push_back(std::move(p));
    }
  }
  if (std::optional<ConfigMap> c = m.Map("confirm")) {
    c->Get("k", &r->confirm_k, 1, 1000, ConfigMap::kRequired);
    c->Get("m", &r->confirm_m, 1, 1000, ConfigMap::kRequired);
    if (r->confirm_k > r->confirm_m) c->Error("k", "k must not exceed m");
  }
  m.Get("cooldown_s", &r->cooldown_s, 0.0, 1e9);
  if (std::optional<ConfigMap> s = m.Map("severity")) {
    s->Get("critical", &r->critical, 0.0, 1.0);
    s->Get("warning", &r->warning, 0.0, 1.0);
  }
}

// Reads a `snapshots` map over *out (the keys it names); `top` also takes `queue`.
void ReadSnapshots(const ConfigMap& m, SnapshotConfig* out, int* queue) {
  out->enabled = true;  // a snapshots section turns them on unless it says enabled: false
  m.Get("enabled", &out->enabled);
  video::SnapshotOptions& o = out->options;
  m.Get("frame", &o.frame);
  // 0 or 16..16384: one message for the whole range (not "out of range [0, 16384]" above and another below).
  auto side = [&](const char* key, int* value, const char* zero) {
    int v = *value;
    if (!m.Get(key, &v, -1000000000, 1000000000)) return;
    if (v == 0 || (v >= 16 && v <= 16384)) {
      *value = v;
    } else {
      m.Error(key, StrCat(v, " pixels: must be 0 (", zero, ") or 16..16384"));
    }
  };
  side("max_width", &o.frame_max_width, "the source's width");
  m.Get("crops", &o.crops);
  double margin = o.crop_margin;
  if (m.Get("crop_margin", &margin, 0.0, 2.0)) o.crop_margin = static_cast<float>(margin);
  side("crop_max_side", &o.crop_max_side, "no limit");
  m.Get("quality", &o.quality, 1, 100);
  if (queue != nullptr) m.Get("queue", queue, 1, 1024);
  if (out->enabled && !o.frame && !o.crops) m.Error("frame", "with frame: false, crops: true is needed (else no picture)");
}

// Reads `key` of `m` into *out when present; a value video::ParseHwaccel rejects is an error at the key.
void ReadHwaccel(const ConfigMap& m, std::string_view key, const std::string& context, std::string* out) {
  if (!m.Get(key, out)) return;
  if (StatusOr<std::optional<int>> device = video::ParseHwaccel(*out); !device.ok()) {
    m.Error(key, StrCat(context, std::string(device.status().message())));
  }
}

}  // namespace

int CudaOrdinal(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 9 ||
      device.find_first_not_of("0123456789", 5) != std::string::npos) {
    return -1;
  }
  return std::stoi(device.substr(5));
}

std::vector<StreamDevice> AssignStreamDevices(const EdgeConfig& config) {
  std::vector<StreamDevice> out;
  const size_t n = std::max<size_t>(config.devices.size(), 1);
  for (size_t i = 0; i < config.streams.size(); ++i) {
    const StreamConfig& sc = config.streams[i];
    StreamDevice sd{i % n, sc.hwaccel};
    // An explicit "cuda:N" picks the device; "cuda" alone (read as GPU 0 by the decoder) does not.
    if (StatusOr<std::optional<int>> gpu = video::ParseHwaccel(sc.hwaccel); gpu.ok() && *gpu && sc.hwaccel != "cuda") {
      for (size_t d = 0; d < config.devices.size(); ++d) {
        if (CudaOrdinal(config.devices[d]) == **gpu) sd.device = d;
      }
    }
    if (sd.hwaccel == "cuda" && sd.device < config.devices.size() && CudaOrdinal(config.devices[sd.device]) >= 0) {
      sd.hwaccel = config.devices[sd.device];
    }
    out.push_back(std::move(sd));
  }
  return out;
}

StatusOr<EdgeConfig> ParseEdgeConfig(std::string_view yaml, const std::string& name) {
  VIGIL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Parse(yaml, name));
  EdgeConfig cfg;
  ConfigMap root = file.root();
  root.Get("edge", &cfg.edge, ConfigMap::kRequired);
  if (root.Has("edge") && cfg.edge.empty()) root.Error("edge", "must not be empty");
  if (root.GetHostPort("aggregator", &cfg.aggregator_host, &cfg.aggregator_port, ConfigMap::kRequired)) {
    if (cfg.aggregator_port == 0) root.Error("aggregator", "port 0 cannot be dialled");
    if (cfg.aggregator_host.empty()) cfg.aggregator_host = "127.0.0.1";
  }
  if (std::optional<ConfigMap> m = root.Map("model", ConfigMap::kRequired)) {
    m->Get("path", &cfg.model_path, ConfigMap::kRequired);
    m->Get("conf", &cfg.conf, 0.0, 1.0);
    m->Get("iou", &cfg.iou, 0.0, 1.0);
    m->Get("max_det", &cfg.max_det, 1, static_cast<int>(transport::kMaxDetections));
    m->Get("threads", &cfg.threads, 0, 1024);
    m->Get("batch", &cfg.model_batch, 0, 256);
    // One device, or a list of them: a worker set per device, streams spread over them.
    std::optional<ConfigValue> dv = m->Value("device");
    std::vector<std::string> devices;
    if (dv && dv->IsSequence() ? m->Get("device", &devices) : m->Get("device", &devices.emplace_back())) {
      if (devices.empty()) m->Error("device", "the list is empty");
      for (std::string& d : devices) {
        if (d == "cuda") d = "cuda:0";
        const bool cuda_n = d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos;
        if (d != "cpu" && !cuda_n) m->Error("device", StrCat("'", d, "' must be cpu, cuda or cuda:N"));
      }
      if (std::set<std::string>(devices.begin(), devices.end()).size() != devices.size()) {
        m->Error("device", "a device is listed twice");
      }
      if (!devices.empty()) cfg.devices = std::move(devices);
    }
    m->Get("workers", &cfg.workers_per_device, 0, 64);
    if (m->Get("precision", &cfg.precision) && cfg.precision != "fp32" && cfg.precision != "fp16") {
      m->Error("precision", "must be fp32 or fp16");
    }
    if (m->Get("int8_activations", &cfg.int8_activations) && cfg.int8_activations != "quantized" &&
        cfg.int8_activations != "float") {
      m->Error("int8_activations", "must be quantized or float");
    }
  }
  if (std::optional<ConfigMap> b = root.Map("batching")) {
    b->Get("max_batch", &cfg.max_batch, 1, 256);
    b->Get("max_wait_ms", &cfg.max_wait_ms, 0, 10000);
  }
  root.Get("http_port", &cfg.http_port, uint16_t{0}, uint16_t{65535});
  root.Get("http_host", &cfg.http_host);
  root.Get("http_allow", &cfg.http_allow);
  root.Get("http_token_file", &cfg.http_token_file);
  if (std::optional<ConfigMap> tls = root.Map("http_tls")) {
    tls->Get("cert_file", &cfg.http_cert_file, ConfigMap::kRequired);
    tls->Get("key_file", &cfg.http_key_file, ConfigMap::kRequired);
  }
  root.Get("state_dir", &cfg.state_dir);
  if (root.Has("state_dir") && cfg.state_dir.empty()) root.Error("state_dir", "must not be empty");
  root.Get("progress_flush_ms", &cfg.progress_flush_ms, 1, 60000);
  if (std::optional<ConfigMap> t = root.Map("transport")) {
    if (t->Get("links", &cfg.links)) {
      if (cfg.links.empty()) t->Error("links", "name at least one link (tcp, ucx, cuda_ipc)");
      std::set<std::string> seen;
      for (const std::string& l : cfg.links) {
        if (l != "tcp" && l != "ucx" && l != "cuda_ipc") {
          t->Error("links", StrCat("unknown link '", l, "' (links: tcp, ucx, cuda_ipc)"));
        } else if (!seen.insert(l).second) {
          t->Error("links", StrCat("link '", l, "' given twice"));
        }
      }
    }
    t->Get("max_outbox", &cfg.max_outbox, 1, 10000000);
    t->GetHostPort("ucx", &cfg.ucx_host, &cfg.ucx_port);
    if (t->Get("cuda_ipc", &cfg.cuda_ipc_socket) && cfg.cuda_ipc_socket.empty()) {
      t->Error("cuda_ipc", "must name the aggregator's cuda_ipc socket");
    }
    t->Get("cuda_ipc_linger_us", &cfg.cuda_ipc_linger_us, 0, 100000);
    if (std::find(cfg.links.begin(), cfg.links.end(), "cuda_ipc") != cfg.links.end() && cfg.cuda_ipc_socket.empty()) {
      t->Error("links", "the cuda_ipc link needs transport.cuda_ipc: the aggregator's socket path");
    }
    t->Get("key_file", &cfg.key_file);
    if (t->Has("key_file") && cfg.key_file.empty()) t->Error("key_file", "must name a file");
    if (std::optional<ConfigMap> tls = t->Map("tls")) {
      cfg.tls = true;
      tls->Get("ca_file", &cfg.tls_ca_file, ConfigMap::kRequired);
      tls->Get("cert_file", &cfg.tls_cert_file);
      tls->Get("key_file", &cfg.tls_key_file);
      tls->Get("server_name", &cfg.tls_server_name);
      if (cfg.tls_cert_file.empty() != cfg.tls_key_file.empty()) {
        tls->Error("cert_file", "cert_file and key_file go together (a client certificate and its key)");
      }
    }
    t->Get("probe_interval_ms", &cfg.probe_interval_ms, 10, 600000);
    t->Get("ack_timeout_ms", &cfg.ack_timeout_ms, 100, 3600000);
  }
  if (std::optional<ConfigMap> p = root.Map("placement")) {
    p->Get("bind", &cfg.placement.bind);
    p->Get("bind_single_numa", &cfg.placement.bind_single_numa);
    p->Get("topology", &cfg.placement.topology);
    if (p->Has("topology") && cfg.placement.topology.empty()) p->Error("topology", "must not be empty");
    p->Get("gflop_per_frame", &cfg.placement.gflop_per_frame, 0.0, 1e6);
  }
  if (std::optional<ConfigMap> r = root.Map("replication")) {
    ReplicationConfig& rc = cfg.replication;
    std::string role;
    if (r->GetOneOf("role", &role, {"primary", "standby"}, ConfigMap::kRequired)) {
      rc.role = role == "primary" ? ReplicationConfig::Role::kPrimary : ReplicationConfig::Role::kStandby;
    }
    r->Get("listen", &rc.listen);
    if (r->Get("peer", &rc.peer, ConfigMap::kRequired) && rc.peer.empty()) {
      r->Error("peer", "the other node's replication channel (host:port)");
    }
    r->Get("node", &rc.node);
    if (std::optional<ConfigMap> tls = r->Map("tls", ConfigMap::kRequired)) {
      tls->Get("cert_file", &rc.cert_file, ConfigMap::kRequired);
      tls->Get("key_file", &rc.key_file, ConfigMap::kRequired);
      tls->Get("ca_file", &rc.ca_file, ConfigMap::kRequired);
    }
    r->Get("heartbeat_ms", &rc.heartbeat_ms, 10, 60000);
    std::string warm = "files";
    if (r->GetOneOf("warm_sources", &warm, {"files", "all", "none"})) {
      rc.warm_sources = warm == "all"    ? ReplicationConfig::WarmSources::kAll
                        : warm == "none" ? ReplicationConfig::WarmSources::kNone
                                         : ReplicationConfig::WarmSources::kFiles;
    }
    std::string via = "channel";
    if (r->GetOneOf("mirror_via", &via, {"channel", "shm"})) {
      rc.mirror_via = via == "shm" ? ReplicationConfig::MirrorVia::kShm : ReplicationConfig::MirrorVia::kChannel;
    }
    const bool shm = rc.mirror_via == ReplicationConfig::MirrorVia::kShm;
    std::string mirror = video::JpegAvailable() || shm ? "live" : "none";
    if (r->GetOneOf("mirror_frames", &mirror, {"live", "none"}) && mirror == "live" && !video::JpegAvailable() &&
        !shm) {
      r->Error("mirror_frames", "live needs libturbojpeg, and this vigil was built without it (VIGIL_WITH_TURBOJPEG; "
                                "Debian libturbojpeg0-dev): use none, or mirror_via: shm for a standby on this host");
    }
    rc.mirror_frames = mirror == "live" && (video::JpegAvailable() || shm);
    r->Get("mirror_results", &rc.mirror_results);
    if (r->Has("mirror_results") && rc.mirror_results && !rc.mirror_frames) {
      r->Error("mirror_results", "results are kept with their pictures' window: it needs mirror_frames: live");
    }
    rc.mirror_results = rc.mirror_results && rc.mirror_frames;
    r->Get("jpeg_quality", &rc.jpeg_quality, 1, 100);
    r->Get("mirror_window", &rc.mirror_window, 1, 100000);
    r->Get("mirror_socket", &rc.mirror_socket);
    r->Get("mirror_slots", &rc.mirror_slots, 2, 4096);
    r->Get("mirror_slot_mb", &rc.mirror_slot_mb, 1, 1024);
    if (r->Get("mirror_memory", &rc.mirror_memory) && rc.mirror_memory != "host") {
      if (rc.mirror_memory == "cuda") rc.mirror_memory = "cuda:0";
      const std::string n = rc.mirror_memory.rfind("cuda:", 0) == 0 ? rc.mirror_memory.substr(5) : "";
      if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
        r->Error("mirror_memory", "host, cuda or cuda:N");
      }
    }
    if (shm && r->Has("mirror_frames") && !rc.mirror_frames) {
      r->Error("mirror_via", "shm mirrors pictures: it needs mirror_frames: live (none mirrors nothing)");
    }
    if (!shm) {
      for (const char* k : {"mirror_socket", "mirror_slots", "mirror_slot_mb", "mirror_memory"}) {
        if (r->Has(k)) r->Error(k, "belongs to the same-host picture ring (mirror_via: shm)");
      }
    }
    if (r->Has("mirror_socket") && (rc.mirror_socket.empty() || rc.mirror_socket.size() > 100)) {
      r->Error("mirror_socket", "a Unix socket path of 1..100 bytes");
    }
    if (std::optional<ConfigMap> d = r->Map("detector")) {
      std::string kind = "fixed";
      d->GetOneOf("kind", &kind, {"fixed", "phi"});
      rc.phi = kind == "phi";
      d->Get("misses", &rc.misses, 1, 100);
      d->Get("threshold", &rc.phi_threshold, 1e-3, 100.0);
      d->Get("min_std_dev_ms", &rc.min_std_dev_ms, 1, 60000);
      d->Get("acceptable_pause_ms", &rc.acceptable_pause_ms, 0, 600000);
      if (!rc.phi && (d->Has("threshold") || d->Has("min_std_dev_ms") || d->Has("acceptable_pause_ms"))) {
        d->Error("kind", "threshold, min_std_dev_ms and acceptable_pause_ms are the phi detector's (kind: phi)");
      }
      if (rc.phi && d->Has("misses")) d->Error("misses", "misses is the fixed detector's (kind: fixed)");
    }
    if (std::optional<ConfigMap> sd = r->Map("step_down")) {
      int64_t v = rc.step_down_stall_ms;  // one message for every value out of bounds: 0 (never) or 100..600000
      if (sd->Get("stall_ms", &v, int64_t{-(int64_t{1} << 40)}, int64_t{1} << 40)) {
        if (v != 0 && (v < 100 || v > 600000)) {
          sd->Error("stall_ms", StrCat(v, " is out of range: 0 (never) or 100..600000"));
        } else {
          rc.step_down_stall_ms = static_cast<int>(v);
        }
      }
      sd->Get("errors", &rc.step_down_errors, 0, 1000);
    }
  }
  std::string default_hwaccel;
  ReadHwaccel(root, "hwaccel", "", &default_hwaccel);
  SnapshotConfig default_snapshots;
  if (std::optional<ConfigMap> sn = root.Map("snapshots")) ReadSnapshots(*sn, &default_snapshots, &cfg.snapshot_queue);
  std::vector<ConfigMap> streams = root.Maps("streams", ConfigMap::kRequired);
  if (root.Has("streams") && streams.empty()) root.Error("streams", "at least one stream is required");
  std::set<std::string> ids;
  for (const ConfigMap& s : streams) {
    StreamConfig sc;
    if (s.Get("id", &sc.id, ConfigMap::kRequired)) {
      if (sc.id.empty()) s.Error("id", "must not be empty");
      if (!ids.insert(sc.id).second) s.Error("id", "duplicate stream id '" + sc.id + "'");
    }
    s.Get("source", &sc.source, ConfigMap::kRequired);
    s.Get("realtime", &sc.realtime);
    s.Get("loop", &sc.loop);
    s.Get("target_fps", &sc.target_fps, 0.0, 1000.0);
    sc.hwaccel = default_hwaccel;
    ReadHwaccel(s, "hwaccel", StrCat("stream '", sc.id, "': "), &sc.hwaccel);
    s.Get("save_frames", &sc.save_frames);
    if (std::optional<ConfigMap> r = s.Map("rules")) ReadRules(*r, &sc.rules);
    sc.snapshots = default_snapshots;
    if (std::optional<ConfigMap> sn = s.Map("snapshots")) ReadSnapshots(*sn, &sc.snapshots, nullptr);
    if (std::optional<ConfigMap> p = s.Map("placement")) {
      p->Get("width", &sc.width, 1, 16384);
      p->Get("height", &sc.height, 1, 16384);
      p->Get("fps", &sc.fps, 1e-3, 1000.0);
      if (p->Has("width") != p->Has("height")) p->Error(p->Has("width") ? "width" : "height", "give both width and height");
    }
    cfg.streams.push_back(std::move(sc));
  }
  VIGIL_RETURN_IF_ERROR(file.Finish());
  if (cfg.replication.role != ReplicationConfig::Role::kNone && cfg.replication.node.empty()) {
    cfg.replication.node = cfg.edge;
  }
  return cfg;
}

PairTexts PairTextsOf(const EdgeConfig& c) {
  // The shortest text that reads back as the same double (std::to_chars): 0.9 is "0.9", any change shows.
  auto num = [](double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  };
  PairTexts t;
  t.model_path = c.model_path;
  t.settings = StrCat("conf=", num(c.conf), " iou=", num(c.iou), " max_det=", c.max_det, " precision=", c.precision,
                      " int8_activations=", c.int8_activations, " batch=", c.model_batch);
  for (const StreamConfig& s : c.streams) {
    t.streams.push_back(StrCat("id=", s.id, " source=", s.source, " realtime=", s.realtime, " loop=", s.loop,
                               " target_fps=", num(s.target_fps)));
    const RulesConfig& r = s.rules;
    std::string roi;
    for (const Polygon& p : r.roi) {
      roi += "[";
      for (const Point& pt : p) roi += StrCat(num(pt.x), ",", num(pt.y), ";");
      roi += "]";
    }
    t.rules.push_back(StrCat("classes=", absl::StrJoin(r.classes, ","), " min_score=", num(r.min_score), " roi=", roi,
                             " confirm=", r.confirm_k, "/", r.confirm_m, " cooldown_s=", num(r.cooldown_s),
                             " critical=", num(r.critical), " warning=", num(r.warning)));
  }
  return t;
}

int MirrorSlotsFor(const EdgeConfig& config) {
  if (config.replication.mirror_slots > 0) return config.replication.mirror_slots;
  return static_cast<int>(std::clamp<size_t>(2 * config.streams.size(), 8, 4096));
}

StatusOr<EdgeConfig> LoadEdgeConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("edge config '" + path + "': cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  return ParseEdgeConfig(text.str(), path);
}

}  // namespace vigil::pipeline
