// The hot standby's picture ring in GPU memory (replication/frame_ring.h, memory cuda:0): NVDEC-like NV12
// pictures (pitched planes in device memory, odd sizes too) go device to device into the standby's GPU ring and
// arrive in order, bit for bit, with their matrix and range; a CPU-decoded BGR picture is uploaded and comes back
// the same; the standby's copies outlive the primary. The standby's half runs in a child process (this binary
// again, FrameRingStandbyProcess.Serve: CUDA IPC handles do not open in the process that exported them). Skips
// without a GPU; scripts/gpu-check.sh runs it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "testing/eventually.h"
#include "testing/require_gpu.h"
#include "vigil/replication/frame_ring.h"

namespace vigil::replication {
namespace {

using std::chrono::milliseconds;

uint64_t Fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string Hex(const std::string& bytes) {
  static constexpr char k[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += k[c >> 4];
    out += k[c & 15];
  }
  return out;
}
std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// The standby's half, started by the test below with VIGIL_FRAME_RING=<socket> and VIGIL_FRAME_TOKEN=<hex>:
// a ring of 4 slots of 8 MiB on cuda:0; prints "ready", then per picture "got <seq> <gpu|bgr> <fnv of the packed
// pixels> <matrix> <full_range> <device>"; on "drain" reads what is left and prints "drained"; ends on "quit"/EOF.
TEST(FrameRingStandbyProcess, Serve) {
  const char* socket = std::getenv("VIGIL_FRAME_RING");
  if (socket == nullptr) GTEST_SKIP() << "the standby's half of the frame-ring GPU test (it starts it)";
  std::mutex mu;
  std::vector<MirroredFrame> kept;  // the window: held until the end (the copies must outlive the primary)
  FrameRingOptions o;
  o.socket = socket;
  o.token = Unhex(std::getenv("VIGIL_FRAME_TOKEN"));
  o.slots = 4;
  o.slot_bytes = 8u << 20;
  o.memory = "cuda:0";
  o.on_frame = [&](MirroredFrame&& f) {
    std::vector<uint8_t> host;
    if (f.gpu) {
      host.resize(f.gpu->bytes);
      EXPECT_EQ(cudaMemcpy(host.data(), f.gpu->data, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      host = f.bgr;
    }
    std::printf("got %llu %s %llu %d %d %d\n", static_cast<unsigned long long>(f.seq), f.gpu ? "gpu" : "bgr",
                static_cast<unsigned long long>(Fnv(host.data(), host.size())), f.gpu ? f.gpu->matrix : -1,
                f.gpu ? int(f.gpu->full_range) : -1, f.gpu ? f.gpu->device : -1);
    std::fflush(stdout);
    std::lock_guard lock(mu);
    kept.push_back(std::move(f));
  };
  StatusOr<std::unique_ptr<FrameRing>> ring = FrameRing::Connect(std::move(o), milliseconds(10000));
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
    if (line == "drain") {
      (*ring)->Drain();
      std::printf("drained %llu %llu\n", static_cast<unsigned long long>((*ring)->stats().received),
                  static_cast<unsigned long long>((*ring)->stats().rejected));
      std::fflush(stdout);
    }
  }
}

class Standby {
 public:
  Standby(const std::string& socket, const std::string& token) {
    int in[2], out[2];
    EXPECT_EQ(pipe(in), 0);
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {  // exec at once: nothing of this process's CUDA state is used in the child
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      setenv("VIGIL_FRAME_RING", socket.c_str(), 1);
      setenv("VIGIL_FRAME_TOKEN", Hex(token).c_str(), 1);
      execl("/proc/self/exe", "frame-ring-standby", "--gtest_filter=FrameRingStandbyProcess.Serve", nullptr);
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
  ~Standby() {
    if (to_ >= 0) {
      (void)!write(to_, "quit\n", 5);
      close(to_);
    }
    if (from_ != nullptr) std::fclose(from_);
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
  }
  bool ready() const { return ready_; }
  void Say(const char* s) { (void)!write(to_, s, std::strlen(s)); }
  std::string Line() {  // the child's gtest output passes by; "" at EOF
    char buf[512];
    if (std::fgets(buf, sizeof buf, from_) == nullptr) return "";
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s.empty() ? " " : s;
  }
  std::string Next(const std::string& prefix) {
    std::string l;
    while (!(l = Line()).empty() && !l.starts_with(prefix)) {
    }
    return l;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
  bool ready_ = false;
};

// An NV12 picture in pitched device memory (as NVDEC leaves one), and its packed bytes on the host.
struct DevicePicture {
  uint32_t w, h;
  size_t y_pitch, uv_pitch;
  void* y = nullptr;
  void* uv = nullptr;
  std::vector<uint8_t> packed;
  ~DevicePicture() {
    cudaFree(y);
    cudaFree(uv);
  }
};
std::unique_ptr<DevicePicture> MakeNv12(uint32_t w, uint32_t h, uint64_t seed) {
  auto p = std::make_unique<DevicePicture>();
  p->w = w;
  p->h = h;
  const size_t uv_row = 2 * size_t{(w + 1) / 2}, uv_rows = (h + 1) / 2;
  p->y_pitch = (w + 255) / 256 * 256 + 256;  // wider than the picture: the padding must not travel
  p->uv_pitch = p->y_pitch;
  EXPECT_EQ(cudaMalloc(&p->y, p->y_pitch * h), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p->uv, p->uv_pitch * uv_rows), cudaSuccess);
  std::vector<uint8_t> y(p->y_pitch * h), uv(p->uv_pitch * uv_rows);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<uint8_t>((i * 7 + seed * 13) >> 1);
  for (size_t i = 0; i < uv.size(); ++i) uv[i] = static_cast<uint8_t>((i * 11 + seed * 5) >> 2);
  EXPECT_EQ(cudaMemcpy(p->y, y.data(), y.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p->uv, uv.data(), uv.size(), cudaMemcpyHostToDevice), cudaSuccess);
  for (uint32_t r = 0; r < h; ++r) p->packed.insert(p->packed.end(), y.begin() + r * p->y_pitch, y.begin() + r * p->y_pitch + w);
  for (size_t r = 0; r < uv_rows; ++r) {
    p->packed.insert(p->packed.end(), uv.begin() + r * p->uv_pitch, uv.begin() + r * p->uv_pitch + uv_row);
  }
  return p;
}

TEST(FrameRingGpu, Nv12PicturesGoDeviceToDeviceAndArriveBitForBit) {
  VIGIL_REQUIRE_GPU();
  FramePublisherOptions po;
  po.socket = "/tmp/vigil-frame-ring-gpu-" + std::to_string(::getpid()) + ".sock";
  StatusOr<std::unique_ptr<FramePublisher>> pub = FramePublisher::Listen(po);
  ASSERT_TRUE(pub.ok()) << pub.status();
  auto standby = std::make_unique<Standby>((*pub)->socket(), (*pub)->NewToken());
  ASSERT_TRUE(standby->ready());
  ASSERT_TRUE(testutil::Eventually([&] { return (*pub)->active(); }));
  ASSERT_TRUE((*pub)->in_gpu_memory());

  struct Want {
    uint64_t seq;
    std::string kind;
    uint64_t fnv;
    int matrix, full;
  };
  std::vector<Want> want;
  const std::vector<std::pair<uint32_t, uint32_t>> sizes = {{1920, 1080}, {1279, 719}, {640, 360}, {3, 3}};
  uint64_t seq = 0;
  for (int round = 0; round < 3; ++round) {
    for (const auto& [w, h] : sizes) {
      std::unique_ptr<DevicePicture> p = MakeNv12(w, h, seq);
      MirroredFrame m;
      m.stream = "cam0";
      m.run = 1;
      m.seq = seq;
      m.width = w;
      m.height = h;
      FramePublisher::DevicePicture d;
      d.device = 0;
      d.y = static_cast<const uint8_t*>(p->y);
      d.uv = static_cast<const uint8_t*>(p->uv);
      d.y_pitch = p->y_pitch;
      d.uv_pitch = p->uv_pitch;
      d.matrix = static_cast<int>(seq % 5);
      d.full_range = seq % 2 == 1;
      Status st;
      ASSERT_TRUE(testutil::Eventually([&] {
        st = (*pub)->WriteDevice(m, d);
        return !absl::IsResourceExhausted(st);  // 4 slots: wait for the standby's reader
      }));
      ASSERT_TRUE(st.ok()) << st;
      want.push_back({seq, "gpu", Fnv(p->packed.data(), p->packed.size()), d.matrix, d.full_range ? 1 : 0});
      ++seq;
    }
    // A CPU-decoded picture into the same ring: uploaded as BGR, kept on the host by the standby.
    std::vector<uint8_t> bgr(64 * 3 * 48);
    for (size_t i = 0; i < bgr.size(); ++i) bgr[i] = static_cast<uint8_t>(i * 3 + seq);
    MirroredFrame m;
    m.stream = "cam1";
    m.run = 1;
    m.seq = seq;
    m.width = 64;
    m.height = 48;
    Status st;
    ASSERT_TRUE(testutil::Eventually([&] {
      st = (*pub)->Write(m, bgr.data(), 64 * 3);
      return !absl::IsResourceExhausted(st);
    }));
    ASSERT_TRUE(st.ok()) << st;
    want.push_back({seq, "bgr", Fnv(bgr.data(), bgr.size()), -1, -1});
    ++seq;
  }
  // A picture larger than a GPU slot (8 MiB) is refused, named.
  {
    std::unique_ptr<DevicePicture> big = MakeNv12(3840, 2160, 99);  // 12.4 MB
    MirroredFrame m;
    m.stream = "cam0";
    m.width = 3840;
    m.height = 2160;
    FramePublisher::DevicePicture d{0, static_cast<const uint8_t*>(big->y), static_cast<const uint8_t*>(big->uv),
                                    big->y_pitch, big->uv_pitch, 1, false};
    const Status st = (*pub)->WriteDevice(m, d);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  }
  // The primary goes away before the standby has read everything: what it wrote is still read.
  pub->reset();
  standby->Say("drain\n");
  for (const Want& w : want) {
    const std::string got = standby->Next("got ");
    char kind[8] = {};
    unsigned long long s = 0, fnv = 0;
    int matrix = -2, full = -2, device = -2;
    ASSERT_EQ(std::sscanf(got.c_str(), "got %llu %7s %llu %d %d %d", &s, kind, &fnv, &matrix, &full, &device), 6) << got;
    EXPECT_EQ(s, w.seq);
    EXPECT_EQ(kind, w.kind) << "seq " << s;
    EXPECT_EQ(fnv, w.fnv) << "seq " << s << ": the pixels differ";
    EXPECT_EQ(matrix, w.matrix) << "seq " << s;
    EXPECT_EQ(full, w.full) << "seq " << s;
    if (w.kind == "gpu") {
      EXPECT_EQ(device, 0);
    }
  }
  const std::string drained = standby->Next("drained ");
  unsigned long long received = 0, rejected = 9;
  ASSERT_EQ(std::sscanf(drained.c_str(), "drained %llu %llu", &received, &rejected), 2) << drained;
  EXPECT_EQ(received, want.size());
  EXPECT_EQ(rejected, 0u);
}

}  // namespace
}  // namespace vigil::replication
