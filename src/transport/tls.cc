// TLS over any Connection (tls.h): OpenSSL 3 with memory BIOs.
//
// How a wrapped connection moves bytes. The SSL object reads ciphertext from `rbio_` and writes it to
// `wbio_`, two memory BIOs; the connection moves bytes between them and the inner connection:
//  - input: when an SSL call wants to read, one thread at a time (the "reader", `reading_`) calls
//    inner->Read with the mutex released, then feeds what arrived into rbio_ under the mutex. A second
//    thread that also needs input (the Write thread during the handshake, while the Read thread is in
//    inner->Read) waits on `cv_` for that input instead of reading the inner connection itself — the
//    inner connection allows one reader — and retries its SSL call when it arrives.
//  - output: one thread at a time (the "flusher", `writing_`) takes what wbio_ holds and passes it to
//    inner->Write with the mutex released. Taking and sending under one role keeps the ciphertext in the
//    order OpenSSL produced it. The Write thread, which must know its bytes went out, waits for another
//    flusher and then sends what is left itself. The Read thread never waits for the Write thread's
//    output: when the Write thread is flushing, it leaves its own (handshake) output in wbio_ for it —
//    a waiting flusher drains wbio_ until empty — so a Read is never held up by a peer that stopped
//    reading our writes.
// The mutex guards the SSL object and the BIOs (OpenSSL's SSL is not safe for concurrent use); it is
// never held across an inner Read or Write, so Shutdown and the other direction always get it promptly.
#include "vigil/common/deadline.h"
#include "vigil/transport/tls.h"

#include <arpa/inet.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

#include "transport/openssl_handles.h"
#include "vigil/common/mutex.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;

// Inner Read size: one full TLS record (16 KiB of payload plus at most 2 KiB of overhead) fits.
constexpr size_t kInnerReadBytes = 32 * 1024;
// Plaintext per SSL_write: bounds the ciphertext held in wbio_ before it is flushed.
constexpr size_t kWriteChunkBytes = 64 * 1024;

// Rounded up, so that the inner connection's deadline is never before ours.
milliseconds Remaining(Deadline deadline) {
  if (deadline.never()) return milliseconds::max();
  return std::chrono::ceil<milliseconds>(deadline.left());
}

// OpenSSL's default for an encrypted key is a passphrase prompt on the terminal; a service must fail.
int NoPassphrase(char*, int, int, void*) { return 0; }

struct EvpPkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};

// The host in "127.0.0.1:7400", "[::1]:7400", "tcp://name:7400" or "ucx://name:7400/...".
std::string HostOf(std::string address) {
  if (const size_t scheme = address.find("://"); scheme != std::string::npos) address.erase(0, scheme + 3);
  if (const size_t slash = address.find('/'); slash != std::string::npos) address.erase(slash);
  if (address.starts_with('[')) {
    const size_t close = address.find(']');
    return address.substr(1, close == std::string::npos ? std::string::npos : close - 1);
  }
  const size_t colon = address.rfind(':');
  if (colon != std::string::npos && address.find(':') == colon) address.erase(colon);  // host:port, not bare IPv6
  return address;
}

bool IsIpAddress(const std::string& name) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, name.c_str(), buf) == 1 || ::inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

Status CheckReadable(std::string_view field, const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(StrCat("tls ", field, " ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

StatusOr<SslCtxPtr> NewContext(bool server) {
  ERR_clear_error();
  SslCtxPtr ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
  if (!ctx) return absl::InternalError(StrCat("tls: SSL_CTX_new: ", TakeOpenSslErrors()));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);  // the max stays the library's: TLS 1.3
  // No renegotiation (TLS 1.2 only; its history of attacks, and it would make Read need to write) and no
  // compression (CRIME). No resumption: links are long-lived, so tickets would only add post-handshake
  // messages, and a TLS 1.3 server then sends nothing after its handshake.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_default_passwd_cb(ctx.get(), NoPassphrase);
  return ctx;
}

// cert_file (a chain, leaf first) and key_file, and that they belong together.
Status LoadIdentity(SSL_CTX* ctx, const TlsOptions& o) {
  VIGIL_RETURN_IF_ERROR(CheckReadable("cert_file", o.cert_file));
  VIGIL_RETURN_IF_ERROR(CheckReadable("key_file", o.key_file));
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx, o.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(StrCat("tls cert_file ", o.cert_file, ": ", TakeOpenSslErrors()));
  }
  // The key is parsed apart from SSL_CTX_use_PrivateKey so that a malformed key file and a key of
  // another certificate get different messages.
  BioPtr bio(BIO_new_file(o.key_file.c_str(), "r"));
  std::unique_ptr<EVP_PKEY, EvpPkeyFree> key(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  if (!key) return absl::InvalidArgumentError(StrCat("tls key_file ", o.key_file, ": ", TakeOpenSslErrors()));
  if (SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(StrCat("tls key_file ", o.key_file, " does not match cert_file ", o.cert_file,
                                             ": ", TakeOpenSslErrors()));
  }
  return absl::OkStatus();
}

Status LoadCa(SSL_CTX* ctx, const std::string& ca_file) {
  VIGIL_RETURN_IF_ERROR(CheckReadable("ca_file", ca_file));
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(StrCat("tls ca_file ", ca_file, ": ", TakeOpenSslErrors()));
  }
  return absl::OkStatus();
}

// One TLS session over `inner_`; see the top of the file for how bytes move.
class TlsConnection final : public Connection {
 public:
  TlsConnection(std::unique_ptr<Connection> inner, std::shared_ptr<TlsContext> context, bool server,
                std::string server_name)
      : inner_(std::move(inner)), context_(std::move(context)), server_(server), in_buf_(new char[kInnerReadBytes]) {
    if (context_->is_server() != server) {
      fatal_ = absl::InvalidArgumentError(server ? "tls: WrapTlsServer needs a TlsContext::Server"
                                                 : "tls: WrapTlsClient needs a TlsContext::Client");
      return;
    }
    ERR_clear_error();
    ssl_.reset(SSL_new(context_->native()));
    BioPtr rbio(BIO_new(BIO_s_mem())), wbio(BIO_new(BIO_s_mem()));
    if (!ssl_ || !rbio || !wbio) {
      fatal_ = absl::InternalError(StrCat("tls: SSL_new: ", TakeOpenSslErrors()));
      ssl_.reset();
      return;
    }
    // An empty rbio_ means "no input yet" (SSL_ERROR_WANT_READ), never end of stream: the end of the
    // inner stream comes from inner->Read.
    BIO_set_mem_eof_return(rbio.get(), -1);
    rbio_ = rbio.release();
    wbio_ = wbio.release();
    SSL_set_bio(ssl_.get(), rbio_, wbio_);  // the SSL owns both now
    if (server) {
      SSL_set_accept_state(ssl_.get());
      return;
    }
    SSL_set_connect_state(ssl_.get());
    if (server_name.empty()) server_name = HostOf(inner_->peer());
    if (IsIpAddress(server_name)) {
      // Matched against the certificate's IP SANs; no SNI (RFC 6066 allows host names only).
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_.get()), server_name.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl_.get(), server_name.c_str());
      SSL_set_hostflags(ssl_.get(), X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      SSL_set1_host(ssl_.get(), server_name.c_str());
    }
    ERR_clear_error();  // OpenSSL errors are per thread: leave none behind for unrelated code
  }

  ~TlsConnection() override {
    MutexLock lock(mu_);
    // A healthy session says goodbye (close_notify) without waiting for the network or the peer's reply.
    if (ssl_ && handshake_done_ && !shut_.load() && fatal_.ok() && read_error_.ok() && write_error_.ok()) {
      ERR_clear_error();
      SSL_shutdown(ssl_.get());
      (void)Flush(lock, Deadline::After(milliseconds(0)), /*wait_for_others=*/false);
    }
    ERR_clear_error();
  }

  Status Write(std::string_view bytes, milliseconds timeout) override {
    const auto deadline = Deadline::After(timeout);
    MutexLock lock(mu_);
    VIGIL_RETURN_IF_ERROR(Usable(/*writing=*/true));
    while (!bytes.empty()) {
      const int len = static_cast<int>(std::min(bytes.size(), kWriteChunkBytes));
      const uint64_t seen = input_events_;
      ERR_clear_error();
      // Runs the handshake first when it has not finished. After WANT_READ it is retried with the same
      // buffer and length, as OpenSSL requires.
      const int n = SSL_write(ssl_.get(), bytes.data(), len);
      const int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_.get(), n);
      NoteHandshake();
      VIGIL_RETURN_IF_ERROR(CheckSslError(lock, err, deadline, /*wait_for_others=*/true));
      if (n > 0) bytes.remove_prefix(static_cast<size_t>(n));
      // The Write must know its bytes went out (connection.h), so it waits for another flusher.
      VIGIL_RETURN_IF_ERROR(Flush(lock, deadline, /*wait_for_others=*/true));
      if (err == SSL_ERROR_WANT_READ) VIGIL_RETURN_IF_ERROR(AwaitInput(lock, seen, deadline, timeout));
      VIGIL_RETURN_IF_ERROR(Usable(/*writing=*/true));
    }
    return absl::OkStatus();
  }

  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    if (max == 0) return absl::InvalidArgumentError("tls: Read into an empty buffer");
    const auto deadline = Deadline::After(timeout);
    MutexLock lock(mu_);
    for (;;) {
      VIGIL_RETURN_IF_ERROR(Usable(/*writing=*/false));
      const uint64_t seen = input_events_;
      ERR_clear_error();
      const int n = SSL_read(ssl_.get(), buf, static_cast<int>(std::min<size_t>(max, INT_MAX)));
      const int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_.get(), n);
      NoteHandshake();
      VIGIL_RETURN_IF_ERROR(CheckSslError(lock, err, deadline, /*wait_for_others=*/false));
      // Output the call produced (the handshake's next flight) goes out now; this never waits on the
      // Write thread's output (see the top of the file). A failure stays in write_error_.
      const Status flushed = Flush(lock, deadline, /*wait_for_others=*/false);
      if (n > 0) {
        received_data_ = true;
        return static_cast<size_t>(n);
      }
      VIGIL_RETURN_IF_ERROR(flushed);
      if (err == SSL_ERROR_WANT_READ) VIGIL_RETURN_IF_ERROR(AwaitInput(lock, seen, deadline, timeout));
    }
  }

  void Shutdown() override {
    shut_.store(true);
    inner_->Shutdown();  // a thread in inner->Read or inner->Write returns at once
    MutexLock lock(mu_);
    cv_.NotifyAll();  // and threads waiting for one of them
  }

  std::string peer() const override { return inner_->peer(); }
  std::string transports() const override { return inner_->transports(); }

 private:
  // The helpers below that take the caller's `lock` release and retake mu_ itself (mu_.Unlock()/Lock()) where
  // they wait on the inner connection, so that the analysis sees mu_ held again on return; `lock` is what
  // cv_ waits with.
  using Lock = MutexLock;

  // Whether calls may proceed.
  Status Usable(bool writing) const VIGIL_REQUIRES(mu_) {
    if (shut_.load()) return absl::UnavailableError(StrCat(peer(), ": connection shut down"));
    if (!fatal_.ok()) return fatal_;
    if (writing && !write_error_.ok()) return write_error_;
    return absl::OkStatus();
  }

  // Notes the end of the handshake right after each SSL call: after a failure OpenSSL reports "in init"
  // again, so it cannot be asked then.
  void NoteHandshake() VIGIL_REQUIRES(mu_) {
    if (!handshake_done_ && SSL_is_init_finished(ssl_.get())) handshake_done_ = true;
  }
  bool InHandshake() const VIGIL_REQUIRES(mu_) { return !handshake_done_; }

  // An inner connection's message without its leading "peer: " (ours names the peer already).
  std::string InnerReason(const Status& st) const {
    std::string m(st.message());  // absl::string_view (Debian's abseil), not std::string_view
    const std::string prefix = StrCat(peer(), ": ");
    if (m.starts_with(prefix)) m.erase(0, prefix.size());
    return m;
  }

  Status TimedOut(milliseconds timeout) const VIGIL_REQUIRES(mu_) {
    if (InHandshake()) {
      return absl::DeadlineExceededError(
          StrCat("tls handshake with ", peer(), " did not complete within ", timeout.count(), " ms"));
    }
    return absl::DeadlineExceededError(StrCat(peer(), ": nothing received for ", timeout.count(), " ms"));
  }

  // Turns SSL_get_error's `err` for the call just made into the error to return: the peer's
  // close_notify, or a TLS failure (which becomes fatal_). OK for SSL_ERROR_NONE and for WANT_READ /
  // WANT_WRITE (the caller flushes, gets input and retries). mu_ held since the call, so that the SSL state
  // and this thread's OpenSSL error queue are still the call's.
  Status CheckSslError(Lock& lock, int err, Deadline deadline, bool wait_for_others) VIGIL_REQUIRES(mu_) {
    switch (err) {
      case SSL_ERROR_NONE:
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE:  // a memory BIO takes everything; cannot happen
        return absl::OkStatus();
      case SSL_ERROR_ZERO_RETURN:  // the peer's close_notify
        if (read_error_.ok()) read_error_ = absl::UnavailableError(StrCat(peer(), ": peer closed the connection"));
        return read_error_;
      default: {
        std::string reason = TakeOpenSslErrors("protocol error");
        if (const long verify = SSL_get_verify_result(ssl_.get()); verify != X509_V_OK) {
          reason += StrCat(" (", X509_verify_cert_error_string(verify), ")");
        }
        // With TLS 1.3 a client's handshake ends before the server has checked the client's certificate:
        // until the server's first data, a failure (its alert) still belongs to the handshake.
        const bool handshake = InHandshake() || (!server_ && !received_data_);
        fatal_ = absl::UnavailableError(handshake ? StrCat("tls handshake with ", peer(), " failed: ", reason)
                                                  : StrCat(peer(), ": tls: ", reason));
        // OpenSSL queued an alert that tells the peer why ("unknown ca", "certificate required").
        (void)Flush(lock, deadline, wait_for_others);
        return fatal_;
      }
    }
  }

  // Gets more ciphertext into rbio_ after an SSL call wanted to read: reads the inner connection, or
  // waits while another thread does. `seen` is input_events_ at the time of that SSL call: if input
  // arrived since (while this thread flushed), the call is retried at once — another thread may have
  // moved the handshake on with it, and waiting for more input could wait for input that never comes.
  // OK means "retry the SSL call". mu_ held (released while reading or waiting).
  Status AwaitInput(Lock& lock, uint64_t seen, Deadline deadline, milliseconds timeout)
      VIGIL_REQUIRES(mu_) {
    if (input_events_ != seen) return absl::OkStatus();
    if (!read_error_.ok()) return read_error_;
    if (reading_) {  // its end (data, timeout or error) increments input_events_
      while (!shut_.load() && input_events_ == seen) {
        if (!cv_.WaitUntil(lock, deadline) && !shut_.load() && input_events_ == seen) return TimedOut(timeout);
      }
      return absl::OkStatus();
    }
    reading_ = true;
    mu_.Unlock();
    StatusOr<size_t> n = inner_->Read(in_buf_.get(), kInnerReadBytes, Remaining(deadline));
    mu_.Lock();
    reading_ = false;
    ++input_events_;
    cv_.NotifyAll();
    if (n.ok()) {
      BIO_write(rbio_, in_buf_.get(), static_cast<int>(*n));  // a memory BIO grows; never fails short
      return absl::OkStatus();
    }
    if (n.status().code() == absl::StatusCode::kDeadlineExceeded) return TimedOut(timeout);
    if (shut_.load()) return Usable(/*writing=*/false);  // "connection shut down", not a handshake failure
    read_error_ = InHandshake() ? absl::UnavailableError(StrCat("tls handshake with ", peer(), " failed: ",
                                                                InnerReason(n.status())))
                                : n.status();
    return read_error_;
  }

  // Sends what wbio_ holds through inner->Write, in order. With `wait_for_others` it returns once
  // everything queued so far went out (waiting for another flusher first); without, it sends what is
  // queued unless another thread is flushing (which then sends it: a waiting flusher drains until
  // wbio_ is empty). mu_ held (released while sending or waiting).
  Status Flush(Lock& lock, Deadline deadline, bool wait_for_others) VIGIL_REQUIRES(mu_) {
    for (;;) {
      if (BIO_ctrl_pending(wbio_) == 0) return wait_for_others ? write_error_ : absl::OkStatus();
      if (!write_error_.ok()) return write_error_;
      if (writing_) {
        if (!wait_for_others) return absl::OkStatus();
        bool timed_out = false;
        while (!shut_.load() && writing_ && !timed_out) timed_out = !cv_.WaitUntil(lock, deadline);
        if (timed_out && !shut_.load() && writing_) {
          return absl::DeadlineExceededError(StrCat(peer(), ": tls: send blocked (the peer is not reading)"));
        }
        if (shut_.load()) return absl::UnavailableError(StrCat(peer(), ": connection shut down"));
        continue;
      }
      writing_ = true;
      std::string out(BIO_ctrl_pending(wbio_), '\0');
      const int got = BIO_read(wbio_, out.data(), static_cast<int>(out.size()));
      out.resize(got > 0 ? static_cast<size_t>(got) : 0);
      mu_.Unlock();
      Status st = inner_->Write(out, Remaining(deadline));
      mu_.Lock();
      writing_ = false;
      cv_.NotifyAll();
      if (!st.ok()) {
        // Part of a record may be on the wire: nothing written after it would decrypt at the peer.
        write_error_ = absl::UnavailableError(
            StrCat(peer(), ": tls: an earlier write failed mid-record: ", InnerReason(st)));
        return st;
      }
      if (!wait_for_others) return absl::OkStatus();  // the rest, if any, is the Write thread's to send
    }
  }

  const std::unique_ptr<Connection> inner_;
  const std::shared_ptr<TlsContext> context_;
  const bool server_;
  const std::unique_ptr<char[]> in_buf_;  // used by the thread that holds `reading_`

  Mutex mu_;
  CondVar cv_;  // reading_ or writing_ ended, or Shutdown
  SslPtr ssl_ VIGIL_GUARDED_BY(mu_);                // null when construction failed (fatal_ says why)
  BIO* rbio_ VIGIL_GUARDED_BY(mu_) = nullptr;       // owned by ssl_: inner → SSL
  BIO* wbio_ VIGIL_GUARDED_BY(mu_) = nullptr;       // owned by ssl_: SSL → inner
  bool reading_ VIGIL_GUARDED_BY(mu_) = false;      // a thread is in inner_->Read
  bool writing_ VIGIL_GUARDED_BY(mu_) = false;      // a thread is in inner_->Write
  uint64_t input_events_ VIGIL_GUARDED_BY(mu_) = 0;  // inner reads finished, for threads waiting for input
  bool handshake_done_ VIGIL_GUARDED_BY(mu_) = false;
  bool received_data_ VIGIL_GUARDED_BY(mu_) = false;  // a Read returned data
  Status fatal_ VIGIL_GUARDED_BY(mu_);        // a TLS failure (handshake, protocol): every call returns it
  Status read_error_ VIGIL_GUARDED_BY(mu_);   // the inner stream ended (peer closed, reset, Shutdown)
  Status write_error_ VIGIL_GUARDED_BY(mu_);  // an inner Write failed: the outgoing stream is broken
  std::atomic<bool> shut_{false};
};

class TlsDialer final : public Dialer {
 public:
  TlsDialer(std::unique_ptr<Dialer> inner, std::shared_ptr<TlsContext> context, std::string server_name)
      : inner_(std::move(inner)), context_(std::move(context)), server_name_(std::move(server_name)) {
    if (server_name_.empty()) server_name_ = context_->options().server_name;
    if (server_name_.empty()) server_name_ = HostOf(inner_->target());
  }

  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> conn, inner_->Dial(timeout));
    return WrapTlsClient(std::move(conn), context_, server_name_);
  }

  std::string target() const override { return StrCat("tls+", inner_->target()); }

 private:
  const std::unique_ptr<Dialer> inner_;
  const std::shared_ptr<TlsContext> context_;
  std::string server_name_;
};

class TlsListener final : public Listener {
 public:
  TlsListener(std::unique_ptr<Listener> inner, std::shared_ptr<TlsContext> context)
      : inner_(std::move(inner)), context_(std::move(context)) {}

  std::string_view kind() const override { return inner_->kind(); }
  uint16_t port() const override { return inner_->port(); }
  const std::string& address() const override { return inner_->address(); }

  StatusOr<std::unique_ptr<Connection>> Accept(milliseconds timeout) override {
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> conn, inner_->Accept(timeout));
    return WrapTlsServer(std::move(conn), context_);
  }

 private:
  const std::unique_ptr<Listener> inner_;
  const std::shared_ptr<TlsContext> context_;
};

}  // namespace

TlsContext::~TlsContext() { SslCtxFree()(ctx_); }

StatusOr<std::shared_ptr<TlsContext>> TlsContext::Server(const TlsOptions& options) {
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError("tls server: cert_file and key_file are required");
  }
  VIGIL_ASSIGN_OR_RETURN(SslCtxPtr ctx, NewContext(/*server=*/true));
  VIGIL_RETURN_IF_ERROR(LoadIdentity(ctx.get(), options));
  if (!options.ca_file.empty()) {
    VIGIL_RETURN_IF_ERROR(LoadCa(ctx.get(), options.ca_file));
    // The CertificateRequest names the accepted CAs, so a client with several certificates picks the right one.
    X509NameStackPtr names(SSL_load_client_CA_file(options.ca_file.c_str()));
    if (names) SSL_CTX_set_client_CA_list(ctx.get(), names.release());
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | (options.require_peer_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                       nullptr);
  }
  ERR_clear_error();
  return std::shared_ptr<TlsContext>(new TlsContext(ctx.release(), /*server=*/true, options));
}

StatusOr<std::shared_ptr<TlsContext>> TlsContext::Client(const TlsOptions& options) {
  if (options.ca_file.empty()) {
    return absl::InvalidArgumentError("tls client: ca_file is required (the server's certificate is always verified)");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("tls client: cert_file and key_file go together (mutual TLS)");
  }
  VIGIL_ASSIGN_OR_RETURN(SslCtxPtr ctx, NewContext(/*server=*/false));
  VIGIL_RETURN_IF_ERROR(LoadCa(ctx.get(), options.ca_file));
  if (!options.cert_file.empty()) VIGIL_RETURN_IF_ERROR(LoadIdentity(ctx.get(), options));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  ERR_clear_error();
  return std::shared_ptr<TlsContext>(new TlsContext(ctx.release(), /*server=*/false, options));
}

std::unique_ptr<Connection> WrapTlsClient(std::unique_ptr<Connection> inner, std::shared_ptr<TlsContext> context,
                                          std::string server_name) {
  if (server_name.empty()) server_name = context->options().server_name;
  return std::make_unique<TlsConnection>(std::move(inner), std::move(context), /*server=*/false,
                                         std::move(server_name));
}

std::unique_ptr<Connection> WrapTlsServer(std::unique_ptr<Connection> inner, std::shared_ptr<TlsContext> context) {
  return std::make_unique<TlsConnection>(std::move(inner), std::move(context), /*server=*/true, std::string());
}

std::unique_ptr<Dialer> MakeTlsDialer(std::unique_ptr<Dialer> inner, std::shared_ptr<TlsContext> context,
                                      std::string server_name) {
  return std::make_unique<TlsDialer>(std::move(inner), std::move(context), std::move(server_name));
}

std::unique_ptr<Listener> MakeTlsListener(std::unique_ptr<Listener> inner, std::shared_ptr<TlsContext> context) {
  return std::make_unique<TlsListener>(std::move(inner), std::move(context));
}

}  // namespace vigil::transport
