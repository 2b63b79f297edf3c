#include "vigil/transport/http_access.h"

#include <algorithm>

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace vigil::transport {
namespace {

bool TokenMatches(std::string_view expected, std::string_view header) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.size() < kPrefix.size() || header.substr(0, kPrefix.size()) != kPrefix) return false;
  const std::string_view got = header.substr(kPrefix.size());
  return got.size() == expected.size() && CRYPTO_memcmp(got.data(), expected.data(), got.size()) == 0;
}

std::string Trimmed(std::string s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  const size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

StatusOr<std::unique_ptr<httplib::Server>> MakeHttpServer(HttpAccess access) {
  if (access.cert_file.empty() != access.key_file.empty()) {
    return absl::InvalidArgumentError("http tls: cert_file and key_file go together");
  }
  std::unique_ptr<httplib::Server> server;
  if (!access.cert_file.empty()) {
    for (const std::string* f : {&access.cert_file, &access.key_file}) {
      if (!std::ifstream(*f)) return absl::InvalidArgumentError(StrCat("http tls: cannot read ", *f));
    }
    auto ssl = std::make_unique<httplib::SSLServer>(access.cert_file.c_str(), access.key_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(StrCat("http tls: ", access.cert_file, " / ", access.key_file,
                                               ": not a PEM certificate and its private key"));
    }
    server = std::move(ssl);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  auto shared = std::make_shared<HttpAccess>(std::move(access));
  server->set_pre_routing_handler([shared](const httplib::Request& req, httplib::Response& res) {
    const HttpAccess& a = *shared;
    auto reject = [&](int status, std::string_view reason, std::string_view message) {
      spdlog::warn("http: {}:{} {} {}: refused ({})", req.remote_addr, req.remote_port, req.method, req.path, reason);
      if (a.on_reject) a.on_reject(reason, req.remote_addr);
      res.status = status;
      if (status == 401) res.set_header("WWW-Authenticate", "Bearer");
      res.set_content(StrCat("{\"error\":\"", message, "\"}"), "application/json");
      return httplib::Server::HandlerResponse::Handled;
    };
    if (a.allow && !a.allow->Allows(req.remote_addr)) {
      return reject(403, "address", "this address may not use the API");
    }
    auto is_public = [&](const std::string& path) {
      if (path == "/healthz") return true;
      return std::any_of(a.public_paths.begin(), a.public_paths.end(), [&](const std::string& p) {
        const bool prefix = p.size() > 1 && p.ends_with('/');  // "/" alone is the root page, not everything
        return prefix ? path.starts_with(p) && path.find("..") == std::string::npos : path == p;
      });
    };
    if (!a.token.empty() && !is_public(req.path) && !TokenMatches(a.token, req.get_header_value("Authorization"))) {
      return reject(401, "token",
                    req.has_header("Authorization") ? "the bearer token does not match (Authorization: Bearer ...)"
                                                    : "a bearer token is required (Authorization: Bearer ...)");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  return server;
}

StatusOr<std::string> ReadToken(const std::string& path, const char* env) {
  std::string token;
  std::string what;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(StrCat("http token_file ", path, ": cannot read"));
    std::stringstream ss;
    ss << in.rdbuf();
    token = Trimmed(ss.str());
    what = StrCat("http token_file ", path);
  } else if (const char* v = env ? std::getenv(env) : nullptr; v != nullptr && *v != '\0') {
    token = Trimmed(v);
    what = StrCat("environment variable ", env);
  } else {
    return std::string();
  }
  if (token.size() < 16) {
    return absl::InvalidArgumentError(StrCat(what, ": a token needs at least 16 characters (`openssl rand -hex 32`)"));
  }
  return token;
}

}  // namespace vigil::transport
