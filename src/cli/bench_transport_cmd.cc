// `vigil bench transport` — what the report links cost, measured through the product's own transport code:
// a client Link (MakeFramedLink over MakeTcpDialer, MakeTlsDialer(MakeTcpDialer) or MakeUcxDialer, with a
// pre-shared key) against a Receiver (Receiver::Start over TcpListener, MakeTlsListener(TcpListener) or
// UcxListen, ReceiverOptions::keys set) in a second process, as ucx_perftest runs its two sides.
//
//   vigil bench transport [--links tcp,tls,ucx,cuda_ipc] [--sizes 64,256,1024,4096,16384,65536] [--iters 2000]
//                         [--warmup 200] [--window 64] [--stream-messages 20000] [--stream-seconds 2]
//                         [--opens 200] [--memory host|device] [--ring-device cuda:0|host] [--json FILE]
//
// cuda_ipc (transport/cuda_ipc.h): the server listens on Unix sockets in its folder and offers rings on
// --ring-device. --memory device puts the Report's rows in GPU memory (cuda:0) as a DevicePayload: cuda_ipc
// copies them device to device into the ring; ucx, where the UCX loaded has CUDA transports (PyPI
// libucx-cu13), sends them from GPU memory (Connection::WriteReport) and the server receives rendezvous rows
// into its GPU memory (--ring-device) and copies them to the host as storage would; every other link is the
// host-staged path (the link downloads them — D2H copy and synchronize —, sends, and the server copies them
// into its GPU memory before its ack).
// Besides RTT/2, each Report's one-way time is measured: the client stamps publish_ns with CLOCK_MONOTONIC
// just before Link::Send, the server's handler subtracts it from its own CLOCK_MONOTONIC (one host, one clock).
//
// The server process is this binary again (/proc/self/exe, fork + exec) in a hidden role
// (`bench transport --serve KIND --dir DIR`): it starts two Receivers on 127.0.0.1 — one with the edge's
// key (KeyStore from DIR/keys.yaml), one without keys — prints "ports KEYED OPEN" on stdout, answers "cpu"
// on stdin with its own CPU time (getrusage RUSAGE_SELF, µs) and stops at "quit" or end of input. Its handler
// admits every Hello (epoch 1) and acknowledges every Report at once from the connection's reader thread
// (Session::Enqueue, written by the session's writer thread): no storage, so this isolates the transport
// (storage is the aggregator's own benchmark).
//
// The message is a Report frame (protocol.h) of exactly the requested size: an event of edge "bench",
// stream "cam0", run 1, with an empty rule — 16 header bytes + 93 body bytes = 109 bytes with no detection —
// plus 24 bytes per detection row (6 f32), the remainder (< 24 bytes) padding the rule string. A size below
// 109 bytes is sent as the 109-byte Report (the smallest there is); the table shows the frame's real size.
//
// Per link and size, on one session opened with the key:
//  - latency: ping-pong, one Report sent (Link::Send of one message) and its Ack received (Link::Receive),
//    `--warmup` untimed then `--iters` timed round trips; p50/p99/max of RTT/2 (one-way, as ucx_perftest's
//    tag_lat prints), µs;
//  - throughput: up to `--window` Reports in flight, one message per Link::Send, acks drained by a reader
//    thread; `--stream-messages` messages or `--stream-seconds`, whichever ends first; messages/s and MiB/s
//    (2^20 bytes, frame bytes, as ucx_perftest's "MB/s");
//  - CPU per message over the throughput phase: client (this process, all threads) and server (its
//    process, all threads) getrusage user + system time ÷ messages.
// Per link, authentication cost per connection: median time of Link::Open (connect + Hello / Challenge /
// Auth / Welcome) with the key against the keyed receiver vs without a key against the receiver without
// keys (the same four messages: the difference is the HMACs and the nonce), `--opens` each, alternating
// (UCX: --opens / 5, each Dial starts a UCP context and worker). For tls, the TLS share of an open is
// tls open − tcp open (with key), and the TLS cost per message is tls − tcp CPU µs per message.
// UCX runs with UcxOptions' defaults (UCX_TLS unset: UCX chooses; shared memory allowed under peer error
// handling); the transports UCX selected (Link::transports()) are printed. Built without UCX, ucx is
// skipped with a message.
//
// Output: a table on stdout; with --json FILE also one JSON object in FILE. Exit codes as cli/commands.h.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <semaphore>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if VIGIL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif


#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/bench_stats.h"
#include "cli/commands.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/transport/throwaway_certs.h"  // throwaway TLS certificates for the tls link
#include "vigil/transport/auth.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/unix_socket.h"
#include "vigil/transport/link.h"
#include "vigil/transport/receiver.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/ucx.h"

namespace vigil::cli {
namespace {

namespace fs = std::filesystem;
namespace tp = vigil::transport;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{5000};  // any single Open, Send or wait for an Ack
constexpr const char* kEdge = "bench";
constexpr const char* kStream = "cam0";

struct BenchTransportArgs {
  std::string links = "tcp,tls,ucx";
  std::string sizes = "64,256,1024,4096,16384,65536";
  int iters = 2000;
  int warmup = 200;
  int window = 64;
  int stream_messages = 20000;
  double stream_seconds = 2;
  int opens = 200;
  std::string memory = "host";        // where the edge's rows live: host or device (cuda:0)
  std::string ring_device = "cuda:0";  // cuda_ipc: where the aggregator's ring lives (cuda:N or host)
  uint32_t ring_linger_us = 200;       // cuda_ipc: the edge's resident publisher (0: a launch per slot)
  std::string json_file;
  // The hidden server role.
  std::string serve;  // link kind
  std::string dir;    // keys.yaml, certs/
};

double UsSince(Clock::time_point t) { return std::chrono::duration<double, std::micro>(SteadyNow() - t).count(); }

std::vector<std::string> SplitComma(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- the server process -----------------------------------------------------------------------------

// CLOCK_MONOTONIC, shared by the processes of one host (SystemClock()'s steady time).
int64_t MonotonicNs() { return SystemClock()->SteadyNs(); }

// Admits every Hello with epoch 1 and acknowledges every Report at once; stores nothing. Records the
// one-way time of each Report (its publish_ns, stamped by the client on CLOCK_MONOTONIC of this host,
// to its arrival here). With --memory device the rows are first copied into this process's GPU memory
// (the host-staged path's last copy; a cuda_ipc ring delivers them there already).
class AckAtOnce final : public tp::ReceiverHandler {
 public:
  explicit AckAtOnce(bool to_device) : to_device_(to_device) {}
  ~AckAtOnce() override {
#if VIGIL_HAVE_CUDA
    if (dev_ != nullptr) cudaFree(dev_);
#endif
  }
  std::vector<double> TakeOneWay() {
    MutexLock lock(mu_);
    return std::exchange(one_way_us_, {});
  }
  // Reports received, and of them those whose rows differ from the pattern the client sends.
  std::pair<uint64_t, uint64_t> Checked() {
    MutexLock lock(mu_);
    return {reports_, reports_wrong_};
  }
  Status OnHello(const std::shared_ptr<tp::Session>& s) override {
    tp::Welcome w{1, {}};
    for (const tp::HelloStream& hs : s->hello().streams) w.streams.push_back({hs.stream, hs.run, -1, -1});
    s->Admit(w);
    return absl::OkStatus();
  }
  void OnReport(const std::shared_ptr<tp::Session>& s, tp::Report r) override {
#if VIGIL_HAVE_CUDA
    // cuda_ipc rows came device to device; ucx rows did where UCX has CUDA transports (sent from GPU memory,
    // received into it by rendezvous): no host-staged H2D copy for them.
    const bool came_from_device =
        s->link() == "cuda_ipc" || (s->link() == "ucx" && tp::GetUcxCounters().cuda_memory_workers > 0);
    if (to_device_ && !came_from_device && !r.detections.empty()) {
      const size_t bytes = r.detections.size() * sizeof(tp::ReportDetection);
      if (bytes > dev_bytes_) {
        if (dev_ != nullptr) cudaFree(dev_);
        dev_ = nullptr;
        if (cudaMalloc(&dev_, bytes) == cudaSuccess) dev_bytes_ = bytes;
      }
      if (dev_ != nullptr) cudaMemcpy(dev_, r.detections.data(), bytes, cudaMemcpyHostToDevice);
    }
#endif
    // Every row as the client made it (MakeMessage's pattern): a link that moves rows wrong is caught here.
    bool wrong = false;
    for (size_t i = 0; i < r.detections.size() && !wrong; ++i) {
      const tp::ReportDetection& d = r.detections[i];
      const float f = static_cast<float>(i % 1000);
      wrong = d.x1 != f || d.y1 != f || d.x2 != f + 10 || d.y2 != f + 20 || d.score != 0.5f ||
              d.class_id != static_cast<float>(i % 80);
    }
    {
      MutexLock lock(mu_);
      one_way_us_.push_back(static_cast<double>(MonotonicNs() - r.publish_ns) / 1000.0);
      ++reports_;
      if (wrong) ++reports_wrong_;
    }
    (void)s->Enqueue(tp::EncodeFrame(
        tp::Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, static_cast<int64_t>(r.seq_last)}));
  }
  void OnClose(const std::shared_ptr<tp::Session>&, const Status&) override {}

 private:
  const bool to_device_;
  void* dev_ = nullptr;
  size_t dev_bytes_ = 0;
  Mutex mu_;
  std::vector<double> one_way_us_ VIGIL_GUARDED_BY(mu_);
  uint64_t reports_ VIGIL_GUARDED_BY(mu_) = 0;
  uint64_t reports_wrong_ VIGIL_GUARDED_BY(mu_) = 0;
};

std::string CertsDir(const std::string& dir) { return (fs::path(dir) / "certs").string(); }

std::string SocketPath(const std::string& dir, int which) {
  return (fs::path(dir) / (which == 0 ? "keyed.sock" : "open.sock")).string();
}

StatusOr<std::unique_ptr<tp::Listener>> Listen(const std::string& kind, const std::string& dir, int which,
                                               const std::string& ring_device, bool device_rows) {
  if (kind == "ucx") {
    tp::UcxOptions o;
    // --memory device: rows that come by rendezvous land in the server's GPU memory (then one copy to the host,
    // as storage needs), where UCX has CUDA transports.
    if (device_rows && ring_device.rfind("cuda:", 0) == 0) o.receive_device = std::atoi(ring_device.c_str() + 5);
    return tp::UcxListen("127.0.0.1", 0, o);
  }
  if (kind == "cuda_ipc") {
    tp::CudaIpcListenOptions o;
    o.path = SocketPath(dir, which);
    o.device = ring_device;
    return tp::CudaIpcListen(o);
  }
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<tp::TcpListener> tcp, tp::TcpListener::Listen("127.0.0.1", 0));
  if (kind == "tcp") return std::unique_ptr<tp::Listener>(std::move(tcp));
  tp::TlsOptions o;
  o.cert_file = CertsDir(dir) + "/server.pem";
  o.key_file = CertsDir(dir) + "/server.key";
  VIGIL_ASSIGN_OR_RETURN(std::shared_ptr<tp::TlsContext> ctx, tp::TlsContext::Server(o));
  return tp::MakeTlsListener(std::move(tcp), std::move(ctx));
}

int Serve(const BenchTransportArgs& a) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "vigil bench transport --serve: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  StatusOr<tp::KeyStore> keys = tp::KeyStore::Load((fs::path(a.dir) / "keys.yaml").string());
  if (!keys.ok()) return fail(keys.status());
  AckAtOnce handler(a.memory == "device");
  std::unique_ptr<tp::Receiver> receivers[2];
  for (int i = 0; i < 2; ++i) {
    StatusOr<std::unique_ptr<tp::Listener>> l = Listen(a.serve, a.dir, i, a.ring_device, a.memory == "device");
    if (!l.ok()) return fail(l.status());
    tp::ReceiverOptions o;
    if (i == 0) o.keys = std::make_shared<const tp::KeyStore>(*keys);  // [1]: no keys
    StatusOr<std::unique_ptr<tp::Receiver>> r = tp::Receiver::Start(o, std::move(*l), &handler);
    if (!r.ok()) return fail(r.status());
    receivers[i] = std::move(*r);
  }
  std::printf("ports %u %u\n", receivers[0]->port(), receivers[1]->port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
    if (line == "cpu") {
      std::printf("cpu %.0f\n", ProcessCpuMs() * 1000.0);
      std::fflush(stdout);
    } else if (line == "reset") {
      (void)handler.TakeOneWay();
      std::printf("ok\n");
      std::fflush(stdout);
    } else if (line == "checked") {
      const auto [n, wrong] = handler.Checked();
      std::printf("checked %llu %llu\n", static_cast<unsigned long long>(n), static_cast<unsigned long long>(wrong));
      std::fflush(stdout);
    } else if (line == "oneway") {
      std::vector<double> v = handler.TakeOneWay();
      const size_t n = v.size();
      const Latency l = Summarize(std::move(v));
      std::printf("oneway %.3f %.3f %.3f %zu\n", l.p50, l.p99, l.max, n);
      std::fflush(stdout);
    }
  }
  for (auto& r : receivers) r->Stop();
  return 0;
}

// The server as seen from the client: a child process and its two pipes.
class ServerProcess {
 public:
  static StatusOr<std::unique_ptr<ServerProcess>> Spawn(const std::string& kind, const std::string& dir,
                                                      const BenchTransportArgs& a) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0) return absl::InternalError(StrCat("pipe: ", std::strerror(errno)));
    if (pipe2(from_child, O_CLOEXEC) != 0) {
      close(to_child[0]), close(to_child[1]);
      return absl::InternalError(StrCat("pipe: ", std::strerror(errno)));
    }
    std::vector<std::string> args = {"vigil",  "--log-level", "error",       "bench",         "transport",
                                     "--serve", kind,         "--dir",       dir,             "--memory",
                                     a.memory,  "--ring-device", a.ring_device};
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {  // only async-signal-safe calls until exec
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    if (pid < 0) {
      close(to_child[1]), close(from_child[0]);
      return absl::InternalError(StrCat("fork: ", std::strerror(errno)));
    }
    auto p = std::unique_ptr<ServerProcess>(new ServerProcess(pid, to_child[1], fdopen(from_child[0], "r")));
    VIGIL_ASSIGN_OR_RETURN(std::string ports, p->ReadLine());
    unsigned keyed = 0, open = 0;
    if (std::sscanf(ports.c_str(), "ports %u %u", &keyed, &open) != 2) {
      return absl::InternalError(StrCat("the server process said '", ports, "', not its ports"));
    }
    p->keyed_port = static_cast<uint16_t>(keyed);
    p->open_port = static_cast<uint16_t>(open);
    return p;
  }

  ~ServerProcess() {
    (void)!write(to_, "quit\n", 5);
    close(to_);
    std::fclose(from_);
    int status = 0;
    for (int i = 0; i < 500; ++i) {  // 5 s for the receivers to stop
      if (waitpid(pid_, &status, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }

  // The server process's CPU time so far (user + system, all its threads), µs.
  StatusOr<double> CpuUs() {
    if (write(to_, "cpu\n", 4) != 4) return absl::UnavailableError("the server process is gone");
    VIGIL_ASSIGN_OR_RETURN(std::string line, ReadLine());
    double us = 0;
    if (std::sscanf(line.c_str(), "cpu %lf", &us) != 1) return absl::InternalError(StrCat("server said '", line, "'"));
    return us;
  }

  // One-way times recorded by the server since the last call: "reset" drops them, "oneway" summarizes.
  Status ResetOneWay() {
    if (write(to_, "reset\n", 6) != 6) return absl::UnavailableError("the server process is gone");
    return ReadLine().status();
  }
  StatusOr<Latency> OneWay(size_t* n) {
    if (write(to_, "oneway\n", 7) != 7) return absl::UnavailableError("the server process is gone");
    VIGIL_ASSIGN_OR_RETURN(std::string line, ReadLine());
    Latency l;
    if (std::sscanf(line.c_str(), "oneway %lf %lf %lf %zu", &l.p50, &l.p99, &l.max, n) != 4) {
      return absl::InternalError(StrCat("server said '", line, "'"));
    }
    return l;
  }

  // Reports the server received so far and how many of them had rows unlike the client's.
  Status Checked(uint64_t* reports, uint64_t* wrong) {
    if (write(to_, "checked\n", 8) != 8) return absl::UnavailableError("the server process is gone");
    VIGIL_ASSIGN_OR_RETURN(std::string line, ReadLine());
    unsigned long long n = 0, w = 0;
    if (std::sscanf(line.c_str(), "checked %llu %llu", &n, &w) != 2) {
      return absl::InternalError(StrCat("server said '", line, "'"));
    }
    *reports = n;
    *wrong = w;
    return absl::OkStatus();
  }

  uint16_t keyed_port = 0, open_port = 0;

 private:
  ServerProcess(pid_t pid, int to, FILE* from) : pid_(pid), to_(to), from_(from) {}
  StatusOr<std::string> ReadLine() {
    char buf[256];
    if (std::fgets(buf, sizeof buf, from_) == nullptr) {
      return absl::UnavailableError("the server process ended (its error is above)");
    }
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }
  const pid_t pid_;
  const int to_;
  FILE* const from_;
};

// ---- the client ---------------------------------------------------------------------------------------

struct SizeResult {
  size_t size = 0;         // requested
  size_t frame_bytes = 0;  // sent: the Report frame
  size_t rows = 0, rule_bytes = 0;
  Latency latency_us;  // RTT/2
  Latency one_way_us;  // client Send → server handler, stamped on CLOCK_MONOTONIC
  int64_t messages = 0;
  double seconds = 0, messages_per_s = 0, mib_per_s = 0;
  double cpu_client_us = 0, cpu_server_us = 0;  // per message, throughput phase
};

struct LinkResult {
  std::string link;
  std::string transports;
  std::string error;  // non-empty: the link failed (what it measured before stays)
  std::vector<SizeResult> sizes;
  int opens = 0;
  double open_keyed_us = 0, open_unkeyed_us = 0;  // medians
  uint64_t reports_checked = 0, reports_wrong = 0;  // the server's check of every report's rows
};

// A Report whose frame is `size` bytes (at least the smallest Report's), as an Outbox message.
tp::OutboxMessage MakeMessage(size_t size, SizeResult* r) {
  tp::OutboxMessage m;
  tp::Report& rep = m.report;
  rep.stream = kStream;
  rep.run = 1;
  rep.kind = tp::ReportKind::kEvent;
  rep.severity = tp::Severity::kWarning;
  rep.capture_ns = rep.publish_ns = 1'700'000'000'000'000'000;
  rep.pts_ns = 0;
  rep.width = 1920, rep.height = 1080;
  std::string frame;
  tp::AppendReportFrame(rep, kEdge, 1, 0, {}, &frame);
  const size_t base = frame.size();
  if (size > base) {
    const size_t rows = (size - base) / sizeof(tp::ReportDetection);
    rep.rule.assign((size - base) % sizeof(tp::ReportDetection), 'x');
    for (size_t i = 0; i < rows; ++i) {
      const float f = static_cast<float>(i % 1000);
      rep.detections.push_back({f, f, f + 10, f + 20, 0.5f, static_cast<float>(i % 80)});
    }
  }
  frame.clear();
  tp::AppendReportFrame(rep, kEdge, 1, 0, rep.detections, &frame);
  r->size = size;
  r->frame_bytes = frame.size();
  r->rows = rep.detections.size();
  r->rule_bytes = rep.rule.size();
  return m;
}

tp::Hello MakeHello() {
  tp::Hello h;
  h.edge = kEdge;
  for (int i = 0; i < 80; ++i) h.class_names.push_back(StrCat("class", i));  // the rows use ids 0..79
  h.streams = {{kStream, 1}};
  return h;
}

// Waits for the Ack of the Report just sent (Heartbeat echoes skipped).
Status WaitAck(tp::Link& link) {
  for (;;) {
    StatusOr<std::optional<tp::Message>> m = link.Receive(kTimeout);
    if (!m.ok()) return m.status();
    if (!m->has_value()) return absl::DeadlineExceededError(StrCat("no Ack within ", kTimeout.count(), " ms"));
    if (std::holds_alternative<tp::Ack>(**m)) return absl::OkStatus();
    if (const tp::Reject* r = std::get_if<tp::Reject>(&**m)) {
      return absl::InternalError(StrCat("Reject ", tp::ToString(r->reason), ": ", r->detail));
    }
  }
}

Status SendOne(tp::Link& link, tp::OutboxMessage& m, uint64_t seq) {
  m.report.seq_first = m.report.seq_last = seq;
  m.report.publish_ns = MonotonicNs();
  const tp::OutboxMessage* p = &m;
  return link.Send(std::span<const tp::OutboxMessage* const>(&p, 1), kTimeout);
}

// --memory device: the rows live in GPU memory (cuda:0) as a DevicePayload, as the edge's post-processing
// leaves them. A link that takes device memory (cuda_ipc on a GPU ring) copies them device to device; the
// others download them (a D2H copy and a synchronize: the host-staged path).
Status MoveRowsToDevice(tp::OutboxMessage* m) {
#if VIGIL_HAVE_CUDA
  std::vector<tp::ReportDetection>& rows = m->report.detections;
  if (rows.empty()) return absl::OkStatus();
  const size_t bytes = rows.size() * sizeof(tp::ReportDetection);
  void* dev = nullptr;
  if (cudaMalloc(&dev, bytes) != cudaSuccess || cudaMemcpy(dev, rows.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError("--memory device: no usable GPU (cudaMalloc/cudaMemcpy failed)");
  }
  tp::DevicePayload p;
  p.count = static_cast<uint32_t>(rows.size());
  p.device = 0;
  p.device_rows = dev;
  p.keepalive = std::shared_ptr<void>(dev, [](void* d) { cudaFree(d); });
  p.download = [dev, bytes](tp::ReportDetection* dst) -> Status {
    if (cudaMemcpy(dst, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return absl::InternalError(cudaGetErrorString(cudaGetLastError()));
    }
    return absl::OkStatus();
  };
  m->device = std::move(p);
  rows.clear();
  return absl::OkStatus();
#else
  (void)m;
  return absl::UnimplementedError("--memory device: this vigil was built without CUDA");
#endif
}

Status MeasureSize(const BenchTransportArgs& a, tp::Link& link, ServerProcess& server, size_t size, uint64_t* seq,
                   SizeResult* r) {
  tp::OutboxMessage m = MakeMessage(size, r);
  if (a.memory == "device") VIGIL_RETURN_IF_ERROR(MoveRowsToDevice(&m));
  // Latency: ping-pong.
  std::vector<double> half_rtt;
  half_rtt.reserve(static_cast<size_t>(a.iters));
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    if (i == a.warmup) VIGIL_RETURN_IF_ERROR(server.ResetOneWay());
    const auto t = SteadyNow();
    VIGIL_RETURN_IF_ERROR(SendOne(link, m, (*seq)++));
    VIGIL_RETURN_IF_ERROR(WaitAck(link));
    if (i >= a.warmup) half_rtt.push_back(UsSince(t) / 2);
  }
  r->latency_us = Summarize(std::move(half_rtt));
  size_t one_way_n = 0;
  VIGIL_ASSIGN_OR_RETURN(r->one_way_us, server.OneWay(&one_way_n));

  // Throughput: a window of reports in flight, acks drained by a reader thread.
  std::counting_semaphore<> credits(a.window);
  std::atomic<int64_t> sent{0}, acked{0};
  std::atomic<bool> sending_done{false}, reader_failed{false};
  Status reader_status;
  Clock::time_point last_ack;
  VIGIL_ASSIGN_OR_RETURN(const double server0, server.CpuUs());
  const double client0 = ProcessCpuMs();
  const auto t0 = SteadyNow();
  std::thread reader([&] {
    auto progress = SteadyNow();
    while (!(sending_done.load() && acked.load() == sent.load())) {
      StatusOr<std::optional<tp::Message>> msg = link.Receive(milliseconds(100));
      Status st = msg.status();
      if (st.ok() && msg->has_value()) {
        if (std::holds_alternative<tp::Ack>(**msg)) {
          acked.fetch_add(1);
          last_ack = progress = SteadyNow();
          credits.release();
        } else if (const tp::Reject* rj = std::get_if<tp::Reject>(&**msg)) {
          st = absl::InternalError(StrCat("Reject ", tp::ToString(rj->reason), ": ", rj->detail));
        }
      } else if (st.ok() && SteadyNow() - progress > kTimeout) {
        st = absl::DeadlineExceededError(StrCat("no Ack within ", kTimeout.count(), " ms"));
      }
      if (!st.ok()) {
        reader_status = st;
        reader_failed = true;
        return;
      }
    }
  });
  Status send_status;
  const auto cap = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.stream_seconds));
  while (sent.load() < a.stream_messages && SteadyNow() < cap && !reader_failed.load()) {
    if (!credits.try_acquire_for(kTimeout)) continue;  // the reader reports a stall
    send_status = SendOne(link, m, (*seq)++);
    if (!send_status.ok()) break;
    sent.fetch_add(1);
  }
  sending_done = true;
  if (!send_status.ok()) link.Close();  // unblocks the reader
  reader.join();
  VIGIL_RETURN_IF_ERROR(send_status);
  VIGIL_RETURN_IF_ERROR(reader_status);
  const double client_us = (ProcessCpuMs() - client0) * 1000.0;
  VIGIL_ASSIGN_OR_RETURN(const double server1, server.CpuUs());
  r->messages = sent.load();
  r->seconds = std::chrono::duration<double>(last_ack - t0).count();
  r->messages_per_s = static_cast<double>(r->messages) / r->seconds;
  r->mib_per_s = r->messages_per_s * static_cast<double>(r->frame_bytes) / (1024.0 * 1024.0);
  r->cpu_client_us = client_us / static_cast<double>(r->messages);
  r->cpu_server_us = (server1 - server0) / static_cast<double>(r->messages);
  return absl::OkStatus();
}

struct Dialing {
  std::string kind;
  std::string dir;                      // cuda_ipc: the server's sockets
  std::shared_ptr<tp::TlsContext> tls;  // tls only
  uint32_t ring_linger_us = 200;        // cuda_ipc
  std::unique_ptr<tp::Dialer> Make(uint16_t port) const {
    if (kind == "ucx") return tp::MakeUcxDialer("127.0.0.1", port, tp::UcxOptions{});
    std::unique_ptr<tp::Dialer> tcp = tp::MakeTcpDialer("127.0.0.1", port);
    if (kind == "tcp") return tcp;
    return tp::MakeTlsDialer(std::move(tcp), tls);  // server name: the dialed IP (the certificate's IP SAN)
  }
  // A link to the keyed receiver (with `key`) or the one without keys.
  std::unique_ptr<tp::Link> Link(const ServerProcess& server, bool keyed, const std::string& key) const {
    if (kind == "cuda_ipc") return tp::MakeCudaIpcLink(SocketPath(dir, keyed ? 0 : 1), key, -1, ring_linger_us);
    return tp::MakeFramedLink(Make(keyed ? server.keyed_port : server.open_port), {"tcp", key});
  }
};

// Median Link::Open time with the key (keyed receiver) and without (receiver without keys), alternating.
Status MeasureOpens(const Dialing& dialing, const ServerProcess& server, const std::string& key, int opens,
                    LinkResult* r) {
  std::unique_ptr<tp::Link> keyed = dialing.Link(server, true, key);
  std::unique_ptr<tp::Link> open = dialing.Link(server, false, "");
  std::vector<double> keyed_us, open_us;
  const tp::Hello hello = MakeHello();
  constexpr int kWarmup = 3;
  for (int i = 0; i < kWarmup + opens; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool with_key = (k == 0) == (i % 2 == 0);  // alternate which goes first
      tp::Link& link = with_key ? *keyed : *open;
      const auto t = SteadyNow();
      StatusOr<tp::Welcome> w = link.Open(hello, kTimeout);
      const double us = UsSince(t);
      link.Close();
      if (!w.ok()) return Annotate(w.status(), with_key ? "open with key" : "open without key");
      if (i >= kWarmup) (with_key ? keyed_us : open_us).push_back(us);
    }
  }
  r->opens = opens;
  r->open_keyed_us = Summarize(keyed_us).p50;
  r->open_unkeyed_us = Summarize(open_us).p50;
  return absl::OkStatus();
}

LinkResult RunLink(const BenchTransportArgs& a, const std::string& kind, const std::vector<size_t>& sizes,
                   const std::string& dir, const std::string& key) {
  LinkResult r;
  r.link = kind;
  Dialing dialing{kind, dir, nullptr, a.ring_linger_us};
  if (kind == "tls") {
    tp::TlsOptions o;
    o.ca_file = CertsDir(dir) + "/ca.pem";
    StatusOr<std::shared_ptr<tp::TlsContext>> ctx = tp::TlsContext::Client(o);
    if (!ctx.ok()) {
      r.error = std::string(ctx.status().message());
      return r;
    }
    dialing.tls = *ctx;
  }
  StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Spawn(kind, dir, a);
  if (!server.ok()) {
    r.error = StrCat("server: ", server.status().message());
    return r;
  }
  std::unique_ptr<tp::Link> link = dialing.Link(**server, true, key);
  if (StatusOr<tp::Welcome> w = link->Open(MakeHello(), kTimeout); !w.ok()) {
    r.error = StrCat("open: ", w.status().message());
    return r;
  }
  r.transports = link->transports();
  const tp::UcxCounters before = tp::GetUcxCounters();
  const tp::CudaIpcCounters ring_before = tp::GetCudaIpcCounters();
  uint64_t seq = 0;
  for (size_t size : sizes) {
    SizeResult s;
    if (Status st = MeasureSize(a, *link, **server, size, &seq, &s); !st.ok()) {
      r.error = StrCat(size, " B: ", st.message());
      return r;
    }
    r.sizes.push_back(s);
  }
  if (kind == "ucx") {  // after the measurements: how many messages really went from GPU memory
    const tp::UcxCounters c = tp::GetUcxCounters();
    r.transports += StrCat(" (UCX takes CUDA memory: ", c.cuda_memory_workers > 0 ? "yes" : "no",
                           "; rows messages sent from GPU memory: ",
                           c.rows_messages_sent_from_device - before.rows_messages_sent_from_device, " of ",
                           c.rows_messages_sent - before.rows_messages_sent, ")");
  }
  if (Status st = (*server)->Checked(&r.reports_checked, &r.reports_wrong); !st.ok()) {
    r.error = std::string(st.message());
    return r;
  }
  if (r.reports_wrong > 0) {
    r.error = StrCat(r.reports_wrong, " of ", r.reports_checked, " reports arrived with rows unlike those sent");
    return r;
  }
  if (kind == "cuda_ipc" && r.transports == "cuda_ipc") {  // a GPU ring: did the publisher stay resident?
    const tp::CudaIpcCounters c = tp::GetCudaIpcCounters();
    r.transports += StrCat(" (publisher linger ", a.ring_linger_us, " us: ",
                           c.publisher_launches - ring_before.publisher_launches, " launches for ",
                           c.slots_written - ring_before.slots_written, " slots)");
  }
  link->Close();
  // UCX: each Dial starts a UCP context; cuda_ipc: each session allocates, exports and maps a ring.
  const int opens = kind == "ucx" || kind == "cuda_ipc" ? std::max(1, a.opens / 5) : a.opens;
  if (Status st = MeasureOpens(dialing, **server, key, opens, &r); !st.ok()) r.error = std::string(st.message());
  return r;
}

nlohmann::json ToJson(const LinkResult& r) {
  nlohmann::json j;
  j["link"] = r.link;
  j["transports"] = r.transports;
  if (!r.error.empty()) j["error"] = r.error;
  j["reports_checked"] = r.reports_checked;  // rows compared with what the client sent
  j["reports_wrong"] = r.reports_wrong;
  j["open_us"] = {{"with_key", r.open_keyed_us},
                  {"without_key", r.open_unkeyed_us},
                  {"auth_cost", r.open_keyed_us - r.open_unkeyed_us},
                  {"opens", r.opens}};
  j["sizes"] = nlohmann::json::array();
  for (const SizeResult& s : r.sizes) {
    j["sizes"].push_back(
        {{"size", s.size},
         {"frame_bytes", s.frame_bytes},
         {"detections", s.rows},
         {"rule_bytes", s.rule_bytes},
         {"latency_us", {{"p50", s.latency_us.p50}, {"p99", s.latency_us.p99}, {"max", s.latency_us.max},
                         {"mean", s.latency_us.mean}, {"min", s.latency_us.min}}},
         {"one_way_us", {{"p50", s.one_way_us.p50}, {"p99", s.one_way_us.p99}, {"max", s.one_way_us.max}}},
         {"throughput", {{"messages", s.messages}, {"seconds", s.seconds}, {"messages_per_s", s.messages_per_s},
                         {"mib_per_s", s.mib_per_s}}},
         {"cpu_us_per_message",
          {{"client", s.cpu_client_us}, {"server", s.cpu_server_us}, {"total", s.cpu_client_us + s.cpu_server_us}}}});
  }
  return j;
}

const LinkResult* Find(const std::vector<LinkResult>& results, const std::string& link) {
  for (const LinkResult& r : results) {
    if (r.link == link && r.error.empty()) return &r;
  }
  return nullptr;
}

int BenchTransport(const BenchTransportArgs& a) {
  if (!a.serve.empty()) return Serve(a);
  std::signal(SIGPIPE, SIG_IGN);  // a server process that died fails its pipe's write, not this process
  std::vector<std::string> links;
  for (const std::string& l : SplitComma(a.links)) {
    if (l != "tcp" && l != "tls" && l != "ucx" && l != "cuda_ipc") {
      std::fprintf(stderr, "vigil bench transport: --links: '%s' is not tcp, tls, ucx or cuda_ipc\n", l.c_str());
      return 2;
    }
    links.push_back(l);
  }
  std::vector<size_t> sizes;
  for (const std::string& s : SplitComma(a.sizes)) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != '\0' || v < 1 || v > (1 << 20)) {
      std::fprintf(stderr, "vigil bench transport: --sizes: '%s' is not a size in bytes (1..1048576)\n", s.c_str());
      return 2;
    }
    sizes.push_back(static_cast<size_t>(v));
  }
  if (a.memory != "host" && a.memory != "device") {
    std::fprintf(stderr, "vigil bench transport: --memory: '%s' is not host or device\n", a.memory.c_str());
    return 2;
  }
  if (links.empty() || sizes.empty()) {
    std::fprintf(stderr, "vigil bench transport: --links and --sizes must name at least one\n");
    return 2;
  }
  // A throwaway key and certificates, in a private folder.
  const char* tmp = std::getenv("TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / StrCat("vigil-bench-transport-", getpid());
  std::error_code ec;
  fs::create_directories(dir, ec);
  fs::permissions(dir, fs::perms::owner_all, ec);
  const std::string key_hex = tp::NewKeyHex();
  StatusOr<std::string> key = tp::ParseHexKey(key_hex, "bench key");
  {
    std::ofstream(dir / "keys.yaml") << kEdge << ": " << key_hex << "\n";
  }
  if (std::find(links.begin(), links.end(), "tls") != links.end()) {
    if (StatusOr<transport::ThrowawayCerts> certs = transport::MakeThrowawayCerts(CertsDir(dir.string())); !certs.ok()) {
      std::fprintf(stderr, "vigil bench transport: %s\n", std::string(certs.status().message()).c_str());
      fs::remove_all(dir, ec);
      return 1;
    }
  }
  std::printf("vigil bench transport: client Link -> Receiver in a second process on 127.0.0.1; the receiver acks "
              "each Report at once (no storage: the transport alone)\n");
  std::printf("latency: ping-pong, %d round trips after %d, one-way = RTT/2; throughput: window %d, one Report per "
              "Send, up to %d messages or %.1f s; cpu: client + server process time per message\n\n",
              a.iters, a.warmup, a.window, a.stream_messages, a.stream_seconds);
  std::printf("rows in %s memory%s; one-way: client Send -> server handler, CLOCK_MONOTONIC stamps (same host)\n\n",
              a.memory.c_str(),
              a.memory == "device" ? " (cuda:0; links other than cuda_ipc download them: D2H, send, then H2D at "
                                     "the server)" : "");
  std::printf("%-8s %7s %7s %6s %9s %9s %9s %9s %9s %11s %9s %9s %9s %9s\n", "link", "size", "frame B", "rows",
              "rtt/2 p50", "p99", "1-way p50", "p99", "max", "msgs/s", "MiB/s", "cpu cli", "cpu srv", "cpu us");
  std::fflush(stdout);
  std::vector<LinkResult> results;
  bool failed = false;
  for (const std::string& kind : links) {
#ifndef VIGIL_HAVE_UCX
    if (kind == "ucx") {
      std::printf("ucx   skipped: this vigil was built without UCX (VIGIL_WITH_UCX, Debian libucx-dev)\n");
      continue;
    }
#endif
    LinkResult r = RunLink(a, kind, sizes, dir.string(), *key);
    for (const SizeResult& s : r.sizes) {
      std::printf("%-8s %7zu %7zu %6zu %9.1f %9.1f %9.1f %9.1f %9.1f %11.0f %9.1f %9.2f %9.2f %9.2f\n", kind.c_str(),
                  s.size, s.frame_bytes, s.rows, s.latency_us.p50, s.latency_us.p99, s.one_way_us.p50,
                  s.one_way_us.p99, s.one_way_us.max, s.messages_per_s, s.mib_per_s, s.cpu_client_us, s.cpu_server_us,
                  s.cpu_client_us + s.cpu_server_us);
    }
    if (!r.transports.empty()) std::printf("      %s: transports under the link: %s\n", kind.c_str(), r.transports.c_str());
    if (!r.error.empty()) {
      std::printf("      %s failed: %s\n", kind.c_str(), r.error.c_str());
      failed = true;
    }
    std::fflush(stdout);
    results.push_back(std::move(r));
  }
  std::printf("\nopen (connect + Hello/Challenge/Auth/Welcome), median us\n");
  std::printf("%-8s %6s %10s %12s %10s\n", "link", "opens", "with key", "without key", "auth cost");
  for (const LinkResult& r : results) {
    if (r.opens == 0) continue;
    std::printf("%-8s %6d %10.1f %12.1f %10.1f\n", r.link.c_str(), r.opens, r.open_keyed_us, r.open_unkeyed_us,
                r.open_keyed_us - r.open_unkeyed_us);
  }
  nlohmann::json tls_cost;
  const LinkResult* tcp = Find(results, "tcp");
  const LinkResult* tls = Find(results, "tls");
  if (tcp != nullptr && tls != nullptr) {
    tls_cost["open_us"] = tls->open_keyed_us - tcp->open_keyed_us;
    tls_cost["cpu_us_per_message"] = nlohmann::json::array();
    std::printf("\nTLS: handshake share of an open (tls - tcp, with key): %.1f us\n", tls->open_keyed_us - tcp->open_keyed_us);
    std::printf("TLS cost per message, cpu us (tls - tcp, client + server):");
    for (size_t i = 0; i < tcp->sizes.size() && i < tls->sizes.size(); ++i) {
      const double d = tls->sizes[i].cpu_client_us + tls->sizes[i].cpu_server_us - tcp->sizes[i].cpu_client_us -
                       tcp->sizes[i].cpu_server_us;
      tls_cost["cpu_us_per_message"].push_back({{"size", tcp->sizes[i].size}, {"us", d}});
      std::printf(" %zu B: %.2f;", tcp->sizes[i].size, d);
    }
    std::printf("\n");
  }
  if (!a.json_file.empty()) {
    nlohmann::json out;
    out["method"] = {
        {"server", "a second process (this binary), Receiver with keys; handler acks each Report at once, no storage"},
        {"iters", a.iters},
        {"warmup", a.warmup},
        {"window", a.window},
        {"stream_messages", a.stream_messages},
        {"stream_seconds", a.stream_seconds},
        {"latency", "one-way = round trip / 2, us"},
        {"one_way", "client Send -> server handler, CLOCK_MONOTONIC stamps in publish_ns, us"},
        {"memory", a.memory},
        {"ring_device", a.ring_device},
        {"ring_linger_us", a.ring_linger_us},
        {"cpu", "getrusage user+system of each process over the throughput phase / messages, us"}};
    out["cpus"] = std::thread::hardware_concurrency();
    out["links"] = nlohmann::json::array();
    for (const LinkResult& r : results) out["links"].push_back(ToJson(r));
    if (!tls_cost.is_null()) out["tls_cost"] = tls_cost;
    std::ofstream f(a.json_file);
    f << out.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "vigil bench transport: cannot write %s\n", a.json_file.c_str());
      failed = true;
    }
  }
  fs::remove_all(dir, ec);
  return failed ? 1 : 0;
}

}  // namespace

void AddBenchTransportCommand(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<BenchTransportArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "transport", "One-way latency (RTT/2, us), messages/s and CPU us per message of the report links (tcp, tls, ucx, cuda_ipc), "
                   "client Link against a Receiver in a second process; the cost of authentication per connection "
                   "and of TLS per message");
  cmd->add_option("--links", a->links, "links to measure, in order: tcp, tls, ucx")->capture_default_str();
  cmd->add_option("--sizes", a->sizes, "Report frame sizes in bytes (smallest possible: 109)")->capture_default_str();
  cmd->add_option("--iters", a->iters, "timed round trips per size")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed round trips first")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--window", a->window, "throughput: Reports in flight at most")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--stream-messages", a->stream_messages, "throughput: messages per size at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--stream-seconds", a->stream_seconds, "throughput: seconds per size at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--opens", a->opens, "Link::Open timings with and without a key, each (ucx: a fifth)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--memory", a->memory, "where the rows live on the edge: host, or device (cuda:0: cuda_ipc copies "
                  "device to device; other links download, send, and the server uploads)")->capture_default_str();
  cmd->add_option("--ring-device", a->ring_device, "cuda_ipc: the aggregator's ring, cuda:N or host")
      ->capture_default_str();
  cmd->add_option("--ring-linger-us", a->ring_linger_us,
                  "cuda_ipc: how long the edge's resident publisher kernel waits for the next slot (0: a kernel "
                  "launch per slot)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--json", a->json_file, "also write one JSON object to this file");
  cmd->add_option("--serve", a->serve, "internal: the server process of this benchmark")->group("");
  cmd->add_option("--dir", a->dir, "internal: the server's folder")->group("");
  cmd->callback([a, exit_code] { *exit_code = BenchTransport(*a); });
}

}  // namespace vigil::cli
