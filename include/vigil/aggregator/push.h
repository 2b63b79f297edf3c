// vigil/aggregator/push.h — events pushed to the plant's systems (issue 18): a durable outbox per sink,
// delivered at least once, retried with backoff, dead-lettered when a sink refuses or never recovers.
//
// Flow: the aggregator's config names sinks (`push:`), each with a route (which events: edges, streams,
// classes, lowest severity) and a delivery (a webhook: an HTTP POST of the event as JSON; or MQTT: QoS 1
// publishes to a broker). When Store::Apply
// stores an event, it writes one outbox row per sink whose route matches, in the same transaction as the
// event (store.h "push_outbox"), so nothing stored is ever left unpushed by a crash, and nothing is queued
// for an event that was not stored. A Pusher per sink takes the due rows in event order, delivers each, and:
//   delivered (2xx)      → the row is deleted;
//   retry (5xx, 408, 429, a timeout, no connection) → attempts + 1, due again after the backoff
//                          initial_ms · 2^(attempts − 1), at most max_ms; after max_attempts → dead letter;
//                          and the pass ends: the sink itself waits initial_ms · 2^(failures in a row − 1) (at
//                          most max_ms) before any row is tried again, so a sink that is down is probed with one
//                          event per step instead of costing every due event a timeout;
//   rejected (another 4xx: the sink will never take it) → dead letter at once.
// A dead letter (push_dead_letters) keeps the event id, attempts and the last error; /api/dead_letters lists
// them. Delivery is at-least-once per (sink, event): a crash between the delivery and the row's deletion
// delivers it again; every delivery carries the event's key, `<edge>/<stream>/<run>/<seq>`, as the
// Idempotency-Key header, so the receiver can drop the repeat.
// Time: due times are wall-clock ns (they survive restarts), from the Pusher's Clock (common/clock.h; a
// FakeClock in tests drives the backoff).
// Thread-safety: a Pusher runs its own thread (Start/Stop/Wake from any thread); RunDue is for tests (one
// caller at a time, not with Start). A Delivery is called from its Pusher's thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"

namespace vigil::aggregator {

struct RetryPolicy {
  int64_t initial_ms = 500;  // the first retry's delay
  int64_t max_ms = 60000;    // the longest delay
  int max_attempts = 20;     // deliveries tried before the event is dead-lettered (≥ 1)
};

// The delay before attempt `attempts` + 1 after `attempts` failed ones (≥ 1): initial · 2^(attempts − 1),
// at most max.
int64_t BackoffMs(const RetryPolicy& policy, int attempts);

struct DeliveryOutcome {
  enum Kind { kDelivered, kRetry, kRejected } kind = kDelivered;
  std::string detail;  // kRetry / kRejected: why (an HTTP status and the start of the body, or the error)
};

// Hands one event to a sink. Errors are outcomes (kRetry / kRejected), never exceptions.
class Delivery {
 public:
  virtual ~Delivery() = default;
  virtual DeliveryOutcome Deliver(const StoredEvent& event) = 0;
  virtual std::string describe() const = 0;  // for logs: e.g. "webhook http://mes:8080/events" (no secrets)
};

// The event as JSON, as /api/events renders it (one element of its "events").
std::string EventJson(const StoredEvent& event);
// `<edge>/<stream>/<run>/<seq>`: the event's key, the Idempotency-Key of every delivery of it.
std::string EventKey(const StoredEvent& event);

// A webhook: POST `url` with the event's JSON (Content-Type: application/json), headers Idempotency-Key
// (EventKey) and X-Vigil-Sink (the sink's name), and `Authorization: Bearer <token>` when a token is given.
// 2xx → delivered; 408, 425, 429, 5xx, a timeout or a connection error → retry; other statuses → rejected.
// HTTPS verifies the server against the system's CAs or `ca_file`.
struct WebhookOptions {
  std::string sink;
  std::string url;             // http:// or https://
  int64_t timeout_ms = 5000;   // the whole request
  std::string token;           // a secret: never logged
  std::string ca_file;         // "" = the system's CAs
};
// Errors: InvalidArgument (not an http(s) URL), Internal (libcurl could not be set up).
StatusOr<std::unique_ptr<Delivery>> MakeWebhook(const WebhookOptions& options);

// MQTT (libmosquitto, MQTT 3.1.1): each event is published with QoS 1 as its JSON on
// `<topic_prefix>/<edge>/<stream>/<label>` once per class it holds (`event` when it holds none), and on
// `<topic_prefix>/<edge>/<stream>/state` retained (the stream's latest event, for a consumer that connects later);
// delivered once the broker acknowledged every message (PUBACK) within timeout_ms, else retry (a broker that is
// down, a lost connection: the client reconnects by itself). `+`, `#` and `/` in ids and labels become `_`.
// TLS when ca_file is set; username/password (a secret: never logged).
struct MqttOptions {
  std::string sink;
  std::string host = "127.0.0.1";
  int port = 1883;
  std::string topic_prefix = "vigil";
  std::string client_id;  // "" = vigil-<sink>
  std::string username, password;
  std::string ca_file;
  int64_t timeout_ms = 5000;
  int keepalive_s = 30;
};
// Errors: InvalidArgument (no host or port, a ca_file libmosquitto refuses), Internal (client set-up).
StatusOr<std::unique_ptr<Delivery>> MakeMqtt(const MqttOptions& options);

struct PusherStats {
  uint64_t delivered = 0, retried = 0, dead = 0;  // deliveries by outcome (retried: attempts that failed and will
                                                  // be tried again)
  uint64_t store_errors = 0;                      // outbox reads/writes that failed (the pass is tried again)
};

class Pusher {
 public:
  // `store` and `clock` outlive the Pusher. `on_outcome` (optional) is called after each delivery with the
  // outcome and the event's stored→delivered wall time in ns (for metrics), on the pusher's thread.
  Pusher(Store* store, std::string sink, std::unique_ptr<Delivery> delivery, RetryPolicy policy,
         Clock* clock = SystemClock(),
         std::function<void(const DeliveryOutcome&, bool dead, int64_t age_ns)> on_outcome = {});
  ~Pusher();  // Stop()

  // One pass over what is due now (at most `limit` rows): delivers each in due order and records the outcome,
  // until a transient failure (then the sink pauses, see above). Delivered rows are deleted in groups of about
  // kDeleteEvery of delivery time: a delivery slower than that (a webhook) is deleted right after it, so a crash
  // repeats at most the delivery in flight; faster ones (MQTT) share one transaction per group, so a crash
  // repeats at most that much time's worth (one commit per event made PostgreSQL's pusher fall behind).
  // Returns the wall ns when the next row falls
  // due or the pause ends, whichever is later (nullopt: the sink's outbox is empty).
  StatusOr<std::optional<int64_t>> RunDue(int limit = 256);
  static constexpr int64_t kDeleteEvery = 1'000'000;  // ns of delivery time per deleting transaction, at most
  void Start();
  void Wake();  // new rows may be due (the storage thread, after a commit that queued some)
  void Stop();  // idempotent; a delivery in progress finishes
  PusherStats stats() const;
  const std::string& sink() const { return sink_; }

 private:
  // Delivers `due` in order (RunDue's loop); the ids of delivered rows go to `delivered`, which is flushed
  // (Flush) whenever its first delivery began kDeleteEvery or more ago.
  Status DeliverDue(std::vector<OutboxItem>& due, std::vector<int64_t>& delivered);
  // Deletes the `delivered` rows (one transaction) and clears the list.
  Status Flush(std::vector<int64_t>& delivered);
  void Loop();
  Store* store_;
  const std::string sink_;
  std::unique_ptr<Delivery> delivery_;
  const RetryPolicy policy_;
  Clock* clock_;
  std::function<void(const DeliveryOutcome&, bool, int64_t)> on_outcome_;
  // The sink's own backoff (RunDue's caller only): after a transient failure no row is tried before
  // pause_until_ns_, which grows with the failures in a row like a row's backoff.
  int64_t pause_until_ns_ = 0;
  int failures_in_row_ = 0;
  mutable Mutex mu_;
  CondVar cv_;
  bool woken_ VIGIL_GUARDED_BY(mu_) = false;
  bool stopping_ VIGIL_GUARDED_BY(mu_) = false;
  PusherStats stats_ VIGIL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace vigil::aggregator
