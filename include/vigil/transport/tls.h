// vigil/transport/tls.h — TLS (OpenSSL 3) over any Connection: TCP sockets, fault-injecting test
// connections, UCX endpoints.
//
// TLS runs over memory BIOs: the SSL object never touches a socket; ciphertext goes through the inner
// Connection's Read and Write, so whatever carries the bytes keeps its own timeouts, Shutdown and faults.
// Protocol: TLS 1.2 minimum (1.3 preferred, negotiated when both ends have it); no renegotiation, no
// compression, no session resumption (a link is long-lived: one full handshake per connection).
//
// The handshake runs lazily inside the first Read or Write of a wrapped connection, bounded by that
// call's timeout, so an accept thread never waits on a slow or silent client. A handshake that has not
// finished when the call's timeout expires returns DeadlineExceeded ("tls handshake with PEER did not
// complete within N ms") and continues in the next Read or Write. A handshake that fails (certificate not
// trusted, hostname mismatch, a client without the required certificate, a peer that does not speak
// TLS) returns Unavailable naming the peer and OpenSSL's reason, e.g. "tls handshake with
// 127.0.0.1:40212 failed: certificate verify failed (hostname mismatch)"; every later call returns it
// too. With TLS 1.3 a client finishes its side of the handshake before the server has checked the
// client's certificate: a refused client learns it at its next Read ("tlsv13 alert certificate
// required"), and its first Write may have succeeded (the server discards those bytes).
//
// Wrapped connections keep connection.h's contract: one thread may Read while another Writes (either
// may drive the handshake: a Write that needs the peer's handshake bytes while the Read thread waits on
// the inner connection takes them from that read, it does not wait for the Read's timeout; a Read never
// waits for the Write thread's output), Shutdown from any thread makes pending and later calls fail
// promptly with Unavailable; peer() and transports() are the inner connection's.
// A Write that fails midway (DeadlineExceeded: the peer stopped reading) leaves a partial TLS record on
// the wire: later Writes on that connection return Unavailable. Destroying a healthy connection sends a
// close_notify without waiting; Shutdown sends none (the framed protocol delimits messages itself).
//
// Key material is never logged or put in messages; messages name files and OpenSSL's reasons.
// Ownership: a wrapped connection owns its inner connection and shares the TlsContext.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX; this header does not include OpenSSL

namespace vigil::transport {

// Files are PEM. Server and client read different fields; see each.
struct TlsOptions {
  // Server: the certificate chain (leaf first, then intermediates) and its private key; required.
  // Client: optional, for mutual TLS; set both or neither. An encrypted key is refused (no prompt).
  std::string cert_file;
  std::string key_file;
  // Server: the CA that client certificates must chain to; when set, clients are verified (mutual TLS).
  // Client: the CA that the server's certificate must chain to; required (there is no unverified mode).
  std::string ca_file;
  // Server with ca_file: whether a client must present a certificate. false admits clients without
  // one (a rollout), still verifying those that present one. Ignored without ca_file and on the client
  // (a client always requires and verifies the server's certificate). Default: true.
  bool require_peer_cert = true;
  // Client: the name sent as SNI and checked against the server certificate's subjectAltName (a DNS
  // name, or an IP address matched against IP SANs). Default "": the name passed to WrapTlsClient /
  // MakeTlsDialer, else the dialed host. Ignored on the server.
  std::string server_name;
};

// Certificates and settings shared by many connections of one role, loaded once.
// Thread-safety: immutable after creation; share it across threads and connections.
class TlsContext {
 public:
  // Loads cert_file + key_file (required) and ca_file (optional: mutual TLS).
  // Errors: InvalidArgument naming the field, the file and the reason, e.g.
  // "tls cert_file /x.pem: No such file or directory", "tls key_file /k.pem does not match cert_file
  // /c.pem: key values mismatch".
  static StatusOr<std::shared_ptr<TlsContext>> Server(const TlsOptions& options);
  // Loads ca_file (required) and the optional cert_file + key_file.
  // Errors: InvalidArgument as for Server, and "tls client: ca_file is required".
  static StatusOr<std::shared_ptr<TlsContext>> Client(const TlsOptions& options);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  bool is_server() const { return server_; }
  const TlsOptions& options() const { return options_; }
  ssl_ctx_st* native() const { return ctx_; }  // for tls.cc; SSL_CTX is thread-safe once configured

 private:
  TlsContext(ssl_ctx_st* ctx, bool server, TlsOptions options)
      : ctx_(ctx), server_(server), options_(std::move(options)) {}
  ssl_ctx_st* const ctx_;  // owned: SSL_CTX_free in the destructor
  const bool server_;
  const TlsOptions options_;
};

// TLS client over `inner` (a connection to the server). The server certificate is verified against
// the context's ca_file and checked for `server_name` (else options().server_name, else the host part
// of inner->peer(), an IP address). REQUIRES: context->is_server() is false; otherwise every call on
// the result fails with InvalidArgument.
std::unique_ptr<Connection> WrapTlsClient(std::unique_ptr<Connection> inner, std::shared_ptr<TlsContext> context,
                                          std::string server_name = {});
// TLS server over `inner` (an accepted connection). REQUIRES: context->is_server(); otherwise every
// call on the result fails with InvalidArgument.
std::unique_ptr<Connection> WrapTlsServer(std::unique_ptr<Connection> inner, std::shared_ptr<TlsContext> context);

// Dials through `inner` and wraps each connection with WrapTlsClient; target() is "tls+" + inner's
// ("tls+tcp://host:port"). The server name is `server_name`, else the context's, else the host of
// inner's target(). Dial returns before the handshake (it runs in the first Read or Write).
std::unique_ptr<Dialer> MakeTlsDialer(std::unique_ptr<Dialer> inner, std::shared_ptr<TlsContext> context,
                                      std::string server_name = {});
// Accepts from `inner` and wraps each connection with WrapTlsServer; kind(), port() and address() are
// inner's. Accept returns before the handshake (it runs in the connection's first Read or Write).
std::unique_ptr<Listener> MakeTlsListener(std::unique_ptr<Listener> inner, std::shared_ptr<TlsContext> context);

}  // namespace vigil::transport
