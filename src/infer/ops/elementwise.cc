// elementwise.cc — reference kernels for elementwise ONNX operators (https://onnx.ai/onnx/operators/):
// binary arithmetic and comparisons with multidirectional broadcasting, variadic Sum/Mean/Max/Min,
// logic ops, Where, unary activations and math functions, Clip, Cast, Identity, Dropout.
//
// float16 tensors are computed in float32 and rounded back (RunAsFloat32). Float32 loops run over
// contiguous rows (BroadcastPlan) with `omp simd` and are split over OpenMP threads when large.
// Integer division by zero yields 0 instead of trapping (ONNX leaves it undefined).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "infer/ops/op_lists.h"
#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements per parallel task

// ---- Dtype sets (ONNX type constraints) --------------------------------------------------------

const std::initializer_list<DType> kFloat = {DType::kFloat32, DType::kFloat16, DType::kFloat64};
const std::initializer_list<DType> kSigned = {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt8,
                                              DType::kInt16,   DType::kInt32,   DType::kInt64};
const std::initializer_list<DType> kNumeric = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                                               DType::kInt8,    DType::kUInt8,   DType::kInt16,
                                               DType::kInt32,   DType::kInt64};
const std::initializer_list<DType> kNumericBool = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                                                   DType::kInt8,    DType::kUInt8,   DType::kInt16,
                                                   DType::kInt32,   DType::kInt64,   DType::kBool};
const std::initializer_list<DType> kBoolOnly = {DType::kBool};

enum class Types { kFloat, kSigned, kNumeric, kNumericBool, kBool };
std::initializer_list<DType> TypeList(Types t) {
  switch (t) {
    case Types::kFloat: return kFloat;
    case Types::kSigned: return kSigned;
    case Types::kNumeric: return kNumeric;
    case Types::kNumericBool: return kNumericBool;
    case Types::kBool: return kBoolOnly;
  }
  return kFloat;
}

// Calls fn(T{}) for the C++ type of `dtype` within set kT (float16 excluded: see RunAsFloat32).
template <Types kT, typename Fn>
bool DispatchTypes(DType dtype, Fn&& fn) {
  if constexpr (kT == Types::kFloat) {
    return DispatchDType<float, double>(dtype, fn);
  } else if constexpr (kT == Types::kSigned) {
    return DispatchDType<float, double, int8_t, int16_t, int32_t, int64_t>(dtype, fn);
  } else if constexpr (kT == Types::kNumeric) {
    return DispatchDType<float, double, int8_t, uint8_t, int16_t, int32_t, int64_t>(dtype, fn);
  } else if constexpr (kT == Types::kNumericBool) {
    return DispatchDType<float, double, int8_t, uint8_t, int16_t, int32_t, int64_t, bool>(dtype, fn);
  } else {
    return DispatchDType<bool>(dtype, fn);
  }
}

template <typename T>
bool IsNaN(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(x);
  } else {
    return false;
  }
}

Status UnsupportedDType(const KernelContext& ctx, DType d) {
  return NodeError(ctx.node, "unsupported dtype ", DTypeName(d));
}

// ---- Loops -------------------------------------------------------------------------------------

// Calls fn(row, begin, n) for every chunk of every row of `plan`, in parallel for large outputs.
template <typename Fn>
void ParallelRows(const BroadcastPlan& plan, Fn fn) {
  const int64_t len = plan.row_length();
  if (len == 0 || plan.rows() == 0) return;
  const int64_t chunks = (len + kChunk - 1) / kChunk, tasks = plan.rows() * chunks;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(plan.rows() * len))
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t row = t / chunks, begin = (t % chunks) * kChunk;
    fn(row, begin, std::min(kChunk, len - begin));
  }
}

// out = f(a, b) with numpy broadcasting; `out` has the broadcast shape.
template <typename A, typename B, typename R, typename F>
void Binary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const Shape shapes[] = {a.shape(), b.shape()};
  const BroadcastPlan plan(shapes, out.shape());
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  R* po = out.data<R>();
  const int64_t sa = plan.inner_stride(0), sb = plan.inner_stride(1), len = plan.row_length();
  ParallelRows(plan, [&](int64_t row, int64_t begin, int64_t n) {
    const A* x = pa + plan.offset(0, row) + begin * sa;
    const B* y = pb + plan.offset(1, row) + begin * sb;
    R* z = po + row * len + begin;
    if (sa && sb) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
    } else if (sa) {
      const B yv = *y;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], yv);
    } else if (sb) {
      const A xv = *x;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) z[i] = f(xv, y[i]);
    } else {
      std::fill_n(z, n, static_cast<R>(f(*x, *y)));
    }
  });
}

// out[i] = f(in[i]) over `n` contiguous elements.
template <typename T, typename R, typename F>
void Map(const T* in, R* out, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) num_threads(ThreadsFor(n))
  for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]);
}

template <typename T>
T Negate(T x) {  // two's-complement wrap for the most negative integer instead of UB
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(x));
  } else {
    return -x;
  }
}

// ---- Binary and variadic arithmetic ------------------------------------------------------------
// Add-7/13/14, Sub-7/13/14, Mul-7/13/14, Div-7/13/14: broadcasting from opset 7 (the legacy
// `broadcast`/`axis` attributes of opset 6 are not supported). Sum-8/13, Mean-8/13, Max-8/12/13,
// Min-8/12/13: variadic with broadcasting.

// Binary ops are stateless generic lambdas; kernels call Op{}(a, b) (captureless closures are
// default-constructible in C++20). Arithmetic on int8/int16 promotes to int and is narrowed back.
using AddOp = decltype([](auto a, auto b) { return a + b; });
using SubOp = decltype([](auto a, auto b) { return a - b; });
using MulOp = decltype([](auto a, auto b) { return a * b; });
using DivOp = decltype([](auto a, auto b) {
  using T = decltype(a);
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return Negate(a);
    }
  }
  return static_cast<T>(a / b);
});
// Mod-10/13: fmod=0 takes the divisor's sign (Python's %), fmod=1 the dividend's (C fmod). The
// spec requires fmod=1 for floating point. Integer x % 0 gives 0, as Div does.
using ModOp = decltype([](auto a, auto b) {
  using T = decltype(a);
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return T(0);
    }
    T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    return r;
  } else {
    return static_cast<T>(std::fmod(a, b));
  }
});
using FModOp = decltype([](auto a, auto b) {
  using T = decltype(a);
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return T(0);
    }
    return static_cast<T>(a % b);
  } else {
    return static_cast<T>(std::fmod(a, b));
  }
});
// NaN propagates (as in numpy.maximum).
using MaxOp = decltype([](auto a, auto b) { return a < b || IsNaN(b) ? b : a; });
using MinOp = decltype([](auto a, auto b) { return b < a || IsNaN(b) ? b : a; });
using MeanOp = decltype([](auto a, auto b) { return a + b; });  // a distinct type: RunVariadic divides by n

template <Types kT>
Status InferVariadic(const ShapeContext& ctx, std::vector<TensorType>* out) {
  const size_t n = ctx.node.NumInputs();
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, std::max<size_t>(n, 1), std::max<size_t>(n, 1)));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  std::vector<Shape> shapes;
  for (size_t i = 0; i < n; ++i) {
    VIGIL_RETURN_IF_ERROR(CheckDType(ctx, i, TypeList(kT)));
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, i));
    shapes.push_back(ctx.input_types[i].shape);
  }
  VIGIL_ASSIGN_OR_RETURN(Shape shape, BroadcastShapes(ctx.node, shapes));
  *out = {TensorType{ctx.input_types[0].dtype, std::move(shape)}};
  return absl::OkStatus();
}

template <Types kT>
Status InferBinary(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  return InferVariadic<kT>(ctx, out);
}

// Folds the inputs left to right: out = op(...op(op(x0, x1), x2)..., xn-1); Mean divides by n.
template <typename Op, Types kT>
Status RunVariadic(const KernelContext& ctx) {
  const DType dtype = ctx.inputs[0].dtype();
  if (dtype == DType::kFloat16) return RunAsFloat32(ctx, &RunVariadic<Op, kT>);
  Tensor& out = ctx.outputs[0];
  const bool ok = DispatchTypes<kT>(dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t n = ctx.inputs.size();
    if (n == 1) std::memcpy(out.raw(), ctx.inputs[0].raw(), out.nbytes());
    Tensor acc = ctx.inputs[0];
    for (size_t i = 1; i < n; ++i) {
      Shape shape;
      BroadcastShapes(acc.shape(), ctx.inputs[i].shape(), &shape);
      Tensor dst = i + 1 == n ? out : Tensor(dtype, shape);
      Binary<T, T, T>(acc, ctx.inputs[i], dst, [](T a, T b) { return static_cast<T>(Op{}(a, b)); });
      acc = dst;
    }
    if constexpr (std::is_same_v<Op, MeanOp>) {
      const T count = static_cast<T>(n);
      Map(out.data<T>(), out.data<T>(), out.numel(), [count](T v) { return static_cast<T>(v / count); });
    }
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, dtype);
}

Status InferMod(const ShapeContext& ctx, std::vector<TensorType>* out) {
  const int64_t fmod = ctx.node.GetInt("fmod", 0);
  if (fmod != 0 && fmod != 1) return NodeError(ctx.node, "attribute fmod must be 0 or 1, got ", fmod);
  if (fmod == 0 && ctx.input_types.size() == 2 &&
      (ctx.input_types[0].dtype == DType::kFloat32 || ctx.input_types[0].dtype == DType::kFloat16 ||
       ctx.input_types[0].dtype == DType::kFloat64)) {
    return NodeError(ctx.node, "floating-point Mod needs fmod=1 (ONNX Mod-13)");
  }
  return InferBinary<Types::kNumeric>(ctx, out);
}

Status RunMod(const KernelContext& ctx) {
  return ctx.node.GetInt("fmod", 0) == 1 ? RunVariadic<FModOp, Types::kNumeric>(ctx)
                                          : RunVariadic<ModOp, Types::kNumeric>(ctx);
}

// Pow-7/12/13/15: Y = X^Y with broadcasting; the exponent may have another dtype; output has X's.
Status InferPow(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  const std::initializer_list<DType> types = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                                              DType::kInt32, DType::kInt64};
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, types));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, types));
  const Shape shapes[] = {ctx.input_types[0].shape, ctx.input_types[1].shape};
  VIGIL_ASSIGN_OR_RETURN(Shape shape, BroadcastShapes(ctx.node, shapes));
  *out = {TensorType{ctx.input_types[0].dtype, std::move(shape)}};
  return absl::OkStatus();
}

Status RunPow(const KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &y = ctx.inputs[1];
  if (x.dtype() == DType::kFloat16 || y.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunPow);
  bool ok = false;
  DispatchDType<float, double, int32_t, int64_t>(x.dtype(), [&](auto xt) {
    using X = decltype(xt);
    ok = DispatchDType<float, double, int32_t, int64_t>(y.dtype(), [&](auto yt) {
      using Y = decltype(yt);
      if constexpr (std::is_same_v<X, float> && std::is_same_v<Y, float>) {
        Binary<X, Y, X>(x, y, ctx.outputs[0], [](float a, float b) { return std::pow(a, b); });
      } else {
        Binary<X, Y, X>(x, y, ctx.outputs[0], [](X a, Y b) {
          return static_cast<X>(std::pow(static_cast<double>(a), static_cast<double>(b)));
        });
      }
    });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, x.dtype());
}

// ---- Comparisons and logic ---------------------------------------------------------------------
// Equal-11/13/19, Less-9/13, Greater-9/13, LessOrEqual-12/16, GreaterOrEqual-12/16: output bool.
// And-7, Or-7 (bool), Not-1.

using EqualOp = decltype([](auto a, auto b) { return a == b; });
using LessOp = decltype([](auto a, auto b) { return a < b; });
using GreaterOp = decltype([](auto a, auto b) { return a > b; });
using LessOrEqualOp = decltype([](auto a, auto b) { return a <= b; });
using GreaterOrEqualOp = decltype([](auto a, auto b) { return a >= b; });
using AndOp = decltype([](auto a, auto b) { return a && b; });
using OrOp = decltype([](auto a, auto b) { return a || b; });

template <Types kT>
Status InferCompare(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(InferBinary<kT>(ctx, out));
  (*out)[0].dtype = DType::kBool;
  return absl::OkStatus();
}

template <typename Op, Types kT>
Status RunCompare(const KernelContext& ctx) {
  const DType dtype = ctx.inputs[0].dtype();
  if (dtype == DType::kFloat16) return RunAsFloat32(ctx, &RunCompare<Op, kT>);
  const bool ok = DispatchTypes<kT>(dtype, [&](auto tag) {
    using T = decltype(tag);
    Binary<T, T, bool>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                       [](T a, T b) { return static_cast<bool>(Op{}(a, b)); });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, dtype);
}

// Where-9/16: out = cond ? X : Y, all three broadcast. Copies elements by size (any dtype).
Status InferWhere(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 3, 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kBool}));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, kNumericBool));
  VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 1, 2));
  const Shape shapes[] = {ctx.input_types[0].shape, ctx.input_types[1].shape, ctx.input_types[2].shape};
  VIGIL_ASSIGN_OR_RETURN(Shape shape, BroadcastShapes(ctx.node, shapes));
  *out = {TensorType{ctx.input_types[1].dtype, std::move(shape)}};
  return absl::OkStatus();
}

template <typename T>
void WhereTyped(const KernelContext& ctx) {
  const Tensor &c = ctx.inputs[0], &x = ctx.inputs[1], &y = ctx.inputs[2];
  const Shape shapes[] = {c.shape(), x.shape(), y.shape()};
  const BroadcastPlan plan(shapes, ctx.outputs[0].shape());
  const bool* pc = c.data<bool>();
  const T* px = static_cast<const T*>(x.raw());
  const T* py = static_cast<const T*>(y.raw());
  T* po = static_cast<T*>(ctx.outputs[0].raw());
  const int64_t sc = plan.inner_stride(0), sx = plan.inner_stride(1), sy = plan.inner_stride(2);
  ParallelRows(plan, [&](int64_t row, int64_t begin, int64_t n) {
    const bool* rc = pc + plan.offset(0, row) + begin * sc;
    const T* rx = px + plan.offset(1, row) + begin * sx;
    const T* ry = py + plan.offset(2, row) + begin * sy;
    T* z = po + row * plan.row_length() + begin;
    for (int64_t i = 0; i < n; ++i) z[i] = rc[i * sc] ? rx[i * sx] : ry[i * sy];
  });
}

Status RunWhere(const KernelContext& ctx) {
  switch (DTypeSize(ctx.inputs[1].dtype())) {
    case 1: WhereTyped<uint8_t>(ctx); break;
    case 2: WhereTyped<uint16_t>(ctx); break;
    case 4: WhereTyped<uint32_t>(ctx); break;
    case 8: WhereTyped<uint64_t>(ctx); break;
    default: return UnsupportedDType(ctx, ctx.inputs[1].dtype());
  }
  return absl::OkStatus();
}

// ---- Unary -------------------------------------------------------------------------------------
// Sigmoid-6/13, Relu-6/13/14, LeakyRelu-6/16 (alpha 0.01), HardSigmoid-6 (alpha 0.2, beta 0.5),
// HardSwish-14 (x·max(0, min(1, x/6 + 0.5))), Tanh, Exp, Log, Sqrt, Erf, Floor, Ceil, Reciprocal
// (6/13), Round-11 (half to even), Neg-6/13, Abs-6/13, Not-1.

template <Types kT>
Status InferUnary(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, TypeList(kT)));
  *out = {ctx.input_types[0]};
  return absl::OkStatus();
}

// Unary ops: generic lambdas, or structs constructed from the node for those with attributes.
// Sigmoid in float32: the rational approximation Eigen and ONNX Runtime's MLAS use (MlasLogisticKernel: odd
// degree-9 / even degree-10 polynomials in x clamped to [-18, 18], evaluated with fused multiply-adds as MLAS's
// FMA3 / AVX-512 kernels do, the result clamped at 0 — not at 1: MLAS returns 1 + 2^-23 near x = 18, and so does
// this): within 1.8e-7 of 1/(1 + e^-x) absolutely (so 1e-4 relatively at sigmoid ≈ 1e-3, and 0 below x = -18).
// The same bits as ONNX Runtime on x86 CPUs with FMA, so that
// a model quantizing a sigmoid's output (int8-dynamic exports: DynamicQuantizeLinear after each SiLU) lands on
// ONNX Runtime's quantization levels; with its previous e^x-based sigmoid (1 ulp), one level in ~10^5 flipped
// and moved the real int8 YOLOv8n's scores by up to 0.05.
inline float Logistic(float x) {
  if (x != x) return x;  // NaN passes through (MLAS's max/min keep it)
  const float v = std::min(18.f, std::max(-18.f, x));
  const float v2 = v * v;
  float p = std::fma(v2, 4.37031012579801e-11f, 1.15627324459942e-07f);
  p = std::fma(p, v2, 6.08574864600143e-05f);
  p = std::fma(p, v2, 8.51377133304701e-03f);
  p = std::fma(p, v2, 2.48287947061529e-01f);
  p *= v;
  float q = std::fma(v2, 6.10247389755681e-13f, 5.76102136993427e-09f);
  q = std::fma(q, v2, 6.29106785017040e-06f);
  q = std::fma(q, v2, 1.70198817374094e-03f);
  q = std::fma(q, v2, 1.16817656904453e-01f);
  q = std::fma(q, v2, 9.93151921023180e-01f);
  return std::max(0.f, p / q + 0.5f);  // as MLAS: never negative, but 1 ulp above 1 near x = 18
}

#if defined(__x86_64__)
// Logistic over n floats, eight at a time with AVX2 fused multiply-adds (the same operations, so the same bits, as
// the scalar Logistic: fma rounds once either way); the tail by the scalar one.
__attribute__((target("avx2,fma"))) void LogisticAvx2(const float* x, float* y, int64_t n) {
  const __m256 lo = _mm256_set1_ps(-18.f), hi = _mm256_set1_ps(18.f), half = _mm256_set1_ps(0.5f);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 in = _mm256_loadu_ps(x + i);
    const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, in));  // NaN lanes: restored below
    const __m256 v2 = _mm256_mul_ps(v, v);
    __m256 p = _mm256_fmadd_ps(v2, _mm256_set1_ps(4.37031012579801e-11f), _mm256_set1_ps(1.15627324459942e-07f));
    p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(6.08574864600143e-05f));
    p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(8.51377133304701e-03f));
    p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(2.48287947061529e-01f));
    p = _mm256_mul_ps(p, v);
    __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(6.10247389755681e-13f), _mm256_set1_ps(5.76102136993427e-09f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(6.29106785017040e-06f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(1.70198817374094e-03f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(1.16817656904453e-01f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(9.93151921023180e-01f));
    __m256 r = _mm256_add_ps(_mm256_div_ps(p, q), half);
    r = _mm256_max_ps(zero, r);
    r = _mm256_blendv_ps(r, in, _mm256_cmp_ps(in, in, _CMP_UNORD_Q));
    _mm256_storeu_ps(y + i, r);
  }
  for (; i < n; ++i) y[i] = Logistic(x[i]);
}
#endif

// Sigmoid-6/13 in float32: Logistic over every element, vectorised where the CPU has AVX2 and FMA.
Status RunSigmoidF32(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const float* in = x.data<float>();
  float* out = ctx.outputs[0].data<float>();
  const int64_t n = x.numel();
  const int threads = ThreadsFor(n);
  const int64_t chunk = (n + threads - 1) / threads;
#if defined(__x86_64__)
  static const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  static const bool avx2_fma = false;
#endif
#pragma omp parallel for num_threads(threads)
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin >= end) continue;
#if defined(__x86_64__)
    if (avx2_fma) {
      LogisticAvx2(in + begin, out + begin, end - begin);
      continue;
    }
#endif
    for (int64_t i = begin; i < end; ++i) out[i] = Logistic(in[i]);
  }
  return absl::OkStatus();
}

using SigmoidOp = decltype([](auto x) {
  if constexpr (std::is_same_v<decltype(x), float>) {
    return Logistic(x);
  } else {
    return 1 / (1 + std::exp(-x));
  }
});
using ReluOp = decltype([](auto x) { return x > 0 ? x : decltype(x)(0); });
using HardSwishOp = decltype([](auto x) {
  using T = decltype(x);
  return x * std::clamp(static_cast<T>(x / 6 + T(0.5)), T(0), T(1));
});
using TanhOp = decltype([](auto x) { return std::tanh(x); });
using ExpOp = decltype([](auto x) { return std::exp(x); });
using LogOp = decltype([](auto x) { return std::log(x); });
using SqrtOp = decltype([](auto x) { return std::sqrt(x); });
using ErfOp = decltype([](auto x) { return std::erf(x); });
using FloorOp = decltype([](auto x) { return std::floor(x); });
using CeilOp = decltype([](auto x) { return std::ceil(x); });
using RoundOp = decltype([](auto x) { return std::nearbyint(x); });  // default mode: ties to even
using ReciprocalOp = decltype([](auto x) { return 1 / x; });
using NegOp = decltype([](auto x) { return Negate(x); });
using AbsOp = decltype([](auto x) {
  if constexpr (std::is_unsigned_v<decltype(x)>) {
    return x;
  } else {
    return x < 0 ? Negate(x) : x;
  }
});
using NotOp = decltype([](auto x) { return !x; });
struct LeakyReluOp {
  explicit LeakyReluOp(const Node& n) : alpha(n.GetFloat("alpha", 0.01f)) {}
  template <typename T>
  T operator()(T x) const {
    return x >= 0 ? x : static_cast<T>(alpha * x);
  }
  float alpha;
};
struct HardSigmoidOp {
  explicit HardSigmoidOp(const Node& n) : alpha(n.GetFloat("alpha", 0.2f)), beta(n.GetFloat("beta", 0.5f)) {}
  template <typename T>
  T operator()(T x) const {
    return std::clamp(static_cast<T>(alpha * x + beta), T(0), T(1));
  }
  float alpha, beta;
};

template <typename Op, Types kT>
Status RunUnary(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunUnary<Op, kT>);
  const auto op = [&] {
    if constexpr (std::is_constructible_v<Op, const Node&>) {
      return Op(ctx.node);
    } else {
      return Op{};
    }
  }();
  const bool ok = DispatchTypes<kT>(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Map(x.data<T>(), ctx.outputs[0].data<T>(), x.numel(), [&op](T v) { return static_cast<T>(op(v)); });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, x.dtype());
}

Status RunSigmoid(const KernelContext& ctx) {
  if (ctx.inputs[0].dtype() == DType::kFloat32) return RunSigmoidF32(ctx);
  if (ctx.inputs[0].dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunSigmoidF32);
  return RunUnary<SigmoidOp, Types::kFloat>(ctx);  // float64
}

// ---- Clip --------------------------------------------------------------------------------------
// Clip-6: `min`/`max` float attributes (default: the float range). Clip-11/12/13: optional scalar
// inputs min and max of the input's dtype (integer types from 12). y = min(max(x, min), max), so
// min > max yields max everywhere (as the spec says from opset 13).
Status InferClip(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, ctx.opset < 11 ? 1 : 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, ctx.opset < 11 ? kFloat : kNumeric));
  for (size_t i = 1; i < ctx.node.NumInputs(); ++i) {
    if (!ctx.node.HasInput(i)) continue;
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, i));
    if (NumElements(ctx.input_types[i].shape) != 1) {
      return NodeError(ctx.node, "input ", i, " (", i == 1 ? "min" : "max", ") must be a scalar, got shape ",
                       ShapeToString(ctx.input_types[i].shape));
    }
  }
  *out = {ctx.input_types[0]};
  return absl::OkStatus();
}

Status RunClip(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunClip);
  const bool ok = DispatchTypes<Types::kNumeric>(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (ctx.opset < 11) {
      lo = static_cast<T>(ctx.node.GetFloat("min", -std::numeric_limits<float>::max()));
      hi = static_cast<T>(ctx.node.GetFloat("max", std::numeric_limits<float>::max()));
    } else {
      if (ctx.inputs.size() > 1 && ctx.inputs[1].defined()) lo = ctx.inputs[1].data<T>()[0];
      if (ctx.inputs.size() > 2 && ctx.inputs[2].defined()) hi = ctx.inputs[2].data<T>()[0];
    }
    Map(x.data<T>(), ctx.outputs[0].data<T>(), x.numel(), [lo, hi](T v) {
      const T m = v < lo ? lo : v;
      return m > hi ? hi : m;
    });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, x.dtype());
}

// ---- Cast, Identity, Dropout -------------------------------------------------------------------

// ONNX TensorProto.DataType (onnx.proto) → vigil DType; kUndefined for the rest.
DType DTypeFromOnnx(int64_t t) {
  switch (t) {
    case 1: return DType::kFloat32;
    case 2: return DType::kUInt8;
    case 3: return DType::kInt8;
    case 5: return DType::kInt16;
    case 6: return DType::kInt32;
    case 7: return DType::kInt64;
    case 9: return DType::kBool;
    case 10: return DType::kFloat16;
    case 11: return DType::kFloat64;
    default: return DType::kUndefined;
  }
}

// Cast-6/9/13/19: to = ONNX dtype. Float → integer truncates toward zero (out-of-range values
// saturate and NaN gives 0: the spec leaves them undefined); anything → bool is (x != 0).
Status InferCast(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, kNumericBool));
  if (!ctx.node.HasAttr("to")) return NodeError(ctx.node, "missing attribute 'to'");
  const int64_t to = ctx.node.GetInt("to", 0);
  const DType dtype = DTypeFromOnnx(to);
  if (dtype == DType::kUndefined)
    return NodeUnimplemented(ctx.node, "cast to ONNX data type ", to, " is not supported");
  *out = {TensorType{dtype, ctx.input_types[0].shape}};
  return absl::OkStatus();
}

template <typename D, typename S>
D ConvertValue(S x) {
  if constexpr (std::is_same_v<D, bool>) {
    return x != S(0);
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    if (std::isnan(x)) return 0;
    if (x <= static_cast<S>(std::numeric_limits<D>::lowest())) return std::numeric_limits<D>::lowest();
    if (x >= static_cast<S>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
    return static_cast<D>(x);
  } else {
    return static_cast<D>(x);
  }
}

// Casts a non-float16 tensor into a non-float16 one of the same shape.
bool CastInto(const Tensor& in, Tensor& out) {
  bool ok = false;
  DispatchDType<float, double, int8_t, uint8_t, int16_t, int32_t, int64_t, bool>(in.dtype(), [&](auto st) {
    using S = decltype(st);
    ok = DispatchDType<float, double, int8_t, uint8_t, int16_t, int32_t, int64_t, bool>(
        out.dtype(), [&](auto dt) {
          using D = decltype(dt);
          Map(in.data<S>(), out.data<D>(), in.numel(), [](S v) { return ConvertValue<D>(v); });
        });
  });
  return ok;
}

// float16 goes through float32 (a float64 → float16 cast thus rounds twice).
Status RunCast(const KernelContext& ctx) {
  const Tensor& in = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (in.dtype() == out.dtype()) {
    std::memcpy(out.raw(), in.raw(), in.nbytes());
    return absl::OkStatus();
  }
  const Tensor src = in.dtype() == DType::kFloat16 ? in.ToFloat32() : in;
  if (out.dtype() != DType::kFloat16) {
    return CastInto(src, out) ? absl::OkStatus() : UnsupportedDType(ctx, in.dtype());
  }
  Tensor tmp(DType::kFloat32, out.shape());
  if (!CastInto(src, tmp)) return UnsupportedDType(ctx, in.dtype());
  Map(tmp.data<float>(), out.data<uint16_t>(), tmp.numel(), [](float v) { return FloatToHalf(v); });
  return absl::OkStatus();
}

// Identity-1/13/14/16/19.
Status InferIdentity(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, kNumericBool));
  *out = {ctx.input_types[0]};
  return absl::OkStatus();
}

Status RunIdentity(const KernelContext& ctx) {
  std::memcpy(ctx.outputs[0].raw(), ctx.inputs[0].raw(), ctx.inputs[0].nbytes());
  return absl::OkStatus();
}

// Dropout-7/10/12/13 in inference: output = data; the optional mask is all true (bool from
// opset 10; the input's dtype, all ones, in opset 7). Dropout-12 adds inputs ratio and
// training_mode: training mode (random dropping) is not supported.
Status InferDropout(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, ctx.opset < 12 ? 1 : 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 2));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, kFloat));
  if (ctx.node.HasInput(2)) {
    VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 2, {DType::kBool}));  // a scalar that must be known and false
    const Tensor* training = ctx.input_values[2];
    if (training == nullptr || training->numel() != 1 || training->data<bool>()[0]) {
      return NodeUnimplemented(ctx.node, "only inference (training_mode known to be false) is supported");
    }
  }
  *out = {ctx.input_types[0]};
  if (ctx.node.outputs.size() > 1) {
    out->push_back(
        TensorType{ctx.opset < 10 ? ctx.input_types[0].dtype : DType::kBool, ctx.input_types[0].shape});
  }
  return absl::OkStatus();
}

Status RunDropout(const KernelContext& ctx) {
  VIGIL_RETURN_IF_ERROR(RunIdentity(ctx));
  if (ctx.outputs.size() < 2 || !ctx.outputs[1].defined()) return absl::OkStatus();
  Tensor& mask = ctx.outputs[1];
  switch (mask.dtype()) {
    case DType::kBool: std::fill_n(mask.data<bool>(), mask.numel(), true); break;
    case DType::kFloat32: std::fill_n(mask.data<float>(), mask.numel(), 1.f); break;
    case DType::kFloat64: std::fill_n(mask.data<double>(), mask.numel(), 1.0); break;
    case DType::kFloat16: std::fill_n(mask.data<uint16_t>(), mask.numel(), FloatToHalf(1.f)); break;
    default: return UnsupportedDType(ctx, mask.dtype());
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<OpSchema> ElementwiseOps() {
  return {
      {"", "Add", 7, InferBinary<Types::kNumeric>, RunVariadic<AddOp, Types::kNumeric>},
      {"", "Sub", 7, InferBinary<Types::kNumeric>, RunVariadic<SubOp, Types::kNumeric>},
      {"", "Mul", 7, InferBinary<Types::kNumeric>, RunVariadic<MulOp, Types::kNumeric>},
      {"", "Div", 7, InferBinary<Types::kNumeric>, RunVariadic<DivOp, Types::kNumeric>},
      {"", "Pow", 7, InferPow, RunPow},
      {"", "Mod", 10, InferMod, RunMod},
      {"", "Max", 8, InferVariadic<Types::kNumeric>, RunVariadic<MaxOp, Types::kNumeric>},
      {"", "Min", 8, InferVariadic<Types::kNumeric>, RunVariadic<MinOp, Types::kNumeric>},
      {"", "Sum", 8, InferVariadic<Types::kFloat>, RunVariadic<AddOp, Types::kFloat>},
      {"", "Mean", 8, InferVariadic<Types::kFloat>, RunVariadic<MeanOp, Types::kFloat>},
      {"", "Equal", 7, InferCompare<Types::kNumericBool>, RunCompare<EqualOp, Types::kNumericBool>},
      {"", "Less", 7, InferCompare<Types::kNumeric>, RunCompare<LessOp, Types::kNumeric>},
      {"", "Greater", 7, InferCompare<Types::kNumeric>, RunCompare<GreaterOp, Types::kNumeric>},
      {"", "LessOrEqual", 12, InferCompare<Types::kNumeric>, RunCompare<LessOrEqualOp, Types::kNumeric>},
      {"", "GreaterOrEqual", 12, InferCompare<Types::kNumeric>,
       RunCompare<GreaterOrEqualOp, Types::kNumeric>},
      {"", "And", 7, InferCompare<Types::kBool>, RunCompare<AndOp, Types::kBool>},
      {"", "Or", 7, InferCompare<Types::kBool>, RunCompare<OrOp, Types::kBool>},
      {"", "Not", 1, InferUnary<Types::kBool>, RunUnary<NotOp, Types::kBool>},
      {"", "Where", 9, InferWhere, RunWhere},
      {"", "Sigmoid", 6, InferUnary<Types::kFloat>, RunSigmoid},
      {"", "Relu", 6, InferUnary<Types::kSigned>, RunUnary<ReluOp, Types::kSigned>},
      {"", "LeakyRelu", 6, InferUnary<Types::kFloat>, RunUnary<LeakyReluOp, Types::kFloat>},
      {"", "HardSigmoid", 6, InferUnary<Types::kFloat>, RunUnary<HardSigmoidOp, Types::kFloat>},
      {"", "HardSwish", 14, InferUnary<Types::kFloat>, RunUnary<HardSwishOp, Types::kFloat>},
      {"", "Tanh", 6, InferUnary<Types::kFloat>, RunUnary<TanhOp, Types::kFloat>},
      {"", "Exp", 6, InferUnary<Types::kFloat>, RunUnary<ExpOp, Types::kFloat>},
      {"", "Log", 6, InferUnary<Types::kFloat>, RunUnary<LogOp, Types::kFloat>},
      {"", "Sqrt", 6, InferUnary<Types::kFloat>, RunUnary<SqrtOp, Types::kFloat>},
      {"", "Neg", 6, InferUnary<Types::kSigned>, RunUnary<NegOp, Types::kSigned>},
      {"", "Abs", 6, InferUnary<Types::kNumeric>, RunUnary<AbsOp, Types::kNumeric>},
      {"", "Reciprocal", 6, InferUnary<Types::kFloat>, RunUnary<ReciprocalOp, Types::kFloat>},
      {"", "Floor", 6, InferUnary<Types::kFloat>, RunUnary<FloorOp, Types::kFloat>},
      {"", "Ceil", 6, InferUnary<Types::kFloat>, RunUnary<CeilOp, Types::kFloat>},
      {"", "Round", 11, InferUnary<Types::kFloat>, RunUnary<RoundOp, Types::kFloat>},
      {"", "Erf", 9, InferUnary<Types::kFloat>, RunUnary<ErfOp, Types::kFloat>},
      {"", "Clip", 6, InferClip, RunClip},
      {"", "Cast", 6, InferCast, RunCast},
      {"", "Identity", 1, InferIdentity, RunIdentity},
      {"", "Dropout", 7, InferDropout, RunDropout},
  };
}

}  // namespace vigil::infer
