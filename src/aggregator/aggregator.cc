#include "vigil/aggregator/aggregator.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/config.h"
#include "aggregator/confirmation.h"
#include "aggregator/http_api.h"
#include "aggregator/ingest.h"
#include "aggregator/live_feed.h"
#include "aggregator/transport_metrics.h"
#include "vigil/aggregator/push.h"
#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/http_access.h"
#include "vigil/transport/receiver.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/ucx.h"

namespace vigil::aggregator {

// The composition root: it reads nothing itself and decides nothing itself; it builds the parts, wires them and
// runs the storage loop. Parts: Ingest (sessions, the queue, Hellos and report batches), Confirmation (tracker and
// second model), Pusher per push sink, HttpApi over LiveFeed, the receivers and their metrics mirrors.
struct Aggregator::Impl {
  AggregatorConfig cfg;
  std::unique_ptr<Store> store;
  std::unique_ptr<Confirmation> confirmation;  // `confirm:` on (aggregator/confirmation.h)
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

  // A failed Start destroys the parts without Shutdown: the second model's thread (it wakes ingest) ends first.
  ~Impl() {
    if (confirmation) confirmation->Stop();
  }

  // ---- the storage thread ----

  void StorageLoop() {
    constexpr int64_t kNever = INT64_MAX;  // steady ns
    const bool prunes = cfg.retention.any();
    int64_t next_prune = prunes ? clock->SteadyNs() : kNever;
    int64_t next_expire = confirmation ? clock->SteadyNs() : kNever;
    for (;;) {
      const std::atomic<bool>* second_ready = confirmation ? confirmation->second_ready() : nullptr;
      if (!ingest->WaitForWork(std::min(next_prune, next_expire), second_ready)) return;
      if (clock->SteadyNs() >= next_prune) {  // between batches: retention holds the writer for a chunk at a time
        Prune();
        next_prune = clock->SteadyNs() + int64_t{cfg.retention_interval_s} * 1'000'000'000;
      }
      if (clock->SteadyNs() >= next_expire) {  // a tenth of idle_s late at most
        confirmation->ExpireTracks();
        next_expire = clock->SteadyNs() + confirmation->expire_interval_ns();
      }
      ingest->ProcessSnapshots();  // between report batches: pictures never hold up the reports for long
      if (confirmation && confirmation->SecondModelPending()) confirmation->StoreSecondModel();
      ingest->ProcessNext();  // a Hello, or the reports up to the next one
    }
  }

  // Between batches, every retention_interval_s.
  void Prune() {
    StatusOr<RetentionResult> r = store->Prune(cfg.retention, clock->WallNs());
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

  // ---- the controlling thread ----

  void Shutdown(bool crash) {
    if (stopped) return;
    stopped = true;
    ingest->Close(crash);
    live.Close();  // the live channels end (their HTTP threads are free for stop())
    if (crash) {  // cut the edges first: no ack for anything queued
      for (auto& rx : receivers) rx->Stop();
    }
    // The second model's thread ends: what it has not decided stays pending, resumed at the next start.
    if (confirmation) confirmation->Stop();
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
  auto wake_push = [&d] {
    for (auto& p : d.pushers) p->Wake();
  };
  if (config.confirm.enabled) {
    ConfirmationOptions co;
    co.config = config.confirm;
    // association "auto": the GPU detection rows arrive on (cuda_ipc's device, else ucx_device's), else the CPU.
    co.auto_device = config.cuda_ipc_enabled && ParseCudaDevice(config.cuda_ipc_device) ? config.cuda_ipc_device
                     : config.ucx_enabled && ParseCudaDevice(config.ucx_device)        ? config.ucx_device
                                                                                       : "cpu";
    co.store = d.store.get();
    co.live = &d.live;
    co.registry = &d.registry;
    co.clock = d.clock;
    co.wake_push = wake_push;
    co.wake_storage = [&d] { d.ingest->WakeStorage(); };
    co.storage_failed = [&d](const Status& st) { d.ingest->StorageFailed(st); };
    VIGIL_ASSIGN_OR_RETURN(d.confirmation, Confirmation::Start(std::move(co)));
    const TrackRules& r = config.confirm.rules;
    spdlog::info("aggregator: confirmation on: seen in {} of the last {} frames, {} s, {} px of travel ({} overrides), "
                 "tracks confirmed after {} frames, streams silent for {} s end their tracks",
                 r.k, r.m, r.min_duration_s, r.min_travel_px, config.confirm.overrides.size(),
                 config.confirm.tracker.min_hits, config.confirm.idle_s);
  }
  IngestOptions io;
  io.store = d.store.get();
  io.registry = &d.registry;
  io.live = &d.live;
  io.confirm = d.confirmation.get();
  io.wake_push = wake_push;
  for (const PushSinkConfig& p : config.push) io.push_routes.push_back(p.route);
  io.queue_max = config.queue_max;
  io.batch_max = config.batch_max;
  io.snapshot_queue_mb = config.snapshot_queue_mb;
  io.clock = d.clock;
  d.ingest = std::make_unique<Ingest>(std::move(io));
  if (d.confirmation) d.confirmation->Run();  // the second model's thread wakes the storage thread through ingest
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
