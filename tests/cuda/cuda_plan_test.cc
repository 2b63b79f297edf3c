// cuda_plan_test.cc — the CUDA backend's plan (Backend::Plan, PlanModel): which kernel each node gets, the host
// fallbacks with their reasons, the NHWC region and its conversions — answered without a GPU (these tests run on
// every machine with the CUDA build), and, where a GPU is visible, equal to what Compile actually built.
#include <algorithm>
#include <fstream>
#include <random>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "infer/backend.h"
#include "vigil/infer/cuda_device.h"
#include "cuda/op_grid_cases.h"
#include "testing/graph_builder.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

using testing::GraphBuilder;

Node& ConvNode(GraphBuilder& b, const std::string& in, const std::string& out, int64_t cin, int64_t cout) {
  b.Initializer(out + ".w", Tensor(DType::kFloat32, {cout, cin, 3, 3}));
  b.Initializer(out + ".b", Tensor(DType::kFloat32, {cout}));
  Node& n = b.Add("FusedConv", {in, out + ".w", out + ".b"}, {out}, "vigil");
  n.attrs["kernel_shape"] = std::vector<int64_t>{3, 3};
  n.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  n.attrs["activation"] = std::string("SiLU");
  return n;
}

// A YOLO-like body (convolutions, pooling, a channel concat) whose tail has an op without a CUDA kernel
// (DynamicQuantizeLinear), a GPU op reading its device scale (DequantizeLinear) and a float64 elementwise op
// (the kernels store no float64).
Graph BodyWithHostTail() {
  GraphBuilder b;
  b.Input("x", {2, 3, 16, 16});
  ConvNode(b, "x", "c1", 3, 16);
  Node& pool = b.Add("MaxPool", {"c1"}, {"p1"});
  pool.attrs["kernel_shape"] = std::vector<int64_t>{3, 3};
  pool.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  b.Add("Concat", {"c1", "p1"}, {"cat"}).attrs["axis"] = int64_t{1};
  ConvNode(b, "cat", "c2", 32, 8);
  b.Add("DynamicQuantizeLinear", {"c2"}, {"q", "qs", "qz"});
  b.Add("DequantizeLinear", {"q", "qs", "qz"}, {"out"});
  b.Input("n", {4}, DType::kFloat64);
  b.Add("Add", {"n", "n"}, {"n2"});
  b.Output("out");
  b.graph.outputs.push_back(ValueInfo{"n2", DType::kFloat64, {}, false});
  EXPECT_TRUE(b.Finish().ok());
  return b.graph;
}

std::map<std::string, NodePlacement> ByNode(const BackendPlan& plan) {
  std::map<std::string, NodePlacement> out;
  for (const NodePlacement& p : plan.nodes) out[p.node] = p;
  return out;
}

TEST(CudaPlan, EachNodesKernelAndEveryHostFallbackWithItsReasonWithoutAGpu) {
  const Graph g = BodyWithHostTail();
  for (const bool fp16 : {false, true}) {
    CompileOptions options;
    options.fp16 = fp16;
    StatusOr<BackendPlan> plan = CreateCudaBackend()->Plan(g, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::map<std::string, NodePlacement> by = ByNode(*plan);
    EXPECT_EQ(by["FusedConv_0"].kernel, "cudnn");
    EXPECT_EQ(by["MaxPool_1"].kernel, "cuda");
    EXPECT_EQ(by["Concat_2"].kernel, "cuda");
    EXPECT_EQ(by["FusedConv_3"].kernel, "cudnn");
    EXPECT_EQ(by["DequantizeLinear_5"].kernel, "cuda");
    EXPECT_EQ(by["FusedConv_0"].op, "vigil.FusedConv");
    // The fallbacks: named, with the reason.
    EXPECT_EQ(by["DynamicQuantizeLinear_4"].kernel, "host");
    EXPECT_EQ(by["DynamicQuantizeLinear_4"].reason, "no CUDA kernel: op");
    EXPECT_EQ(by["Add_6"].kernel, "host");
    EXPECT_EQ(by["Add_6"].reason, "no CUDA kernel: dtype float64");
    EXPECT_EQ(plan->host_nodes, 2);
    // The NHWC region: the body's four values; one conversion where it ends (DynamicQuantizeLinear reads NCHW).
    for (const char* n : {"FusedConv_0", "MaxPool_1", "Concat_2", "FusedConv_3"}) EXPECT_TRUE(by[n].channels_last) << n;
    for (const char* n : {"DynamicQuantizeLinear_4", "DequantizeLinear_5", "Add_6"}) EXPECT_FALSE(by[n].channels_last) << n;
    EXPECT_EQ(plan->channels_last_values, 4);
    ASSERT_EQ(plan->conversions, 1);
    size_t conversion = 0, reduce = 0;
    for (size_t i = 0; i < plan->nodes.size(); ++i) {
      if (plan->nodes[i].conversion) conversion = i;
      if (plan->nodes[i].node == "DynamicQuantizeLinear_4") reduce = i;
    }
    EXPECT_EQ(plan->nodes[conversion].op, "vigil.cpu.ToNchw");
    EXPECT_EQ(plan->nodes[conversion].kernel, "cuda");
    EXPECT_EQ(conversion + 1, reduce) << "converted right before its NCHW reader";
    EXPECT_EQ(plan->nodes.size(), g.nodes.size() + 1);
  }
}

// Every node of the op grid's graphs (the reference op set detection exports use) plans onto a GPU kernel,
// except the one case that exists to show a host fallback.
TEST(CudaPlan, EveryOpOfTheGridPlansOntoAGpuKernel) {
  std::mt19937 rng(7);
  for (const testing::Case& c : testing::Cases()) {
    SCOPED_TRACE(c.name);
    GraphBuilder b;
    c.build(b, rng);
    ASSERT_TRUE(b.Finish().ok()) << b.Finish();
    for (const bool fp16 : {false, true}) {
      CompileOptions options;
      options.fp16 = fp16;
      StatusOr<BackendPlan> plan = CreateCudaBackend()->Plan(b.graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const bool wants_host = std::find(c.expect_kernels.begin(), c.expect_kernels.end(), "host") != c.expect_kernels.end();
      for (const NodePlacement& p : plan->nodes) {
        if (p.kernel == "host") EXPECT_TRUE(wants_host) << p.node << " (" << p.op << ") on the host: " << p.reason;
      }
      EXPECT_EQ(plan->host_nodes, wants_host ? 1 : 0);
    }
  }
}

// C2f's chunk, written as Split (Ultralytics' exporter) or as two channel Slices (PyTorch's own exporter from a
// plain module): the same NHWC region, the same conversions, the same kernels.
Graph ChunkedBody(bool slices) {
  GraphBuilder b;
  b.Input("x", {1, 3, 32, 32});
  ConvNode(b, "x", "c1", 3, 32);
  if (slices) {
    b.Initializer("s0", Tensor::FromVector<int64_t>({0}, {1}));
    b.Initializer("s1", Tensor::FromVector<int64_t>({16}, {1}));
    b.Initializer("e1", Tensor::FromVector<int64_t>({9223372036854775807LL}, {1}));
    b.Initializer("ax", Tensor::FromVector<int64_t>({1}, {1}));
    b.Add("Slice", {"c1", "s0", "s1", "ax"}, {"a"});
    b.Add("Slice", {"c1", "s1", "e1", "ax"}, {"h"});
  } else {
    b.Initializer("split", Tensor::FromVector<int64_t>({16, 16}, {2}));
    b.Add("Split", {"c1", "split"}, {"a", "h"}).attrs["axis"] = int64_t{1};
  }
  ConvNode(b, "h", "m1", 16, 16);
  ConvNode(b, "m1", "m2", 16, 16);
  b.Add("Add", {"h", "m2"}, {"r"});
  b.Add("Concat", {"a", "h", "r"}, {"cat"}).attrs["axis"] = int64_t{1};
  ConvNode(b, "cat", "y", 48, 32);
  b.Output("y");
  EXPECT_TRUE(b.Finish().ok());
  return b.graph;
}

TEST(CudaPlan, ChannelSlicesStayInTheRegionAsSplitDoes) {
  for (const bool fp16 : {false, true}) {
    CompileOptions options;
    options.fp16 = fp16;
    StatusOr<BackendPlan> split = CreateCudaBackend()->Plan(ChunkedBody(false), options);
    StatusOr<BackendPlan> slice = CreateCudaBackend()->Plan(ChunkedBody(true), options);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_TRUE(slice.ok()) << slice.status();
    EXPECT_EQ(split->conversions, 1) << "only the graph output leaves the region";
    EXPECT_EQ(slice->conversions, split->conversions);
    // The Slice spelling has one node more (two Slices for one Split) and one value more in the region (none).
    EXPECT_EQ(slice->channels_last_values, split->channels_last_values);
    EXPECT_EQ(slice->host_nodes, 0);
    for (const NodePlacement& p : slice->nodes) {
      if (p.op == "Slice") EXPECT_TRUE(p.channels_last) << p.node;
    }
  }
}

// Exports whose heads use the wider op set — YOLO26's NMS-free head (TopK, GatherElements, integer Div / Mod,
// Cast, Expand, ReduceMax), the QDQ int8 export (246 QuantizeLinear / DequantizeLinear), the float16 export's
// Casts around Resize — plan wholly onto the GPU.
TEST(CudaPlan, EndToEndQdqAndFloat16ExportsPlanWhollyOnTheGpu) {
  for (const char* name : {"yolo26n_320_b4_op12.onnx", "yolo26n_640_b1_op17.onnx", "yolov8n_320_b1_op17_qdq.onnx",
                           "yolov8n_320_b1_op17_fp16.onnx"}) {
    const std::string model = std::string(VIGIL_TEST_MODELS_DIR) + "/" + name;
    if (!std::ifstream(model).good()) GTEST_SKIP() << model << " is missing (tools/testmodels/make_models.py)";
    EngineOptions options;
    options.device = "cuda:0";
    options.precision = Precision::kFp16;
    StatusOr<BackendPlan> plan = PlanModel(model, options);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
    EXPECT_EQ(plan->host_nodes, 0) << name;
    for (const NodePlacement& p : plan->nodes) EXPECT_NE(p.kernel, "host") << name << ": " << p.node << " " << p.reason;
  }
}

// The CPU backend has no fallback: its plan is every node on itself.
TEST(CudaPlan, TheCpuBackendsDefaultPlanPutsEveryNodeOnItself) {
  const Graph g = BodyWithHostTail();
  StatusOr<BackendPlan> plan = CreateCpuBackend()->Plan(g, CompileOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes.size(), g.nodes.size());
  for (const NodePlacement& p : plan->nodes) EXPECT_EQ(p.kernel, "cpu") << p.node;
  EXPECT_EQ(plan->host_nodes, 0);
}

TEST(CudaPlan, AnOpWithoutAnyKernelIsRefusedNamed) {
  GraphBuilder b;
  b.Input("x", {1, 4});
  b.Add("Sigmoid", {"x"}, {"y"});
  b.Output("y");
  ASSERT_TRUE(b.Finish().ok());
  b.graph.nodes[0].op_type = "NoSuchOp";
  StatusOr<BackendPlan> plan = CreateCudaBackend()->Plan(b.graph, CompileOptions{});
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::IsUnimplemented(plan.status())) << plan.status();
  EXPECT_NE(plan.status().message().find("NoSuchOp"), std::string_view::npos) << plan.status();
}

// A real export through PlanModel (the passes Load runs, then the plan): YOLOv8n runs wholly on the GPU.
TEST(CudaPlan, PlanModelOfAYoloExportOnAMachineWithoutAGpu) {
  const std::string model = std::string(VIGIL_TEST_MODELS_DIR) + "/yolov8n_320_b1_op17.onnx";
  if (!std::ifstream(model).good()) GTEST_SKIP() << model << " is missing (tools/testmodels/make_models.py)";
  EngineOptions options;
  options.device = "cuda:0";
  options.precision = Precision::kFp16;
  StatusOr<BackendPlan> plan = PlanModel(model, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<std::string, int> kernels;
  for (const NodePlacement& p : plan->nodes) ++kernels[p.kernel];
  EXPECT_EQ(plan->host_nodes, 0);
  EXPECT_EQ(kernels["host"], 0);
  EXPECT_EQ(kernels["cudnn"], 64) << "YOLOv8n's 64 convolutions (63 fused with SiLU, the DFL's 1x1)";
  EXPECT_EQ(plan->channels_last_values, 103);
  EXPECT_EQ(plan->conversions, 6) << "the 6 ToNchw the H200's profile of this export shows";
  options.device = "gpu";
  EXPECT_TRUE(absl::IsInvalidArgument(PlanModel(model, options).status()));
}

// With a GPU: the kernels Compile built, node by node, are the plan's.
TEST(CudaPlan, CompileBuildsWhatThePlanSaid) {
  std::string why;
  if (cuda::ListDevices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << "); run via scripts/gpu-check.sh";
  const Graph g = BodyWithHostTail();
  for (const bool fp16 : {false, true}) {
    CompileOptions options;
    options.fp16 = fp16;
    options.profile = true;
    StatusOr<BackendPlan> plan = CreateCudaBackend()->Plan(g, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    StatusOr<std::unique_ptr<CompiledModel>> compiled = CreateCudaBackend()->Compile(g, options);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    const std::vector<NodeTiming> built = (*compiled)->Profile();
    ASSERT_EQ(built.size(), plan->nodes.size());
    for (size_t i = 0; i < built.size(); ++i) EXPECT_EQ(built[i].kernel, plan->nodes[i].kernel) << built[i].node_name;
  }
}

}  // namespace
}  // namespace vigil::infer
