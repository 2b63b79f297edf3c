// op_grid_cases.h — the CUDA op grid's graphs (cuda_backend_test.cc runs them against the reference kernels on a
// GPU; cuda_plan_test.cc checks, without one, that every node of them plans onto a GPU kernel). Each case builds
// a small graph with odd shapes (3, 5, 7, 13 channels / pixels) and names the kernels its CUDA profile must show.
#pragma once

#include <cmath>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "testing/graph_builder.h"

namespace vigil::infer::testing {

struct Case {
  std::string name;
  std::function<void(GraphBuilder&, std::mt19937&)> build;  // inputs named in graph.inputs, float32
  std::vector<std::string> expect_kernels;                  // kernels that must appear in the CUDA profile
};

// gtest prints parameters with this (else as raw bytes).
[[maybe_unused]] inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

inline Tensor Weights(std::mt19937& rng, const Shape& shape) {
  const double fan_in = static_cast<double>(NumElements(shape) / shape[0]);
  const float s = static_cast<float>(1.0 / std::sqrt(fan_in));
  return RandomTensor(rng, shape, -s, s);
}

inline Node& Conv(GraphBuilder& b, std::mt19937& rng, const std::string& in, const std::string& out, int64_t cin,
           int64_t cout, int64_t k, int64_t stride, int64_t pad, int64_t group = 1, const std::string& act = "",
           bool bias = true, int64_t dilation = 1) {
  b.Initializer(out + ".w", Weights(rng, {cout, cin / group, k, k}));
  std::vector<std::string> ins = {in, out + ".w"};
  if (bias) {
    b.Initializer(out + ".b", RandomTensor(rng, {cout}, -0.5f, 0.5f));
    ins.push_back(out + ".b");
  }
  Node& n = act.empty() ? b.Add("Conv", ins, {out}) : b.Add("FusedConv", ins, {out}, "vigil");
  n.attrs["kernel_shape"] = std::vector<int64_t>{k, k};
  n.attrs["strides"] = std::vector<int64_t>{stride, stride};
  n.attrs["pads"] = std::vector<int64_t>{pad, pad, pad, pad};
  n.attrs["dilations"] = std::vector<int64_t>{dilation, dilation};
  n.attrs["group"] = group;
  if (!act.empty()) n.attrs["activation"] = act;
  return n;
}

inline std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"conv3x3_silu_3ch", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {1, 3, 17, 19});
                     Conv(b, rng, "x", "y", 3, 16, 3, 1, 1, 1, "SiLU");
                     b.Output("y");
                   }, {"cudnn"}});
  cases.push_back({"conv1x1_nobias_batch2", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 16, 9, 7});
                     Conv(b, rng, "x", "y", 16, 24, 1, 1, 0, 1, "", false);
                     b.Output("y");
                   }, {"cudnn"}});
  cases.push_back({"depthwise_stride2", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {1, 8, 15, 13});
                     Conv(b, rng, "x", "y", 8, 8, 3, 2, 1, 8, "Relu");
                     b.Output("y");
                   }, {"cudnn"}});
  cases.push_back({"dilated_conv_k5", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {1, 16, 21, 11});
                     Conv(b, rng, "x", "y", 16, 8, 5, 1, 4, 1, "", true, 2);
                     b.Output("y");
                   }, {"cudnn"}});
  // The YOLO body in miniature: NHWC region with pooling, channel concat/split, residual add and
  // nearest upsampling, leaving through ToNchw into a float32 head (reshape, softmax, transpose).
  cases.push_back({"yolo_like_chain", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 32, 24});
                     Conv(b, rng, "x", "c1", 3, 16, 3, 2, 1, 1, "SiLU");
                     Node& pool = b.Add("MaxPool", {"c1"}, {"p1"});
                     pool.attrs["kernel_shape"] = std::vector<int64_t>{5, 5};
                     pool.attrs["pads"] = std::vector<int64_t>{2, 2, 2, 2};
                     b.Add("Concat", {"c1", "p1"}, {"cat"}).attrs["axis"] = int64_t{1};
                     Conv(b, rng, "cat", "c2", 32, 16, 1, 1, 0, 1, "SiLU");
                     b.Initializer("split", Tensor::FromVector<int64_t>({8, 8}, {2}));
                     b.Add("Split", {"c2", "split"}, {"s0", "s1"}).attrs["axis"] = int64_t{1};
                     b.Add("Add", {"s0", "s1"}, {"sum"});
                     b.Initializer("scales", Tensor::FromVector<float>({1, 1, 2, 2}, {4}));
                     Node& up = b.Add("Resize", {"sum", "", "scales"}, {"up"});
                     up.attrs["mode"] = std::string("nearest");
                     up.attrs["coordinate_transformation_mode"] = std::string("asymmetric");
                     up.attrs["nearest_mode"] = std::string("floor");
                     Conv(b, rng, "up", "c3", 8, 12, 3, 1, 1, 1, "SiLU");
                     b.Initializer("shape", Tensor::FromVector<int64_t>({2, 12, -1}, {3}));
                     b.Add("Reshape", {"c3", "shape"}, {"flat"});
                     b.Add("Softmax", {"flat"}, {"soft"}).attrs["axis"] = int64_t{1};
                     b.Add("Transpose", {"soft"}, {"out"}).attrs["perm"] = std::vector<int64_t>{0, 2, 1};
                     b.Add("Sigmoid", {"c2"}, {"gate"});
                     b.Output("out");
                     b.Output("gate");
                   }, {"cudnn", "cuda", "copy"}});
  // Nearest upsampling of 12 NHWC channels: whole 16-byte groups in float32 (4 channels), not in float16 (8),
  // so the grouped and the element-wise resize kernels both run (yolo_like_chain's 8 channels: grouped in both).
  cases.push_back({"resize_after_conv_12ch", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 9, 7});
                     Conv(b, rng, "x", "c", 3, 12, 3, 1, 1, 1, "SiLU");
                     b.Initializer("scales", Tensor::FromVector<float>({1, 1, 2, 2}, {4}));
                     Node& up = b.Add("Resize", {"c", "", "scales"}, {"up"});
                     up.attrs["mode"] = std::string("nearest");
                     up.attrs["coordinate_transformation_mode"] = std::string("asymmetric");
                     up.attrs["nearest_mode"] = std::string("floor");
                     Conv(b, rng, "up", "y", 12, 8, 1, 1, 0, 1, "SiLU");
                     b.Output("y");
                   }, {"cudnn", "cuda"}});
  cases.push_back({"broadcast_elementwise", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 4, 5});
                     b.Initializer("bias", RandomTensor(rng, {3, 1, 1}));
                     b.Initializer("two", Tensor::FromVector<float>({2.0f}, {}));
                     b.Initializer("row", RandomTensor(rng, {5}, 0.5f, 1.5f));
                     b.Add("Add", {"x", "bias"}, {"a"});
                     b.Add("Mul", {"a", "two"}, {"m"});
                     b.Add("Div", {"m", "row"}, {"d"});
                     b.Add("Sub", {"d", "x"}, {"s"});
                     b.Add("Pow", {"s", "two"}, {"p"});
                     b.Add("Exp", {"x"}, {"e"});
                     b.Add("Max", {"p", "e"}, {"y"});
                     b.Output("y");
                   }, {"cuda"}});
  cases.push_back({"slice_focus_and_reverse", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {1, 3, 10, 9});
                     b.Initializer("st", Tensor::FromVector<int64_t>({0, 1}, {2}));
                     b.Initializer("en", Tensor::FromVector<int64_t>({1000, 1000}, {2}));
                     b.Initializer("ax", Tensor::FromVector<int64_t>({2, 3}, {2}));
                     b.Initializer("sp", Tensor::FromVector<int64_t>({2, 2}, {2}));
                     b.Add("Slice", {"x", "st", "en", "ax", "sp"}, {"focus"});
                     b.Initializer("st2", Tensor::FromVector<int64_t>({-1}, {1}));
                     b.Initializer("en2", Tensor::FromVector<int64_t>({-1000}, {1}));
                     b.Initializer("ax2", Tensor::FromVector<int64_t>({3}, {1}));
                     b.Initializer("sp2", Tensor::FromVector<int64_t>({-1}, {1}));
                     b.Add("Slice", {"x", "st2", "en2", "ax2", "sp2"}, {"rev"});
                     b.Output("focus");
                     b.Output("rev");
                   }, {"cuda"}});
  cases.push_back({"matmul_batched_and_weight", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("a", {2, 3, 4, 5});
                     b.Input("c", {2, 3, 5, 7});
                     b.Initializer("w", RandomTensor(rng, {7, 6}));
                     b.Add("MatMul", {"a", "c"}, {"ac"});
                     b.Add("MatMul", {"ac", "w"}, {"y"});
                     b.Output("y");
                   }, {"cublas"}});
  cases.push_back({"maxpool_on_input_and_host_fallback", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {1, 5, 13, 11});
                     Node& pool = b.Add("MaxPool", {"x"}, {"p"});
                     pool.attrs["kernel_shape"] = std::vector<int64_t>{3, 3};
                     pool.attrs["strides"] = std::vector<int64_t>{2, 2};
                     pool.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
                     b.Add("DynamicQuantizeLinear", {"p"}, {"q", "qs", "qz"});  // no GPU kernel: host
                     b.Output("p");
                     b.Output("q");
                     b.Output("qs");
                   }, {"cuda", "host"}});
  // ---- The rest of the reference op set that detection exports use (issue 21 item 2) ----
  // Reductions over every axis combination exporters write (DFL as softmax·arange summed, global pooling).
  cases.push_back({"reductions_and_arg", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {2, 4, 16, 37});
                     b.Initializer("ax2", Tensor::FromVector<int64_t>({2}, {1}));
                     b.Add("ReduceSum", {"x", "ax2"}, {"sum"}).attrs["keepdims"] = int64_t{0};
                     Node& mean = b.Add("ReduceMean", {"x"}, {"mean"});
                     mean.attrs["axes"] = std::vector<int64_t>{1, 3};
                     b.Add("ReduceMax", {"x"}, {"max"}).attrs["axes"] = std::vector<int64_t>{-1};
                     b.Add("ReduceMin", {"x"}, {"min"}).attrs["axes"] = std::vector<int64_t>{0};
                     b.Add("ReduceProd", {"x"}, {"prod"}).attrs["axes"] = std::vector<int64_t>{1};
                     b.Add("ReduceL2", {"x"}, {"l2"}).attrs["axes"] = std::vector<int64_t>{2, 3};
                     b.Add("ReduceSum", {"x"}, {"all"});  // no axes: everything, one block
                     b.Add("ArgMax", {"x"}, {"amax"}).attrs["axis"] = int64_t{2};
                     Node& amin = b.Add("ArgMin", {"x"}, {"amin"});
                     amin.attrs["axis"] = int64_t{-1};
                     amin.attrs["keepdims"] = int64_t{0};
                     b.Add("GlobalAveragePool", {"x"}, {"gap"});
                     b.Add("GlobalMaxPool", {"x"}, {"gmp"});
                     for (const char* o : {"sum", "mean", "max", "min", "prod", "l2", "all", "amax", "amin", "gap", "gmp"}) {
                       b.Output(o);
                     }
                   }, {"cuda"}});
  // YOLO26's NMS-free head in miniature: the top anchors by their best class score, their rows gathered,
  // then the top (anchor, class) pairs and the index arithmetic (Div, Mod on int64) that splits them.
  cases.push_back({"end2end_topk_head", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {2, 300, 13});  // [batch, anchors, 4 box + 9 classes]
                     b.Initializer("st", Tensor::FromVector<int64_t>({4}, {1}));
                     b.Initializer("en", Tensor::FromVector<int64_t>({13}, {1}));
                     b.Initializer("ax", Tensor::FromVector<int64_t>({2}, {1}));
                     b.Add("Slice", {"x", "st", "en", "ax"}, {"scores"});
                     Node& rmax = b.Add("ReduceMax", {"scores"}, {"best"});
                     rmax.attrs["axes"] = std::vector<int64_t>{-1};
                     rmax.attrs["keepdims"] = int64_t{0};
                     b.Initializer("k", Tensor::FromVector<int64_t>({40}, {1}));
                     b.Add("TopK", {"best", "k"}, {"top", "idx"}).attrs["axis"] = int64_t{-1};
                     b.Initializer("unsq", Tensor::FromVector<int64_t>({-1}, {1}));
                     b.Add("Unsqueeze", {"idx", "unsq"}, {"idx3"});
                     b.Initializer("shape", Tensor::FromVector<int64_t>({2, 40, 9}, {3}));
                     b.Add("Expand", {"idx3", "shape"}, {"idxe"});
                     b.Add("GatherElements", {"scores", "idxe"}, {"rows"}).attrs["axis"] = int64_t{1};
                     b.Initializer("flat", Tensor::FromVector<int64_t>({2, -1}, {2}));
                     b.Add("Reshape", {"rows", "flat"}, {"rows2"});
                     b.Initializer("k2", Tensor::FromVector<int64_t>({25}, {1}));
                     Node& top2 = b.Add("TopK", {"rows2", "k2"}, {"top2", "idx2"});
                     top2.attrs["axis"] = int64_t{1};
                     b.Initializer("nc", Tensor::FromVector<int64_t>({9}, {}));
                     b.Add("Div", {"idx2", "nc"}, {"anchor"});
                     b.Add("Mod", {"idx2", "nc"}, {"cls"});
                     b.Add("Cast", {"cls"}, {"clsf"}).attrs["to"] = int64_t{1};
                     Node& low = b.Add("TopK", {"best", "k"}, {"low", "lowi"});
                     low.attrs["largest"] = int64_t{0};
                     b.Add("Gather", {"x", "anchor"}, {"picked"}).attrs["axis"] = int64_t{1};
                     for (const char* o : {"top", "idx", "rows", "top2", "anchor", "cls", "clsf", "low", "lowi", "picked"}) {
                       b.Output(o);
                     }
                   }, {"cuda"}});
  cases.push_back({"compare_where_logic_cast", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {3, 5, 7});
                     b.Input("y", {5, 1});
                     b.Initializer("half", Tensor::FromVector<float>({0.25f}, {}));
                     b.Add("Greater", {"x", "y"}, {"gt"});
                     b.Add("LessOrEqual", {"x", "half"}, {"le"});
                     b.Add("And", {"gt", "le"}, {"both"});
                     b.Add("Or", {"gt", "le"}, {"either"});
                     b.Add("Not", {"both"}, {"neither"});
                     b.Add("Where", {"both", "x", "y"}, {"w"});
                     b.Initializer("scale", RandomTensor(rng, {7}, 50.f, 300.f));
                     b.Add("Mul", {"x", "scale"}, {"big"});
                     b.Add("Cast", {"big"}, {"i8"}).attrs["to"] = int64_t{3};     // int8: saturates
                     b.Add("Cast", {"big"}, {"u8"}).attrs["to"] = int64_t{2};     // uint8: saturates at 0
                     b.Add("Cast", {"big"}, {"i32"}).attrs["to"] = int64_t{6};    // truncates toward zero
                     b.Add("Cast", {"i32"}, {"back"}).attrs["to"] = int64_t{1};
                     b.Add("Cast", {"x"}, {"h"}).attrs["to"] = int64_t{10};       // float16
                     b.Add("Cast", {"neither"}, {"nf"}).attrs["to"] = int64_t{1};
                     b.Add("Equal", {"i32", "i32"}, {"eq"});
                     b.Add("Round", {"big"}, {"round"});
                     for (const char* o : {"gt", "both", "either", "neither", "w", "i8", "u8", "i32", "back", "h", "nf",
                                           "eq", "round"}) {
                       b.Output(o);
                     }
                   }, {"cuda"}});
  cases.push_back({"variadic_and_integer_arith", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("a", {2, 3, 4});
                     b.Input("c", {3, 1});
                     b.Input("d", {4});
                     b.Add("Sum", {"a", "c", "d"}, {"sum"});
                     b.Add("Mean", {"a", "c", "d"}, {"mean"});
                     b.Add("Max", {"a", "c", "d"}, {"max"});
                     b.Add("Min", {"a", "d"}, {"min"});
                     b.Initializer("k", Tensor::FromVector<float>({7.0f}, {}));
                     b.Add("Mul", {"a", "k"}, {"ak"});
                     b.Add("Cast", {"ak"}, {"ai"}).attrs["to"] = int64_t{7};
                     b.Initializer("m", Tensor::FromVector<int64_t>({-3, 4, 5, -2}, {4}));
                     b.Add("Mod", {"ai", "m"}, {"mod"});
                     Node& fmod = b.Add("Mod", {"ai", "m"}, {"fmod"});
                     fmod.attrs["fmod"] = int64_t{1};
                     b.Add("Div", {"ai", "m"}, {"div"});
                     b.Add("Sub", {"ai", "m"}, {"sub"});
                     b.Add("Max", {"ai", "m"}, {"imax"});
                     b.Initializer("fm", Tensor::FromVector<float>({1.5f, -2.5f, 0.75f, 3.0f}, {4}));
                     Node& ff = b.Add("Mod", {"a", "fm"}, {"ffmod"});
                     ff.attrs["fmod"] = int64_t{1};
                     for (const char* o : {"sum", "mean", "max", "min", "mod", "fmod", "div", "sub", "imax", "ffmod"}) b.Output(o);
                   }, {"cuda"}});
  cases.push_back({"pad_tile_depth_space", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {1, 8, 5, 6});
                     b.Initializer("pads", Tensor::FromVector<int64_t>({0, 0, 2, 1, 0, 0, 1, 3}, {8}));
                     b.Initializer("val", Tensor::FromVector<float>({-0.5f}, {}));
                     b.Add("Pad", {"x", "pads", "val"}, {"pc"});
                     b.Add("Pad", {"x", "pads"}, {"pr"}).attrs["mode"] = std::string("reflect");
                     b.Add("Pad", {"x", "pads"}, {"pe"}).attrs["mode"] = std::string("edge");
                     b.Initializer("crop", Tensor::FromVector<int64_t>({0, 0, -1, 0, 0, 0, 0, -2}, {8}));
                     b.Add("Pad", {"x", "crop"}, {"pn"});
                     b.Initializer("reps", Tensor::FromVector<int64_t>({2, 1, 3, 1}, {4}));
                     b.Add("Tile", {"x", "reps"}, {"tile"});
                     Node& d2s = b.Add("DepthToSpace", {"x"}, {"d2s"});
                     d2s.attrs["blocksize"] = int64_t{2};
                     Node& crd = b.Add("DepthToSpace", {"x"}, {"crd"});
                     crd.attrs["blocksize"] = int64_t{2};
                     crd.attrs["mode"] = std::string("CRD");
                     b.Initializer("st", Tensor::FromVector<int64_t>({0}, {1}));
                     b.Initializer("en", Tensor::FromVector<int64_t>({4}, {1}));
                     b.Initializer("ax", Tensor::FromVector<int64_t>({2}, {1}));
                     b.Add("Slice", {"x", "st", "en", "ax"}, {"x4"});
                     b.Add("SpaceToDepth", {"x4"}, {"s2d"}).attrs["blocksize"] = int64_t{2};
                     for (const char* o : {"pc", "pr", "pe", "pn", "tile", "d2s", "crd", "s2d"}) b.Output(o);
                   }, {"cuda"}});
  // YOLOv5's BottleneckCSP (a BatchNormalization after a Concat), pooling, a classifier's Gemm.
  cases.push_back({"batchnorm_avgpool_gemm", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 6, 11, 9});
                     b.Initializer("bs", RandomTensor(rng, {6}, 0.5f, 1.5f));
                     b.Initializer("bb", RandomTensor(rng, {6}));
                     b.Initializer("bm", RandomTensor(rng, {6}));
                     b.Initializer("bv", RandomTensor(rng, {6}, 0.2f, 2.0f));
                     b.Add("BatchNormalization", {"x", "bs", "bb", "bm", "bv"}, {"bn"});
                     Node& ap = b.Add("AveragePool", {"bn"}, {"ap"});
                     ap.attrs["kernel_shape"] = std::vector<int64_t>{3, 3};
                     ap.attrs["strides"] = std::vector<int64_t>{2, 2};
                     ap.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
                     Node& api = b.Add("AveragePool", {"bn"}, {"api"});
                     api.attrs["kernel_shape"] = std::vector<int64_t>{3, 2};
                     api.attrs["pads"] = std::vector<int64_t>{1, 0, 1, 1};
                     api.attrs["count_include_pad"] = int64_t{1};
                     api.attrs["ceil_mode"] = int64_t{1};
                     api.attrs["strides"] = std::vector<int64_t>{2, 2};
                     b.Add("GlobalAveragePool", {"bn"}, {"gap"});
                     b.Add("Flatten", {"gap"}, {"feat"});
                     b.Initializer("w", RandomTensor(rng, {5, 6}));
                     b.Initializer("bias", RandomTensor(rng, {5}));
                     Node& gemm = b.Add("Gemm", {"feat", "w", "bias"}, {"logits"});
                     gemm.attrs["transB"] = int64_t{1};
                     gemm.attrs["alpha"] = 0.5f;
                     gemm.attrs["beta"] = 2.0f;
                     b.Initializer("w2", RandomTensor(rng, {2, 4}));
                     Node& g2 = b.Add("Gemm", {"feat", "w2"}, {"t"});
                     g2.attrs["transA"] = int64_t{1};
                     for (const char* o : {"bn", "ap", "api", "logits", "t"}) b.Output(o);
                   }, {"cuda", "cublas"}});
  // QDQ: per-tensor uint8 and per-channel int8 round trips; exact to the host reference's rounding.
  cases.push_back({"quantize_dequantize", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {1, 3, 7, 5});
                     b.Initializer("s", Tensor::FromVector<float>({0.0123f}, {}));
                     b.Initializer("z", Tensor::FromVector<uint8_t>({131}, {}));
                     b.Add("QuantizeLinear", {"x", "s", "z"}, {"q"});
                     b.Add("DequantizeLinear", {"q", "s", "z"}, {"dq"});
                     b.Initializer("sc", Tensor::FromVector<float>({0.01f, 0.005f, 0.02f}, {3}));
                     b.Initializer("zc", Tensor::FromVector<int8_t>({0, -3, 7}, {3}));
                     b.Add("QuantizeLinear", {"x", "sc", "zc"}, {"qc"});
                     b.Add("DequantizeLinear", {"qc", "sc", "zc"}, {"dqc"});
                     for (const char* o : {"q", "dq", "qc", "dqc"}) b.Output(o);
                   }, {"cuda"}});
  // Every activation and math op of the reference set detection exports use (issue 21's list: Clip, HardSwish,
  // LeakyRelu, Tanh, Erf, LogSoftmax, ...), chained so each reads the previous one's range.
  cases.push_back({"activations_and_math", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {2, 5, 7, 3});
                     b.Initializer("lo", Tensor::FromVector<float>({-0.5f}, {}));
                     b.Initializer("hi", Tensor::FromVector<float>({0.75f}, {}));
                     b.Add("Clip", {"x", "lo", "hi"}, {"clip"});
                     b.Add("HardSwish", {"x"}, {"hswish"});
                     Node& hs = b.Add("HardSigmoid", {"x"}, {"hsig"});
                     hs.attrs["alpha"] = 0.25f;
                     b.Add("LeakyRelu", {"x"}, {"leaky"}).attrs["alpha"] = 0.1f;
                     b.Add("Tanh", {"x"}, {"tanh"});
                     b.Add("Erf", {"x"}, {"erf"});
                     b.Add("Relu", {"x"}, {"relu"});
                     b.Add("Sigmoid", {"x"}, {"sig"});
                     b.Add("Exp", {"x"}, {"exp"});
                     b.Add("Abs", {"x"}, {"abs"});
                     b.Add("Neg", {"abs"}, {"neg"});
                     b.Initializer("one", Tensor::FromVector<float>({1.0f}, {}));
                     b.Add("Add", {"abs", "one"}, {"pos"});
                     b.Add("Log", {"pos"}, {"log"});
                     b.Add("Sqrt", {"pos"}, {"sqrt"});
                     b.Add("Reciprocal", {"pos"}, {"recip"});
                     b.Add("Floor", {"exp"}, {"floor"});
                     b.Add("Ceil", {"exp"}, {"ceil"});
                     b.Add("LogSoftmax", {"x"}, {"logsoftmax"}).attrs["axis"] = int64_t{1};
                     b.Add("Softmax", {"x"}, {"softmax"}).attrs["axis"] = int64_t{-1};
                     b.Add("Identity", {"x"}, {"id"});
                     for (const char* o : {"clip", "hswish", "hsig", "leaky", "tanh", "erf", "relu", "sig", "neg",
                                           "log", "sqrt", "recip", "floor", "ceil", "logsoftmax", "softmax", "id"}) {
                       b.Output(o);
                     }
                   }, {"cuda", "copy"}});
  // int8-dynamic models as exported (passes.h DequantizeWeights): the activation quantized over its whole range,
  // dequantized (in the NHWC region between convolutions) or centered with its scale (exact products).
  cases.push_back({"dynamic_fake_quantize", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 13, 11});
                     Conv(b, rng, "x", "c1", 3, 16, 3, 1, 1, 1, "SiLU");
                     b.Add("DynamicFakeQuantize", {"c1"}, {"fq"}, "vigil");
                     Conv(b, rng, "fq", "c2", 16, 8, 3, 1, 1, 1, "SiLU");
                     Node& centered = b.Add("DynamicFakeQuantize", {"x"}, {"xc", "xs"}, "vigil");
                     centered.attrs["centered"] = int64_t{1};
                     for (const char* o : {"c2", "xc", "xs"}) b.Output(o);
                   }, {"cudnn", "cuda"}});
  // A channel Slice between convolutions stays in the NHWC region (C2f's chunk as PyTorch's own exporter writes
  // it): the same conversions as the Split spelling.
  cases.push_back({"channel_slice_in_region", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 12, 10});
                     Conv(b, rng, "x", "c1", 3, 16, 3, 1, 1, 1, "SiLU");
                     b.Initializer("s0", Tensor::FromVector<int64_t>({0}, {1}));
                     b.Initializer("s1", Tensor::FromVector<int64_t>({8}, {1}));
                     b.Initializer("e1", Tensor::FromVector<int64_t>({16}, {1}));
                     b.Initializer("ax", Tensor::FromVector<int64_t>({1}, {1}));
                     b.Add("Slice", {"c1", "s0", "s1", "ax"}, {"lo"});
                     b.Add("Slice", {"c1", "s1", "e1", "ax"}, {"hi"});
                     Conv(b, rng, "hi", "c2", 8, 8, 3, 1, 1, 1, "SiLU");
                     b.Add("Concat", {"lo", "c2"}, {"cat"}).attrs["axis"] = int64_t{1};
                     Conv(b, rng, "cat", "y", 16, 8, 1, 1, 0, 1, "SiLU");
                     b.Output("y");
                   }, {"cudnn", "cuda"}});
  return cases;
}

}  // namespace vigil::infer::testing
