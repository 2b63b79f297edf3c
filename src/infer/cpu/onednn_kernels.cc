#include "infer/cpu/onednn_kernels.h"

#ifdef VIGIL_HAVE_ONEDNN

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace vigil::infer {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr size_t kAlign = 64;

const dnnl::engine& CpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

memory::dims Dims(const Shape& shape) { return memory::dims(shape.begin(), shape.end()); }

// The 4-D float32 type of value `name`, or nullptr.
const TensorType* Float4D(const Graph& graph, const std::string& name) {
  auto it = graph.types.find(name);
  if (it == graph.types.end() || it->second.dtype != DType::kFloat32 || it->second.shape.size() != 4) return nullptr;
  return &it->second;
}

// Padding of one spatial axis for oneDNN, whose output size is (in + pl + pr − k_eff) / s + 1 (floor),
// k_eff = (k − 1)·d + 1. Starts from ONNX's begin pad and end pad (explicit, or from auto_pad as in the
// ONNX Conv/MaxPool spec: SAME_* pads total = (out − 1)·s + k_eff − in, the odd one at the end for
// SAME_UPPER, at the beginning for SAME_LOWER) and moves the end pad into the range that yields the
// inferred `out` (ceil_mode adds end padding; MaxPool ignores padded elements, Conv pads with zeros
// that the extra rows never reach). nullopt when no end pad >= 0 fits.
std::optional<std::pair<int64_t, int64_t>> AxisPadding(const std::string& auto_pad, int64_t pad_begin,
                                                      int64_t pad_end, int64_t in, int64_t out, int64_t k_eff,
                                                      int64_t stride) {
  if (auto_pad == "VALID") {
    pad_begin = pad_end = 0;
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t total = std::max<int64_t>(0, (out - 1) * stride + k_eff - in);
    pad_begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    pad_end = total - pad_begin;
  } else if (auto_pad != "NOTSET" && !auto_pad.empty()) {
    return std::nullopt;
  }
  const int64_t lo = (out - 1) * stride + k_eff - in - pad_begin;  // smallest end pad giving `out`
  const int64_t hi = lo + stride - 1;
  const int64_t end = std::max<int64_t>(std::clamp(pad_end, lo, hi), 0);
  if (pad_begin < 0 || end > hi) return std::nullopt;
  return std::make_pair(pad_begin, end);
}

struct Window {
  memory::dims strides, dilates, pad_l, pad_r;  // dilates in oneDNN's convention: ONNX dilation − 1
};

// Strides, dilations and pads of a 2-D Conv/MaxPool node with kernel `kernel` ([kh, kw]) mapping
// `in` [N,C,H,W] to `out`; nullopt when an attribute is malformed or unrepresentable.
std::optional<Window> MakeWindow(const Node& node, const Shape& in, const Shape& out, const std::vector<int64_t>& kernel) {
  const std::vector<int64_t> strides = node.GetInts("strides", {1, 1});
  const std::vector<int64_t> dilations = node.GetInts("dilations", {1, 1});
  const std::vector<int64_t> pads = node.GetInts("pads", {0, 0, 0, 0});
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4) return std::nullopt;
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  Window w;
  for (int i = 0; i < 2; ++i) {
    if (strides[i] < 1 || dilations[i] < 1 || kernel[i] < 1) return std::nullopt;
    const int64_t k_eff = (kernel[i] - 1) * dilations[i] + 1;
    auto pad = AxisPadding(auto_pad, pads[i], pads[i + 2], in[2 + i], out[2 + i], k_eff, strides[i]);
    if (!pad) return std::nullopt;
    w.strides.push_back(strides[i]);
    w.dilates.push_back(dilations[i] - 1);
    w.pad_l.push_back(pad->first);
    w.pad_r.push_back(pad->second);
  }
  return w;
}

Tag TagOf(Layout layout, int64_t block) {
  if (layout == Layout::kNchw) return Tag::nchw;
  return block == 16 ? Tag::nChw16c : Tag::nChw8c;
}

// oneDNN's slow fallbacks: reference loops, and gemm unless `plain_product`: a pointwise convolution
// (1x1, stride 1, no padding: a matrix product on NCHW, no im2col) without post-ops, which oneDNN 2.6's
// gemm path applies in a slow separate pass. Measured on one AVX-512 core: YOLOv8's DFL conv
// [1,16,4,8400] → [1,1,4,8400] 0.03 ms (brgconv with reorders 0.3 ms); [1,128,80,80] → 64 channels
// 1.1 ms (2.4 ms), but 7.5 ms with a SiLU post-op (brgconv 2.6 ms).
bool IsSlowImpl(const dnnl::primitive_desc_base& pd, bool plain_product) {
  const std::string impl = pd.impl_info_str();
  return impl.find("ref") != std::string::npos || (!plain_product && impl.find("gemm") != std::string::npos);
}

// Runs one primitive whose source and destination live in the arena in the given layouts ("user"
// memory). Where the primitive wants another layout (`pd` descriptors), the source is reordered into
// the scratch buffer first and the result reordered out of it after.
class OnednnKernel final : public CpuKernel {
 public:
  OnednnKernel(const dnnl::primitive_desc_base& pd, dnnl::primitive primitive, const memory::desc& src_user,
               const memory::desc& dst_user, std::unordered_map<int, memory> constants,
               std::shared_ptr<OnednnScratch> scratch, std::string label)
      : primitive_(std::move(primitive)),
        stream_(CpuEngine()),
        src_user_(src_user, CpuEngine(), DNNL_MEMORY_NONE),
        dst_user_(dst_user, CpuEngine(), DNNL_MEMORY_NONE),
        src_native_(pd.src_desc(), CpuEngine(), DNNL_MEMORY_NONE),
        dst_native_(pd.dst_desc(), CpuEngine(), DNNL_MEMORY_NONE),
        args_(std::move(constants)),
        scratch_(std::move(scratch)),
        label_(std::move(label)) {
    if (pd.src_desc() != src_user) src_reorder_ = dnnl::reorder(src_user_, src_native_);
    if (pd.dst_desc() != dst_user) dst_reorder_ = dnnl::reorder(dst_native_, dst_user_);
    args_[DNNL_ARG_SRC] = src_reorder_ ? src_native_ : src_user_;
    args_[DNNL_ARG_DST] = dst_reorder_ ? dst_native_ : dst_user_;
    dst_offset_ = src_reorder_ ? AlignUp(pd.src_desc().get_size()) : 0;
    scratch_->Reserve(dst_offset_ + (dst_reorder_ ? pd.dst_desc().get_size() : 0));
  }

  std::string_view name() const override { return "onednn"; }

  Status Run(std::span<const Tensor> inputs, std::span<Tensor> outputs) override {
    try {
      auto* scratch = static_cast<std::byte*>(scratch_->data());
      src_user_.set_data_handle(const_cast<void*>(inputs[0].raw()));
      dst_user_.set_data_handle(outputs[0].raw());
      if (src_reorder_) {
        src_native_.set_data_handle(scratch);
        src_reorder_.execute(stream_, src_user_, src_native_);
      }
      if (dst_reorder_) dst_native_.set_data_handle(scratch + dst_offset_);
      primitive_.execute(stream_, args_);
      if (dst_reorder_) dst_reorder_.execute(stream_, dst_native_, dst_user_);
      stream_.wait();
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat(label_, ": oneDNN failed: ", e.what()));
    }
    return absl::OkStatus();
  }

 private:
  dnnl::primitive primitive_;
  dnnl::reorder src_reorder_, dst_reorder_;  // empty when the primitive reads/writes the arena's layout
  dnnl::stream stream_;
  memory src_user_, dst_user_, src_native_, dst_native_;
  std::unordered_map<int, memory> args_;
  std::shared_ptr<OnednnScratch> scratch_;
  size_t dst_offset_ = 0;  // of the native destination in the scratch buffer
  std::string label_;
};

// eltwise post-op of a FusedConv activation; false when oneDNN has no equivalent.
bool AppendActivation(const Node& node, dnnl::post_ops* ops) {
  const std::string activation = node.GetString("activation", "");
  if (activation == "SiLU") {
    ops->append_eltwise(1.f, dnnl::algorithm::eltwise_swish, 1.f, 0.f);  // x·sigmoid(1·x)
  } else if (activation == "Relu") {
    ops->append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  } else if (activation == "LeakyRelu") {  // ONNX LeakyRelu default alpha 0.01
    ops->append_eltwise(1.f, dnnl::algorithm::eltwise_relu, node.GetFloat("alpha", 0.01f), 0.f);
  } else {
    return false;
  }
  return true;
}

bool IsConv(const Node& node) {
  return (node.domain.empty() && node.op_type == "Conv") || (node.domain == "vigil" && node.op_type == "FusedConv");
}

// What a Conv / FusedConv node needs from oneDNN; nullopt when oneDNN does not apply.
struct ConvParams {
  const TensorType *x, *y;
  const Tensor *w, *b;  // b null without bias
  int64_t groups;
  Window window;
  dnnl::post_ops ops;
};

std::optional<ConvParams> ParseConv(const Node& node, const Graph& graph) {
  if (node.NumInputs() < 2 || node.outputs.size() != 1) return std::nullopt;
  ConvParams p;
  p.x = Float4D(graph, node.inputs[0]);
  p.y = Float4D(graph, node.outputs[0]);
  p.w = graph.FindInitializer(node.inputs[1]);
  p.b = node.HasInput(2) ? graph.FindInitializer(node.inputs[2]) : nullptr;
  if (p.x == nullptr || p.y == nullptr || p.w == nullptr || p.w->dtype() != DType::kFloat32 || p.w->rank() != 4) {
    return std::nullopt;
  }
  if (node.HasInput(2) && (p.b == nullptr || p.b->dtype() != DType::kFloat32 || p.b->numel() != p.w->dim(0))) {
    return std::nullopt;
  }
  p.groups = node.GetInt("group", 1);
  const int64_t oc = p.w->dim(0);
  if (p.groups < 1 || oc % p.groups != 0 || p.x->shape[1] != p.w->dim(1) * p.groups || p.y->shape[1] != oc) {
    return std::nullopt;
  }
  std::optional<Window> window = MakeWindow(node, p.x->shape, p.y->shape, {p.w->dim(2), p.w->dim(3)});
  if (!window) return std::nullopt;
  p.window = *std::move(window);
  if (node.domain == "vigil" && !AppendActivation(node, &p.ops)) return std::nullopt;
  return p;
}

StatusOr<std::unique_ptr<CpuKernel>> CreateConv(const Node& node, const ConvParams& p, Layout src_layout,
                                                Layout dst_layout, int64_t block,
                                                const std::shared_ptr<OnednnScratch>& scratch) {
  const auto f32 = memory::data_type::f32;
  const int64_t oc = p.w->dim(0), g = p.groups;
  const memory::desc src_user(Dims(p.x->shape), f32, TagOf(src_layout, block));
  const memory::desc dst_user(Dims(p.y->shape), f32, TagOf(dst_layout, block));
  const memory::dims w_dims =
      g == 1 ? Dims(p.w->shape()) : memory::dims{g, oc / g, p.w->dim(1), p.w->dim(2), p.w->dim(3)};
  const memory::desc w_user(w_dims, f32, g == 1 ? Tag::oihw : Tag::goihw);
  const memory::desc b_desc = p.b != nullptr ? memory::desc({oc}, f32, Tag::x) : memory::desc();
  dnnl::primitive_attr attr;
  attr.set_post_ops(p.ops);
  const Window& win = p.window;
  // The arena's layouts when oneDNN has a fast kernel for them, else the layouts it picks (reorders).
  auto make = [&](const memory::desc& src, const memory::desc& dst) {
    const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, src,
                                               memory::desc(w_dims, f32, Tag::any), b_desc, dst, win.strides,
                                               win.dilates, win.pad_l, win.pad_r);
    return dnnl::convolution_forward::primitive_desc(desc, attr, CpuEngine());
  };
  dnnl::convolution_forward::primitive_desc pd = make(src_user, dst_user);
  bool plain_product = p.w->dim(2) == 1 && p.w->dim(3) == 1 && p.ops.len() == 0;
  for (int i = 0; i < 2; ++i) {
    plain_product &= win.strides[i] == 1 && win.pad_l[i] == 0 && win.pad_r[i] == 0;
  }
  if (IsSlowImpl(pd, plain_product)) {
    pd = make(memory::desc(src_user.dims(), f32, Tag::any), memory::desc(dst_user.dims(), f32, Tag::any));
  }

  // Weights: reordered once into the primitive's layout; bias copied.
  dnnl::stream stream(CpuEngine());
  memory weights(pd.weights_desc(), CpuEngine());
  memory w_src(w_user, CpuEngine(), const_cast<void*>(p.w->raw()));
  dnnl::reorder(w_src, weights).execute(stream, w_src, weights);
  stream.wait();
  std::unordered_map<int, memory> constants{{DNNL_ARG_WEIGHTS, weights}};
  if (p.b != nullptr) {
    memory bias(pd.bias_desc(), CpuEngine());
    std::memcpy(bias.get_data_handle(), p.b->raw(), p.b->nbytes());
    constants.emplace(DNNL_ARG_BIAS, bias);
  }
  spdlog::debug("{}: oneDNN convolution {}; source {}, result {}", node.Describe(), pd.impl_info_str(),
                pd.src_desc() == src_user ? "direct" : "reordered", pd.dst_desc() == dst_user ? "direct" : "reordered");
  return std::make_unique<OnednnKernel>(pd, dnnl::convolution_forward(pd), src_user, dst_user, std::move(constants),
                                        scratch, node.Describe());
}

// What a MaxPool node needs from oneDNN; nullopt when oneDNN does not apply.
struct PoolParams {
  const TensorType *x, *y;
  std::vector<int64_t> kernel;
  Window window;
};

std::optional<PoolParams> ParsePool(const Node& node, const Graph& graph) {
  if (node.NumInputs() != 1 || node.outputs.empty() || (node.outputs.size() > 1 && !node.outputs[1].empty())) {
    return std::nullopt;  // the Indices output has no oneDNN equivalent
  }
  PoolParams p;
  p.x = Float4D(graph, node.inputs[0]);
  p.y = Float4D(graph, node.outputs[0]);
  p.kernel = node.GetInts("kernel_shape");
  if (p.x == nullptr || p.y == nullptr || p.kernel.size() != 2) return std::nullopt;
  std::optional<Window> window = MakeWindow(node, p.x->shape, p.y->shape, p.kernel);
  if (!window) return std::nullopt;
  p.window = *std::move(window);
  return p;
}

StatusOr<std::unique_ptr<CpuKernel>> CreatePool(const Node& node, const PoolParams& p, Layout src_layout,
                                                Layout dst_layout, int64_t block,
                                                const std::shared_ptr<OnednnScratch>& scratch) {
  const auto f32 = memory::data_type::f32;
  const memory::desc src(Dims(p.x->shape), f32, TagOf(src_layout, block));
  const memory::desc dst(Dims(p.y->shape), f32, TagOf(dst_layout, block));
  const Window& win = p.window;
  const dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max, src,
                                            memory::desc(dst.dims(), f32, Tag::any), win.strides, Dims(p.kernel),
                                            win.dilates, win.pad_l, win.pad_r);
  const dnnl::pooling_v2_forward::primitive_desc pd(desc, CpuEngine());
  spdlog::debug("{}: oneDNN pooling {}", node.Describe(), pd.impl_info_str());
  return std::make_unique<OnednnKernel>(pd, dnnl::pooling_v2_forward(pd), src, dst, std::unordered_map<int, memory>{},
                                        scratch, node.Describe());
}

// A layout conversion: the reorder primitive itself reads and writes the arena (its descriptors
// equal the user ones, so OnednnKernel adds no reorders around it).
StatusOr<std::unique_ptr<CpuKernel>> CreateReorder(const Shape& shape, Layout from, Layout to, int64_t block,
                                                   std::string label, const std::shared_ptr<OnednnScratch>& scratch) {
  const auto f32 = memory::data_type::f32;
  const memory::desc src(Dims(shape), f32, TagOf(from, block)), dst(Dims(shape), f32, TagOf(to, block));
  const memory src_mem(src, CpuEngine(), DNNL_MEMORY_NONE), dst_mem(dst, CpuEngine(), DNNL_MEMORY_NONE);
  const dnnl::reorder::primitive_desc pd(src_mem, dst_mem);
  return std::make_unique<OnednnKernel>(pd, dnnl::reorder(pd), src, dst, std::unordered_map<int, memory>{}, scratch,
                                        std::move(label));
}

}  // namespace

void OnednnScratch::Reserve(size_t bytes) {
  if (bytes > buffer_.nbytes()) buffer_ = Tensor(DType::kUInt8, {static_cast<int64_t>(bytes)});
}

int64_t OnednnChannelBlock() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core:
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_amx:
      return 16;
    default:
      return 8;
  }
}

bool OnednnHandles(const Node& node, const Graph& graph) {
  if (IsConv(node)) return ParseConv(node, graph).has_value();
  return node.domain.empty() && node.op_type == "MaxPool" && ParsePool(node, graph).has_value();
}

StatusOr<std::unique_ptr<CpuKernel>> CreateOnednnKernel(const Node& node, const Graph& graph, Layout src, Layout dst,
                                                        int64_t block, const std::shared_ptr<OnednnScratch>& scratch) {
  try {
    if (IsConv(node)) {
      std::optional<ConvParams> p = ParseConv(node, graph);
      if (!p) return nullptr;
      return CreateConv(node, *p, src, dst, block, scratch);
    }
    if (node.domain.empty() && node.op_type == "MaxPool") {
      std::optional<PoolParams> p = ParsePool(node, graph);
      if (!p) return nullptr;
      return CreatePool(node, *p, src, dst, block, scratch);
    }
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(node.Describe(), ": oneDNN could not create a primitive: ", e.what()));
  }
  return nullptr;
}

StatusOr<std::unique_ptr<CpuKernel>> CreateOnednnReorder(const Shape& shape, Layout from, Layout to, int64_t block,
                                                         std::string label,
                                                         const std::shared_ptr<OnednnScratch>& scratch) {
  try {
    return CreateReorder(shape, from, to, block, std::move(label), scratch);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(label, ": oneDNN could not create a reorder: ", e.what()));
  }
}

}  // namespace vigil::infer

#endif  // VIGIL_HAVE_ONEDNN
