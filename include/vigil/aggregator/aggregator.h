// vigil/aggregator/aggregator.h — the aggregation node: `vigil aggregator --config agg.yaml`.
//
// Edges connect over the tcp link (optionally TLS), the ucx link and the cuda_ipc link (same host:
// transport/cuda_ipc.h) when configured (transport/receiver.h,
// protocol v3), prove their key (transport/auth.h) and say Hello; the aggregator is the authority on
// epochs. Every listener, HTTP included, takes only addresses in `allow`. Hellos and reports go through one queue to one storage thread, in arrival order:
//  - a Hello is decided by Store::Admit in a committed transaction of its own, BEFORE any answer: a
//    held epoch older than the edge id's current one is refused (Reject kFenced, epoch = current, the
//    connection closes); otherwise the session gets a new epoch (held 0, kHelloPromote, or an epoch this
//    database never granted — logged as a warning) or is re-admitted (held == current). A grant first
//    evicts every other open session of that edge id admitted with an older epoch (Reject kFenced with
//    the new epoch; the connection stays open until that edge closes it or falls silent for peer_timeout,
//    and every report it still sends is refused as stale and counted), then sends the Welcome with, per (stream, run) of the
//    Hello, contiguous_through and highest_seq as stored. A held epoch after which no 64-bit epoch exists
//    is refused with kProtocolError; a Hello whose grant transaction fails closes its connection.
//  - reports up to the next Hello are applied in one transaction (store.h: de-duplication by
//    (edge, stream, run, seq), fencing against the edge's current granted epoch inside the transaction,
//    so a report of an evicted session that commits after the newer grant is refused and never stored),
//    and only after the commit every report is answered: Ack, or Reject(kStaleEpoch, epoch = the edge's
//    current epoch). Answers are batched per session per transaction.
//  - admitting a session (granted or re-admitted) supersedes every other session of that edge id with the
//    same epoch: the same instance reconnected, maybe over another link (fail-back). The old connection is
//    closed and its reports still queued are ignored, counted as result="superseded" — the edge re-sends
//    them on the new session, so a stream's frames are stored in the order the edge sent them.
// A report that was received but not committed is never acked, so the edge re-sends it: nothing is lost
// when the aggregator dies, and nothing is stored twice. If a transaction fails (disk full, I/O error)
// the connections whose reports (or Hello) were in it are closed, so their edges reconnect and re-send;
// the failure is logged and counted, and /healthz says so.
// Labels: a stored detection's label is the class name of its class id in the Hello of the session that
// sent it ("class N" when the id is out of range).
// The storage thread never writes to a socket: it only queues frames on sessions (Session::Admit,
// Refuse, Enqueue), whose writer threads send them; a session that cannot keep up is closed.
//
// HTTP (cpp-httplib), GET but one POST; allow-list, bearer token and TLS as transport/http_access.h says:
//   /healthz      200 {"status":"ok",...}; 503 with "status":"degraded" while storage is failing
//   /metrics      Prometheus text format 0.0.4 (metrics/registry.h)
//   /api/events   ?since_seq=ID (events with id > ID; default 0) &since_time=SECONDS (capture time ≥,
//                 Unix seconds, fractions allowed) &edge=E &stream=S &state=pending|confirmed|rejected
//                 &limit=N (1..10000, default 100)
//                 → {"events":[{id, edge, stream, run, seq, epoch, capture_ns, pts_ns, publish_ns,
//                   stored_ns, severity, rule, width, height, state, state_reason, decided_ns,
//                   detections:[{class_id, label, score, box:[x1,y1,x2,y2], track_id, second_label,
//                   second_score}]}],
//                   "next_since_seq": last id (or since_seq)}
//   /api/events/live  Server-Sent Events: `: open`, then `event: event` per stored event and `event: state` per
//                 decision on a pending event (confirm.h); the dashboard's push channel (dashboard/openapi.json)
//   /api/dead_letters ?sink=NAME &limit=N (1..10000, default 100) → {"dead_letters":[{sink, attempts, last_error,
//                 dead_ns, event: {as /api/events}}]}, newest first: events a push sink refused or never took
//   POST /api/dead_letters/replay ?sink=NAME → {"sink", "replayed": N}: that sink's dead letters go back into its
//                 outbox (attempts from 0), e.g. after the endpoint was fixed; 400 for an unknown sink
//   /api/stats    → {"edges":[{edge, epoch (current granted), connected, first_seen_ns, last_seen_ns,
//                   granted_ns, streams, frames, events, dropped, lost, missing, duplicates,
//                   stale_rejected}], "streams":[{edge, stream, epoch (newest stored report's), frames,
//                   events, dropped, lost, missing, duplicates, stale_rejected, "runs":[{run, frames,
//                   events, dropped, lost, contiguous_through, last_seq, missing, gaps:[[first,last],...]}]}]}
//                   frames counts processed frames (events and progress); dropped and lost frames are
//                   stored rows too, counted apart, and are never gaps or missing.
//   A bad query parameter gives 400 {"error": "..."} naming it.
//
// Metrics (names are the contract for dashboards):
//   vigil_aggregator_reports_total{result=stored|duplicate|stale|superseded}   counter
//   vigil_aggregator_frames_total{edge,stream}                      counter, new frames stored (event/progress)
//   vigil_aggregator_events_total{edge,stream}                      counter
//   vigil_aggregator_dropped_frames_total{edge,stream}              counter, new frames stored as dropped
//   vigil_aggregator_lost_frames_total{edge,stream}                 counter, new frames stored as lost
//   vigil_aggregator_duplicate_frames_total{edge,stream}            counter
//   vigil_aggregator_stale_rejected_total{edge,stream}              counter: reports refused, epoch not current
//   vigil_aggregator_hellos_total{result=granted|readmitted|fenced} counter
//   vigil_aggregator_evicted_sessions_total                         counter: sessions fenced by a newer grant
//   vigil_aggregator_frame_to_stored_seconds{edge,stream}           histogram: commit time − capture_ns
//                                                                   (across hosts: includes clock offset)
//   vigil_aggregator_commit_seconds                                 histogram: one storage transaction
//   vigil_aggregator_storage_errors_total                           counter: failed transactions
//   vigil_aggregator_queue_depth                                    gauge: reports waiting for storage
//   vigil_aggregator_edges_connected                                gauge: open sessions past their Hello
//   vigil_transport_connections_total{link,result=accepted|refused|authenticated}   counter
//   vigil_transport_rejected_total{link,reason=address|unknown_edge|bad_proof|no_proof|handshake_timeout|
//                                   malformed|unsupported_version|tls|challenge_refused|peer_credentials|
//                                   ring_unavailable|ring_refused}
//                                                                            counter: refused before a session
//   vigil_cuda_ipc_{rings_offered,ring_failures,slots,slots_rejected,device_reports,bytes}_total
//                                                                            counter: the cuda_ipc rings (when on)
//   vigil_transport_disconnects_total{link,reason=protocol_error|timeout|sequence_gap} counter
//   vigil_transport_repeated_reports_total{link}                    counter: duplicated frames ignored
//   vigil_transport_received_bytes_total{link}, vigil_transport_received_frames_total{link}   counters
//   vigil_http_rejected_total{reason=address|token}                 counter
//   vigil_aggregator_push_total{sink,result=delivered|retried|dead}  counter: deliveries to push sinks by outcome
//   vigil_aggregator_push_delay_seconds{sink}                       histogram: event stored → delivered
//   vigil_aggregator_push_outbox_depth{sink}                        gauge: events waiting for a sink (at scrape)
//   vigil_aggregator_event_states_total{state,at=stored|decided}    counter: events by the state they were stored
//                                                                   in / decided to (confirm.h)
//   vigil_aggregator_events_pending                                 gauge: events waiting for their tracks
//   vigil_aggregator_tracks                                         gauge: live tracks (every stream)
//   vigil_aggregator_confirm_seconds                                histogram: tracking a batch of reports
//   vigil_aggregator_second_model_total{result=confirmed|rejected|no_opinion|no_crops|crops|crop_errors}
//                                                                   counter: the second model (classifier.h)
//
// Thread-safety: Start/Stop/Kill from one controlling thread; the accessors from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/aggregator/confirm.h"
#include "vigil/aggregator/push.h"
#include "vigil/common/status.h"
#include "vigil/metrics/registry.h"

namespace vigil::aggregator {

// One push sink (push.h): `push: [{name, webhook: {url, timeout_ms, token_file | token_env, ca_file} | mqtt: {broker
// (host:port), topic_prefix, client_id, username, password_file | password_env, ca_file, timeout_ms}, route: {edges,
// streams, classes, min_severity}, on: stored | confirmed, retry: {initial_ms, max_ms, max_attempts}}]`.
// on: stored (default): every event the route takes, when it is stored, whatever its state; confirmed: only once it
// is confirmed (confirm.h), when that is decided (with no `confirm:` every event is stored confirmed).
struct PushSinkConfig {
  PushRoute route;         // route.sink = name
  bool mqtt_sink = false;  // mqtt: (else webhook:)
  WebhookOptions webhook;  // webhook.token read from token_file or the token_env variable (a secret)
  MqttOptions mqtt;        // mqtt.password likewise
  RetryPolicy retry;
};

// agg.yaml; every key is optional.
struct AggregatorConfig {
  std::string listen_host = "0.0.0.0";  // listen: the tcp link; edges connect here. Default: 0.0.0.0:7400
  uint16_t listen_port = 7400;          //   (port 0 = any free port, printed at start)
  bool ucx_enabled = false;             // ucx_listen: the ucx link (UCX active messages). Default: off
  std::string ucx_host = "0.0.0.0";
  uint16_t ucx_port = 7402;
  // ucx_device: where detection rows an edge sends from its GPU memory land ("cuda:N": rendezvous rows are
  // received into that GPU's memory, then copied to the host for storage; "host": straight to host memory).
  // Takes effect when the UCX loaded has CUDA transports (ucx.h). Default: host.
  std::string ucx_device = "host";
  // cuda_ipc: {socket, device, slots, slot_bytes, allow_uids}: the cuda_ipc link for edges on this host
  // (transport/cuda_ipc.h): control over the Unix socket `socket`, reports through a ring per session on
  // `device` ("cuda:N", default cuda:0; "host" = shared host memory; a GPU that cannot hold rings fails the
  // start). Default: off.
  bool cuda_ipc_enabled = false;
  std::string cuda_ipc_socket;
  std::string cuda_ipc_device = "cuda:0";
  uint32_t cuda_ipc_slots = 64;
  uint32_t cuda_ipc_slot_bytes = 64 << 10;
  std::vector<uint32_t> cuda_ipc_allow_uids;  // empty = the aggregator's own uid
  // tls: {cert_file, key_file, client_ca_file}: TLS on the tcp link; client_ca_file makes client
  // certificates mandatory (mutual TLS). Default: off.
  std::string tls_cert_file, tls_key_file, tls_client_ca_file;
  // allow: [CIDR, ...]: addresses that may connect to any IP listener (report links and HTTP; the cuda_ipc
  // socket checks uids instead: cuda_ipc_allow_uids). Default: any.
  std::vector<std::string> allow;
  // auth: {keys_file, required}: edge keys (auth.h: a YAML map edge id → hex key). Required unless
  // `required: false`, which runs without authentication (logged as a warning at start).
  std::string keys_file;
  bool auth_required = true;
  // http_tls: {cert_file, key_file}: HTTPS for the API. Default: off.
  std::string http_cert_file, http_key_file;
  // http_token_file: a bearer token every API request but /healthz must carry (or VIGIL_HTTP_TOKEN).
  std::string http_token_file;
  std::string http_host = "127.0.0.1";  // http: the API. Default: 127.0.0.1:7401
  uint16_t http_port = 7401;
  // db: a SQLite file, or a PostgreSQL URL (postgresql://user@host:port/database; the database must exist).
  // Default: vigil-aggregator.db
  std::string db_path = "vigil-aggregator.db";
  // db_password_file | db_password_env: PostgreSQL's password from a file (first line) or an environment
  // variable, never logged. Default: none (the URL's, or libpq's PGPASSWORD / ~/.pgpass)
  std::string db_password;
  bool db_synchronous_full = false;             // db_synchronous: normal | full (SQLite). Default: normal
  // retention: {max_age_hours, max_events, interval_s}: what the database keeps (store.h, Retention).
  // max_age_hours: events and frame rows older than this (0 < h ≤ 87600; default: kept forever);
  // max_events: at most this many events (default: no limit); interval_s: how often it prunes, 1..86400
  // (default 60). Events a push sink has not delivered are kept.
  RetentionPolicy retention;
  int retention_interval_s = 60;
  int max_connections = 256;                    // max_connections: 1..65536. Default: 256
  int batch_max = 512;                          // batch_max: reports per transaction, 1..100000. Default: 512
  int queue_max = 16384;                        // queue_max: reports waiting for storage, 1..10^7. Default: 16384
  // snapshot_queue_mb: snapshots (an event's pictures) received and waiting for storage, at most this many MiB
  // (1..4096); a picture that finds it full is dropped and counted. Default: 64
  int snapshot_queue_mb = 64;
  int peer_timeout_ms = 10000;                  // peer_timeout_ms: silent edge is dropped, 100..3600000. Default: 10000
  std::vector<PushSinkConfig> push;             // push: sinks the stored events go to (push.h). Default: none
  ConfirmConfig confirm;                        // confirm: tracking and rules (confirm.h). Default: off
};

// Reads agg.yaml. Errors: NotFound (no file), InvalidArgument listing every bad key with its
// line:column (common/config.h).
StatusOr<AggregatorConfig> LoadAggregatorConfig(const std::string& path);
StatusOr<AggregatorConfig> ParseAggregatorConfig(std::string_view yaml, const std::string& name);

class Aggregator {
 public:
  // Opens the database, binds both ports and starts serving.
  // Errors: from Store::Open, TcpReceiver::Start; Unavailable when the HTTP port cannot be bound.
  static StatusOr<std::unique_ptr<Aggregator>> Start(const AggregatorConfig& config);
  ~Aggregator();  // Stop()

  uint16_t listen_port() const;  // the bound ports (resolving port 0)
  uint16_t ucx_port() const;     // 0 when the ucx link is off
  uint16_t http_port() const;
  metrics::Registry& metrics();

  // Clean shutdown: stops accepting and reading, stores and acks what was received, closes.
  // Idempotent.
  void Stop();
  // Simulates a crash (for tests; the real one is SIGKILL): connections are cut and reports received
  // but not yet committed are dropped without an ack. What was committed stays committed.
  void Kill();

 private:
  struct Impl;
  explicit Aggregator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::aggregator
