// The replication channel over gRPC (replication/channel.h): the primary's server and the standby's client.
#include "vigil/common/deadline.h"
#include "vigil/replication/channel.h"

#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "replication.grpc.pb.h"
#include "vigil/common/mutex.h"

namespace vigil::replication {
namespace {

namespace v1 = ::vigil::replication::v1;
// A Deadline as gRPC's own monotonic deadline (gRPC reads its clock; an absolute point, so that a call that waits
// in several steps, like WaitForConnected, does not restart the span at each).
gpr_timespec GrpcDeadline(Deadline d) {
  if (d.never()) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(d.left().count(), GPR_TIMESPAN));
}
constexpr uint32_t kChannelVersion = 1;
constexpr size_t kHeartbeatTokenBytes = 32;

StatusOr<std::string> ReadPem(const std::string& what, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(StrCat("replication tls: ", what, " is required (mutual TLS)"));
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("replication tls: ", what, " ", path, ": cannot read the file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Pems {
  std::string cert, key, ca;
};
StatusOr<Pems> LoadTls(const ChannelTls& t) {
  Pems p;
  VIGIL_ASSIGN_OR_RETURN(p.cert, ReadPem("cert_file", t.cert_file));
  VIGIL_ASSIGN_OR_RETURN(p.key, ReadPem("key_file", t.key_file));
  VIGIL_ASSIGN_OR_RETURN(p.ca, ReadPem("ca_file", t.ca_file));
  return p;
}

void ToProto(const PairDigest& d, v1::PairDigest* p) {
  p->set_model(d.model);
  p->set_settings(d.settings);
  p->set_streams(d.streams);
  p->set_rules(d.rules);
  p->set_pair(d.pair);
  for (const StreamDigest& s : d.per_stream) {
    v1::StreamDigest* x = p->add_per_stream();
    x->set_id(s.id);
    x->set_stream(s.stream);
    x->set_rules(s.rules);
  }
}
PairDigest FromProto(const v1::PairDigest& p) {
  PairDigest d{p.model(), p.settings(), p.streams(), p.rules(), p.pair(), {}};
  for (int i = 0; i < p.per_stream_size() && i < 100000; ++i) {  // bounded: names in a refusal, nothing more
    const v1::StreamDigest& s = p.per_stream(i);
    d.per_stream.push_back({s.id().substr(0, 256), s.stream(), s.rules()});
  }
  return d;
}

void ToProto(uint64_t version, const std::vector<MirroredStream>& streams, v1::LedgerState* p) {
  p->set_version(version);
  for (const MirroredStream& s : streams) {
    v1::StreamRecord* r = p->add_streams();
    r->set_stream(s.stream);
    r->set_source(s.source);
    r->set_run(s.run);
    r->set_has_acked_through(s.acked_through.has_value());
    r->set_acked_through(s.acked_through.value_or(0));
    r->set_next_seq(s.next_seq);
  }
}
std::vector<MirroredStream> FromProto(const v1::LedgerState& p) {
  std::vector<MirroredStream> out;
  for (const v1::StreamRecord& r : p.streams()) {
    MirroredStream s{r.stream(), r.source(), r.run(), std::nullopt, r.next_seq()};
    if (r.has_acked_through()) s.acked_through = r.acked_through();
    out.push_back(std::move(s));
  }
  return out;
}

void ToProto(const MirroredFrame& f, v1::MirroredFrame* p) {
  p->set_stream(f.stream);
  p->set_run(f.run);
  p->set_seq(f.seq);
  p->set_capture_ns(f.capture_ns);
  p->set_pts_ns(f.pts_ns);
  p->set_width(f.width);
  p->set_height(f.height);
  p->set_jpeg(f.jpeg);
}

void ToProto(const MirroredResult& r, v1::MirroredResult* p) {
  p->set_stream(r.stream);
  p->set_run(r.run);
  p->set_seq(r.seq);
  p->set_capture_ns(r.capture_ns);
  p->set_pts_ns(r.pts_ns);
  p->set_width(r.width);
  p->set_height(r.height);
  p->mutable_boxes()->Reserve(static_cast<int>(5 * r.detections.size()));
  p->mutable_classes()->Reserve(static_cast<int>(r.detections.size()));
  for (const MirroredDetection& d : r.detections) {
    for (float v : {d.x1, d.y1, d.x2, d.y2, d.score}) p->add_boxes(v);
    p->add_classes(d.class_id);
  }
}

// Null when the message does not hold together (boxes not 5 per class id, too many detections).
std::optional<MirroredResult> FromProto(const v1::MirroredResult& p) {
  if (p.boxes_size() != 5 * p.classes_size() || static_cast<size_t>(p.classes_size()) > kMaxMirroredDetections) {
    return std::nullopt;
  }
  MirroredResult r;
  r.stream = p.stream().substr(0, 256);
  r.run = p.run();
  r.seq = p.seq();
  r.capture_ns = p.capture_ns();
  r.pts_ns = p.pts_ns();
  r.width = p.width();
  r.height = p.height();
  r.detections.resize(static_cast<size_t>(p.classes_size()));
  for (int i = 0; i < p.classes_size(); ++i) {
    const float* b = p.boxes().data() + 5 * i;
    r.detections[static_cast<size_t>(i)] = {b[0], b[1], b[2], b[3], b[4], p.classes(i)};
  }
  return r;
}

MirroredFrame FromProto(v1::MirroredFrame* p) {
  MirroredFrame f;
  f.stream = p->stream().substr(0, 256);
  f.run = p->run();
  f.seq = p->seq();
  f.capture_ns = p->capture_ns();
  f.pts_ns = p->pts_ns();
  f.width = p->width();
  f.height = p->height();
  f.jpeg = std::move(*p->mutable_jpeg());
  return f;
}

Status FromGrpc(const grpc::Status& s, const std::string& where) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = StrCat(where, ": ", s.error_message());
  switch (s.error_code()) {
    case grpc::StatusCode::FAILED_PRECONDITION: return absl::FailedPreconditionError(msg);
    case grpc::StatusCode::INVALID_ARGUMENT: return absl::InvalidArgumentError(msg);
    case grpc::StatusCode::CANCELLED: return absl::CancelledError(msg);
    case grpc::StatusCode::DEADLINE_EXCEEDED: return absl::DeadlineExceededError(msg);
    default: return absl::UnavailableError(msg);
  }
}

// Why a TLS connection to `target` (host:port, [v6]:port) with this side's files fails, in words, for the
// message of a standby that could not pair: nobody listening; the primary's certificate not trusted or not
// naming the host dialled (OpenSSL's verification result); this standby's certificate refused by the primary
// (its alert); or a handshake that succeeds (then not the TLS). A handshake of its own, bounded to ~2 s.
std::string DiagnoseTls(const std::string& target, const Pems& pems) {
  std::string host = target, port;
  if (size_t colon = target.rfind(':'); colon != std::string::npos) {
    host = target.substr(0, colon);
    port = target.substr(colon + 1);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return StrCat("cannot resolve '", host, "'");
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return StrCat("nobody is listening at ", target, " (", std::strerror(errno), ")");
  std::string why;
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = nullptr;
  auto pem_cert = [](const std::string& pem) {
    BIO* b = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
    X509* x = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
    BIO_free(b);
    return x;
  };
  X509* ca = pem_cert(pems.ca);
  X509* cert = pem_cert(pems.cert);
  BIO* kb = BIO_new_mem_buf(pems.key.data(), static_cast<int>(pems.key.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(kb);
  if (ctx == nullptr || ca == nullptr || cert == nullptr || key == nullptr) {
    why = "the TLS handshake failed (and this side's cert_file, key_file or ca_file does not hold a PEM certificate "
          "or key)";
  } else {
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca);
    SSL_CTX_use_certificate(ctx, cert);
    SSL_CTX_use_PrivateKey(ctx, key);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    // The name gRPC checks: the host dialled, as an IP subjectAltName for an address, else a DNS one.
    if (X509_VERIFY_PARAM* vp = SSL_get0_param(ssl); X509_VERIFY_PARAM_set1_ip_asc(vp, host.c_str()) != 1) {
      X509_VERIFY_PARAM_set1_host(vp, host.c_str(), 0);
      SSL_set_tlsext_host_name(ssl, host.c_str());
    }
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    const long verify = SSL_get_verify_result(ssl);
    char err[256] = {};
    ERR_error_string_n(ERR_peek_last_error(), err, sizeof err);
    if (verify != X509_V_OK) {
      why = StrCat("the primary's certificate is not accepted here: ", X509_verify_cert_error_string(verify),
                   verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH
                       ? StrCat(" (it must name '", host, "', the host this standby dials, as a subjectAltName: IP for "
                                "an address, DNS for a name)")
                       : std::string(" (is it signed by this standby's ca_file?)"));
    } else if (r != 1) {
      why = StrCat("the primary refused this standby's certificate (", err[0] != '\0' ? err : "handshake failed",
                   "): is it signed by the primary's ca_file, with extendedKeyUsage clientAuth?");
    } else {
      // TLS 1.3: the server's verdict on our certificate arrives after the handshake; read once to see it.
      char byte = 0;
      const int n = SSL_read(ssl, &byte, 1);
      const int e = SSL_get_error(ssl, n);
      ERR_error_string_n(ERR_peek_last_error(), err, sizeof err);
      if (n <= 0 && e == SSL_ERROR_SSL) {
        why = StrCat("the primary refused this standby's certificate (", err,
                     "): is it signed by the primary's ca_file, with extendedKeyUsage clientAuth?");
      } else {
        why = StrCat("the TLS handshake with ", target, " succeeds, but it does not answer as a vigil primary");
      }
    }
  }
  if (ssl != nullptr) SSL_free(ssl);
  if (ctx != nullptr) SSL_CTX_free(ctx);
  X509_free(ca);
  X509_free(cert);
  EVP_PKEY_free(key);
  ::close(fd);
  return why;
}

// Mirrored results sent in one message at most, and their detections (≈ 26 bytes each on the wire: a message
// stays under the standby's receive limit, kMaxMirroredJpegBytes + 1 MiB, whatever max_det is).
constexpr uint64_t kResultsPerMessage = 256;
constexpr size_t kRowsPerMessage = size_t{1} << 20;

// ---- the primary -----------------------------------------------------------------------------------

class PrimaryService final : public v1::Replication::Service {
 public:
  explicit PrimaryService(PrimaryChannelOptions o) : opt_(std::move(o)) {}

  grpc::Status Mirror(grpc::ServerContext* ctx,
                      grpc::ServerReaderWriter<v1::PrimaryMessage, v1::StandbyMessage>* stream) override {
    v1::StandbyMessage first;
    if (!stream->Read(&first)) return grpc::Status(grpc::StatusCode::CANCELLED, "the stream ended before Pair");
    const std::string peer = ctx->peer();
    if (!first.has_pair()) return Refuse(stream, peer, "the first message must be Pair");
    const v1::Pair& p = first.pair();
    if (p.version() != kChannelVersion) {
      return Refuse(stream, peer, StrCat("channel version ", p.version(), ", this primary speaks ", kChannelVersion));
    }
    if (p.edge() != opt_.edge) {
      return Refuse(stream, peer, StrCat("the edge ids differ (primary '", opt_.edge, "', standby '", p.edge().substr(0, 200), "')"));
    }
    const std::string mismatch = DescribeMismatch(opt_.digest, FromProto(p.digest()), "primary", "standby");
    if (!mismatch.empty()) return Refuse(stream, peer, mismatch);
    const std::string node = p.node().substr(0, 200);
    v1::PrimaryMessage paired;
    {
      MutexLock lock(mu_);
      if (stats_.standby_connected) {
        const std::string other = stats_.standby;
        lock.Unlock();
        return Refuse(stream, peer, StrCat("another standby ('", other, "') is paired with this primary"));
      }
      stats_.standby_connected = true;
      stats_.standby = node;
      ++stats_.paired;
      hb_token_.assign(kHeartbeatTokenBytes, '\0');
      if (RAND_bytes(reinterpret_cast<unsigned char*>(hb_token_.data()), static_cast<int>(hb_token_.size())) != 1) {
        hb_token_.clear();  // no token: this pairing's heartbeats stay on Mirror
      }
      paired.mutable_paired()->set_heartbeat_token(hb_token_);
    }
    spdlog::info("replication: standby '{}' ({}) paired with primary '{}' of edge '{}'", node, peer, opt_.node, opt_.edge);
    paired.mutable_paired()->set_node(opt_.node);
    if (opt_.frames_offer) {
      const FramesOffer offer = opt_.frames_offer();
      paired.mutable_paired()->set_frames_socket(offer.socket);
      paired.mutable_paired()->set_frames_token(offer.token);
    }
    grpc::Status end = grpc::Status::OK;
    Mutex write_mu;    // one Write at a time: heartbeat answers (this thread) and ledger states (sender)
    bool over = false;  // the stream is ending: the sender stops. Read and written under mu_ (a local variable,
                        // which the analysis cannot annotate)
    std::thread sender;
    if (stream->Write(paired)) {
      sender = std::thread([&] {
        uint64_t sent = 0;           // the ledger version this standby has
        uint64_t next_frame = 0;     // the first ordinal this standby has not been sent
        uint64_t next_result = 0;    // the same for results
        MutexLock lock(mu_);
        for (;;) {
          while (!over && ledger_version_ <= sent && frames_.lower_bound(next_frame) == frames_.end() &&
                 results_.lower_bound(next_result) == results_.end() && !(finish_ && !finish_sent_)) {
            ledger_cv_.Wait(lock);
          }
          if (over) return;
          v1::PrimaryMessage m;
          // Retained frames queued before the latest ledger state go first (a standby that pairs gets the
          // unacknowledged ones from before it paired too); then the state; then later frames. A result goes
          // after the frames queued before it. Finished goes last, after the last state and every retained frame
          // and result (a standby taking over can use them).
          const auto next = frames_.lower_bound(next_frame);
          const auto next_r = results_.lower_bound(next_result);
          const bool ledger_due = ledger_version_ > sent && (next == frames_.end() || next->first >= ledger_barrier_);
          const bool frame_due = !ledger_due && next != frames_.end() &&
                                 (next_r == results_.end() || next->first < next_r->second.after_frames);
          const bool result_due = !ledger_due && !frame_due && next_r != results_.end();
          const bool finishing = !ledger_due && !frame_due && !result_due;
          size_t frame_bytes = 0;
          uint64_t results_sent = 0;
          if (ledger_due) {
            ToProto(ledger_version_, ledger_, m.mutable_ledger());
            sent = ledger_version_;
          } else if (frame_due) {
            frame_bytes = next->second.jpeg.size();
            ToProto(next->second, m.mutable_frame());  // a copy: kept until acknowledged
            next_frame = next->first + 1;
          } else if (result_due) {
            // Every result due now in one message (up to kResultsPerMessage, none overtaking a frame): at 128
            // cameras one message per batch of results instead of 3,840 a second.
            v1::MirroredResults* batch = m.mutable_results();
            size_t rows = 0;
            for (auto it = next_r; it != results_.end() && results_sent < kResultsPerMessage &&
                                   (next == frames_.end() || next->first >= it->second.after_frames) &&
                                   (results_sent == 0 || rows + it->second.result.detections.size() <= kRowsPerMessage);
                 ++it, ++results_sent) {
              rows += it->second.result.detections.size();
              ToProto(it->second.result, batch->add_results());
              next_result = it->first + 1;
            }
          } else {
            m.mutable_finished()->set_streams_done(*finish_);
            m.mutable_finished()->set_reason(finish_reason_);
            finish_sent_ = true;
          }
          lock.Unlock();
          bool ok;
          {
            MutexLock w(write_mu);
            ok = stream->Write(m);
          }
          lock.Lock();
          if (!ok) return;
          if (finishing) {
            ledger_cv_.NotifyAll();  // Finish waits for it
          } else if (frame_due) {
            ++stats_.frames_sent;
            stats_.frame_bytes_sent += frame_bytes;
          } else if (result_due) {
            stats_.results_sent += results_sent;
          } else {
            ++stats_.ledger_states_sent;
          }
        }
      });
      v1::StandbyMessage m;
      while (stream->Read(&m)) {
        if (!m.has_heartbeat()) {
          end = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a message of a kind this primary does not know");
          break;
        }
        const int64_t now = SteadyNs();
        if (opt_.on_heartbeat) opt_.on_heartbeat(now);
        {
          MutexLock lock(mu_);
          ++stats_.heartbeats;
        }
        v1::PrimaryMessage answer;
        answer.mutable_heartbeat()->set_sent_ns(now);
        answer.mutable_heartbeat()->set_echo_ns(m.heartbeat().sent_ns());
        MutexLock w(write_mu);
        if (!stream->Write(answer)) break;
      }
    }
    {
      MutexLock lock(mu_);
      over = true;
      stats_.standby_connected = false;
      stats_.standby.clear();
      hb_token_.clear();                        // the pairing's heartbeat stream ends with it
      if (hb_ctx_ != nullptr) hb_ctx_->TryCancel();
    }
    ledger_cv_.NotifyAll();
    if (sender.joinable()) sender.join();
    const Status why = ctx->IsCancelled() ? absl::UnavailableError(StrCat("standby '", node, "': the stream was cancelled"))
                       : end.ok()         ? absl::UnavailableError(StrCat("standby '", node, "' ended the stream"))
                                          : absl::InvalidArgumentError(StrCat("standby '", node, "': ", end.error_message()));
    // A standby that leaves (it took over, was stopped, probed and hung up, or died) is news, not a fault here.
    spdlog::info("replication: {}; this primary goes on without a standby", std::string(why.message()));
    if (opt_.on_end) opt_.on_end(why);
    return end;
  }

  // The paired standby's heartbeats on a connection of their own (replication.proto Heartbeats): answered on
  // this stream's own thread, so nothing the sender writes on Mirror holds an answer back.
  grpc::Status Heartbeats(grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::Heartbeat, v1::Heartbeat>* stream) override {
    v1::Heartbeat m;
    if (!stream->Read(&m)) return grpc::Status(grpc::StatusCode::CANCELLED, "the stream ended before its first heartbeat");
    std::string token;
    {
      MutexLock lock(mu_);
      if (hb_token_.empty() || m.token().size() != hb_token_.size() ||
          CRYPTO_memcmp(m.token().data(), hb_token_.data(), hb_token_.size()) != 0) {
        ++stats_.heartbeat_streams_refused;
        spdlog::warn("replication: a heartbeat stream from {} names no current pairing: refused", ctx->peer());
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "the heartbeat token names no current pairing");
      }
      if (hb_ctx_ != nullptr) hb_ctx_->TryCancel();  // a second stream for this pairing replaces the first
      hb_ctx_ = ctx;
      token = hb_token_;
      ++stats_.heartbeat_streams;
    }
    do {
      const int64_t now = SteadyNs();
      {
        MutexLock lock(mu_);
        if (hb_ctx_ != ctx || hb_token_ != token) break;  // replaced, or the pairing ended
        ++stats_.heartbeats;
      }
      if (opt_.on_heartbeat) opt_.on_heartbeat(now);
      v1::Heartbeat answer;
      answer.set_sent_ns(now);
      answer.set_echo_ns(m.sent_ns());
      if (!stream->Write(answer)) break;
    } while (stream->Read(&m));
    MutexLock lock(mu_);
    if (hb_ctx_ == ctx) hb_ctx_ = nullptr;  // cancelled only while registered: never after this returns
    return grpc::Status::OK;
  }

  PrimaryChannelStats stats() const {
    MutexLock lock(mu_);
    return stats_;
  }

  void Finish(bool streams_done, std::string reason) {
    MutexLock lock(mu_);
    if (finish_) return;  // said already (a step-down, then the run's end)
    finish_ = streams_done;
    finish_reason_ = std::move(reason);
    finish_sent_ = false;
    ledger_cv_.NotifyAll();
    if (stats_.standby_connected) {
      const auto deadline = Deadline::After(std::chrono::seconds(1));  // a CondVar deadline
      while (!finish_sent_ && stats_.standby_connected && ledger_cv_.WaitUntil(lock, deadline)) {
      }
    }
  }

  void PublishLedger(std::vector<MirroredStream> streams) {
    {
      MutexLock lock(mu_);
      if (streams == ledger_) return;  // unchanged: nothing to send
      ledger_ = std::move(streams);
      ++ledger_version_;
      ledger_barrier_ = frames_queued_;  // the frames queued so far go out before this state
    }
    ledger_cv_.NotifyAll();
  }
  bool MirrorFrame(MirroredFrame frame) {
    {
      MutexLock lock(mu_);
      if (frame.jpeg.empty() || frame.jpeg.size() > kMaxMirroredJpegBytes) {  // the channel carries JPEGs only
        ++stats_.frames_refused;
        return false;
      }
      std::deque<uint64_t>& of_stream = by_stream_[frame.stream];
      of_stream.push_back(frames_queued_);
      retained_bytes_ += frame.jpeg.size();
      frames_.emplace(frames_queued_++, std::move(frame));
      while (frames_.size() > opt_.max_retained_frames) {  // the oldest goes: it is the front of its stream's
        auto oldest = frames_.begin();
        by_stream_[oldest->second.stream].pop_front();
        retained_bytes_ -= oldest->second.jpeg.size();
        frames_.erase(oldest);
        ++stats_.frames_evicted;
      }
      stats_.frames_retained = frames_.size();
      stats_.retained_bytes = retained_bytes_;
    }
    ledger_cv_.NotifyAll();
    return true;
  }
  bool MirrorResult(MirroredResult result) {
    {
      MutexLock lock(mu_);
      if (result.detections.size() > kMaxMirroredDetections) {
        ++stats_.results_refused;
        return false;
      }
      results_by_stream_[result.stream].push_back(results_queued_);
      results_.emplace(results_queued_++, Retained{std::move(result), frames_queued_});
      while (results_.size() > opt_.max_retained_results) {  // the oldest goes: the front of its stream's
        auto oldest = results_.begin();
        results_by_stream_[oldest->second.result.stream].pop_front();
        results_.erase(oldest);
        ++stats_.results_evicted;
      }
      stats_.results_retained = results_.size();
    }
    ledger_cv_.NotifyAll();
    return true;
  }
  void Acknowledge(const std::string& stream, uint64_t run, uint64_t through) {
    MutexLock lock(mu_);
    auto stored = [&](uint64_t r, uint64_t seq) { return r < run || (r == run && seq <= through); };
    if (auto it = by_stream_.find(stream); it != by_stream_.end()) {
      std::deque<uint64_t>& of_stream = it->second;
      while (!of_stream.empty()) {
        auto f = frames_.find(of_stream.front());
        if (!stored(f->second.run, f->second.seq)) break;
        retained_bytes_ -= f->second.jpeg.size();
        frames_.erase(f);
        of_stream.pop_front();
      }
    }
    if (auto it = results_by_stream_.find(stream); it != results_by_stream_.end()) {
      std::deque<uint64_t>& of_stream = it->second;
      while (!of_stream.empty()) {
        auto r = results_.find(of_stream.front());
        if (!stored(r->second.result.run, r->second.result.seq)) break;
        results_.erase(r);
        of_stream.pop_front();
      }
    }
    stats_.frames_retained = frames_.size();
    stats_.retained_bytes = retained_bytes_;
    stats_.results_retained = results_.size();
  }

 private:
  grpc::Status Refuse(grpc::ServerReaderWriter<v1::PrimaryMessage, v1::StandbyMessage>* stream, const std::string& peer,
                      const std::string& reason) {
    spdlog::warn("replication: refused to pair with {}: {}", peer, reason);
    {
      MutexLock lock(mu_);
      ++stats_.refused;
      stats_.last_refusal = reason;
    }
    v1::PrimaryMessage m;
    m.mutable_refused()->set_reason(reason);
    stream->Write(m);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, reason);
  }

  int64_t SteadyNs() const { return clock_->SteadyNs(); }

  const PrimaryChannelOptions opt_;
  vigil::Clock* const clock_ = opt_.clock != nullptr ? opt_.clock : SystemClock();
  mutable Mutex mu_;
  CondVar ledger_cv_;
  PrimaryChannelStats stats_ VIGIL_GUARDED_BY(mu_);
  std::vector<MirroredStream> ledger_ VIGIL_GUARDED_BY(mu_);  // the latest published records
  uint64_t ledger_version_ VIGIL_GUARDED_BY(mu_) = 0;         // 0: none published yet
  // Mirrored frames kept until acknowledged, by ordinal (the order given); per stream, its ordinals in order.
  std::map<uint64_t, MirroredFrame> frames_ VIGIL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<uint64_t>, std::less<>> by_stream_ VIGIL_GUARDED_BY(mu_);
  size_t retained_bytes_ VIGIL_GUARDED_BY(mu_) = 0;
  uint64_t frames_queued_ VIGIL_GUARDED_BY(mu_) = 0;  // ordinals handed out
  // Mirrored results kept until acknowledged, by their own ordinal; each goes out after the frames whose
  // ordinal is below its after_frames (those queued before it).
  struct Retained {
    MirroredResult result;
    uint64_t after_frames = 0;
  };
  std::map<uint64_t, Retained> results_ VIGIL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<uint64_t>, std::less<>> results_by_stream_ VIGIL_GUARDED_BY(mu_);
  uint64_t results_queued_ VIGIL_GUARDED_BY(mu_) = 0;
  uint64_t ledger_barrier_ VIGIL_GUARDED_BY(mu_) = 0;  // frames with an ordinal below it precede ledger_
  std::optional<bool> finish_ VIGIL_GUARDED_BY(mu_);   // Finish(streams_done) was called
  std::string finish_reason_ VIGIL_GUARDED_BY(mu_);
  bool finish_sent_ VIGIL_GUARDED_BY(mu_) = false;
  std::string hb_token_ VIGIL_GUARDED_BY(mu_);  // the current pairing's heartbeat token ("" unpaired)
  grpc::ServerContext* hb_ctx_ VIGIL_GUARDED_BY(mu_) = nullptr;  // its Heartbeats stream, while one runs
};

class GrpcPrimaryChannel final : public PrimaryChannel {
 public:
  GrpcPrimaryChannel(std::unique_ptr<PrimaryService> service, std::unique_ptr<grpc::Server> server, int port)
      : service_(std::move(service)), server_(std::move(server)), port_(static_cast<uint16_t>(port)) {}
  ~GrpcPrimaryChannel() override { Stop(); }
  uint16_t port() const override { return port_; }
  PrimaryChannelStats stats() const override { return service_->stats(); }
  void PublishLedger(std::vector<MirroredStream> streams) override { service_->PublishLedger(std::move(streams)); }
  bool MirrorFrame(MirroredFrame frame) override { return service_->MirrorFrame(std::move(frame)); }
  bool MirrorResult(MirroredResult result) override { return service_->MirrorResult(std::move(result)); }
  void Acknowledge(const std::string& stream, uint64_t run, uint64_t through) override {
    service_->Acknowledge(stream, run, through);
  }
  void Finish(bool streams_done, std::string reason) override {
    service_->Finish(streams_done, std::move(reason));
    Stop();
  }
  void Stop() override {
    MutexLock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    // After 200 ms the open stream is cancelled.
    server_->Shutdown(GrpcDeadline(Deadline::After(std::chrono::milliseconds(200))));
    server_->Wait();
  }

 private:
  std::unique_ptr<PrimaryService> service_;
  std::unique_ptr<grpc::Server> server_;
  const uint16_t port_;
  Mutex mu_;
  bool stopped_ VIGIL_GUARDED_BY(mu_) = false;
};

// ---- the standby -----------------------------------------------------------------------------------

class GrpcStandbyChannel final : public StandbyChannel {
 public:
  explicit GrpcStandbyChannel(StandbyChannelOptions o) : opt_(std::move(o)) {}
  ~GrpcStandbyChannel() override { Stop(); }

  Status Open(const Pems& pems, std::chrono::milliseconds timeout) {
    const auto deadline = Deadline::After(timeout);
    grpc::SslCredentialsOptions co;
    co.pem_root_certs = pems.ca;
    co.pem_private_key = pems.key;
    co.pem_cert_chain = pems.cert;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMirroredJpegBytes + (1u << 20)));  // a mirrored picture
    channel_ = grpc::CreateCustomChannel(opt_.primary, grpc::SslCredentials(co), args);
    const std::string where = StrCat("replication: primary ", opt_.primary);
    if (!channel_->WaitForConnected(GrpcDeadline(deadline))) {
      // gRPC does not say why; a handshake of our own with the same files does.
      return absl::UnavailableError(StrCat(where, ": no answer within ", timeout.count(), " ms: ",
                                           DiagnoseTls(opt_.primary, pems)));
    }
    stub_ = v1::Replication::NewStub(channel_);
    stream_ = stub_->Mirror(&ctx_);
    v1::StandbyMessage pair;
    v1::Pair* p = pair.mutable_pair();
    p->set_version(kChannelVersion);
    p->set_edge(opt_.edge);
    p->set_node(opt_.node);
    ToProto(opt_.digest, p->mutable_digest());
    // The first answer within the deadline: a watchdog cancels the stream otherwise.
    std::atomic<bool> answered{false};
    std::thread watchdog([&] {
      MutexLock lock(mu_);
      while (!answered.load() && cv_.WaitUntil(lock, deadline)) {
      }
      if (!answered.load()) ctx_.TryCancel();
    });
    v1::PrimaryMessage reply;
    const bool wrote = stream_->Write(pair);
    const bool got = wrote && stream_->Read(&reply);
    {
      MutexLock lock(mu_);
      answered = true;
    }
    cv_.NotifyAll();
    watchdog.join();
    if (!got) {
      const grpc::Status s = stream_->Finish();
      return s.ok() ? absl::UnavailableError(StrCat(where, ": the stream ended before an answer to Pair"))
                    : FromGrpc(s, StrCat(where, ": pairing"));
    }
    if (reply.has_refused()) {
      ctx_.TryCancel();
      (void)stream_->Finish();
      return absl::FailedPreconditionError(StrCat(where, " refused to pair: ", reply.refused().reason()));
    }
    if (!reply.has_paired()) {
      ctx_.TryCancel();
      (void)stream_->Finish();
      return absl::UnavailableError(StrCat(where, ": answered Pair with neither Paired nor Refused"));
    }
    primary_node_ = reply.paired().node();
    frames_offer_.socket = reply.paired().frames_socket().substr(0, 200);
    frames_offer_.token = reply.paired().frames_token().substr(0, 64);
    spdlog::info("replication: paired with primary '{}' at {} (edge '{}')", primary_node_, opt_.primary, opt_.edge);
    reader_ = std::thread([this] { ReadLoop(); });
    if (const std::string& token = reply.paired().heartbeat_token(); !token.empty()) {
      // Heartbeats on a connection of their own: nothing queued on Mirror (ledger states, frames, results, and
      // the callbacks that take them on the reader thread) holds an answer back.
      const Status st = OpenHeartbeats(pems, token.substr(0, 64), deadline);
      if (!st.ok()) {
        spdlog::warn("replication: heartbeats to primary {} go on the mirroring stream: {}", opt_.primary,
                     std::string(st.message()));
      }
    }
    heartbeats_ = std::thread([this] { HeartbeatLoop(); });
    return absl::OkStatus();
  }

  // Opens the Heartbeats stream (its own gRPC channel: its own TCP connection) and sends the first heartbeat,
  // which names the pairing; starts its reader. Errors: Unavailable (no connection before the deadline, or the
  // first write failed).
  Status OpenHeartbeats(const Pems& pems, const std::string& token, Deadline deadline) {
    grpc::SslCredentialsOptions co;
    co.pem_root_certs = pems.ca;
    co.pem_private_key = pems.key;
    co.pem_cert_chain = pems.cert;
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // not the Mirror stream's connection
    hb_channel_ = grpc::CreateCustomChannel(opt_.primary, grpc::SslCredentials(co), args);
    const Deadline wait_until = Deadline::Later(deadline, Deadline::After(std::chrono::milliseconds(500)));
    if (!hb_channel_->WaitForConnected(GrpcDeadline(wait_until))) {
      return absl::UnavailableError("no second connection for heartbeats");
    }
    hb_stub_ = v1::Replication::NewStub(hb_channel_);
    hb_stream_ = hb_stub_->Heartbeats(&hb_ctx_);
    v1::Heartbeat first;
    first.set_sent_ns(SteadyNs());
    first.set_token(token);
    if (!hb_stream_->Write(first)) {
      hb_ctx_.TryCancel();
      (void)hb_stream_->Finish();
      hb_stream_.reset();
      return absl::UnavailableError("the heartbeat stream ended at its first write");
    }
    hb_live_.store(true);
    hb_reader_ = std::thread([this] { HeartbeatReadLoop(); });
    return absl::OkStatus();
  }

  const std::string& primary_node() const override { return primary_node_; }
  const FramesOffer& frames_offer() const override { return frames_offer_; }
  uint64_t heartbeats_answered() const override { return answered_.load(); }
  bool heartbeats_on_own_connection() const override { return hb_live_.load(); }
  uint64_t frames_received() const override { return frames_.load(); }
  uint64_t results_received() const override { return results_.load(); }

  void Stop() override {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.NotifyAll();
    if (stream_) ctx_.TryCancel();
    if (hb_stream_) hb_ctx_.TryCancel();
    if (heartbeats_.joinable()) heartbeats_.join();
    if (reader_.joinable()) reader_.join();
    if (hb_reader_.joinable()) hb_reader_.join();
  }

 private:
  void ReadLoop() {
    v1::PrimaryMessage m;
    Status why = absl::OkStatus();
    while (stream_->Read(&m)) {
      if (m.has_ledger()) {
        if (opt_.on_ledger) opt_.on_ledger(FromProto(m.ledger()));
        continue;
      }
      if (m.has_frame()) {
        ++frames_;
        if (opt_.on_frame) opt_.on_frame(FromProto(m.mutable_frame()));
        continue;
      }
      if (m.has_results()) {
        bool bad = false;
        for (const v1::MirroredResult& one : m.results().results()) {
          std::optional<MirroredResult> r = FromProto(one);
          if (!r) {
            bad = true;
            break;
          }
          ++results_;
          if (opt_.on_result) opt_.on_result(std::move(*r));
        }
        if (bad) {
          why = absl::InvalidArgumentError("the primary sent a mirrored result whose boxes and class ids do not match");
          ctx_.TryCancel();
          break;
        }
        continue;
      }
      if (m.has_finished()) {
        if (opt_.on_finished) opt_.on_finished(m.finished().streams_done(), m.finished().reason().substr(0, 512));
        continue;
      }
      if (!m.has_heartbeat()) {
        why = absl::InvalidArgumentError("the primary sent a message of a kind this standby does not know");
        ctx_.TryCancel();
        break;
      }
      ++answered_;
      if (opt_.on_heartbeat) opt_.on_heartbeat(SteadyNs());
    }
    const grpc::Status s = stream_->Finish();
    if (why.ok()) {
      why = s.ok() ? absl::UnavailableError(StrCat("primary ", opt_.primary, " ended the stream"))
                   : FromGrpc(s, StrCat("primary ", opt_.primary));
    }
    {
      MutexLock lock(mu_);
      ended_ = true;
      if (stopping_) return;  // our own Stop: not news
    }
    cv_.NotifyAll();
    spdlog::warn("replication: {}", std::string(why.message()));
    if (opt_.on_end) opt_.on_end(why);
  }

  // The answers on the Heartbeats stream. Its end (not our Stop) moves the heartbeats back to Mirror: the
  // stream's end is no verdict on the primary (its process gone ends Mirror too, which is on_end's news).
  void HeartbeatReadLoop() {
    v1::Heartbeat m;
    while (hb_stream_->Read(&m)) {
      ++answered_;
      if (opt_.on_heartbeat) opt_.on_heartbeat(SteadyNs());
    }
    hb_live_.store(false);
    const grpc::Status s = hb_stream_->Finish();
    MutexLock lock(mu_);
    if (!stopping_ && !ended_) {
      spdlog::info("replication: the heartbeat stream to primary {} ended ({}); heartbeats go on the mirroring stream",
                   opt_.primary, s.ok() ? std::string("by the primary") : s.error_message());
    }
  }

  void HeartbeatLoop() {
    MutexLock lock(mu_);
    for (;;) {
      lock.Unlock();
      const int64_t now = SteadyNs();
      bool ok = true;
      if (hb_live_.load()) {
        v1::Heartbeat hb;
        hb.set_sent_ns(now);
        if (!hb_stream_->Write(hb)) hb_live_.store(false);  // ended: the next goes on Mirror
      }
      if (!hb_live_.load()) {
        v1::StandbyMessage hb;
        hb.mutable_heartbeat()->set_sent_ns(now);
        ok = stream_->Write(hb);
      }
      lock.Lock();
      if (!ok || stopping_ || ended_) return;
      const auto deadline = Deadline::After(opt_.heartbeat_interval);  // a CondVar deadline
      while (!stopping_ && !ended_ && cv_.WaitUntil(lock, deadline)) {
      }
      if (stopping_ || ended_) return;
    }
  }

  int64_t SteadyNs() const { return clock_->SteadyNs(); }

  const StandbyChannelOptions opt_;
  vigil::Clock* const clock_ = opt_.clock != nullptr ? opt_.clock : SystemClock();
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Replication::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StandbyMessage, v1::PrimaryMessage>> stream_;
  // The Heartbeats stream on its own channel (null: heartbeats on Mirror); hb_live_ while it carries them.
  std::shared_ptr<grpc::Channel> hb_channel_;
  std::unique_ptr<v1::Replication::Stub> hb_stub_;
  grpc::ClientContext hb_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::Heartbeat, v1::Heartbeat>> hb_stream_;
  std::atomic<bool> hb_live_{false};
  std::string primary_node_;
  FramesOffer frames_offer_;
  std::atomic<uint64_t> answered_{0};
  std::atomic<uint64_t> frames_{0};
  std::atomic<uint64_t> results_{0};
  Mutex mu_;
  CondVar cv_;
  bool stopping_ VIGIL_GUARDED_BY(mu_) = false;
  bool ended_ VIGIL_GUARDED_BY(mu_) = false;
  std::thread reader_, heartbeats_, hb_reader_;
};

}  // namespace

StatusOr<std::unique_ptr<PrimaryChannel>> PrimaryChannel::Start(PrimaryChannelOptions options) {
  VIGIL_ASSIGN_OR_RETURN(Pems pems, LoadTls(options.tls));
  if (options.edge.empty()) return absl::InvalidArgumentError("replication: the primary channel needs the edge id");
  if (options.max_retained_frames == 0 || options.max_retained_results == 0) {
    return absl::InvalidArgumentError("replication: max_retained_frames and max_retained_results must be at least 1");
  }
  const std::string listen = options.listen;
  grpc::SslServerCredentialsOptions so(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  so.pem_root_certs = pems.ca;
  so.pem_key_cert_pairs.push_back({pems.key, pems.cert});
  auto service = std::make_unique<PrimaryService>(std::move(options));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::SslServerCredentials(so), &port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(StrCat("replication: cannot listen on ", listen,
                                         " (address in use, not an address of this host, or the TLS files do not "
                                         "hold a certificate and its key)"));
  }
  spdlog::info("replication: primary channel listening on {} (port {}, mutual TLS)", listen, port);
  return std::unique_ptr<PrimaryChannel>(new GrpcPrimaryChannel(std::move(service), std::move(server), port));
}

StatusOr<std::unique_ptr<StandbyChannel>> StandbyChannel::Pair(StandbyChannelOptions options,
                                                               std::chrono::milliseconds timeout) {
  VIGIL_ASSIGN_OR_RETURN(Pems pems, LoadTls(options.tls));
  if (options.primary.empty()) return absl::InvalidArgumentError("replication: the standby needs the primary's address");
  if (options.heartbeat_interval <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError("replication: heartbeat_interval must be positive");
  }
  auto c = std::make_unique<GrpcStandbyChannel>(std::move(options));
  VIGIL_RETURN_IF_ERROR(c->Open(pems, timeout));
  return std::unique_ptr<StandbyChannel>(std::move(c));
}

}  // namespace vigil::replication
