// The Binder on this live machine. Thread affinity and memory policy are read back through hwloc and,
// independently, through the kernel (sched_getaffinity, get_mempolicy), so a binder that only
// pretended would fail.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "vigil/topology/binder.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {
namespace {

using ::testing::HasSubstr;

// DISABLE_NUMA_BIND set (or cleared) for one test, restored afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

CpuList KernelAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);  // 0 = the calling thread
  CpuList out;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) out.push_back(i);
  }
  return out;
}

// The kernel's memory policy for the page at `p` (mode, node mask) and the node holding it.
struct KernelPolicy {
  int mode = -1;
  unsigned long nodes = 0;
  int page_node = -1;
};
KernelPolicy KernelPolicyAt(void* p) {
  KernelPolicy k;
  EXPECT_EQ(syscall(SYS_get_mempolicy, &k.mode, &k.nodes, sizeof(k.nodes) * 8, p, MPOL_F_ADDR), 0);
  EXPECT_EQ(syscall(SYS_get_mempolicy, &k.page_node, nullptr, 0, p, MPOL_F_ADDR | MPOL_F_NODE), 0);
  return k;
}

// A live machine's allowed PUs and NUMA nodes with CPUs, from discovery.
struct Live {
  CpuList allowed;
  int node = -1;  // first NUMA node with memory and allowed CPUs
  size_t numa_nodes = 0;
};
Live LiveMachine() {
  Live l;
  StatusOr<Topology> t = Discover({});
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return l;
  l.allowed = t->allowed_cpus;
  l.numa_nodes = t->numa_nodes.size();
  for (const NumaNode& n : t->numa_nodes) {
    if (l.node < 0 && n.allowed && !Intersect(n.cpus, t->allowed_cpus).empty()) l.node = n.os_index;
  }
  return l;
}

TEST(Binder, BindsThreadAndReadsItBack) {
  ScopedEnv env("DISABLE_NUMA_BIND", nullptr);
  const Live live = LiveMachine();
  ASSERT_FALSE(live.allowed.empty());
  Binder binder({.enabled = true, .bind_single_numa = true});
  ASSERT_TRUE(binder.active()) << binder.skip_reason();
  // In a fresh thread, so the test runner's own affinity is left alone.
  std::thread([&] {
    const CpuList before = KernelAffinity();
    StatusOr<CpuList> hw_before = binder.CurrentThreadCpus();
    ASSERT_TRUE(hw_before.ok()) << hw_before.status();
    EXPECT_EQ(*hw_before, before);
    for (const CpuList& target : {CpuList{live.allowed.back()}, CpuList{live.allowed.front()}, live.allowed}) {
      SCOPED_TRACE(FormatCpuList(target));
      ASSERT_TRUE(binder.BindCurrentThread(target, "test thread").ok());
      EXPECT_EQ(KernelAffinity(), target);
      StatusOr<CpuList> hw = binder.CurrentThreadCpus();
      ASSERT_TRUE(hw.ok()) << hw.status();
      EXPECT_EQ(*hw, target);
    }
    // PUs outside the allowed cpuset: refused, affinity unchanged.
    Status st = binder.BindCurrentThread({live.allowed.back() + 1000}, "test thread");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(st.message()), HasSubstr("test thread"));
    EXPECT_EQ(KernelAffinity(), live.allowed);
    EXPECT_EQ(binder.BindCurrentThread({}, "test thread").code(), absl::StatusCode::kInvalidArgument);
  }).join();
}

TEST(Binder, AllocatesNumaLocalMemory) {
  ScopedEnv env("DISABLE_NUMA_BIND", nullptr);
  const Live live = LiveMachine();
  ASSERT_GE(live.node, 0);
  Binder binder({.enabled = true, .bind_single_numa = true});
  ASSERT_TRUE(binder.active()) << binder.skip_reason();
  const size_t bytes = (4u << 20) + 123;  // not a page multiple
  StatusOr<HostBuffer> buf = binder.AllocateHostBuffer(bytes, live.node);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(buf->size(), bytes);
  EXPECT_EQ(buf->numa_node(), live.node);
  ASSERT_NE(buf->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)), 0u);
  const auto* bytes_in = static_cast<const unsigned char*>(buf->data());
  EXPECT_EQ(bytes_in[0], 0);
  EXPECT_EQ(bytes_in[bytes - 1], 0);

  StatusOr<MemoryPlacement> placed = binder.QueryMemory(buf->data(), buf->size());
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->policy, "bind");
  EXPECT_EQ(placed->policy_nodes, (CpuList{live.node}));
  EXPECT_EQ(placed->location, (CpuList{live.node}));  // faulted in on allocation

  for (size_t off : {size_t{0}, bytes - 1}) {
    const KernelPolicy k = KernelPolicyAt(static_cast<char*>(buf->data()) + off);
    EXPECT_EQ(k.mode, MPOL_BIND);
    EXPECT_EQ(k.nodes, 1ul << live.node);
    EXPECT_EQ(k.page_node, live.node);
  }

  // Move keeps ownership in one place.
  HostBuffer moved = std::move(*buf);
  EXPECT_EQ(buf->data(), nullptr);
  EXPECT_EQ(moved.numa_node(), live.node);

  EXPECT_EQ(binder.AllocateHostBuffer(0, live.node).status().code(), absl::StatusCode::kInvalidArgument);
  StatusOr<HostBuffer> nowhere = binder.AllocateHostBuffer(4096, 4000);
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nowhere.status().message()), HasSubstr("NUMA node 4000"));
}

// DISABLE_NUMA_BIND=1: nothing is bound — the thread keeps its affinity, the buffer keeps the
// default policy — and the calls still succeed.
TEST(Binder, DisableNumaBindSkipsBinding) {
  ScopedEnv env("DISABLE_NUMA_BIND", "1");
  const Live live = LiveMachine();
  Binder binder({.enabled = true, .bind_single_numa = true});
  EXPECT_FALSE(binder.active());
  EXPECT_THAT(binder.skip_reason(), HasSubstr("DISABLE_NUMA_BIND=1"));
  std::thread([&] {
    const CpuList before = KernelAffinity();
    ASSERT_GE(before.size(), 2u) << "needs a thread allowed on 2+ PUs to show that nothing narrowed it";
    EXPECT_TRUE(binder.BindCurrentThread({before.back()}, "test thread").ok());
    EXPECT_EQ(KernelAffinity(), before);
    StatusOr<CpuList> hw = binder.CurrentThreadCpus();  // read-back still works
    ASSERT_TRUE(hw.ok());
    EXPECT_EQ(*hw, before);
  }).join();
  StatusOr<HostBuffer> buf = binder.AllocateHostBuffer(1 << 20, std::max(live.node, 0));
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(buf->numa_node(), -1);
  EXPECT_EQ(KernelPolicyAt(buf->data()).mode, MPOL_DEFAULT);
  StatusOr<MemoryPlacement> placed = binder.QueryMemory(buf->data(), buf->size());
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_NE(placed->policy, "bind");
}

TEST(Binder, OptionAndSingleNumaSkip) {
  ScopedEnv env("DISABLE_NUMA_BIND", nullptr);
  Binder off({.enabled = false});
  EXPECT_FALSE(off.active());
  EXPECT_THAT(off.skip_reason(), HasSubstr("bind: false"));

  const Live live = LiveMachine();
  Binder plain;  // default options: a single-NUMA machine skips, a multi-NUMA one binds
  EXPECT_EQ(plain.numa_nodes(), static_cast<int>(live.numa_nodes));
  if (live.numa_nodes == 1) {
    EXPECT_FALSE(plain.active());
    EXPECT_THAT(plain.skip_reason(), HasSubstr("single NUMA node"));
  } else {
    EXPECT_TRUE(plain.active()) << plain.skip_reason();
  }
}

}  // namespace
}  // namespace vigil::topology
