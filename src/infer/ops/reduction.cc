// reduction.cc — reference kernels for ONNX reductions (https://onnx.ai/onnx/operators/):
// ReduceMax/Min/Sum/Mean/Prod/L2, ArgMax/ArgMin, Softmax, LogSoftmax.
//
// Version differences handled (ONNX spec, YOLO-NOTES.md):
//  - Reduce*: `axes` is an attribute before opset 18 and an optional int64 input from 18
//    (ReduceSum: from 13), which must then be a constant known at load; `noop_with_empty_axes`
//    (from 13 for ReduceSum, 18 for the others) makes empty axes an identity instead of
//    "reduce all".
//  - Softmax/LogSoftmax before 13 coerce the input to 2-D [prod(d0..d(axis-1)), prod(d(axis)..)]
//    and normalise each row (default axis 1); from 13 they normalise along one axis (default -1).
// Floating-point sums accumulate in double; float16 is computed in float32 (RunAsFloat32).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "infer/ops/op_lists.h"
#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

enum class Reduce { kMax, kMin, kSum, kMean, kProd, kL2 };

// Opset from which `axes` is an input rather than an attribute.
int64_t AxesInputOpset(Reduce r) { return r == Reduce::kSum ? 13 : 18; }

// The normalised, sorted axes to reduce; empty means identity (noop_with_empty_axes).
StatusOr<std::vector<int64_t>> ReduceAxes(const ShapeContext& ctx, Reduce r, int64_t rank) {
  std::vector<int64_t> axes;
  if (ctx.opset >= AxesInputOpset(r)) {
    if (ctx.node.HasInput(1)) {
      VIGIL_ASSIGN_OR_RETURN(axes, ConstInt64Input(ctx, 1, "axes"));
    }
  } else {
    axes = ctx.node.GetInts("axes");
  }
  if (axes.empty()) {
    if (ctx.node.GetInt("noop_with_empty_axes", 0) != 0) return axes;
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  return NormalizeAxes(ctx.node, axes, rank);
}

template <Reduce kR>
Status InferReduce(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, ctx.opset >= AxesInputOpset(kR) ? 2 : 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  if constexpr (kR == Reduce::kMax || kR == Reduce::kMin) {
    VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0,
                                     {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt8,
                                      DType::kUInt8, DType::kInt32, DType::kInt64}));
  } else {
    VIGIL_RETURN_IF_ERROR(CheckDType(
        ctx, 0, {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt32, DType::kInt64}));
  }
  const Shape& in = ctx.input_types[0].shape;
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReduceAxes(ctx, kR, static_cast<int64_t>(in.size())));
  const bool keepdims = ctx.node.GetInt("keepdims", 1) != 0;
  Shape shape;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    if (!std::binary_search(axes.begin(), axes.end(), d)) {
      shape.push_back(in[d]);
    } else if (keepdims) {
      shape.push_back(1);
    }
  }
  *out = {TensorType{ctx.input_types[0].dtype, std::move(shape)}};
  return absl::OkStatus();
}

// Element offsets, in a row-major tensor of shape `shape`, of every index over the dimensions
// with selected[d] == want (the others held at 0), in row-major order of those dimensions.
std::vector<int64_t> Offsets(const Shape& shape, const std::vector<bool>& selected, bool want) {
  std::vector<int64_t> offsets = {0};
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (selected[d] != want) continue;
    std::vector<int64_t> next;
    next.reserve(offsets.size() * shape[d]);
    for (int64_t o : offsets) {
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(o + i * strides[d]);
    }
    offsets = std::move(next);
  }
  return offsets;
}

template <Reduce kR>
Status RunReduce(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunReduce<kR>);
  // Recover the reduced axes from the output shape is ambiguous (size-1 dims), so recompute them.
  ShapeContext sctx{ctx.node, ctx.opset, {}, {}};
  for (const Tensor& t : ctx.inputs) {
    sctx.input_types.push_back(TensorType{t.dtype(), t.shape()});
    sctx.input_values.push_back(t.defined() ? &t : nullptr);
  }
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReduceAxes(sctx, kR, x.rank()));
  std::vector<bool> reduced(x.rank(), false);
  for (int64_t a : axes) reduced[a] = true;
  const std::vector<int64_t> outer = Offsets(x.shape(), reduced, false);
  const std::vector<int64_t> inner = Offsets(x.shape(), reduced, true);
  const int64_t n_out = static_cast<int64_t>(outer.size()), n_red = static_cast<int64_t>(inner.size());
  const bool ok = DispatchDType<float, double, int8_t, uint8_t, int32_t, int64_t>(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    const T* in = x.data<T>();
    T* y = ctx.outputs[0].data<T>();
#pragma omp parallel for num_threads(ThreadsFor(n_out* n_red))
    for (int64_t o = 0; o < n_out; ++o) {
      const T* base = in + outer[o];
      if constexpr (kR == Reduce::kMax || kR == Reduce::kMin) {
        using Limits = std::numeric_limits<T>;  // empty reductions give -inf/+inf (floats), lowest/max (ints)
        T m = kR == Reduce::kMax ? (Limits::has_infinity ? -Limits::infinity() : Limits::lowest())
                                 : (Limits::has_infinity ? Limits::infinity() : Limits::max());
        for (int64_t r = 0; r < n_red; ++r) {
          m = kR == Reduce::kMax ? std::max(m, base[inner[r]]) : std::min(m, base[inner[r]]);
        }
        y[o] = m;
      } else {
        Acc acc = kR == Reduce::kProd ? 1 : 0;
        for (int64_t r = 0; r < n_red; ++r) {
          const Acc v = static_cast<Acc>(base[inner[r]]);
          if constexpr (kR == Reduce::kProd) {
            acc *= v;
          } else if constexpr (kR == Reduce::kL2) {
            acc += v * v;
          } else {
            acc += v;
          }
        }
        if constexpr (kR == Reduce::kMean) {
          if constexpr (std::is_floating_point_v<T>) {
            acc /= static_cast<Acc>(n_red);  // NaN for an empty reduction
          } else {
            acc = n_red == 0 ? 0 : acc / n_red;
          }
        } else if constexpr (kR == Reduce::kL2) {
          acc = static_cast<Acc>(std::sqrt(static_cast<double>(acc)));
        }
        y[o] = static_cast<T>(acc);
      }
    }
  });
  return ok ? absl::OkStatus() : NodeError(ctx.node, "unsupported dtype ", DTypeName(x.dtype()));
}

// ---- ArgMax / ArgMin (ArgMax-1/11/12/13): int64 indices along `axis` (default 0); keepdims
// (default 1); select_last_index (from 12, default 0) picks the last of equal extremes.

Status InferArg(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0,
                                   {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt8,
                                    DType::kUInt8, DType::kInt32, DType::kInt64}));
  Shape shape = ctx.input_types[0].shape;
  VIGIL_ASSIGN_OR_RETURN(
      int64_t axis, NormalizeAxis(ctx.node, ctx.node.GetInt("axis", 0), static_cast<int64_t>(shape.size())));
  if (shape[axis] == 0) return NodeError(ctx.node, "cannot take the arg-extreme of an empty axis ", axis);
  if (ctx.node.GetInt("keepdims", 1) != 0) {
    shape[axis] = 1;
  } else {
    shape.erase(shape.begin() + axis);
  }
  *out = {TensorType{DType::kInt64, std::move(shape)}};
  return absl::OkStatus();
}

// Splits `shape` around `axis` into (outer, n, inner) for strided access along the axis.
void SplitAround(const Shape& shape, int64_t axis, int64_t* outer, int64_t* n, int64_t* inner) {
  *outer = NumElements(Shape(shape.begin(), shape.begin() + axis));
  *n = shape[axis];
  *inner = NumElements(Shape(shape.begin() + axis + 1, shape.end()));
}

template <bool kMax>
Status RunArg(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunArg<kMax>);
  int64_t axis = ctx.node.GetInt("axis", 0);
  if (axis < 0) axis += x.rank();
  const bool last = ctx.node.GetInt("select_last_index", 0) != 0;
  int64_t outer, n, inner;
  SplitAround(x.shape(), axis, &outer, &n, &inner);
  const bool ok = DispatchDType<float, double, int8_t, uint8_t, int32_t, int64_t>(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    int64_t* y = ctx.outputs[0].data<int64_t>();
#pragma omp parallel for num_threads(ThreadsFor(outer* n* inner))
    for (int64_t o = 0; o < outer * inner; ++o) {
      const T* p = in + (o / inner) * n * inner + o % inner;
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i) {
        const T v = p[i * inner], b = p[best * inner];
        const bool better = kMax ? (v > b || (last && v == b)) : (v < b || (last && v == b));
        if (better) best = i;
      }
      y[o] = best;
    }
  });
  return ok ? absl::OkStatus() : NodeError(ctx.node, "unsupported dtype ", DTypeName(x.dtype()));
}

// ---- Softmax / LogSoftmax (Softmax-1/11/13) ----------------------------------------------------

int64_t SoftmaxDefaultAxis(int64_t opset) { return opset < 13 ? 1 : -1; }

Status InferSoftmax(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16, DType::kFloat64}));
  const int64_t rank = static_cast<int64_t>(ctx.input_types[0].shape.size());
  VIGIL_RETURN_IF_ERROR(
      NormalizeAxis(ctx.node, ctx.node.GetInt("axis", SoftmaxDefaultAxis(ctx.opset)), rank).status());
  *out = {ctx.input_types[0]};
  return absl::OkStatus();
}

template <bool kLog>
Status RunSoftmax(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunSoftmax<kLog>);
  int64_t axis = ctx.node.GetInt("axis", SoftmaxDefaultAxis(ctx.opset));
  if (axis < 0) axis += x.rank();
  int64_t outer, n, inner;
  if (ctx.opset < 13) {  // coerced to 2-D: rows of prod(shape[axis:]) contiguous elements
    outer = NumElements(Shape(x.shape().begin(), x.shape().begin() + axis));
    n = x.numel() / std::max<int64_t>(outer, 1);
    inner = 1;
  } else {
    SplitAround(x.shape(), axis, &outer, &n, &inner);
  }
  const bool ok = DispatchDType<float, double>(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* y = ctx.outputs[0].data<T>();
#pragma omp parallel for num_threads(ThreadsFor(outer* n* inner))
    for (int64_t o = 0; o < outer * inner; ++o) {
      const int64_t base = (o / inner) * n * inner + o % inner;
      const T* p = in + base;
      T* q = y + base;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i * inner]);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T e = std::exp(p[i * inner] - m);
        sum += e;
        if (!kLog) q[i * inner] = e;
      }
      if (kLog) {
        const T log_sum = static_cast<T>(std::log(sum));
        for (int64_t i = 0; i < n; ++i) q[i * inner] = p[i * inner] - m - log_sum;
      } else {
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t i = 0; i < n; ++i) q[i * inner] *= inv;
      }
    }
  });
  return ok ? absl::OkStatus() : NodeError(ctx.node, "unsupported dtype ", DTypeName(x.dtype()));
}

}  // namespace

std::vector<OpSchema> ReductionOps() {
  return {
      {"", "ReduceMax", 1, InferReduce<Reduce::kMax>, RunReduce<Reduce::kMax>},
      {"", "ReduceMin", 1, InferReduce<Reduce::kMin>, RunReduce<Reduce::kMin>},
      {"", "ReduceSum", 1, InferReduce<Reduce::kSum>, RunReduce<Reduce::kSum>},
      {"", "ReduceMean", 1, InferReduce<Reduce::kMean>, RunReduce<Reduce::kMean>},
      {"", "ReduceProd", 1, InferReduce<Reduce::kProd>, RunReduce<Reduce::kProd>},
      {"", "ReduceL2", 1, InferReduce<Reduce::kL2>, RunReduce<Reduce::kL2>},
      {"", "ArgMax", 1, InferArg, RunArg<true>},
      {"", "ArgMin", 1, InferArg, RunArg<false>},
      {"", "Softmax", 1, InferSoftmax, RunSoftmax<false>},
      {"", "LogSoftmax", 1, InferSoftmax, RunSoftmax<true>},
  };
}

}  // namespace vigil::infer
