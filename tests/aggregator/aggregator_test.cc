// The aggregator service end to end on loopback: a raw protocol-v2 edge client (connection.h, protocol.h)
// → receiver → SQLite → HTTP.
#include "vigil/aggregator/aggregator.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "testing/colour_classifier.h"
#include "testing/eventually.h"
#include "testing/test_certs.h"
#include "testing/test_database.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/link.h"
#include "vigil/transport/protocol.h"

namespace vigil::aggregator {
namespace {

using testutil::Eventually;
using nlohmann::json;
using std::chrono::milliseconds;
using transport::Ack;
using transport::Reject;
using transport::RejectReason;
using transport::Report;
using transport::ReportKind;
using transport::Welcome;
using transport::WelcomeStream;

constexpr milliseconds kWait{20000};  // generous: an upper bound on a busy 2-core machine, not a timing assertion

std::string Message(const Status& s) { return std::string(s.message()); }

// Every test edge id's key (raw bytes), as the keys file the fixture writes holds it in hex.
const std::string kTestKey(32, '\x5a');
std::string Hex(std::string_view raw) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : raw) {
    h += d[c >> 4];
    h += d[c & 15];
  }
  return h;
}

TEST(AggregatorConfigTest, ReadsEveryKey) {
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "listen: 127.0.0.1:0\nhttp: ':8080'\ndb: /tmp/a.db\ndb_synchronous: full\nmax_connections: 8\n"
      "batch_max: 64\nqueue_max: 1000\npeer_timeout_ms: 2500\nsnapshot_queue_mb: 16\n"
      "ucx_listen: 10.0.0.1:7500\nucx_device: cuda:1\ntls: {cert_file: s.pem, key_file: s.key, client_ca_file: ca.pem}\n"
      "allow: [127.0.0.1/32, 10.0.0.0/8]\nauth: {keys_file: keys.yaml}\n"
      "http_tls: {cert_file: h.pem, key_file: h.key}\nhttp_token_file: token\n",
      "agg.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->ucx_enabled);
  EXPECT_EQ(c->ucx_host, "10.0.0.1");
  EXPECT_EQ(c->ucx_port, 7500);
  EXPECT_EQ(c->ucx_device, "cuda:1");
  EXPECT_EQ(c->tls_cert_file, "s.pem");
  EXPECT_EQ(c->tls_key_file, "s.key");
  EXPECT_EQ(c->tls_client_ca_file, "ca.pem");
  EXPECT_EQ(c->allow, (std::vector<std::string>{"127.0.0.1/32", "10.0.0.0/8"}));
  EXPECT_EQ(c->keys_file, "keys.yaml");
  EXPECT_TRUE(c->auth_required);
  EXPECT_EQ(c->http_cert_file, "h.pem");
  EXPECT_EQ(c->http_key_file, "h.key");
  EXPECT_EQ(c->http_token_file, "token");
  EXPECT_EQ(c->listen_host, "127.0.0.1");
  EXPECT_EQ(c->listen_port, 0);
  EXPECT_EQ(c->http_host, "");
  EXPECT_EQ(c->http_port, 8080);
  EXPECT_EQ(c->db_path, "/tmp/a.db");
  EXPECT_TRUE(c->db_synchronous_full);
  EXPECT_EQ(c->max_connections, 8);
  EXPECT_EQ(c->batch_max, 64);
  EXPECT_EQ(c->queue_max, 1000);
  EXPECT_EQ(c->peer_timeout_ms, 2500);
  EXPECT_EQ(c->snapshot_queue_mb, 16);

  // Authentication is on unless switched off in so many words.
  EXPECT_EQ(Message(ParseAggregatorConfig("", "empty.yaml").status()),
            "empty.yaml: auth: keys_file is required (a YAML map `edge-id: hex key`; make a key with `openssl rand -hex "
            "32`), or `auth: {required: false}` to accept edges without authentication");
  StatusOr<AggregatorConfig> defaults = ParseAggregatorConfig("auth: {required: false}", "open.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->listen_port, 7400);
  EXPECT_EQ(defaults->db_path, "vigil-aggregator.db");
  EXPECT_FALSE(defaults->ucx_enabled);
  EXPECT_EQ(defaults->ucx_device, "host");
  EXPECT_FALSE(defaults->cuda_ipc_enabled);
  EXPECT_TRUE(defaults->allow.empty());
  EXPECT_FALSE(defaults->auth_required);

  StatusOr<AggregatorConfig> ipc = ParseAggregatorConfig(
      "auth: {required: false}\ncuda_ipc: {socket: /run/vigil/agg.sock, device: cuda:1, slots: 128, "
      "slot_bytes: 32768, allow_uids: [1000, 1001]}\n",
      "ipc.yaml");
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  EXPECT_TRUE(ipc->cuda_ipc_enabled);
  EXPECT_EQ(ipc->cuda_ipc_socket, "/run/vigil/agg.sock");
  EXPECT_EQ(ipc->cuda_ipc_device, "cuda:1");
  EXPECT_EQ(ipc->cuda_ipc_slots, 128u);
  EXPECT_EQ(ipc->cuda_ipc_slot_bytes, 32768u);
  EXPECT_EQ(ipc->cuda_ipc_allow_uids, (std::vector<uint32_t>{1000, 1001}));
  StatusOr<AggregatorConfig> ipc_defaults =
      ParseAggregatorConfig("auth: {required: false}\ncuda_ipc: {socket: a.sock}\n", "ipc.yaml");
  ASSERT_TRUE(ipc_defaults.ok()) << ipc_defaults.status();
  EXPECT_EQ(ipc_defaults->cuda_ipc_device, "cuda:0");
  EXPECT_EQ(ipc_defaults->cuda_ipc_slots, 64u);
  EXPECT_EQ(ipc_defaults->cuda_ipc_slot_bytes, 65536u);
  EXPECT_TRUE(ipc_defaults->cuda_ipc_allow_uids.empty());
}

TEST(AggregatorConfigTest, PushSinksAreReadAndTheirSecretsComeFromAFileOrTheEnvironment) {
  const std::string token = ::testing::TempDir() + "/vigil-push-token";
  std::ofstream(token) << "t0ken-from-file\n";
  ::setenv("VIGIL_TEST_PUSH_TOKEN", "t0ken-from-env", 1);
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      StrCat("auth: {required: false}\npush:\n"
             "  - name: mes\n    webhook: {url: 'https://mes.plant:8443/vigil', timeout_ms: 2000, token_file: ", token,
             ", ca_file: ca.pem}\n"
             "    route: {edges: [line-3], streams: [door], classes: [person, car], min_severity: warning}\n"
             "    retry: {initial_ms: 250, max_ms: 30000, max_attempts: 7}\n"
             "  - name: alarms\n    webhook: {url: 'http://alarm/hook', token_env: VIGIL_TEST_PUSH_TOKEN}\n"),
      "agg.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->push.size(), 2u);
  const PushSinkConfig& mes = c->push[0];
  EXPECT_EQ(mes.route.sink, "mes");
  EXPECT_EQ(mes.route.edges, std::vector<std::string>{"line-3"});
  EXPECT_EQ(mes.route.streams, std::vector<std::string>{"door"});
  EXPECT_EQ(mes.route.classes, (std::vector<std::string>{"person", "car"}));
  EXPECT_EQ(mes.route.min_severity, "warning");
  EXPECT_EQ(mes.webhook.sink, "mes");
  EXPECT_EQ(mes.webhook.url, "https://mes.plant:8443/vigil");
  EXPECT_EQ(mes.webhook.timeout_ms, 2000);
  EXPECT_EQ(mes.webhook.token, "t0ken-from-file");
  EXPECT_EQ(mes.webhook.ca_file, "ca.pem");
  EXPECT_EQ(mes.retry.initial_ms, 250);
  EXPECT_EQ(mes.retry.max_ms, 30000);
  EXPECT_EQ(mes.retry.max_attempts, 7);
  const PushSinkConfig& alarms = c->push[1];
  EXPECT_EQ(alarms.webhook.token, "t0ken-from-env");
  EXPECT_TRUE(alarms.route.classes.empty());
  EXPECT_EQ(alarms.retry.max_attempts, 20);  // the defaults
  EXPECT_EQ(alarms.webhook.timeout_ms, 5000);

  // Errors name the key; a secret never appears in a message.
  const std::string bad = Message(
      ParseAggregatorConfig("auth: {required: false}\npush:\n"
                            "  - name: a\n    webhook: {url: 'ftp://x', token_env: VIGIL_TEST_PUSH_TOKEN}\n"
                            "    route: {min_severity: loud}\n"
                            "  - name: a\n    webhook: {url: 'http://x', token_env: VIGIL_NOT_SET_ANYWHERE}\n"
                            "  - name: b\n    webhok: {url: 'http://x'}\n",
                            "bad.yaml")
          .status());
  EXPECT_NE(bad.find("push[0].webhook.url"), std::string::npos) << bad;
  EXPECT_NE(bad.find("'ftp://x' is not an http:// or https:// URL"), std::string::npos) << bad;
  EXPECT_NE(bad.find("min_severity"), std::string::npos) << bad;
  EXPECT_NE(bad.find("'a' names two push sinks"), std::string::npos) << bad;
  EXPECT_NE(bad.find("VIGIL_NOT_SET_ANYWHERE is not set"), std::string::npos) << bad;
  EXPECT_NE(bad.find("webhok"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("t0ken"), std::string::npos) << bad;
  const std::string both = Message(
      ParseAggregatorConfig("auth: {required: false}\npush:\n  - name: a\n    webhook: {url: 'http://x'}\n"
                            "    mqtt: {broker: 'mqtt://b:1883'}\n    retry: {initial_ms: 500, max_ms: 100}\n"
                            "  - name: c\n",
                            "both.yaml")
          .status());
  EXPECT_NE(both.find("push[0].mqtt: a push sink has one delivery: webhook or mqtt, not both"), std::string::npos) << both;
  EXPECT_NE(both.find("'mqtt://b:1883': give host:port, without a scheme"), std::string::npos) << both;
  EXPECT_NE(both.find("push[0].retry.max_ms: 100 is below initial_ms (500)"), std::string::npos) << both;
  EXPECT_NE(both.find("push sink 'c' has no delivery: give a webhook: or an mqtt: section"), std::string::npos) << both;
  ::unsetenv("VIGIL_TEST_PUSH_TOKEN");
}

TEST(AggregatorConfigTest, ConfirmationIsReadAndItsErrorsNameTheKey) {
  const std::string model = ::testing::TempDir() + "/helmet.onnx";  // only its existence is checked here
  std::ofstream(model) << "x";
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "auth: {required: false}\n"
      "confirm:\n"
      "  tracker: {high_score: 0.4, low_score: 0.05, new_track_score: 0.5, min_hits: 3, max_lost_s: 2}\n"
      "  rules: {k: 3, m: 5, min_duration_s: 0.5}\n"
      "  overrides:\n"
      "    - {classes: [car], min_travel_px: 40}\n"
      "    - {streams: [gate], k: 1, m: 1}\n"
      "  idle_s: 10\n"
      "  association: {device: cuda:1, max_streams: 256, max_tracks: 128, max_detections: 600}\n"
      "  classifier:\n"
      "    model: " + model + "\n    device: cuda:1\n    threads: 2\n    labels: [helmet, bare_head, glare]\n"
      "    normalize: imagenet\n    min_score: 0.7\n    confirm: [helmet, bare_head]\n    reject: [glare]\n"
      "    relabel: {bare_head: no_helmet}\n    wait_s: 3\n"
      "push:\n  - name: a\n    webhook: {url: 'http://x'}\n    on: confirmed\n",
      "agg.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const ConfirmConfig& k = c->confirm;
  EXPECT_TRUE(k.enabled);
  EXPECT_FLOAT_EQ(k.tracker.high_score, 0.4f);
  EXPECT_FLOAT_EQ(k.tracker.low_score, 0.05f);
  EXPECT_FLOAT_EQ(k.tracker.new_track_score, 0.5f);
  EXPECT_EQ(k.tracker.min_hits, 3);
  EXPECT_EQ(k.tracker.max_lost_s, 2);
  EXPECT_EQ(k.rules.k, 3);
  EXPECT_EQ(k.rules.m, 5);
  EXPECT_EQ(k.rules.min_duration_s, 0.5);
  ASSERT_EQ(k.overrides.size(), 2u);
  EXPECT_EQ(k.overrides[0].classes, std::vector<std::string>{"car"});
  EXPECT_EQ(k.overrides[0].rules.min_travel_px, 40);
  EXPECT_EQ(k.overrides[0].rules.k, 3) << "what an override does not say, the rules say";
  EXPECT_EQ(k.overrides[1].streams, std::vector<std::string>{"gate"});
  EXPECT_EQ(k.overrides[1].rules.m, 1);
  EXPECT_EQ(k.idle_s, 10);
  EXPECT_EQ(k.association_device, "cuda:1");
  EXPECT_EQ(k.association_limits.max_streams, 256u);
  EXPECT_EQ(k.association_limits.max_tracks, 128u);
  EXPECT_EQ(k.association_limits.max_detections, 600u);
  ASSERT_TRUE(k.classifier_enabled);
  EXPECT_EQ(k.classifier.model, model);
  EXPECT_EQ(k.classifier.device, "cuda:1");
  EXPECT_EQ(k.classifier.threads, 2);
  EXPECT_EQ(k.classifier.labels, (std::vector<std::string>{"helmet", "bare_head", "glare"}));
  EXPECT_TRUE(k.classifier.imagenet);
  EXPECT_FLOAT_EQ(k.classifier.min_score, 0.7f);
  EXPECT_EQ(k.classifier.confirm, (std::vector<std::string>{"helmet", "bare_head"}));
  EXPECT_EQ(k.classifier.reject, std::vector<std::string>{"glare"});
  EXPECT_EQ(k.classifier.relabel, (std::map<std::string, std::string>{{"bare_head", "no_helmet"}}));
  EXPECT_EQ(k.classifier.wait_s, 3);
  EXPECT_TRUE(c->push[0].route.on_confirmed);
  StatusOr<AggregatorConfig> off = ParseAggregatorConfig("auth: {required: false}\n", "agg.yaml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->confirm.enabled);
  EXPECT_EQ(off->confirm.association_device, "auto") << "the default: the GPU rows arrive on, else the CPU";

  const std::string bad = std::string(
      ParseAggregatorConfig("auth: {required: false}\nconfirm:\n  rules: {k: 4, m: 2}\n  tracker: {low_score: 0.9}\n"
                            "  association: {device: gpu0, max_tracks: 5000}\n"
                            "  classifier: {device: tpu, confirm: [a], reject: [a]}\n"
                            "push:\n  - name: a\n    webhook: {url: 'http://x'}\n    on: decided\n",
                            "agg.yaml")
          .status()
          .message());
  EXPECT_NE(bad.find("confirm.rules.k"), std::string::npos) << bad;
  EXPECT_NE(bad.find("4 is above m (2)"), std::string::npos) << bad;
  EXPECT_NE(bad.find("push[0].on"), std::string::npos) << bad;
  EXPECT_NE(bad.find("confirm.association.device: 'gpu0': expected auto, cpu or cuda:N"), std::string::npos) << bad;
  EXPECT_NE(bad.find("confirm.association.max_tracks"), std::string::npos) << bad;
  const std::string once = std::string(
      ParseAggregatorConfig("auth: {required: false}\npush:\n  - name: a\n    webhook: {url: 'http://x'}\n"
                            "    once_per_track: true\n",
                            "agg.yaml")
          .status()
          .message());
  EXPECT_NE(once.find("push[0].once_per_track: needs on: confirmed"), std::string::npos) << once;
  EXPECT_NE(bad.find("confirm.classifier: missing required key 'model'"), std::string::npos) << bad;
  EXPECT_NE(bad.find("confirm.classifier.device: 'tpu' is not cpu or cuda:N"), std::string::npos) << bad;
  EXPECT_NE(bad.find("confirm.classifier.reject: 'a' is in both confirm and reject"), std::string::npos) << bad;
  EXPECT_NE(bad.find("confirm.tracker.low_score: low_score 0.9: must be in [0, high_score 0.5)"), std::string::npos)
      << bad;
  const std::string missing = std::string(
      ParseAggregatorConfig("auth: {required: false}\nconfirm:\n  classifier: {model: /nonexistent/cls.onnx}\n",
                            "agg.yaml")
          .status()
          .message());
  EXPECT_NE(missing.find("agg.yaml:3:23: confirm.classifier.model: '/nonexistent/cls.onnx' is not a file"),
            std::string::npos)
      << missing;
}

TEST(AggregatorConfigTest, ADatabaseUrlItsPasswordAndRetentionAreRead) {
  ::setenv("VIGIL_TEST_DB_PASSWORD", "pa55-from-env", 1);
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "auth: {required: false}\ndb: postgresql://vigil@db.plant:5432/vigil\ndb_password_env: VIGIL_TEST_DB_PASSWORD\n"
      "retention: {max_age_hours: 72, max_events: 1000000, interval_s: 30}\n",
      "pg.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->db_path, "postgresql://vigil@db.plant:5432/vigil");
  EXPECT_EQ(c->db_password, "pa55-from-env");
  EXPECT_EQ(c->retention.max_age_ns, int64_t{72} * 3600 * 1'000'000'000);
  EXPECT_EQ(c->retention.max_events, 1000000u);
  EXPECT_EQ(c->retention_interval_s, 30);
  StatusOr<AggregatorConfig> defaults = ParseAggregatorConfig("auth: {required: false}", "open.yaml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_FALSE(defaults->retention.any());  // kept forever unless asked

  const std::string bad = Message(
      ParseAggregatorConfig("auth: {required: false}\ndb: agg.db\ndb_password_env: VIGIL_TEST_DB_PASSWORD\n"
                            "retention: {max_age_hours: -1, max_evnts: 5}\n",
                            "bad.yaml")
          .status());
  EXPECT_NE(bad.find("db_password_file: a password is for a PostgreSQL database"), std::string::npos) << bad;
  EXPECT_NE(bad.find("retention.max_age_hours"), std::string::npos) << bad;
  EXPECT_NE(bad.find("max_evnts"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("pa55"), std::string::npos) << bad;
  ::unsetenv("VIGIL_TEST_DB_PASSWORD");
}

TEST(AggregatorConfigTest, CudaIpcErrorsNameTheKey) {
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "auth: {required: false}\n"
      "cuda_ipc: {device: gpu0, slots: 1, allow_uids: [root]}\n",
      "agg.yaml");
  ASSERT_FALSE(c.ok());
  const std::string m = Message(c.status());
  EXPECT_NE(m.find("cuda_ipc: missing required key 'socket'"), std::string::npos) << m;
  EXPECT_NE(m.find("cuda_ipc.device: 'gpu0': expected cuda:N or host"), std::string::npos) << m;
  EXPECT_NE(m.find("cuda_ipc.slots: 1 is out of range [2, 65536]"), std::string::npos) << m;
  EXPECT_NE(m.find("cuda_ipc.allow_uids: 'root' is not a numeric uid"), std::string::npos) << m;
  for (const char* bad : {"gpu0", "cuda:", "cuda:x1", "cuda:-1"}) {
    const std::string m2 =
        Message(ParseAggregatorConfig(StrCat("auth: {required: false}\nucx_device: '", bad, "'\n"), "agg.yaml").status());
    EXPECT_NE(m2.find(StrCat("ucx_device: '", bad, "': expected cuda:N or host")), std::string::npos) << m2;
  }
}

TEST(AggregatorConfigTest, ErrorsNameKeyAndLine) {
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "listen: 0.0.0.0:99999\n"
      "http: 127.0.0.1:7401\n"
      "batch_max: lots\n"
      "databse: x.db\n"
      "db_synchronous: sometimes\n"
      "peer_timeout_ms: 5\n"
      "auth: {keys_file: k.yaml}\n",
      "agg.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(c.status()),
            "agg.yaml:1:9: listen: port 99999 is out of range [0, 65535]\n"
            "agg.yaml:3:12: batch_max: expected an integer, got 'lots'\n"
            "agg.yaml:4:1: databse: unknown key\n"
            "agg.yaml:5:17: db_synchronous: 'sometimes' is not one of: normal, full\n"
            "agg.yaml:6:18: peer_timeout_ms: 5 is out of range [100, 3600000]");
  EXPECT_EQ(LoadAggregatorConfig("/nonexistent/agg.yaml").status().code(), absl::StatusCode::kNotFound);
}

// A minimal edge: one TCP connection, frames written as they are given, every received message collected
// by a reader thread (so the aggregator's writer never waits on this client).
class RawEdge {
 public:
  explicit RawEdge(uint16_t port, std::string key = kTestKey) : key_(std::move(key)) {
    StatusOr<std::unique_ptr<transport::Connection>> c =
        transport::MakeTcpDialer("127.0.0.1", port)->Dial(milliseconds(5000));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) {
      closed_ = true;
      return;
    }
    conn_ = std::move(*c);
    reader_ = std::thread([this] { ReadLoop(); });
  }
  ~RawEdge() {
    if (conn_) conn_->Shutdown();
    if (reader_.joinable()) reader_.join();
  }

  Status Send(const transport::Message& m) { return Write(transport::EncodeFrame(m)); }
  // Reports, stamped with the connection's next link_seq numbers as a link would.
  Status Send(const std::vector<Report>& reports) {
    std::string frames;
    for (Report r : reports) {
      r.link_seq = link_seq_++;
      transport::AppendFrame(r, &frames);
    }
    return Write(frames);
  }

  bool aggregator_proved = false;  // the last Challenge proved the key this edge holds
  // Writes raw bytes (a replay, garbage).
  Status SendRaw(const std::string& bytes) { return Write(bytes); }
  // Every frame this edge wrote, in order (for a replay).
  const std::string& written() const { return written_; }

  // Says Hello; the Welcome, or nullopt when refused (then reject() says why) or nothing came.
  std::optional<Welcome> Hello(const std::string& edge, uint64_t held, std::vector<std::string> classes = {"person"},
                               std::vector<transport::HelloStream> streams = {}, uint8_t flags = 0) {
    transport::Hello h;
    h.edge = edge;
    h.epoch = held;
    h.flags = flags;
    h.class_names = std::move(classes);
    h.streams = std::move(streams);
    h.nonce = transport::RandomNonce();
    EXPECT_TRUE(Send(h).ok());
    // The handshake: the aggregator proves the key, then so does this edge.
    std::optional<transport::Challenge> challenge;
    EXPECT_TRUE(WaitUntil([&] {
      for (const transport::Message& m : messages_) {
        if (const auto* c = std::get_if<transport::Challenge>(&m)) challenge = *c;
      }
      return challenge.has_value() || closed_;
    })) << edge << ": no Challenge";
    if (!challenge) return std::nullopt;
    // A wrong key (a test of the aggregator's refusal) still answers, as an attacker would.
    aggregator_proved = challenge->proof == transport::AggregatorProof(key_, h, challenge->nonce);
    EXPECT_TRUE(Send(transport::Auth{transport::EdgeProof(key_, h, challenge->nonce)}).ok());
    std::optional<Welcome> w;
    EXPECT_TRUE(WaitUntil([&] {
      for (const transport::Message& m : messages_) {
        if (const Welcome* x = std::get_if<Welcome>(&m)) w = *x;
        if (std::holds_alternative<Reject>(m)) return true;
      }
      return w.has_value() || closed_;
    })) << edge << ": no answer to Hello";
    return w;
  }

  // Waits (up to kWait) until `pred` holds; it runs under the lock, reading messages_ and closed_.
  bool WaitUntil(const std::function<bool()>& pred, milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, pred);
  }
  bool WaitClosed() {
    return WaitUntil([&] { return closed_; });
  }
  // Waits until `n` reports were answered (Ack or a Reject naming a stream).
  bool WaitAnswers(size_t n) {
    return WaitUntil([&] { return AnswersLocked() >= n || closed_; }) && answers() >= n;
  }

  std::vector<Ack> acks() const {
    std::lock_guard lock(mu_);
    std::vector<Ack> out;
    for (const transport::Message& m : messages_) {
      if (const Ack* a = std::get_if<Ack>(&m)) out.push_back(*a);
    }
    return out;
  }
  std::vector<Reject> rejects() const {
    std::lock_guard lock(mu_);
    std::vector<Reject> out;
    for (const transport::Message& m : messages_) {
      if (const Reject* r = std::get_if<Reject>(&m)) out.push_back(*r);
    }
    return out;
  }
  // The messages received so far; only inside a WaitUntil predicate (the lock is held there).
  const std::vector<transport::Message>& MessagesLocked() const { return messages_; }
  size_t answers() const {
    std::lock_guard lock(mu_);
    return AnswersLocked();
  }
  // Highest contiguous_through acknowledged for (stream, run); -1 none.
  int64_t AckedThrough(const std::string& stream, uint64_t run = 1) const {
    int64_t c = -1;
    for (const Ack& a : acks()) {
      if (a.stream == stream && a.run == run) c = std::max(c, a.contiguous_through);
    }
    return c;
  }

 private:
  Status Write(const std::string& bytes) {
    if (!conn_) return absl::UnavailableError("not connected");
    written_ += bytes;
    return conn_->Write(bytes, milliseconds(10000));
  }
  size_t AnswersLocked() const {
    size_t n = 0;
    for (const transport::Message& m : messages_) {
      if (std::holds_alternative<Ack>(m)) ++n;
      if (const Reject* r = std::get_if<Reject>(&m); r != nullptr && !r->stream.empty()) ++n;
    }
    return n;
  }
  void ReadLoop() {
    transport::FrameDecoder decoder;
    std::string buf(64 << 10, '\0');
    for (;;) {
      StatusOr<size_t> n = conn_->Read(buf.data(), buf.size(), milliseconds(60000));
      if (!n.ok()) break;
      decoder.Feed(std::string_view(buf.data(), *n));
      std::lock_guard lock(mu_);
      for (;;) {
        StatusOr<std::optional<transport::Message>> m = decoder.Next();
        EXPECT_TRUE(m.ok()) << m.status();
        if (!m.ok() || !m->has_value()) break;
        messages_.push_back(std::move(**m));
      }
      cv_.notify_all();
    }
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

  std::unique_ptr<transport::Connection> conn_;
  std::thread reader_;
  mutable std::mutex mu_;
  const std::string key_;
  uint64_t link_seq_ = 0;
  std::string written_;
  std::condition_variable cv_;
  std::vector<transport::Message> messages_;  // GUARDED_BY(mu_)
  bool closed_ = false;                       // GUARDED_BY(mu_) the aggregator closed the connection
};

class AggregatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("vigil_agg_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
    config_.listen_host = "127.0.0.1";
    config_.listen_port = 0;
    config_.http_host = "127.0.0.1";
    config_.http_port = 0;
    config_.db_path = (dir_ / "agg.db").string();
    config_.batch_max = 64;
    config_.keys_file = (dir_ / "keys.yaml").string();
    {
      std::ofstream keys(config_.keys_file);
      for (int e = 0; e < 8; ++e) keys << "edge-" << e << ": " << Hex(kTestKey) << "\n";
    }
    std::filesystem::permissions(config_.keys_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Aggregator> StartAggregator() {
    StatusOr<std::unique_ptr<Aggregator>> a = Aggregator::Start(config_);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }

  // Reports for frames first..last of `stream`, run 1: an event (one detection of class `cls`) every 4th
  // frame, progress ranges between.
  static std::vector<Report> Frames(const std::string& edge, uint64_t epoch, const std::string& stream,
                                    uint64_t first, uint64_t last, float cls = 0) {
    std::vector<Report> out;
    for (uint64_t seq = first; seq <= last;) {
      Report& r = out.emplace_back();
      r.edge = edge;
      r.epoch = epoch;
      r.stream = stream;
      r.run = 1;
      r.seq_first = seq;
      r.capture_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(seq) * 40'000'000;
      r.width = 768;
      r.height = 576;
      if (seq % 4 == 0) {
        r.kind = ReportKind::kEvent;
        r.seq_last = seq;
        r.rule = "person";
        r.severity = transport::Severity::kWarning;
        r.detections = {{1, 2, 30, 40, 0.8f, cls}};
      } else {
        r.seq_last = std::min(last, seq - seq % 4 + 3);
      }
      seq = r.seq_last + 1;
    }
    return out;
  }
  static Report Marks(const std::string& edge, uint64_t epoch, ReportKind kind, uint64_t first, uint64_t last) {
    Report r;
    r.edge = edge;
    r.epoch = epoch;
    r.stream = "cam0";
    r.run = 1;
    r.seq_first = first;
    r.seq_last = last;
    r.kind = kind;
    r.rule = kind == ReportKind::kLost ? "lost_on_restart" : "queue_full";
    return r;
  }

  // Sends `reports` and waits until each is answered; they must all be acked.
  static void SendAndAwaitAcks(RawEdge& e, const std::vector<Report>& reports) {
    const size_t before = e.answers();
    ASSERT_TRUE(e.Send(reports).ok());
    ASSERT_TRUE(e.WaitAnswers(before + reports.size())) << e.answers() << " of " << before + reports.size();
    ASSERT_EQ(e.acks().size(), e.answers());
  }

  static void SendAndAwaitAnswers(RawEdge& e, const std::vector<Report>& reports) {
    const size_t before = e.answers();
    ASSERT_TRUE(e.Send(reports).ok());
    ASSERT_TRUE(e.WaitAnswers(before + reports.size())) << e.answers() << " of " << before + reports.size();
  }

  json Get(uint16_t port, const std::string& path, int expect_status = 200) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(5, 0);
    auto res = c.Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return json();
    EXPECT_EQ(res->status, expect_status) << path << ": " << res->body;
    if (res->get_header_value("Content-Type") != "application/json") return json(res->body);
    return json::parse(res->body);
  }
  std::string Metrics(uint16_t http_port) { return Get(http_port, "/metrics").get<std::string>(); }

  int64_t Query(const std::string& sql) { return testing::QuerySqliteInt(config_.db_path, sql); }

  std::filesystem::path dir_;
  AggregatorConfig config_;
};

TEST_F(AggregatorTest, StoresReportsAndServesThemOverHttp) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  RawEdge edge(agg->listen_port());
  std::optional<Welcome> w = edge.Hello("edge-1", 0, {"person", "bicycle"}, {{"cam0", 1}});
  EXPECT_TRUE(edge.aggregator_proved);
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, (Welcome{1, {{"cam0", 1, -1, -1}}}));
  SendAndAwaitAcks(edge, Frames("edge-1", 1, "cam0", 0, 99));
  SendAndAwaitAcks(edge, Frames("edge-1", 1, "cam1", 0, 9, /*cls=*/5));  // class 5: not in the Hello
  EXPECT_EQ(edge.AckedThrough("cam0"), 99);
  EXPECT_EQ(edge.AckedThrough("cam1"), 9);

  json health = Get(agg->http_port(), "/healthz");
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["schema_version"], Store::kSchemaVersion);
  EXPECT_EQ(health["edges_connected"], 1);

  json stats = Get(agg->http_port(), "/api/stats");
  ASSERT_EQ(stats["streams"].size(), 2u);
  const json& cam0 = stats["streams"][0];
  EXPECT_EQ(cam0["stream"], "cam0");
  EXPECT_EQ(cam0["frames"], 100);
  EXPECT_EQ(cam0["events"], 25);
  EXPECT_EQ(cam0["missing"], 0);
  EXPECT_EQ(cam0["dropped"], 0);
  EXPECT_EQ(cam0["epoch"], 1);
  EXPECT_EQ(cam0["runs"][0]["contiguous_through"], 99);
  EXPECT_EQ(cam0["runs"][0]["gaps"], json::array());
  ASSERT_EQ(stats["edges"].size(), 1u);
  EXPECT_EQ(stats["edges"][0]["edge"], "edge-1");
  EXPECT_EQ(stats["edges"][0]["epoch"], 1);
  EXPECT_EQ(stats["edges"][0]["connected"], true);
  EXPECT_EQ(stats["edges"][0]["frames"], 110);
  EXPECT_EQ(stats["edges"][0]["events"], 28);

  json page = Get(agg->http_port(), "/api/events?stream=cam0&limit=10");
  ASSERT_EQ(page["events"].size(), 10u);
  const json& e = page["events"][0];
  EXPECT_EQ(e["seq"], 0);
  EXPECT_EQ(e["epoch"], 1);
  EXPECT_EQ(e["severity"], "warning");
  EXPECT_EQ(e["capture_ns"], 1'700'000'000'000'000'000);
  EXPECT_EQ(e["detections"][0]["class_id"], 0);
  EXPECT_EQ(e["detections"][0]["label"], "person");  // from the Hello's class names
  EXPECT_EQ(e["detections"][0]["box"], json({1.0, 2.0, 30.0, 40.0}));
  json cam1 = Get(agg->http_port(), "/api/events?stream=cam1&limit=1");
  EXPECT_EQ(cam1["events"][0]["detections"][0]["label"], "class 5");
  json next = Get(agg->http_port(), "/api/events?stream=cam0&since_seq=" + page["next_since_seq"].dump());
  ASSERT_EQ(next["events"].size(), 15u);
  EXPECT_EQ(next["events"][0]["seq"], 40);
  // since_time in Unix seconds: frame 80 was captured 3.2 s after the first.
  json late = Get(agg->http_port(), "/api/events?stream=cam0&since_time=1700000003.2");
  ASSERT_EQ(late["events"].size(), 5u);
  EXPECT_EQ(late["events"][0]["seq"], 80);

  EXPECT_EQ(Get(agg->http_port(), "/api/events?limit=0", 400)["error"], "limit: '0' is not an integer in [1, 10000]");
  EXPECT_EQ(Get(agg->http_port(), "/api/events?since_time=yesterday", 400)["error"],
            "since_time: 'yesterday' is not a Unix time in seconds (e.g. 1700000000.5)");

  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_frames_total{edge=\"edge-1\",stream=\"cam0\"} 100\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_events_total{edge=\"edge-1\",stream=\"cam1\"} 3\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_reports_total{result=\"stored\"} 56\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_hellos_total{result=\"granted\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_transport_connections_total{link=\"tcp\",result=\"accepted\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_transport_connections_total{link=\"tcp\",result=\"authenticated\"} 1\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_frame_to_stored_seconds_count{edge=\"edge-1\",stream=\"cam0\"} 50\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("# TYPE vigil_aggregator_commit_seconds histogram\n"), std::string::npos);
}

TEST_F(AggregatorTest, DroppedAndLostMarksAreStoredCountedAndNotGaps) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  {
    RawEdge edge(agg->listen_port());
    ASSERT_TRUE(edge.Hello("edge-1", 0));
    SendAndAwaitAcks(edge, {Marks("edge-1", 1, ReportKind::kProgress, 0, 9),
                            Marks("edge-1", 1, ReportKind::kDropped, 10, 14),
                            Marks("edge-1", 1, ReportKind::kProgress, 15, 19),
                            Marks("edge-1", 1, ReportKind::kLost, 20, 22),
                            Marks("edge-1", 1, ReportKind::kDropped, 10, 14)});  // re-sent: counted once
    EXPECT_EQ(edge.AckedThrough("cam0"), 22);
  }
  json run = Get(agg->http_port(), "/api/stats")["streams"][0]["runs"][0];
  EXPECT_EQ(run["frames"], 15);
  EXPECT_EQ(run["dropped"], 5);
  EXPECT_EQ(run["lost"], 3);
  EXPECT_EQ(run["contiguous_through"], 22);
  EXPECT_EQ(run["missing"], 0);
  EXPECT_EQ(run["gaps"], json::array());
  json edge_stats = Get(agg->http_port(), "/api/stats")["edges"][0];
  EXPECT_EQ(edge_stats["dropped"], 5);
  EXPECT_EQ(edge_stats["lost"], 3);
  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_dropped_frames_total{edge=\"edge-1\",stream=\"cam0\"} 5\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_lost_frames_total{edge=\"edge-1\",stream=\"cam0\"} 3\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_duplicate_frames_total{edge=\"edge-1\",stream=\"cam0\"} 5\n"),
            std::string::npos);
  // The edge reconnects holding epoch 1: re-admitted, told what is stored of its run.
  RawEdge again(agg->listen_port());
  std::optional<Welcome> w = again.Hello("edge-1", 1, {"person"}, {{"cam0", 1}});
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, (Welcome{1, {{"cam0", 1, 22, 22}}}));
}

TEST_F(AggregatorTest, ReSentFramesAreStoredOnceAndAnOldEpochIsFenced) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  {
    RawEdge first(agg->listen_port());
    ASSERT_EQ(first.Hello("edge-1", 0)->epoch, 1u);
    SendAndAwaitAcks(first, Frames("edge-1", 1, "cam0", 0, 39));
  }
  // The edge restarts as a new instance from an old cursor: granted epoch 2, frames 20..39 are re-sent,
  // 40..59 are new.
  RawEdge restarted(agg->listen_port());
  std::optional<Welcome> w = restarted.Hello("edge-1", 0, {"person"}, {{"cam0", 1}});
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, (Welcome{2, {{"cam0", 1, 39, 39}}}));
  SendAndAwaitAcks(restarted, Frames("edge-1", 2, "cam0", 20, 59));
  EXPECT_EQ(restarted.AckedThrough("cam0"), 59);
  // A zombie of the old instance (epoch 1) is refused at its Hello and closed.
  RawEdge zombie(agg->listen_port());
  EXPECT_FALSE(zombie.Hello("edge-1", 1));
  ASSERT_EQ(zombie.rejects().size(), 1u);
  EXPECT_EQ(zombie.rejects()[0], (Reject{RejectReason::kFenced, "", 0, 0, 0, 2,
                                         "edge edge-1: epoch 1 is older than 2, held by a newer instance"}));
  EXPECT_TRUE(zombie.WaitClosed());
  // The current instance is untouched by it.
  SendAndAwaitAcks(restarted, Frames("edge-1", 2, "cam0", 60, 63));

  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 64);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 16);
  json s = Get(agg->http_port(), "/api/stats")["streams"][0];
  EXPECT_EQ(s["frames"], 64);
  EXPECT_EQ(s["duplicates"], 20);
  EXPECT_EQ(s["epoch"], 2);
  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_duplicate_frames_total{edge=\"edge-1\",stream=\"cam0\"} 20\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_hellos_total{result=\"fenced\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_hellos_total{result=\"granted\"} 2\n"), std::string::npos);
}

TEST_F(AggregatorTest, ASecondHelloOfTheEdgeIdEvictsTheFirstSession) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  RawEdge old_instance(agg->listen_port());
  ASSERT_EQ(old_instance.Hello("edge-1", 0)->epoch, 1u);
  SendAndAwaitAcks(old_instance, Frames("edge-1", 1, "cam0", 0, 9));

  // A new instance of the same edge id (held 0) is granted 2; the first session is told it is fenced.
  RawEdge new_instance(agg->listen_port());
  std::optional<Welcome> w = new_instance.Hello("edge-1", 0, {"person"}, {{"cam0", 1}});
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, (Welcome{2, {{"cam0", 1, 9, 9}}}));
  EXPECT_TRUE(old_instance.WaitUntil([&] { return !old_instance.MessagesLocked().empty() &&
                                                  std::holds_alternative<Reject>(old_instance.MessagesLocked().back()); }));
  std::vector<Reject> rejects = old_instance.rejects();
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0], (Reject{RejectReason::kFenced, "", 0, 0, 0, 2,
                                "edge edge-1: epoch 1 was superseded by epoch 2, granted to a newer instance (" +
                                    rejects[0].detail.substr(rejects[0].detail.find('(') + 1)}));
  EXPECT_NE(rejects[0].detail.find("127.0.0.1:"), std::string::npos) << rejects[0].detail;
  // Its later reports (a zombie that did not listen) are refused as stale and counted; nothing is stored.
  const size_t acked = old_instance.acks().size();
  const std::vector<Report> late = Frames("edge-1", 1, "cam0", 10, 19);
  SendAndAwaitAnswers(old_instance, late);
  for (size_t i = 1; i < old_instance.rejects().size(); ++i) {
    EXPECT_EQ(old_instance.rejects()[i].reason, RejectReason::kStaleEpoch);
  }
  EXPECT_EQ(old_instance.rejects().size(), 1 + late.size());
  EXPECT_EQ(old_instance.acks().size(), acked) << "nothing after the fencing was acknowledged";
  SendAndAwaitAcks(new_instance, Frames("edge-1", 2, "cam0", 20, 23));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames WHERE epoch = 1"), 10);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames WHERE seq BETWEEN 10 AND 19"), 0);
  EXPECT_EQ(Query("SELECT stale_rejected FROM streams"), static_cast<int64_t>(late.size()));

  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_evicted_sessions_total 1\n"), std::string::npos) << metrics;
  json s = Get(agg->http_port(), "/api/stats");
  EXPECT_EQ(s["edges"][0]["epoch"], 2);
  EXPECT_EQ(s["streams"][0]["runs"][0]["gaps"], json({{10, 19}}));
}

TEST_F(AggregatorTest, AnEvictedSessionsReportsInFlightAreStaleNeverStored) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  RawEdge old_instance(agg->listen_port());
  ASSERT_EQ(old_instance.Hello("edge-1", 0)->epoch, 1u);
  // The old instance keeps sending one-frame reports while a new instance of the same edge id says Hello:
  // reports queued before the new Hello are stored, those queued after it are refused as stale in their
  // transaction, until the old session is closed.
  std::atomic<bool> stop{false};
  std::thread barrage([&] {
    for (uint64_t seq = 0; !stop.load() && seq < 20000; ++seq) {
      if (!old_instance.Send(std::vector<Report>{Marks("edge-1", 1, ReportKind::kProgress, seq, seq)}).ok()) return;
    }
  });
  // Let some reports be stored first (without this the Hello may overtake all of them).
  ASSERT_TRUE(old_instance.WaitAnswers(50));
  RawEdge new_instance(agg->listen_port());
  std::optional<Welcome> w = new_instance.Hello("edge-1", 0);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->epoch, 2u);
  // The evicted session is told why and stays open: what it still sends is refused as stale, not stored.
  auto fenced = [&] {
    for (const Reject& r : old_instance.rejects()) {
      if (r.reason == RejectReason::kFenced && r.stream.empty()) return true;
    }
    return false;
  };
  EXPECT_TRUE(old_instance.WaitUntil([&] {
    for (const transport::Message& m : old_instance.MessagesLocked()) {
      if (const Reject* r = std::get_if<Reject>(&m); r && r->reason == RejectReason::kFenced) return true;
    }
    return false;
  }));
  EXPECT_TRUE(fenced());
  stop = true;
  barrage.join();
  ASSERT_TRUE(old_instance.Send(std::vector<Report>{Marks("edge-1", 1, ReportKind::kProgress, 30000, 30000)}).ok());
  // Its answer comes after the answers to every report the barrage sent before it (one connection, in order):
  // once it is here the stale count below is final.
  ASSERT_TRUE(old_instance.WaitUntil([&] {
    for (const transport::Message& m : old_instance.MessagesLocked()) {
      if (const Reject* r = std::get_if<Reject>(&m); r && r->seq_first == 30000) return true;
    }
    return false;
  }));
  const std::vector<Reject> rejects = old_instance.rejects();
  EXPECT_EQ(rejects.back().reason, RejectReason::kStaleEpoch) << rejects.back().detail;
  EXPECT_EQ(rejects.back().epoch, 2u);
  for (const Reject& r : rejects) {
    EXPECT_TRUE(r.reason == RejectReason::kFenced || r.reason == RejectReason::kStaleEpoch) << r.detail;
  }

  // What was stored is a prefix 0..H of what was sent: after the grant nothing of epoch 1 was stored.
  const int64_t stored = Query("SELECT COUNT(*) FROM frames");
  EXPECT_GE(stored, 50);
  EXPECT_EQ(Query("SELECT MAX(seq) FROM frames"), stored - 1);
  EXPECT_LE(static_cast<int64_t>(old_instance.acks().size()), stored);
  SendAndAwaitAcks(new_instance, {Marks("edge-1", 2, ReportKind::kLost, static_cast<uint64_t>(stored),
                                        static_cast<uint64_t>(stored) + 9)});
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames WHERE epoch = 1"), stored);

  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_evicted_sessions_total 1\n"), std::string::npos) << metrics;
  // Every stale refusal is counted in both places (how many there were depends on timing: the reports
  // read between the grant and the close).
  json s = Get(agg->http_port(), "/api/stats");
  const int64_t stale = s["streams"][0]["stale_rejected"].get<int64_t>();
  RecordProperty("stale_rejected", static_cast<int>(stale));
  EXPECT_NE(metrics.find(StrCat("vigil_aggregator_reports_total{result=\"stale\"} ", stale, "\n")),
            std::string::npos);
  EXPECT_NE(metrics.find(StrCat("vigil_aggregator_stale_rejected_total{edge=\"edge-1\",stream=\"cam0\"} ", stale,
                                "\n")),
            std::string::npos);
}

TEST_F(AggregatorTest, AReadmissionSupersedesTheSameEpochsSessionAndAGrantEvictsTheOlderEpoch) {
  // The same instance reconnects (a re-admission, as after a break or a move to a preferred link): its old
  // session is closed, so nothing it still had in flight can be stored after what the new one sends. Then a
  // new instance: the epoch-1 session is fenced. (That a report of epoch 1 committed after the grant is
  // refused is StoreTest.AnOldSessionsReportCommittedAfterANewerGrantIsStale.)
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  RawEdge a(agg->listen_port());
  ASSERT_EQ(a.Hello("edge-1", 0)->epoch, 1u);
  SendAndAwaitAcks(a, Frames("edge-1", 1, "cam0", 0, 3));
  RawEdge b(agg->listen_port());
  std::optional<Welcome> w = b.Hello("edge-1", 1);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->epoch, 1u);  // re-admitted
  EXPECT_TRUE(a.WaitClosed());  // superseded: closed without a Reject (the instance is not fenced)
  EXPECT_TRUE(a.rejects().empty());
  SendAndAwaitAcks(b, Frames("edge-1", 1, "cam0", 4, 7));
  RawEdge c(agg->listen_port());
  ASSERT_EQ(c.Hello("edge-1", 0)->epoch, 2u);
  EXPECT_TRUE(b.WaitUntil(
      [&] { return !b.MessagesLocked().empty() && std::holds_alternative<Reject>(b.MessagesLocked().back()); }));
  EXPECT_EQ(b.rejects().back().reason, RejectReason::kFenced);
  EXPECT_EQ(b.rejects().back().epoch, 2u);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 8);
  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_evicted_sessions_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_hellos_total{result=\"readmitted\"} 1\n"), std::string::npos);
}

TEST_F(AggregatorTest, KilledMidRunAndRestartedEveryFrameIsAccountedOnce) {
  constexpr uint64_t kFrames = 3000;
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  config_.listen_port = agg->listen_port();  // the restarted aggregator takes the same port
  auto edge = std::make_unique<RawEdge>(agg->listen_port());
  ASSERT_EQ(edge->Hello("edge-1", 0)->epoch, 1u);
  const std::vector<Report> all = Frames("edge-1", 1, "cam0", 0, kFrames - 1);
  ASSERT_TRUE(edge->Send(std::vector<Report>(all.begin(), all.begin() + all.size() / 2)).ok());
  // Kill once part of the run is durably acknowledged, while reports are still in flight.
  ASSERT_TRUE(edge->WaitAnswers(all.size() / 4));
  (void)edge->Send(std::vector<Report>(all.begin() + all.size() / 2, all.end()));
  agg->Kill();
  agg.reset();
  const int64_t acked = edge->AckedThrough("cam0");
  EXPECT_GE(acked, 0);
  edge.reset();

  agg = StartAggregator();
  ASSERT_TRUE(agg);
  // The edge reconnects holding epoch 1 and resumes from what the Welcome says is stored.
  edge = std::make_unique<RawEdge>(agg->listen_port());
  std::optional<Welcome> w = edge->Hello("edge-1", 1, {"person"}, {{"cam0", 1}});
  ASSERT_TRUE(w);
  EXPECT_EQ(w->epoch, 1u);
  ASSERT_EQ(w->streams.size(), 1u);
  const int64_t through = w->streams[0].contiguous_through;
  EXPECT_GE(through, acked);  // everything acked was durable
  EXPECT_GE(w->streams[0].highest_seq, through);
  // Re-send every report not wholly below the cursor (frames above it may be stored already).
  std::vector<Report> rest;
  for (const Report& r : all) {
    if (static_cast<int64_t>(r.seq_last) > through) rest.push_back(r);
  }
  SendAndAwaitAcks(*edge, rest);
  EXPECT_EQ(edge->AckedThrough("cam0"), static_cast<int64_t>(kFrames - 1));

  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), static_cast<int64_t>(kFrames));
  EXPECT_EQ(Query("SELECT COUNT(DISTINCT seq) FROM frames"), static_cast<int64_t>(kFrames));
  EXPECT_EQ(Query("SELECT MAX(seq) FROM frames"), static_cast<int64_t>(kFrames - 1));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), static_cast<int64_t>(kFrames / 4));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames f JOIN events e USING(stream_id, run, seq)"),
            static_cast<int64_t>(kFrames / 4));
  json s = Get(agg->http_port(), "/api/stats")["streams"][0];
  EXPECT_EQ(s["frames"], kFrames);
  EXPECT_EQ(s["missing"], 0);
  EXPECT_EQ(s["runs"][0]["contiguous_through"], kFrames - 1);
}

// Confirmation (confirm.h) in the aggregator as shipped: events decided by their tracks, the API's state filter and
// the metrics; a push sink waiting for confirmations gets only those (its webhook refuses connections: the rows stay
// in its outbox, counted); and a restart resumes the events left pending.
TEST_F(AggregatorTest, WithConfirmationEventsAreDecidedByTheirTracksAndPendingOnesSurviveARestart) {
  config_.confirm.enabled = true;
  config_.confirm.tracker.min_hits = 2;
  config_.confirm.rules = {.k = 3, .m = 3};
  PushSinkConfig alarms;
  alarms.route = {.sink = "alarms", .on_confirmed = true};
  alarms.webhook = {.sink = "alarms", .url = "http://127.0.0.1:1/refused"};
  alarms.retry = {.initial_ms = 60000, .max_ms = 60000, .max_attempts = 100};
  PushSinkConfig pager = alarms;  // one alert per object followed
  pager.route.sink = pager.webhook.sink = "pager";
  pager.route.once_per_track = true;
  config_.push = {alarms, pager};
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  config_.listen_port = agg->listen_port();
  auto event = [](const std::string& stream, uint64_t seq, float score = 0.9f) {
    Report r;
    r.edge = "edge-1";
    r.epoch = 1;
    r.stream = stream;
    r.run = 1;
    r.seq_first = r.seq_last = seq;
    r.capture_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(seq) * 100'000'000;
    r.kind = ReportKind::kEvent;
    r.rule = "person";
    r.severity = transport::Severity::kWarning;
    r.detections = {{100, 50, 140, 150, score, 0}};
    return r;
  };
  auto progress = [&](const std::string& stream, uint64_t first, uint64_t last) {
    Report r = event(stream, first);
    r.kind = ReportKind::kProgress;
    r.seq_last = last;
    r.rule = "";
    r.detections.clear();
    return r;
  };
  // The live channel, from now on: the decisions come as `event: state`.
  std::mutex live_mu;
  std::string live;
  std::atomic<bool> live_done{false};
  std::thread reader([&, port = agg->http_port()] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    c.Get("/api/events/live", [&](const char* data, size_t n) {
      std::lock_guard lock(live_mu);
      live.append(data, n);
      return !live_done.load();
    });
  });
  // However the test ends, the channel ends (the aggregator stops) and the reader is joined.
  auto join_reader = [&](void*) {
    live_done = true;
    if (agg) agg->Stop();
    reader.join();
  };
  std::unique_ptr<void, decltype(join_reader)> reader_guard(&reader, join_reader);
  ASSERT_TRUE(Eventually([&] {  // open before the reports: it carries what happens from then on
    std::lock_guard lock(live_mu);
    return live.starts_with(": open\n\n");
  }));
  {
    RawEdge edge(agg->listen_port());
    ASSERT_TRUE(edge.Hello("edge-1", 0, {"person"}, {{"door", 1}, {"glint", 1}, {"dim", 1}, {"yard", 1}}));
    // door: a person in 3 frames: the third confirms all three. glint: one frame, then nothing. dim: too low a score
    // for a track. yard: two frames before the restart.
    SendAndAwaitAcks(edge, {event("door", 0), event("door", 1), event("door", 2), event("glint", 0),
                            progress("glint", 1, 5), event("dim", 0, 0.3f), event("yard", 0), event("yard", 1)});
  }
  auto states = [&](const std::string& stream) {
    std::vector<std::string> out;
    const json page = Get(agg->http_port(), "/api/events?stream=" + stream);
    for (const json& e : page["events"]) out.push_back(e["state"]);
    return out;
  };
  EXPECT_EQ(states("door"), (std::vector<std::string>{"confirmed", "confirmed", "confirmed"}));
  EXPECT_EQ(states("glint"), (std::vector<std::string>{"rejected"}));
  EXPECT_EQ(states("dim"), (std::vector<std::string>{"rejected"}));
  EXPECT_EQ(states("yard"), (std::vector<std::string>{"pending", "pending"}));
  json door = Get(agg->http_port(), "/api/events?stream=door")["events"];
  EXPECT_EQ(door[0]["state_reason"], "track 1 (person): seen in 3 of the last 3 frames, for 0.20 s, travelled 0 px");
  EXPECT_EQ(door[0]["detections"][0]["track_id"], 1);
  EXPECT_GT(door[0]["decided_ns"].get<int64_t>(), 0);
  EXPECT_EQ(Get(agg->http_port(), "/api/events?stream=glint")["events"][0]["state_reason"],
            "track 2 (person): ended tentative, matched in 1 of 2 consecutive frames");
  EXPECT_EQ(Get(agg->http_port(), "/api/events?state=pending")["events"].size(), 2u);
  EXPECT_EQ(Get(agg->http_port(), "/api/events?state=maybe", 400)["error"],
            "state: 'maybe' is not pending, confirmed or rejected");
  const std::string metrics = Metrics(agg->http_port());
  EXPECT_NE(metrics.find("vigil_aggregator_event_states_total{at=\"decided\",state=\"confirmed\"} 2\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_event_states_total{at=\"stored\",state=\"rejected\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_event_states_total{at=\"decided\",state=\"rejected\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_events_pending 2\n"), std::string::npos);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'alarms'"), 3) << "the door's three, nothing else";
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'pager'"), 1) << "the door's one person, once";
  EXPECT_TRUE(Eventually([&] {
    std::lock_guard lock(live_mu);
    return live.find("\"key\":\"edge-1/glint/1/0\"") != std::string::npos;
  }));
  live_done = true;
  {
    std::lock_guard lock(live_mu);
    std::map<std::string, json> decided;  // key → its `event: state` message
    static constexpr std::string_view kState = "event: state\ndata: ";
    for (size_t at = 0; (at = live.find(kState, at)) != std::string::npos;) {
      at += kState.size();
      const json d = json::parse(live.substr(at, live.find("\n\n", at) - at));
      decided[d["key"]] = d;
    }
    ASSERT_EQ(decided.size(), 3u) << live;  // door 0 and 1 confirmed, glint 0 rejected (the rest: stored decided)
    EXPECT_EQ(decided["edge-1/door/1/0"]["state"], "confirmed");
    EXPECT_EQ(decided["edge-1/door/1/1"]["state"], "confirmed");
    EXPECT_EQ(decided["edge-1/glint/1/0"]["state"], "rejected");
    EXPECT_EQ(decided["edge-1/glint/1/0"]["state_reason"],
              "track 2 (person): ended tentative, matched in 1 of 2 consecutive frames");
    EXPECT_GT(decided["edge-1/door/1/0"]["decided_ns"].get<int64_t>(), 0);
  }
  reader_guard.reset();  // stops the aggregator: the channel ends

  // A restart: yard's two pending events are resumed from the store; the next frame confirms them.
  agg.reset();
  agg = StartAggregator();
  ASSERT_TRUE(agg);
  EXPECT_NE(Metrics(agg->http_port()).find("vigil_aggregator_events_pending 2\n"), std::string::npos);
  {
    RawEdge edge(agg->listen_port());
    ASSERT_TRUE(edge.Hello("edge-1", 1, {"person"}, {{"yard", 1}}));
    SendAndAwaitAcks(edge, {event("yard", 2)});
  }
  EXPECT_EQ(states("yard"), (std::vector<std::string>{"confirmed", "confirmed", "confirmed"}));
  json yard = Get(agg->http_port(), "/api/events?stream=yard")["events"];
  EXPECT_EQ(yard[0]["detections"][0]["track_id"], 3);
  // The rebuilt track has a new id, past the largest stored (never one another track had).
  EXPECT_EQ(yard[2]["detections"][0]["track_id"], 4);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'alarms'"), 6);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'pager'"), 2) << "and the yard's person";
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events WHERE state = 'pending'"), 0);
}

#if VIGIL_HAVE_CLASSIFIER
// The second model (classifier.h) in the aggregator as shipped: what the tracker confirms waits for its crops; a red
// crop confirms (the model's class "red" in confirm), a blue one rejects, an event with no crop is confirmed once
// wait_s ran out; the classes are stored with the detections and only confirmed events reach the on-confirmed sink.
TEST_F(AggregatorTest, TheSecondModelDecidesWhatTheTrackerConfirmsFromTheEventsCrops) {
  const std::string model = (dir_ / "colour.onnx").string();
  std::ofstream(model, std::ios::binary) << testing::ColourModel(true).SerializeAsString();
  config_.confirm.enabled = true;
  config_.confirm.tracker.min_hits = 2;
  config_.confirm.classifier_enabled = true;
  config_.confirm.classifier.model = model;
  config_.confirm.classifier.confirm = {"red"};
  config_.confirm.classifier.reject = {"blue"};
  config_.confirm.classifier.min_score = 0.5f;
  config_.confirm.classifier.wait_s = 1;
  PushSinkConfig alarms;
  alarms.route = {.sink = "alarms", .on_confirmed = true};
  alarms.webhook = {.sink = "alarms", .url = "http://127.0.0.1:1/refused"};
  alarms.retry = {.initial_ms = 60000, .max_ms = 60000, .max_attempts = 100};
  config_.push = {alarms};
  {  // The crops are stored before their events arrive (a picture may come first): frame 0 red, frame 1 blue.
    StatusOr<std::unique_ptr<Store>> st = Store::Open(config_.db_path);
    ASSERT_TRUE(st.ok()) << st.status();
    const std::string edge = "edge-1";
    const transport::Snapshot red{"door", 1, 0, 0, 100, 50, 40, 100, 40, 100, testing::Crop(0, 0, 255)};
    const transport::Snapshot blue{"door", 1, 1, 0, 100, 50, 40, 100, 40, 100, testing::Crop(255, 0, 0)};
    const std::vector<PendingSnapshot> pics = {{&edge, &red}, {&edge, &blue}};
    ASSERT_EQ(*(*st)->PutSnapshots(pics, 1), 2u);
  }
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  auto event = [](uint64_t seq) {
    Report r;
    r.edge = "edge-1";
    r.epoch = 1;
    r.stream = "door";
    r.run = 1;
    r.seq_first = r.seq_last = seq;
    r.capture_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(seq) * 100'000'000;
    r.kind = ReportKind::kEvent;
    r.rule = "person";
    r.detections = {{100, 50, 140, 150, 0.9f, 0}};
    return r;
  };
  RawEdge edge(agg->listen_port());
  ASSERT_TRUE(edge.Hello("edge-1", 0, {"person"}, {{"door", 1}}));
  SendAndAwaitAcks(edge, {event(0), event(1), event(2)});
  json events;
  ASSERT_TRUE(Eventually([&] {
    events = Get(agg->http_port(), "/api/events?stream=door")["events"];
    return events.size() == 3 && events[2]["state"] != "pending";
  })) << events.dump();
  EXPECT_EQ(events[0]["state"], "confirmed");
  EXPECT_EQ(events[0]["state_reason"],
            "track 1 (person): seen in 1 of the last 1 frames, for 0.10 s, travelled 0 px; second model: box 0 red 0.58");
  EXPECT_EQ(events[0]["detections"][0]["second_label"], "red");
  EXPECT_NEAR(events[0]["detections"][0]["second_score"].get<double>(), 0.576, 0.01);
  EXPECT_EQ(events[1]["state"], "rejected");
  EXPECT_EQ(events[1]["detections"][0]["second_label"], "blue");
  EXPECT_EQ(events[2]["state"], "confirmed");
  EXPECT_NE(events[2]["state_reason"].get<std::string>().find("second model: no crops within 1.0 s"), std::string::npos)
      << events[2]["state_reason"];
  EXPECT_EQ(events[2]["detections"][0]["second_label"], "");
  EXPECT_EQ(Query("SELECT COUNT(*) FROM push_outbox WHERE sink = 'alarms'"), 2);
  const std::string metrics = Metrics(agg->http_port());
  for (const char* line : {"vigil_aggregator_second_model_total{result=\"confirmed\"} 1\n",
                           "vigil_aggregator_second_model_total{result=\"rejected\"} 1\n",
                           "vigil_aggregator_second_model_total{result=\"no_crops\"} 1\n",
                           "vigil_aggregator_second_model_total{result=\"crops\"} 2\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
  }
}
#else
// Built with VIGIL_WITH_CLASSIFIER=OFF (the aggregator links no vigil_infer, vigil_detect, vigil_video): a config
// with confirm.classifier does not start, and says why.
TEST_F(AggregatorTest, WithoutTheClassifierBuiltInTheSecondModelFailsToStartNamingTheOption) {
  config_.confirm.enabled = true;
  config_.confirm.classifier_enabled = true;
  config_.confirm.classifier.model = (dir_ / "colour.onnx").string();
  StatusOr<std::unique_ptr<Aggregator>> a = Aggregator::Start(config_);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::IsUnimplemented(a.status())) << a.status();
  EXPECT_NE(a.status().message().find("VIGIL_WITH_CLASSIFIER=OFF"), std::string::npos) << a.status();
}
#endif  // VIGIL_HAVE_CLASSIFIER

// snapshot.jpg?boxes=1: the event's boxes drawn on its stored picture (picture_boxes.h) with the classifier's media
// modules built in; without them (VIGIL_WITH_CLASSIFIER=OFF) 501 naming the option. The picture as stored is served
// either way.
TEST_F(AggregatorTest, BoxesOnAStoredPictureAreDrawnOrRefusedNamingWhatTheBuildLacks) {
#if VIGIL_HAVE_CLASSIFIER && VIGIL_HAVE_TURBOJPEG
  const std::string jpeg = testing::Crop(40, 40, 40);
#else
  const std::string jpeg = "\xFF\xD8\xFF not decoded here";
#endif
  {
    StatusOr<std::unique_ptr<Store>> st = Store::Open(config_.db_path);
    ASSERT_TRUE(st.ok()) << st.status();
    const std::string edge = "edge-1";
    const transport::Snapshot frame{"door", 1, 0, -1, 0, 0, 160, 160, 40, 24, jpeg};
    const std::vector<PendingSnapshot> pics = {{&edge, &frame}};
    ASSERT_EQ(*(*st)->PutSnapshots(pics, 1), 1u);
  }
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  RawEdge edge(agg->listen_port());
  ASSERT_TRUE(edge.Hello("edge-1", 0, {"person"}, {{"door", 1}}));
  Report r;
  r.edge = "edge-1";
  r.epoch = 1;
  r.stream = "door";
  r.run = 1;
  r.seq_first = r.seq_last = 0;
  r.capture_ns = 1'700'000'000'000'000'000;
  r.kind = ReportKind::kEvent;
  r.rule = "person";
  r.detections = {{20, 20, 140, 140, 0.9f, 0}};
  SendAndAwaitAcks(edge, {r});
  json events = Get(agg->http_port(), "/api/events?stream=door")["events"];
  ASSERT_EQ(events.size(), 1u) << events.dump();
  const std::string url = "/api/events/" + std::to_string(events[0]["id"].get<int64_t>()) + "/snapshot.jpg?box=-1";
  EXPECT_EQ(Get(agg->http_port(), url).get<std::string>(), jpeg);
#if !VIGIL_HAVE_CLASSIFIER
  json drawn = Get(agg->http_port(), url + "&boxes=1", 501);
  EXPECT_EQ(drawn["error"],
            "boxes=1: this vigil was built without VIGIL_WITH_CLASSIFIER (the aggregator links no vigil_video: it "
            "cannot draw on a JPEG)");
#elif VIGIL_HAVE_TURBOJPEG
  const std::string drawn = Get(agg->http_port(), url + "&boxes=1").get<std::string>();
  EXPECT_EQ(drawn.substr(0, 3), "\xFF\xD8\xFF");
  EXPECT_NE(drawn, jpeg) << "the boxes are drawn on it";
#else
  json drawn = Get(agg->http_port(), url + "&boxes=1", 501);
  EXPECT_EQ(drawn["error"], "boxes=1: this vigil was built without libturbojpeg (it cannot draw on a JPEG)");
#endif
}

TEST_F(AggregatorTest, ManyEdgesAtOnce) {
  constexpr int kEdges = 6;
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  std::vector<std::thread> edges;
  std::atomic<int> done{0};
  for (int e = 0; e < kEdges; ++e) {
    edges.emplace_back([&, e] {
      const std::string id = "edge-" + std::to_string(e);
      RawEdge edge(agg->listen_port());
      std::optional<Welcome> w = edge.Hello(id, 0);
      if (!w) return;
      std::vector<Report> reports = Frames(id, w->epoch, "a", 0, 199);
      std::vector<Report> b = Frames(id, w->epoch, "b", 0, 99);
      reports.insert(reports.end(), b.begin(), b.end());
      if (edge.Send(reports).ok() && edge.WaitAnswers(reports.size()) && edge.acks().size() == reports.size()) ++done;
    });
  }
  for (std::thread& t : edges) t.join();
  EXPECT_EQ(done.load(), kEdges);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), kEdges * 300);
  json stats = Get(agg->http_port(), "/api/stats");
  ASSERT_EQ(stats["edges"].size(), static_cast<size_t>(kEdges));
  for (const json& e : stats["edges"]) {
    EXPECT_EQ(e["epoch"], 1) << e["edge"];
    EXPECT_EQ(e["frames"], 300) << e["edge"];
    EXPECT_EQ(e["events"], 75) << e["edge"];
    EXPECT_EQ(e["missing"], 0) << e["edge"];
  }
}

// Connects to 127.0.0.1:port from `source` (another loopback address); true when the aggregator closed the
// connection without sending a single byte.
bool ClosedWithoutAWord(const char* source, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  to.sin_port = htons(port);
  bool closed = false;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
    const std::string hello = transport::EncodeFrame(transport::Hello{"edge-1", 0, transport::kProtocolVersion});
    (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    const ssize_t n = ::recv(fd, &c, 1, 0);
    closed = n == 0 || (n < 0 && errno == ECONNRESET);
  }
  ::close(fd);
  return closed;
}

TEST_F(AggregatorTest, UnauthenticatedPeersAreRefusedCountedAndStoreNothingWhileTheGoodEdgeIsServed) {
  config_.allow = {"127.0.0.1/32"};
  const std::string token = "0123456789abcdef0123456789abcdef";
  config_.http_token_file = (dir_ / "token").string();
  std::ofstream(config_.http_token_file) << token << "\n";
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  const uint16_t port = agg->listen_port();
  // The good edge reports before, between and after the attacks, on one session.
  RawEdge good(port);
  ASSERT_EQ(good.Hello("edge-1", 0)->epoch, 1u);
  SendAndAwaitAcks(good, Frames("edge-1", 1, "cam0", 0, 9));

  // An address outside the allow-list: closed without a word.
  EXPECT_TRUE(ClosedWithoutAWord("127.0.0.2", port));
  // A wrong key: the aggregator's proof does not match it, and its own proof is refused.
  RawEdge wrong(port, std::string(32, '\x11'));
  EXPECT_FALSE(wrong.Hello("edge-2", 0));
  EXPECT_FALSE(wrong.aggregator_proved);
  // No key: an Auth without proof.
  RawEdge keyless(port, "");
  {
    transport::Hello h{"edge-3", 0, transport::kProtocolVersion};
    ASSERT_TRUE(keyless.Send(h).ok());
    ASSERT_TRUE(keyless.WaitUntil([&] { return !keyless.MessagesLocked().empty(); }));
    ASSERT_TRUE(keyless.Send(transport::Auth{}).ok());
    ASSERT_TRUE(keyless.WaitClosed());
  }
  // An edge id the aggregator has no key for.
  RawEdge stranger(port);
  EXPECT_FALSE(stranger.Hello("edge-unknown", 0));
  EXPECT_FALSE(stranger.aggregator_proved);  // a proof that matches nothing, like a wrong key's
  // vigil's own link with a wrong key, and with an id the aggregator has no key for: the link checks the
  // aggregator's proof first and hangs up; the aggregator counts and logs that too.
  for (const char* id : {"edge-2", "edge-unknown"}) {
    auto link = transport::MakeTcpLink(transport::MakeTcpDialer("127.0.0.1", port), std::string(32, '\x11'));
    StatusOr<Welcome> w = link->Open(transport::Hello{id, 0, transport::kProtocolVersion}, milliseconds(5000));
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnauthenticated) << w.status();
    EXPECT_NE(Message(w.status()).find("its keys_file has another key for edge"), std::string::npos) << w.status();
  }
  // A replayed Hello + Auth of a real session: the aggregator's nonce is new, so the old proof fails.
  RawEdge recorded(port);
  ASSERT_TRUE(recorded.Hello("edge-4", 0));
  RawEdge replay(port);
  ASSERT_TRUE(replay.SendRaw(recorded.written()).ok());
  ASSERT_TRUE(replay.WaitClosed());
  // Malformed and oversized frames before authentication.
  RawEdge garbage(port);
  ASSERT_TRUE(garbage.SendRaw("GET / HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  ASSERT_TRUE(garbage.WaitClosed());
  RawEdge oversized(port);
  std::string huge = transport::EncodeFrame(transport::Heartbeat{1});
  huge[8] = huge[9] = huge[10] = huge[11] = '\x7F';
  ASSERT_TRUE(oversized.SendRaw(huge).ok());
  ASSERT_TRUE(oversized.WaitClosed());
  for (RawEdge* e : {&wrong, &keyless, &stranger, &replay}) {
    ASSERT_FALSE(e->rejects().empty());
    EXPECT_EQ(e->rejects().back().reason, RejectReason::kUnauthenticated);
    EXPECT_EQ(e->rejects().back().detail, "authentication failed");  // no hint for the prober
  }
  // The HTTP API: no token, a wrong token, the right one; /healthz needs none.
  httplib::Client http("127.0.0.1", agg->http_port());
  auto no_token = http.Get("/api/events");
  ASSERT_TRUE(no_token);
  EXPECT_EQ(no_token->status, 401);
  EXPECT_EQ(no_token->get_header_value("WWW-Authenticate"), "Bearer");
  auto wrong_token = http.Get("/api/events", {{"Authorization", "Bearer not-the-token-at-all"}});
  ASSERT_TRUE(wrong_token);
  EXPECT_EQ(wrong_token->status, 401);
  EXPECT_EQ(wrong_token->body, "{\"error\":\"the bearer token does not match (Authorization: Bearer ...)\"}");
  auto healthz = http.Get("/healthz");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200);
  // The dashboard's page and files need no token (they hold no data and ask for it); nothing else does.
  for (const char* open : {"/", "/ui/app.js", "/ui/style.css"}) {
    auto r = http.Get(open);
    ASSERT_TRUE(r) << open;
    EXPECT_EQ(r->status, 200) << open;
  }
  EXPECT_NE(http.Get("/")->body.find("<script src=\"/ui/app.js\">"), std::string::npos);
  // (5 more refusals: the token metric counts 7.)
  for (const char* closed : {"/api/stats", "/api/events/live", "/ui/../api/stats", "/metrics", "/ui"}) {
    auto r = http.Get(closed);
    ASSERT_TRUE(r) << closed;
    EXPECT_EQ(r->status, 401) << closed;
  }

  SendAndAwaitAcks(good, Frames("edge-1", 1, "cam0", 10, 19));
  EXPECT_TRUE(good.rejects().empty());
  // Nothing of the refused peers was stored: only edge-1's frames and edge-4's (empty) grant.
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 20);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM edges WHERE edge NOT IN ('edge-1', 'edge-4')"), 0);
  auto metrics = http.Get("/metrics", {{"Authorization", "Bearer " + token}});
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  for (const char* line : {"vigil_transport_rejected_total{link=\"tcp\",reason=\"address\"} 1\n",
                           "vigil_transport_rejected_total{link=\"tcp\",reason=\"bad_proof\"} 2\n",
                           "vigil_transport_rejected_total{link=\"tcp\",reason=\"no_proof\"} 1\n",
                           "vigil_transport_rejected_total{link=\"tcp\",reason=\"unknown_edge\"} 2\n",
                           "vigil_transport_rejected_total{link=\"tcp\",reason=\"challenge_refused\"} 1\n",
                           "vigil_transport_rejected_total{link=\"tcp\",reason=\"malformed\"} 2\n",
                           "vigil_http_rejected_total{reason=\"token\"} 7\n",
                           "vigil_transport_connections_total{link=\"tcp\",result=\"authenticated\"} 2\n"}) {
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line << metrics->body;
  }
}

TEST_F(AggregatorTest, TheApiOverHttpsWithATokenAndBadTlsFilesFailTheStart) {
  StatusOr<testing::TestCerts> certs = testing::MakeTestCerts((dir_ / "certs").string());
  ASSERT_TRUE(certs.ok()) << certs.status();
  config_.http_cert_file = certs->server_cert;
  config_.http_key_file = certs->server_key;
  const std::string token = "fedcba9876543210fedcba9876543210";
  config_.http_token_file = (dir_ / "token").string();
  std::ofstream(config_.http_token_file) << token;
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  httplib::SSLClient https("127.0.0.1", agg->http_port());
  https.set_ca_cert_path(certs->ca_cert.c_str());
  https.enable_server_certificate_verification(true);
  auto ok = https.Get("/api/stats", {{"Authorization", "Bearer " + token}});
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
  auto no_token = https.Get("/api/stats");
  ASSERT_TRUE(no_token);
  EXPECT_EQ(no_token->status, 401);
  httplib::Client plain("127.0.0.1", agg->http_port());  // plain HTTP to an HTTPS port gets nothing
  plain.set_read_timeout(2, 0);
  auto refused = plain.Get("/api/stats");
  EXPECT_TRUE(!refused || refused->status != 200);
  agg.reset();

  AggregatorConfig bad = config_;
  bad.http_key_file = certs->client_key;  // not the certificate's key
  bad.db_path = (dir_ / "bad.db").string();
  StatusOr<std::unique_ptr<Aggregator>> b = Aggregator::Start(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(Message(b.status()), StrCat("http tls: ", certs->server_cert, " / ", certs->client_key,
                                        ": not a PEM certificate and its private key"));
  bad = config_;
  bad.http_token_file = (dir_ / "short").string();
  std::ofstream(bad.http_token_file) << "abc";
  EXPECT_EQ(Message(Aggregator::Start(bad).status()),
            StrCat("http token_file ", bad.http_token_file, ": a token needs at least 16 characters (`openssl rand -hex 32`)"));
}

TEST_F(AggregatorTest, StartFailsClearlyWhenThePortIsTaken) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  AggregatorConfig clash = config_;
  clash.listen_port = agg->listen_port();
  clash.db_path = (dir_ / "other.db").string();
  StatusOr<std::unique_ptr<Aggregator>> second = Aggregator::Start(clash);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(Message(second.status()).find("Address already in use"), std::string::npos) << second.status();
}

}  // namespace
}  // namespace vigil::aggregator
