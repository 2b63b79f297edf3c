// vigil/pipeline/edge_http.h — the edge's HTTP server (edge.yaml http: port, host, allow, token_file, cert/key):
//   GET /healthz         the edge's health as JSON (the `healthz` callback's HTTP status and body)
//   GET /metrics         the registry's text (Prometheus 0.0.4)
//   GET /api/placement   the PlacementReport JSON (`placement_json`), 503 until the edge is placed
// Access (transport/http_access.h): an address allow-list and a bearer token (not for /healthz); HTTPS with a
// certificate and key. Refused requests count in vigil_http_rejected_total{reason=address|token}.
//
// Ownership: the Edge owns it; it owns the server and its thread (started by Start, joined by Stop or the
// destructor). The callbacks run on the server's threads and must be thread-safe; they must stay callable until
// Stop. Thread-safety: Start and Stop from one thread (Run's). Errors: Start returns the allow-list's and the
// token file's errors (InvalidArgument, NotFound, PermissionDenied) and MakeHttpServer's; a port that cannot be
// bound is logged, not an error (the edge runs without /healthz and /metrics, as before issue 41).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/metrics/registry.h"

namespace httplib {
class Server;
}

namespace vigil::pipeline {

struct EdgeHttpOptions {
  std::string edge;        // the edge id, for the logs
  std::string host = "0.0.0.0";
  int port = 0;            // 0: no server (Start does nothing)
  bool any_port = false;   // tests: bind any free port (port() tells) instead of `port`
  std::vector<std::string> allow;  // http_allow: CIDRs (empty: any address)
  std::string token_file;  // http_token_file ("": VIGIL_HTTP_TOKEN, else no token)
  std::string cert_file, key_file;
  metrics::Registry* registry = nullptr;  // required; /metrics renders it
  // GET /healthz: (HTTP status, JSON body).
  std::function<std::pair<int, std::string>()> healthz;
  // GET /api/placement: the report as JSON; nullopt until placed (answered 503).
  std::function<std::optional<std::string>()> placement_json;
};

class EdgeHttp {
 public:
  EdgeHttp();
  ~EdgeHttp();  // Stop
  EdgeHttp(const EdgeHttp&) = delete;
  EdgeHttp& operator=(const EdgeHttp&) = delete;

  // Starts the server (once; a second call does nothing). See the errors above.
  Status Start(EdgeHttpOptions options);
  // Stops the server and joins its thread; idempotent.
  void Stop();
  bool started() const { return started_; }
  int port() const { return port_; }  // the bound port; 0 when none

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  bool started_ = false;
  int port_ = 0;
};

}  // namespace vigil::pipeline
