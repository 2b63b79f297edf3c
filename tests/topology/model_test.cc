// The topology model, relations, reports and the planner on topologies built in code (no hwloc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "vigil/topology/planner.h"
#include "vigil/topology/report.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A machine built in code: `nodes` NUMA nodes (one per package) of `cores_per_node` cores with two
// PUs each; PUs of node n, core c are n*2C + c and n*2C + C + c (Linux-style SMT sibling numbering).
// Each node has one host bridge (id 100 + n) with one root port (id 200 + n).
Topology MakeMachine(int nodes, int cores_per_node) {
  Topology t;
  t.source = "in-code machine";
  for (int n = 0; n < nodes; ++n) {
    NumaNode node{n, 64ull << 30, {}, true, ""};
    Package pkg{n, {}, {n}};
    for (int c = 0; c < cores_per_node; ++c) {
      const int pu0 = n * 2 * cores_per_node + c, pu1 = pu0 + cores_per_node;
      t.cores.push_back({c, n, n, {pu0, pu1}});
      node.cpus.insert(node.cpus.end(), {pu0, pu1});
    }
    std::sort(node.cpus.begin(), node.cpus.end());
    pkg.cpus = node.cpus;
    t.cpus.insert(t.cpus.end(), node.cpus.begin(), node.cpus.end());
    t.numa_nodes.push_back(node);
    t.packages.push_back(pkg);
  }
  std::sort(t.cpus.begin(), t.cpus.end());
  t.allowed_cpus = t.cpus;
  return t;
}

PciLocation At(const Topology& t, int node, std::vector<uint64_t> below_root_port, std::string bus) {
  PciLocation loc;
  loc.bus_id = std::move(bus);
  loc.bridges = {static_cast<uint64_t>(100 + node), static_cast<uint64_t>(200 + node)};
  loc.bridges.insert(loc.bridges.end(), below_root_port.begin(), below_root_port.end());
  loc.under_host_bridge = true;
  loc.numa_nodes = {node};
  loc.cpus = t.FindNumaNode(node)->cpus;
  return loc;
}

void AddGpu(Topology* t, PciLocation loc) {
  Gpu g;
  g.index = static_cast<int>(t->gpus.size());
  g.pci = std::move(loc);
  t->gpus.push_back(std::move(g));
}

std::vector<StreamSpec> Streams(int n, double fps, double gflop) {
  std::vector<StreamSpec> s;
  for (int i = 0; i < n; ++i) s.push_back({"s" + std::to_string(i), 1280, 720, fps, gflop});
  return s;
}

TEST(CpuList, FormatsLinuxCpulist) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({3}), "3");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({0, 2, 4}), "0,2,4");
  EXPECT_EQ(FormatCpuList({0, 1, 5}, '_'), "0-1_5");
  EXPECT_THAT(Intersect({0, 1, 2, 5, 9}, {1, 2, 3, 9}), ElementsAre(1, 2, 9));
}

TEST(PciBusId, Normalizes) {
  EXPECT_EQ(*NormalizePciBusId("84:00.0"), "0000:84:00.0");
  EXPECT_EQ(*NormalizePciBusId("00000000:84:00.0"), "0000:84:00.0");  // NVML's 8-digit domain
  EXPECT_EQ(*NormalizePciBusId("0000:3B:1f.7"), "0000:3b:1f.7");
  EXPECT_EQ(*NormalizePciBusId("0001:00:00.1"), "0001:00:00.1");
  for (const char* bad : {"", "84:00", "zz:00.0", "0000:84:00.0 x", "0000:84:20.0", "0000:84:00.8", "1:2:3:4.0"}) {
    SCOPED_TRACE(bad);
    StatusOr<std::string> r = NormalizePciBusId(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// Bridge ids: host bridge 100+n with root port 200+n (MakeMachine's At). Below node 0's root port
// 200: a PCIe switch with upstream port 1 and downstream ports 2 and 3, and a second switch with
// upstream port 4 and downstream port 5, so that devices behind different switches meet at port 200.
TEST(Relation, NvidiaSmiCodesFromPciPaths) {
  Topology t = MakeMachine(2, 2);
  const PciLocation a = At(t, 0, {1, 2}, "0000:03:00.0");      // switch 1, port 2
  const PciLocation b = At(t, 0, {1, 3}, "0000:04:00.0");      // switch 1, port 3: one switch apart
  const PciLocation c = At(t, 0, {4, 5}, "0000:06:00.0");      // switch 4, port 5: meets a at root port 200
  const PciLocation nic = At(t, 0, {1, 2}, "0000:03:00.1");    // same downstream port as a
  PciLocation d = At(t, 0, {}, "0000:10:00.0");                // directly on another root port 210
  d.bridges[1] = 210;
  PciLocation e = At(t, 0, {}, "0000:20:00.0");                // another host bridge of node 0
  e.bridges = {110, 220};
  const PciLocation f = At(t, 1, {1, 2}, "0000:80:00.0");      // node 1

  EXPECT_EQ(PciRelation(a, b).link, Link::kPIX);
  EXPECT_EQ(PciRelation(a, nic).link, Link::kPIX);
  EXPECT_EQ(PciRelation(a, c).link, Link::kPXB);  // 2 bridges below the common root port on each side
  EXPECT_EQ(PciRelation(a, d).link, Link::kPHB);
  EXPECT_EQ(PciRelation(a, e).link, Link::kNODE);
  EXPECT_EQ(PciRelation(a, f).link, Link::kSYS);
  EXPECT_EQ(PciRelation(f, a).link, Link::kSYS);
  PciLocation unknown = e;
  unknown.numa_nodes.clear();  // no NUMA information: cannot claim NODE
  EXPECT_EQ(PciRelation(a, unknown).link, Link::kSYS);

  EXPECT_EQ(RelationCode({Link::kNVLink, 12}), "NV12");
  EXPECT_EQ(RelationCode({Link::kSelf}), "X");
  EXPECT_EQ(RelationCode({Link::kNODE}), "NODE");

  AddGpu(&t, a);
  AddGpu(&t, f);
  EXPECT_EQ(GpuRelation(t, 0, 1).link, Link::kSYS);
  EXPECT_EQ(GpuRelation(t, 1, 1).link, Link::kSelf);
  t.nvlinks = {{0, 4}, {4, 0}};
  EXPECT_EQ(RelationCode(GpuRelation(t, 0, 1)), "NV4");
}

TEST(Relation, NearestNicPrefersSwitchThenHostBridgeThenNodeThenRdma) {
  Topology t = MakeMachine(2, 2);
  AddGpu(&t, At(t, 0, {1, 2}, "0000:03:00.0"));
  EXPECT_EQ(NearestNic(t, 0), -1);  // no NIC at all
  PciLocation other_hb = At(t, 0, {}, "0000:20:00.0");
  other_hb.bridges = {110, 220};
  t.nics.push_back({"eth_far", {"eth_far"}, false, "Ethernet", At(t, 1, {}, "0000:81:00.0")});       // SYS
  t.nics.push_back({"mlx5_far", {"mlx5_far"}, true, "InfiniBand", At(t, 1, {}, "0000:82:00.0")});    // SYS, RDMA
  EXPECT_EQ(NearestNic(t, 0), 1);  // equal distance: the RDMA one
  t.nics.push_back({"eth_node", {"eth_node"}, false, "Ethernet", other_hb});                          // NODE
  EXPECT_EQ(NearestNic(t, 0), 2);
  PciLocation other_root_port = At(t, 0, {}, "0000:30:00.0");
  other_root_port.bridges[1] = 230;
  t.nics.push_back({"eth_phb", {"eth_phb"}, false, "Ethernet", other_root_port});                     // PHB
  EXPECT_EQ(GpuNicRelation(t, 0, 3).link, Link::kPHB);
  EXPECT_EQ(NearestNic(t, 0), 3);
  // {100, 200, 7} vs the GPU's {100, 200, 1, 2}: they meet at root port 200, with 1 and 2 bridges below.
  t.nics.push_back({"eth_pxb", {"eth_pxb"}, false, "Ethernet", At(t, 0, {7}, "0000:08:00.0")});
  EXPECT_EQ(GpuNicRelation(t, 0, 4).link, Link::kPXB);
  EXPECT_EQ(NearestNic(t, 0), 4);
  t.nics.push_back({"eth_pix", {"eth_pix"}, false, "Ethernet", At(t, 0, {1, 3}, "0000:04:00.0")});    // PIX
  EXPECT_EQ(NearestNic(t, 0), 5);
}

TEST(CudaOrdinals, AssignedByBusIdNotByOrder) {
  Topology t = MakeMachine(1, 2);
  AddGpu(&t, At(t, 0, {1}, "0000:03:00.0"));
  AddGpu(&t, At(t, 0, {2}, "0000:84:00.0"));
  t.gpus[0].cuda_ordinal = 7;  // stale value: replaced
  ASSERT_TRUE(AssignCudaOrdinals(&t, {{0, "00000000:84:00.0"}}).ok());
  EXPECT_EQ(t.gpus[0].cuda_ordinal, -1);
  EXPECT_EQ(t.gpus[1].cuda_ordinal, 0);
  Status st = AssignCudaOrdinals(&t, {{1, "0000:03:00.0"}, {0, "0000:05:00.0"}});
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("0000:05:00.0"));
  EXPECT_EQ(t.gpus[1].cuda_ordinal, 0);  // unchanged on error
  EXPECT_EQ(AssignCudaOrdinals(&t, {{0, "bogus"}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Labels, KubernetesSyntax) {
  for (const std::string& ok : {std::string(), std::string("0"), std::string("0_1"), std::string("mlx5_0"),
                                std::string("a.b-c_d"), std::string(63, 'x')}) {
    EXPECT_TRUE(IsValidLabelValue(ok)) << ok;
  }
  for (const std::string& bad : {std::string("0,1"), std::string("_a"), std::string("a-"), std::string("a b"),
                                 std::string("a/b"), std::string(64, 'x')}) {
    EXPECT_FALSE(IsValidLabelValue(bad)) << bad;
  }
  EXPECT_TRUE(IsValidLabelKey("vigil.io/numa-0-gpus"));
  EXPECT_TRUE(IsValidLabelKey("gpu-count"));
  EXPECT_FALSE(IsValidLabelKey("vigil.io/"));
  EXPECT_FALSE(IsValidLabelKey("Vigil.io/x"));
  EXPECT_FALSE(IsValidLabelKey("vigil..io/x"));

  // A NIC name with characters labels do not allow is cleaned, never emitted raw.
  Topology t = MakeMachine(2, 2);
  AddGpu(&t, At(t, 0, {1}, "0000:03:00.0"));
  AddGpu(&t, At(t, 1, {1}, "0000:83:00.0"));
  t.nics.push_back({"en p3s0:1", {"en p3s0:1"}, false, "Ethernet", At(t, 0, {1}, "0000:03:00.1")});
  const std::vector<std::string> labels = KubernetesLabels(t);
  EXPECT_THAT(labels, ::testing::Contains("vigil.io/gpu-0-nic=en_p3s0_1"));
  EXPECT_THAT(labels, ::testing::Contains("vigil.io/numa-1-gpus=1"));
  EXPECT_THAT(labels, ::testing::Contains("vigil.io/gpu-1-numa=1"));
  for (const std::string& l : labels) {
    const size_t eq = l.find('=');
    ASSERT_NE(eq, std::string::npos) << l;
    EXPECT_TRUE(IsValidLabelKey(l.substr(0, eq))) << l;
    EXPECT_TRUE(IsValidLabelValue(l.substr(eq + 1))) << l;
  }
}

// 2 nodes × 4 cores, 2 GPUs per node: each GPU gets 2 cores of its own node, worker on the first.
TEST(Planner, GpusGetDisjointLocalCores) {
  Topology t = MakeMachine(2, 4);  // node 0: cores (0,4) (1,5) (2,6) (3,7); node 1: (8,12) ... (11,15)
  for (int n = 0; n < 2; ++n) {
    AddGpu(&t, At(t, n, {1}, n ? "0000:81:00.0" : "0000:01:00.0"));
    AddGpu(&t, At(t, n, {2}, n ? "0000:82:00.0" : "0000:02:00.0"));
  }
  StatusOr<Plan> plan = MakePlan(t, Streams(4, 25, 4), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->devices.size(), 4u);
  const std::vector<CpuList> worker{{0, 4}, {2, 6}, {8, 12}, {10, 14}};
  const std::vector<CpuList> decode{{1, 5}, {3, 7}, {9, 13}, {11, 15}};
  for (int g = 0; g < 4; ++g) {
    SCOPED_TRACE(g);
    const DevicePlan& d = plan->devices[g];
    EXPECT_EQ(d.gpu, g);
    EXPECT_EQ(d.numa_node, g / 2);
    EXPECT_EQ(d.worker_cpus, worker[g]);
    EXPECT_EQ(d.decode_cpus, decode[g]);
    EXPECT_FALSE(d.shares_cores);
    EXPECT_EQ(d.worker_threads, 1);
    EXPECT_EQ(d.decode_threads, 1);                       // one stream each, one decode thread per stream
    EXPECT_EQ(d.staging_bytes, 1280u * 720u * 3u * 2u);   // one stream, two BGR frames
    EXPECT_DOUBLE_EQ(d.load_gflops, 100.0);               // 25 fps × 4 GFLOP
  }
  EXPECT_TRUE(plan->fits);
  EXPECT_TRUE(plan->notes.empty());
}

// Loads (fps 10): s0..s7 = 20, 50, 10, 40, 10, 30, 10, 10 GFLOP/s over 4 GPUs. By hand, largest first
// onto the least loaded (ties: fewer streams, then lower index):
//   50→g0, 40→g1, 30→g2, 20→g3 | 10(s2)→g3 (30) | 10(s4): g2=30 (1 stream) vs g3=30 (2) → g2 (40)
//   10(s6): g3=30 → g3 (40) | 10(s7): g1=40 (1 stream) → g1 (50).
TEST(Planner, LargestFirstOntoLeastLoaded) {
  Topology t = MakeMachine(1, 8);
  for (int g = 0; g < 4; ++g) AddGpu(&t, At(t, 0, {static_cast<uint64_t>(g + 1)}, "0000:0" + std::to_string(g + 1) + ":00.0"));
  std::vector<StreamSpec> s;
  for (double gf : {2.0, 5.0, 1.0, 4.0, 1.0, 3.0, 1.0, 1.0}) s.push_back({"s" + std::to_string(s.size()), 640, 480, 10, gf});
  PlanOptions o;
  o.decode_pool_threads = 3;
  StatusOr<Plan> plan = MakePlan(t, s, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->devices[0].streams, ElementsAre("s1"));
  EXPECT_THAT(plan->devices[1].streams, ElementsAre("s3", "s7"));
  EXPECT_THAT(plan->devices[2].streams, ElementsAre("s5", "s4"));
  EXPECT_THAT(plan->devices[3].streams, ElementsAre("s0", "s2", "s6"));
  EXPECT_THAT(plan->stream_device, ElementsAre(3, 0, 3, 1, 2, 2, 3, 1));
  EXPECT_DOUBLE_EQ(plan->devices[1].load_gflops, 50.0);
  EXPECT_DOUBLE_EQ(plan->devices[3].load_gflops, 40.0);
  for (const DevicePlan& d : plan->devices) EXPECT_EQ(d.decode_threads, 3);  // the pool replaces per-stream threads

  // Capacity 45 GFLOP/s: g0 and g1 (50) are over by 50/45 = 111.1%; s1 alone (50) exceeds a GPU;
  // in total 180 GFLOP/s fits 4 × 45 = 180 exactly, so the split is what fails.
  o.gpu_capacity_gflops = 45;
  plan = MakePlan(t, s, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->fits);
  ASSERT_EQ(plan->notes.size(), 4u);
  EXPECT_THAT(plan->notes[0], HasSubstr("GPU 0 (0000:01:00.0): load 50.0 GFLOP/s exceeds its capacity 45.0 GFLOP/s (111.1%)"));
  EXPECT_THAT(plan->notes[1], HasSubstr("GPU 1 (0000:02:00.0): load 50.0"));
  EXPECT_THAT(plan->notes[2], HasSubstr("stream 's1' alone needs 50.0 GFLOP/s, more than GPU 0"));
  EXPECT_THAT(plan->notes[3], HasSubstr("within the machine's capacity 180.0 GFLOP/s"));

  o.gpu_capacity_gflops = 50;  // every GPU at or under 50: fits, no notes
  plan = MakePlan(t, s, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->fits);
  EXPECT_TRUE(plan->notes.empty());
}

// Greedy onto the least loaded keeps max - min <= the largest single load (when the last stream went
// onto the final maximum, that device was the least loaded). Random loads, fresh seed.
TEST(Planner, BalanceBoundOnRandomLoads) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> gflop(0.5, 20), fps(5, 60);
  Topology t = MakeMachine(2, 6);
  const int gpus = 2 + static_cast<int>(rng() % 5);
  for (int g = 0; g < gpus; ++g) AddGpu(&t, At(t, g % 2, {static_cast<uint64_t>(g + 1)}, "0000:" + std::to_string(10 + g) + ":00.0"));
  std::vector<StreamSpec> s;
  const int n = 1 + static_cast<int>(rng() % 40);
  double largest = 0, total = 0;
  for (int i = 0; i < n; ++i) {
    s.push_back({"s" + std::to_string(i), 1920, 1080, fps(rng), gflop(rng)});
    largest = std::max(largest, s.back().fps * s.back().gflop_per_frame);
    total += s.back().fps * s.back().gflop_per_frame;
  }
  StatusOr<Plan> plan = MakePlan(t, s, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  double lo = 1e300, hi = 0, sum = 0;
  size_t placed = 0;
  for (const DevicePlan& d : plan->devices) {
    lo = std::min(lo, d.load_gflops);
    hi = std::max(hi, d.load_gflops);
    sum += d.load_gflops;
    placed += d.streams.size();
  }
  EXPECT_EQ(placed, s.size());
  EXPECT_NEAR(sum, total, 1e-9 * total);
  EXPECT_LE(hi - lo, largest + 1e-9);
}

TEST(Planner, FewerCoresThanGpusShareAndSaySo) {
  Topology t = MakeMachine(1, 1);  // one core: PUs 0 and 1
  AddGpu(&t, At(t, 0, {1}, "0000:01:00.0"));
  AddGpu(&t, At(t, 0, {2}, "0000:02:00.0"));
  StatusOr<Plan> plan = MakePlan(t, Streams(2, 30, 1), {});
  ASSERT_TRUE(plan.ok());
  for (const DevicePlan& d : plan->devices) {
    EXPECT_EQ(d.worker_cpus, (CpuList{0, 1}));
    EXPECT_EQ(d.decode_cpus, (CpuList{0, 1}));  // a one-core block serves workers and decoders
    EXPECT_TRUE(d.shares_cores);
  }
  ASSERT_EQ(plan->notes.size(), 2u);
  EXPECT_THAT(plan->notes[0], HasSubstr("cannot give each GPU its own cores: 2 of 2 GPUs share cores"));
  EXPECT_THAT(plan->notes[1], HasSubstr("NUMA node 0: 2 GPUs share 1 allowed cores (PUs 0-1), up to 2 GPUs per core"));
}

// Only allowed PUs are placed on; a GPU whose only local node has no allowed PU falls back to all
// allowed cores without NUMA binding; a locality spanning two nodes takes the less used one.
TEST(Planner, AllowedCpusAndOddLocalities) {
  Topology t = MakeMachine(3, 2);  // node 0: PUs 0-3, node 1: 4-7, node 2: 8-11
  t.allowed_cpus = {0, 1, 2, 5, 7};  // node 0: cores (0,2)→{0,2}, (1,3)→{1}; node 1: (4,6)→{}, (5,7)→{5,7}; node 2: none
  AddGpu(&t, At(t, 2, {1}, "0000:01:00.0"));          // node 2 has no allowed PU
  PciLocation both = At(t, 0, {2}, "0000:02:00.0");   // locality spans nodes 0 and 1
  both.numa_nodes = {0, 1};
  AddGpu(&t, both);
  AddGpu(&t, both);
  StatusOr<Plan> plan = MakePlan(t, Streams(3, 10, 1), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const DevicePlan& g0 = plan->devices[0];
  EXPECT_EQ(g0.numa_node, -1);
  EXPECT_EQ(g0.worker_cpus, (CpuList{0, 2}));  // first of all allowed cores: (0,2), (1), (5,7): 1 worker core
  EXPECT_EQ(g0.decode_cpus, (CpuList{1, 5, 7}));
  EXPECT_TRUE(g0.shares_cores);
  EXPECT_EQ(plan->devices[1].numa_node, 0);  // both nodes empty so far: the lower
  EXPECT_EQ(plan->devices[2].numa_node, 1);  // node 0 has one GPU now
  EXPECT_EQ(plan->devices[1].worker_cpus, (CpuList{0, 2}));
  EXPECT_EQ(plan->devices[1].decode_cpus, (CpuList{1}));
  EXPECT_EQ(plan->devices[2].worker_cpus, (CpuList{5, 7}));
  EXPECT_THAT(plan->notes, ::testing::Contains(HasSubstr("GPU 0 (0000:01:00.0): no allowed CPU in its locality (NUMA nodes 2)")));
  for (const DevicePlan& d : plan->devices) {
    for (int pu : d.worker_cpus) EXPECT_TRUE(std::binary_search(t.allowed_cpus.begin(), t.allowed_cpus.end(), pu)) << pu;
    for (int pu : d.decode_cpus) EXPECT_TRUE(std::binary_search(t.allowed_cpus.begin(), t.allowed_cpus.end(), pu)) << pu;
  }
}

TEST(Planner, CpuWorkersPerNumaNodeWithCpus) {
  Topology t = MakeMachine(2, 2);                 // node 0: PUs 0-3 (2 cores), node 1: 4-7
  t.numa_nodes.push_back({7, 16ull << 30, {}, true, ""});  // memory-only node
  t.cores.push_back({9, -1, -1, {20}});            // a PU in no NUMA node
  t.cpus.push_back(20);
  t.allowed_cpus.push_back(20);
  PlanOptions o;
  o.cpu_capacity_gflops_per_core = 10;
  StatusOr<Plan> plan = MakePlan(t, Streams(5, 10, 1), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->devices.size(), 3u);
  EXPECT_EQ(plan->devices[0].numa_node, 0);
  EXPECT_EQ(plan->devices[0].worker_cpus, (CpuList{0, 1, 2, 3}));
  EXPECT_EQ(plan->devices[0].worker_threads, 2);
  EXPECT_DOUBLE_EQ(plan->devices[0].capacity_gflops, 20);
  EXPECT_EQ(plan->devices[1].numa_node, 1);
  EXPECT_EQ(plan->devices[2].numa_node, -1);
  EXPECT_EQ(plan->devices[2].worker_cpus, (CpuList{20}));
  // Per-core balance, each stream 10 GFLOP/s, groups n0 (2 cores), n1 (2), x (PU 20, 1 core); the
  // figure is (load + 10) / cores, ties to fewer streams, then lower index:
  //   s0: n0 5, n1 5, x 10 → n0 | s1: n0 10, n1 5 → n1 | s2: 10, 10, 10, x has no stream → x
  //   s3: n0 10, n1 10, x 20 → n0 | s4: n0 15, n1 10, x 20 → n1.
  EXPECT_THAT(plan->stream_device, ElementsAre(0, 1, 2, 0, 1));
  EXPECT_TRUE(plan->fits);  // 20 ≤ 20, 20 ≤ 20, 10 ≤ 10
  for (const DevicePlan& d : plan->devices) EXPECT_NE(d.numa_node, 7);
}

TEST(Planner, RejectsBadInput) {
  Topology t = MakeMachine(1, 2);
  EXPECT_EQ(MakePlan(t, {{"a", 640, 480, 0, 1}}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(t, {{"a", 0, 480, 30, 1}}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  StatusOr<Plan> dup = MakePlan(t, {{"a", 640, 480, 30, 1}, {"a", 640, 480, 30, 1}}, {});
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("stream 'a': id used twice"));
  PlanOptions o;
  o.worker_threads_per_gpu = 0;
  EXPECT_EQ(MakePlan(t, {}, o).status().code(), absl::StatusCode::kInvalidArgument);
  t.allowed_cpus.clear();
  EXPECT_EQ(MakePlan(t, {}, {}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace vigil::topology
