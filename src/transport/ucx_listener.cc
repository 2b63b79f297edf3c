// The UCX link's listener/accept side (ucx.h UcxListen): the Worker's UCP listener and connection requests,
// and the Listener whose Accept hands out the endpoints that said Hello.
#include <arpa/inet.h>

#include <cstring>
#include <utility>

#include "sockaddr.h"
#include "transport/ucx_worker.h"

namespace vigil::transport {
namespace ucx {

using net::FormatAddress;

StatusOr<sockaddr_storage> Worker::Listen(const sockaddr_storage& addr, std::shared_ptr<AcceptQueue> queue) {
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  p.sockaddr.addrlen = SockaddrLen(addr);
  p.conn_handler.cb = &Worker::OnConnRequest;
  p.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(worker_, &p, &listener_);
  if (st != UCS_OK) {
    listener_ = nullptr;
    // The tcp connection manager reports a bind() that failed with EADDRINUSE as UCS_ERR_BUSY.
    if (st == UCS_ERR_BUSY) return absl::UnavailableError(StrCat("Address already in use (UCX: ", UcsError(st), ")"));
    return absl::UnavailableError(UcsError(st));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) {
    StopListening();
    return absl::UnavailableError(StrCat("ucp_listener_query: ", UcsError(st)));
  }
  accept_queue_ = std::move(queue);
  return attr.sockaddr;
}

void Worker::StopListening() {
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  accept_queue_.reset();
  for (auto& [ep, conn] : eps_) {
    if (conn->awaiting_accept) BeginClose(conn, /*force=*/true);
  }
}

void Worker::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* w = static_cast<Worker*>(arg);
  if (w->listener_ == nullptr) return;
  if (w->stopping_) {
    ucp_listener_reject(w->listener_, request);
    return;
  }
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string peer = "?";
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    peer = FormatAddress(reinterpret_cast<const sockaddr*>(&attr.client_address), SockaddrLen(attr.client_address));
  }
  auto conn = std::make_shared<ConnState>(w, std::move(peer), w->options_);
  conn->awaiting_accept = true;
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = request;
  if (!w->Register(conn.get()).ok()) {
    ucp_listener_reject(w->listener_, request);  // the client's error handler fires (UCS_ERR_REJECTED)
    return;
  }
  // A failed ucp_ep_create has consumed the request: the client learns it from its error handler.
  (void)w->CreateEndpoint(conn, &p);
}

namespace {

class UcxListener final : public Listener {
 public:
  UcxListener(std::shared_ptr<Worker> worker, std::shared_ptr<AcceptQueue> queue, uint16_t port, std::string address)
      : worker_(std::move(worker)), queue_(std::move(queue)), port_(port), address_(std::move(address)) {}

  ~UcxListener() override {
    worker_->Call<bool>([w = worker_.get()] {
      w->StopListening();
      return true;
    });
    std::deque<std::shared_ptr<ConnState>> unaccepted;
    {
      MutexLock lock(queue_->mu);
      unaccepted.swap(queue_->ready);
    }
    for (auto& c : unaccepted) worker_->Post([w = worker_.get(), c] { w->BeginClose(c, /*force=*/true); });
  }

  std::string_view kind() const override { return "ucx"; }
  uint16_t port() const override { return port_; }
  const std::string& address() const override { return address_; }

  StatusOr<std::unique_ptr<Connection>> Accept(milliseconds timeout) override {
    MutexLock lock(queue_->mu);
    const auto deadline = Deadline::After(timeout);  // a CondVar deadline (as wait_for's)
    while (queue_->ready.empty() && queue_->cv.WaitUntil(lock, deadline)) {
    }
    if (queue_->ready.empty()) return absl::DeadlineExceededError("no connection");
    std::shared_ptr<ConnState> conn = std::move(queue_->ready.front());
    queue_->ready.pop_front();
    return MakeConnection(worker_, std::move(conn));
  }

 private:
  const std::shared_ptr<Worker> worker_;
  const std::shared_ptr<AcceptQueue> queue_;
  const uint16_t port_;
  const std::string address_;
};

}  // namespace
}  // namespace ucx

StatusOr<std::unique_ptr<Listener>> UcxListen(const std::string& host, uint16_t port, UcxOptions options) {
  VIGIL_RETURN_IF_ERROR(ucx::ValidateOptions(options));
  const std::string where = StrCat(host.empty() ? "0.0.0.0" : host, ":", port);
  VIGIL_ASSIGN_OR_RETURN(net::AddrInfoPtr addrs, net::Resolve(host, port, true));
  sockaddr_storage addr{};
  std::memcpy(&addr, addrs->ai_addr, addrs->ai_addrlen);
  StatusOr<std::shared_ptr<ucx::Worker>> started = ucx::Worker::Start(options);
  if (!started.ok()) return Annotate(started.status(), StrCat("listen on ", where));
  std::shared_ptr<ucx::Worker> worker = *std::move(started);
  auto queue = std::make_shared<ucx::AcceptQueue>();
  StatusOr<sockaddr_storage> bound =
      worker->Call<StatusOr<sockaddr_storage>>([&] { return worker->Listen(addr, queue); });
  if (!bound.ok()) return absl::UnavailableError(StrCat("listen on ", where, " (UCX): ", bound.status().message()));
  const uint16_t actual = ntohs(bound->ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&*bound)->sin6_port
                                                             : reinterpret_cast<sockaddr_in*>(&*bound)->sin_port);
  return std::unique_ptr<Listener>(new ucx::UcxListener(
      std::move(worker), std::move(queue), actual,
      net::FormatAddress(reinterpret_cast<const sockaddr*>(&*bound), ucx::SockaddrLen(*bound))));
}

}  // namespace vigil::transport
