// The cuda_ipc link on a GPU ring (transport/cuda_ipc.h, src/transport/cuda_ring.cc): reports whose rows
// live in GPU memory go device to device into the aggregator's ring through the resident publisher kernel
// (or one launch per slot), arrive in order and bit for bit, and the kernel stays resident while slots
// keep coming. The aggregator's half runs in a child process (this binary again, RingServerProcess.Serve:
// CUDA IPC handles do not open in the process that exported them). Skips without a GPU;
// scripts/gpu-check.sh runs it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/infer/cuda_device.h"
#include "testing/require_gpu.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/link.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/receiver.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{10000};

// Rows of report `seq`: distinct per report and row, so a slot mixed up or a row torn shows.
std::vector<ReportDetection> RowsOf(uint64_t seq, size_t n) {
  std::vector<ReportDetection> rows;
  for (size_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(seq * 1000 + i);
    rows.push_back({f, f + 0.25f, f + 10, f + 20, 0.5f, static_cast<float>((seq + i) % 80)});
  }
  return rows;
}

// Admits every edge with epoch 1, checks every Report (consecutive seqs from 0, rows as RowsOf makes
// them), acknowledges it at once.
class Checker final : public ReceiverHandler {
 public:
  Status OnHello(const std::shared_ptr<Session>& s) override {
    Welcome w{1, {}};
    for (const HelloStream& hs : s->hello().streams) w.streams.push_back({hs.stream, hs.run, -1, -1});
    s->Admit(w);
    return absl::OkStatus();
  }
  void OnReport(const std::shared_ptr<Session>& s, Report r) override {
    (void)s->Enqueue(EncodeFrame(Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, static_cast<int64_t>(r.seq_last)}));
    std::lock_guard lock(mu_);
    if (r.seq_first == 0) next_ = 0;  // a new session of the test starts again from 0
    if (r.seq_first != next_ || r.detections != RowsOf(r.seq_first, r.detections.size())) ++wrong_;
    next_ = r.seq_first + 1;
    ++reports_;
  }
  void OnClose(const std::shared_ptr<Session>&, const Status&) override {}
  std::pair<uint64_t, uint64_t> Take() {
    std::lock_guard lock(mu_);
    return {std::exchange(reports_, 0), std::exchange(wrong_, 0)};
  }

 private:
  std::mutex mu_;
  uint64_t next_ = 0, reports_ = 0, wrong_ = 0;
};

// The aggregator's half, started by the tests below as a child process with VIGIL_RING_SERVE=<socket>:
// a cuda_ipc receiver with rings on cuda:0 (VIGIL_RING_SLOTS slots of 4 KiB). Prints "ready"; on "checked"
// prints "checked <reports> <wrong> <device reports> <slots rejected>" (since the last "checked"); ends on
// "quit" or EOF.
TEST(RingServerProcess, Serve) {
  const char* path = std::getenv("VIGIL_RING_SERVE");
  if (path == nullptr) GTEST_SKIP() << "the aggregator's half of the cuda_ipc GPU tests (they start it)";
  Checker checker;
  CudaIpcListenOptions o;
  o.path = path;
  o.device = std::getenv("VIGIL_RING_DEVICE") ? std::getenv("VIGIL_RING_DEVICE") : "cuda:0";  // host: a check of this half
  o.slots = static_cast<uint32_t>(std::atoi(std::getenv("VIGIL_RING_SLOTS") ? std::getenv("VIGIL_RING_SLOTS") : "64"));
  o.slot_bytes = 4096;
  StatusOr<std::unique_ptr<Listener>> l = CudaIpcListen(o);
  ASSERT_TRUE(l.ok()) << l.status();
  StatusOr<std::unique_ptr<Receiver>> rx = Receiver::Start({}, std::move(*l), &checker);
  ASSERT_TRUE(rx.ok()) << rx.status();
  std::printf("ready\n");
  std::fflush(stdout);
  CudaIpcCounters last = GetCudaIpcCounters();
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
    if (line != "checked") continue;
    const auto [reports, wrong] = checker.Take();
    const CudaIpcCounters now = GetCudaIpcCounters();
    std::printf("checked %llu %llu %llu %llu\n", static_cast<unsigned long long>(reports),
                static_cast<unsigned long long>(wrong),
                static_cast<unsigned long long>(now.device_reports - last.device_reports),
                static_cast<unsigned long long>(now.slots_rejected - last.slots_rejected));
    std::fflush(stdout);
    last = now;
  }
  (*rx)->Stop();
}

// The child process running RingServerProcess.Serve; stopped on destruction.
class Server {
 public:
  explicit Server(uint32_t slots) : path_("/tmp/vigil-ring-test-" + std::to_string(::getpid()) + ".sock") {
    int in[2], out[2];
    EXPECT_EQ(pipe(in), 0);
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {  // exec at once: nothing of this process's CUDA state is used in the child
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      setenv("VIGIL_RING_SERVE", path_.c_str(), 1);
      setenv("VIGIL_RING_SLOTS", std::to_string(slots).c_str(), 1);
      execl("/proc/self/exe", "ring-server", "--gtest_filter=RingServerProcess.Serve", nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = fdopen(out[0], "r");
    std::string l;
    while ((l = Line()) != "ready" && !l.empty()) {
    }
    ready_ = l == "ready";
  }
  ~Server() {
    if (to_ >= 0) {
      (void)!write(to_, "quit\n", 5);
      close(to_);
    }
    if (from_ != nullptr) std::fclose(from_);
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
  }
  bool ready() const { return ready_; }
  const std::string& path() const { return path_; }
  // {reports, wrong, device reports, slots rejected} since the last call.
  std::vector<unsigned long long> Checked() {
    (void)!write(to_, "checked\n", 8);
    std::string l;
    while (!(l = Line()).empty() && !l.starts_with("checked ")) {
    }
    std::vector<unsigned long long> v(4, ~0ull);
    std::sscanf(l.c_str(), "checked %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3]);
    return v;
  }

 private:
  std::string Line() {  // the child's gtest output passes by; "" at EOF
    char buf[512];
    if (std::fgets(buf, sizeof buf, from_) == nullptr) return "";
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s.empty() ? " " : s;
  }
  std::string path_;
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
  bool ready_ = false;
};

// A message whose rows are in GPU memory (cuda:0), as the edge's detector leaves them.
OutboxMessage DeviceMessage(uint64_t seq, size_t rows) {
  OutboxMessage m;
  m.report.stream = "cam0";
  m.report.run = 1;
  m.report.seq_first = m.report.seq_last = seq;
  m.report.kind = ReportKind::kEvent;
  m.report.rule = "crowd";
  m.report.width = 1920, m.report.height = 1080;
  if (rows == 0) return m;  // an event without detections: nothing in device memory
  const std::vector<ReportDetection> host = RowsOf(seq, rows);
  const size_t bytes = host.size() * sizeof(ReportDetection);
  void* dev = nullptr;
  EXPECT_EQ(cudaMalloc(&dev, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  DevicePayload p;
  p.count = static_cast<uint32_t>(rows);
  p.device = 0;
  p.device_rows = dev;
  p.keepalive = std::shared_ptr<void>(dev, [](void* d) { cudaFree(d); });
  p.download = [dev, bytes](ReportDetection* dst) {
    return cudaMemcpy(dst, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? absl::OkStatus()
                                                                              : absl::InternalError("download");
  };
  m.device = std::move(p);
  return m;
}

Hello EdgeHello() {
  Hello h;
  h.edge = "edge-gpu";
  for (int i = 0; i < 80; ++i) h.class_names.push_back("c" + std::to_string(i));
  h.streams = {{"cam0", 1}};
  return h;
}

// Waits until `n` acks arrived on `link`.
void WaitAcks(Link& link, size_t n) {
  size_t acks = 0;
  while (acks < n) {
    StatusOr<std::optional<Message>> m = link.Receive(kTimeout);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(m->has_value()) << "no ack within " << kTimeout.count() << " ms";
    if (std::holds_alternative<Ack>(**m)) ++acks;
    ASSERT_FALSE(std::holds_alternative<Reject>(**m)) << std::get<Reject>(**m).detail;
  }
}

class RingPublisher : public ::testing::TestWithParam<uint32_t> {};

// `linger_us` 0: a kernel launch per slot; otherwise the resident publisher.
TEST_P(RingPublisher, DeviceRowsArriveInOrderBitForBit) {
  VIGIL_REQUIRE_GPU();
  const uint32_t linger_us = GetParam();
  Server server(8);  // fewer slots than a burst: the edge waits for slots, jobs wrap the publisher's queue
  ASSERT_TRUE(server.ready());
  // One at a time (each acked before the next), then bursts of 32 in one Send, sizes 0..300 rows
  // (up to 7 KB: two slots). All made first: cudaMalloc may wait for the device, resident kernel included.
  std::vector<OutboxMessage> sent;
  for (uint64_t seq = 0; seq < 200; ++seq) sent.push_back(DeviceMessage(seq, seq * 37 % 170));
  for (uint64_t seq = 200; seq < 200 + 20 * 32; ++seq) sent.push_back(DeviceMessage(seq, seq * 53 % 301));
  const CudaIpcCounters before = GetCudaIpcCounters();
  std::unique_ptr<Link> link = MakeCudaIpcLink(server.path(), "", 0, linger_us);
  const StatusOr<Welcome> w = link->Open(EdgeHello(), kTimeout);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(link->transports(), "cuda_ipc");
  for (size_t k = 0; k < 200; ++k) {
    const OutboxMessage* p = &sent[k];
    ASSERT_TRUE(link->Send(std::span<const OutboxMessage* const>(&p, 1), kTimeout).ok());
    WaitAcks(*link, 1);
  }
  for (size_t first = 200; first < sent.size(); first += 32) {
    std::vector<const OutboxMessage*> ptrs;
    for (size_t k = first; k < first + 32; ++k) ptrs.push_back(&sent[k]);
    ASSERT_TRUE(link->Send(ptrs, kTimeout).ok());
    WaitAcks(*link, ptrs.size());
  }
  // A report whose rows fit one slot goes device to device; a larger one is downloaded and spans slots.
  size_t fit = 0, with_rows = 0;
  for (const OutboxMessage& m : sent) {
    with_rows += m.device.has_value();
    fit += m.device.has_value() && m.device->count <= 150;  // 3.6 KB of rows and a header: one 4 KiB slot
  }
  const std::vector<unsigned long long> c = server.Checked();
  EXPECT_EQ(c[0], sent.size());  // reports
  EXPECT_EQ(c[1], 0u);           // out of order, or rows unlike those sent
  EXPECT_GE(c[2], fit);          // taken from the GPU ring's device-report slots
  EXPECT_LT(c[2], with_rows);
  EXPECT_EQ(c[3], 0u);           // slots rejected
  const CudaIpcCounters after = GetCudaIpcCounters();
  EXPECT_EQ(after.device_rows_sent - before.device_rows_sent, c[2]);
  const uint64_t launches = after.publisher_launches - before.publisher_launches;
  if (linger_us == 0) {
    EXPECT_EQ(launches, 0u);
  } else {
    // Every ack round trip is far below the 100 ms linger: the kernel never leaves between reports (a
    // second launch at most, when the first one's start races the first post).
    EXPECT_GE(launches, 1u);
    EXPECT_LE(launches, 2u);
  }
  link->Close();
}

INSTANTIATE_TEST_SUITE_P(Linger, RingPublisher, ::testing::Values(0u, 100000u),
                         [](const auto& param_info) { return param_info.param == 0 ? std::string("launch_per_slot") : std::string("resident"); });

// The resident publisher leaves after its linger and is launched again by the next report; a CUDA call
// that synchronises the whole device returns once it has left.
TEST(RingPublisherLinger, LeavesWhenIdleAndComesBackForTheNextReport) {
  VIGIL_REQUIRE_GPU();
  Server server(64);
  ASSERT_TRUE(server.ready());
  std::vector<OutboxMessage> sent;
  for (uint64_t seq = 0; seq < 3; ++seq) sent.push_back(DeviceMessage(seq, 100));
  const CudaIpcCounters before = GetCudaIpcCounters();
  std::unique_ptr<Link> link = MakeCudaIpcLink(server.path(), "", 0, 500);
  const StatusOr<Welcome> w = link->Open(EdgeHello(), kTimeout);
  ASSERT_TRUE(w.ok()) << w.status();
  for (uint64_t seq = 0; seq < 3; ++seq) {
    const OutboxMessage* p = &sent[seq];
    ASSERT_TRUE(link->Send(std::span<const OutboxMessage* const>(&p, 1), kTimeout).ok());
    WaitAcks(*link, 1);
    // The kernel leaves 0.5 ms after its last slot: the device-wide synchronisation returns then (it
    // would hang here if the kernel never left), and the next report launches a new one.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_EQ(GetCudaIpcCounters().publisher_launches - before.publisher_launches, 3u);
  const std::vector<unsigned long long> c = server.Checked();
  EXPECT_EQ(c[0], 3u);
  EXPECT_EQ(c[1], 0u);
  EXPECT_EQ(c[2], 3u);
  link->Close();
}

}  // namespace
}  // namespace vigil::transport
