// CheckPlacement on this live process: threads named, bound and re-bound by the test itself and a bound
// host buffer pool, so that each verdict (ok, mismatch, unbound, exited, offspring) is provoked on purpose.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

#include "vigil/topology/host_buffer_pool.h"
#include "vigil/topology/placement_check.h"

namespace vigil::topology {
namespace {

using ::testing::HasSubstr;

void SetAffinity(pid_t tid, const CpuList& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  ASSERT_EQ(sched_setaffinity(tid, sizeof set, &set), 0);
}

// A thread that names itself, runs `body` and then sleeps until the object is destroyed.
class NamedThread {
 public:
  NamedThread(const char* name, std::function<void()> body = {}) {
    std::promise<pid_t> tid;
    std::future<pid_t> got = tid.get_future();
    thread_ = std::thread([this, name, body = std::move(body), tid = std::move(tid)]() mutable {
      pthread_setname_np(pthread_self(), name);
      if (body) body();
      tid.set_value(gettid());
      while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    tid_ = got.get();
  }
  ~NamedThread() {
    stop_ = true;
    thread_.join();
  }
  pid_t tid() const { return tid_; }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
  pid_t tid_ = 0;
};

struct Live {
  CpuList allowed;
  int node = -1;
};
Live LiveMachine() {
  Live l;
  StatusOr<Topology> t = Discover({});
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return l;
  l.allowed = t->allowed_cpus;
  for (const NumaNode& n : t->numa_nodes) {
    if (l.node < 0 && n.allowed && !Intersect(n.cpus, t->allowed_cpus).empty()) l.node = n.os_index;
  }
  return l;
}

TEST(PlacementReport, JsonRoundTrip) {
  PlacementReport r{1234, "this system", true, "", {0, 1},
                    {{1240, "vigil-worker", "worker", "", -1, {0, 1, 2}}, {1241, "vigil-dec-0", "decode", "door", 1, {3}}},
                    R"({"plan": {"devices": []}})"};
  const std::string text = PlacementReportToJson(r);
  StatusOr<PlacementReport> back = PlacementReportFromJson(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(back->pid, 1234);
  EXPECT_EQ(back->topology, "this system");
  EXPECT_TRUE(back->binding);
  EXPECT_EQ(back->memory_nodes, (std::vector<int>{0, 1}));
  ASSERT_EQ(back->threads.size(), 2u);
  EXPECT_EQ(back->threads[1].tid, 1241);
  EXPECT_EQ(back->threads[1].name, "vigil-dec-0");
  EXPECT_EQ(back->threads[1].stream, "door");
  EXPECT_EQ(back->threads[1].device, 1);
  EXPECT_EQ(back->threads[1].cpus, (CpuList{3}));
  EXPECT_THAT(back->plan_json, HasSubstr("\"devices\""));

  EXPECT_EQ(PlacementReportFromJson("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  StatusOr<PlacementReport> no_threads = PlacementReportFromJson(
      R"({"pid": 5, "topology": "x", "binding": {"active": true, "note": ""}, "memory_nodes": []})");
  EXPECT_THAT(std::string(no_threads.status().message()), HasSubstr("'threads'"));
  EXPECT_EQ(PlacementReportFromJson(R"({"pid": 0, "topology": "x", "binding": {"active": true, "note": ""},
                                       "memory_nodes": [], "threads": []})").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckPlacement, ThreadsAndBuffersOfThisProcess) {
  const Live live = LiveMachine();
  ASSERT_GE(live.allowed.size(), 2u) << "needs 2 PUs to tell a narrowed thread from an unbound one";
  ASSERT_GE(live.node, 0);
  const CpuList one{live.allowed.back()}, other{live.allowed.front()};

  NamedThread decode("vt-dec-0");
  SetAffinity(decode.tid(), one);
  // The worker creates a helper before it reports its tid: the helper inherits its name (and affinity).
  std::unique_ptr<NamedThread> helper;
  NamedThread worker("vt-worker", [&] { helper = std::make_unique<NamedThread>("vt-worker"); });
  unsetenv("DISABLE_NUMA_BIND");
  Binder binder({.enabled = true, .bind_single_numa = true});
  StatusOr<HostBufferPool> pool = HostBufferPool::Create(binder, {.buffer_bytes = 1 << 20, .buffers = 2, .numa_node = live.node});
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->stats().numa_node, live.node);

  PlacementReport r{getpid(), "this system", true, "", {live.node},
                    {{decode.tid(), "vt-dec-0", "decode", "door", 0, one}, {worker.tid(), "vt-worker", "worker", "", -1, live.allowed}},
                    ""};
  StatusOr<PlacementCheck> c = CheckPlacement(r);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->threads.size(), 3u) << FormatPlacementCheck(*c);
  EXPECT_EQ(c->threads[0].tid, decode.tid());
  EXPECT_EQ(c->threads[0].actual, one);
  EXPECT_EQ(c->threads[0].state, ThreadCheck::State::kOk);
  EXPECT_EQ(c->threads[1].tid, worker.tid());
  EXPECT_EQ(c->threads[1].state, ThreadCheck::State::kOk);
  EXPECT_FALSE(c->threads[2].listed);
  EXPECT_EQ(c->threads[2].tid, helper->tid());
  EXPECT_EQ(c->threads[2].planned, live.allowed);
  EXPECT_EQ(c->threads[2].state, ThreadCheck::State::kOk);
  const MappingCheck* slab = nullptr;
  for (const MappingCheck& m : c->mappings) {
    if (m.mapping.start == reinterpret_cast<uintptr_t>(pool->slab())) slab = &m;
  }
  ASSERT_NE(slab, nullptr) << FormatPlacementCheck(*c);
  EXPECT_EQ(slab->problem, "");
  EXPECT_EQ(slab->mapping.bytes_on_node.at(live.node), 2u << 20);
  EXPECT_GE(c->memory_on_node.at(live.node), 2u << 20);
  EXPECT_TRUE(c->ok()) << FormatPlacementCheck(*c);
  EXPECT_THAT(FormatPlacementCheck(*c), HasSubstr("verdict: match"));

  // Someone moves the decode thread and the worker's helper: both are mismatches.
  SetAffinity(decode.tid(), other);
  SetAffinity(helper->tid(), one);
  c = CheckPlacement(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->threads[0].state, ThreadCheck::State::kMismatch);
  EXPECT_EQ(c->threads[0].actual, other);
  EXPECT_EQ(c->threads[1].state, ThreadCheck::State::kOk);
  EXPECT_EQ(c->threads[2].state, ThreadCheck::State::kMismatch);
  EXPECT_FALSE(c->ok());
  EXPECT_THAT(FormatPlacementCheck(*c), HasSubstr("verdict: MISMATCH: 2 of 3 threads"));

  // A plan whose memory lives on another node: the pool's mapping no longer matches.
  SetAffinity(decode.tid(), one);
  SetAffinity(helper->tid(), live.allowed);
  PlacementReport elsewhere = r;
  elsewhere.memory_nodes = {live.node + 1};
  c = CheckPlacement(elsewhere);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_NE(c->mappings.size(), 0u);
  bool flagged = false;
  for (const MappingCheck& m : c->mappings) {
    if (m.mapping.start == reinterpret_cast<uintptr_t>(pool->slab())) {
      flagged = true;
      EXPECT_THAT(m.problem, HasSubstr("outside the plan's"));
    }
  }
  EXPECT_TRUE(flagged);
  EXPECT_FALSE(c->ok());

  // Binding off: the same threads are "unbound", never a mismatch.
  PlacementReport off = r;
  off.binding = false;
  off.binding_note = "disabled by DISABLE_NUMA_BIND=1";
  SetAffinity(decode.tid(), other);
  c = CheckPlacement(off);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->threads[0].state, ThreadCheck::State::kUnbound);
  EXPECT_TRUE(c->ok());
  EXPECT_THAT(FormatPlacementCheck(*c), HasSubstr("binding is off (disabled by DISABLE_NUMA_BIND=1)"));
  helper.reset();
}

TEST(CheckPlacement, ExitedThreadsAndMissingProcess) {
  pid_t gone = 0;
  std::thread([&] { gone = gettid(); }).join();
  PlacementReport r{getpid(), "this system", true, "", {}, {{gone, "vt-gone", "decode", "s", 0, {0}}}, ""};
  StatusOr<PlacementCheck> c = CheckPlacement(r);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->threads.size(), 1u);
  EXPECT_EQ(c->threads[0].state, ThreadCheck::State::kExited);
  EXPECT_TRUE(c->ok());
  r.pid = 0x7ffffff0;
  EXPECT_EQ(CheckPlacement(r).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vigil::topology
