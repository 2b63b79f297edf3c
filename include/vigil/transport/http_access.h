// vigil/transport/http_access.h — access control for the nodes' HTTP APIs (cpp-httplib): an address
// allow-list, a bearer token, and TLS.
//
// A request from an address outside the allow-list gets 403; a request without `Authorization: Bearer
// <token>` (when a token is set) gets 401 with `WWW-Authenticate: Bearer`; each is counted through
// `on_reject(reason, peer)` ("address", "token") and logged with the peer, and no handler runs. /healthz
// (and `public_paths`) is exempt from the token (load balancers and orchestrators probe it without secrets) but not from the
// allow-list. The token is compared in constant time and never logged.
//
// Thread-safety: the returned server's handlers run on httplib's worker threads; `on_reject` must be
// thread-safe.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/transport/auth.h"

namespace vigil::transport {

struct HttpAccess {
  std::shared_ptr<const AllowList> allow;  // null: any address
  std::string token;                       // empty: no token required
  std::string cert_file, key_file;         // both set: HTTPS (PEM files); both empty: plain HTTP
  std::function<void(std::string_view reason, const std::string& peer)> on_reject;
  // Paths exempt from the token besides /healthz (exact; a prefix when it ends with '/' and is not "/" itself,
  // never with ".." in the request): files that hold no
  // data, such as the dashboard's page and scripts, which then ask for the token. Not from the allow-list.
  std::vector<std::string> public_paths;
};

// A server with `access` enforced before any route. Errors: InvalidArgument when only one of
// cert_file/key_file is set, or the certificate or key cannot be loaded (naming the file).
StatusOr<std::unique_ptr<httplib::Server>> MakeHttpServer(HttpAccess access);

// Reads a bearer token from `path` (surrounding whitespace trimmed; at least 16 characters), or from
// the environment variable `env` when path is empty and it is set; "" when neither is configured.
// Errors: NotFound/PermissionDenied naming the file, InvalidArgument (too short).
StatusOr<std::string> ReadToken(const std::string& path, const char* env);

}  // namespace vigil::transport
