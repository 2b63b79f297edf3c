// /proc and /sys parsers on fixture text with hand-computed expectations, then the readers on this
// live machine against independent sources (the Binder's own buffer, sched_getaffinity, the thread's
// CPU clock).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "vigil/topology/binder.h"
#include "vigil/topology/numa_stats.h"

namespace vigil::topology {
namespace {

using ::testing::HasSubstr;

TEST(NumaStats, ParseCpuList) {
  StatusOr<CpuList> l = ParseCpuList("0-3,8,10-11\n");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(*l, (CpuList{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList("5"), (CpuList{5}));
  EXPECT_EQ(*ParseCpuList("7,2-3,2"), (CpuList{2, 3, 7}));
  EXPECT_TRUE(ParseCpuList("")->empty());
  for (const char* bad : {"3-1", "a", "1,,2", "-1", "0-"}) {
    EXPECT_EQ(ParseCpuList(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// A two-node process: text, heap, a buffer bound to node 1, an interleaved one, a 2 MiB-page mapping
// preferring node 0, the stack, a weighted-interleave mapping, an untouched mapping.
constexpr const char* kNumaMaps =
    "00400000 default file=/usr/bin/vigil mapped=120 N0=100 N1=20 kernelpagesize_kB=4\n"
    "01e5a000 default heap anon=3000 dirty=3000 N0=2500 N1=500 kernelpagesize_kB=4\n"
    "7f1a00000000 bind:1 anon=1024 dirty=1024 active=0 N1=1024 kernelpagesize_kB=4\n"
    "7f1b00000000 interleave:0-1 anon=10 dirty=10 N0=5 N1=5 kernelpagesize_kB=4\n"
    "7f1c00000000 prefer:0 huge anon=2 dirty=2 N0=2 kernelpagesize_kB=2048\n"
    "7f1d00000000 default stack anon=9 dirty=9 N0=9 kernelpagesize_kB=4\n"
    "7f1e00000000 weighted interleave:0-1 anon=4 N0=2 N1=2 kernelpagesize_kB=4\n"
    "7f1f00000000 local\n"
    "7f2000000000 prefer (many):0-1 anon=1 N1=1 kernelpagesize_kB=4\n"
    "7f2100000000 bind=static:1 anon=3 N1=3 kernelpagesize_kB=4\n";

TEST(NumaStats, ParseNumaMaps) {
  StatusOr<NumaMaps> m = ParseNumaMaps(kNumaMaps);
  ASSERT_TRUE(m.ok()) << m.status();
  // Node 0: (100 + 2500 + 5 + 9 + 2) 4 KiB pages + 2 pages of 2 MiB = 2616 * 4096 + 4194304.
  // Node 1: (20 + 500 + 1024 + 5 + 2 + 1 + 3) 4 KiB pages = 1555 * 4096.
  EXPECT_EQ(m->bytes_on_node.size(), 2u);
  EXPECT_EQ(m->bytes_on_node.at(0), 14909440u);
  EXPECT_EQ(m->bytes_on_node.at(1), 6369280u);
  ASSERT_EQ(m->placed.size(), 6u);
  EXPECT_EQ(m->placed[0].start, 0x7f1a00000000u);
  EXPECT_EQ(m->placed[0].policy, "bind");
  EXPECT_EQ(m->placed[0].policy_nodes, (std::vector<int>{1}));
  EXPECT_EQ(m->placed[0].bytes_on_node, (std::map<int, uint64_t>{{1, 4194304}}));
  EXPECT_EQ(m->placed[1].policy, "interleave");
  EXPECT_EQ(m->placed[1].policy_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(m->placed[1].bytes_on_node, (std::map<int, uint64_t>{{0, 20480}, {1, 20480}}));
  EXPECT_EQ(m->placed[2].policy, "prefer");
  EXPECT_EQ(m->placed[2].bytes_on_node, (std::map<int, uint64_t>{{0, 4194304}}));
  EXPECT_EQ(m->placed[3].policy, "weighted interleave");
  EXPECT_EQ(m->placed[3].policy_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(m->placed[4].policy, "prefer (many)");
  EXPECT_EQ(m->placed[4].policy_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(m->placed[5].policy, "bind");
  EXPECT_EQ(m->placed[5].policy_nodes, (std::vector<int>{1}));
  EXPECT_EQ(m->placed[5].bytes_on_node, (std::map<int, uint64_t>{{1, 12288}}));

  EXPECT_TRUE(ParseNumaMaps("")->bytes_on_node.empty());
  StatusOr<NumaMaps> bad = ParseNumaMaps("00400000 default N0=1 kernelpagesize_kB=4\nzz default\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2"));
  EXPECT_EQ(ParseNumaMaps("00400000 default N0=3\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseNumaMaps("00400000 bind:x N0=3 kernelpagesize_kB=4\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NumaStats, ParseNumastat) {
  StatusOr<std::map<std::string, uint64_t>> s =
      ParseNumastat("numa_hit 1000\nnuma_miss 20\nnuma_foreign 5\ninterleave_hit 7\nlocal_node 990\nother_node 30\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::map<std::string, uint64_t>{{"numa_hit", 1000}, {"numa_miss", 20}, {"numa_foreign", 5},
                                                 {"interleave_hit", 7}, {"local_node", 990}, {"other_node", 30}}));
  EXPECT_EQ(ParseNumastat("numa_hit abc\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseNumastat("numa_hit 1 2\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NumaStats, ReadNumastatFromATree) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "vigil_numastat_tree";
  std::filesystem::remove_all(dir);
  for (int n : {0, 2}) {
    std::filesystem::create_directories(dir / ("node" + std::to_string(n)));
    std::ofstream(dir / ("node" + std::to_string(n)) / "numastat") << "numa_hit " << 100 + n << "\nother_node " << n << "\n";
  }
  std::ofstream(dir / "possible") << "0-3\n";  // not a node directory
  StatusOr<NumaStat> st = ReadNumastat(dir.string());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, (NumaStat{{0, {{"numa_hit", 100}, {"other_node", 0}}}, {2, {{"numa_hit", 102}, {"other_node", 2}}}}));
  EXPECT_TRUE(ReadNumastat((dir / "absent").string())->empty());
  std::filesystem::remove_all(dir);

  StatusOr<NumaStat> live = ReadNumastat();
  ASSERT_TRUE(live.ok()) << live.status();
  if (std::filesystem::exists("/sys/devices/system/node/node0/numastat")) {
    ASSERT_TRUE(live->count(0));
    EXPECT_GT(live->at(0).at("numa_hit"), 0u);
    EXPECT_TRUE(live->at(0).count("other_node"));
  }
}

// Fields: 1 pid, 2 (comm), 3 state, 4 ppid ... 14 utime, 15 stime ... 38 exit_signal, 39 processor.
constexpr const char* kTaskStat =
    "1234 (vigil (dec) 0) S 1 1234 1234 0 -1 4194368 100 0 0 0 250 37 0 0 20 0 9 0 12345 1000000 500 "
    "18446744073709551615 1 1 0 0 0 0 0 4096 1 0 0 0 17 3 0 0 0 0 0\n";

TEST(NumaStats, ParseTaskStat) {
  StatusOr<TaskStat> t = ParseTaskStat(kTaskStat);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->comm, "vigil (dec) 0");
  EXPECT_EQ(t->utime_ticks, 250u);
  EXPECT_EQ(t->stime_ticks, 37u);
  EXPECT_EQ(t->processor, 3);
  EXPECT_DOUBLE_EQ(CpuSeconds(*t), 287.0 / static_cast<double>(sysconf(_SC_CLK_TCK)));
  EXPECT_EQ(ParseTaskStat("1234 vigil S 1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTaskStat("1234 (x) S 1 2 3").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NumaStats, ReadTaskOfALiveThread) {
  std::thread([] {
    pthread_setname_np(pthread_self(), "vigil-test (1)");
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < until) {
    }
    StatusOr<TaskInfo> t = ReadTask(0, gettid());
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->stat.comm, "vigil-test (1)");
    const double clock_s = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    EXPECT_NEAR(CpuSeconds(t->stat), clock_s, 0.03) << "procfs ticks vs the thread's CPU clock";
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    CpuList expected;
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) expected.push_back(i);
    }
    EXPECT_EQ(t->cpus_allowed, expected);
    EXPECT_GE(t->stat.processor, 0);

    StatusOr<std::vector<TaskInfo>> all = ReadTasks(0);
    ASSERT_TRUE(all.ok()) << all.status();
    bool found = false;
    for (const TaskInfo& i : *all) found = found || (i.tid == gettid() && i.stat.comm == "vigil-test (1)");
    EXPECT_TRUE(found);
  }).join();
  EXPECT_EQ(ReadTask(0, 0x7ffffff0).status().code(), absl::StatusCode::kNotFound);
}

TEST(NumaStats, ReadNumaMapsSeesABoundBuffer) {
  unsetenv("DISABLE_NUMA_BIND");
  Binder binder({.enabled = true, .bind_single_numa = true});
  ASSERT_TRUE(binder.active()) << binder.skip_reason();
  StatusOr<Topology> topo = Discover({});
  ASSERT_TRUE(topo.ok());
  const int node = topo->numa_nodes.front().os_index;
  StatusOr<HostBuffer> buf = binder.AllocateHostBuffer(8 << 20, node);
  ASSERT_TRUE(buf.ok()) << buf.status();
  StatusOr<NumaMaps> maps = ReadNumaMaps(0);
  ASSERT_TRUE(maps.ok()) << maps.status();
  const NumaMapping* mine = nullptr;
  for (const NumaMapping& m : maps->placed) {
    if (m.start == reinterpret_cast<uintptr_t>(buf->data())) mine = &m;
  }
  ASSERT_NE(mine, nullptr) << "the bound buffer is not among the placed mappings";
  EXPECT_EQ(mine->policy, "bind");
  EXPECT_EQ(mine->policy_nodes, (std::vector<int>{node}));
  EXPECT_EQ(mine->bytes_on_node, (std::map<int, uint64_t>{{node, uint64_t{8} << 20}}));
  EXPECT_GE(maps->bytes_on_node.at(node), uint64_t{8} << 20);
}

}  // namespace
}  // namespace vigil::topology
