// TLS over connections (transport/tls.h): contexts, round trips over TcpListener / MakeTcpDialer on
// 127.0.0.1 (ephemeral ports), concurrent Read + Write on both ends (both may drive the handshake),
// refused handshakes (mutual TLS, wrong CA, hostname, plain TCP on either side), Shutdown and timeouts.
// Certificates are made per run by testing/test_certs.h.
#include "testing/test_certs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <openssl/ssl.h>

#include "vigil/transport/protocol.h"
#include "vigil/transport/tls.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using vigil::testing::TestCerts;

constexpr milliseconds kLong{20000};    // generous: the machine is busy
constexpr milliseconds kPrompt{5000};   // "promptly": far below kLong, far above scheduling noise

std::string Msg(const Status& st) { return std::string(st.message()); }

// Wraps a connection to see what the TLS layer does with it: whether a thread waits in Read, and
// optionally hands out at most `max_read` bytes per Read (TLS records then arrive in pieces).
class ObservedConnection final : public Connection {
 public:
  explicit ObservedConnection(std::unique_ptr<Connection> inner, size_t max_read = SIZE_MAX)
      : inner_(std::move(inner)), max_read_(max_read) {}

  Status Write(std::string_view bytes, milliseconds timeout) override { return inner_->Write(bytes, timeout); }
  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    {
      std::lock_guard lock(mu_);
      ++reading_;
      cv_.notify_all();
    }
    StatusOr<size_t> n = inner_->Read(buf, std::min(max, max_read_), timeout);
    std::lock_guard lock(mu_);
    --reading_;
    return n;
  }
  void Shutdown() override { inner_->Shutdown(); }
  std::string peer() const override { return inner_->peer(); }
  std::string transports() const override { return "observed"; }

  // Waits until a thread is inside Read; false after `timeout`.
  bool WaitReading(milliseconds timeout = kLong) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return reading_ > 0; });
  }

 private:
  const std::unique_ptr<Connection> inner_;
  const size_t max_read_;
  std::mutex mu_;
  std::condition_variable cv_;
  int reading_ = 0;  // GUARDED_BY(mu_)
};

// Reads exactly `n` bytes (several Reads).
StatusOr<std::string> ReadExactly(Connection& c, size_t n, milliseconds timeout = kLong) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    VIGIL_ASSIGN_OR_RETURN(size_t k, c.Read(out.data() + got, n - got, timeout));
    got += k;
  }
  return out;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A connected pair: the client's TLS connection and the server's (accepted) one. The handshake has
// not run yet (it runs in the first Read or Write).
struct Pair {
  std::unique_ptr<Connection> client, server;
  ObservedConnection* client_inner = nullptr;  // owned by `client`
  ObservedConnection* server_inner = nullptr;  // owned by `server`
  uint16_t port = 0;
};

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/vigil_tls_test_" + std::to_string(::getpid()));
    StatusOr<TestCerts> c = vigil::testing::MakeTestCerts(*dir_);
    if (c.ok()) certs_ = new TestCerts(*c);
    else cert_error_ = new std::string(Msg(c.status()));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete certs_;
    delete cert_error_;
    dir_ = cert_error_ = nullptr;
    certs_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(certs_, nullptr) << *cert_error_; }

  static const TestCerts& certs() { return *certs_; }

  static std::shared_ptr<TlsContext> ServerContext(const std::string& ca_file = "", bool require_peer_cert = true) {
    TlsOptions o;
    o.cert_file = certs().server_cert;
    o.key_file = certs().server_key;
    o.ca_file = ca_file;
    o.require_peer_cert = require_peer_cert;
    StatusOr<std::shared_ptr<TlsContext>> ctx = TlsContext::Server(o);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    return ctx.ok() ? *ctx : nullptr;
  }
  static std::shared_ptr<TlsContext> ClientContext(const std::string& ca_file, const std::string& cert_file = "",
                                                   const std::string& key_file = "") {
    TlsOptions o;
    o.ca_file = ca_file;
    o.cert_file = cert_file;
    o.key_file = key_file;
    StatusOr<std::shared_ptr<TlsContext>> ctx = TlsContext::Client(o);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    return ctx.ok() ? *ctx : nullptr;
  }

  // Listens on 127.0.0.1:0 through MakeTlsListener, dials through MakeTlsDialer (server name
  // `server_name`, "" = the dialed host 127.0.0.1), accepts. Each side's inner connection is observed.
  static std::optional<Pair> Connect(std::shared_ptr<TlsContext> server_ctx, std::shared_ptr<TlsContext> client_ctx,
                                     const std::string& server_name = "", size_t max_read = SIZE_MAX) {
    StatusOr<std::unique_ptr<TcpListener>> tcp = TcpListener::Listen("127.0.0.1", 0);
    EXPECT_TRUE(tcp.ok()) << tcp.status();
    if (!tcp.ok()) return std::nullopt;
    Pair p;
    p.port = (*tcp)->port();
    // The observed wrappers sit between TLS and TCP, so the TLS dialer/listener cannot be used for
    // them; ListenerAndDialer checks those separately.
    StatusOr<std::unique_ptr<Connection>> c = MakeTcpDialer("127.0.0.1", p.port)->Dial(kLong);
    EXPECT_TRUE(c.ok()) << c.status();
    StatusOr<std::unique_ptr<Connection>> s = (*tcp)->Accept(kLong);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!c.ok() || !s.ok()) return std::nullopt;
    auto ci = std::make_unique<ObservedConnection>(std::move(*c), max_read);
    auto si = std::make_unique<ObservedConnection>(std::move(*s), max_read);
    p.client_inner = ci.get();
    p.server_inner = si.get();
    p.client = WrapTlsClient(std::move(ci), std::move(client_ctx), server_name);
    p.server = WrapTlsServer(std::move(si), std::move(server_ctx));
    return p;
  }

  // Both sides Read at once (each drives its half of the handshake); returns their results.
  static std::pair<StatusOr<size_t>, StatusOr<size_t>> ReadBoth(Pair& p, milliseconds timeout = kLong) {
    char cbuf[64], sbuf[64];
    StatusOr<size_t> server_result = absl::UnknownError("not run");
    std::thread server([&] { server_result = p.server->Read(sbuf, sizeof sbuf, timeout); });
    StatusOr<size_t> client_result = p.client->Read(cbuf, sizeof cbuf, timeout);
    server.join();
    return {client_result, server_result};
  }

  // Sends "ping" client → server and "pong" back; the handshake runs inside.
  static void ExpectRoundTrip(Pair& p) {
    std::thread server([&] {
      StatusOr<std::string> got = ReadExactly(*p.server, 4);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, "ping");
      EXPECT_TRUE(p.server->Write("pong", kLong).ok());
    });
    Status st = p.client->Write("ping", kLong);
    EXPECT_TRUE(st.ok()) << st;
    StatusOr<std::string> got = ReadExactly(*p.client, 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "pong");
    server.join();
  }

  static std::string* dir_;
  static TestCerts* certs_;
  static std::string* cert_error_;
};

std::string* TlsTest::dir_ = nullptr;
TestCerts* TlsTest::certs_ = nullptr;
std::string* TlsTest::cert_error_ = nullptr;

// ---- Contexts ----------------------------------------------------------------------------------

TEST_F(TlsTest, ContextErrorsNameTheFileAndTheReason) {
  TlsOptions o;
  o.cert_file = *dir_ + "/missing.pem";
  o.key_file = certs().server_key;
  StatusOr<std::shared_ptr<TlsContext>> ctx = TlsContext::Server(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(ctx.status()), StrCat("tls cert_file ", o.cert_file, ": No such file or directory"));

  const std::string garbage = *dir_ + "/garbage.pem";
  std::ofstream(garbage) << "not a certificate\n";
  o.cert_file = garbage;
  ctx = TlsContext::Server(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ctx.status()), StartsWith(StrCat("tls cert_file ", garbage, ": ")));
  EXPECT_THAT(Msg(ctx.status()), HasSubstr("no start line"));  // OpenSSL's PEM reason

  o.cert_file = certs().server_cert;
  o.key_file = certs().client_key;  // another certificate's key
  ctx = TlsContext::Server(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ctx.status()), StartsWith(StrCat("tls key_file ", o.key_file, " does not match cert_file ",
                                                   o.cert_file, ": ")));
  EXPECT_THAT(Msg(ctx.status()), HasSubstr("key values mismatch"));

  o.key_file = garbage;
  ctx = TlsContext::Server(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_THAT(Msg(ctx.status()), StartsWith(StrCat("tls key_file ", garbage, ": ")));

  o.key_file = certs().server_key;
  o.ca_file = *dir_ + "/no_ca.pem";
  ctx = TlsContext::Server(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(Msg(ctx.status()), StrCat("tls ca_file ", o.ca_file, ": No such file or directory"));

  ctx = TlsContext::Server(TlsOptions{});
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(Msg(ctx.status()), "tls server: cert_file and key_file are required");
}

TEST_F(TlsTest, ClientContextRequiresACaAndBothHalvesOfAnIdentity) {
  TlsOptions o;
  StatusOr<std::shared_ptr<TlsContext>> ctx = TlsContext::Client(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ctx.status()), StartsWith("tls client: ca_file is required"));

  o.ca_file = certs().ca_cert;
  o.cert_file = certs().client_cert;
  ctx = TlsContext::Client(o);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(Msg(ctx.status()), "tls client: cert_file and key_file go together (mutual TLS)");

  o.key_file = certs().client_key;
  ctx = TlsContext::Client(o);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_FALSE((*ctx)->is_server());
}

TEST_F(TlsTest, AWrapperOfTheWrongRoleFailsEveryCall) {
  auto wrong = WrapTlsClient(std::make_unique<ObservedConnection>(nullptr), ServerContext());
  char buf[8];
  StatusOr<size_t> n = wrong->Read(buf, sizeof buf, kLong);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(n.status()), "tls: WrapTlsClient needs a TlsContext::Client");
  Status st = wrong->Write("x", kLong);
  EXPECT_EQ(Msg(st), "tls: WrapTlsClient needs a TlsContext::Client");
}

// ---- Round trips -------------------------------------------------------------------------------

TEST_F(TlsTest, ListenerAndDialerWrapTcp) {
  StatusOr<std::unique_ptr<TcpListener>> tcp = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  const uint16_t port = (*tcp)->port();
  const std::string address = (*tcp)->address();
  std::unique_ptr<Listener> listener = MakeTlsListener(std::move(*tcp), ServerContext());
  EXPECT_EQ(listener->kind(), "tcp");
  EXPECT_EQ(listener->port(), port);
  EXPECT_EQ(listener->address(), address);
  // No server name: the dialed host, 127.0.0.1, is checked against the certificate's IP SAN.
  std::unique_ptr<Dialer> dialer = MakeTlsDialer(MakeTcpDialer("127.0.0.1", port), ClientContext(certs().ca_cert));
  EXPECT_EQ(dialer->target(), StrCat("tls+tcp://127.0.0.1:", port));

  StatusOr<std::unique_ptr<Connection>> client = dialer->Dial(kLong);
  ASSERT_TRUE(client.ok()) << client.status();
  StatusOr<std::unique_ptr<Connection>> server = listener->Accept(kLong);  // returns before any handshake
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*client)->peer(), StrCat("127.0.0.1:", port));
  EXPECT_THAT((*server)->peer(), StartsWith("127.0.0.1:"));
  EXPECT_EQ((*client)->transports(), "");  // a plain socket underneath

  Pair p{std::move(*client), std::move(*server)};
  ExpectRoundTrip(p);
}

TEST_F(TlsTest, RoundTripWithTheDnsNameAndPassThroughAccessors) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert), "localhost");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->client->peer(), p->client_inner->peer());
  EXPECT_EQ(p->client->transports(), "observed");
  EXPECT_EQ(p->server->transports(), "observed");
  ExpectRoundTrip(*p);
  // Once established, more traffic in both directions.
  ASSERT_TRUE(p->server->Write("second", kLong).ok());
  StatusOr<std::string> got = ReadExactly(*p->client, 6);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "second");
}

TEST_F(TlsTest, RecordsArrivingAFewBytesPerInnerReadAreReassembled) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert), "", /*max_read=*/7);
  ASSERT_TRUE(p);
  ExpectRoundTrip(*p);
  const std::string big = Pattern(100000, 7);
  std::thread writer([&] { EXPECT_TRUE(p->client->Write(big, kLong).ok()); });
  StatusOr<std::string> got = ReadExactly(*p->server, big.size());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == big);
}

TEST_F(TlsTest, OneMebibyteWritesWhileTheOtherSideReads) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  const std::string up = Pattern(1 << 20, 1), down = Pattern(1 << 20, 2);
  // Client → server, with the server reading concurrently (the handshake runs inside these calls).
  std::thread writer([&] {
    Status st = p->client->Write(up, kLong);
    EXPECT_TRUE(st.ok()) << st;
  });
  StatusOr<std::string> got = ReadExactly(*p->server, up.size());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == up) << "client → server bytes differ";
  // Server → client.
  writer = std::thread([&] {
    Status st = p->server->Write(down, kLong);
    EXPECT_TRUE(st.ok()) << st;
  });
  got = ReadExactly(*p->client, down.size());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == down) << "server → client bytes differ";
}

// Four threads on a fresh connection: each end Reads on one thread and Writes on another, in pieces
// of random sizes, 2 MiB each way. Whichever thread gets there first drives the handshake; neither
// direction may wait for the other (both ends write more than the sockets buffer).
TEST_F(TlsTest, ConcurrentReadAndWriteOnBothEndsDoNotDeadlock) {
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(StrCat("round ", round));
    std::optional<Pair> p = Connect(ServerContext(certs().ca_cert),
                                    ClientContext(certs().ca_cert, certs().client_cert, certs().client_key));
    ASSERT_TRUE(p);
    const std::string up = Pattern(2 << 20, 10 + round), down = Pattern(2 << 20, 20 + round);
    auto write_all = [](Connection& c, const std::string& data, uint32_t seed) {
      std::mt19937 rng(seed);
      for (size_t at = 0; at < data.size();) {
        const size_t n = std::min<size_t>(data.size() - at, 1 + rng() % 100000);
        Status st = c.Write(std::string_view(data).substr(at, n), kLong);
        ASSERT_TRUE(st.ok()) << st;
        at += n;
      }
    };
    StatusOr<std::string> at_server = absl::UnknownError("not run"), at_client = absl::UnknownError("not run");
    std::thread t1([&] { write_all(*p->client, up, 1); });
    std::thread t2([&] { write_all(*p->server, down, 2); });
    std::thread t3([&] { at_server = ReadExactly(*p->server, up.size()); });
    std::thread t4([&] { at_client = ReadExactly(*p->client, down.size()); });
    for (std::thread* t : {&t1, &t2, &t3, &t4}) t->join();
    ASSERT_TRUE(at_server.ok()) << at_server.status();
    ASSERT_TRUE(at_client.ok()) << at_client.status();
    EXPECT_TRUE(*at_server == up);
    EXPECT_TRUE(*at_client == down);
  }
}

// The Read thread started the handshake and waits in the inner Read; a Write then needs the server's
// reply too. It must take it from the Read thread's input, not wait for that Read's 20 s timeout.
TEST_F(TlsTest, AWriteDuringTheHandshakeUsesTheReadThreadsInput) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  StatusOr<std::string> client_got = absl::UnknownError("not run");
  std::thread reader([&] { client_got = ReadExactly(*p->client, 4); });
  ASSERT_TRUE(p->client_inner->WaitReading());  // ClientHello sent; waiting for the server
  const auto start = Clock::now();
  Status written = absl::UnknownError("not run");
  std::thread writer([&] { written = p->client->Write("ping", kLong); });
  std::thread server([&] {
    StatusOr<std::string> got = ReadExactly(*p->server, 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "ping");
    EXPECT_TRUE(p->server->Write("pong", kLong).ok());
  });
  writer.join();
  EXPECT_TRUE(written.ok()) << written;
  EXPECT_LT(Clock::now() - start, kPrompt);
  server.join();
  reader.join();
  ASSERT_TRUE(client_got.ok()) << client_got.status();
  EXPECT_EQ(*client_got, "pong");
}

// The reverse: the Write thread started the handshake and waits in the inner Read; a Read arrives and
// waits for it, then reads the reply.
TEST_F(TlsTest, AReadDuringTheHandshakeWaitsForTheWriteThreadsInput) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  Status written = absl::UnknownError("not run");
  std::thread writer([&] { written = p->client->Write("ping", kLong); });
  ASSERT_TRUE(p->client_inner->WaitReading());  // the Write thread waits for the server's flight
  StatusOr<std::string> client_got = absl::UnknownError("not run");
  std::thread reader([&] { client_got = ReadExactly(*p->client, 4); });
  std::thread server([&] {
    StatusOr<std::string> got = ReadExactly(*p->server, 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "ping");
    EXPECT_TRUE(p->server->Write("pong", kLong).ok());
  });
  writer.join();
  EXPECT_TRUE(written.ok()) << written;
  server.join();
  reader.join();
  ASSERT_TRUE(client_got.ok()) << client_got.status();
  EXPECT_EQ(*client_got, "pong");
}

TEST_F(TlsTest, MutualTlsAccepted) {
  std::optional<Pair> p = Connect(ServerContext(certs().ca_cert),
                                  ClientContext(certs().ca_cert, certs().client_cert, certs().client_key));
  ASSERT_TRUE(p);
  ExpectRoundTrip(*p);
}

TEST_F(TlsTest, OptionalClientCertificate) {
  // require_peer_cert = false: a client without a certificate is admitted ...
  std::optional<Pair> p = Connect(ServerContext(certs().ca_cert, false), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  ExpectRoundTrip(*p);
  // ... and one that presents a certificate of another CA is still refused.
  p = Connect(ServerContext(certs().ca_cert, false),
              ClientContext(certs().ca_cert, certs().other_client_cert, certs().other_client_key));
  ASSERT_TRUE(p);
  auto [client, server] = ReadBoth(*p);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(server.status()), StrCat("tls handshake with ", p->server->peer(),
                                         " failed: certificate verify failed (unable to get local issuer certificate)"));
}

// ---- TLS 1.2 (the minimum): the flights run the other way round at the end of the handshake ----

// A client context limited to TLS 1.2 (a peer with an older OpenSSL).
std::shared_ptr<TlsContext> AtMostTls12(std::shared_ptr<TlsContext> ctx) {
  if (ctx) SSL_CTX_set_max_proto_version(ctx->native(), TLS1_2_VERSION);
  return ctx;
}

TEST_F(TlsTest, ContextsRequireTls12AndDisableCompressionAndRenegotiation) {
  for (const std::shared_ptr<TlsContext>& ctx : {ServerContext(), ClientContext(certs().ca_cert)}) {
    ASSERT_NE(ctx, nullptr);
    EXPECT_EQ(SSL_CTX_get_min_proto_version(ctx->native()), TLS1_2_VERSION);
    const uint64_t options = SSL_CTX_get_options(ctx->native());
    EXPECT_NE(options & SSL_OP_NO_COMPRESSION, 0u);
    EXPECT_NE(options & SSL_OP_NO_RENEGOTIATION, 0u);
  }
}

TEST_F(TlsTest, Tls12ConcurrentReadAndWriteAndMutualTls) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(StrCat("round ", round));
    std::optional<Pair> p =
        Connect(ServerContext(certs().ca_cert),
                AtMostTls12(ClientContext(certs().ca_cert, certs().client_cert, certs().client_key)));
    ASSERT_TRUE(p);
    const std::string up = Pattern(1 << 20, 30 + round), down = Pattern(1 << 20, 40 + round);
    StatusOr<std::string> at_server = absl::UnknownError("not run"), at_client = absl::UnknownError("not run");
    std::thread t1([&] { EXPECT_TRUE(p->client->Write(up, kLong).ok()); });
    std::thread t2([&] { EXPECT_TRUE(p->server->Write(down, kLong).ok()); });
    std::thread t3([&] { at_server = ReadExactly(*p->server, up.size()); });
    std::thread t4([&] { at_client = ReadExactly(*p->client, down.size()); });
    for (std::thread* t : {&t1, &t2, &t3, &t4}) t->join();
    ASSERT_TRUE(at_server.ok()) << at_server.status();
    ASSERT_TRUE(at_client.ok()) << at_client.status();
    EXPECT_TRUE(*at_server == up);
    EXPECT_TRUE(*at_client == down);
  }
}

TEST_F(TlsTest, Tls12ClientWithoutTheRequiredCertificateIsRefusedDuringTheHandshake) {
  std::optional<Pair> p = Connect(ServerContext(certs().ca_cert), AtMostTls12(ClientContext(certs().ca_cert)));
  ASSERT_TRUE(p);
  auto [client, server] = ReadBoth(*p);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(Msg(server.status()),
            StrCat("tls handshake with ", p->server->peer(), " failed: peer did not return a certificate"));
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(client.status()), StrCat("tls handshake with ", p->client->peer(), " failed: sslv3 alert handshake failure"));
}

// ---- Refused handshakes ------------------------------------------------------------------------

TEST_F(TlsTest, ClientWithoutTheRequiredCertificateIsRefused) {
  std::optional<Pair> p = Connect(ServerContext(certs().ca_cert), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  auto [client, server] = ReadBoth(*p);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(server.status()),
            StrCat("tls handshake with ", p->server->peer(), " failed: peer did not return a certificate"));
  // TLS 1.3: the client's side of the handshake had finished; the server's alert fails its Read.
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(client.status()),
            StrCat("tls handshake with ", p->client->peer(), " failed: tlsv13 alert certificate required"));
  // Sticky: later calls return the same error.
  EXPECT_EQ(Msg(p->server->Write("x", kLong)), Msg(server.status()));
}

TEST_F(TlsTest, ClientCertificateOfAnotherCaIsRefused) {
  std::optional<Pair> p = Connect(ServerContext(certs().ca_cert),
                                  ClientContext(certs().ca_cert, certs().other_client_cert, certs().other_client_key));
  ASSERT_TRUE(p);
  auto [client, server] = ReadBoth(*p);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(server.status()), StrCat("tls handshake with ", p->server->peer(),
                                         " failed: certificate verify failed (unable to get local issuer certificate)"));
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(client.status()), StrCat("tls handshake with ", p->client->peer(), " failed: tlsv1 alert unknown ca"));
}

TEST_F(TlsTest, ServerCertificateNotTrustedByTheClient) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().other_ca_cert));
  ASSERT_TRUE(p);
  auto [client, server] = ReadBoth(*p);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(client.status()), StrCat("tls handshake with ", p->client->peer(),
                                         " failed: certificate verify failed (unable to get local issuer certificate)"));
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(server.status()),
            StrCat("tls handshake with ", p->server->peer(), " failed: tlsv1 alert unknown ca"));
}

TEST_F(TlsTest, HostnameMismatchIsRefused) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert), "aggregator.example");
  ASSERT_TRUE(p);
  auto [client, server] = ReadBoth(*p);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(client.status()),
            StrCat("tls handshake with ", p->client->peer(), " failed: certificate verify failed (hostname mismatch)"));
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(Msg(server.status()), StrCat("tls handshake with ", p->server->peer(), " failed: sslv3 alert bad certificate"));
  // An IP address that is not in the certificate's IP SANs.
  p = Connect(ServerContext(), ClientContext(certs().ca_cert), "127.0.0.2");
  ASSERT_TRUE(p);
  std::tie(client, server) = ReadBoth(*p);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(Msg(client.status()), StrCat("tls handshake with ", p->client->peer(),
                                         " failed: certificate verify failed (IP address mismatch)"));
}

TEST_F(TlsTest, PlainTcpClientAgainstATlsServer) {
  StatusOr<std::unique_ptr<TcpListener>> tcp = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  std::unique_ptr<Listener> listener = MakeTlsListener(std::move(*tcp), ServerContext());
  StatusOr<std::unique_ptr<Connection>> plain = MakeTcpDialer("127.0.0.1", listener->port())->Dial(kLong);
  ASSERT_TRUE(plain.ok()) << plain.status();
  StatusOr<std::unique_ptr<Connection>> server = listener->Accept(kLong);
  ASSERT_TRUE(server.ok()) << server.status();
  // What a plain edge sends first: a protocol frame.
  ASSERT_TRUE((*plain)->Write(EncodeFrame(Heartbeat{42}), kLong).ok());
  const auto start = Clock::now();
  char buf[64];
  StatusOr<size_t> n = (*server)->Read(buf, sizeof buf, kLong);
  EXPECT_LT(Clock::now() - start, kPrompt);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(n.status()), StartsWith(StrCat("tls handshake with ", (*server)->peer(), " failed: ")));
  EXPECT_THAT(Msg(n.status()), HasSubstr("wrong version number"));
}

TEST_F(TlsTest, TlsClientAgainstAPlainServer) {
  StatusOr<std::unique_ptr<TcpListener>> tcp = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  std::unique_ptr<Dialer> dialer = MakeTlsDialer(MakeTcpDialer("127.0.0.1", (*tcp)->port()), ClientContext(certs().ca_cert));
  StatusOr<std::unique_ptr<Connection>> client = dialer->Dial(kLong);
  ASSERT_TRUE(client.ok()) << client.status();
  StatusOr<std::unique_ptr<Connection>> plain = (*tcp)->Accept(kLong);
  ASSERT_TRUE(plain.ok()) << plain.status();
  // The plain server reads the ClientHello and answers as an aggregator answers garbage: a Reject frame.
  std::thread server([&] {
    char buf[4096];
    ASSERT_TRUE((*plain)->Read(buf, sizeof buf, kLong).ok());
    (void)(*plain)->Write(EncodeFrame(Reject{RejectReason::kProtocolError, "", 0, 0, 0, 0, "bad magic"}), kLong);
  });
  const auto start = Clock::now();
  Status st = (*client)->Write("hello", kLong);
  server.join();
  EXPECT_LT(Clock::now() - start, kPrompt);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(st), StartsWith(StrCat("tls handshake with ", (*client)->peer(), " failed: ")));
  EXPECT_THAT(Msg(st), HasSubstr("wrong version number"));
}

TEST_F(TlsTest, PeerClosingDuringTheHandshake) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  const std::string peer = p->client->peer();
  p->server.reset();  // closes the socket before any handshake
  Status st = p->client->Write("hello", kLong);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  // Depending on timing the ClientHello meets the closed socket (reset) or is sent and the reply is EOF.
  EXPECT_THAT(Msg(st), StartsWith(StrCat("tls handshake with ", peer, " failed: ")));
}

TEST_F(TlsTest, ClosingAnEstablishedConnectionIsSeenAsPeerClosed) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  ExpectRoundTrip(*p);
  const std::string client_peer = p->server->peer();
  p->client.reset();  // sends close_notify
  char buf[8];
  StatusOr<size_t> n = p->server->Read(buf, sizeof buf, kLong);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(n.status()), StrCat(client_peer, ": peer closed the connection"));
}

// ---- Timeouts and Shutdown ---------------------------------------------------------------------

TEST_F(TlsTest, AHandshakeThatNeverCompletesTimesOutAndContinuesLater) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  // The client has not started (its handshake waits for its first call): no ClientHello arrives.
  char buf[8];
  const auto start = Clock::now();
  StatusOr<size_t> n = p->server->Read(buf, sizeof buf, milliseconds(200));
  const auto took = Clock::now() - start;
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Msg(n.status()), StrCat("tls handshake with ", p->server->peer(), " did not complete within 200 ms"));
  EXPECT_GE(took, milliseconds(190));  // the TCP layer rounds its poll timeouts down to whole ms
  EXPECT_LT(took, kPrompt);
  // Not fatal: the next calls finish the handshake.
  ExpectRoundTrip(*p);
}

TEST_F(TlsTest, ASilentPlainClientHitsTheTimeout) {
  StatusOr<std::unique_ptr<TcpListener>> tcp = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  std::unique_ptr<Listener> listener = MakeTlsListener(std::move(*tcp), ServerContext());
  StatusOr<std::unique_ptr<Connection>> plain = MakeTcpDialer("127.0.0.1", listener->port())->Dial(kLong);
  ASSERT_TRUE(plain.ok()) << plain.status();
  StatusOr<std::unique_ptr<Connection>> server = listener->Accept(kLong);
  ASSERT_TRUE(server.ok()) << server.status();
  Status st = (*server)->Write("welcome", milliseconds(150));  // a Write drives the handshake too
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Msg(st), StrCat("tls handshake with ", (*server)->peer(), " did not complete within 150 ms"));
}

TEST_F(TlsTest, ShutdownUnblocksAReadPromptly) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);
  ExpectRoundTrip(*p);
  StatusOr<size_t> n = absl::UnknownError("not run");
  Clock::time_point returned;
  std::thread reader([&] {
    char buf[8];
    n = p->client->Read(buf, sizeof buf, kLong);
    returned = Clock::now();
  });
  ASSERT_TRUE(p->client_inner->WaitReading());
  const auto start = Clock::now();
  p->client->Shutdown();
  reader.join();
  EXPECT_LT(returned - start, kPrompt);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(n.status()), StrCat(p->client->peer(), ": connection shut down"));
  // Later calls fail at once; Shutdown is idempotent.
  p->client->Shutdown();
  EXPECT_EQ(Msg(p->client->Write("x", kLong)), StrCat(p->client->peer(), ": connection shut down"));
}

// During the handshake one thread waits in the inner Read and the other waits for it: Shutdown
// releases both.
TEST_F(TlsTest, ShutdownDuringTheHandshakeReleasesBothThreads) {
  std::optional<Pair> p = Connect(ServerContext(), ClientContext(certs().ca_cert));
  ASSERT_TRUE(p);  // the server never answers
  StatusOr<size_t> n = absl::UnknownError("not run");
  Status written = absl::UnknownError("not run");
  std::thread reader([&] {
    char buf[8];
    n = p->client->Read(buf, sizeof buf, kLong);
  });
  ASSERT_TRUE(p->client_inner->WaitReading());
  std::thread writer([&] { written = p->client->Write("ping", kLong); });
  const auto start = Clock::now();
  p->client->Shutdown();
  reader.join();
  writer.join();
  EXPECT_LT(Clock::now() - start, kPrompt);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(n.status()), StrCat(p->client->peer(), ": connection shut down"));
  EXPECT_EQ(written.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Msg(written), StrCat(p->client->peer(), ": connection shut down"));
}

}  // namespace
}  // namespace vigil::transport
