// transport/openssl_handles.h — owners for the OpenSSL handles the transport creates (internal).
// Each handle has a unique_ptr with its free function; no naked *_free calls elsewhere.
#pragma once

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>
#include <string>

namespace vigil::transport {

struct SslCtxFree {
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
};
struct SslFree {
  void operator()(SSL* p) const { SSL_free(p); }  // frees the BIOs attached with SSL_set_bio too
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free_all(p); }
};
struct X509NameStackFree {
  void operator()(STACK_OF(X509_NAME) * p) const { sk_X509_NAME_pop_free(p, X509_NAME_free); }
};

using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;
using SslPtr = std::unique_ptr<SSL, SslFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509NameStackPtr = std::unique_ptr<STACK_OF(X509_NAME), X509NameStackFree>;

// Empties this thread's OpenSSL error queue into one line: the reasons, oldest first, "; "-separated
// and without repeats ("certificate verify failed"); `fallback` when the queue is empty.
inline std::string TakeOpenSslErrors(const char* fallback = "unknown error") {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    std::string reason;
    if (const char* r = ERR_reason_error_string(e)) {
      reason = r;
    } else {
      char buf[256];
      ERR_error_string_n(e, buf, sizeof buf);
      reason = buf;
    }
    if (out.find(reason) != std::string::npos) continue;
    if (!out.empty()) out += "; ";
    out += reason;
  }
  return out.empty() ? fallback : out;
}

}  // namespace vigil::transport
