// cpu_backend_test.cc — the CPU backend against the reference kernels.
//
// The op × path grid runs Conv / vigil FusedConv / MaxPool nodes through a compiled model (oneDNN when
// built with it), alone (NCHW) and inside a chain that keeps them in oneDNN's blocked layout, and
// compares with RunReference on the same inputs by relative error max|a − b| / max(1, max|ref|)
// <= 1e-4. Multi-node graphs check the arena binding, the layout conversions and the values stored
// inside others (memory-plan reuse and aliasing must not corrupt values) against evaluating each node
// with RunReference in order; then input validation and unsupported ops. Random inputs and shapes come
// from fresh seeds, printed by SCOPED_TRACE on failure.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "infer/backend.h"
#include "infer/op_registry.h"
#include "infer/ops/op_util.h"
#include "infer/passes/memory_plan.h"
#include "testing/graph_builder.h"

namespace vigil::infer {
namespace {

using testing::FreshSeed;
using testing::GraphBuilder;
using testing::kOpset;
using testing::RandomTensor;
using testing::RelativeError;

StatusOr<std::unique_ptr<CompiledModel>> Compile(const Graph& graph, bool use_onednn, bool profile = true) {
  CompileOptions options;
  options.use_onednn = use_onednn;
  options.profile = profile;
  return CreateCpuBackend()->Compile(graph, options);
}

#ifdef VIGIL_HAVE_ONEDNN
constexpr const char* kFastKernel = "onednn";
#else
constexpr const char* kFastKernel = "reference";
#endif

// Compiles the one-node graph `b` (input "x", output "y"), runs it on `x` and compares with RunReference.
void ExpectSingleNodeMatchesReference(GraphBuilder& b, const Tensor& x) {
  ASSERT_TRUE(b.Finish().ok()) << b.Finish();
  auto model = Compile(b.graph, /*use_onednn=*/true);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<Tensor> out;
  ASSERT_TRUE((*model)->Run({&x, 1}, &out).ok());
  ASSERT_EQ((*model)->Profile().size(), 1u);
  EXPECT_EQ((*model)->Profile()[0].kernel, kFastKernel);

  const Node& node = b.graph.nodes[0];
  std::vector<Tensor> ref_in;
  for (const std::string& in : node.inputs) {
    ref_in.push_back(in.empty() ? Tensor() : in == "x" ? x : b.graph.initializers.at(in));
  }
  std::vector<Tensor> ref_out;
  ASSERT_TRUE(RunReference(node, kOpset, ref_in, &ref_out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_LE(RelativeError(out[0], ref_out[0]), 1e-4);
}

// Evaluates the nodes one by one with RunReference; returns the graph outputs.
std::vector<Tensor> EvaluateWithReference(const Graph& graph, const std::vector<Tensor>& inputs) {
  std::unordered_map<std::string, Tensor> values(graph.initializers.begin(), graph.initializers.end());
  for (size_t i = 0; i < inputs.size(); ++i) values[graph.inputs[i].name] = inputs[i];
  for (const Node& node : graph.nodes) {
    std::vector<Tensor> in, out;
    for (const std::string& name : node.inputs) in.push_back(name.empty() ? Tensor() : values.at(name));
    Status st = RunReference(node, kOpset, in, &out);
    EXPECT_TRUE(st.ok()) << st;
    for (size_t i = 0; i < out.size(); ++i) values[node.outputs[i]] = out[i];
  }
  std::vector<Tensor> outputs;
  for (const ValueInfo& v : graph.outputs) outputs.push_back(values.at(v.name));
  return outputs;
}

// ---- Conv / FusedConv grid ------------------------------------------------------------------------

struct ConvCase {
  int64_t kernel, stride, dilation;
  int group_kind;  // 0: group 1, 1: group 2, 2: depthwise
  bool bias;
  std::string activation;  // "" = plain Conv
};

std::string Describe(const ConvCase& c) {
  return absl::StrCat("k", c.kernel, " s", c.stride, " d", c.dilation, " groups ",
                      c.group_kind == 0 ? "1" : c.group_kind == 1 ? "2" : "depthwise", c.bias ? " bias" : " no-bias",
                      c.activation.empty() ? " Conv" : " FusedConv " + c.activation);
}

TEST(CpuBackendConvGrid, MatchesReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int64_t kernel : {1, 3, 5, 6}) {
    for (int64_t stride : {1, 2}) {
      for (int64_t dilation : {1, 2}) {
        for (int group_kind : {0, 1, 2}) {
          for (bool bias : {false, true}) {
            for (const char* activation : {"", "SiLU", "Relu", "LeakyRelu"}) {
              const ConvCase c{kernel, stride, dilation, group_kind, bias, activation};
              const int64_t group = group_kind == 0 ? 1 : group_kind == 1 ? 2 : uniform(2, 12);
              const int64_t in_per_group = group_kind == 2 ? 1 : uniform(1, 9);
              const int64_t out_per_group = group_kind == 2 ? 1 : uniform(1, 9);
              const int64_t span = (kernel - 1) * dilation + 1;
              const Shape x_shape{uniform(1, 2), group * in_per_group, span + uniform(0, 14), span + uniform(0, 14)};
              const Shape w_shape{group * out_per_group, in_per_group, kernel, kernel};
              std::vector<int64_t> pads;
              for (int i = 0; i < 4; ++i) pads.push_back(uniform(0, span - 1));
              const int64_t auto_pad = uniform(0, 4);  // 0..1: explicit pads, 2: SAME_UPPER, 3: SAME_LOWER, 4: VALID
              SCOPED_TRACE(absl::StrCat(Describe(c), " x", ShapeToString(x_shape), " w", ShapeToString(w_shape),
                                        " group ", group, " auto_pad ", auto_pad, " pads ", ShapeToString(pads)));
              GraphBuilder b;
              b.Input("x", x_shape);
              b.Initializer("w", RandomTensor(rng, w_shape));
              std::vector<std::string> inputs{"x", "w"};
              if (bias) {
                b.Initializer("b", RandomTensor(rng, {w_shape[0]}));
                inputs.push_back("b");
              }
              Node& n = c.activation.empty() ? b.Add("Conv", inputs, {"y"}) : b.Add("FusedConv", inputs, {"y"}, "vigil");
              n.attrs["kernel_shape"] = std::vector<int64_t>{kernel, kernel};
              n.attrs["strides"] = std::vector<int64_t>{stride, stride};
              n.attrs["dilations"] = std::vector<int64_t>{dilation, dilation};
              n.attrs["group"] = group;
              if (auto_pad <= 1) n.attrs["pads"] = pads;
              if (auto_pad >= 2) n.attrs["auto_pad"] = std::string(auto_pad == 2 ? "SAME_UPPER" : auto_pad == 3 ? "SAME_LOWER" : "VALID");
              if (!c.activation.empty()) n.attrs["activation"] = c.activation;
              if (c.activation == "LeakyRelu") n.attrs["alpha"] = std::uniform_real_distribution<float>(0.01f, 0.5f)(rng);
              b.Output("y");
              ExpectSingleNodeMatchesReference(b, RandomTensor(rng, x_shape, -2.f, 2.f));
            }
          }
        }
      }
    }
  }
}

// The same op grid inside a chain x → FusedConv 1x1 → (case) → Relu → y with channel counts that are
// multiples of 16, so that with oneDNN the case's convolution reads and writes the blocked layout
// (layout_plan.h) as in real models; compared with evaluating node by node with RunReference.
TEST(CpuBackendConvGrid, BlockedChainMatchesReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int64_t kernel : {1, 3, 5, 6}) {
    for (int64_t stride : {1, 2}) {
      for (int64_t dilation : {1, 2}) {
        for (int group_kind : {0, 1, 2}) {
          for (const char* activation : {"", "SiLU", "Relu", "LeakyRelu"}) {
            const ConvCase c{kernel, stride, dilation, group_kind, uniform(0, 1) == 1, activation};
            const int64_t channels = 16 * uniform(1, 2);
            const int64_t group = group_kind == 0 ? 1 : group_kind == 1 ? 2 : channels;
            const int64_t out_channels = group_kind == 2 ? channels : 16 * uniform(1, 2);
            const int64_t span = (kernel - 1) * dilation + 1;
            const Shape x_shape{uniform(1, 2), 8, span + uniform(0, 12), span + uniform(0, 12)};
            std::vector<int64_t> pads;
            for (int i = 0; i < 4; ++i) pads.push_back(uniform(0, span - 1));
            SCOPED_TRACE(absl::StrCat(Describe(c), " x", ShapeToString(x_shape), " channels ", channels, "->",
                                      out_channels, " group ", group, " pads ", ShapeToString(pads)));
            GraphBuilder b;
            b.Input("x", x_shape);
            b.Initializer("w0", RandomTensor(rng, {channels, 8, 1, 1}));
            b.Initializer("w", RandomTensor(rng, {out_channels, channels / group, kernel, kernel}));
            std::vector<std::string> inputs{"t", "w"};
            if (c.bias) {
              b.Initializer("b", RandomTensor(rng, {out_channels}));
              inputs.push_back("b");
            }
            b.Add("FusedConv", {"x", "w0"}, {"t"}, "vigil").attrs["activation"] = std::string("Relu");
            Node& n = c.activation.empty() ? b.Add("Conv", inputs, {"u"}) : b.Add("FusedConv", inputs, {"u"}, "vigil");
            n.attrs["kernel_shape"] = std::vector<int64_t>{kernel, kernel};
            n.attrs["strides"] = std::vector<int64_t>{stride, stride};
            n.attrs["dilations"] = std::vector<int64_t>{dilation, dilation};
            n.attrs["group"] = group;
            n.attrs["pads"] = pads;
            if (!c.activation.empty()) n.attrs["activation"] = c.activation;
            if (c.activation == "LeakyRelu") n.attrs["alpha"] = 0.2f;
            b.Add("Relu", {"u"}, {"y"});
            b.Output("y");
            ASSERT_TRUE(b.Finish().ok()) << b.Finish();
            auto model = Compile(b.graph, /*use_onednn=*/true);
            ASSERT_TRUE(model.ok()) << model.status();
            const std::vector<Tensor> in{RandomTensor(rng, x_shape, -2.f, 2.f)};
            std::vector<Tensor> out;
            ASSERT_TRUE((*model)->Run(in, &out).ok());
            const std::vector<Tensor> ref = EvaluateWithReference(b.graph, in);
            ASSERT_EQ(out.size(), 1u);
            EXPECT_LE(RelativeError(out[0], ref[0]), 1e-4);
            EXPECT_EQ((*model)->Profile()[1].kernel, kFastKernel);
          }
        }
      }
    }
  }
}

// ---- MaxPool grid ---------------------------------------------------------------------------------

TEST(CpuBackendMaxPoolGrid, MatchesReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int64_t kernel : {2, 3, 5}) {
    for (int64_t stride : {1, 2}) {
      for (int64_t dilation : {1, 2}) {
        for (int64_t ceil_mode : {0, 1}) {
          for (int64_t auto_pad : {0, 1, 2, 3}) {  // 0: no pads, 1: explicit pads, 2: SAME_UPPER, 3: SAME_LOWER
            const int64_t span = (kernel - 1) * dilation + 1;
            const Shape x_shape{uniform(1, 2), uniform(1, 20), span + uniform(0, 17), span + uniform(0, 17)};
            std::vector<int64_t> pads(4, 0);  // at most kernel/2, so every window holds an input element
            if (auto_pad == 1) {
              for (int64_t& p : pads) p = uniform(0, kernel / 2);
            }
            SCOPED_TRACE(absl::StrCat("k", kernel, " s", stride, " d", dilation, " ceil_mode ", ceil_mode, " auto_pad ",
                                      auto_pad, " pads ", ShapeToString(pads), " x", ShapeToString(x_shape)));
            GraphBuilder b;
            b.Input("x", x_shape);
            Node& n = b.Add("MaxPool", {"x"}, {"y"});
            n.attrs["kernel_shape"] = std::vector<int64_t>{kernel, kernel};
            n.attrs["strides"] = std::vector<int64_t>{stride, stride};
            n.attrs["dilations"] = std::vector<int64_t>{dilation, dilation};
            n.attrs["ceil_mode"] = ceil_mode;
            if (auto_pad <= 1) n.attrs["pads"] = pads;
            if (auto_pad >= 2) n.attrs["auto_pad"] = std::string(auto_pad == 2 ? "SAME_UPPER" : "SAME_LOWER");
            b.Output("y");
            ExpectSingleNodeMatchesReference(b, RandomTensor(rng, x_shape, -3.f, 3.f));
          }
        }
      }
    }
  }
}

// ---- A multi-node graph: arena reuse, graph inputs/outputs, fast and reference kernels mixed -------

// x[N,8,H,W] → Conv 3x3 → c [N,16,H,W]; Sigmoid(c) → s; Mul(c, s) → m; MaxPool 5x5 → p;
// Concat(m, p) → cat; Split → a, b; Add(a, b) → sum; Resize nearest ×scale → up; FusedConv SiLU 3x3
// stride `scale` (up) → f [N,16,H,W]; FusedConv Relu 1x1 (f) → h [N,24,H,W]; Mul(h, y_in) → g
// (broadcast: NCHW only); Relu(g) → out; outputs: out, m (live to the end), sum.
// With oneDNN, c … f run blocked (layout_plan.h; 16 channels fit a block of 8 or 16); h is NCHW with a
// block of 16 (24 channels), or blocked with 8 and converted for the Mul; m and sum are converted as
// graph outputs: 3 conversions either way.
GraphBuilder MultiNodeGraph(std::mt19937& rng, int64_t n, int64_t h, int64_t w, int64_t scale) {
  GraphBuilder b;
  b.Input("x", {n, 8, h, w});
  b.Input("y_in", {n, 24, 1, w});
  b.Initializer("w1", RandomTensor(rng, {16, 8, 3, 3}));
  b.Initializer("b1", RandomTensor(rng, {16}));
  b.Initializer("w2", RandomTensor(rng, {16, 16, 3, 3}));
  b.Initializer("w3", RandomTensor(rng, {24, 16, 1, 1}));
  b.Initializer("scales", Tensor::FromVector<float>({1, 1, static_cast<float>(scale), static_cast<float>(scale)}, {4}));
  Node& conv = b.Add("Conv", {"x", "w1", "b1"}, {"c"});
  conv.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  b.Add("Sigmoid", {"c"}, {"s"});
  b.Add("Mul", {"c", "s"}, {"m"});
  Node& pool = b.Add("MaxPool", {"m"}, {"p"});
  pool.attrs["kernel_shape"] = std::vector<int64_t>{5, 5};
  pool.attrs["pads"] = std::vector<int64_t>{2, 2, 2, 2};
  Node& concat = b.Add("Concat", {"m", "p"}, {"cat"});
  concat.attrs["axis"] = int64_t{1};
  Node& split = b.Add("Split", {"cat"}, {"a", "b"});
  split.attrs["axis"] = int64_t{1};
  b.Add("Add", {"a", "b"}, {"sum"});
  Node& resize = b.Add("Resize", {"sum", "", "scales"}, {"up"});
  resize.attrs["mode"] = std::string("nearest");
  const char* transforms[] = {"asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel"};
  const char* roundings[] = {"floor", "round_prefer_floor", "round_prefer_ceil", "ceil"};
  resize.attrs["coordinate_transformation_mode"] = std::string(transforms[rng() % 4]);
  resize.attrs["nearest_mode"] = std::string(roundings[rng() % 4]);
  Node& fused = b.Add("FusedConv", {"up", "w2"}, {"f"}, "vigil");
  fused.attrs["activation"] = std::string("SiLU");
  fused.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  fused.attrs["strides"] = std::vector<int64_t>{scale, scale};
  Node& pointwise = b.Add("FusedConv", {"f", "w3"}, {"h"}, "vigil");
  pointwise.attrs["activation"] = std::string("Relu");
  b.Add("Mul", {"h", "y_in"}, {"g"});
  b.Add("Relu", {"g"}, {"out"});
  b.Output("out");
  b.Output("m");
  b.Output("sum");
  return b;
}

TEST(CpuBackendGraph, MatchesNodeByNodeReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  const int64_t h = std::uniform_int_distribution<int64_t>(5, 23)(rng);
  const int64_t w = std::uniform_int_distribution<int64_t>(5, 23)(rng);
  const int64_t scale = std::uniform_int_distribution<int64_t>(2, 3)(rng);
  const int64_t n = std::uniform_int_distribution<int64_t>(1, 2)(rng);
  GraphBuilder b = MultiNodeGraph(rng, n, h, w, scale);
  SCOPED_TRACE(absl::StrCat("n ", n, " h ", h, " w ", w, " resize ", scale, "x ",
                            b.graph.nodes[7].GetString("coordinate_transformation_mode", ""), " ",
                            b.graph.nodes[7].GetString("nearest_mode", "")));
  ASSERT_TRUE(b.Finish().ok()) << b.Finish();
  // The plan must actually share memory, or the test could not see reuse corrupting values.
  const MemoryPlan plan = PlanMemory(b.graph);
  ASSERT_LT(plan.arena_bytes, plan.unshared_bytes);

  for (bool use_onednn : {true, false}) {
    SCOPED_TRACE(use_onednn ? "oneDNN" : "reference only");
    auto model = Compile(b.graph, use_onednn);
    ASSERT_TRUE(model.ok()) << model.status();
    const bool blocked = use_onednn && std::string(kFastKernel) == "onednn";
    for (int run = 0; run < 2; ++run) {  // a second run must not see the first one's values
      const std::vector<Tensor> inputs{RandomTensor(rng, {n, 8, h, w}), RandomTensor(rng, {n, 24, 1, w})};
      std::vector<Tensor> out;
      Status st = (*model)->Run(inputs, &out);
      ASSERT_TRUE(st.ok()) << st;
      const std::vector<Tensor> ref = EvaluateWithReference(b.graph, inputs);
      ASSERT_EQ(out.size(), ref.size());
      for (size_t i = 0; i < out.size(); ++i) {
        SCOPED_TRACE(b.graph.outputs[i].name);
        EXPECT_LE(RelativeError(out[i], ref[i]), 1e-4);
      }
    }
    // One timing per graph node in order, plus the blocked → NCHW conversions the layout plan added.
    std::vector<NodeTiming> profile;
    int conversions = 0;
    for (const NodeTiming& t : (*model)->Profile()) {
      if (t.op_type == "ToNchw") {
        ++conversions;
        EXPECT_EQ(t.calls, 2);
      } else {
        profile.push_back(t);
      }
    }
    ASSERT_EQ(profile.size(), b.graph.nodes.size());
    EXPECT_EQ(conversions, blocked ? 3 : 0);
    for (size_t i = 0; i < profile.size(); ++i) {
      const Node& node = b.graph.nodes[i];
      EXPECT_EQ(profile[i].node_name, node.name);
      EXPECT_EQ(profile[i].calls, 2);
      EXPECT_GE(profile[i].total_ms, 0.0);
      const std::string& op = node.op_type;
      std::string kernel = "reference";
      if (use_onednn && (op == "Conv" || op == "FusedConv" || op == "MaxPool")) kernel = kFastKernel;
      if (blocked && op == "Resize") kernel = "blocked";
      if (n == 1 && (op == "Concat" || op == "Split")) kernel = "alias";  // alias_plan.h
      EXPECT_EQ(profile[i].kernel, kernel) << node.name;
    }
    (*model)->ResetProfile();
    EXPECT_EQ((*model)->Profile()[0].calls, 0);
  }
}

// Channel Slices of whole blocks (C2f's chunk as PyTorch's own exporter writes it) run on the blocked values like
// Split does (layout_plan.h): the same results as the reference, and no conversion until the graph output.
TEST(CpuBackendGraph, ChannelSlicesRunOnBlockedValues) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  GraphBuilder b;
  b.Input("x", {2, 8, 9, 11});
  b.Initializer("w1", RandomTensor(rng, {32, 8, 3, 3}));
  b.Initializer("w2", RandomTensor(rng, {16, 16, 3, 3}));
  Node& conv = b.Add("Conv", {"x", "w1"}, {"c"});
  conv.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  b.Initializer("s0", Tensor::FromVector<int64_t>({0}, {1}));
  b.Initializer("s1", Tensor::FromVector<int64_t>({16}, {1}));
  b.Initializer("e1", Tensor::FromVector<int64_t>({32}, {1}));
  b.Initializer("ax", Tensor::FromVector<int64_t>({1}, {1}));
  b.Add("Slice", {"c", "s0", "s1", "ax"}, {"a"});
  b.Add("Slice", {"c", "s1", "e1", "ax"}, {"h"});
  Node& mid = b.Add("FusedConv", {"h", "w2"}, {"m"}, "vigil");
  mid.attrs["activation"] = std::string("SiLU");
  mid.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  b.Add("Add", {"a", "m"}, {"out"});
  b.Output("out");
  ASSERT_TRUE(b.Finish().ok()) << b.Finish();
  auto model = Compile(b.graph, true);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<Tensor> inputs{RandomTensor(rng, {2, 8, 9, 11})};
  std::vector<Tensor> out;
  ASSERT_TRUE((*model)->Run(inputs, &out).ok());
  const std::vector<Tensor> ref = EvaluateWithReference(b.graph, inputs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_LE(RelativeError(out[0], ref[0]), 1e-4);
  int conversions = 0;
  for (const NodeTiming& t : (*model)->Profile()) conversions += t.op_type == "ToNchw" ? 1 : 0;
  EXPECT_EQ(conversions, std::string(kFastKernel) == "onednn" ? 1 : 0) << "only the graph output leaves the blocked layout";
}

// Values stored inside others (alias_plan.h): a Split concatenated back in order (the Split input goes
// in whole), in reverse order (copied), a partial run (one input placed, the others copied), a reshape,
// and a value read again after its bytes moved into a Concat.
TEST(CpuBackendGraph, AliasedValuesKeepTheirValues) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t ca = uniform(1, 6), cb = uniform(1, 6), h = uniform(1, 9), w = uniform(1, 9);
  SCOPED_TRACE(absl::StrCat("split ", ca, "+", cb, " h ", h, " w ", w));
  GraphBuilder b;
  b.Input("x", {1, ca + cb, h, w});
  b.Initializer("sizes", Tensor::FromVector<int64_t>({ca, cb}, {2}));
  b.Initializer("flat_shape", Tensor::FromVector<int64_t>({1, -1}, {2}));
  b.Add("Relu", {"x"}, {"c"});
  b.Add("Split", {"c", "sizes"}, {"a", "bb"}).attrs["axis"] = int64_t{1};
  b.Add("Concat", {"a", "bb"}, {"in_order"}).attrs["axis"] = int64_t{1};
  b.Add("Concat", {"bb", "a"}, {"reversed"}).attrs["axis"] = int64_t{1};
  b.Add("Sigmoid", {"bb"}, {"sb"});
  b.Add("Concat", {"a", "sb", "bb"}, {"partial"}).attrs["axis"] = int64_t{1};
  b.Add("Reshape", {"in_order", "flat_shape"}, {"flat"});
  b.Add("Neg", {"c"}, {"neg"});  // reads c after c moved into in_order
  for (const char* out : {"in_order", "reversed", "partial", "flat", "neg", "a"}) b.Output(out);
  ASSERT_TRUE(b.Finish().ok()) << b.Finish();
  for (bool use_onednn : {true, false}) {
    SCOPED_TRACE(use_onednn ? "oneDNN" : "reference only");
    auto model = Compile(b.graph, use_onednn);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<Tensor> inputs{RandomTensor(rng, {1, ca + cb, h, w})};
    std::vector<Tensor> out;
    ASSERT_TRUE((*model)->Run(inputs, &out).ok());
    const std::vector<Tensor> ref = EvaluateWithReference(b.graph, inputs);
    ASSERT_EQ(out.size(), ref.size());
    for (size_t i = 0; i < out.size(); ++i) {
      SCOPED_TRACE(b.graph.outputs[i].name);
      EXPECT_EQ(out[i].shape(), ref[i].shape());
      EXPECT_EQ(out[i].ToFloatVector(), ref[i].ToFloatVector());  // copies only: exact
    }
    // "reversed" has no input in place: its reference kernel copies both.
    const std::vector<std::string> kernels = {"reference", "alias", "alias", "reference", "reference", "alias",
                                              "alias", "reference"};
    const std::vector<NodeTiming> profile = (*model)->Profile();
    ASSERT_EQ(profile.size(), kernels.size());
    for (size_t i = 0; i < profile.size(); ++i) EXPECT_EQ(profile[i].kernel, kernels[i]) << profile[i].node_name;
  }
}

TEST(CpuBackendGraph, GraphInputAsOutputIsCopied) {
  GraphBuilder b;
  b.Input("x", {2, 3});
  b.Add("Relu", {"x"}, {"r"});
  b.Output("r");
  b.Output("x");
  ASSERT_TRUE(b.Finish().ok());
  auto model = Compile(b.graph, true);
  ASSERT_TRUE(model.ok()) << model.status();
  const Tensor x = Tensor::FromVector<float>({-1, 2, -3, 4, -5, 6}, {2, 3});
  std::vector<Tensor> out;
  ASSERT_TRUE((*model)->Run({&x, 1}, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].ToFloatVector(), (std::vector<float>{0, 2, 0, 4, 0, 6}));
  EXPECT_EQ(out[1].ToFloatVector(), x.ToFloatVector());
  EXPECT_NE(out[1].raw(), x.raw());  // an owned copy
}

// ---- Errors ---------------------------------------------------------------------------------------

class CpuBackendValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    b_.Input("images", {1, 3, 4, 4});
    b_.Add("Sigmoid", {"images"}, {"y"});
    b_.Output("y");
    ASSERT_TRUE(b_.Finish().ok());
    auto model = Compile(b_.graph, true, false);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }
  void ExpectInvalid(const std::vector<Tensor>& inputs, const std::string& fragment) {
    std::vector<Tensor> out;
    Status st = model_->Run(inputs, &out);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(fragment), std::string::npos) << st;
  }
  GraphBuilder b_;
  std::unique_ptr<CompiledModel> model_;
};

TEST_F(CpuBackendValidation, RejectsWrongInputCount) {
  ExpectInvalid({}, "expected 1 input(s), got 0");
  ExpectInvalid({Tensor(DType::kFloat32, {1, 3, 4, 4}), Tensor(DType::kFloat32, {1})}, "got 2");
}

TEST_F(CpuBackendValidation, RejectsWrongShapeNamingTheInput) {
  ExpectInvalid({Tensor(DType::kFloat32, {1, 3, 4, 5})}, "input 'images': expected float32[1,3,4,4], got float32[1,3,4,5]");
}

TEST_F(CpuBackendValidation, RejectsWrongDTypeNamingTheInput) {
  ExpectInvalid({Tensor(DType::kFloat16, {1, 3, 4, 4})}, "input 'images': expected float32[1,3,4,4], got float16[1,3,4,4]");
}

TEST_F(CpuBackendValidation, AcceptsMatchingInput) {
  const Tensor x(DType::kFloat32, {1, 3, 4, 4});  // zeros → sigmoid 0.5
  std::vector<Tensor> out;
  ASSERT_TRUE(model_->Run({&x, 1}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  for (float v : out[0].ToFloatVector()) EXPECT_FLOAT_EQ(v, 0.5f);
}

TEST(CpuBackend, UnsupportedOpFailsCompileNamingIt) {
  GraphBuilder b;
  b.Input("x", {2});
  b.graph.types["y"] = {DType::kFloat32, {2}};
  b.Add("NoSuchOp", {"x"}, {"y"});
  b.Output("y");
  auto model = Compile(b.graph, true);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("NoSuchOp"), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find("NoSuchOp_0"), std::string::npos) << model.status();
  EXPECT_FALSE(CreateCpuBackend()->Supports(b.graph.nodes[0], kOpset));
}

}  // namespace
}  // namespace vigil::infer
