// ucx::Worker (ucx_worker.h): the UCP context and worker, the progress thread that makes every UCP call, and
// the endpoints' creation, send-buffer registration, close and release.
#include "transport/ucx_worker.h"

#include <poll.h>

#include <cstring>
#include <utility>

namespace vigil::transport::ucx {

StatusOr<std::shared_ptr<Worker>> Worker::Start(const UcxOptions& options) {
  std::shared_ptr<Worker> w(new Worker(options));
  auto started = std::make_shared<std::promise<Status>>();
  std::future<Status> result = started->get_future();
  w->thread_ = std::thread([raw = w.get(), started] { raw->Run(started.get()); });
  Status st = result.get();
  if (!st.ok()) {
    w->thread_.join();  // the thread has cleaned up and ended: ~Worker has nothing to stop
    return st;
  }
  return w;
}

Worker::~Worker() {
  if (!thread_.joinable()) return;
  Post([this] {
    stopping_ = true;
    stop_deadline_ = Deadline::After(kCloseTimeout);
    StopListening();
    for (auto& [ep, conn] : eps_) BeginClose(conn, /*force=*/true);
  });
  thread_.join();
}

void Worker::Post(std::function<void()> fn) {
  MutexLock lock(mu_);
  commands_.push_back(std::move(fn));
  // Documented safe from any thread in any thread mode. Under mu_: the stop command may run and the
  // thread destroy the worker as soon as the command is queued, so Cleanup takes mu_ first.
  if (!destroyed_) ucp_worker_signal(worker_);
}

Status Worker::Connect(const std::shared_ptr<ConnState>& conn, const sockaddr_storage& addr) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                 UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  p.sockaddr.addrlen = SockaddrLen(addr);
  VIGIL_RETURN_IF_ERROR(Register(conn.get()));
  return CreateEndpoint(conn, &p);
}

void Worker::BeginClose(const std::shared_ptr<ConnState>& conn, bool force) {
  if (conn->ep == nullptr || conn->close_started) return;
  conn->close_started = true;
  conn->awaiting_accept = false;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* c = static_cast<ConnState*>(user_data);
    c->close_done = true;
    --c->inflight;
    ucp_request_free(request);
  };
  p.user_data = conn.get();
  ucs_status_ptr_t r = ucp_ep_close_nbx(conn->ep, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    conn->close_done = true;
  } else {
    ++conn->inflight;
  }
  closing_.push_back(conn);
}

// The progress thread: init, loop, cleanup.
void Worker::Run(std::promise<Status>* started) {
  Status st = Init();
  if (!st.ok()) {
    Cleanup();
    started->set_value(st);
    return;
  }
  ++g_workers;
  if (cuda_memory_) ++g_cuda_workers;
  started->set_value(absl::OkStatus());
  Loop();
  Cleanup();
  if (cuda_memory_) --g_cuda_workers;
  --g_workers;
}

Status Worker::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return absl::UnavailableError(StrCat("UCX: reading the configuration: ", UcsError(st)));
  if (!options_.tls.empty()) st = ucp_config_modify(config, "TLS", options_.tls.c_str());
  // Best effort: a UCX without this setting (or with it on by default) still works. Only where shared
  // memory may be used: UCX warns "invalid configuration" when no transport reads it.
  if (options_.shared_memory_error_handling && MayUseSharedMemory(options_.tls)) {
    (void)ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
  }
  if (st == UCS_OK && options_.rendezvous_threshold_bytes > 0) {
    st = ucp_config_modify(config, "RNDV_THRESH", std::to_string(options_.rendezvous_threshold_bytes).c_str());
  }
  if (st != UCS_OK) {
    ucp_config_release(config);
    return absl::UnavailableError(StrCat("UCX: configuration (tls '", options_.tls, "'): ", UcsError(st)));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "vigil";
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    context_ = nullptr;
    return absl::UnavailableError(StrCat("UCX: ucp_init (tls '", options_.tls, "'): ", UcsError(st)));
  }
  ucp_context_attr_t ca{};
  ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &ca) == UCS_OK) {
    cuda_memory_ = (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0 && device_memory::Available();
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only this thread calls UCP (ucp_worker_signal excepted)
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return absl::UnavailableError(StrCat("UCX: ucp_worker_create: ", UcsError(st)));
  }
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return absl::UnavailableError(StrCat("UCX: ucp_worker_get_efd: ", UcsError(st)));
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(worker_, &wa) == UCS_OK) max_am_header_ = wa.max_am_header;
  for (unsigned id : {kDataAm, kControlAm, kRowsAm}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = id == kDataAm ? &Worker::OnDataAm : id == kRowsAm ? &Worker::OnRowsAm : &Worker::OnControlAm;
    hp.arg = this;
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) return absl::UnavailableError(StrCat("UCX: ucp_worker_set_am_recv_handler: ", UcsError(st)));
  }
  return absl::OkStatus();
}

void Worker::Cleanup() {
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  // Endpoints whose close did not finish in time: destroying the worker cancels what is left of them;
  // only then may their send buffers be unregistered.
  std::vector<std::shared_ptr<ConnState>> left;
  for (auto& [ep, conn] : eps_) left.push_back(conn);
  eps_.clear();
  closing_.clear();
  {
    MutexLock lock(mu_);  // no Post is signalling the worker now, and none will
    destroyed_ = true;
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  for (auto& conn : left) Release(conn.get());
  if (context_ != nullptr) ucp_cleanup(context_);
  worker_ = nullptr;
  context_ = nullptr;
}

void Worker::Loop() {
  for (;;) {
    RunCommands();
    while (ucp_worker_progress(worker_) != 0) RunDeferred();
    RunDeferred();
    Sweep();
    if (stopping_ && (eps_.empty() || stop_deadline_.passed())) return;
    {
      MutexLock lock(mu_);
      if (!commands_.empty()) continue;
    }
    const ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    {
      MutexLock lock(mu_);  // a command posted before the arm: its signal may have been drained
      if (!commands_.empty()) continue;
    }
    // Not armed (an interface without events): poll briefly rather than sleep through its events.
    const int wait_ms = st != UCS_OK ? 1 : stopping_ ? 10 : -1;
    pollfd pfd{efd_, POLLIN, 0};
    ::poll(&pfd, 1, wait_ms);  // EINTR: loop anyway
  }
}

void Worker::RunCommands() {
  std::vector<std::function<void()>> batch;
  {
    MutexLock lock(mu_);
    batch.swap(commands_);
  }
  for (auto& fn : batch) fn();
}

void Worker::RunDeferred() {
  while (!deferred_.empty()) {
    std::vector<std::function<void()>> batch;
    batch.swap(deferred_);
    for (auto& fn : batch) fn();
  }
}

void Worker::Sweep() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    ConnState* c = it->get();
    if (!c->close_done || c->inflight > 0) {
      ++it;
      continue;
    }
    eps_.erase(c->ep);
    Release(c);
    it = closing_.erase(it);
  }
}

void Worker::Release(ConnState* c) {
  if (c->memh != nullptr) {
    ucp_mem_unmap(context_, c->memh);
    c->memh = nullptr;
    --g_registrations;
  }
  if (c->ep != nullptr) --g_endpoints;
  c->ep = nullptr;
  MutexLock lock(c->mu);
  c->closed = true;
  c->FailLocked(absl::UnavailableError(StrCat(c->peer, ": connection closed")));
}

Status Worker::Register(ConnState* conn) {
  const UcxOptions& o = conn->options;
  const size_t bytes = o.max_message_bytes * static_cast<size_t>(o.send_buffers);
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  conn->buffers = static_cast<char*>(std::aligned_alloc(4096, rounded));
  if (conn->buffers == nullptr) return absl::ResourceExhaustedError(StrCat("cannot allocate ", rounded, " bytes"));
  for (int i = 0; i < o.send_buffers; ++i) {
    SendSlot s;
    s.conn = conn;
    s.data = conn->buffers + static_cast<size_t>(i) * o.max_message_bytes;
    s.index = static_cast<size_t>(i);
    conn->slots.push_back(s);
  }
  {
    MutexLock lock(conn->mu);  // not shared yet: the lock is for the analysis
    conn->slot_busy.assign(conn->slots.size(), false);
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = conn->buffers;
  mp.length = rounded;
  const ucs_status_t st = ucp_mem_map(context_, &mp, &conn->memh);
  if (st != UCS_OK) {
    conn->memh = nullptr;
    return absl::UnavailableError(StrCat("ucp_mem_map of ", rounded, " bytes: ", UcsError(st)));
  }
  ++g_registrations;
  return absl::OkStatus();
}

Status Worker::CreateEndpoint(const std::shared_ptr<ConnState>& conn, ucp_ep_params_t* p) {
  p->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p->err_mode = UCP_ERR_HANDLING_MODE_PEER;  // requests fail (and OnEndpointError runs) when the peer dies
  p->err_handler.cb = &Worker::OnEndpointError;
  p->err_handler.arg = conn.get();
  const ucs_status_t st = ucp_ep_create(worker_, p, &conn->ep);
  if (st != UCS_OK) {
    conn->ep = nullptr;
    ucp_mem_unmap(context_, conn->memh);
    conn->memh = nullptr;
    --g_registrations;
    return absl::UnavailableError(StrCat("ucp_ep_create: ", UcsError(st)));
  }
  ++g_endpoints;
  eps_[conn->ep] = conn;
  SendControl(conn.get(), ControlType::kHello, conn->options.receive_window_bytes);
  return absl::OkStatus();
}

void Worker::OnEndpointError(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* conn = static_cast<ConnState*>(arg);
  {
    MutexLock lock(conn->mu);
    conn->FailLocked(absl::UnavailableError(
        StrCat(conn->peer, ": ", conn->connected ? "UCX endpoint error" : kNotConnected, ": ", UcsError(st))));
  }
  Worker* w = conn->worker;
  auto it = w->eps_.find(conn->ep);
  if (it == w->eps_.end()) return;
  std::shared_ptr<ConnState> keep = it->second;
  w->deferred_.push_back([w, keep] { w->BeginClose(keep, /*force=*/true); });
}

}  // namespace vigil::transport::ucx
