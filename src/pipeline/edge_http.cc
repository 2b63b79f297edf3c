#include "vigil/pipeline/edge_http.h"

#include <chrono>
#include <utility>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "vigil/transport/http_access.h"

namespace vigil::pipeline {

EdgeHttp::EdgeHttp() = default;
EdgeHttp::~EdgeHttp() { Stop(); }

Status EdgeHttp::Start(EdgeHttpOptions o) {
  if (started_) return absl::OkStatus();
  started_ = true;
  if (o.port == 0 && !o.any_port) return absl::OkStatus();
  transport::HttpAccess access;
  if (!o.allow.empty()) {
    VIGIL_ASSIGN_OR_RETURN(transport::AllowList allow, transport::AllowList::Parse(o.allow));
    access.allow = std::make_shared<const transport::AllowList>(std::move(allow));
  }
  VIGIL_ASSIGN_OR_RETURN(access.token, transport::ReadToken(o.token_file, "VIGIL_HTTP_TOKEN"));
  access.cert_file = o.cert_file;
  access.key_file = o.key_file;
  metrics::Registry* reg = o.registry;
  metrics::Counter* by_address = &reg->GetCounter("vigil_http_rejected_total", "HTTP requests refused",
                                                  {{"reason", "address"}});
  metrics::Counter* by_token = &reg->GetCounter("vigil_http_rejected_total", "HTTP requests refused",
                                                {{"reason", "token"}});
  access.on_reject = [by_address, by_token](std::string_view reason, const std::string&) {
    (reason == "address" ? by_address : by_token)->Inc();
  };
  VIGIL_ASSIGN_OR_RETURN(server_, transport::MakeHttpServer(std::move(access)));
  server_->Get("/healthz", [healthz = std::move(o.healthz)](const httplib::Request&, httplib::Response& res) {
    auto [status, body] = healthz();
    res.status = status;
    res.set_content(body, "application/json");
  });
  server_->Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    res.set_content(reg->Render(), metrics::Registry::kContentType);
  });
  server_->Get("/api/placement", [placement = std::move(o.placement_json)](const httplib::Request&,
                                                                          httplib::Response& res) {
    std::optional<std::string> json = placement ? placement() : std::nullopt;
    if (!json) {
      res.status = 503;
      res.set_content(R"json({"error":"not placed yet (a standby without warm sources places at the takeover)"})json",
                      "application/json");
      return;
    }
    res.set_content(*json, "application/json");
  });
  int port = o.port;
  if (o.any_port) {
    port = server_->bind_to_any_port(o.host);
  } else if (!server_->bind_to_port(o.host, o.port)) {
    port = -1;
  }
  if (port <= 0) {
    spdlog::error("edge: cannot bind http {}:{}; /healthz and /metrics are off", o.host, o.port);
    server_.reset();
    return absl::OkStatus();
  }
  port_ = port;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  spdlog::info("edge '{}': http on {}:{} (/healthz, /metrics, /api/placement)", o.edge, o.host, port_);
  return absl::OkStatus();
}

void EdgeHttp::Stop() {
  if (!server_ || !thread_.joinable()) return;
  // A stop() before the server thread is listening is lost: give it up to 2 s to get there.
  for (int i = 0; i < 2000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->stop();
  thread_.join();
}

}  // namespace vigil::pipeline
