#include "vigil/pipeline/edge_config.h"

#include <gtest/gtest.h>

#include "vigil/pipeline/edge.h"
#include "vigil/video/jpeg.h"

namespace vigil::pipeline {
namespace {

constexpr const char* kGood = R"(edge: e1
aggregator: 127.0.0.1:7400
model: {path: m.onnx, conf: 0.3, threads: 2}
batching: {max_batch: 4, max_wait_ms: 20}
http_port: 9100
state_dir: /tmp/s
streams:
  - id: door
    source: /v/door.mp4
    realtime: true
    target_fps: 5
    rules:
      classes: [person, 2]
      min_score: 0.5
      roi: [[[0, 0], [640, 0], [640, 480]]]
      confirm: {k: 2, m: 3}
      cooldown_s: 10
      severity: {critical: 0.9, warning: 0.5}
  - id: imgs
    source: /d/*.jpg
    save_frames: /tmp/frames
)";

TEST(EdgeConfig, ParsesEveryKey) {
  StatusOr<EdgeConfig> c = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->edge, "e1");
  EXPECT_EQ(c->aggregator_host, "127.0.0.1");
  EXPECT_EQ(c->aggregator_port, 7400);
  EXPECT_EQ(c->model_path, "m.onnx");
  EXPECT_DOUBLE_EQ(c->conf, 0.3);
  EXPECT_EQ(c->threads, 2);
  EXPECT_EQ(c->max_batch, 4);
  EXPECT_EQ(c->max_wait_ms, 20);
  EXPECT_EQ(c->http_port, 9100);
  ASSERT_EQ(c->streams.size(), 2u);
  const StreamConfig& s = c->streams[0];
  EXPECT_TRUE(s.realtime);
  EXPECT_DOUBLE_EQ(s.target_fps, 5);
  EXPECT_EQ(s.rules.classes, (std::vector<std::string>{"person", "2"}));
  ASSERT_EQ(s.rules.roi.size(), 1u);
  ASSERT_EQ(s.rules.roi[0].size(), 3u);
  EXPECT_DOUBLE_EQ(s.rules.roi[0][1].x, 640);
  EXPECT_EQ(s.rules.confirm_k, 2);
  EXPECT_EQ(s.rules.confirm_m, 3);
  EXPECT_DOUBLE_EQ(s.rules.cooldown_s, 10);
  EXPECT_DOUBLE_EQ(s.rules.critical, 0.9);
  EXPECT_EQ(c->streams[1].source, "/d/*.jpg");
  EXPECT_TRUE(c->streams[1].rules.classes.empty());
  EXPECT_EQ(s.save_frames, "");
  EXPECT_EQ(c->streams[1].save_frames, "/tmp/frames");
}

// Replaces the first occurrence of `from` in kGood and returns the error message.
std::string ErrorWith(const std::string& from, const std::string& to) {
  std::string text = kGood;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  StatusOr<EdgeConfig> c = ParseEdgeConfig(text, "edge.yaml");
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(EdgeConfig, UnknownKeyNamesKeyAndLine) {
  const std::string e = ErrorWith("    realtime: true", "    realtme: true");
  EXPECT_NE(e.find("edge.yaml:10:"), std::string::npos) << e;
  EXPECT_NE(e.find("streams[0].realtme"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key"), std::string::npos) << e;
}

TEST(EdgeConfig, WrongTypeNamesKeyAndLine) {
  const std::string e = ErrorWith("min_score: 0.5", "min_score: [0.5]");
  EXPECT_NE(e.find("edge.yaml:14:"), std::string::npos) << e;
  EXPECT_NE(e.find("min_score"), std::string::npos) << e;
}

TEST(EdgeConfig, DeviceAndPrecision) {
  std::string e = ErrorWith("threads: 2}", "threads: 2, device: gpu0}");
  EXPECT_NE(e.find("device"), std::string::npos) << e;
  EXPECT_NE(e.find("must be cpu, cuda or cuda:N"), std::string::npos) << e;
  e = ErrorWith("threads: 2}", "threads: 2, device: cuda:1, precision: int8}");
  EXPECT_NE(e.find("precision"), std::string::npos) << e;
  EXPECT_EQ(e.find("device"), std::string::npos) << e;  // cuda:1 is valid
}

TEST(EdgeConfig, DeviceListAndStreamAssignment) {
  StatusOr<EdgeConfig> c = ParseEdgeConfig(
      "edge: e\naggregator: h:1\nmodel: {path: m.onnx, device: [cuda:0, cuda, 'cuda:3'], workers: 3}\n"
      "streams:\n  - {id: a, source: f, hwaccel: cuda}\n  - {id: b, source: f, hwaccel: cuda}\n"
      "  - {id: c, source: f, hwaccel: 'cuda:0'}\n  - {id: d, source: f}\n  - {id: e, source: f, hwaccel: 'cuda:7'}\n",
      "edge.yaml");
  ASSERT_FALSE(c.ok()) << "cuda and cuda:0 are the same device";
  EXPECT_NE(std::string(c.status().message()).find("a device is listed twice"), std::string::npos) << c.status();
  c = ParseEdgeConfig(
      "edge: e\naggregator: h:1\nmodel: {path: m.onnx, device: [cuda:1, 'cuda:3'], workers: 3}\n"
      "streams:\n  - {id: a, source: f, hwaccel: cuda}\n  - {id: b, source: f, hwaccel: cuda}\n"
      "  - {id: c, source: f, hwaccel: 'cuda:1'}\n  - {id: d, source: f}\n  - {id: e, source: f, hwaccel: 'cuda:7'}\n",
      "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->devices, (std::vector<std::string>{"cuda:1", "cuda:3"}));
  EXPECT_EQ(c->workers_per_device, 3);
  EXPECT_EQ(CudaOrdinal("cuda:3"), 3);
  EXPECT_EQ(CudaOrdinal("cpu"), -1);
  const std::vector<StreamDevice> sd = AssignStreamDevices(*c);
  ASSERT_EQ(sd.size(), 5u);
  // Round-robin, an unnumbered "cuda" decoding on its device's GPU; an explicit GPU that is one of the
  // devices pins the stream there; one that is not keeps the round-robin device and its own decoder.
  EXPECT_EQ(sd[0].device, 0u);
  EXPECT_EQ(sd[0].hwaccel, "cuda:1");
  EXPECT_EQ(sd[1].device, 1u);
  EXPECT_EQ(sd[1].hwaccel, "cuda:3");
  EXPECT_EQ(sd[2].device, 0u);
  EXPECT_EQ(sd[2].hwaccel, "cuda:1");
  EXPECT_EQ(sd[3].device, 1u);
  EXPECT_EQ(sd[3].hwaccel, "");
  EXPECT_EQ(sd[4].device, 0u);
  EXPECT_EQ(sd[4].hwaccel, "cuda:7");
  c = ParseEdgeConfig("edge: e\naggregator: h:1\nmodel: {path: m.onnx, device: []}\nstreams:\n  - {id: a, source: f}\n",
                      "edge.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("the list is empty"), std::string::npos) << c.status();
}

TEST(EdgeConfig, WorkerOptionsFollowTheDevicesAndTheModelsBatch) {
  auto parse = [](const std::string& model_yaml) {
    StatusOr<EdgeConfig> c = ParseEdgeConfig("edge: e\naggregator: h:1\nmodel: {path: m.onnx" + model_yaml +
                                                 "}\nbatching: {max_batch: 16, max_wait_ms: 3}\nstreams:\n"
                                                 "  - {id: a, source: f}\n  - {id: b, source: f}\n  - {id: c, source: f}\n",
                                             "edge.yaml");
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  };
  const auto yes = [] { return true; };
  const auto no = [] { return false; };
  int asked = 0;
  const auto counted = [&] { ++asked; return true; };
  // GPUs: 2 workers each, a symbolic batch runs whole batches; a fixed one stays the model's (0).
  WorkerPoolOptions o = EdgeWorkerOptions(parse(", device: [cuda:0, cuda:1], precision: fp16"), yes, 16);
  EXPECT_EQ(o.workers_per_device, 2);
  EXPECT_EQ(o.detector.engine.batch, 16);
  EXPECT_EQ(o.detector.engine.precision, infer::Precision::kFp16);
  EXPECT_EQ(o.max_batch, 16u);
  EXPECT_EQ(o.max_wait, std::chrono::milliseconds(3));
  EXPECT_EQ(o.stream_device, (std::vector<size_t>{0, 1, 0}));
  EXPECT_EQ(EdgeWorkerOptions(parse(", device: cuda:0"), no, 16).detector.engine.batch, 0);
  EXPECT_EQ(EdgeWorkerOptions(parse(", device: cuda:0, batch: 4"), yes, 16).detector.engine.batch, 4);
  // CPU: one worker with every core (threads 0), engine batch 1 for a symbolic batch (no padding); the
  // model is not even asked.
  o = EdgeWorkerOptions(parse(""), counted, 16);
  EXPECT_EQ(asked, 0);
  EXPECT_EQ(o.workers_per_device, 1);
  EXPECT_EQ(o.detector.engine.batch, 0);
  EXPECT_EQ(o.detector.engine.threads, 0);
  // Several CPU workers split the cores; explicit threads are kept.
  EXPECT_EQ(EdgeWorkerOptions(parse(", workers: 2"), yes, 16).detector.engine.threads, 8);
  EXPECT_EQ(EdgeWorkerOptions(parse(", workers: 4"), yes, 2).detector.engine.threads, 1);
  EXPECT_EQ(EdgeWorkerOptions(parse(", workers: 2, threads: 3"), yes, 16).detector.engine.threads, 3);
}

TEST(EdgeConfig, OutOfRangeValuesNameKeyAndLine) {
  std::string e = ErrorWith("max_batch: 4", "max_batch: 0");
  EXPECT_NE(e.find("edge.yaml:4:"), std::string::npos) << e;
  EXPECT_NE(e.find("max_batch"), std::string::npos) << e;
  e = ErrorWith("confirm: {k: 2, m: 3}", "confirm: {k: 4, m: 3}");
  EXPECT_NE(e.find("edge.yaml:16:"), std::string::npos) << e;
  EXPECT_NE(e.find("k must not exceed m"), std::string::npos) << e;
  e = ErrorWith("[640, 480]]]", "[640]]]");
  EXPECT_NE(e.find("edge.yaml:15:"), std::string::npos) << e;
  e = ErrorWith("min_score: 0.5", "min_score: 1.5");
  EXPECT_NE(e.find("edge.yaml:14:"), std::string::npos) << e;
}

TEST(EdgeConfig, SnapshotsAtTheTopAndPerStream) {
  StatusOr<EdgeConfig> c = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->streams[0].snapshots.enabled);  // off unless configured
  EXPECT_EQ(c->snapshot_queue, 16);
  std::string text = kGood;
  text.insert(text.find("streams:"), "snapshots: {max_width: 480, crops: true, crop_margin: 0.25, crop_max_side: 200, "
                                     "quality: 70, queue: 4}\n");
  text.insert(text.find("    save_frames"), "    snapshots: {enabled: false}\n");
  text.insert(text.find("    rules:"), "    snapshots: {frame: false, quality: 95}\n");
  c = ParseEdgeConfig(text, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->snapshot_queue, 4);
  const SnapshotConfig& door = c->streams[0].snapshots;  // the top level's, with its own two keys
  EXPECT_TRUE(door.enabled);
  EXPECT_FALSE(door.options.frame);
  EXPECT_TRUE(door.options.crops);
  EXPECT_EQ(door.options.frame_max_width, 480);
  EXPECT_FLOAT_EQ(door.options.crop_margin, 0.25f);
  EXPECT_EQ(door.options.crop_max_side, 200);
  EXPECT_EQ(door.options.quality, 95);
  EXPECT_FALSE(c->streams[1].snapshots.enabled);
  EXPECT_EQ(c->streams[1].snapshots.options.quality, 70);

  auto error = [&](const std::string& section) {
    std::string t = kGood;
    t.insert(t.find("streams:"), section + "\n");
    StatusOr<EdgeConfig> e = ParseEdgeConfig(t, "edge.yaml");
    return e.ok() ? std::string("OK") : std::string(e.status().message());
  };
  EXPECT_NE(error("snapshots: {quality: 0}").find("edge.yaml:7:"), std::string::npos) << error("snapshots: {quality: 0}");
  EXPECT_NE(error("snapshots: {quality: 0}").find("quality"), std::string::npos);
  EXPECT_NE(error("snapshots: {max_width: 8}").find("snapshots.max_width: 8 pixels: must be 0 (the source's width) or 16..16384"), std::string::npos)
      << error("snapshots: {max_width: 8}");
  EXPECT_NE(error("snapshots: {frame: false}").find("crops: true is needed"), std::string::npos);
  EXPECT_NE(error("snapshots: {queue: 0}").find("queue"), std::string::npos);
  EXPECT_NE(error("snapshots: {qualty: 80}").find("unknown key"), std::string::npos);
  EXPECT_EQ(error("snapshots: {enabled: false, frame: false}"), "OK");  // off: nothing to encode
}

TEST(EdgeConfig, MissingAndDuplicateStreams) {
  std::string e = ErrorWith("  - id: imgs", "  - id: door");
  EXPECT_NE(e.find("duplicate stream id 'door'"), std::string::npos) << e;
  e = ErrorWith("model: {path: m.onnx,", "model: {");
  EXPECT_NE(e.find("edge.yaml:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("missing required key 'path'"), std::string::npos) << e;
}

TEST(EdgeConfig, PlacementDefaultsAndKeys) {
  StatusOr<EdgeConfig> d = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->placement.bind);
  EXPECT_FALSE(d->placement.bind_single_numa);
  EXPECT_TRUE(d->placement.topology.empty());
  EXPECT_EQ(d->placement.gflop_per_frame, 0.0);
  EXPECT_EQ(d->streams[0].width, 0);
  EXPECT_EQ(d->streams[0].fps, 0.0);

  std::string text = kGood;
  text.replace(text.find("streams:"), 8,
               "placement: {bind: false, bind_single_numa: true, topology: /t/dgx.xml, gflop_per_frame: 8.7}\nstreams:");
  text += "    placement: {width: 1920, height: 1080, fps: 25}\n";
  StatusOr<EdgeConfig> c = ParseEdgeConfig(text, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->placement.bind);
  EXPECT_TRUE(c->placement.bind_single_numa);
  EXPECT_EQ(c->placement.topology, "/t/dgx.xml");
  EXPECT_DOUBLE_EQ(c->placement.gflop_per_frame, 8.7);
  EXPECT_EQ(c->streams[1].width, 1920);
  EXPECT_EQ(c->streams[1].height, 1080);
  EXPECT_DOUBLE_EQ(c->streams[1].fps, 25);
}

TEST(EdgeConfig, PlacementErrorsNameKeyAndLine) {
  std::string e = ErrorWith("http_port: 9100", "placement: {bind: maybe}");
  EXPECT_NE(e.find("edge.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("placement.bind"), std::string::npos) << e;
  e = ErrorWith("http_port: 9100", "placement: {bnd: false}");
  EXPECT_NE(e.find("placement.bnd: unknown key"), std::string::npos) << e;
  e = ErrorWith("http_port: 9100", "placement: {gflop_per_frame: -1}");
  EXPECT_NE(e.find("placement.gflop_per_frame"), std::string::npos) << e;
  e = ErrorWith("    realtime: true", "    placement: {width: 640}");
  EXPECT_NE(e.find("edge.yaml:10:"), std::string::npos) << e;
  EXPECT_NE(e.find("give both width and height"), std::string::npos) << e;
  e = ErrorWith("    realtime: true", "    placement: {fps: 0}");
  EXPECT_NE(e.find("streams[0].placement.fps"), std::string::npos) << e;
}

TEST(EdgeConfig, HwaccelDefaultAndPerStream) {
  StatusOr<EdgeConfig> d = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->streams[0].hwaccel, "") << "absent: decode on the CPU";
  EXPECT_EQ(d->streams[1].hwaccel, "");

  std::string text = kGood;
  text.replace(text.find("streams:"), 8, "hwaccel: cuda\nstreams:");
  text.replace(text.find("    realtime: true"), 18, "    hwaccel: cuda:3\n    realtime: true");
  StatusOr<EdgeConfig> c = ParseEdgeConfig(text, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->streams[0].hwaccel, "cuda:3") << "the stream's own value";
  EXPECT_EQ(c->streams[1].hwaccel, "cuda") << "the top-level default";

  text.replace(text.find("    hwaccel: cuda:3"), 19, "    hwaccel: cpu");
  c = ParseEdgeConfig(text, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->streams[0].hwaccel, "cpu") << "a stream opts out of the default";
}

TEST(EdgeConfig, BadHwaccelNamesStreamKeyLineAndValue) {
  std::string e = ErrorWith("    save_frames: /tmp/frames", "    hwaccel: vulkan");
  EXPECT_NE(e.find("edge.yaml:21:"), std::string::npos) << e;
  EXPECT_NE(e.find("streams[1].hwaccel"), std::string::npos) << e;
  EXPECT_NE(e.find("stream 'imgs': hwaccel 'vulkan' is not"), std::string::npos) << e;
  EXPECT_NE(e.find("cuda:N"), std::string::npos) << e;
  e = ErrorWith("http_port: 9100", "hwaccel: cuda:x");
  EXPECT_NE(e.find("edge.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("hwaccel 'cuda:x' is not"), std::string::npos) << e;
  e = ErrorWith("    realtime: true", "    hwaccel: [cuda]");
  EXPECT_NE(e.find("streams[0].hwaccel"), std::string::npos) << e;
}

TEST(EdgeConfig, TransportLinksKeysTlsAndHttpAccess) {
  std::string text = kGood;
  text.replace(text.find("streams:"), 0,
               "transport:\n  links: [ucx, tcp]\n  ucx: 10.0.0.9:7402\n  key_file: /etc/vigil/edge.key\n"
               "  tls: {ca_file: ca.pem, cert_file: c.pem, key_file: c.key, server_name: agg.example}\n"
               "  probe_interval_ms: 250\n  ack_timeout_ms: 3000\n"
               "http_allow: [10.0.0.0/8]\nhttp_token_file: /etc/vigil/token\n"
               "http_tls: {cert_file: h.pem, key_file: h.key}\n");
  StatusOr<EdgeConfig> c = ParseEdgeConfig(text, "edge.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->links, (std::vector<std::string>{"ucx", "tcp"}));
  EXPECT_EQ(c->ucx_host, "10.0.0.9");
  EXPECT_EQ(c->ucx_port, 7402);
  EXPECT_EQ(c->key_file, "/etc/vigil/edge.key");
  EXPECT_TRUE(c->tls);
  EXPECT_EQ(c->tls_ca_file, "ca.pem");
  EXPECT_EQ(c->tls_cert_file, "c.pem");
  EXPECT_EQ(c->tls_key_file, "c.key");
  EXPECT_EQ(c->tls_server_name, "agg.example");
  EXPECT_EQ(c->probe_interval_ms, 250);
  EXPECT_EQ(c->ack_timeout_ms, 3000);
  EXPECT_EQ(c->http_allow, (std::vector<std::string>{"10.0.0.0/8"}));
  EXPECT_EQ(c->http_token_file, "/etc/vigil/token");
  EXPECT_EQ(c->http_cert_file, "h.pem");
  EXPECT_EQ(c->http_key_file, "h.key");

  std::string ipc = kGood;
  ipc.replace(ipc.find("streams:"), 0, "transport: {links: [cuda_ipc, tcp], cuda_ipc: /run/vigil/agg.sock}\n");
  StatusOr<EdgeConfig> with_ipc = ParseEdgeConfig(ipc, "edge.yaml");
  ASSERT_TRUE(with_ipc.ok()) << with_ipc.status();
  EXPECT_EQ(with_ipc->links, (std::vector<std::string>{"cuda_ipc", "tcp"}));
  EXPECT_EQ(with_ipc->cuda_ipc_socket, "/run/vigil/agg.sock");
  EXPECT_EQ(with_ipc->cuda_ipc_linger_us, 200);  // the resident publisher by default
  std::string launch = kGood;
  launch.replace(launch.find("streams:"), 0,
                 "transport: {links: [cuda_ipc], cuda_ipc: /run/vigil/agg.sock, cuda_ipc_linger_us: 0}\n");
  ASSERT_TRUE(ParseEdgeConfig(launch, "edge.yaml").ok());
  EXPECT_EQ(ParseEdgeConfig(launch, "edge.yaml")->cuda_ipc_linger_us, 0);
  std::string too_long = kGood;
  too_long.replace(too_long.find("streams:"), 0,
                   "transport: {links: [cuda_ipc], cuda_ipc: /run/vigil/agg.sock, cuda_ipc_linger_us: 200000}\n");
  EXPECT_NE(std::string(ParseEdgeConfig(too_long, "edge.yaml").status().message()).find("transport.cuda_ipc_linger_us"),
            std::string::npos)
      << ParseEdgeConfig(too_long, "edge.yaml").status();
  std::string no_socket = kGood;
  no_socket.replace(no_socket.find("streams:"), 0, "transport: {links: [cuda_ipc]}\n");
  EXPECT_NE(std::string(ParseEdgeConfig(no_socket, "edge.yaml").status().message())
                .find("transport.links: the cuda_ipc link needs transport.cuda_ipc: the aggregator's socket path"),
            std::string::npos)
      << ParseEdgeConfig(no_socket, "edge.yaml").status();

  StatusOr<EdgeConfig> defaults = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->links, (std::vector<std::string>{"tcp"}));
  EXPECT_FALSE(defaults->tls);
  EXPECT_EQ(defaults->key_file, "");

  text = kGood;
  text.replace(text.find("streams:"), 0, "transport: {links: [rdma], tls: {cert_file: c.pem}}\n");
  StatusOr<EdgeConfig> bad = ParseEdgeConfig(text, "edge.yaml");
  ASSERT_FALSE(bad.ok());
  const std::string e(bad.status().message());
  EXPECT_NE(e.find("unknown link 'rdma' (links: tcp, ucx, cuda_ipc)"), std::string::npos) << e;
  EXPECT_NE(e.find("transport.tls: missing required key 'ca_file'"), std::string::npos) << e;
  EXPECT_NE(e.find("cert_file and key_file go together"), std::string::npos) << e;
}

TEST(EdgeConfig, EdgeLinksNameTheKeyProblemAndAreBuiltInOrder) {
  StatusOr<EdgeConfig> c = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(c.ok());
  c->key_file = "/nonexistent/edge.key";
  StatusOr<std::vector<std::shared_ptr<transport::Link>>> links = MakeEdgeLinks(*c);
  ASSERT_FALSE(links.ok());
  EXPECT_EQ(std::string(links.status().message()).rfind("key_file /nonexistent/edge.key: cannot read", 0), 0u)
      << links.status();
  c->key_file.clear();
  c->links = {"tcp"};
  links = MakeEdgeLinks(*c);
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 1u);
  EXPECT_EQ((*links)[0]->kind(), "tcp");
  EXPECT_EQ((*links)[0]->target(), "tcp://127.0.0.1:7400");
#if VIGIL_HAVE_UCX
  c->links = {"ucx", "tcp"};
  c->ucx_port = 7499;
  links = MakeEdgeLinks(*c);
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 2u);
  EXPECT_EQ((*links)[0]->kind(), "ucx");
  EXPECT_EQ((*links)[0]->target(), "ucx://127.0.0.1:7499");
#endif
}

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(EdgeConfig, ReplicationRolesDetectorsAndTheirErrors) {
  const std::string tls = "  tls: {cert_file: n.pem, key_file: n.key, ca_file: ca.pem}\n";
  StatusOr<EdgeConfig> none = ParseEdgeConfig(kGood, "edge.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->replication.role, ReplicationConfig::Role::kNone);
  StatusOr<EdgeConfig> p = ParseEdgeConfig(
      std::string(kGood) + "replication:\n  role: primary\n  listen: 10.0.0.1:7421\n  peer: 10.0.0.2:7421\n" + tls,
                                           "edge.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->replication.role, ReplicationConfig::Role::kPrimary);
  EXPECT_EQ(p->replication.listen, "10.0.0.1:7421");
  EXPECT_EQ(p->replication.peer, "10.0.0.2:7421");
  EXPECT_EQ(p->replication.node, "e1");  // the edge id by default
  EXPECT_EQ(p->replication.ca_file, "ca.pem");
  EXPECT_EQ(p->replication.heartbeat_ms, 500);
  EXPECT_FALSE(p->replication.phi);
  EXPECT_EQ(p->replication.misses, 3);
  EXPECT_EQ(p->replication.step_down_stall_ms, 3000);  // the primary's own health, on by default
  EXPECT_EQ(p->replication.step_down_errors, 3);
  StatusOr<EdgeConfig> off = ParseEdgeConfig(std::string(kGood) +
                                                 "replication:\n  role: primary\n  peer: b:7420\n"
                                                 "  step_down: {stall_ms: 0, errors: 5}\n" + tls,
                                             "edge.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->replication.step_down_stall_ms, 0);
  EXPECT_EQ(off->replication.step_down_errors, 5);
  // What a standby reads while it waits: files by default; cameras too only when asked (two clients each).
  EXPECT_EQ(p->replication.warm_sources, ReplicationConfig::WarmSources::kFiles);
  for (const auto& [text, want] : {std::pair{"all", ReplicationConfig::WarmSources::kAll},
                                   std::pair{"none", ReplicationConfig::WarmSources::kNone},
                                   std::pair{"files", ReplicationConfig::WarmSources::kFiles}}) {
    StatusOr<EdgeConfig> w = ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n" +
                                                 "  warm_sources: " + text + "\n" + tls,
                                             "edge.yaml");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->replication.warm_sources, want) << text;
  }
  // Live pictures mirrored as JPEG: on by default where vigil has libturbojpeg.
  EXPECT_EQ(p->replication.mirror_frames, video::JpegAvailable());
  EXPECT_EQ(p->replication.jpeg_quality, 85);
  EXPECT_EQ(p->replication.mirror_window, 256);
  // The primary's results mirrored beside its pictures: on wherever pictures are; asked for without them, an error.
  EXPECT_EQ(p->replication.mirror_results, p->replication.mirror_frames);
  {
    StatusOr<EdgeConfig> m = ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n" +
                                                 "  mirror_via: shm\n  mirror_results: false\n" + tls,
                                             "edge.yaml");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m->replication.mirror_frames);
    EXPECT_FALSE(m->replication.mirror_results);
    StatusOr<EdgeConfig> bare = ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n" +
                                                    "  mirror_frames: none\n" + tls,
                                                "edge.yaml");
    ASSERT_TRUE(bare.ok()) << bare.status();
    EXPECT_FALSE(bare->replication.mirror_results) << "no window to keep them in";
    EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                          "  mirror_frames: none\n  mirror_results: true\n" + tls, "edge.yaml").status())
                  .find("replication.mirror_results: results are kept with their pictures' window"),
              std::string::npos);
  }
  {
    StatusOr<EdgeConfig> m = ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n" +
                                                 "  mirror_frames: none\n  jpeg_quality: 60\n  mirror_window: 32\n" + tls,
                                             "edge.yaml");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_FALSE(m->replication.mirror_frames);
    EXPECT_EQ(m->replication.jpeg_quality, 60);
    EXPECT_EQ(m->replication.mirror_window, 32);
  }
  // The same-host picture ring (issue 17): off by default; its keys only with mirror_via shm.
  EXPECT_EQ(p->replication.mirror_via, ReplicationConfig::MirrorVia::kChannel);
  {
    StatusOr<EdgeConfig> m = ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n" +
                                                 "  mirror_via: shm\n  mirror_slots: 16\n  mirror_slot_mb: 25\n"
                                                 "  mirror_socket: /run/vigil/frames.sock\n" + tls,
                                             "edge.yaml");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->replication.mirror_via, ReplicationConfig::MirrorVia::kShm);
    EXPECT_TRUE(m->replication.mirror_frames);  // raw pictures need no libturbojpeg
    EXPECT_EQ(m->replication.mirror_slots, 16);
    EXPECT_EQ(m->replication.mirror_slot_mb, 25);
    EXPECT_EQ(MirrorSlotsFor(*m), 16);  // set: as set
    EXPECT_EQ(m->replication.mirror_socket, "/run/vigil/frames.sock");
    EXPECT_EQ(m->replication.mirror_memory, "host");
  }
  {
    StatusOr<EdgeConfig> m = ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n" +
                                                 "  mirror_via: shm\n  mirror_memory: cuda\n" + tls,
                                             "edge.yaml");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->replication.mirror_memory, "cuda:0");
    // Unset: two slots per stream, at least 8 and at most 4096.
    EXPECT_EQ(m->replication.mirror_slots, 0);
    ASSERT_FALSE(m->streams.empty());
    EXPECT_EQ(MirrorSlotsFor(*m), std::max<int>(8, 2 * static_cast<int>(m->streams.size())));
    EdgeConfig many = *m;
    many.streams.resize(128, m->streams[0]);
    EXPECT_EQ(MirrorSlotsFor(many), 256);
    many.streams.resize(3000, m->streams[0]);
    EXPECT_EQ(MirrorSlotsFor(many), 4096);
  }
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n"
                                        "  mirror_via: shm\n  mirror_memory: gpu0\n" + tls, "edge.yaml").status())
                .find("replication.mirror_memory"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n"
                                        "  mirror_memory: cuda:0\n" + tls, "edge.yaml").status())
                .find("belongs to the same-host picture ring"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  mirror_slots: 16\n" + tls, "edge.yaml").status())
                .find("replication.mirror_slots: belongs to the same-host picture ring (mirror_via: shm)"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  mirror_via: shm\n  mirror_slots: 1\n" + tls, "edge.yaml").status())
                .find("mirror_slots"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  mirror_via: shm\n  mirror_frames: none\n" + tls, "edge.yaml").status())
                .find("it needs mirror_frames: live"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  mirror_via: ipc\n" + tls, "edge.yaml").status())
                .find("mirror_via"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  jpeg_quality: 101\n" + tls, "edge.yaml").status())
                .find("jpeg_quality"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  mirror_frames: all\n" + tls, "edge.yaml").status())
                .find("mirror_frames"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: standby\n  peer: b:7420\n"
                                        "  warm_sources: cameras\n" + tls, "edge.yaml").status())
                .find("warm_sources"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  step_down: {stall_ms: 20}\n" + tls, "edge.yaml").status())
                .find("replication.step_down.stall_ms: 20 is out of range: 0 (never) or 100..600000"),
            std::string::npos);
  EXPECT_NE(Message(ParseEdgeConfig(std::string(kGood) + "replication:\n  role: primary\n  peer: b:7420\n"
                                        "  step_down: {stall_ms: 700000}\n" + tls, "edge.yaml").status())
                .find("replication.step_down.stall_ms: 700000 is out of range: 0 (never) or 100..600000"),
            std::string::npos);
  StatusOr<EdgeConfig> s = ParseEdgeConfig(
      std::string(kGood) + "replication:\n  role: standby\n  peer: gpu-a:7420\n  node: gpu-b\n  heartbeat_ms: 100\n" +
          "  detector: {kind: phi, threshold: 10, min_std_dev_ms: 20, acceptable_pause_ms: 200}\n" + tls,
      "edge.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->replication.role, ReplicationConfig::Role::kStandby);
  EXPECT_EQ(s->replication.peer, "gpu-a:7420");
  EXPECT_EQ(s->replication.listen, "0.0.0.0:7420");
  EXPECT_EQ(s->replication.node, "gpu-b");
  EXPECT_TRUE(s->replication.phi);
  EXPECT_DOUBLE_EQ(s->replication.phi_threshold, 10);
  EXPECT_EQ(s->replication.min_std_dev_ms, 20);
  EXPECT_EQ(s->replication.acceptable_pause_ms, 200);
  const std::string m = Message(ParseEdgeConfig(
      std::string(kGood) + "replication:\n  role: standby\n  detector: {kind: fixed, threshold: 3}\n  tls: {cert_file: a}\n",
      "edge.yaml").status());
  EXPECT_NE(m.find("replication: missing required key 'peer'"), std::string::npos) << m;
  EXPECT_NE(m.find("replication.detector.kind: threshold, min_std_dev_ms and acceptable_pause_ms are the phi"),
            std::string::npos) << m;
  EXPECT_NE(m.find("replication.tls: missing required key 'key_file'"), std::string::npos) << m;
  const std::string m2 = Message(ParseEdgeConfig(std::string(kGood) + "replication: {role: leader}\n", "edge.yaml").status());
  EXPECT_NE(m2.find("replication.role"), std::string::npos) << m2;
  EXPECT_NE(m2.find("replication: missing required key 'tls'"), std::string::npos) << m2;
}

TEST(EdgeConfig, ThePairTextsCoverModelSettingsStreamsAndRulesButNotRoleOrPlace) {
  StatusOr<EdgeConfig> a = ParseEdgeConfig(kGood, "a.yaml");
  ASSERT_TRUE(a.ok());
  EdgeConfig b = *a;
  b.replication.role = ReplicationConfig::Role::kStandby;
  b.replication.node = "other";
  b.devices = {"cuda:1"};
  b.threads = 7;
  b.state_dir = "/elsewhere";
  b.links = {"ucx", "tcp"};
  const PairTexts ta = PairTextsOf(*a), tb = PairTextsOf(b);
  EXPECT_EQ(ta.model_path, "m.onnx");
  EXPECT_EQ(ta.settings, tb.settings);
  EXPECT_EQ(ta.streams, tb.streams);
  EXPECT_EQ(ta.rules, tb.rules);
  ASSERT_EQ(ta.streams.size(), 2u);
  EXPECT_EQ(ta.streams[0], "id=door source=/v/door.mp4 realtime=1 loop=0 target_fps=5");
  EXPECT_EQ(ta.rules[0],
            "classes=person,2 min_score=0.5 roi=[0,0;640,0;640,480;] confirm=2/3 cooldown_s=10 critical=0.9 "
            "warning=0.5");
  b.conf = 0.30000000000000004;  // the smallest change shows
  EXPECT_NE(PairTextsOf(b).settings, ta.settings);
  b.streams[1].rules.min_score = 0.1;
  EXPECT_NE(PairTextsOf(b).rules, ta.rules);
}

}  // namespace
}  // namespace vigil::pipeline
