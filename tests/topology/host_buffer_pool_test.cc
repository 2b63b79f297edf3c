// HostBufferPool on this live machine: the buffers' NUMA policy and page location read back from the
// kernel (get_mempolicy, move_pages), exhaustion and waits counted, buffers reused, and the pinner hook
// exercised with a real page lock (mlock, read back from /proc/self/status VmLck).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "vigil/topology/host_buffer_pool.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// The first NUMA node with memory and allowed CPUs on this machine.
int LiveNode() {
  StatusOr<Topology> t = Discover({});
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return -1;
  for (const NumaNode& n : t->numa_nodes) {
    if (n.allowed && !Intersect(n.cpus, t->allowed_cpus).empty()) return n.os_index;
  }
  return -1;
}

// Binding forced on (also on a single-NUMA machine), DISABLE_NUMA_BIND cleared for the binder's creation.
Binder ActiveBinder() {
  const char* old = std::getenv("DISABLE_NUMA_BIND");
  const std::string saved = old ? old : "";
  unsetenv("DISABLE_NUMA_BIND");
  Binder b({.enabled = true, .bind_single_numa = true});
  if (old) setenv("DISABLE_NUMA_BIND", saved.c_str(), 1);
  return b;
}

struct KernelPolicy {
  int mode = -1;
  unsigned long nodes = 0;
};
KernelPolicy PolicyAt(const void* p) {
  KernelPolicy k;
  EXPECT_EQ(syscall(SYS_get_mempolicy, &k.mode, &k.nodes, sizeof(k.nodes) * 8, p, MPOL_F_ADDR), 0) << std::strerror(errno);
  return k;
}
// The node holding the page at `p`, from move_pages(2) with nodes = NULL (query only).
int PageNode(const void* p) {
  void* pages[1] = {const_cast<void*>(p)};
  int status[1] = {-1000};
  EXPECT_EQ(syscall(SYS_move_pages, 0, 1, pages, nullptr, status, 0), 0) << std::strerror(errno);
  return status[0];
}

// A kB field of /proc/self/status ("VmLck").
long StatusKb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return -1;
}

// AnonHugePages (kB) of the mapping that starts at `start`, from /proc/self/smaps.
long AnonHugeKb(const void* start) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool in_vma = false;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      in_vma = lo == reinterpret_cast<uintptr_t>(start);
    } else if (in_vma && line.rfind("AnonHugePages:", 0) == 0) {
      return std::strtol(line.c_str() + 14, nullptr, 10);
    }
  }
  return -1;
}

// A pinner that page-locks with mlock(2): the CPU-side equivalent of cudaHostRegister.
class MlockPinner final : public HostMemoryPinner {
 public:
  Status Pin(void* data, size_t bytes) override {
    ++pins;
    if (mlock(data, bytes) != 0) return absl::InternalError(StrCat("mlock: ", std::strerror(errno)));
    pinned_bytes = bytes;
    pinned_at = data;
    return absl::OkStatus();
  }
  void Unpin(void* data) override {
    ++unpins;
    unpinned_at = data;
    munlock(data, pinned_bytes);
  }
  std::string_view name() const override { return "mlock"; }
  int pins = 0, unpins = 0;
  size_t pinned_bytes = 0;
  void* pinned_at = nullptr;
  void* unpinned_at = nullptr;
};

class FailingPinner final : public HostMemoryPinner {
 public:
  Status Pin(void*, size_t) override { return absl::ResourceExhaustedError("test: no pinned memory left"); }
  void Unpin(void*) override { ++unpins; }
  std::string_view name() const override { return "failing"; }
  int unpins = 0;
};

TEST(HostBufferPool, BuffersAreBoundToTheNodeAndDisjoint) {
  const int node = LiveNode();
  ASSERT_GE(node, 0);
  Binder binder = ActiveBinder();
  ASSERT_TRUE(binder.active()) << binder.skip_reason();
  const size_t bytes = 3 * kPage + 100;  // not a page multiple: the stride rounds it up to 4 pages
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = bytes, .buffers = 3, .numa_node = node, .name = "t"});
  ASSERT_TRUE(pool.ok()) << pool.status();
  HostBufferPoolStats st = pool->stats();
  EXPECT_EQ(st.capacity, 3u);
  EXPECT_EQ(st.buffer_bytes, bytes);
  EXPECT_EQ(st.stride, 4 * kPage);
  EXPECT_EQ(st.slab_bytes, 12 * kPage);
  EXPECT_EQ(st.numa_node, node);
  EXPECT_FALSE(st.pinned);

  std::vector<PooledBuffer> held;
  for (size_t i = 0; i < 3; ++i) {
    StatusOr<PooledBuffer> b = pool->Acquire();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->index(), i) << "first acquires hand out the slab in order";
    EXPECT_EQ(b->size(), bytes);
    EXPECT_EQ(b->data(), static_cast<const char*>(pool->slab()) + i * 4 * kPage);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % kPage, 0u);
    std::memset(b->data(), static_cast<int>('a' + i), bytes);
    held.push_back(std::move(*b));
  }
  for (size_t i = 0; i < 3; ++i) {
    const auto* p = static_cast<const unsigned char*>(held[i].data());
    // Every buffer kept its own pattern (no overlap) and its first and last byte sit on `node`, bound there.
    EXPECT_EQ(p[0], 'a' + i);
    EXPECT_EQ(p[bytes - 1], 'a' + i);
    for (const unsigned char* q : {p, p + bytes - 1}) {
      const KernelPolicy k = PolicyAt(q);
      EXPECT_EQ(k.mode, MPOL_BIND);
      EXPECT_EQ(k.nodes, 1ul << node);
      EXPECT_EQ(PageNode(q), node);
    }
  }
  st = pool->stats();
  EXPECT_EQ(st.in_use, 3u);
  EXPECT_EQ(st.peak_in_use, 3u);
  EXPECT_EQ(st.acquired, 3u);
}

TEST(HostBufferPool, ExhaustionIsCountedAndWaitsEndWhenABufferReturns) {
  Binder binder = ActiveBinder();
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = 1000, .buffers = 2, .name = "small"});
  ASSERT_TRUE(pool.ok()) << pool.status();
  StatusOr<PooledBuffer> a = pool->Acquire();
  StatusOr<PooledBuffer> b = pool->Acquire();
  ASSERT_TRUE(a.ok() && b.ok());

  StatusOr<PooledBuffer> none = pool->Acquire();  // no wait
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("'small': all 2 buffers in use"));
  HostBufferPoolStats st = pool->stats();
  EXPECT_EQ(st.failures, 1u);
  EXPECT_EQ(st.waits, 0u);

  StatusOr<PooledBuffer> late = pool->Acquire(milliseconds(20));  // waits, times out
  EXPECT_EQ(late.status().code(), absl::StatusCode::kResourceExhausted);
  st = pool->stats();
  EXPECT_EQ(st.failures, 2u);
  EXPECT_EQ(st.waits, 1u);

  // A waiter gets the buffer another thread releases.
  void* const b_data = b->data();
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(50));
    b->Release();
  });
  StatusOr<PooledBuffer> got = pool->Acquire(std::chrono::seconds(30));
  releaser.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data(), b_data);
  st = pool->stats();
  EXPECT_EQ(st.waits, 2u);
  EXPECT_EQ(st.failures, 2u);
  EXPECT_EQ(st.acquired, 3u);
  EXPECT_EQ(st.in_use, 2u);
  EXPECT_EQ(st.peak_in_use, 2u);
}

TEST(HostBufferPool, ReleasedBuffersAreReusedMostRecentFirst) {
  Binder binder = ActiveBinder();
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = kPage, .buffers = 4});
  ASSERT_TRUE(pool.ok()) << pool.status();
  StatusOr<PooledBuffer> b0 = pool->Acquire(), b1 = pool->Acquire(), b2 = pool->Acquire();
  ASSERT_TRUE(b0.ok() && b1.ok() && b2.ok());
  void* const p1 = b1->data();
  std::memset(p1, 0x5a, kPage);
  b1->Release();
  b1->Release();  // idempotent
  EXPECT_TRUE(b1->empty());
  EXPECT_EQ(pool->stats().in_use, 2u);
  StatusOr<PooledBuffer> again = pool->Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), p1);
  EXPECT_EQ(again->index(), 1u);
  EXPECT_EQ(static_cast<unsigned char*>(again->data())[kPage - 1], 0x5a) << "a reused buffer is not cleared";

  // Moving a handle moves the ownership; destroying it returns the buffer.
  PooledBuffer moved = std::move(*again);
  EXPECT_TRUE(again->empty());
  EXPECT_EQ(moved.data(), p1);
  { PooledBuffer gone = std::move(moved); }
  EXPECT_EQ(pool->stats().in_use, 2u);
  EXPECT_EQ(pool->stats().acquired, 4u);
  EXPECT_EQ(pool->stats().peak_in_use, 3u);
}

TEST(HostBufferPool, ConcurrentUsersNeverShareABuffer) {
  Binder binder = ActiveBinder();
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = 64, .buffers = 3});
  ASSERT_TRUE(pool.ok()) << pool.status();
  constexpr int kThreads = 4, kRounds = 2000;
  std::atomic<int> clashes{0}, got{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        StatusOr<PooledBuffer> b = pool->Acquire(std::chrono::seconds(30));
        if (!b.ok()) continue;
        ++got;
        auto* owner = static_cast<volatile int*>(b->data());
        *owner = t;
        std::this_thread::yield();
        if (*owner != t) ++clashes;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(clashes.load(), 0);
  EXPECT_EQ(got.load(), kThreads * kRounds);
  const HostBufferPoolStats st = pool->stats();
  EXPECT_EQ(st.acquired, static_cast<uint64_t>(kThreads * kRounds));
  EXPECT_EQ(st.failures, 0u);
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_EQ(st.peak_in_use, 3u);
}

TEST(HostBufferPool, PinnerLocksTheSlabUntilTheLastBufferIsGone) {
  Binder binder = ActiveBinder();
  MlockPinner pinner;
  const long locked_before = StatusKb("VmLck");
  ASSERT_GE(locked_before, 0);
  PooledBuffer survivor;
  {
    StatusOr<HostBufferPool> pool =
        HostBufferPool::Create(binder, {.buffer_bytes = 64 * 1024, .buffers = 4, .pinner = &pinner});
    ASSERT_TRUE(pool.ok()) << pool.status();
    ASSERT_EQ(pinner.pins, 1);
    ASSERT_TRUE(pool->stats().pinned) << "mlock of 256 KiB failed (RLIMIT_MEMLOCK?)";
    EXPECT_EQ(pinner.pinned_at, pool->slab());
    EXPECT_EQ(pinner.pinned_bytes, 256u * 1024);
    EXPECT_EQ(StatusKb("VmLck") - locked_before, 256);
    StatusOr<PooledBuffer> b = pool->Acquire();
    ASSERT_TRUE(b.ok());
    survivor = std::move(*b);
  }
  // The pool object is gone; its buffer still works and the slab stays locked.
  EXPECT_EQ(pinner.unpins, 0);
  std::memset(survivor.data(), 1, survivor.size());
  EXPECT_EQ(StatusKb("VmLck") - locked_before, 256);
  survivor.Release();
  EXPECT_EQ(pinner.unpins, 1);
  EXPECT_EQ(pinner.unpinned_at, pinner.pinned_at);
  EXPECT_EQ(StatusKb("VmLck"), locked_before);
}

TEST(HostBufferPool, PinningFailureLeavesUsablePageableBuffers) {
  Binder binder = ActiveBinder();
  FailingPinner pinner;
  {
    StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = 4096, .buffers = 2, .pinner = &pinner});
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_FALSE(pool->stats().pinned);
    StatusOr<PooledBuffer> b = pool->Acquire();
    ASSERT_TRUE(b.ok());
    std::memset(b->data(), 7, b->size());
  }
  EXPECT_EQ(pinner.unpins, 0) << "nothing pinned, nothing to unpin";
}

TEST(HostBufferPool, HugePagesForALargeSlab) {
  Binder binder = ActiveBinder();
  const int node = LiveNode();
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(
      binder, {.buffer_bytes = 1920 * 1080 * 3, .buffers = 2, .numa_node = node, .huge_pages = true});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const HostBufferPoolStats st = pool->stats();
  const size_t two_mib = size_t{2} << 20;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->slab()) % two_mib, 0u);
  EXPECT_EQ(st.slab_bytes % two_mib, 0u);
  EXPECT_GE(st.slab_bytes, 2 * st.stride);
  EXPECT_EQ(st.numa_node, node);
  EXPECT_EQ(PolicyAt(pool->slab()).mode, MPOL_BIND);
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (mode.find("[never]") != std::string::npos || mode.empty()) {
    GTEST_SKIP() << "transparent huge pages are off on this machine (" << mode << ")";
  }
  EXPECT_TRUE(st.huge_pages);
  EXPECT_GT(AnonHugeKb(pool->slab()), 0) << "THP mode " << mode;

  // A small pool ignores the request (below one huge page).
  StatusOr<HostBufferPool> small = HostBufferPool::Create(binder, {.buffer_bytes = 4096, .buffers = 1, .huge_pages = true});
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE(small->stats().huge_pages);
  EXPECT_EQ(small->stats().slab_bytes, kPage);
}

TEST(HostBufferPool, DisableNumaBindGivesUnboundBuffers) {
  const char* old = std::getenv("DISABLE_NUMA_BIND");
  const std::string saved = old ? old : "";
  setenv("DISABLE_NUMA_BIND", "1", 1);
  Binder binder({.enabled = true, .bind_single_numa = true});
  if (old) setenv("DISABLE_NUMA_BIND", saved.c_str(), 1);
  else unsetenv("DISABLE_NUMA_BIND");
  ASSERT_FALSE(binder.active());
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = 8192, .buffers = 2, .numa_node = std::max(LiveNode(), 0)});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->stats().numa_node, -1);
  StatusOr<PooledBuffer> b = pool->Acquire();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(PolicyAt(b->data()).mode, MPOL_DEFAULT);
}

TEST(HostBufferPool, BadOptionsAreErrorsNamingThePool) {
  Binder binder = ActiveBinder();
  StatusOr<HostBufferPool> zero = HostBufferPool::Create(binder, {.buffer_bytes = 0, .buffers = 4, .name = "frames"});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("'frames'"));
  EXPECT_EQ(HostBufferPool::Create(binder, {.buffer_bytes = 10, .buffers = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostBufferPool::Create(binder, {.buffer_bytes = SIZE_MAX / 4, .buffers = 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  StatusOr<HostBufferPool> nowhere = HostBufferPool::Create(binder, {.buffer_bytes = 10, .buffers = 1, .numa_node = 4000, .name = "x"});
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nowhere.status().message()), HasSubstr("NUMA node 4000"));
}

}  // namespace
}  // namespace vigil::topology
