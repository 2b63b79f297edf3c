// Discovery and plans on recorded machines: the hwloc XML exports in ../shared/topologies (see
// SOURCES.md there). Expected values are read by hand from the XML (`lstopo-no-graphics --input FILE
// --whole-io -v` shows the same tree); the reasoning is next to each expectation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "vigil/topology/planner.h"
#include "vigil/topology/report.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TopologyDir() {
  const char* env = std::getenv("VIGIL_SOURCE_DIR");
  return std::string(env && *env ? env : VIGIL_SOURCE_DIR) + "/../shared/topologies";
}

#define LOAD_OR_SKIP(var, file)                                                                      \
  if (!std::filesystem::is_directory(TopologyDir()))                                                 \
    GTEST_SKIP() << "recorded topologies not found at " << TopologyDir() << " (set VIGIL_SOURCE_DIR)"; \
  StatusOr<Topology> var##_or = Discover({TopologyDir() + "/" + (file)});                            \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                                                   \
  const Topology& var = *var##_or

std::vector<StreamSpec> Streams(int n) {
  std::vector<StreamSpec> s;
  for (int i = 0; i < n; ++i) s.push_back({"cam" + std::to_string(i), 1920, 1080, 30, 8.7});
  return s;
}

bool Subset(const CpuList& a, const CpuList& b) { return std::includes(b.begin(), b.end(), a.begin(), a.end()); }

// Writes `text` to a file in the test's temp dir and returns its path.
std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// nvidiaDGX2.xml: Package P#0 holds NUMA node 0 and PUs 0-1; package P#1 node 1 and PUs 24-25 (a
// trimmed export). 16 PCI devices 10de:1db8 class 0302 with NVML OS devices nvml0..15; bus order
// 34,36,39,3b (host bridge [2b-3b]), 57,59,5c,5e ([4e-67]) under package 0, b7,b9,bc,be ([ae-c7]) and
// e0,e2,e5,e7 ([d7-e7]) under package 1. 12 PCI objects of subtype NVSwitch (10de:1ac2, one reads
// 0000:0000) at 61-67 and c1-c7. The NVLinkBandwidth matrix gives each GPU 6 links of 25000 MB/s to
// the 6 NVSwitches of its board, and no GPU-GPU entry.
TEST(Recorded, Dgx2Discovery) {
  LOAD_OR_SKIP(t, "nvidiaDGX2.xml");
  EXPECT_FALSE(t.is_this_system);
  EXPECT_EQ(t.packages.size(), 2u);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.numa_nodes[0].cpus, (CpuList{0, 1}));
  EXPECT_EQ(t.numa_nodes[1].cpus, (CpuList{24, 25}));
  EXPECT_EQ(t.numa_nodes[0].memory_bytes, 791244484ull * 1024);  // local_memory in the XML
  EXPECT_EQ(t.allowed_cpus, (CpuList{0, 1, 24, 25}));
  EXPECT_EQ(t.cores.size(), 4u);
  const std::vector<std::string> bus = {"34", "36", "39", "3b", "57", "59", "5c", "5e",
                                        "b7", "b9", "bc", "be", "e0", "e2", "e5", "e7"};
  ASSERT_EQ(t.gpus.size(), 16u);
  for (int g = 0; g < 16; ++g) {
    SCOPED_TRACE(g);
    EXPECT_EQ(t.gpus[g].pci.bus_id, "0000:" + bus[g] + ":00.0");
    EXPECT_EQ(t.gpus[g].nvml_index, g);  // nvmlN follows bus order on this machine
    EXPECT_EQ(t.gpus[g].cuda_ordinal, -1);
    EXPECT_EQ(t.gpus[g].device_id, 0x1db8);
    EXPECT_EQ(t.gpus[g].model, "Tesla V100-SXM3-32GB-H");
    EXPECT_EQ(t.gpus[g].pci.numa_nodes, (CpuList{g < 8 ? 0 : 1}));
  }
  EXPECT_TRUE(t.nics.empty());
  EXPECT_EQ(t.nvswitches, 12);
  EXPECT_THAT(t.notes, ::testing::Not(::testing::Contains(HasSubstr("NVLink"))));
  // Every pair reaches the other over its 6 NVSwitch links: NV6, as nvidia-smi prints on a DGX-2.
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 16; ++b) EXPECT_EQ(RelationCode(GpuRelation(t, a, b)), a == b ? "X" : "NV6") << a << "," << b;
  }
  // The PCIe tree underneath: 34 and 36 sit behind downstream ports 33:00.0 / 33:10.0 of one switch
  // (PIX); 34 and 39 meet at 2c:00.0, three bridges above each (PXB); 34 and 57 are on different host
  // bridges of socket 0 (NODE); 34 and b7 are on different sockets (SYS).
  EXPECT_EQ(PciRelation(t.gpus[0].pci, t.gpus[1].pci).link, Link::kPIX);
  EXPECT_EQ(PciRelation(t.gpus[0].pci, t.gpus[2].pci).link, Link::kPXB);
  EXPECT_EQ(PciRelation(t.gpus[0].pci, t.gpus[4].pci).link, Link::kNODE);
  EXPECT_EQ(PciRelation(t.gpus[0].pci, t.gpus[8].pci).link, Link::kSYS);
}

// 32 streams over 16 GPUs: 2 each. GPUs 0-7 are local to node 0 (socket 0: PUs 0-1), 8-15 to node 1
// (PUs 24-25). Each node has 2 cores for 8 GPUs: GPU k of a node takes core k mod 2, i.e. GPU 0 → PU 0,
// GPU 1 → PU 1, GPU 2 → PU 0, ..., GPU 8 → PU 24, GPU 9 → PU 25; the plan must say cores are shared.
TEST(Recorded, Dgx2Plan) {
  LOAD_OR_SKIP(t, "nvidiaDGX2.xml");
  StatusOr<Plan> plan = MakePlan(t, Streams(32), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->devices.size(), 16u);
  const CpuList socket0 = t.packages[0].cpus, socket1 = t.packages[1].cpus;
  ASSERT_EQ(socket0, (CpuList{0, 1}));
  ASSERT_EQ(socket1, (CpuList{24, 25}));
  for (int g = 0; g < 16; ++g) {
    SCOPED_TRACE(g);
    const DevicePlan& d = plan->devices[g];
    EXPECT_EQ(d.streams.size(), 2u);
    EXPECT_DOUBLE_EQ(d.load_gflops, 2 * 30 * 8.7);
    EXPECT_EQ(d.numa_node, g < 8 ? 0 : 1);
    EXPECT_TRUE(Subset(d.worker_cpus, g < 8 ? socket0 : socket1));
    EXPECT_TRUE(Subset(d.decode_cpus, g < 8 ? socket0 : socket1));
    EXPECT_EQ(d.worker_cpus, (CpuList{(g < 8 ? 0 : 24) + g % 2}));
    EXPECT_TRUE(d.shares_cores);
    EXPECT_EQ(d.nic, -1);
  }
  ASSERT_GE(plan->notes.size(), 3u);
  EXPECT_EQ(plan->notes[0], "cannot give each GPU its own cores: 16 of 16 GPUs share cores (4 allowed cores, 4 PUs in all)");
  EXPECT_THAT(plan->notes, ::testing::Contains("NUMA node 0: 8 GPUs share 2 allowed cores (PUs 0-1), up to 4 GPUs per core"));
  EXPECT_THAT(plan->notes, ::testing::Contains("NUMA node 1: 8 GPUs share 2 allowed cores (PUs 24-25), up to 4 GPUs per core"));
}

// 32em64t-2n8c2t-pci-normalio.xml: 2 packages, node 0 = PUs 0-7,16-23 (cores P#0-7 with SMT siblings
// +16), node 1 = PUs 8-15,24-31. GPUs 10de:1094 at 03:00.0 (package 0), 83:00.0 and 84:00.0
// (package 1); only 84:00.0 carries "cuda0". ConnectX-4 (15b3:1013, class 0207) with ib0 and mlx5_0
// sits below the same root port 80:03.0 as 84:00.0; eth0/eth1 (81:00.0/.1) below root port 80:01.0,
// and 83:00.0 below 80:02.0, all under host bridge [80-84] of package 1.
TEST(Recorded, Em64t32Discovery) {
  LOAD_OR_SKIP(t, "32em64t-2n8c2t-pci-normalio.xml");
  ASSERT_EQ(t.gpus.size(), 3u);
  EXPECT_EQ(t.gpus[0].pci.bus_id, "0000:03:00.0");
  EXPECT_EQ(t.gpus[1].pci.bus_id, "0000:83:00.0");
  EXPECT_EQ(t.gpus[2].pci.bus_id, "0000:84:00.0");
  EXPECT_EQ(t.gpus[0].pci.numa_nodes, (CpuList{0}));
  EXPECT_EQ(t.gpus[1].pci.numa_nodes, (CpuList{1}));
  EXPECT_EQ(t.gpus[2].pci.numa_nodes, (CpuList{1}));
  EXPECT_EQ(t.gpus[0].cuda_ordinal, -1);
  EXPECT_EQ(t.gpus[1].cuda_ordinal, -1);
  EXPECT_EQ(t.gpus[2].cuda_ordinal, 0);
  EXPECT_THAT(t.gpus[2].os_devices, ElementsAre("cuda0", "card0"));
  ASSERT_EQ(t.nics.size(), 3u);
  EXPECT_EQ(t.nics[0].name, "eth0");
  EXPECT_EQ(t.nics[1].name, "eth1");
  const Nic& ib = t.nics[2];
  EXPECT_EQ(ib.name, "mlx5_0");
  EXPECT_TRUE(ib.rdma);
  EXPECT_EQ(ib.kind, "InfiniBand");
  EXPECT_THAT(ib.os_devices, ElementsAre("ib0", "mlx5_0"));
  EXPECT_EQ(ib.pci.numa_nodes, (CpuList{1}));
  EXPECT_EQ(RelationCode(GpuNicRelation(t, 2, 2)), "PIX");  // same root port 80:03.0
  EXPECT_EQ(RelationCode(GpuNicRelation(t, 1, 2)), "PHB");  // 80:02.0 vs 80:03.0, one host bridge
  EXPECT_EQ(RelationCode(GpuNicRelation(t, 1, 0)), "PHB");
  EXPECT_EQ(RelationCode(GpuNicRelation(t, 0, 2)), "SYS");
  EXPECT_EQ(RelationCode(GpuRelation(t, 1, 2)), "PHB");
  EXPECT_EQ(RelationCode(GpuRelation(t, 0, 1)), "SYS");
  EXPECT_EQ(NearestNic(t, 2), 2);
  EXPECT_EQ(NearestNic(t, 1), 2);  // PHB ties eth0/eth1/mlx5_0: the RDMA one
  EXPECT_TRUE(t.nvlinks.empty());
  EXPECT_THAT(t.notes, ::testing::Contains(HasSubstr("no NVLink data")));
}

// Node 1 has 8 cores (L#8-15: PUs 8+24 ... 15+31) for GPUs 83:00.0 and 84:00.0: 4 cores each, in
// order, so the CUDA GPU (84:00.0, vigil GPU 2) gets cores L#12-15; its worker takes L#12 = PUs 12,28
// and its decode threads PUs 13-15,29-31. Its nearest NIC is mlx5_0 (PIX).
TEST(Recorded, Em64t32PlanPutsCudaGpuAndIbNicOnNode1) {
  LOAD_OR_SKIP(t, "32em64t-2n8c2t-pci-normalio.xml");
  StatusOr<Plan> plan = MakePlan(t, Streams(6), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int cuda0 = -1;
  for (const Gpu& g : t.gpus) {
    if (g.cuda_ordinal == 0) cuda0 = g.index;
  }
  ASSERT_EQ(cuda0, 2);
  const DevicePlan& d = plan->devices[cuda0];
  EXPECT_EQ(d.numa_node, 1);
  EXPECT_EQ(d.worker_cpus, (CpuList{12, 28}));
  EXPECT_EQ(d.decode_cpus, (CpuList{13, 14, 15, 29, 30, 31}));
  EXPECT_TRUE(Subset(d.worker_cpus, t.FindNumaNode(1)->cpus));
  ASSERT_GE(d.nic, 0);
  EXPECT_EQ(t.nics[d.nic].name, "mlx5_0");
  EXPECT_EQ(d.streams.size(), 2u);
  // GPU 0 alone on node 0 takes all 8 cores: worker core P#0 (PUs 0,16), decode the other 7.
  EXPECT_EQ(plan->devices[0].worker_cpus, (CpuList{0, 16}));
  EXPECT_EQ(plan->devices[0].decode_cpus, (CpuList{1, 2, 3, 4, 5, 6, 7, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(plan->devices[1].worker_cpus, (CpuList{8, 24}));
  EXPECT_TRUE(plan->notes.empty());
}

// 24em64t-2n6c2t-pci.xml: three 10de:06d2 (class 0302) PCI devices without any OS device: 06:00.0
// below host bridge [00-0f] of package 0, 11:00.0 and 14:00.0 below [10-1f] of package 1. The
// Mellanox 15b3:6746 (class 0c06) at 05:00.0 carries eth2, ib0 and mlx4_0; eth0/eth1 at 04:00.0/.1.
TEST(Recorded, Em64t24GpusVisibleOnlyAsPciDevices) {
  LOAD_OR_SKIP(t, "24em64t-2n6c2t-pci.xml");
  ASSERT_EQ(t.gpus.size(), 3u);
  const std::vector<std::string> bus = {"0000:06:00.0", "0000:11:00.0", "0000:14:00.0"};
  const std::vector<int> node = {0, 1, 1};
  for (int g = 0; g < 3; ++g) {
    SCOPED_TRACE(g);
    EXPECT_EQ(t.gpus[g].pci.bus_id, bus[g]);
    EXPECT_EQ(t.gpus[g].pci.numa_nodes, (CpuList{node[g]}));
    EXPECT_TRUE(t.gpus[g].os_devices.empty());
    EXPECT_EQ(t.gpus[g].cuda_ordinal, -1);
    EXPECT_EQ(t.gpus[g].device_id, 0x06d2);
  }
  ASSERT_EQ(t.nics.size(), 3u);
  EXPECT_EQ(t.nics[2].name, "mlx4_0");
  EXPECT_EQ(t.nics[2].kind, "InfiniBand");
  EXPECT_THAT(t.nics[2].os_devices, ElementsAre("eth2", "ib0", "mlx4_0"));
  EXPECT_EQ(t.nics[2].pci.numa_nodes, (CpuList{0}));
  EXPECT_EQ(RelationCode(GpuNicRelation(t, 0, 2)), "PHB");  // root ports 00:07.0 vs 00:05.0
  EXPECT_EQ(RelationCode(GpuRelation(t, 1, 2)), "PHB");     // root ports 10:07.0 vs 10:03.0
  EXPECT_EQ(RelationCode(GpuRelation(t, 0, 1)), "SYS");

  // CUDA will report (ordinal, bus id) pairs; the order need not be hwloc's.
  Topology copy = t;
  ASSERT_TRUE(AssignCudaOrdinals(&copy, {{0, "0000:14:00.0"}, {1, "06:00.0"}, {2, "00000000:11:00.0"}}).ok());
  EXPECT_EQ(copy.gpus[0].cuda_ordinal, 1);
  EXPECT_EQ(copy.gpus[1].cuda_ordinal, 2);
  EXPECT_EQ(copy.gpus[2].cuda_ordinal, 0);

  // Node 0 (PUs 0,2,...,22; cores L#0-5 = PUs 0+12, 2+14, ...) serves GPU 0 alone: worker PUs 0,12.
  // Node 1's 6 cores split 3/3 between GPUs 1 and 2: GPU 1 worker L#6 (1,13), GPU 2 worker L#9 (7,19).
  StatusOr<Plan> plan = MakePlan(t, Streams(6), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->devices[0].worker_cpus, (CpuList{0, 12}));
  EXPECT_EQ(plan->devices[1].worker_cpus, (CpuList{1, 13}));
  EXPECT_EQ(plan->devices[1].decode_cpus, (CpuList{3, 5, 15, 17}));
  EXPECT_EQ(plan->devices[2].worker_cpus, (CpuList{7, 19}));
  for (const DevicePlan& d : plan->devices) EXPECT_EQ(t.nics[d.nic].name, "mlx4_0");
}

// 16amd64-8n2c-cpusets.xml: allowed cpuset 0xf06f = PUs 0-3,5-6,12-15 (complete 0xffff: PUs 4,7-11
// missing); NUMA nodes P#1 (PUs 2-3), P#2 (PU 5), P#3 (PU 6), P#4 and P#5 memory-only (cpuset 0x0);
// PUs 0-1 (package P#0) and 12-15 (packages P#6, P#7) have an empty nodeset. No PCI at all.
TEST(Recorded, Amd16RestrictedCpusetsAndCpulessNodes) {
  LOAD_OR_SKIP(t, "16amd64-8n2c-cpusets.xml");
  EXPECT_EQ(t.allowed_cpus, (CpuList{0, 1, 2, 3, 5, 6, 12, 13, 14, 15}));
  EXPECT_EQ(t.missing_cpus, (CpuList{4, 7, 8, 9, 10, 11}));
  ASSERT_EQ(t.numa_nodes.size(), 5u);
  std::set<int> memory_only;
  for (const NumaNode& n : t.numa_nodes) {
    if (n.cpus.empty()) memory_only.insert(n.os_index);
    EXPECT_EQ(n.memory_bytes, 8589934592ull);
  }
  EXPECT_EQ(memory_only, (std::set<int>{4, 5}));
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_TRUE(t.nics.empty());
  EXPECT_THAT(t.notes, ::testing::Contains("PUs 4,7-11 exist but are not in the topology (offline or hidden)"));
  EXPECT_THAT(t.notes, ::testing::Contains("NUMA node 4 has memory but no CPUs (memory-only)"));

  // CPU workers: nodes 1, 2, 3 (the ones with CPUs), then the PUs without a node (0-1, 12-15).
  StatusOr<Plan> plan = MakePlan(t, Streams(8), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->devices.size(), 4u);
  const std::vector<int> nodes = {1, 2, 3, -1};
  const std::vector<CpuList> cpus = {{2, 3}, {5}, {6}, {0, 1, 12, 13, 14, 15}};
  size_t placed = 0;
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    const DevicePlan& d = plan->devices[i];
    EXPECT_EQ(d.gpu, -1);
    EXPECT_EQ(d.numa_node, nodes[i]);
    EXPECT_EQ(d.worker_cpus, cpus[i]);
    EXPECT_EQ(d.worker_threads, static_cast<int>(cpus[i].size()));  // one PU per core here
    EXPECT_TRUE(Subset(d.worker_cpus, t.allowed_cpus));
    EXPECT_TRUE(Subset(d.decode_cpus, t.allowed_cpus));
    EXPECT_TRUE(d.numa_node != 4 && d.numa_node != 5);
    placed += d.streams.size();
  }
  EXPECT_EQ(placed, 8u);
}

TEST(Recorded, EveryFileGivesValidLabelsTextAndJson) {
  if (!std::filesystem::is_directory(TopologyDir())) GTEST_SKIP() << "recorded topologies not found at " << TopologyDir();
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TopologyDir())) {
    if (entry.path().extension() != ".xml") continue;
    ++files;
    SCOPED_TRACE(entry.path().string());
    StatusOr<Topology> t = Discover({entry.path().string()});
    ASSERT_TRUE(t.ok()) << t.status();
    for (const std::string& l : KubernetesLabels(*t)) {
      const size_t eq = l.find('=');
      ASSERT_NE(eq, std::string::npos);
      EXPECT_TRUE(IsValidLabelKey(l.substr(0, eq))) << l;
      EXPECT_TRUE(IsValidLabelValue(l.substr(eq + 1))) << l;
    }
    EXPECT_THAT(KubernetesLabels(*t), ::testing::Contains("vigil.io/gpu-count=" + std::to_string(t->gpus.size())));
    StatusOr<Plan> plan = MakePlan(*t, Streams(4), {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const nlohmann::json j = nlohmann::json::parse(ToJson(*t, &*plan));
    EXPECT_EQ(j["topology"]["gpus"].size(), t->gpus.size());
    EXPECT_EQ(j["topology"]["numa_nodes"].size(), t->numa_nodes.size());
    EXPECT_EQ(j["plan"]["devices"].size(), plan->devices.size());
    const std::string text = FormatTopologyText(*t);
    EXPECT_THAT(text, HasSubstr(t->source));
    for (const Gpu& g : t->gpus) EXPECT_THAT(text, HasSubstr(g.pci.bus_id));
  }
  EXPECT_EQ(files, 4);
}

TEST(Recorded, Dgx2LabelsByHand) {
  LOAD_OR_SKIP(t, "nvidiaDGX2.xml");
  const std::vector<std::string> labels = KubernetesLabels(t);
  EXPECT_THAT(labels, ::testing::IsSupersetOf({"vigil.io/gpu-count=16", "vigil.io/numa-count=2", "vigil.io/nvswitch-count=12",
                                               "vigil.io/numa-0-gpus=0_1_2_3_4_5_6_7", "vigil.io/numa-1-gpus=8_9_10_11_12_13_14_15",
                                               "vigil.io/gpu-0-numa=0", "vigil.io/gpu-15-numa=1"}));
}

TEST(Discover, MissingAndMalformedFilesNameTheFile) {
  StatusOr<Topology> missing = Discover({"/nonexistent/machine.xml"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/machine.xml"));

  const std::string cut = TempFile("cut.xml", "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n  <object type=\"Mach");
  StatusOr<Topology> bad = Discover({cut});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(cut));

  const std::string text = TempFile("text.xml", "not xml at all");
  EXPECT_THAT(std::string(Discover({text}).status().message()), HasSubstr(text));
}

// A topology with no NUMA node: hwloc 2 refuses it; discovery reports that instead of crashing.
TEST(Discover, NoNumaInfoIsAnErrorNotACrash) {
  const std::string path = TempFile("nonuma.xml", R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x3" complete_cpuset="0x3" allowed_cpuset="0x3" nodeset="0x1" complete_nodeset="0x1" allowed_nodeset="0x1" gp_index="1">
    <object type="Core" os_index="0" cpuset="0x1" complete_cpuset="0x1" gp_index="2"><object type="PU" os_index="0" cpuset="0x1" complete_cpuset="0x1" gp_index="3"/></object>
    <object type="Core" os_index="1" cpuset="0x2" complete_cpuset="0x2" gp_index="4"><object type="PU" os_index="1" cpuset="0x2" complete_cpuset="0x2" gp_index="5"/></object>
  </object>
</topology>
)");
  StatusOr<Topology> t = Discover({path});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(path));
}

// Odd but valid: 4 PUs of which 0 and 2 are allowed, PUs 4-7 offline, a NUMA node without a memory
// size, and a GPU hanging directly off the machine (no host bridge, locality = Machine = node 0).
TEST(Discover, OddTopologyIsDescribed) {
  const std::string path = TempFile("odd.xml", R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0xf" complete_cpuset="0xff" allowed_cpuset="0x5" nodeset="0x1" complete_nodeset="0x1" allowed_nodeset="0x1" gp_index="1">
    <object type="Package" os_index="0" cpuset="0xf" complete_cpuset="0xf" nodeset="0x1" complete_nodeset="0x1" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0xf" complete_cpuset="0xf" nodeset="0x1" complete_nodeset="0x1" gp_index="3"/>
      <object type="Core" os_index="0" cpuset="0x3" complete_cpuset="0x3" nodeset="0x1" complete_nodeset="0x1" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="5"/>
        <object type="PU" os_index="1" cpuset="0x2" complete_cpuset="0x2" nodeset="0x1" complete_nodeset="0x1" gp_index="6"/>
      </object>
      <object type="Core" os_index="1" cpuset="0xc" complete_cpuset="0xc" nodeset="0x1" complete_nodeset="0x1" gp_index="7">
        <object type="PU" os_index="2" cpuset="0x4" complete_cpuset="0x4" nodeset="0x1" complete_nodeset="0x1" gp_index="8"/>
        <object type="PU" os_index="3" cpuset="0x8" complete_cpuset="0x8" nodeset="0x1" complete_nodeset="0x1" gp_index="9"/>
      </object>
    </object>
    <object type="PCIDev" gp_index="10" pci_busid="0000:02:00.0" pci_type="0302 [10de:20b0] [0000:0000] a1" pci_link_speed="0.000000"/>
  </object>
</topology>
)");
  StatusOr<Topology> t = Discover({path});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->cpus, (CpuList{0, 1, 2, 3}));
  EXPECT_EQ(t->allowed_cpus, (CpuList{0, 2}));
  EXPECT_EQ(t->missing_cpus, (CpuList{4, 5, 6, 7}));
  EXPECT_THAT(t->notes, ::testing::Contains("PUs 1,3 are present but not allowed (cgroup cpuset or affinity)"));
  ASSERT_EQ(t->numa_nodes.size(), 1u);
  EXPECT_EQ(t->numa_nodes[0].memory_bytes, 0u);
  ASSERT_EQ(t->gpus.size(), 1u);
  EXPECT_TRUE(t->gpus[0].pci.bridges.empty());
  EXPECT_EQ(t->gpus[0].pci.numa_nodes, (CpuList{0}));
  StatusOr<Plan> plan = MakePlan(*t, {{"a", 640, 480, 30, 1}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->devices[0].worker_cpus, (CpuList{0}));  // core 0's allowed PU
  EXPECT_EQ(plan->devices[0].decode_cpus, (CpuList{2}));  // core 1's allowed PU
}

TEST(Discover, EnvironmentVariableNamesTheFile) {
  if (!std::filesystem::is_directory(TopologyDir())) GTEST_SKIP() << "recorded topologies not found at " << TopologyDir();
  const std::string path = TopologyDir() + "/24em64t-2n6c2t-pci.xml";
  ASSERT_EQ(setenv("VIGIL_TOPOLOGY_XML", path.c_str(), 1), 0);
  StatusOr<Topology> t = Discover();
  unsetenv("VIGIL_TOPOLOGY_XML");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, path);
  EXPECT_EQ(t->gpus.size(), 3u);
}

}  // namespace
}  // namespace vigil::topology
