// kernels.cu — vigil's own CUDA kernels (kernels.h).
#include <cuda_fp16.h>

#include <cfloat>
#include <type_traits>

#include "infer/cuda/kernels.h"

namespace vigil::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

// Grid size for n elements with kThreads per block and a grid-stride loop.
unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

#define VIGIL_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Offset of linear index `i` (row-major over view.shape) in a strided view.
__device__ __forceinline__ int64_t Offset(const StridedView& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    const int64_t q = i / v.shape[d];
    off += (i - q * v.shape[d]) * v.stride[d];
    i = q;
  }
  return off;
}

int64_t Count(const StridedView& v) {
  int64_t n = 1;
  for (int d = 0; d < v.ndim; ++d) n *= v.shape[d];
  return n;
}

template <typename To, typename Ti>
__global__ void StridedCopyKernel(To* dst, StridedView dv, const Ti* src, StridedView sv, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(dst, Offset(dv, i), Load(src, Offset(sv, i))); }
}

template <typename T>
__device__ __forceinline__ float ApplyUnary(UnaryOp op, float x, float alpha, float beta) {
  switch (op) {
    case UnaryOp::kIdentity: return x;
    case UnaryOp::kSigmoid: return 1.0f / (1.0f + __expf(-x));
    case UnaryOp::kRelu: return x > 0.0f ? x : 0.0f;
    case UnaryOp::kLeakyRelu: return x >= 0.0f ? x : alpha * x;
    case UnaryOp::kTanh: return tanhf(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kLog: return logf(x);
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return fabsf(x);
    case UnaryOp::kSqrt: return sqrtf(x);
    case UnaryOp::kReciprocal: return 1.0f / x;
    case UnaryOp::kFloor: return floorf(x);
    case UnaryOp::kCeil: return ceilf(x);
    case UnaryOp::kErf: return erff(x);
    case UnaryOp::kHardSigmoid: return fminf(1.0f, fmaxf(0.0f, alpha * x + beta));
    case UnaryOp::kHardSwish: return x * fminf(1.0f, fmaxf(0.0f, x / 6.0f + 0.5f));
    case UnaryOp::kSiLU: return x / (1.0f + __expf(-x));
    case UnaryOp::kClip: return fminf(beta, fmaxf(alpha, x));
    case UnaryOp::kSoftplus: return x > 20.0f ? x : log1pf(__expf(x));
  }
  return x;
}

template <typename T>
__global__ void UnaryKernel(UnaryOp op, float alpha, float beta, T* out, const T* in, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(out, i, ApplyUnary<T>(op, Load(in, i), alpha, beta)); }
}

__device__ __forceinline__ float ApplyBinary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPow: return powf(a, b);
    case BinaryOp::kMax: return fmaxf(a, b);
    case BinaryOp::kMin: return fminf(a, b);
  }
  return a;
}

template <typename T>
__global__ void BinaryKernel(BinaryOp op, T* out, const T* a, StridedView av, const T* b, StridedView bv, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(out, i, ApplyBinary(op, Load(a, Offset(av, i)), Load(b, Offset(bv, i)))); }
}

// Both operands contiguous over the output, or one of them a single element (stride 0).
template <typename T>
__global__ void BinaryFlatKernel(BinaryOp op, T* out, const T* a, int64_t a_step, const T* b, int64_t b_step, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(out, i, ApplyBinary(op, Load(a, i * a_step), Load(b, i * b_step))); }
}

template <typename T>
__global__ void BiasActivationKernel(T* y, const float* bias, int64_t n, int64_t channels, int64_t inner, UnaryOp act,
                                     float alpha) {
  VIGIL_GRID_STRIDE(i, n) {
    float v = Load(y, i);
    if (bias != nullptr) v += bias[(i / inner) % channels];
    Store(y, i, ApplyUnary<T>(act, v, alpha, 0.0f));
  }
}

template <typename To, typename Ti>
__global__ void MaxPoolKernel(To* out, const Ti* in, Pool2d p, int64_t total) {
  VIGIL_GRID_STRIDE(i, total) {
    // i enumerates outputs with the channel innermost (coalesced for NHWC).
    int64_t r = i;
    const int64_t c = r % p.c; r /= p.c;
    const int64_t ow = r % p.ow; r /= p.ow;
    const int64_t oh = r % p.oh;
    const int64_t n = r / p.oh;
    float best = -FLT_MAX;
    const int64_t base = n * p.in.n + c * p.in.c;
    for (int64_t ky = 0; ky < p.kh; ++ky) {
      const int64_t y = oh * p.sh - p.ph + ky * p.dh;
      if (y < 0 || y >= p.h) continue;
      for (int64_t kx = 0; kx < p.kw; ++kx) {
        const int64_t x = ow * p.sw - p.pw + kx * p.dw;
        if (x < 0 || x >= p.w) continue;
        best = fmaxf(best, Load(in, base + y * p.in.h + x * p.in.w));
      }
    }
    Store(out, n * p.out.n + c * p.out.c + oh * p.out.h + ow * p.out.w, best);
  }
}

template <typename T>
__global__ void ResizeNearestKernel(T* out, const T* in, int64_t c, int64_t in_w, int64_t out_w, int64_t out_pixels,
                                    const int32_t* source, Strides4d is, Strides4d os, int64_t total) {
  VIGIL_GRID_STRIDE(i, total) {
    int64_t r = i;
    const int64_t ch = r % c; r /= c;
    const int64_t p = r % out_pixels;
    const int64_t n = r / out_pixels;
    const int64_t s = source[p];
    const int64_t src = n * is.n + ch * is.c + (s / in_w) * is.h + (s % in_w) * is.w;
    const int64_t dst = n * os.n + ch * os.c + (p / out_w) * os.h + (p % out_w) * os.w;
    out[dst] = in[src];
  }
}

template <typename T>
__global__ void SoftmaxKernel(T* out, const T* in, int64_t outer, int64_t axis, int64_t inner, bool log_softmax) {
  VIGIL_GRID_STRIDE(i, outer * inner) {
    const int64_t o = i / inner, k = i % inner;
    const int64_t base = o * axis * inner + k;
    float m = -FLT_MAX;
    for (int64_t a = 0; a < axis; ++a) m = fmaxf(m, Load(in, base + a * inner));
    float sum = 0.0f;
    for (int64_t a = 0; a < axis; ++a) sum += expf(Load(in, base + a * inner) - m);
    const float ls = logf(sum);
    for (int64_t a = 0; a < axis; ++a) {
      const float x = Load(in, base + a * inner) - m;
      Store(out, base + a * inner, log_softmax ? x - ls : expf(x) / sum);
    }
  }
}

template <typename F>
cudaError_t ForType(ElemType t, F&& f) {
  if (t == ElemType::kF16) {
    f(static_cast<__half*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t StridedCopy(void* dst, ElemType dst_type, const StridedView& dst_view, const void* src, ElemType src_type,
                        const StridedView& src_view, cudaStream_t stream) {
  const int64_t n = Count(dst_view);
  if (n == 0) return cudaSuccess;
  return ForType(dst_type, [&](auto* to) {
    using To = std::remove_pointer_t<decltype(to)>;
    ForType(src_type, [&](auto* ti) {
      using Ti = std::remove_pointer_t<decltype(ti)>;
      StridedCopyKernel<To, Ti><<<Blocks(n), kThreads, 0, stream>>>(static_cast<To*>(dst), dst_view,
                                                                    static_cast<const Ti*>(src), src_view, n);
    });
  });
}

cudaError_t Unary(UnaryOp op, float alpha, float beta, void* out, const void* in, ElemType type, int64_t n,
                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return ForType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    UnaryKernel<T><<<Blocks(n), kThreads, 0, stream>>>(op, alpha, beta, static_cast<T*>(out), static_cast<const T*>(in), n);
  });
}

cudaError_t Binary(BinaryOp op, void* out, const void* a, const StridedView& a_view, const void* b,
                   const StridedView& b_view, ElemType type, cudaStream_t stream) {
  const int64_t n = Count(a_view);
  if (n == 0) return cudaSuccess;
  // Flat fast path: a view is "flat" when contiguous over the output (step 1) or one element (step 0).
  auto step = [&](const StridedView& v) -> int64_t {
    bool zero = true, contiguous = true;
    int64_t expect = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (v.shape[d] == 1) continue;
      zero = zero && v.stride[d] == 0;
      contiguous = contiguous && v.stride[d] == expect;
      expect *= v.shape[d];
    }
    return zero ? 0 : contiguous ? 1 : -1;
  };
  const int64_t sa = step(a_view), sb = step(b_view);
  return ForType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (sa >= 0 && sb >= 0) {
      BinaryFlatKernel<T><<<Blocks(n), kThreads, 0, stream>>>(op, static_cast<T*>(out), static_cast<const T*>(a), sa,
                                                              static_cast<const T*>(b), sb, n);
    } else {
      BinaryKernel<T><<<Blocks(n), kThreads, 0, stream>>>(op, static_cast<T*>(out), static_cast<const T*>(a), a_view,
                                                          static_cast<const T*>(b), b_view, n);
    }
  });
}

cudaError_t BiasActivation(void* y, ElemType type, const float* bias, int64_t n, int64_t channels, int64_t inner,
                           UnaryOp act, float alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return ForType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BiasActivationKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(y), bias, n, channels, inner, act, alpha);
  });
}

cudaError_t MaxPool2d(void* out, ElemType out_type, const void* in, ElemType in_type, const Pool2d& p,
                      cudaStream_t stream) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total == 0) return cudaSuccess;
  return ForType(out_type, [&](auto* to) {
    using To = std::remove_pointer_t<decltype(to)>;
    ForType(in_type, [&](auto* ti) {
      using Ti = std::remove_pointer_t<decltype(ti)>;
      MaxPoolKernel<To, Ti><<<Blocks(total), kThreads, 0, stream>>>(static_cast<To*>(out), static_cast<const Ti*>(in), p,
                                                                    total);
    });
  });
}

cudaError_t ResizeNearest(void* out, const void* in, ElemType type, int64_t n, int64_t c, int64_t in_w,
                          int64_t out_w, int64_t out_pixels, const int32_t* source, const Strides4d& in_strides,
                          const Strides4d& out_strides, cudaStream_t stream) {
  const int64_t total = n * c * out_pixels;
  if (total == 0) return cudaSuccess;
  return ForType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ResizeNearestKernel<T><<<Blocks(total), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), c,
                                                                   in_w, out_w, out_pixels, source, in_strides,
                                                                   out_strides, total);
  });
}

cudaError_t Softmax(void* out, const void* in, ElemType type, int64_t outer, int64_t axis, int64_t inner,
                    bool log_softmax, cudaStream_t stream) {
  if (outer * inner == 0 || axis == 0) return cudaSuccess;
  return ForType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    SoftmaxKernel<T><<<Blocks(outer * inner), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in),
                                                                      outer, axis, inner, log_softmax);
  });
}

}  // namespace vigil::cuda
