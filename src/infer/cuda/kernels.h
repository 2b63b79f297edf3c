// kernels.h — vigil's own CUDA kernels for the CUDA backend (cuda_backend.cc): everything that is
// not a convolution (cuDNN) or a matrix product (cuBLAS).
//
// Conventions:
//  - Element types (ElemType): float32, float16, int64, int32, int8, uint8 and bool (one byte, 0 or 1).
//    Float arithmetic is done in float32 and rounded once when stored (round to nearest even,
//    __float2half_rn); integer arithmetic in int64, narrowed when stored (wrapping, as C++ does).
//    Kernels that say "float" take kF32 / kF16 only.
//  - Shapes, strides and offsets are in elements, int64. Strided kernels take up to kMaxDims dims;
//    a stride of 0 broadcasts (numpy rules, ONNX "Broadcasting in ONNX"); negative strides are allowed
//    for reversed slices.
//  - 4-D activations are [N,C,H,W] logically; the backend stores them NCHW or NHWC (channels last).
//    Kernels that read or write 4-D data take the layout's strides (Strides4d) so one kernel serves both.
//  - Every function enqueues on `stream` and returns the launch error (cudaGetLastError) without
//    synchronising; errors of the kernel itself surface at the next synchronisation.
// Thread-safety: stateless; any thread may enqueue on any stream.
// Formulas: the ONNX operator specification (https://onnx.ai/onnx/operators/) of the op named.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace vigil::cuda {

enum class ElemType : uint8_t { kF32, kF16, kI64, kI32, kI8, kU8, kBool };
inline constexpr int kMaxDims = 6;
// Bytes per element of `t`.
int ElemBytes(ElemType t);

// Shape and strides of a strided view: element (i0..i_{n-1}) at offset sum(i_k · stride_k).
struct StridedView {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

// dst[i] = src[i] over the shape of `dst_view` (src_view.shape must equal it), converting the element
// type as ONNX Cast does (the reference's rules: float → integer truncates toward zero, saturates, NaN
// gives 0; anything → bool is x != 0; float16 goes through float32). Serves Transpose, Slice, Expand,
// Tile, Cast, DepthToSpace, Concat/Split pieces and NCHW <-> NHWC conversion.
cudaError_t StridedCopy(void* dst, ElemType dst_type, const StridedView& dst_view, const void* src, ElemType src_type,
                        const StridedView& src_view, cudaStream_t stream);

enum class UnaryOp : uint8_t {
  kIdentity, kSigmoid, kRelu, kLeakyRelu, kTanh, kExp, kLog, kNeg, kAbs, kSqrt, kReciprocal, kFloor, kCeil,
  kErf, kHardSigmoid, kHardSwish, kSiLU, kClip, kSoftplus, kRound
};
// out[i] = f(in[i]) for n contiguous float elements. alpha/beta: LeakyRelu alpha; HardSigmoid alpha,
// beta; Clip min (alpha), max (beta). Round: half to even.
cudaError_t Unary(UnaryOp op, float alpha, float beta, void* out, const void* in, ElemType type, int64_t n,
                  cudaStream_t stream);

enum class BinaryOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kMod, kFMod,                   // out: the operands' type
  kEqual, kGreater, kGreaterOrEqual, kLess, kLessOrEqual, kAnd, kOr  // out: bool
};
// Whether `op` writes bool (comparisons, logic) rather than the operands' type.
bool BinaryWritesBool(BinaryOp op);
// out = a op b over the shape of a_view (contiguous output; b_view has the same shape); a and b read through
// broadcast strides (0 on broadcast dims). a and b share `type`; out has it too, or bool (BinaryWritesBool).
// Integer Div truncates toward zero and x / 0 = 0; Mod takes the divisor's sign (fmod=0), FMod the
// dividend's; Pow is float only; And / Or take bool. NaN propagates through Max and Min.
cudaError_t Binary(BinaryOp op, void* out, const void* a, const StridedView& a_view, const void* b,
                   const StridedView& b_view, ElemType type, cudaStream_t stream);

// out[i] = !in[i] over n bool elements.
cudaError_t LogicalNot(void* out, const void* in, int64_t n, cudaStream_t stream);

// out = cond ? x : y over the shape of x_view (contiguous output), cond bool, x / y / out of `type`,
// all three read through broadcast views.
cudaError_t Where(void* out, const void* cond, const StridedView& cond_view, const void* x, const StridedView& x_view,
                  const void* y, const StridedView& y_view, ElemType type, cudaStream_t stream);

// y[i] = act(y[i] + bias[(i / inner) % channels]) over n elements, in place: channels innermost
// (NHWC) with inner = 1, NCHW with inner = H·W. bias may be null (activation only).
// act: kIdentity, kRelu, kSiLU, kSigmoid, kLeakyRelu (alpha).
cudaError_t BiasActivation(void* y, ElemType type, const float* bias, int64_t n, int64_t channels, int64_t inner,
                           UnaryOp act, float alpha, cudaStream_t stream);

// Element strides of logical [N,C,H,W] data.
struct Strides4d {
  int64_t n = 0, c = 0, h = 0, w = 0;
};
inline Strides4d NchwStrides(int64_t c, int64_t h, int64_t w) { return {c * h * w, h * w, w, 1}; }
inline Strides4d NhwcStrides(int64_t c, int64_t h, int64_t w) { return {h * w * c, 1, w * c, c}; }

// 2-D max pooling (ONNX MaxPool-12, no indices): out[n,c,oh,ow] = max over the window of
// in[n,c,oh·sh − ph + kh·dh, ow·sw − pw + kw·dw] (padding ignored). ceil_mode is already in OH/OW.
struct Pool2d {
  int64_t n, c, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  Strides4d in, out;
};
cudaError_t MaxPool2d(void* out, ElemType out_type, const void* in, ElemType in_type, const Pool2d& p,
                      cudaStream_t stream);

// Nearest resize of H, W: out[n,c,p] = in[n,c,source[p]] where p = oh·OW + ow and source[p] = ih·W + iw
// (device array of out_pixels int32, computed by the backend from the ONNX Resize semantics).
cudaError_t ResizeNearest(void* out, const void* in, ElemType type, int64_t n, int64_t c, int64_t in_w,
                          int64_t out_w, int64_t out_pixels, const int32_t* source, const Strides4d& in_strides,
                          const Strides4d& out_strides, cudaStream_t stream);

// Softmax (ONNX Softmax-13) over the middle axis of contiguous [outer, axis, inner] data:
// exp(x − max) / sum exp(x − max). log_softmax: x − max − log(sum).
cudaError_t Softmax(void* out, const void* in, ElemType type, int64_t outer, int64_t axis, int64_t inner,
                    bool log_softmax, cudaStream_t stream);

// ---- Reductions, selection and indexing (tensor_kernels.cu) ------------------------------------

enum class ReduceOp : uint8_t { kSum, kMean, kMax, kMin, kProd, kL2, kArgMax, kArgMin };
// out[o] = reduce over r of in[Offset(kept, o) + Offset(reduced, r)], o over the kept view's shape
// (row-major, contiguous output), r over the reduced view's. Float types accumulate in float32,
// integer types in int64 (Mean truncates). kArgMax / kArgMin write int64 positions r along the one
// reduced axis (reduced.ndim == 1), ties to the first (to the last with select_last); the others
// write `type`. Types: float, int64, int32, int8, uint8 (L2 float only).
cudaError_t Reduce(ReduceOp op, void* out, const void* in, ElemType type, const StridedView& kept,
                   const StridedView& reduced, bool select_last, cudaStream_t stream);

// TopK along the middle axis of contiguous [outer, n, inner] data: for each of outer·inner slices the
// k largest (smallest) values, sorted, ties to the lower index, NaN above every number (as the host
// reference); values into `values` ([outer, k, inner], `type`), positions into `indices` (int64).
// `scratch`: TopKScratchBytes(outer·inner, k) bytes of device memory. Types: float, int64, int32, int8,
// uint8. Cost: one block per slice; O(n) to select, O(k²) to sort the k selected.
size_t TopKScratchBytes(int64_t slices, int64_t k);
cudaError_t TopK(void* values, int64_t* indices, const void* in, ElemType type, int64_t outer, int64_t n,
                 int64_t inner, int64_t k, bool largest, void* scratch, cudaStream_t stream);

// A device-visible word pair kernels set on bad data: fault[0] becomes 1 and fault[1] the offending
// value (the first one seen). The backend keeps it in mapped pinned memory and reads it after the
// stream synchronises.
using Fault = unsigned long long;

// Gather (ONNX Gather-13): out[o, j, r] = data[o, idx[j], r] over [outer, nidx, inner] (element size
// `elem_bytes`), idx int64 or int32 (`index_type`), negative indices count from the back of `dim`.
// An index outside [-dim, dim) reads zeros and is reported in `fault`.
cudaError_t Gather(void* out, const void* data, int elem_bytes, int64_t outer, int64_t dim, int64_t inner,
                   const void* indices, ElemType index_type, int64_t nidx, Fault* fault, cudaStream_t stream);

// GatherElements (ONNX GatherElements-13): out[i] = data[Offset(out_view, i) + idx[i] · axis_stride]
// where out_view has the indices' shape and the data's strides with the axis' stride 0. Errors as Gather.
cudaError_t GatherElements(void* out, const void* data, int elem_bytes, const StridedView& out_view,
                           int64_t axis_stride, int64_t dim, const void* indices, ElemType index_type, Fault* fault,
                           cudaStream_t stream);

enum class PadMode : uint8_t { kConstant, kReflect, kEdge };
// Pad (ONNX Pad-18, constant / reflect / edge): out over `out_shape` (contiguous) reads in at
// out index − begin (begin may be negative: crops), out-of-range positions take `value` (constant: the
// element's bytes, little-endian in the low bytes) or the reflected / nearest edge element.
struct PadSpec {
  int ndim = 0;
  int64_t out_shape[kMaxDims] = {};
  int64_t in_shape[kMaxDims] = {};
  int64_t begin[kMaxDims] = {};
  PadMode mode = PadMode::kConstant;
  unsigned long long value = 0;
};
cudaError_t Pad(void* out, const void* in, int elem_bytes, const PadSpec& spec, cudaStream_t stream);

// y[i] = x[i] · scale[c] + shift[c], c = (i / inner) % channels (BatchNormalization at inference with
// scale and shift folded on the host); float.
cudaError_t ChannelAffine(void* y, const void* x, ElemType type, const float* scale, const float* shift, int64_t n,
                          int64_t channels, int64_t inner, cudaStream_t stream);

// 2-D average pooling (ONNX AveragePool-19) over Pool2d's window: the mean of the in-bounds elements,
// or with count_include_pad of the positions inside the padded extent (pe_h / pe_w: end padding).
cudaError_t AvgPool2d(void* out, ElemType out_type, const void* in, ElemType in_type, const Pool2d& p, int64_t pe_h,
                      int64_t pe_w, bool count_include_pad, cudaStream_t stream);

// QuantizeLinear (ONNX -10/13/19): y = saturate(round_half_even(x / scale[c]) + zp[c]), c = (i / inner)
// % channels (channels = 1: per tensor); x float, scale float32 or float16 (`scale_type`), y and zp
// (null: 0) uint8 or int8 (`q_type`). Same arithmetic as the host reference, bit for bit.
cudaError_t Quantize(void* y, ElemType q_type, const void* x, ElemType x_type, const void* scale, ElemType scale_type,
                     const void* zero_point, int64_t n, int64_t channels, int64_t inner, cudaStream_t stream);
// DequantizeLinear: y = float(q − zp[c]) · scale[c]; q uint8, int8 or int32 (`q_type`), y float32 or
// float16 (`y_type`), zp of q's type (null: 0).
cudaError_t Dequantize(void* y, ElemType y_type, const void* q, ElemType q_type, const void* scale,
                       ElemType scale_type, const void* zero_point, int64_t n, int64_t channels, int64_t inner,
                       cudaStream_t stream);

// vigil DynamicFakeQuantize (src/infer/ops/quant.cc) over n contiguous float elements, any layout: the range
// [min(0, min x), max(0, max x)] in two passes (per-block partials, then one block), then y = (q − zp) · scale
// (centered: y = q − zp, and the scale into *scale_out when non-null) with DynamicQuantizeLinear's scale, zero
// point and rounding — the host reference's arithmetic. `scratch`: DynamicFakeQuantizeScratchBytes() of device
// memory.
size_t DynamicFakeQuantizeScratchBytes();
cudaError_t DynamicFakeQuantize(void* y, const void* x, ElemType type, int64_t n, bool centered, float* scale_out,
                                void* scratch, cudaStream_t stream);

}  // namespace vigil::cuda
