// tensor_ops.cc — reference kernels and shape inference for data-movement ops (op_lists.h TensorOps).
//
// Semantics follow the ONNX operator specification (https://onnx.ai/onnx/operators/) at the
// node's opset; each op names the spec section and the version differences it handles.
// Data movement copies whole elements by their byte size, so every vigil dtype is accepted unless
// an op says otherwise. Strided views (Slice, Transpose, Expand, Tile) go through CopyStrided,
// which merges contiguous dimensions and copies rows with memcpy where it can; large copies are
// split over OpenMP threads. Shapes are static; sizes and strides are in elements.
// Thread-safety: stateless functions (see op_registry.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "infer/ops/op_lists.h"
#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using Types = std::vector<TensorType>;

std::vector<int64_t> RowMajorStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

int64_t ElementSize(const Tensor& t) { return static_cast<int64_t>(DTypeSize(t.dtype())); }
const uint8_t* Bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.raw()); }
uint8_t* Bytes(Tensor& t) { return static_cast<uint8_t*>(t.raw()); }

// Same-dtype copy of a whole tensor (Reshape and friends). The output may alias the input.
Status CopyAll(const KernelContext& ctx) {
  if (ctx.outputs[0].raw() != ctx.inputs[0].raw() && ctx.inputs[0].nbytes() > 0) {
    std::memcpy(ctx.outputs[0].raw(), ctx.inputs[0].raw(), ctx.inputs[0].nbytes());
  }
  return absl::OkStatus();
}

template <int64_t E>
void CopyRowOf(const uint8_t* src, int64_t stride, int64_t n, uint8_t* dst) {
  for (int64_t j = 0; j < n; ++j) std::memcpy(dst + j * E, src + j * stride * E, E);
}

// Copies n elements of `e` bytes read `stride` elements apart into contiguous dst.
void CopyRow(const uint8_t* src, int64_t stride, int64_t n, int64_t e, uint8_t* dst) {
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n * e));
    return;
  }
  switch (e) {
    case 1:
      CopyRowOf<1>(src, stride, n, dst);
      break;
    case 2:
      CopyRowOf<2>(src, stride, n, dst);
      break;
    case 4:
      CopyRowOf<4>(src, stride, n, dst);
      break;
    default:
      CopyRowOf<8>(src, stride, n, dst);
      break;
  }
}

// Copies the strided view of `src` (element `offset`, per-dimension element `strides`, which may
// be 0 for broadcast or negative for reversed slices) with shape `shape` into the contiguous
// row-major `dst`. `e` is the element size in bytes (1, 2, 4 or 8).
void CopyStrided(const uint8_t* src, int64_t offset, const Shape& shape, const std::vector<int64_t>& strides,
                 int64_t e, uint8_t* dst) {
  const int64_t total = NumElements(shape);
  if (total == 0) return;
  // Drop size-1 dimensions; merge a dimension into the previous one when the pair is contiguous.
  std::vector<int64_t> dims, st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty() && st.back() == strides[d] * shape[d]) {
      dims.back() *= shape[d];
      st.back() = strides[d];
    } else {
      dims.push_back(shape[d]);
      st.push_back(strides[d]);
    }
  }
  const int64_t len = dims.empty() ? 1 : dims.back();
  const int64_t inner = dims.empty() ? 1 : st.back();
  if (!dims.empty()) {
    dims.pop_back();
    st.pop_back();
  }
  const int64_t rows = NumElements(dims);
  src += offset * e;
#pragma omp parallel for num_threads(ThreadsFor(total))
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1, rem = r; d >= 0; --d) {
      off += (rem % dims[d]) * st[d];
      rem /= dims[d];
    }
    CopyRow(src + off * e, inner, len, e, dst + r * len * e);
  }
}

// Reads an optional constant int64 input; `present` is false when the input is omitted.
StatusOr<std::vector<int64_t>> OptionalConstInts(const ShapeContext& ctx, size_t i, std::string_view what,
                                                 bool* present) {
  *present = ctx.node.HasInput(i);
  if (!*present) return std::vector<int64_t>{};
  return ConstInt64Input(ctx, i, what);
}

// The ShapeContext a kernel would have seen: lets a RunFn re-derive attributes with its InferFn's
// helpers instead of duplicating validation.
ShapeContext ContextOf(const KernelContext& ctx) {
  ShapeContext s{ctx.node, ctx.opset, {}, {}};
  for (const Tensor& t : ctx.inputs) {
    s.input_types.push_back(TensorType{t.dtype(), t.defined() ? t.shape() : Shape{}});
    s.input_values.push_back(t.defined() ? &t : nullptr);
  }
  return s;
}

// The 'axis' attribute of a node whose InferFn validated it, normalised to [0, rank).
int64_t AxisAttr(const Node& node, int64_t rank, int64_t fallback) {
  const int64_t a = node.GetInt("axis", fallback);
  return a < 0 ? a + rank : a;
}

// ---- Shape, Size (spec: Shape-1/15, Size-1) -----------------------------------------------------

// Shape-15 start/end: negative values count from the back, both clamp to [0, rank].
std::pair<int64_t, int64_t> ShapeRange(const Node& node, int64_t opset, int64_t rank) {
  auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  const int64_t start = clamp(opset >= 15 ? node.GetInt("start", 0) : 0);
  const int64_t end = clamp(opset >= 15 ? node.GetInt("end", rank) : rank);
  return {start, std::max(start, end)};
}

Status InferShape(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  auto [start, end] = ShapeRange(ctx.node, ctx.opset, static_cast<int64_t>(ctx.input_types[0].shape.size()));
  *out = {{DType::kInt64, {end - start}}};
  return absl::OkStatus();
}

Status RunShape(const KernelContext& ctx) {
  const Shape& s = ctx.inputs[0].shape();
  auto [start, end] = ShapeRange(ctx.node, ctx.opset, static_cast<int64_t>(s.size()));
  std::copy(s.begin() + start, s.begin() + end, ctx.outputs[0].data<int64_t>());
  return absl::OkStatus();
}

Status InferSize(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  *out = {{DType::kInt64, {}}};
  return absl::OkStatus();
}

Status RunSize(const KernelContext& ctx) {
  *ctx.outputs[0].data<int64_t>() = ctx.inputs[0].numel();
  return absl::OkStatus();
}

// ---- Reshape, Flatten, Squeeze, Unsqueeze ---------------------------------------------------------

// Reshape-5/14: 0 copies the input dimension at the same index (unless allowzero=1, opset 14),
// one -1 is inferred from the remaining size.
StatusOr<Shape> ReshapeTarget(const ShapeContext& ctx, const std::vector<int64_t>& spec) {
  const Node& node = ctx.node;
  const Shape& in = ctx.input_types[0].shape;
  const bool allowzero = ctx.opset >= 14 && node.GetInt("allowzero", 0) != 0;
  Shape out(spec.size());
  int64_t inferred = -1, known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t d = spec[i];
    if (d == -1) {
      if (inferred >= 0) return NodeError(node, "shape ", ShapeToString(spec), " has more than one -1");
      inferred = static_cast<int64_t>(i);
      continue;
    }
    if (d == 0 && !allowzero) {
      if (i >= in.size())
        return NodeError(node, "shape ", ShapeToString(spec), " copies dimension ", i, " (0) of input ",
                         ShapeToString(in), " which has no such dimension");
      d = in[i];
    }
    if (d < 0) return NodeError(node, "shape ", ShapeToString(spec), " has negative dimension ", d);
    if (d > 0 && known > std::numeric_limits<int64_t>::max() / d)
      return NodeError(node, "shape ", ShapeToString(spec), " is too large");
    out[i] = d;
    known *= d;
  }
  const int64_t n = NumElements(in);
  if (inferred >= 0) {
    if (known == 0 || n % known != 0) {
      return NodeError(node, "cannot reshape ", ShapeToString(in), " to ", ShapeToString(spec),
                       ": -1 cannot be inferred");
    }
    out[inferred] = n / known;
  }
  if (NumElements(out) != n)
    return NodeError(node, "cannot reshape ", ShapeToString(in), " (", n, " elements) to ",
                     ShapeToString(spec));
  return out;
}

Status InferReshape(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> spec, ConstInt64Input(ctx, 1, "shape"));
  VIGIL_ASSIGN_OR_RETURN(Shape s, ReshapeTarget(ctx, spec));
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

// Flatten-1/9/11/13: output [prod(d[0:axis]), prod(d[axis:])], axis in [-r, r].
Status InferFlatten(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  const Shape& in = ctx.input_types[0].shape;
  const int64_t r = static_cast<int64_t>(in.size());
  int64_t axis = ctx.node.GetInt("axis", 1);
  if (axis < -r || axis > r)
    return NodeError(ctx.node, "axis ", axis, " is out of range [", -r, ", ", r, "]");
  if (axis < 0) axis += r;
  const Shape outer(in.begin(), in.begin() + axis), inner(in.begin() + axis, in.end());
  *out = {{ctx.input_types[0].dtype, {NumElements(outer), NumElements(inner)}}};
  return absl::OkStatus();
}

// Squeeze-1/11/13: axes attribute before opset 13, optional input from 13; without axes every
// size-1 dimension goes; a listed axis must have size 1.
Status InferSqueeze(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, ctx.opset >= 13 ? 2 : 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  const Shape& in = ctx.input_types[0].shape;
  bool given = false;
  std::vector<int64_t> axes;
  if (ctx.opset >= 13) {
    VIGIL_ASSIGN_OR_RETURN(axes, OptionalConstInts(ctx, 1, "axes", &given));
  } else {
    given = ctx.node.HasAttr("axes");
    axes = ctx.node.GetInts("axes");
  }
  VIGIL_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx.node, axes, static_cast<int64_t>(in.size())));
  Shape s;
  for (size_t d = 0; d < in.size(); ++d) {
    const bool listed = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d));
    if (listed && in[d] != 1)
      return NodeError(ctx.node, "cannot squeeze axis ", d, " of size ", in[d], " in ", ShapeToString(in));
    if (given ? !listed : in[d] != 1) s.push_back(in[d]);
  }
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

// Unsqueeze-1/11/13: axes (attribute before 13, input from 13) index the output, rank r + len(axes).
Status InferUnsqueeze(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, ctx.opset >= 13 ? 2 : 1, ctx.opset >= 13 ? 2 : 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  const Shape& in = ctx.input_types[0].shape;
  std::vector<int64_t> axes = ctx.node.GetInts("axes");
  if (ctx.opset >= 13) {
    VIGIL_ASSIGN_OR_RETURN(axes, ConstInt64Input(ctx, 1, "axes"));
  }
  if (axes.empty()) return NodeError(ctx.node, "axes are required");
  const int64_t out_rank = static_cast<int64_t>(in.size() + axes.size());
  VIGIL_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx.node, axes, out_rank));
  Shape s;
  for (int64_t d = 0, next = 0; d < out_rank; ++d) {
    s.push_back(std::binary_search(axes.begin(), axes.end(), d) ? 1 : in[next++]);
  }
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

// ---- Concat, Split (spec: Concat-4/11/13, Split-2/11/13/18) -------------------------------------------

Status InferConcat(const ShapeContext& ctx, Types* out) {
  const Node& node = ctx.node;
  const size_t n = node.NumInputs();
  if (n == 0) return NodeError(node, "needs at least one input");
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, n, n));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(node, 1, 1));
  if (!node.HasAttr("axis")) return NodeError(node, "attribute 'axis' is required");
  Shape s = ctx.input_types[0].shape;
  VIGIL_ASSIGN_OR_RETURN(int64_t axis,
                         NormalizeAxis(node, node.GetInt("axis", 0), static_cast<int64_t>(s.size())));
  for (size_t i = 1; i < n; ++i) {
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, i));
    const Shape& si = ctx.input_types[i].shape;
    bool ok = si.size() == s.size();
    for (size_t d = 0; ok && d < s.size(); ++d) ok = static_cast<int64_t>(d) == axis || si[d] == s[d];
    if (!ok) {
      return NodeError(node, "input ", i, " ", ShapeToString(si), " does not match input 0 ",
                       ShapeToString(ctx.input_types[0].shape), " outside axis ", axis);
    }
    s[axis] += si[axis];
  }
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

Status RunConcat(const KernelContext& ctx) {
  Tensor& y = ctx.outputs[0];
  const int64_t axis = AxisAttr(ctx.node, y.rank(), 0);
  const int64_t e = ElementSize(y);
  const int64_t outer = NumElements(Shape(y.shape().begin(), y.shape().begin() + axis));
  const int64_t out_block = y.numel() / std::max<int64_t>(outer, 1) * e;  // bytes per outer index
  int64_t prefix = 0;
  for (const Tensor& x : ctx.inputs) {
    const int64_t block = x.numel() / std::max<int64_t>(outer, 1) * e;
    const uint8_t* src = Bytes(x);
    uint8_t* dst = Bytes(y) + prefix;
#pragma omp parallel for num_threads(outer > 1 ? ThreadsFor(x.numel()) : 1)
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + o * out_block, src + o * block, static_cast<size_t>(block));
    prefix += block;
  }
  return absl::OkStatus();
}

// Split sizes: attribute 'split' before opset 13, optional input 1 from 13; without them, equal
// parts (opset 18 'num_outputs': ceil(dim / n) each, the last one smaller).
StatusOr<std::vector<int64_t>> SplitSizes(const ShapeContext& ctx, int64_t dim) {
  const Node& node = ctx.node;
  const int64_t n = static_cast<int64_t>(node.outputs.size());
  bool given = false;
  std::vector<int64_t> sizes;
  if (ctx.opset >= 13) {
    VIGIL_ASSIGN_OR_RETURN(sizes, OptionalConstInts(ctx, 1, "split", &given));
  } else {
    given = node.HasAttr("split");
    sizes = node.GetInts("split");
  }
  if (ctx.opset >= 18 && node.HasAttr("num_outputs")) {
    if (given) return NodeError(node, "'split' input and 'num_outputs' attribute are both given");
    if (node.GetInt("num_outputs", 0) != n) {
      return NodeError(node, "num_outputs ", node.GetInt("num_outputs", 0), " does not match ", n,
                       " outputs");
    }
    const int64_t chunk = (dim + n - 1) / n;
    for (int64_t i = 0; i < n; ++i) sizes.push_back(std::clamp<int64_t>(dim - i * chunk, 0, chunk));
    return sizes;
  }
  if (!given) {
    if (dim % n != 0) return NodeError(node, "dimension ", dim, " cannot be split into ", n, " equal parts");
    return std::vector<int64_t>(static_cast<size_t>(n), dim / n);
  }
  if (static_cast<int64_t>(sizes.size()) != n) {
    return NodeError(node, "split ", ShapeToString(sizes), " has ", sizes.size(), " entries for ", n,
                     " outputs");
  }
  int64_t sum = 0;
  for (int64_t s : sizes) {
    if (s < 0) return NodeError(node, "split ", ShapeToString(sizes), " has a negative size");
    sum += s;
  }
  if (sum != dim)
    return NodeError(node, "split ", ShapeToString(sizes), " sums to ", sum, ", not to dimension ", dim);
  return sizes;
}

Status InferSplit(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, ctx.opset >= 13 ? 2 : 1));
  if (ctx.node.outputs.empty()) return NodeError(ctx.node, "needs at least one output");
  const Shape& in = ctx.input_types[0].shape;
  VIGIL_ASSIGN_OR_RETURN(
      int64_t axis, NormalizeAxis(ctx.node, ctx.node.GetInt("axis", 0), static_cast<int64_t>(in.size())));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, SplitSizes(ctx, in[axis]));
  out->clear();
  for (int64_t s : sizes) {
    Shape shape = in;
    shape[axis] = s;
    out->push_back({ctx.input_types[0].dtype, shape});
  }
  return absl::OkStatus();
}

Status RunSplit(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t axis = AxisAttr(ctx.node, x.rank(), 0);
  const int64_t e = ElementSize(x);
  const int64_t outer = NumElements(Shape(x.shape().begin(), x.shape().begin() + axis));
  const int64_t inner = NumElements(Shape(x.shape().begin() + axis + 1, x.shape().end())) * e;  // bytes
  const int64_t in_block = x.dim(static_cast<int>(axis)) * inner;
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                         SplitSizes(ContextOf(ctx), x.dim(static_cast<int>(axis))));
  int64_t prefix = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t block = sizes[i] * inner;
    Tensor& y = ctx.outputs[i];
    if (y.defined()) {  // an omitted output only advances the read position
      const uint8_t* src = Bytes(x) + prefix;
      uint8_t* dst = Bytes(y);
#pragma omp parallel for num_threads(outer > 1 ? ThreadsFor(y.numel()) : 1)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + o * block, src + o * in_block, static_cast<size_t>(block));
    }
    prefix += block;
  }
  return absl::OkStatus();
}

// ---- Slice (spec: Slice-1 attributes; Slice-10/11/13 inputs) ---------------------------------------

struct SliceView {
  Shape out;
  int64_t offset = 0;            // element offset of the first output element in the input
  std::vector<int64_t> strides;  // input element strides per output dimension
};

// Resolves starts/ends/axes/steps after the spec: negative indices add the dimension; starts
// clamp to [0, d] (step > 0) or [0, d-1] (step < 0); ends clamp to [0, d] or [-1, d-1].
StatusOr<SliceView> ResolveSlice(const Node& node, const Shape& in, const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                                 std::vector<int64_t> steps) {
  const int64_t r = static_cast<int64_t>(in.size());
  const size_t n = starts.size();
  if (ends.size() != n)
    return NodeError(node, "starts and ends have different lengths (", n, ", ", ends.size(), ")");
  if (axes.empty()) {
    axes.resize(n);
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(n, 1);
  if (axes.size() != n || steps.size() != n) {
    return NodeError(node, "starts, ends, axes and steps have different lengths");
  }
  SliceView v;
  v.out = in;
  v.strides = RowMajorStrides(in);
  std::vector<bool> seen(static_cast<size_t>(r), false);
  for (size_t i = 0; i < n; ++i) {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, axes[i], r));
    if (seen[a]) return NodeError(node, "axis ", axes[i], " is sliced twice");
    seen[a] = true;
    const int64_t d = in[a];
    if (steps[i] == 0) return NodeError(node, "step for axis ", axes[i], " is 0");
    // |step| > d takes at most one element: clamping keeps the result and avoids overflow.
    const int64_t step = std::clamp<int64_t>(steps[i], -d - 1, d + 1);
    int64_t start = starts[i] < 0 ? starts[i] + d : starts[i];
    int64_t end = ends[i] < 0 ? ends[i] + d : ends[i];
    int64_t count = 0;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, d);
      end = std::clamp<int64_t>(end, 0, d);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else if (d > 0) {  // (an empty axis stays empty)
      start = std::clamp<int64_t>(start, 0, d - 1);
      end = std::clamp<int64_t>(end, -1, d - 1);
      count = start > end ? (start - end - step - 1) / -step : 0;
    }
    v.out[a] = count;
    if (count > 0) v.offset += start * v.strides[a];
    v.strides[a] *= step;
  }
  return v;
}

// Slice-1 takes attributes starts/ends/axes; from opset 10 they are inputs 1..4 (steps added).
StatusOr<SliceView> SliceOf(const ShapeContext& ctx) {
  const Node& node = ctx.node;
  const Shape& in = ctx.input_types[0].shape;
  if (ctx.opset < 10) {
    return ResolveSlice(node, in, node.GetInts("starts"), node.GetInts("ends"), node.GetInts("axes"), {});
  }
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> starts, ConstInt64Input(ctx, 1, "starts"));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> ends, ConstInt64Input(ctx, 2, "ends"));
  bool given = false;
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> axes, OptionalConstInts(ctx, 3, "axes", &given));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, OptionalConstInts(ctx, 4, "steps", &given));
  return ResolveSlice(node, in, starts, ends, axes, steps);
}

Status InferSlice(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(ctx.opset < 10 ? CheckInputCount(ctx, 1, 1) : CheckInputCount(ctx, 3, 5));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(SliceView v, SliceOf(ctx));
  *out = {{ctx.input_types[0].dtype, v.out}};
  return absl::OkStatus();
}

Status RunSlice(const KernelContext& ctx) {
  VIGIL_ASSIGN_OR_RETURN(SliceView v, SliceOf(ContextOf(ctx)));
  CopyStrided(Bytes(ctx.inputs[0]), v.offset, v.out, v.strides, ElementSize(ctx.inputs[0]),
              Bytes(ctx.outputs[0]));
  return absl::OkStatus();
}

// ---- Transpose (spec: Transpose-1/13; perm defaults to the reversed axes) --------------------------

StatusOr<std::vector<int64_t>> PermOf(const Node& node, size_t rank) {
  std::vector<int64_t> perm(rank);
  std::iota(perm.rbegin(), perm.rend(), 0);
  if (node.HasAttr("perm")) perm = node.GetInts("perm");
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool ok = sorted.size() == rank;
  for (size_t i = 0; ok && i < rank; ++i) ok = sorted[i] == static_cast<int64_t>(i);
  if (!ok)
    return NodeError(node, "perm ", ShapeToString(perm), " is not a permutation of the ", rank,
                     " input axes");
  return perm;
}

Status InferTranspose(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  const Shape& in = ctx.input_types[0].shape;
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> perm, PermOf(ctx.node, in.size()));
  Shape s;
  for (int64_t p : perm) s.push_back(in[p]);
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

Status RunTranspose(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> perm, PermOf(ctx.node, x.shape().size()));
  const std::vector<int64_t> in_strides = RowMajorStrides(x.shape());
  std::vector<int64_t> strides;
  for (int64_t p : perm) strides.push_back(in_strides[p]);
  CopyStrided(Bytes(x), 0, ctx.outputs[0].shape(), strides, ElementSize(x), Bytes(ctx.outputs[0]));
  return absl::OkStatus();
}

// ---- Gather, GatherElements (spec: Gather-13, GatherElements-13) ---------------------------------

Status InferGather(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, {DType::kInt32, DType::kInt64}));
  const Shape& data = ctx.input_types[0].shape;
  VIGIL_ASSIGN_OR_RETURN(
      int64_t axis, NormalizeAxis(ctx.node, ctx.node.GetInt("axis", 0), static_cast<int64_t>(data.size())));
  Shape s(data.begin(), data.begin() + axis);
  s.insert(s.end(), ctx.input_types[1].shape.begin(), ctx.input_types[1].shape.end());
  s.insert(s.end(), data.begin() + axis + 1, data.end());
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

// Normalises index values for an axis of size d (negative ones count from the back).
Status NormalizeIndices(const Node& node, std::vector<int64_t>& idx, int64_t d) {
  for (int64_t& i : idx) {
    if (i < -d || i >= d) return NodeError(node, "index ", i, " is out of range for an axis of size ", d);
    if (i < 0) i += d;
  }
  return absl::OkStatus();
}

Status RunGather(const KernelContext& ctx) {
  const Tensor& data = ctx.inputs[0];
  const int64_t axis = AxisAttr(ctx.node, data.rank(), 0);
  std::vector<int64_t> idx = ctx.inputs[1].ToInt64Vector();
  const int64_t d = data.dim(static_cast<int>(axis));
  VIGIL_RETURN_IF_ERROR(NormalizeIndices(ctx.node, idx, d));
  const int64_t e = ElementSize(data);
  const int64_t outer = NumElements(Shape(data.shape().begin(), data.shape().begin() + axis));
  const int64_t inner = NumElements(Shape(data.shape().begin() + axis + 1, data.shape().end())) * e;  // bytes
  const int64_t n = static_cast<int64_t>(idx.size());
  const uint8_t* src = Bytes(data);
  uint8_t* dst = Bytes(ctx.outputs[0]);
#pragma omp parallel for num_threads(ThreadsFor(ctx.outputs[0].numel()))
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(dst + (o * n + j) * inner, src + (o * d + idx[j]) * inner, static_cast<size_t>(inner));
    }
  }
  return absl::OkStatus();
}

Status InferGatherElements(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 1, {DType::kInt32, DType::kInt64}));
  const Shape& data = ctx.input_types[0].shape;
  const Shape& idx = ctx.input_types[1].shape;
  VIGIL_ASSIGN_OR_RETURN(
      int64_t axis, NormalizeAxis(ctx.node, ctx.node.GetInt("axis", 0), static_cast<int64_t>(data.size())));
  bool ok = idx.size() == data.size();
  for (size_t d = 0; ok && d < data.size(); ++d) ok = static_cast<int64_t>(d) == axis || idx[d] <= data[d];
  if (!ok)
    return NodeError(ctx.node, "indices ", ShapeToString(idx), " do not fit data ", ShapeToString(data),
                     " outside axis ", axis);
  *out = {{ctx.input_types[0].dtype, idx}};
  return absl::OkStatus();
}

Status RunGatherElements(const KernelContext& ctx) {
  const Tensor& data = ctx.inputs[0];
  const Shape& ishape = ctx.inputs[1].shape();
  const int64_t axis = AxisAttr(ctx.node, data.rank(), 0);
  std::vector<int64_t> idx = ctx.inputs[1].ToInt64Vector();
  VIGIL_RETURN_IF_ERROR(NormalizeIndices(ctx.node, idx, data.dim(static_cast<int>(axis))));
  const std::vector<int64_t> strides = RowMajorStrides(data.shape());
  const int64_t e = ElementSize(data);
  const int64_t n = static_cast<int64_t>(idx.size());
#pragma omp parallel for num_threads(ThreadsFor(n))
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int64_t d = data.rank() - 1, rem = i; d >= 0; --d) {
      off += (d == axis ? idx[i] : rem % ishape[d]) * strides[d];
      rem /= ishape[d];
    }
    std::memcpy(Bytes(ctx.outputs[0]) + i * e, Bytes(data) + off * e, static_cast<size_t>(e));
  }
  return absl::OkStatus();
}

// ---- Expand, Tile, ConstantOfShape, Range (spec: Expand-8/13, Tile-6/13, ConstantOfShape-9, Range-11)

Status InferExpand(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ConstInt64Input(ctx, 1, "shape"));
  for (int64_t d : shape) {
    if (d < 0) return NodeError(ctx.node, "shape ", ShapeToString(shape), " has a negative dimension");
  }
  const Shape shapes[] = {ctx.input_types[0].shape, shape};
  VIGIL_ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx.node, shapes));
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

Status RunExpand(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Shape& out = ctx.outputs[0].shape();
  CopyStrided(Bytes(x), 0, out, BroadcastStrides(x.shape(), out), ElementSize(x), Bytes(ctx.outputs[0]));
  return absl::OkStatus();
}

Status InferTile(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> repeats, ConstInt64Input(ctx, 1, "repeats"));
  Shape s = ctx.input_types[0].shape;
  if (repeats.size() != s.size())
    return NodeError(ctx.node, "repeats ", ShapeToString(repeats), " do not match input rank ", s.size());
  for (size_t d = 0; d < s.size(); ++d) {
    if (repeats[d] < 0)
      return NodeError(ctx.node, "repeats ", ShapeToString(repeats), " has a negative entry");
    s[d] *= repeats[d];
  }
  *out = {{ctx.input_types[0].dtype, s}};
  return absl::OkStatus();
}

// Tile as a strided copy: each axis d becomes the pair (repeat, d) with stride (0, stride_d).
Status RunTile(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const std::vector<int64_t> repeats = ctx.inputs[1].ToInt64Vector();
  const std::vector<int64_t> in_strides = RowMajorStrides(x.shape());
  Shape shape;
  std::vector<int64_t> strides;
  for (int d = 0; d < x.rank(); ++d) {
    shape.insert(shape.end(), {repeats[d], x.dim(d)});
    strides.insert(strides.end(), {0, in_strides[d]});
  }
  CopyStrided(Bytes(x), 0, shape, strides, ElementSize(x), Bytes(ctx.outputs[0]));
  return absl::OkStatus();
}

Status InferConstantOfShape(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ConstInt64Input(ctx, 0, "shape"));
  for (int64_t d : shape) {
    if (d < 0) return NodeError(ctx.node, "shape ", ShapeToString(shape), " has a negative dimension");
  }
  const Tensor* value = ctx.node.GetTensor("value");
  if (value && value->numel() != 1)
    return NodeError(ctx.node, "attribute 'value' must hold one element, has ", value->numel());
  *out = {{value ? value->dtype() : DType::kFloat32, shape}};
  return absl::OkStatus();
}

Status RunConstantOfShape(const KernelContext& ctx) {
  const Tensor* value = ctx.node.GetTensor("value");  // absent: float32 zero, as allocated
  if (!value) return absl::OkStatus();
  Tensor& y = ctx.outputs[0];
  const int64_t e = ElementSize(y);
  for (int64_t i = 0; i < y.numel(); ++i) std::memcpy(Bytes(y) + i * e, value->raw(), static_cast<size_t>(e));
  return absl::OkStatus();
}

// Range-11: n = max(ceil((limit - start) / delta), 0) computed in the input type; y[i] = start + i·delta.
// Returns -1 when the count is not a finite number below 2^40.
template <typename T>
int64_t RangeCount(T start, T limit, T delta) {
  if constexpr (std::is_floating_point_v<T>) {
    const double n = std::ceil(static_cast<double>((limit - start) / delta));
    if (!(n < 1099511627776.0)) return -1;
    return n > 0 ? static_cast<int64_t>(n) : 0;
  } else {
    const int64_t span = static_cast<int64_t>(limit) - start;
    const int64_t n = span / delta + ((span % delta != 0 && (span < 0) == (delta < 0)) ? 1 : 0);
    return std::max<int64_t>(n, 0);
  }
}

Status InferRange(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(CheckInputCount(ctx, 3, 3));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  const DType dt = ctx.input_types[0].dtype;
  for (size_t i = 0; i < 3; ++i) {
    VIGIL_RETURN_IF_ERROR(
        CheckDType(ctx, i, {DType::kFloat32, DType::kFloat64, DType::kInt16, DType::kInt32, DType::kInt64}));
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, i));
    if (ctx.input_values.size() <= i || ctx.input_values[i] == nullptr) {
      return NodeUnimplemented(ctx.node, "input ", i,
                               " must be a constant known at load (the output size depends on it)");
    }
    if (ctx.input_values[i]->numel() != 1) return NodeError(ctx.node, "input ", i, " must be a scalar");
  }
  int64_t n = 0;
  Status st;
  DispatchDType<float, double, int16_t, int32_t, int64_t>(dt, [&](auto tag) {
    using T = decltype(tag);
    const T start = *ctx.input_values[0]->data<T>(), limit = *ctx.input_values[1]->data<T>();
    const T delta = *ctx.input_values[2]->data<T>();
    if (delta == 0) {
      st = NodeError(ctx.node, "delta is 0");
      return;
    }
    n = RangeCount<T>(start, limit, delta);
    if (n < 0) st = NodeError(ctx.node, "range (", start, ", ", limit, ", ", delta, ") has no finite size");
  });
  VIGIL_RETURN_IF_ERROR(st);
  *out = {{dt, {n}}};
  return absl::OkStatus();
}

Status RunRange(const KernelContext& ctx) {
  Tensor& y = ctx.outputs[0];
  DispatchDType<float, double, int16_t, int32_t, int64_t>(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T start = *ctx.inputs[0].data<T>(), delta = *ctx.inputs[2].data<T>();
    for (int64_t i = 0; i < y.numel(); ++i)
      y.data<T>()[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  });
  return absl::OkStatus();
}

// ---- TopK (spec: TopK-1 k attribute, TopK-10 k input, TopK-11 largest/sorted) ----------------------

struct TopKParams {
  int64_t axis = 0, k = 0;
  bool largest = true;
};

StatusOr<TopKParams> TopKOf(const ShapeContext& ctx) {
  const Node& node = ctx.node;
  const Shape& in = ctx.input_types[0].shape;
  TopKParams p;
  VIGIL_ASSIGN_OR_RETURN(p.axis,
                         NormalizeAxis(node, node.GetInt("axis", -1), static_cast<int64_t>(in.size())));
  if (ctx.opset >= 10) {
    VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> k, ConstInt64Input(ctx, 1, "K"));
    if (k.size() != 1) return NodeError(node, "K must hold one value, has ", k.size());
    p.k = k[0];
  } else {
    p.k = node.GetInt("k", -1);
  }
  if (p.k < 0 || p.k > in[p.axis])
    return NodeError(node, "k ", p.k, " is out of range for axis ", p.axis, " of ", ShapeToString(in));
  p.largest = ctx.opset < 11 || node.GetInt("largest", 1) != 0;
  return p;
}

Status InferTopK(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(ctx.opset >= 10 ? CheckInputCount(ctx, 2, 2) : CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 2, 2));
  VIGIL_RETURN_IF_ERROR(CheckDType(ctx, 0,
                                   {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt8,
                                    DType::kUInt8, DType::kInt16, DType::kInt32, DType::kInt64}));
  VIGIL_ASSIGN_OR_RETURN(TopKParams p, TopKOf(ctx));
  Shape s = ctx.input_types[0].shape;
  s[p.axis] = p.k;
  *out = {{ctx.input_types[0].dtype, s}, {DType::kInt64, s}};
  return absl::OkStatus();
}

// Selects the k largest (or smallest) keys of every slice along the axis, ties broken by the lower
// index; NaN orders above every number. The result is sorted also for sorted=0 (any order is allowed).
// `key(i)` reads element i of the input as K.
template <typename K, typename KeyFn>
void TopKSlices(const KernelContext& ctx, const TopKParams& p, KeyFn key) {
  const Tensor& x = ctx.inputs[0];
  const int64_t n = x.dim(static_cast<int>(p.axis)), k = p.k, e = ElementSize(x);
  const int64_t inner = NumElements(Shape(x.shape().begin() + p.axis + 1, x.shape().end()));
  const int64_t slices = n == 0 ? 0 : x.numel() / n;
  auto less = [](K a, K b) {
    if constexpr (std::is_floating_point_v<K>) return (!std::isnan(a) && std::isnan(b)) || a < b;
    return a < b;
  };
#pragma omp parallel for num_threads(ThreadsFor(x.numel()))
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t base = (s / inner) * n * inner + s % inner;
    std::vector<K> keys(static_cast<size_t>(n));
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) keys[j] = key(base + j * inner);
    std::iota(order.begin(), order.end(), 0);
    auto before = [&](int64_t a, int64_t b) {
      const bool ab = p.largest ? less(keys[b], keys[a]) : less(keys[a], keys[b]);
      const bool ba = p.largest ? less(keys[a], keys[b]) : less(keys[b], keys[a]);
      return ab || (!ba && a < b);
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    const int64_t out_base = (s / inner) * k * inner + s % inner;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t o = out_base + j * inner;
      std::memcpy(Bytes(ctx.outputs[0]) + o * e, Bytes(x) + (base + order[j] * inner) * e,
                  static_cast<size_t>(e));
      ctx.outputs[1].data<int64_t>()[o] = order[j];
    }
  }
}

Status RunTopK(const KernelContext& ctx) {
  VIGIL_ASSIGN_OR_RETURN(TopKParams p, TopKOf(ContextOf(ctx)));
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kFloat16) {
    TopKSlices<float>(ctx, p, [&](int64_t i) { return HalfToFloat(x.data<uint16_t>()[i]); });
    return absl::OkStatus();
  }
  DispatchDType<float, double, int8_t, uint8_t, int16_t, int32_t, int64_t>(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    TopKSlices<T>(ctx, p, [&](int64_t i) { return x.data<T>()[i]; });
  });
  return absl::OkStatus();
}

// ---- Pad (spec: Pad-2 attributes pads/value; Pad-11 inputs pads/constant_value; Pad-18 axes) --------

enum class PadMode { kConstant, kReflect, kEdge };

struct PadParams {
  PadMode mode = PadMode::kConstant;
  std::vector<int64_t> begin, end;  // per input axis; negative values crop
  Shape out;
};

StatusOr<PadParams> PadOf(const ShapeContext& ctx) {
  const Node& node = ctx.node;
  const Shape& in = ctx.input_types[0].shape;
  const size_t r = in.size();
  PadParams p;
  const std::string mode = node.GetString("mode", "constant");
  if (mode == "reflect") {
    p.mode = PadMode::kReflect;
  } else if (mode == "edge") {
    p.mode = PadMode::kEdge;
  } else if (mode != "constant") {
    return NodeUnimplemented(node, "mode '", mode, "' is not supported (constant, reflect, edge are)");
  }
  std::vector<int64_t> pads = node.GetInts("pads");
  std::vector<int64_t> axes(r);
  std::iota(axes.begin(), axes.end(), 0);
  if (ctx.opset >= 11) {
    VIGIL_ASSIGN_OR_RETURN(pads, ConstInt64Input(ctx, 1, "pads"));
    bool given = false;
    std::vector<int64_t> listed;
    if (ctx.opset >= 18) {
      VIGIL_ASSIGN_OR_RETURN(listed, OptionalConstInts(ctx, 3, "axes", &given));
    }
    if (given) {
      axes.clear();
      for (int64_t a : listed) {
        VIGIL_ASSIGN_OR_RETURN(int64_t na, NormalizeAxis(node, a, static_cast<int64_t>(r)));
        axes.push_back(na);
      }
    }
  }
  if (pads.size() != 2 * axes.size()) {
    return NodeError(node, "pads ", ShapeToString(pads), " must have ", 2 * axes.size(),
                     " entries for input ", ShapeToString(in));
  }
  p.begin.assign(r, 0);
  p.end.assign(r, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    p.begin[axes[i]] = pads[i];
    p.end[axes[i]] = pads[i + axes.size()];
  }
  p.out = in;
  for (size_t d = 0; d < r; ++d) {
    p.out[d] = in[d] + p.begin[d] + p.end[d];
    if (p.out[d] < 0)
      return NodeError(node, "pads ", ShapeToString(pads), " crop axis ", d, " of ", ShapeToString(in),
                       " below zero");
    const bool pads_axis = p.out[d] > 0 && (p.begin[d] > 0 || p.end[d] > 0);
    if (pads_axis && p.mode != PadMode::kConstant && in[d] == 0) {
      return NodeError(node, "mode '", mode, "' cannot pad empty axis ", d);
    }
    if (p.mode == PadMode::kReflect && (p.begin[d] > in[d] - 1 || p.end[d] > in[d] - 1) && pads_axis) {
      return NodeError(node, "reflect pads ", ShapeToString(pads), " exceed axis ", d, " of ",
                       ShapeToString(in), " (at most size - 1)");
    }
  }
  return p;
}

Status InferPad(const ShapeContext& ctx, Types* out) {
  VIGIL_RETURN_IF_ERROR(ctx.opset >= 11 ? CheckInputCount(ctx, 2, ctx.opset >= 18 ? 4 : 3)
                                        : CheckInputCount(ctx, 1, 1));
  VIGIL_RETURN_IF_ERROR(CheckOutputCount(ctx.node, 1, 1));
  if (ctx.opset >= 11 && ctx.node.HasInput(2)) {
    VIGIL_RETURN_IF_ERROR(CheckSameDType(ctx, 0, 2));
    if (NumElements(ctx.input_types[2].shape) != 1)
      return NodeError(ctx.node, "constant_value must hold one element");
  }
  VIGIL_ASSIGN_OR_RETURN(PadParams p, PadOf(ctx));
  *out = {{ctx.input_types[0].dtype, p.out}};
  return absl::OkStatus();
}

// Writes `v` as one element of `dtype` to dst (Pad-2 'value' is a float attribute).
void StoreScalar(double v, DType dtype, uint8_t* dst) {
  if (dtype == DType::kFloat16) {
    const uint16_t h = FloatToHalf(static_cast<float>(v));
    std::memcpy(dst, &h, 2);
  } else if (dtype == DType::kBool) {
    *dst = v != 0;
  } else {
    DispatchDType<float, double, int8_t, uint8_t, int16_t, int32_t, int64_t>(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T t = static_cast<T>(v);
      std::memcpy(dst, &t, sizeof(T));
    });
  }
}

// Source index along one axis for output index o, or -1 for the constant.
int64_t PadSource(PadMode mode, int64_t o, int64_t begin, int64_t d) {
  const int64_t i = o - begin;
  if (i >= 0 && i < d) return i;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kEdge:
      return std::clamp<int64_t>(i, 0, d - 1);
    case PadMode::kReflect:
      return i < 0 ? -i : 2 * (d - 1) - i;
  }
  return -1;
}

Status RunPad(const KernelContext& ctx) {
  VIGIL_ASSIGN_OR_RETURN(PadParams p, PadOf(ContextOf(ctx)));
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  const int64_t e = ElementSize(x);
  std::vector<uint8_t> value(static_cast<size_t>(e), 0);
  if (ctx.opset >= 11 && ctx.inputs.size() > 2 && ctx.inputs[2].defined()) {
    std::memcpy(value.data(), ctx.inputs[2].raw(), static_cast<size_t>(e));
  } else if (ctx.opset < 11) {
    StoreScalar(ctx.node.GetFloat("value", 0.0f), x.dtype(), value.data());
  }
  if (y.numel() == 0) return absl::OkStatus();
  if (y.rank() == 0) return CopyAll(ctx);
  const int r = y.rank();
  const std::vector<int64_t> strides = RowMajorStrides(x.shape());
  const int64_t len = y.dim(-1);
  std::vector<int64_t> last(static_cast<size_t>(len));
  for (int64_t j = 0; j < len; ++j) last[j] = PadSource(p.mode, j, p.begin[r - 1], x.dim(-1));
  const int64_t rows = y.numel() / len;
#pragma omp parallel for num_threads(ThreadsFor(y.numel()))
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0;
    bool constant = false;
    int64_t rem = row;
    for (int d = r - 2; d >= 0; --d) {
      const int64_t src = PadSource(p.mode, rem % y.dim(d), p.begin[d], x.dim(d));
      rem /= y.dim(d);
      constant = constant || src < 0;
      off += src * strides[d];
    }
    uint8_t* dst = Bytes(y) + row * len * e;
    for (int64_t j = 0; j < len; ++j) {
      const uint8_t* src = (constant || last[j] < 0) ? value.data() : Bytes(x) + (off + last[j]) * e;
      std::memcpy(dst + j * e, src, static_cast<size_t>(e));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<OpSchema> TensorOps() {
  return {
      {"", "Shape", 1, InferShape, RunShape},
      {"", "Size", 1, InferSize, RunSize},
      {"", "Reshape", 5, InferReshape, CopyAll},
      {"", "Flatten", 1, InferFlatten, CopyAll},
      {"", "Squeeze", 1, InferSqueeze, CopyAll},
      {"", "Unsqueeze", 1, InferUnsqueeze, CopyAll},
      {"", "Concat", 4, InferConcat, RunConcat},
      {"", "Split", 2, InferSplit, RunSplit},
      {"", "Slice", 1, InferSlice, RunSlice},
      {"", "Transpose", 1, InferTranspose, RunTranspose},
      {"", "Gather", 1, InferGather, RunGather},
      {"", "GatherElements", 11, InferGatherElements, RunGatherElements},
      {"", "Expand", 8, InferExpand, RunExpand},
      {"", "Tile", 6, InferTile, RunTile},
      {"", "ConstantOfShape", 9, InferConstantOfShape, RunConstantOfShape},
      {"", "Range", 11, InferRange, RunRange},
      {"", "TopK", 1, InferTopK, RunTopK},
      {"", "Pad", 2, InferPad, RunPad},
  };
}

}  // namespace vigil::infer
