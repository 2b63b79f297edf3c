// nn.cc — reference kernels and shape inference for neural-network ops (op_lists.h NnOps):
// Conv and vigil's FusedConv, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, Resize,
// Upsample, BatchNormalization (inference), DepthToSpace, SpaceToDepth.
//
// Semantics follow the ONNX operator specification (https://onnx.ai/onnx/operators/) at the
// node's opset; each op names its spec section. Layout is NCHW ("N x C x D1 x ... x Dn").
// Convolution and pooling support 1-D and 2-D spatial inputs (a 1-D input runs as H = 1);
// 3-D and up are Unimplemented. Arithmetic is float32; float16 tensors are computed in float32
// through RunAsFloat32 (op_util.h) and rounded once at the end.
//
// The direct convolution is the reference the oneDNN/CUDA paths are checked against, also on whole
// YOLO models, so it is organised for speed without im2col: each task computes one output row
// for a block of up to 8 output channels, accumulating in an L1-resident buffer whose innermost
// loop runs over the contiguous output width (vectorised with `omp simd`); tasks are spread over
// OpenMP threads.
// Thread-safety: stateless functions (see op_registry.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "infer/ops/op_lists.h"
#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using Types = std::vector<TensorType>;

// The ShapeContext a kernel would have seen, so RunFns re-derive attributes with the InferFn helpers.
ShapeContext ContextOf(const KernelContext& ctx) {
  ShapeContext s{ctx.node, ctx.opset, {}, {}};
  for (const Tensor& t : ctx.inputs) {
    s.input_types.push_back(TensorType{t.dtype(), t.defined() ? t.shape() : Shape{}});
    s.input_values.push_back(t.defined() ? &t : nullptr);
  }
  return s;
}

// Runs a float32 kernel, through float32 temporaries when the tensors are float16.
Status RunFloat(const KernelContext& ctx, RunFn run) {
  return ctx.inputs[0].dtype() == DType::kFloat16 ? RunAsFloat32(ctx, run) : run(ctx);
}

Status CheckRankAtLeast(const ShapeContext& ctx, size_t i, size_t rank, const char* layout) {
  const Shape& s = ctx.input_types[i].shape;
  if (s.size() >= rank) return absl::OkStatus();
  return NodeError(ctx.node, "input ", i, " ", ShapeToString(s), " must have rank >= ", rank, " (", layout,
                   ")");
}

// ---- Sliding windows (Conv-11, MaxPool-12, AveragePool-19 output-shape rules) ------------------------

// Per spatial axis: input size, kernel, stride, dilation, padding and output size.
struct Window {
  std::vector<int64_t> in, kernel, stride, dilation, pad_begin, pad_end, out;
};

// Resolves auto_pad / pads / strides / dilations. Output size (spec, Conv and MaxPool):
//   NOTSET: floor or, with ceil_mode, ceil((in + pads - ((k-1)·d + 1)) / s) + 1, dropping a last
//           window that would start in the right padding (MaxPool: "Sliding windows that would
//           start in the right padded region are ignored");
//   VALID: no padding; SAME_UPPER / SAME_LOWER: out = ceil(in / s), total padding
//   (out-1)·s + (k-1)·d + 1 - in split evenly, the odd one at the end (UPPER) or beginning (LOWER).
StatusOr<Window> ResolveWindow(const Node& node, const Shape& x, const std::vector<int64_t>& kernel,
                               bool use_dilations, bool ceil_mode) {
  const size_t n = x.size() - 2;
  Window w;
  w.in.assign(x.begin() + 2, x.end());
  w.kernel = kernel;
  w.stride = node.GetInts("strides", std::vector<int64_t>(n, 1));
  w.dilation =
      use_dilations ? node.GetInts("dilations", std::vector<int64_t>(n, 1)) : std::vector<int64_t>(n, 1);
  const std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * n, 0));
  if (kernel.size() != n || w.stride.size() != n || w.dilation.size() != n || pads.size() != 2 * n) {
    return NodeError(node, "kernel ", ShapeToString(kernel), ", strides ", ShapeToString(w.stride),
                     ", dilations ", ShapeToString(w.dilation), " and pads ", ShapeToString(pads),
                     " do not fit ", n, " spatial axes of input ", ShapeToString(x));
  }
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") {
    return NodeError(node, "unknown auto_pad '", auto_pad, "'");
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = kernel[i], s = w.stride[i], d = w.dilation[i];
    if (k < 1 || s < 1 || d < 1 || pads[i] < 0 || pads[i + n] < 0) {
      return NodeError(node, "kernel ", ShapeToString(kernel), ", strides ", ShapeToString(w.stride),
                       ", dilations ", ShapeToString(w.dilation), " must be >= 1 and pads ",
                       ShapeToString(pads), " >= 0");
    }
    const int64_t span = (k - 1) * d + 1, in = w.in[i];
    int64_t pb = pads[i], pe = pads[i + n], out;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + span - in);
      pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      if (auto_pad == "VALID") pb = pe = 0;
      const int64_t room = in + pb + pe - span;
      if (room < 0) {
        return NodeError(node, "window of ", span, " (kernel ", k, ", dilation ", d, ") exceeds padded size ",
                         in + pb + pe, " of spatial axis ", i, " of input ", ShapeToString(x));
      }
      out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
      if (ceil_mode && (out - 1) * s >= in + pb) --out;
    }
    w.pad_begin.push_back(pb);
    w.pad_end.push_back(pe);
    w.out.push_back(out);
  }
  return w;
}

// A 1-D or 2-D window as 2-D (a 1-D one gets H = OH = KH = 1).
struct Plane {
  int64_t H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw, peh, pew;
};

StatusOr<Plane> PlaneOf(const Node& node, Window w) {
  const size_t n = w.in.size();
  if (n < 1 || n > 2) {
    return NodeUnimplemented(node, n, "-D spatial input is not supported (1-D and 2-D are)");
  }
  if (n == 1) {  // a trivial H axis in front
    for (auto* a : {&w.in, &w.out, &w.kernel, &w.stride, &w.dilation}) a->insert(a->begin(), 1);
    for (auto* a : {&w.pad_begin, &w.pad_end}) a->insert(a->begin(), 0);
  }
  return Plane{w.in[0],        w.in[1],        w.out[0],     w.out[1],      w.kernel[0],
               w.kernel[1],    w.stride[0],    w.stride[1],  w.dilation[0], w.dilation[1],
               w.pad_begin[0], w.pad_begin[1], w.pad_end[0], w.pad_end[1]};
}

Shape OutputShape(const Shape& x, int64_t channels, const Window& w) {
  Shape y = {x[0], channels};
  y.insert(y.end(), w.out.begin(), w.out.end());
  return y;
}

// ---- Conv (spec: Conv-11) and FusedConv (vigil: Conv followed by an activation) ---------------------

enum class ActKind { kNone, kRelu, kLeakyRelu, kSiLU };
struct Activation {
  ActKind kind = ActKind::kNone;
  float alpha = 0.01f;  // LeakyRelu slope (ONNX LeakyRelu default)
};

// FusedConv's "activation": "SiLU" (x·sigmoid(x)), "Relu", "LeakyRelu" (attribute alpha).
StatusOr<Activation> ActivationOf(const Node& node) {
  if (node.domain != "vigil") return Activation{};
  const std::string a = node.GetString("activation", "");
  if (a == "SiLU") return Activation{ActKind::kSiLU};
  if (a == "Relu") return Activation{ActKind::kRelu};
  if (a == "LeakyRelu") return Activation{ActKind::kLeakyRelu, node.GetFloat("alpha", 0.01f)};
  return NodeError(node, "unknown activation '", a, "' (expected SiLU, Relu or LeakyRelu)");
}

inline float Activate(const Activation& act, float v) {
  switch (act.kind) {
    case ActKind::kNone:
      return v;
    case ActKind::kRelu:
      return v > 0.0f ? v : 0.0f;
    case ActKind::kLeakyRelu:
      return v >= 0.0f ? v : act.alpha * v;
    case ActKind::kSiLU:
      return v / (1.0f + std::exp(-v));
  }
  return v;
}

struct ConvSetup {
  Plane p;
  int64_t N, C, M, group;
  Shape y;
};

// X [N, C, D...], W [M, C/group, k...], B [M] (optional).
StatusOr<ConvSetup> ConvSetupOf(const Node& node, const Shape& x, const Shape& w, const Shape* b) {
  if (x.size() < 3 || w.size() != x.size()) {
    return NodeError(node, "input X ", ShapeToString(x), " and weight W ", ShapeToString(w),
                     " must have the same rank >= 3 (N x C x D1 ... and M x C/group x k1 ...)");
  }
  const int64_t group = node.GetInt("group", 1);
  if (group < 1) return NodeError(node, "group ", group, " must be >= 1");
  if (x[1] != w[1] * group) {
    return NodeError(node, "input X ", ShapeToString(x), " has ", x[1], " channels but weight W ",
                     ShapeToString(w), " with group ", group, " expects ", w[1] * group,
                     " (W.shape[1] * group)");
  }
  if (w[0] % group != 0)
    return NodeError(node, "weight W ", ShapeToString(w), ": ", w[0], " output channels do not divide into ",
                     group, " groups");
  if (b && (b->size() != 1 || (*b)[0] != w[0])) {
    return NodeError(node, "bias B ", ShapeToString(*b), " must have shape [", w[0], "] for weight W ",
                     ShapeToString(w));
  }
  const std::vector<int64_t> kernel(w.begin() + 2, w.end());
  if (node.HasAttr("kernel_shape") && node.GetInts("kernel_shape") != kernel) {
    return NodeError(node, "kernel_shape ", ShapeToString(node.GetInts("kernel_shape")),
                     " does not match weight W ", ShapeToString(w));
  }
  VIGIL_ASSIGN_OR_RETURN(Window win, ResolveWindow(node, x, kernel, true, false));
  VIGIL_ASSIGN_OR_RETURN(Plane p, PlaneOf(node, win));
  return ConvSetup{p, x[0], x[1], w[0], group, OutputShape(x, w[0], win)};
}

Status InferConv(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 1));
  const bool has_bias = ctx.node.HasInput(2);
  if (has_bias) VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 2));
  VIGIL_RETURN_IF_ERROR(ActivationOf(ctx.node).status());
  VIGIL_ASSIGN_OR_RETURN(ConvSetup s,
                         ConvSetupOf(ctx.node, ctx.input_types[0].shape, ctx.input_types[1].shape,
                                     has_bias ? &ctx.input_types[2].shape : nullptr));
  *out = {{ctx.input_types[0].dtype, s.y}};
  return absl::OkStatus();
}

// Direct convolution y = act(Σ w·x + b); see the file comment for the loop organisation.
void ConvKernel(const float* x, const float* w, const float* b, float* y, const ConvSetup& s,
                const Activation& act) {
  constexpr int64_t kBlock = 8;  // output channels accumulated together (reuse of each input row)
  const Plane& p = s.p;
  const int64_t cg = s.C / s.group, mg = s.M / s.group, k = p.KH * p.KW;
  const int64_t blocks = (mg + kBlock - 1) / kBlock;
  // Output columns whose input column ow·sw + kw·dw - pw lies inside [0, W), per kw.
  std::vector<int64_t> lo(p.KW), hi(p.KW);
  for (int64_t kw = 0; kw < p.KW; ++kw) {
    const int64_t off = kw * p.dw - p.pw;
    hi[kw] = std::min(p.OW, off > p.W - 1 ? 0 : (p.W - 1 - off) / p.sw + 1);
    lo[kw] = std::min(hi[kw], off >= 0 ? 0 : (-off + p.sw - 1) / p.sw);
  }
  const int64_t tasks = s.N * s.group * blocks * p.OH, macs = s.N * s.M * p.OH * p.OW * cg * k;
#pragma omp parallel num_threads(ThreadsFor(macs))
  {
    std::vector<float> acc(static_cast<size_t>(kBlock * p.OW)), row(static_cast<size_t>(p.OW));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t oh = t % p.OH, ob = (t / p.OH) % blocks, g = (t / (p.OH * blocks)) % s.group;
      const int64_t n = t / (p.OH * blocks * s.group);
      const int64_t oc0 = g * mg + ob * kBlock, nb = std::min(kBlock, mg - ob * kBlock);
      for (int64_t bb = 0; bb < nb; ++bb) std::fill_n(acc.data() + bb * p.OW, p.OW, b ? b[oc0 + bb] : 0.0f);
      for (int64_t ic = 0; ic < cg; ++ic) {
        const float* xc = x + ((n * s.C + g * cg + ic) * p.H) * p.W;
        const float* wc = w + (oc0 * cg + ic) * k;
        for (int64_t kh = 0; kh < p.KH; ++kh) {
          const int64_t ih = oh * p.sh - p.ph + kh * p.dh;
          if (ih < 0 || ih >= p.H) continue;
          const float* xr = xc + ih * p.W;
          for (int64_t kw = 0; kw < p.KW; ++kw) {
            const int64_t l = lo[kw], len = hi[kw] - lo[kw], off = kw * p.dw - p.pw;
            if (len <= 0) continue;
            const float* src = xr + l * p.sw + off;
            if (p.sw != 1) {  // gather the strided input once for the whole channel block
              for (int64_t j = 0; j < len; ++j) row[j] = src[j * p.sw];
              src = row.data();
            }
            for (int64_t bb = 0; bb < nb; ++bb) {
              const float wv = wc[bb * cg * k + kh * p.KW + kw];
              float* __restrict a = acc.data() + bb * p.OW + l;
              const float* __restrict in = src;
#pragma omp simd
              for (int64_t j = 0; j < len; ++j) a[j] += wv * in[j];
            }
          }
        }
      }
      for (int64_t bb = 0; bb < nb; ++bb) {
        float* yr = y + ((n * s.M + oc0 + bb) * p.OH + oh) * p.OW;
        const float* a = acc.data() + bb * p.OW;
        for (int64_t j = 0; j < p.OW; ++j) yr[j] = Activate(act, a[j]);
      }
    }
  }
}

Status RunConvF32(const KernelContext& ctx) {
  const bool has_bias = ctx.inputs.size() > 2 && ctx.inputs[2].defined();
  VIGIL_ASSIGN_OR_RETURN(Activation act, ActivationOf(ctx.node));
  VIGIL_ASSIGN_OR_RETURN(ConvSetup s, ConvSetupOf(ctx.node, ctx.inputs[0].shape(), ctx.inputs[1].shape(),
                                                  has_bias ? &ctx.inputs[2].shape() : nullptr));
  ConvKernel(ctx.inputs[0].data<float>(), ctx.inputs[1].data<float>(),
             has_bias ? ctx.inputs[2].data<float>() : nullptr, ctx.outputs[0].data<float>(), s, act);
  return absl::OkStatus();
}

Status RunConv(const KernelContext& ctx) { return RunFloat(ctx, RunConvF32); }

// ---- MaxPool (spec: MaxPool-12), AveragePool (spec: AveragePool-19) ---------------------------------

struct PoolSetup {
  Plane p;
  Shape y;
};

StatusOr<PoolSetup> PoolSetupOf(const ShapeContext& ctx, bool is_max) {
  const Node& node = ctx.node;
  const Shape& x = ctx.input_types[0].shape;
  if (!node.HasAttr("kernel_shape")) return NodeError(node, "attribute 'kernel_shape' is required");
  const bool ceil_mode = ctx.opset >= 10 && node.GetInt("ceil_mode", 0) != 0;
  const bool dilations = is_max ? ctx.opset >= 10 : ctx.opset >= 19;
  VIGIL_ASSIGN_OR_RETURN(Window win,
                         ResolveWindow(node, x, node.GetInts("kernel_shape"), dilations, ceil_mode));
  VIGIL_ASSIGN_OR_RETURN(Plane p, PlaneOf(node, win));
  return PoolSetup{p, OutputShape(x, x[1], win)};
}

Status InferPool(const ShapeContext& ctx, Types* out, bool is_max) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, is_max ? 2 : 1));
  if (ctx.node.outputs.size() > 1 && !ctx.node.outputs[1].empty()) {
    return NodeUnimplemented(ctx.node, "the optional Indices output is not supported");
  }
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  VIGIL_RETURN_IF_ERROR(CheckRankAtLeast(ctx, 0, 3, "N x C x D1 ..."));
  VIGIL_ASSIGN_OR_RETURN(PoolSetup s, PoolSetupOf(ctx, is_max));
  out->assign(ctx.node.outputs.size(), TensorType{});
  (*out)[0] = {ctx.input_types[0].dtype, s.y};
  return absl::OkStatus();
}

Status InferMaxPool(const ShapeContext& ctx, Types* out) { return InferPool(ctx, out, true); }
Status InferAveragePool(const ShapeContext& ctx, Types* out) { return InferPool(ctx, out, false); }

// Max over the in-bounds window elements (padding never wins), or the mean over them; with
// count_include_pad the divisor counts window positions inside the padded extent instead.
template <bool kMax>
Status RunPoolF32(const KernelContext& ctx) {
  VIGIL_ASSIGN_OR_RETURN(PoolSetup s, PoolSetupOf(ContextOf(ctx), kMax));
  const Plane& p = s.p;
  const bool include_pad = ctx.node.GetInt("count_include_pad", 0) != 0;
  const int64_t planes = s.y[0] * s.y[1];
  const float* x = ctx.inputs[0].data<float>();
  float* y = ctx.outputs[0].data<float>();
  const int64_t work = planes * p.OH * p.OW * p.KH * p.KW;
#pragma omp parallel for num_threads(ThreadsFor(work))
  for (int64_t c = 0; c < planes; ++c) {
    const float* xc = x + c * p.H * p.W;
    for (int64_t oh = 0; oh < p.OH; ++oh) {
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        float m = -std::numeric_limits<float>::infinity(), sum = 0.0f;
        int64_t inside = 0, padded = 0;
        for (int64_t kh = 0; kh < p.KH; ++kh) {
          const int64_t ih = oh * p.sh - p.ph + kh * p.dh;
          for (int64_t kw = 0; kw < p.KW; ++kw) {
            const int64_t iw = ow * p.sw - p.pw + kw * p.dw;
            if (ih >= -p.ph && ih < p.H + p.peh && iw >= -p.pw && iw < p.W + p.pew) ++padded;
            if (ih < 0 || ih >= p.H || iw < 0 || iw >= p.W) continue;
            const float v = xc[ih * p.W + iw];
            m = std::max(m, v);
            sum += v;
            ++inside;
          }
        }
        const int64_t count = include_pad ? padded : inside;
        y[(c * p.OH + oh) * p.OW + ow] = kMax ? m : (count > 0 ? sum / static_cast<float>(count) : 0.0f);
      }
    }
  }
  return absl::OkStatus();
}

Status RunMaxPool(const KernelContext& ctx) { return RunFloat(ctx, RunPoolF32<true>); }
Status RunAveragePool(const KernelContext& ctx) { return RunFloat(ctx, RunPoolF32<false>); }

// ---- GlobalAveragePool, GlobalMaxPool (spec: -1): [N, C, D...] → [N, C, 1, ...] -------------------

Status InferGlobalPool(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  VIGIL_RETURN_IF_ERROR(CheckRankAtLeast(ctx, 0, 3, "N x C x D1 ..."));
  Shape y = ctx.input_types[0].shape;
  std::fill(y.begin() + 2, y.end(), 1);
  *out = {{ctx.input_types[0].dtype, y}};
  return absl::OkStatus();
}

template <bool kMax>
Status RunGlobalPoolF32(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t planes = x.dim(0) * x.dim(1), size = x.numel() / std::max<int64_t>(planes, 1);
  float* y = ctx.outputs[0].data<float>();
#pragma omp parallel for num_threads(ThreadsFor(x.numel()))
  for (int64_t c = 0; c < planes; ++c) {
    const float* xc = x.data<float>() + c * size;
    if (kMax) {
      y[c] = size > 0 ? *std::max_element(xc, xc + size) : -std::numeric_limits<float>::infinity();
    } else {
      double sum = 0.0;
      for (int64_t i = 0; i < size; ++i) sum += xc[i];
      y[c] = size > 0 ? static_cast<float>(sum / static_cast<double>(size)) : 0.0f;
    }
  }
  return absl::OkStatus();
}

Status RunGlobalMaxPool(const KernelContext& ctx) { return RunFloat(ctx, RunGlobalPoolF32<true>); }
Status RunGlobalAveragePool(const KernelContext& ctx) { return RunFloat(ctx, RunGlobalPoolF32<false>); }

// ---- Resize (spec: Resize-10/11/13/18/19), Upsample (spec: Upsample-7/9) ---------------------------

enum class CoordMode { kHalfPixel, kPytorchHalfPixel, kAlignCorners, kAsymmetric, kTfHalfPixelForNearest };
// kLegacy: Resize-10 and Upsample, whose spec gives no rounding rule: floor when enlarging an
// axis, ceil when shrinking it, as ONNX Runtime does (upsamplebase.h, "simple" nearest mode).
enum class NearestMode { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil, kLegacy };

struct ResizeSetup {
  bool linear = false;
  CoordMode coord = CoordMode::kHalfPixel;
  NearestMode nearest = NearestMode::kRoundPreferFloor;
  std::vector<float> scales;  // per axis; out/in where sizes were given
  Shape out;
};

// `scales` / `sizes` are empty when absent. Opset < 11 (Resize-10, Upsample) uses asymmetric
// coordinates and the legacy nearest rule.
StatusOr<ResizeSetup> ResizeSetupOf(const ShapeContext& ctx, std::vector<float> scales,
                                    std::vector<int64_t> sizes) {
  const Node& node = ctx.node;
  const Shape& in = ctx.input_types[0].shape;
  const int64_t r = static_cast<int64_t>(in.size());
  ResizeSetup s;
  const std::string mode = node.GetString("mode", "nearest");
  if (mode == "linear") {
    s.linear = true;
  } else if (mode != "nearest") {
    return NodeUnimplemented(node, "mode '", mode, "' is not supported (nearest, linear are)");
  }
  if (ctx.opset < 11) {
    s.coord = CoordMode::kAsymmetric;
    s.nearest = NearestMode::kLegacy;
  } else {
    const std::string coord = node.GetString("coordinate_transformation_mode", "half_pixel");
    const std::string nearest = node.GetString("nearest_mode", "round_prefer_floor");
    if (coord == "half_pixel")
      s.coord = CoordMode::kHalfPixel;
    else if (coord == "pytorch_half_pixel")
      s.coord = CoordMode::kPytorchHalfPixel;
    else if (coord == "align_corners")
      s.coord = CoordMode::kAlignCorners;
    else if (coord == "asymmetric")
      s.coord = CoordMode::kAsymmetric;
    else if (coord == "tf_half_pixel_for_nearest")
      s.coord = CoordMode::kTfHalfPixelForNearest;
    else
      return NodeUnimplemented(node, "coordinate_transformation_mode '", coord, "' is not supported");
    if (nearest == "round_prefer_floor")
      s.nearest = NearestMode::kRoundPreferFloor;
    else if (nearest == "round_prefer_ceil")
      s.nearest = NearestMode::kRoundPreferCeil;
    else if (nearest == "floor")
      s.nearest = NearestMode::kFloor;
    else if (nearest == "ceil")
      s.nearest = NearestMode::kCeil;
    else
      return NodeError(node, "unknown nearest_mode '", nearest, "'");
  }
  if (ctx.opset >= 18 && node.GetInt("antialias", 0) != 0)
    return NodeUnimplemented(node, "antialias=1 is not supported");
  if (ctx.opset >= 18 && !sizes.empty() &&
      node.GetString("keep_aspect_ratio_policy", "stretch") != "stretch") {
    return NodeUnimplemented(node, "keep_aspect_ratio_policy '",
                             node.GetString("keep_aspect_ratio_policy", ""), "' is not supported");
  }
  std::vector<int64_t> axes(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) axes[d] = d;
  if (ctx.opset >= 18 && node.HasAttr("axes")) {
    axes.clear();
    for (int64_t a : node.GetInts("axes")) {
      VIGIL_ASSIGN_OR_RETURN(int64_t na, NormalizeAxis(node, a, r));
      axes.push_back(na);
    }
  }
  if (scales.empty() == sizes.empty())
    return NodeError(node, "exactly one of scales and sizes must be given");
  const size_t given = std::max(scales.size(), sizes.size());
  if (given != axes.size()) {
    return NodeError(node, scales.empty() ? "sizes " : "scales ", "have ", given, " entries for ",
                     axes.size(), " axes of input ", ShapeToString(in));
  }
  s.scales.assign(static_cast<size_t>(r), 1.0f);
  s.out = in;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i];
    if (!scales.empty()) {
      if (!(scales[i] > 0.0f) || !std::isfinite(scales[i]))
        return NodeError(node, "scale ", scales[i], " for axis ", a, " must be positive");
      const double out = std::floor(static_cast<double>(in[a]) * scales[i]);
      if (out >= 1099511627776.0)
        return NodeError(node, "scale ", scales[i], " for axis ", a, " gives an output too large");
      s.scales[a] = scales[i];
      s.out[a] = static_cast<int64_t>(out);
    } else {
      if (sizes[i] < 0) return NodeError(node, "size ", sizes[i], " for axis ", a, " is negative");
      s.out[a] = sizes[i];
      s.scales[a] = in[a] > 0 ? static_cast<float>(sizes[i]) / static_cast<float>(in[a]) : 1.0f;
    }
  }
  if (s.linear) {  // bilinear over the last two axes; the others must stay as they are
    for (int64_t d = 0; d + 2 < r; ++d) {
      if (s.out[d] != in[d] || s.scales[d] != 1.0f) {
        return NodeUnimplemented(node, "linear resize of axis ", d,
                                 " is not supported (only the last two axes)");
      }
    }
  }
  return s;
}

// Present, constant float input i (empty when omitted or given as an empty tensor).
StatusOr<std::vector<float>> ConstFloats(const ShapeContext& ctx, size_t i, const char* what) {
  if (!ctx.node.HasInput(i)) return std::vector<float>{};
  const Tensor* t = i < ctx.input_values.size() ? ctx.input_values[i] : nullptr;
  if (!t) return NodeUnimplemented(ctx.node, "input ", i, " (", what, ") must be a constant known at load");
  return t->ToFloatVector();
}

StatusOr<ResizeSetup> ResizeOf(const ShapeContext& ctx) {
  if (ctx.node.op_type == "Upsample") {
    if (ctx.opset < 9) return ResizeSetupOf(ctx, ctx.node.GetFloats("scales"), {});
    VIGIL_ASSIGN_OR_RETURN(std::vector<float> scales, ConstFloats(ctx, 1, "scales"));
    return ResizeSetupOf(ctx, scales, {});
  }
  if (ctx.opset < 11) {
    VIGIL_ASSIGN_OR_RETURN(std::vector<float> scales, ConstFloats(ctx, 1, "scales"));
    return ResizeSetupOf(ctx, scales, {});
  }
  VIGIL_ASSIGN_OR_RETURN(std::vector<float> scales, ConstFloats(ctx, 2, "scales"));
  std::vector<int64_t> sizes;
  if (ctx.node.HasInput(3)) {
    VIGIL_ASSIGN_OR_RETURN(sizes, ConstInt64Input(ctx, 3, "sizes"));
  }
  return ResizeSetupOf(ctx, scales, sizes);
}

Status InferResize(const ShapeContext& ctx, Types* out) {
  // Inputs: Upsample-7 (X), Upsample-9 and Resize-10 (X, scales), Resize-11 (X, roi, scales, sizes).
  const bool upsample = ctx.node.op_type == "Upsample";
  const size_t fixed = upsample && ctx.opset < 9 ? 1 : 2;
  VIGIL_RETURN_IF_ERROR(upsample || ctx.opset < 11 ? CheckInputCount(ctx, fixed, fixed)
                                                   : CheckInputCount(ctx, 1, 4));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(ResizeSetup s, ResizeOf(ctx));
  if (s.linear) VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  *out = {{ctx.input_types[0].dtype, s.out}};
  return absl::OkStatus();
}

// Input coordinate of output coordinate x along an axis (spec: coordinate_transformation_mode),
// computed in float as ONNX Runtime does.
float ToInputCoordinate(CoordMode mode, int64_t x, float scale, int64_t in, int64_t out) {
  const float xf = static_cast<float>(x);
  switch (mode) {
    case CoordMode::kHalfPixel:
      return (xf + 0.5f) / scale - 0.5f;
    case CoordMode::kPytorchHalfPixel:
      return out > 1 ? (xf + 0.5f) / scale - 0.5f : 0.0f;
    case CoordMode::kAlignCorners:
      return out == 1 ? 0.0f : xf * static_cast<float>(in - 1) / static_cast<float>(out - 1);
    case CoordMode::kAsymmetric:
      return xf / scale;
    case CoordMode::kTfHalfPixelForNearest:
      return (xf + 0.5f) / scale;
  }
  return 0.0f;
}

// Nearest input index (spec: nearest_mode), clamped to [0, in-1].
int64_t NearestIndex(NearestMode mode, float c, float scale, int64_t in) {
  const float f = std::floor(c);
  const bool half = c - f == 0.5f;
  float v = 0.0f;
  switch (mode) {
    case NearestMode::kRoundPreferFloor:
      v = half ? f : std::round(c);
      break;
    case NearestMode::kRoundPreferCeil:
      v = half ? f + 1.0f : std::round(c);
      break;
    case NearestMode::kFloor:
      v = f;
      break;
    case NearestMode::kCeil:
      v = std::ceil(c);
      break;
    case NearestMode::kLegacy:
      v = scale < 1.0f ? std::ceil(c) : f;
      break;
  }
  return std::clamp<int64_t>(static_cast<int64_t>(std::clamp(v, -1.0f, static_cast<float>(in))), 0, in - 1);
}

// Nearest: copies whole elements, so every dtype works.
Status RunResizeNearest(const KernelContext& ctx) {
  VIGIL_ASSIGN_OR_RETURN(ResizeSetup s, ResizeOf(ContextOf(ctx)));
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return absl::OkStatus();
  if (y.rank() == 0 || x.numel() == 0) {
    if (x.numel() == 0)
      return NodeError(ctx.node, "cannot resize the empty input ", ShapeToString(x.shape()), " to ",
                       ShapeToString(y.shape()));
    std::memcpy(y.raw(), x.raw(), y.nbytes());
    return absl::OkStatus();
  }
  const int r = x.rank();
  std::vector<std::vector<int64_t>> index(static_cast<size_t>(r));  // per axis: input index · input stride
  int64_t stride = 1;
  for (int d = r - 1; d >= 0; --d) {
    for (int64_t o = 0; o < y.dim(d); ++o) {
      const float c = ToInputCoordinate(s.coord, o, s.scales[d], x.dim(d), y.dim(d));
      index[d].push_back(NearestIndex(s.nearest, c, s.scales[d], x.dim(d)) * stride);
    }
    stride *= x.dim(d);
  }
  const int64_t e = static_cast<int64_t>(DTypeSize(x.dtype())), len = y.dim(-1), rows = y.numel() / len;
  const uint8_t* src = static_cast<const uint8_t*>(x.raw());
  uint8_t* dst = static_cast<uint8_t*>(y.raw());
#pragma omp parallel for num_threads(ThreadsFor(y.numel()))
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0;
    for (int64_t d = r - 2, rem = row; d >= 0; --d) {
      off += index[d][rem % y.dim(static_cast<int>(d))];
      rem /= y.dim(static_cast<int>(d));
    }
    for (int64_t j = 0; j < len; ++j) {
      std::memcpy(dst + (row * len + j) * e, src + (off + index[r - 1][j]) * e, static_cast<size_t>(e));
    }
  }
  return absl::OkStatus();
}

// Linear interpolation taps along one axis: input indices i0, i1 and the weight of i1.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<float> w1;
};

Taps LinearTaps(const ResizeSetup& s, int axis, int64_t in, int64_t out) {
  Taps t;
  for (int64_t o = 0; o < out; ++o) {
    const float c =
        std::clamp(ToInputCoordinate(s.coord, o, s.scales[axis], in, out), 0.0f, static_cast<float>(in - 1));
    const int64_t i0 = std::min(static_cast<int64_t>(c), in - 1);
    t.i0.push_back(i0);
    t.i1.push_back(std::min(i0 + 1, in - 1));
    t.w1.push_back(c - static_cast<float>(i0));
  }
  return t;
}

// Bilinear over the last two axes (the spec's "linear" mode; an input coordinate outside
// [0, in-1] takes the edge value, as in the spec's reference implementation).
Status RunResizeLinearF32(const KernelContext& ctx) {
  VIGIL_ASSIGN_OR_RETURN(ResizeSetup s, ResizeOf(ContextOf(ctx)));
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return absl::OkStatus();
  if (x.numel() == 0) return NodeError(ctx.node, "cannot resize the empty input ", ShapeToString(x.shape()));
  const int r = x.rank();
  const int64_t h = r >= 2 ? x.dim(-2) : 1, w = r >= 1 ? x.dim(-1) : 1;
  const int64_t oh = r >= 2 ? y.dim(-2) : 1, ow = r >= 1 ? y.dim(-1) : 1;
  const Taps th = r >= 2 ? LinearTaps(s, r - 2, h, oh) : Taps{{0}, {0}, {0.0f}};
  const Taps tw = r >= 1 ? LinearTaps(s, r - 1, w, ow) : Taps{{0}, {0}, {0.0f}};
  const int64_t planes = x.numel() / (h * w);
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
#pragma omp parallel for num_threads(ThreadsFor(y.numel()))
  for (int64_t pr = 0; pr < planes * oh; ++pr) {
    const int64_t p = pr / oh, i = pr % oh;
    const float* r0 = xs + (p * h + th.i0[i]) * w;
    const float* r1 = xs + (p * h + th.i1[i]) * w;
    const float wy = th.w1[i];
    float* out = ys + pr * ow;
    for (int64_t j = 0; j < ow; ++j) {
      const float wx = tw.w1[j];
      const float top = r0[tw.i0[j]] + wx * (r0[tw.i1[j]] - r0[tw.i0[j]]);
      const float bottom = r1[tw.i0[j]] + wx * (r1[tw.i1[j]] - r1[tw.i0[j]]);
      out[j] = top + wy * (bottom - top);
    }
  }
  return absl::OkStatus();
}

Status RunResize(const KernelContext& ctx) {
  return ctx.node.GetString("mode", "nearest") == "linear" ? RunFloat(ctx, RunResizeLinearF32)
                                                           : RunResizeNearest(ctx);
}

// ---- BatchNormalization (spec: BatchNormalization-7/9/14/15, inference mode) -----------------------

Status InferBatchNorm(const ShapeContext& ctx, Types* out) {
  const Node& node = ctx.node;
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 5, 5));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(node, 1, 5));
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (!node.outputs[i].empty())
      return NodeUnimplemented(node, "training outputs (running mean/variance) are not supported");
  }
  if (ctx.opset >= 14 && node.GetInt("training_mode", 0) != 0)
    return NodeUnimplemented(node, "training_mode=1 is not supported");
  if (ctx.opset < 9 && node.GetInt("spatial", 1) == 0)
    return NodeUnimplemented(node, "spatial=0 is not supported");
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  VIGIL_RETURN_IF_ERROR(CheckRankAtLeast(ctx, 0, 2, "N x C x ..."));
  const Shape& x = ctx.input_types[0].shape;
  for (size_t i = 1; i < 5; ++i) {
    VIGIL_RETURN_IF_ERROR(CheckDType(ctx, i, {DType::kFloat32, DType::kFloat16}));
    if (ctx.input_types[i].shape != Shape{x[1]}) {
      return NodeError(node, "input ", i, " ", ShapeToString(ctx.input_types[i].shape), " must have shape [",
                       x[1], "] for input X ", ShapeToString(x));
    }
  }
  out->assign(node.outputs.size(), TensorType{});  // optional training outputs stay omitted
  (*out)[0] = {ctx.input_types[0].dtype, x};
  return absl::OkStatus();
}

// y = scale · (x - mean) / sqrt(var + epsilon) + B, per channel.
Status RunBatchNormF32(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const float eps = ctx.node.GetFloat("epsilon", 1e-5f);
  const int64_t n = x.dim(0), c = x.dim(1), size = x.numel() / std::max<int64_t>(n * c, 1);
  const float *scale = ctx.inputs[1].data<float>(), *bias = ctx.inputs[2].data<float>();
  const float *mean = ctx.inputs[3].data<float>(), *var = ctx.inputs[4].data<float>();
  float* y = ctx.outputs[0].data<float>();
#pragma omp parallel for num_threads(ThreadsFor(x.numel()))
  for (int64_t pc = 0; pc < n * c; ++pc) {
    const int64_t ch = pc % c;
    const float a = scale[ch] / std::sqrt(var[ch] + eps), b = bias[ch] - mean[ch] * a;
    const float* xs = x.data<float>() + pc * size;
    for (int64_t i = 0; i < size; ++i) y[pc * size + i] = xs[i] * a + b;
  }
  return absl::OkStatus();
}

Status RunBatchNorm(const KernelContext& ctx) {
  for (const Tensor& t : ctx.inputs) {
    if (t.dtype() == DType::kFloat16) return RunAsFloat32(ctx, RunBatchNormF32);
  }
  return RunBatchNormF32(ctx);
}

// ---- DepthToSpace (spec: DepthToSpace-13, modes DCR and CRD), SpaceToDepth (spec: -13) -------------

StatusOr<int64_t> BlockSizeOf(const ShapeContext& ctx) {
  const Shape& x = ctx.input_types[0].shape;
  if (x.size() != 4)
    return NodeError(ctx.node, "input ", ShapeToString(x), " must have rank 4 (N x C x H x W)");
  const int64_t b = ctx.node.GetInt("blocksize", 0);
  if (b < 1) return NodeError(ctx.node, "blocksize ", b, " must be >= 1");
  return b;
}

Status InferDepthToSpace(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(int64_t b, BlockSizeOf(ctx));
  const Shape& x = ctx.input_types[0].shape;
  if (x[1] % (b * b) != 0)
    return NodeError(ctx.node, "channels of ", ShapeToString(x), " are not divisible by blocksize² ", b * b);
  const std::string mode = ctx.node.GetString("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") return NodeError(ctx.node, "unknown mode '", mode, "' (DCR or CRD)");
  *out = {{ctx.input_types[0].dtype, {x[0], x[1] / (b * b), x[2] * b, x[3] * b}}};
  return absl::OkStatus();
}

Status InferSpaceToDepth(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(int64_t b, BlockSizeOf(ctx));
  const Shape& x = ctx.input_types[0].shape;
  if (x[2] % b != 0 || x[3] % b != 0)
    return NodeError(ctx.node, "height and width of ", ShapeToString(x), " are not divisible by blocksize ",
                     b);
  *out = {{ctx.input_types[0].dtype, {x[0], x[1] * b * b, x[2] / b, x[3] / b}}};
  return absl::OkStatus();
}

// Both ops move the element (n, c, h·b + i, w·b + j) of the "space" tensor [N, C, H·b, W·b] to the
// "depth" tensor [N, C·b², H, W] at channel (i·b + j)·C + c (DCR, and SpaceToDepth) or c·b² + i·b + j (CRD).
Status RunBlockShuffle(const KernelContext& ctx, bool to_space) {
  const int64_t b = ctx.node.GetInt("blocksize", 1);
  const bool crd = to_space && ctx.node.GetString("mode", "DCR") == "CRD";
  const Tensor& depth = to_space ? ctx.inputs[0] : ctx.outputs[0];
  const int64_t n = depth.dim(0), c = depth.dim(1) / (b * b), h = depth.dim(2), w = depth.dim(3);
  const int64_t e = static_cast<int64_t>(DTypeSize(depth.dtype()));
  const uint8_t* src = static_cast<const uint8_t*>(ctx.inputs[0].raw());
  uint8_t* dst = static_cast<uint8_t*>(ctx.outputs[0].raw());
  const int64_t rows = n * c * h * b;  // rows of the space tensor
#pragma omp parallel for num_threads(ThreadsFor(depth.numel()))
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t i = row % b, hh = (row / b) % h, cc = (row / (b * h)) % c, nn = row / (b * h * c);
    for (int64_t ww = 0; ww < w; ++ww) {
      for (int64_t j = 0; j < b; ++j) {
        const int64_t ch = crd ? cc * b * b + i * b + j : (i * b + j) * c + cc;
        const int64_t d = ((nn * c * b * b + ch) * h + hh) * w + ww;                // depth-tensor element
        const int64_t s = (((nn * c + cc) * h + hh) * b + i) * w * b + ww * b + j;  // space-tensor element
        std::memcpy(dst + (to_space ? s : d) * e, src + (to_space ? d : s) * e, static_cast<size_t>(e));
      }
    }
  }
  return absl::OkStatus();
}

Status RunDepthToSpace(const KernelContext& ctx) { return RunBlockShuffle(ctx, true); }
Status RunSpaceToDepth(const KernelContext& ctx) { return RunBlockShuffle(ctx, false); }

}  // namespace

std::vector<OpSchema> NnOps() {
  return {
      {"", "Conv", 1, InferConv, RunConv},
      {"vigil", "FusedConv", 1, InferConv, RunConv},
      {"", "MaxPool", 1, InferMaxPool, RunMaxPool},
      {"", "AveragePool", 1, InferAveragePool, RunAveragePool},
      {"", "GlobalAveragePool", 1, InferGlobalPool, RunGlobalAveragePool},
      {"", "GlobalMaxPool", 1, InferGlobalPool, RunGlobalMaxPool},
      {"", "Resize", 10, InferResize, RunResize},
      {"", "Upsample", 7, InferResize, RunResize},
      {"", "BatchNormalization", 7, InferBatchNorm, RunBatchNorm},
      {"", "DepthToSpace", 1, InferDepthToSpace, RunDepthToSpace},
      {"", "SpaceToDepth", 1, InferSpaceToDepth, RunSpaceToDepth},
  };
}

}  // namespace vigil::infer
