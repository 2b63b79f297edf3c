// kernels.h — vigil's own CUDA kernels for the CUDA backend (cuda_backend.cc): everything that is
// not a convolution (cuDNN) or a matrix product (cuBLAS).
//
// Conventions:
//  - Element types: float32 or float16 storage (ElemType); arithmetic is done in float32 and rounded
//    once when stored (round to nearest even, __float2half_rn).
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

enum class ElemType : uint8_t { kF32, kF16 };
inline constexpr int kMaxDims = 6;

// Shape and strides of a strided view: element (i0..i_{n-1}) at offset sum(i_k · stride_k).
struct StridedView {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

// dst[i] = src[i] over the shape of `dst_view` (src_view.shape must equal it), converting the element
// type. Serves Transpose, Slice, Expand, Concat/Split pieces and NCHW <-> NHWC conversion.
cudaError_t StridedCopy(void* dst, ElemType dst_type, const StridedView& dst_view, const void* src, ElemType src_type,
                        const StridedView& src_view, cudaStream_t stream);

enum class UnaryOp : uint8_t {
  kIdentity, kSigmoid, kRelu, kLeakyRelu, kTanh, kExp, kLog, kNeg, kAbs, kSqrt, kReciprocal, kFloor, kCeil,
  kErf, kHardSigmoid, kHardSwish, kSiLU, kClip, kSoftplus
};
// out[i] = f(in[i]) for n contiguous elements. alpha/beta: LeakyRelu alpha; HardSigmoid alpha, beta;
// Clip min (alpha), max (beta).
cudaError_t Unary(UnaryOp op, float alpha, float beta, void* out, const void* in, ElemType type, int64_t n,
                  cudaStream_t stream);

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin };
// out = a op b over `out_shape` (contiguous output); a and b read through broadcast strides (0 on
// broadcast dims). All three share `type`.
cudaError_t Binary(BinaryOp op, void* out, const void* a, const StridedView& a_view, const void* b,
                   const StridedView& b_view, ElemType type, cudaStream_t stream);

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

}  // namespace vigil::cuda
