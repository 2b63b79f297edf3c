// matrix.cc — reference kernels for ONNX MatMul, Gemm and MatMulInteger
// (https://onnx.ai/onnx/operators/).
//
// MatMul-1/9/13 follows numpy.matmul: a 1-D A is [1,K] with the 1 removed from the result, a 1-D
// B is [K,1] likewise; leading (batch) dimensions broadcast. Products use an i-k-j loop (rows of
// B streamed contiguously, inner loop vectorised) parallelised over batch × rows with OpenMP;
// float32 accumulates in float32.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "infer/ops/op_lists.h"
#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

// Shapes of a (possibly batched) matrix product after numpy.matmul's promotion rules.
struct MatMulDims {
  Shape batch_a, batch_b, batch;  // leading dims of A, B and the broadcast result
  int64_t m = 0, k = 0, n = 0;
  Shape out;  // result shape with promoted 1-D dimensions removed
};

StatusOr<MatMulDims> MatMulShapes(const Node& node, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) {
    return NodeError(node, "inputs must have rank >= 1, got ", ShapeToString(a), " and ", ShapeToString(b));
  }
  const Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  const Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  MatMulDims d;
  d.m = a2[a2.size() - 2];
  d.k = a2.back();
  d.n = b2.back();
  if (b2[b2.size() - 2] != d.k) {
    return NodeError(node, "inner dimensions of ", ShapeToString(a), " and ", ShapeToString(b),
                     " do not match");
  }
  d.batch_a.assign(a2.begin(), a2.end() - 2);
  d.batch_b.assign(b2.begin(), b2.end() - 2);
  if (!BroadcastShapes(d.batch_a, d.batch_b, &d.batch)) {
    return NodeError(node, "batch dimensions of ", ShapeToString(a), " and ", ShapeToString(b),
                     " do not broadcast");
  }
  d.out = d.batch;
  if (a.size() > 1) d.out.push_back(d.m);
  if (b.size() > 1) d.out.push_back(d.n);
  return d;
}

// c[batch] = a[batch_a] × b[batch_b] for row-major [m,k] × [k,n] matrices with broadcast batches.
template <typename T>
void BatchedMatMul(const MatMulDims& d, const T* a, const T* b, T* c) {
  const std::vector<int64_t> sa = BroadcastStrides(d.batch_a, d.batch);
  const std::vector<int64_t> sb = BroadcastStrides(d.batch_b, d.batch);
  const int64_t batches = NumElements(d.batch), m = d.m, k = d.k, n = d.n;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(batches* m* k* n))
  for (int64_t row = 0; row < batches * m; ++row) {
    int64_t bi = row / m, off_a = 0, off_b = 0;
    for (size_t dim = d.batch.size(); dim-- > 0;) {
      const int64_t idx = bi % d.batch[dim];
      off_a += idx * sa[dim];
      off_b += idx * sb[dim];
      bi /= d.batch[dim];
    }
    const T* ar = a + off_a * m * k + (row % m) * k;
    const T* bm = b + off_b * k * n;
    T* cr = c + row * n;
    std::fill_n(cr, n, T(0));
    for (int64_t p = 0; p < k; ++p) {
      const T av = ar[p];
      const T* br = bm + p * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) cr[j] += av * br[j];
    }
  }
}

Status InferMatMul(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(
      CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt32, DType::kInt64}));
  VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 1));
  VIGIL_ASSIGN_OR_RETURN(MatMulDims d,
                         MatMulShapes(ctx.node, ctx.input_types[0].shape, ctx.input_types[1].shape));
  *out = {TensorType{ctx.input_types[0].dtype, d.out}};
  return absl::OkStatus();
}

Status RunMatMul(const KernelContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1];
  if (a.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunMatMul);
  VIGIL_ASSIGN_OR_RETURN(MatMulDims d, MatMulShapes(ctx.node, a.shape(), b.shape()));
  const bool ok = DispatchDType<float, double, int32_t, int64_t>(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    BatchedMatMul<T>(d, a.data<T>(), b.data<T>(), ctx.outputs[0].data<T>());
  });
  return ok ? absl::OkStatus() : NodeError(ctx.node, "unsupported dtype ", DTypeName(a.dtype()));
}

// ---- Gemm-7/9/11/13: Y = alpha·A'·B' + beta·C, A' = transA ? Aᵀ : A ([M,K]), B' likewise ([K,N]);
// C (optional from opset 11) broadcasts unidirectionally to [M,N]. Defaults alpha = beta = 1.

Status InferGemm(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, ctx.opset < 11 ? 3 : 2, 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(
      CheckDType(ctx, 0, {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt32, DType::kInt64}));
  VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 1));
  const Shape &a = ctx.input_types[0].shape, &b = ctx.input_types[1].shape;
  if (a.size() != 2 || b.size() != 2) {
    return NodeError(ctx.node, "A and B must be 2-D, got ", ShapeToString(a), " and ", ShapeToString(b));
  }
  const bool ta = ctx.node.GetInt("transA", 0) != 0, tb = ctx.node.GetInt("transB", 0) != 0;
  const int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  const int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  if (k != kb) {
    return NodeError(ctx.node, "inner dimensions of A ", ShapeToString(a), " (transA=", ta, ") and B ",
                     ShapeToString(b), " (transB=", tb, ") do not match");
  }
  const Shape y = {m, n};
  if (ctx.node.HasInput(2)) {
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 2));
    Shape bc;
    if (!BroadcastShapes(ctx.input_types[2].shape, y, &bc) || bc != y) {
      return NodeError(ctx.node, "C ", ShapeToString(ctx.input_types[2].shape), " does not broadcast to ",
                       ShapeToString(y));
    }
  }
  *out = {TensorType{ctx.input_types[0].dtype, y}};
  return absl::OkStatus();
}

// Row-major transpose of a [rows, cols] matrix.
template <typename T>
std::vector<T> Transposed(const T* src, int64_t rows, int64_t cols) {
  std::vector<T> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = src[r * cols + c];
  }
  return t;
}

Status RunGemm(const KernelContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1];
  if (a.dtype() == DType::kFloat16) return RunAsFloat32(ctx, &RunGemm);
  Tensor& y = ctx.outputs[0];
  const bool ta = ctx.node.GetInt("transA", 0) != 0, tb = ctx.node.GetInt("transB", 0) != 0;
  const float alpha = ctx.node.GetFloat("alpha", 1.f), beta = ctx.node.GetFloat("beta", 1.f);
  MatMulDims d;
  d.m = y.dim(0);
  d.n = y.dim(1);
  d.k = ta ? a.dim(0) : a.dim(1);
  const bool ok = DispatchDType<float, double, int32_t, int64_t>(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> at, bt;
    if (ta) at = Transposed(a.data<T>(), d.k, d.m);
    if (tb) bt = Transposed(b.data<T>(), d.n, d.k);
    T* py = y.data<T>();
    BatchedMatMul<T>(d, ta ? at.data() : a.data<T>(), tb ? bt.data() : b.data<T>(), py);
    const bool has_c = ctx.inputs.size() > 2 && ctx.inputs[2].defined();
    const Shape shapes[] = {y.shape(), has_c ? ctx.inputs[2].shape() : Shape{}};
    const BroadcastPlan plan(shapes, y.shape());
    const T* pc = has_c ? ctx.inputs[2].data<T>() : nullptr;
    for (int64_t r = 0; r < plan.rows(); ++r) {
      T* yr = py + r * plan.row_length();
      const T* cr = has_c ? pc + plan.offset(1, r) : nullptr;
      for (int64_t j = 0; j < plan.row_length(); ++j) {
        yr[j] = static_cast<T>(alpha * yr[j] + (has_c ? beta * cr[j * plan.inner_stride(1)] : 0));
      }
    }
  });
  return ok ? absl::OkStatus() : NodeError(ctx.node, "unsupported dtype ", DTypeName(a.dtype()));
}

// ---- MatMulInteger-10: Y (int32) = (A − a_zero_point) × (B − b_zero_point), MatMul shape rules.
// A, B uint8 or int8; zero points of the matching dtype: a scalar, or per row of A (M values) /
// per column of B (N values). Zero points that vary across batches are not supported.

// Checks zero point input `zp` of input `x` and returns its length (1, or `per` values).
Status CheckZeroPoint(const ShapeContext& ctx, size_t zp, size_t x, int64_t per) {
  if (!ctx.node.HasInput(zp)) return absl::OkStatus();
  VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, x, zp));
  const int64_t count = NumElements(ctx.input_types[zp].shape);
  if (count != 1 && count != per) {
    return NodeUnimplemented(ctx.node, "zero point ", zp, " of shape ",
                             ShapeToString(ctx.input_types[zp].shape), ": only a scalar or ", per,
                             " values are supported");
  }
  return absl::OkStatus();
}

Status InferMatMulInteger(const ShapeContext& ctx, std::vector<TensorType>* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 4));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0, {DType::kUInt8, DType::kInt8}));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, {DType::kUInt8, DType::kInt8}));
  VIGIL_ASSIGN_OR_RETURN(MatMulDims d,
                         MatMulShapes(ctx.node, ctx.input_types[0].shape, ctx.input_types[1].shape));
  VIGIL_RETURN_IF_ERROR(CheckZeroPoint(ctx, 2, 0, d.m));
  VIGIL_RETURN_IF_ERROR(CheckZeroPoint(ctx, 3, 1, d.n));
  *out = {TensorType{DType::kInt32, d.out}};
  return absl::OkStatus();
}

// x − zero point as int32; the zero point index is (element / zp_div) % zp_count.
Tensor MinusZeroPoint(const Tensor& x, const Tensor* zp, int64_t zp_div) {
  Tensor out(DType::kInt32, x.shape());
  const std::vector<int64_t> z = zp && zp->defined() ? zp->ToInt64Vector() : std::vector<int64_t>{0};
  const std::vector<int64_t> v = x.ToInt64Vector();
  const int64_t count = static_cast<int64_t>(z.size());
  int32_t* o = out.data<int32_t>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = static_cast<int32_t>(v[i] - z[(i / zp_div) % count]);
  return out;
}

Status RunMatMulInteger(const KernelContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1];
  VIGIL_ASSIGN_OR_RETURN(MatMulDims d, MatMulShapes(ctx.node, a.shape(), b.shape()));
  const Tensor* za = ctx.inputs.size() > 2 ? &ctx.inputs[2] : nullptr;
  const Tensor* zb = ctx.inputs.size() > 3 ? &ctx.inputs[3] : nullptr;
  const Tensor a32 = MinusZeroPoint(a, za, d.k);  // per row: row index = element / K
  const Tensor b32 = MinusZeroPoint(b, zb, 1);    // per column: column index = element % N
  BatchedMatMul<int32_t>(d, a32.data<int32_t>(), b32.data<int32_t>(), ctx.outputs[0].data<int32_t>());
  return absl::OkStatus();
}

}  // namespace

std::vector<OpSchema> MatrixOps() {
  return {
      {"", "MatMul", 1, InferMatMul, RunMatMul},
      {"", "Gemm", 7, InferGemm, RunGemm},
      {"", "MatMulInteger", 10, InferMatMulInteger, RunMatMulInteger},
  };
}

}  // namespace vigil::infer
