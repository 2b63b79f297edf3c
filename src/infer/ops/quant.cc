// quant.cc — reference kernels for ONNX quantization operators (https://onnx.ai/onnx/operators/):
// QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, ConvInteger, and vigil's DynamicFakeQuantize.
//
// Rounding is to nearest, ties to even (std::nearbyint in the default rounding mode), as the spec
// requires; quantized values saturate to the integer type's range. Scales and zero points are
// per tensor (one element) or, from opset 13, per axis (a 1-D tensor of x.shape[axis] values,
// attribute `axis`, default 1). Opset 21's blocked quantization (block_size) is not supported.
#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <utility>

#include "infer/ops/op_lists.h"
#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

// saturate(round(v) + zero_point) into Q, rounding half to even before the zero point is added
// (as the spec orders it: the two differ on ties when the zero point is odd). NaN gives Q's lowest.
template <typename Q>
Q QuantizeValue(float v, float zero_point) {
  constexpr float lo = std::numeric_limits<Q>::lowest(), hi = std::numeric_limits<Q>::max();
  v = std::nearbyint(v) + zero_point;
  v = v > lo ? v : lo;
  return static_cast<Q>(v < hi ? v : hi);
}

// Validates scale input `si` and optional zero point `zi` for input 0 of the node and returns
// the normalised axis (meaningful only for per-axis parameters).
StatusOr<int64_t> CheckQuantParams(const ShapeContext& ctx, size_t si, size_t zi) {
  if (ctx.node.GetInt("block_size", 0) != 0)
    return NodeUnimplemented(ctx.node, "blocked quantization is not supported");
  const Shape& x = ctx.input_types[0].shape;
  const Shape& scale = ctx.input_types[si].shape;
  int64_t axis = 0;
  if (NumElements(scale) != 1) {
    if (scale.size() != 1)
      return NodeError(ctx.node, "scale must be a scalar or 1-D, got ", ShapeToString(scale));
    VIGIL_ASSIGN_OR_RETURN(
        axis, NormalizeAxis(ctx.node, ctx.node.GetInt("axis", 1), static_cast<int64_t>(x.size())));
    if (scale[0] != x[axis]) {
      return NodeError(ctx.node, "per-axis scale ", ShapeToString(scale), " does not match input ",
                       ShapeToString(x), " along axis ", axis);
    }
  }
  // A scalar and a one-element 1-D tensor are the same per-tensor parameter (exporters mix them).
  const Shape& zp = ctx.input_types[zi].shape;
  if (ctx.node.HasInput(zi) && zp != scale && !(NumElements(zp) == 1 && NumElements(scale) == 1)) {
    return NodeError(ctx.node, "zero point ", ShapeToString(ctx.input_types[zi].shape), " and scale ",
                     ShapeToString(scale), " differ in shape");
  }
  return axis;
}

// Iterates x as [outer, channels, inner] around `axis` for per-axis parameters (channels = 1
// for per-tensor ones) and calls fn(begin, count, channel) for each contiguous run.
template <typename Fn>
void ForEachChannelRun(const Shape& x, int64_t axis, int64_t channels, Fn fn) {
  const int64_t numel = NumElements(x);
  const int64_t inner = channels == 1 ? numel : NumElements(Shape(x.begin() + axis + 1, x.end()));
  const int64_t runs = inner == 0 ? 0 : numel / inner;
#pragma omp parallel for num_threads(ThreadsFor(numel))
  for (int64_t r = 0; r < runs; ++r) fn(r * inner, inner, channels == 1 ? 0 : r % channels);
}

// ---- QuantizeLinear-10/13/19/21: y = saturate(round(x / y_scale) + y_zero_point); y has the
// zero point's dtype, uint8 when it is omitted.

Status InferQuantize(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, {DType::kFloat32, DType::kFloat16}));
  DType dtype = DType::kUInt8;
  if (ctx.node.HasInput(2)) {
    VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 2, {DType::kUInt8, DType::kInt8}));
    dtype = ctx.input_types[2].dtype;
  }
  VIGIL_RETURN_IF_ERROR(CheckQuantParams(ctx, 1, 2).status());
  *out = {TensorType{dtype, ctx.input_types[0].shape}};
  return absl::OkStatus();
}

template <typename Q>
void Quantize(const float* x, const Shape& shape, int64_t axis, const std::vector<float>& scale,
              const std::vector<int64_t>& zp, Q* y) {
  ForEachChannelRun(shape, axis, static_cast<int64_t>(scale.size()),
                    [&](int64_t begin, int64_t n, int64_t c) {
                      const float s = scale[c], z = static_cast<float>(zp[c]);
                      for (int64_t i = begin; i < begin + n; ++i) y[i] = QuantizeValue<Q>(x[i] / s, z);
                    });
}

Status RunQuantize(const KernelContext& ctx) {
  const Tensor x = ctx.inputs[0].ToFloat32();
  const std::vector<float> scale = ctx.inputs[1].ToFloatVector();
  const bool has_zp = ctx.inputs.size() > 2 && ctx.inputs[2].defined();
  const std::vector<int64_t> zp =
      has_zp ? ctx.inputs[2].ToInt64Vector() : std::vector<int64_t>(scale.size(), 0);
  int64_t axis = ctx.node.GetInt("axis", 1);
  if (axis < 0) axis += x.rank();
  Tensor& y = ctx.outputs[0];
  if (y.dtype() == DType::kUInt8) {
    Quantize(x.data<float>(), x.shape(), axis, scale, zp, y.data<uint8_t>());
  } else {
    Quantize(x.data<float>(), x.shape(), axis, scale, zp, y.data<int8_t>());
  }
  return absl::OkStatus();
}

// ---- DequantizeLinear-10/13/19/21: y = (x − x_zero_point) · x_scale; y has the scale's dtype.

Status InferDequantize(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kUInt8, DType::kInt8, DType::kInt32}));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, {DType::kFloat32, DType::kFloat16}));
  if (ctx.node.HasInput(2)) VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 2));
  VIGIL_RETURN_IF_ERROR(CheckQuantParams(ctx, 1, 2).status());
  *out = {TensorType{ctx.input_types[1].dtype, ctx.input_types[0].shape}};
  return absl::OkStatus();
}

Status RunDequantize(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const std::vector<float> scale = ctx.inputs[1].ToFloatVector();
  const bool has_zp = ctx.inputs.size() > 2 && ctx.inputs[2].defined();
  const std::vector<int64_t> zp =
      has_zp ? ctx.inputs[2].ToInt64Vector() : std::vector<int64_t>(scale.size(), 0);
  int64_t axis = ctx.node.GetInt("axis", 1);
  if (axis < 0) axis += x.rank();
  Tensor& y = ctx.outputs[0];
  const bool half = y.dtype() == DType::kFloat16;
  DispatchDType<uint8_t, int8_t, int32_t>(x.dtype(), [&](auto tag) {
    using Q = decltype(tag);
    const Q* q = x.data<Q>();
    ForEachChannelRun(x.shape(), axis, static_cast<int64_t>(scale.size()),
                      [&](int64_t begin, int64_t n, int64_t c) {
                        const float s = scale[c];
                        const int64_t z = zp[c];
                        for (int64_t i = begin; i < begin + n; ++i) {
                          const float v = static_cast<float>(static_cast<int64_t>(q[i]) - z) * s;
                          if (half) {
                            y.data<uint16_t>()[i] = FloatToHalf(v);
                          } else {
                            y.data<float>()[i] = v;
                          }
                        }
                      });
  });
  return absl::OkStatus();
}

// ---- DynamicQuantizeLinear-11 (uint8): with lo = min(0, min x), hi = max(0, max x):
// y_scale = (hi − lo) / 255 (1/255 when hi == lo, as in the ONNX reference implementation),
// y_zero_point = saturate(round(−lo / y_scale)), y = saturate(round(x / y_scale) + y_zero_point).

Status InferDynamicQuantize(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 3, 3));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32}));
  *out = {TensorType{DType::kUInt8, ctx.input_types[0].shape}, TensorType{DType::kFloat32, {}},
          TensorType{DType::kUInt8, {}}};
  return absl::OkStatus();
}

// DynamicQuantizeLinear's scale and zero point for the n values at px.
#if defined(__x86_64__)
// min(lo, x[0..n)) and max(hi, x[0..n)) eight lanes at a time (NaN-free inputs: the order does not matter).
__attribute__((target("avx2"))) void RangeAvx2(const float* x, int64_t n, float* lo, float* hi) {
  __m256 l = _mm256_set1_ps(*lo), h = _mm256_set1_ps(*hi);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    l = _mm256_min_ps(l, v);
    h = _mm256_max_ps(h, v);
  }
  alignas(32) float ls[8], hs[8];
  _mm256_store_ps(ls, l);
  _mm256_store_ps(hs, h);
  for (int k = 0; k < 8; ++k) *lo = std::min(*lo, ls[k]), *hi = std::max(*hi, hs[k]);
  for (; i < n; ++i) *lo = std::min(*lo, x[i]), *hi = std::max(*hi, x[i]);
}

// y = (clamp(round_half_even(x / scale) + z, 0, 255) − z) · step, eight lanes at a time: the scalar formula's
// operations (an IEEE division, the round-to-nearest-even instruction), so the same bits.
__attribute__((target("avx2"))) void FakeQuantizeAvx2(const float* x, float* y, int64_t n, float scale, float z,
                                                      float step) {
  const __m256 s = _mm256_set1_ps(scale), zz = _mm256_set1_ps(z), st = _mm256_set1_ps(step);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 q = _mm256_min_ps(top, _mm256_max_ps(zero, _mm256_add_ps(r, zz)));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_sub_ps(q, zz), st));
  }
  for (; i < n; ++i) y[i] = (std::min(255.f, std::max(0.f, std::nearbyint(x[i] / scale) + z)) - z) * step;
}

bool HasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
#endif

std::pair<float, uint8_t> DynamicQuantParams(const float* px, int64_t n) {
  float lo = 0.f, hi = 0.f;
#if defined(__x86_64__)
  if (HasAvx2()) {
    const int threads = ThreadsFor(n);
    const int64_t chunk = (n + threads - 1) / threads;
#pragma omp parallel for reduction(min : lo) reduction(max : hi) num_threads(threads)
    for (int t = 0; t < threads; ++t) {
      const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
      if (begin < end) RangeAvx2(px + begin, end - begin, &lo, &hi);
    }
  } else
#endif
  {
#pragma omp parallel for reduction(min : lo) reduction(max : hi) num_threads(ThreadsFor(n))
    for (int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, px[i]);
      hi = std::max(hi, px[i]);
    }
  }
  const float scale = (hi == lo ? 1.f : hi - lo) / 255.f;
  return {scale, QuantizeValue<uint8_t>(-lo / scale, 0.f)};
}

Status RunDynamicQuantize(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const float* px = x.data<float>();
  const int64_t n = x.numel();
  // Not a structured binding: clang < 16 (the thread-safety check's) cannot name one in an OpenMP region.
  const std::pair<float, uint8_t> params = DynamicQuantParams(px, n);
  const float scale = params.first;
  const uint8_t zp = params.second;
  uint8_t* y = ctx.outputs[0].data<uint8_t>();
#pragma omp parallel for num_threads(ThreadsFor(n))
  for (int64_t i = 0; i < n; ++i) y[i] = QuantizeValue<uint8_t>(px[i] / scale, zp);
  if (ctx.outputs[1].defined()) ctx.outputs[1].data<float>()[0] = scale;
  if (ctx.outputs[2].defined()) ctx.outputs[2].data<uint8_t>()[0] = zp;
  return absl::OkStatus();
}

// ---- vigil DynamicFakeQuantize: DynamicQuantizeLinear and its dequantization in one — the activation a
// ConvInteger / MatMulInteger fed by DynamicQuantizeLinear computes on, for the float convolution that replaces
// it (passes.h DequantizeWeights, EngineOptions::int8_activations). x float32 or float16 (computed in float32).
//  - centered 0 (default): y = (q − zp) · scale, one output of x's dtype;
//  - centered 1: y = q − zp as float (integers in [−255, 255]) and, as an optional second output, the scale
//    (float32 scalar): the exact integer product's operands, for a float convolution whose sums stay exact.
// Elementwise given its one global range, so any layout serves.

Status InferDynamicFakeQuantize(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  const bool centered = ctx.node.GetInt("centered", 0) != 0;
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, centered ? 2 : 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16}));
  *out = {ctx.input_types[0]};
  if (centered) out->push_back(TensorType{DType::kFloat32, {}});
  return absl::OkStatus();
}

Status RunDynamicFakeQuantizeF32(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const float* px = x.data<float>();
  const int64_t n = x.numel();
  // Not a structured binding: clang < 16 (the thread-safety check's) cannot name one in an OpenMP region.
  const std::pair<float, uint8_t> params = DynamicQuantParams(px, n);
  const float scale = params.first;
  const uint8_t zp = params.second;
  const bool centered = ctx.node.GetInt("centered", 0) != 0;
  const float step = centered ? 1.f : scale;
  float* y = ctx.outputs[0].data<float>();
  const float z = zp;
  const int threads = ThreadsFor(n);
  const int64_t chunk = (n + threads - 1) / threads;
#pragma omp parallel for num_threads(threads)
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
#if defined(__x86_64__)
    if (HasAvx2()) {
      if (begin < end) FakeQuantizeAvx2(px + begin, y + begin, end - begin, scale, z, step);
      continue;
    }
#endif
    for (int64_t i = begin; i < end; ++i) {  // QuantizeValue's arithmetic
      y[i] = (std::min(255.f, std::max(0.f, std::nearbyint(px[i] / scale) + z)) - z) * step;
    }
  }
  if (ctx.outputs.size() > 1 && ctx.outputs[1].defined()) ctx.outputs[1].data<float>()[0] = scale;
  return absl::OkStatus();
}

Status RunDynamicFakeQuantize(const KernelContext& ctx) {
  if (ctx.inputs[0].dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunDynamicFakeQuantizeF32);
  return RunDynamicFakeQuantizeF32(ctx);
}

// ---- ConvInteger-10: Y (int32) = Conv(x − x_zero_point, w − w_zero_point) with Conv's attributes
// (auto_pad, dilations, group, kernel_shape, pads, strides; Conv-11 output-size formula). x, w are
// uint8 or int8 in NCHW / MCkHkW (1-D convolutions as [N,C,W] / [M,C,kW]); x_zero_point is a
// scalar, w_zero_point a scalar or one value per output channel M. Padded positions contribute 0
// (they hold the zero point).

// Geometry of a 2-D convolution (1-D ones have h = kh = oh = 1).
struct ConvGeom {
  int64_t n, c, h, w, m, kh, kw, oh, ow, group;
  int64_t stride[2], dilation[2], pad[2];  // pad: at the beginning of each spatial axis
  Shape out;
};

StatusOr<ConvGeom> ConvGeometry(const Node& node, const Shape& x, const Shape& w) {
  if ((x.size() != 3 && x.size() != 4) || w.size() != x.size()) {
    return NodeUnimplemented(node, "only 1-D and 2-D convolutions are supported, got x ", ShapeToString(x),
                             " and w ", ShapeToString(w));
  }
  const size_t s = x.size() - 2;  // spatial rank
  const std::vector<int64_t> strides = node.GetInts("strides", std::vector<int64_t>(s, 1));
  const std::vector<int64_t> dilations = node.GetInts("dilations", std::vector<int64_t>(s, 1));
  std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * s, 0));
  const std::vector<int64_t> kernel = node.GetInts("kernel_shape", Shape(w.begin() + 2, w.end()));
  if (strides.size() != s || dilations.size() != s || pads.size() != 2 * s ||
      kernel != Shape(w.begin() + 2, w.end())) {
    return NodeError(node, "strides/dilations/pads/kernel_shape do not match the ", s, "-D weights ",
                     ShapeToString(w));
  }
  ConvGeom g{};
  g.group = node.GetInt("group", 1);
  g.n = x[0];
  g.c = x[1];
  g.m = w[0];
  if (g.group < 1 || g.c != w[1] * g.group || g.m % g.group != 0) {
    return NodeError(node, "input ", ShapeToString(x), " and weights ", ShapeToString(w),
                     " do not fit group ", g.group);
  }
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  int64_t in[2] = {1, x.back()}, k[2] = {1, w.back()}, out[2] = {1, 1};
  if (s == 2) {
    in[0] = x[2];
    k[0] = w[2];
  }
  for (size_t i = 0; i < 2; ++i) {
    const size_t a = i + s - 2;  // index into the attribute lists (1-D: only i == 1)
    const bool real = i + s >= 2;
    g.stride[i] = real ? strides[a] : 1;
    g.dilation[i] = real ? dilations[a] : 1;
    if (g.stride[i] < 1 || g.dilation[i] < 1) return NodeError(node, "strides and dilations must be >= 1");
    const int64_t extent = g.dilation[i] * (k[i] - 1) + 1;
    int64_t begin = real ? pads[a] : 0, end = real ? pads[a + s] : 0;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out[i] = (in[i] + g.stride[i] - 1) / g.stride[i];
      const int64_t total = std::max<int64_t>(0, (out[i] - 1) * g.stride[i] + extent - in[i]);
      begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end = total - begin;
    } else if (auto_pad == "VALID") {
      begin = end = 0;
    } else if (auto_pad != "NOTSET") {
      return NodeError(node, "unknown auto_pad '", auto_pad, "'");
    }
    if (in[i] + begin + end < extent) {
      return NodeError(node, "kernel ", ShapeToString(w), " is larger than the padded input ",
                       ShapeToString(x));
    }
    out[i] = (in[i] + begin + end - extent) / g.stride[i] + 1;
    g.pad[i] = begin;
  }
  g.h = in[0];
  g.w = in[1];
  g.kh = k[0];
  g.kw = k[1];
  g.oh = out[0];
  g.ow = out[1];
  g.out = {g.n, g.m};
  if (s == 2) g.out.push_back(g.oh);
  g.out.push_back(g.ow);
  return g;
}

Status InferConvInteger(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 4));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kUInt8, DType::kInt8}));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, {DType::kUInt8, DType::kInt8}));
  VIGIL_ASSIGN_OR_RETURN(ConvGeom g,
                         ConvGeometry(ctx.node, ctx.input_types[0].shape, ctx.input_types[1].shape));
  if (ctx.node.HasInput(2)) {
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 2));
    if (NumElements(ctx.input_types[2].shape) != 1) {
      return NodeError(ctx.node, "x_zero_point must be a scalar, got ",
                       ShapeToString(ctx.input_types[2].shape));
    }
  }
  if (ctx.node.HasInput(3)) {
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 1, 3));
    const int64_t count = NumElements(ctx.input_types[3].shape);
    if (count != 1 && count != g.m) {
      return NodeError(ctx.node, "w_zero_point must be a scalar or have ", g.m, " values, got ",
                       ShapeToString(ctx.input_types[3].shape));
    }
  }
  *out = {TensorType{DType::kInt32, g.out}};
  return absl::OkStatus();
}

Status RunConvInteger(const KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &w = ctx.inputs[1];
  VIGIL_ASSIGN_OR_RETURN(ConvGeom g, ConvGeometry(ctx.node, x.shape(), w.shape()));
  const int64_t xz = ctx.inputs.size() > 2 && ctx.inputs[2].defined() ? ctx.inputs[2].ToInt64Vector()[0] : 0;
  const std::vector<int64_t> wz = ctx.inputs.size() > 3 && ctx.inputs[3].defined()
                                      ? ctx.inputs[3].ToInt64Vector()
                                      : std::vector<int64_t>{0};
  const std::vector<int64_t> xv = x.ToInt64Vector(), wv = w.ToInt64Vector();
  const int64_t cg = g.c / g.group, mg = g.m / g.group, wsize = cg * g.kh * g.kw;
  int32_t* y = ctx.outputs[0].data<int32_t>();
#pragma omp parallel for num_threads(ThreadsFor(g.n* g.m* g.oh* g.ow* wsize))
  for (int64_t nm = 0; nm < g.n * g.m; ++nm) {
    const int64_t n = nm / g.m, m = nm % g.m, grp = m / mg;
    const int64_t z = wz[wz.size() == 1 ? 0 : m];
    int32_t* out = y + nm * g.oh * g.ow;
    std::fill_n(out, g.oh * g.ow, 0);
    for (int64_t c = 0; c < cg; ++c) {
      const int64_t* xc = xv.data() + ((n * g.c) + grp * cg + c) * g.h * g.w;
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          const int32_t wt = static_cast<int32_t>(wv[m * wsize + (c * g.kh + i) * g.kw + j] - z);
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            const int64_t iy = oy * g.stride[0] - g.pad[0] + i * g.dilation[0];
            if (iy < 0 || iy >= g.h) continue;
            for (int64_t ox = 0; ox < g.ow; ++ox) {
              const int64_t ix = ox * g.stride[1] - g.pad[1] + j * g.dilation[1];
              if (ix >= 0 && ix < g.w)
                out[oy * g.ow + ox] += wt * static_cast<int32_t>(xc[iy * g.w + ix] - xz);
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<OpSchema> QuantOps() {
  return {
      {"", "QuantizeLinear", 10, InferQuantize, RunQuantize},
      {"", "DequantizeLinear", 10, InferDequantize, RunDequantize},
      {"", "DynamicQuantizeLinear", 11, InferDynamicQuantize, RunDynamicQuantize},
      {"vigil", "DynamicFakeQuantize", 1, InferDynamicFakeQuantize, RunDynamicFakeQuantize},
      {"", "ConvInteger", 10, InferConvInteger, RunConvInteger},
  };
}

}  // namespace vigil::infer
