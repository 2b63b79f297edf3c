// vigil/transport/throwaway_certs.h — a private CA and certificates signed by it, made at run time with the
// OpenSSL API, for TLS on one machine where nobody issued real ones: `vigil bench transport` and the tests (no
// openssl CLI, no checked-in keys that expire). Never for a deployment: the CA's key is thrown away with the
// directory, and anyone who reads the directory can impersonate every side.
//
// MakeThrowawayCerts(dir) writes PEM files into `dir` (created if missing) and returns their paths:
//  - ca:       a self-signed CA ("vigil test CA");
//  - server:   signed by ca, CN=localhost, subjectAltName DNS:localhost, IP:127.0.0.1, serverAuth;
//  - client:   signed by ca, CN=vigil-test-edge, clientAuth;
//  - other_ca: an unrelated self-signed CA ("vigil other CA"), for "wrong CA" tests, and other_client, a
//    client certificate signed by it.
// Keys are EC P-256 (fast to make); certificates are valid from an hour ago for 7 days; SHA-256.
// Key files are written with mode 0600. Errors: Internal naming the step and OpenSSL's reason.
// Ownership: the files are the caller's (delete the directory to discard them); nothing is kept in memory.
// Thread-safety: distinct directories may be written from any thread.
#pragma once

#include <string>

#include "vigil/common/status.h"

namespace vigil::transport {

struct ThrowawayCerts {
  std::string ca_cert;
  std::string server_cert, server_key;
  std::string client_cert, client_key;
  std::string other_ca_cert;
  std::string other_client_cert, other_client_key;
};

StatusOr<ThrowawayCerts> MakeThrowawayCerts(const std::string& dir);

}  // namespace vigil::transport
