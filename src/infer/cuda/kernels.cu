// kernels.cu — vigil's own CUDA kernels (kernels.h).
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "infer/cuda/kernels.h"
#include "infer/cuda/kernel_util.cuh"

namespace vigil::cuda {
namespace {

using detail::Blocks;
using detail::Count;
using detail::kThreads;
using detail::Load;
using detail::Offset;
using detail::Store;

template <typename To, typename Ti>
__global__ void StridedCopyKernel(To* dst, StridedView dv, const Ti* src, StridedView sv, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(dst, Offset(dv, i), Load(src, Offset(sv, i))); }
}

// 32-bit index arithmetic with the rank known at compile time (int64 division is ~10x slower).
struct View32 {
  int shape[kMaxDims];
  int stride[kMaxDims];
};

// The offsets of linear index i (row-major over a.shape, which b shares) in two 32-bit views of rank N.
template <int N>
__device__ __forceinline__ void Offsets32(int i, const View32& a, const View32& b, int* a_off, int* b_off) {
  int rem = i, ao = 0, bo = 0;
#pragma unroll
  for (int d = N - 1; d >= 0; --d) {
    const int q = rem / a.shape[d];
    const int idx = rem - q * a.shape[d];
    ao += idx * a.stride[d];
    bo += idx * b.stride[d];
    rem = q;
  }
  *a_off = ao;
  *b_off = bo;
}

template <int N, typename To, typename Ti>
__global__ void StridedCopyKernel32(To* dst, View32 dv, const Ti* src, View32 sv, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    int d_off, s_off;
    Offsets32<N>(i, dv, sv, &d_off, &s_off);
    Store(dst, d_off, Load(src, s_off));
  }
}

// dst[i] = src[i] moving raw elements V (same type on both sides; no conversion).
template <int N, typename V>
__global__ void StridedMoveKernel32(V* dst, View32 dv, const V* src, View32 sv, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    int d_off, s_off;
    Offsets32<N>(i, dv, sv, &d_off, &s_off);
    dst[d_off] = src[s_off];
  }
}

template <typename V>
__global__ void StridedMoveKernel(V* dst, StridedView dv, const V* src, StridedView sv, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { dst[Offset(dv, i)] = src[Offset(sv, i)]; }
}

// Row copies: `rows` rows of `width` vectors V, at pitches (in V) dst_pitch / src_pitch.
template <typename V>
__global__ void CopyRowsKernel(V* dst, int64_t dst_pitch, const V* src, int64_t src_pitch, int width, int64_t total) {
  VIGIL_GRID_STRIDE(i, total) {
    const int64_t r = i / width;
    const int64_t c = i - r * width;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
}

// Drops unit dims and merges dims that are contiguous in both views (outer stride = inner stride ·
// inner size). Keeps the element order, so a copy over the result equals the copy over the input.
void Collapse(StridedView& a, StridedView& b) {
  StridedView ra, rb;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] == 1) continue;
    const int k = ra.ndim;
    if (k > 0 && ra.stride[k - 1] == a.stride[d] * a.shape[d] && rb.stride[k - 1] == b.stride[d] * a.shape[d]) {
      ra.shape[k - 1] *= a.shape[d];
      rb.shape[k - 1] = ra.shape[k - 1];
      ra.stride[k - 1] = a.stride[d];
      rb.stride[k - 1] = b.stride[d];
      continue;
    }
    ra.shape[k] = rb.shape[k] = a.shape[d];
    ra.stride[k] = a.stride[d];
    rb.stride[k] = b.stride[d];
    ++ra.ndim;
    rb.ndim = ra.ndim;
  }
  if (ra.ndim == 0) {
    ra.ndim = rb.ndim = 1;
    ra.shape[0] = rb.shape[0] = 1;
    ra.stride[0] = rb.stride[0] = 1;
  }
  a = ra;
  b = rb;
}

// Largest vector (16, 8, 4, 2 bytes) dividing every byte quantity of a row copy.
int VectorBytes(int64_t esize, const void* dst, const void* src, int64_t dpitch, int64_t spitch, int64_t width) {
  for (int v : {16, 8, 4, 2}) {
    if (v < esize) break;
    if (reinterpret_cast<uintptr_t>(dst) % v == 0 && reinterpret_cast<uintptr_t>(src) % v == 0 &&
        (dpitch * esize) % v == 0 && (spitch * esize) % v == 0 && (width * esize) % v == 0) {
      return v;
    }
  }
  return static_cast<int>(esize);
}

template <typename V>
cudaError_t LaunchRows(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       cudaStream_t stream) {
  const int64_t total = width * rows;
  CopyRowsKernel<V><<<Blocks(total), kThreads, 0, stream>>>(static_cast<V*>(dst), dpitch, static_cast<const V*>(src), spitch,
                                                            static_cast<int>(width), total);
  return cudaGetLastError();
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
    case UnaryOp::kRound: return rintf(x);  // the default rounding mode: half to even
  }
  return x;
}

template <typename T>
__global__ void UnaryKernel(UnaryOp op, float alpha, float beta, T* out, const T* in, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(out, i, ApplyUnary<T>(op, Load(in, i), alpha, beta)); }
}

// Float operands (float16 is computed in float32). Max / Min propagate NaN as the host reference does.
__device__ __forceinline__ float ApplyBinary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPow: return powf(a, b);
    case BinaryOp::kMax: return (a < b || b != b) ? b : a;
    case BinaryOp::kMin: return (b < a || b != b) ? b : a;
    case BinaryOp::kMod:
    case BinaryOp::kFMod: return fmodf(a, b);
    case BinaryOp::kEqual: return a == b;
    case BinaryOp::kGreater: return a > b;
    case BinaryOp::kGreaterOrEqual: return a >= b;
    case BinaryOp::kLess: return a < b;
    case BinaryOp::kLessOrEqual: return a <= b;
    case BinaryOp::kAnd: return (a != 0.0f) && (b != 0.0f);
    case BinaryOp::kOr: return (a != 0.0f) || (b != 0.0f);
  }
  return a;
}

// Integer operands (and bool as 0 / 1), as the host reference: wrapping arithmetic (done unsigned here, so
// that overflow is defined), x / 0 = x % 0 = 0, x / −1 = −x.
__device__ __forceinline__ int64_t ApplyBinary(BinaryOp op, int64_t a, int64_t b) {
  const auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case BinaryOp::kAdd: return static_cast<int64_t>(ua + ub);
    case BinaryOp::kSub: return static_cast<int64_t>(ua - ub);
    case BinaryOp::kMul: return static_cast<int64_t>(ua * ub);
    case BinaryOp::kDiv:
      if (b == 0) return 0;
      if (b == -1) return static_cast<int64_t>(uint64_t{0} - ua);
      return a / b;
    case BinaryOp::kMod: {
      if (b == 0 || b == -1) return 0;
      int64_t r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      return r;
    }
    case BinaryOp::kFMod: return (b == 0 || b == -1) ? 0 : a % b;
    case BinaryOp::kPow: return 0;  // refused by the backend (integer Pow runs on the host)
    case BinaryOp::kMax: return a < b ? b : a;
    case BinaryOp::kMin: return b < a ? b : a;
    case BinaryOp::kEqual: return a == b;
    case BinaryOp::kGreater: return a > b;
    case BinaryOp::kGreaterOrEqual: return a >= b;
    case BinaryOp::kLess: return a < b;
    case BinaryOp::kLessOrEqual: return a <= b;
    case BinaryOp::kAnd: return (a != 0) && (b != 0);
    case BinaryOp::kOr: return (a != 0) || (b != 0);
  }
  return a;
}

template <typename T, typename To>
__global__ void BinaryKernel(BinaryOp op, To* out, const T* a, StridedView av, const T* b, StridedView bv, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(out, i, ApplyBinary(op, Load(a, Offset(av, i)), Load(b, Offset(bv, i)))); }
}

// Both operands contiguous over the output, or one of them a single element (stride 0).
template <typename T, typename To>
__global__ void BinaryFlatKernel(BinaryOp op, To* out, const T* a, int64_t a_step, const T* b, int64_t b_step, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { Store(out, i, ApplyBinary(op, Load(a, i * a_step), Load(b, i * b_step))); }
}

// BinaryKernel with 32-bit index arithmetic and the rank known at compile time (the output contiguous; a and b
// through their collapsed views).
template <int N, typename T, typename To>
__global__ void BinaryKernel32(BinaryOp op, To* out, const T* a, View32 av, const T* b, View32 bv, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    int ao, bo;
    Offsets32<N>(i, av, bv, &ao, &bo);
    Store(out, i, ApplyBinary(op, Load(a, ao), Load(b, bo)));
  }
}

__global__ void NotKernel(bool* out, const bool* in, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { out[i] = !in[i]; }
}

template <typename V>
__global__ void WhereKernel(V* out, const bool* cond, StridedView cv, const V* x, StridedView xv, const V* y,
                            StridedView yv, int64_t n) {
  VIGIL_GRID_STRIDE(i, n) { out[i] = cond[Offset(cv, i)] ? x[Offset(xv, i)] : y[Offset(yv, i)]; }
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

// I: int when every index fits 31 bits (4x faster division than int64), else int64_t.
template <typename I, typename To, typename Ti>
__global__ void MaxPoolKernel(To* out, const Ti* in, Pool2d p, I total) {
  const I pc = static_cast<I>(p.c), pow = static_cast<I>(p.ow), poh = static_cast<I>(p.oh);
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < total; i += static_cast<I>(blockDim.x) * gridDim.x) {
    // i enumerates outputs with the channel innermost (coalesced for NHWC).
    I r = i;
    const I c = r % pc; r /= pc;
    const I ow = r % pow; r /= pow;
    const I oh = r % poh;
    const I n = r / poh;
    float best = -FLT_MAX;
    const I base = n * static_cast<I>(p.in.n) + c * static_cast<I>(p.in.c);
    for (I ky = 0; ky < static_cast<I>(p.kh); ++ky) {
      const I y = oh * static_cast<I>(p.sh) - static_cast<I>(p.ph) + ky * static_cast<I>(p.dh);
      if (y < 0 || y >= static_cast<I>(p.h)) continue;
      for (I kx = 0; kx < static_cast<I>(p.kw); ++kx) {
        const I x = ow * static_cast<I>(p.sw) - static_cast<I>(p.pw) + kx * static_cast<I>(p.dw);
        if (x < 0 || x >= static_cast<I>(p.w)) continue;
        best = fmaxf(best, Load(in, base + y * static_cast<I>(p.in.h) + x * static_cast<I>(p.in.w)));
      }
    }
    Store(out, n * static_cast<I>(p.out.n) + c * static_cast<I>(p.out.c) + oh * static_cast<I>(p.out.h) +
                   ow * static_cast<I>(p.out.w),
          best);
  }
}

// MaxPoolKernel on NHWC data in whole 16-byte channel groups (p in group units: c and strides divided by the
// lanes per group): one thread per group of 16 / sizeof(T) channels, one uint4 load per window element.
template <typename I, typename T>
__global__ void MaxPoolGroupKernel(uint4* out, const uint4* in, Pool2d p, I total) {
  constexpr int kLanes = 16 / sizeof(T);
  const I pc = static_cast<I>(p.c), pow = static_cast<I>(p.ow), poh = static_cast<I>(p.oh);
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < total; i += static_cast<I>(blockDim.x) * gridDim.x) {
    I r = i;
    const I c = r % pc; r /= pc;
    const I ow = r % pow; r /= pow;
    const I oh = r % poh;
    const I n = r / poh;
    float best[kLanes];
    for (int j = 0; j < kLanes; ++j) best[j] = -FLT_MAX;
    const I base = n * static_cast<I>(p.in.n) + c;
    for (I ky = 0; ky < static_cast<I>(p.kh); ++ky) {
      const I y = oh * static_cast<I>(p.sh) - static_cast<I>(p.ph) + ky * static_cast<I>(p.dh);
      if (y < 0 || y >= static_cast<I>(p.h)) continue;
      for (I kx = 0; kx < static_cast<I>(p.kw); ++kx) {
        const I x = ow * static_cast<I>(p.sw) - static_cast<I>(p.pw) + kx * static_cast<I>(p.dw);
        if (x < 0 || x >= static_cast<I>(p.w)) continue;
        const uint4 raw = in[base + y * static_cast<I>(p.in.h) + x * static_cast<I>(p.in.w)];
        const T* lanes = reinterpret_cast<const T*>(&raw);
        for (int j = 0; j < kLanes; ++j) best[j] = fmaxf(best[j], Load(lanes, j));
      }
    }
    alignas(16) T result[kLanes];
    for (int j = 0; j < kLanes; ++j) Store(result, j, best[j]);
    out[n * static_cast<I>(p.out.n) + c + oh * static_cast<I>(p.out.h) + ow * static_cast<I>(p.out.w)] =
        *reinterpret_cast<const uint4*>(result);
  }
}

template <typename I, typename T>
__global__ void ResizeNearestKernel(T* out, const T* in, I c, I in_w, I out_w, I out_pixels, const int32_t* source,
                                    Strides4d is, Strides4d os, I total) {
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < total; i += static_cast<I>(blockDim.x) * gridDim.x) {
    I r = i;
    const I ch = r % c; r /= c;
    const I p = r % out_pixels;
    const I n = r / out_pixels;
    const I s = source[p];
    const I src = n * static_cast<I>(is.n) + ch * static_cast<I>(is.c) + (s / in_w) * static_cast<I>(is.h) +
                  (s % in_w) * static_cast<I>(is.w);
    const I dst = n * static_cast<I>(os.n) + ch * static_cast<I>(os.c) + (p / out_w) * static_cast<I>(os.h) +
                  (p % out_w) * static_cast<I>(os.w);
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

// ForFloatType, then the launch error.
template <typename F>
cudaError_t ForType(ElemType t, F&& f) {
  detail::ForFloatType(t, f);
  return cudaGetLastError();
}

}  // namespace

int ElemBytes(ElemType t) {
  switch (t) {
    case ElemType::kF32: case ElemType::kI32: return 4;
    case ElemType::kF16: return 2;
    case ElemType::kI64: return 8;
    default: return 1;
  }
}

bool BinaryWritesBool(BinaryOp op) { return op >= BinaryOp::kEqual; }

cudaError_t StridedCopy(void* dst, ElemType dst_type, const StridedView& dst_view, const void* src, ElemType src_type,
                        const StridedView& src_view, cudaStream_t stream) {
  const int64_t n = Count(dst_view);
  if (n == 0) return cudaSuccess;
  StridedView dv = dst_view, sv = src_view;
  for (int d = 0; d < sv.ndim; ++d) sv.shape[d] = dv.shape[d];
  Collapse(dv, sv);
  const int64_t esize = ElemBytes(dst_type);
  // Same type, rows contiguous on both sides: a (vectorised) row copy.
  if (dst_type == src_type && dv.ndim <= 2 && dv.stride[dv.ndim - 1] == 1 && sv.stride[sv.ndim - 1] == 1) {
    const int64_t width = dv.shape[dv.ndim - 1], rows = dv.ndim == 2 ? dv.shape[0] : 1;
    const int64_t dp = dv.ndim == 2 ? dv.stride[0] : width, sp = sv.ndim == 2 ? sv.stride[0] : width;
    const int v = VectorBytes(esize, dst, src, dp, sp, width);
    const int64_t k = v / esize;
    switch (v) {
      case 16: return LaunchRows<uint4>(dst, dp / k, src, sp / k, width / k, rows, stream);
      case 8: return LaunchRows<uint2>(dst, dp / k, src, sp / k, width / k, rows, stream);
      case 4: return LaunchRows<uint32_t>(dst, dp / k, src, sp / k, width / k, rows, stream);
      case 2: return LaunchRows<uint16_t>(dst, dp / k, src, sp / k, width / k, rows, stream);
      default: return LaunchRows<uint8_t>(dst, dp, src, sp, width, rows, stream);
    }
  }
  bool fits32 = n < (int64_t{1} << 30);
  for (int d = 0; d < dv.ndim; ++d) {
    fits32 = fits32 && std::abs(dv.stride[d]) * dv.shape[d] < (int64_t{1} << 30) &&
             std::abs(sv.stride[d]) * sv.shape[d] < (int64_t{1} << 30);
  }
  View32 d32{}, s32{};
  for (int d = 0; d < dv.ndim; ++d) {
    d32.shape[d] = static_cast<int>(dv.shape[d]);
    d32.stride[d] = static_cast<int>(dv.stride[d]);
    s32.stride[d] = static_cast<int>(sv.stride[d]);
  }
  const int m = static_cast<int>(n);
  if (dst_type == src_type) {  // raw element moves
    detail::ForBytes(static_cast<int>(esize), [&](auto* tag) {
      using V = std::remove_pointer_t<decltype(tag)>;
      auto* o = static_cast<V*>(dst);
      auto* in = static_cast<const V*>(src);
      if (!fits32) {
        StridedMoveKernel<V><<<Blocks(n), kThreads, 0, stream>>>(o, dv, in, sv, n);
        return;
      }
      switch (dv.ndim) {
        case 1: StridedMoveKernel32<1, V><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 2: StridedMoveKernel32<2, V><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 3: StridedMoveKernel32<3, V><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 4: StridedMoveKernel32<4, V><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 5: StridedMoveKernel32<5, V><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        default: StridedMoveKernel32<6, V><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
      }
    });
    return cudaGetLastError();
  }
  const bool floats = (dst_type == ElemType::kF32 || dst_type == ElemType::kF16) &&
                      (src_type == ElemType::kF32 || src_type == ElemType::kF16);
  if (!floats || !fits32) {  // any conversion (Cast): the general kernel
    detail::ForAnyType(dst_type, [&](auto* to) {
      using To = std::remove_pointer_t<decltype(to)>;
      detail::ForAnyType(src_type, [&](auto* ti) {
        using Ti = std::remove_pointer_t<decltype(ti)>;
        StridedCopyKernel<To, Ti><<<Blocks(n), kThreads, 0, stream>>>(static_cast<To*>(dst), dv,
                                                                      static_cast<const Ti*>(src), sv, n);
      });
    });
    return cudaGetLastError();
  }
  // float32 <-> float16 (layout conversions, convolution inputs): 32-bit indices, rank known at compile time.
  return ForType(dst_type, [&](auto* to) {
    using To = std::remove_pointer_t<decltype(to)>;
    detail::ForFloatType(src_type, [&](auto* ti) {
      using Ti = std::remove_pointer_t<decltype(ti)>;
      auto* o = static_cast<To*>(dst);
      auto* in = static_cast<const Ti*>(src);
      switch (dv.ndim) {
        case 1: StridedCopyKernel32<1, To, Ti><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 2: StridedCopyKernel32<2, To, Ti><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 3: StridedCopyKernel32<3, To, Ti><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 4: StridedCopyKernel32<4, To, Ti><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        case 5: StridedCopyKernel32<5, To, Ti><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
        default: StridedCopyKernel32<6, To, Ti><<<Blocks(n), kThreads, 0, stream>>>(o, d32, in, s32, m); break;
      }
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
  const bool to_bool = BinaryWritesBool(op);
  // Broadcasting: collapse the dims (unit dims dropped, neighbours merged where the output and both operands
  // continue contiguously) and index in 32 bits with the rank known at compile time — a DFL's
  // Mul(softmax [64,4,16,8400], arange [1,1,16,1]) took 1.6 ms through the int64 kernel, 10x its bytes' worth.
  // (The output is contiguous, so it merges wherever both operands do.)
  StridedView ca{}, cb{};
  if (a_view.ndim == b_view.ndim) {
    int k = 0;
    for (int d = 0; d < a_view.ndim; ++d) {
      if (a_view.shape[d] == 1) continue;
      const int64_t len = a_view.shape[d];
      if (k > 0 && ca.stride[k - 1] == a_view.stride[d] * len && cb.stride[k - 1] == b_view.stride[d] * len) {
        ca.shape[k - 1] *= len;
        ca.stride[k - 1] = a_view.stride[d];
        cb.stride[k - 1] = b_view.stride[d];
        cb.shape[k - 1] = ca.shape[k - 1];
        continue;
      }
      ca.shape[k] = cb.shape[k] = len;
      ca.stride[k] = a_view.stride[d];
      cb.stride[k] = b_view.stride[d];
      ++k;
    }
    if (k == 0) ca.shape[0] = cb.shape[0] = 1, k = 1;
    ca.ndim = cb.ndim = k;
  }
  bool fits32 = n < (int64_t{1} << 30) && ca.ndim <= 4 && a_view.ndim == b_view.ndim;
  for (int d = 0; d < ca.ndim; ++d) {
    fits32 = fits32 && std::abs(ca.stride[d]) * ca.shape[d] < (int64_t{1} << 30) &&
             std::abs(cb.stride[d]) * cb.shape[d] < (int64_t{1} << 30);
  }
  View32 a32{}, b32{};
  for (int d = 0; d < ca.ndim; ++d) {
    a32.shape[d] = b32.shape[d] = static_cast<int>(ca.shape[d]);
    a32.stride[d] = static_cast<int>(ca.stride[d]);
    b32.stride[d] = static_cast<int>(cb.stride[d]);
  }
  detail::ForAnyType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto launch = [&](auto* out_tag) {
      using To = std::remove_pointer_t<decltype(out_tag)>;
      auto* o = static_cast<To*>(out);
      auto* pa = static_cast<const T*>(a);
      auto* pb = static_cast<const T*>(b);
      if (sa >= 0 && sb >= 0) {
        BinaryFlatKernel<T, To><<<Blocks(n), kThreads, 0, stream>>>(op, o, pa, sa, pb, sb, n);
      } else if (fits32) {
        const int m = static_cast<int>(n);
        switch (ca.ndim) {
          case 1: BinaryKernel32<1, T, To><<<Blocks(n), kThreads, 0, stream>>>(op, o, pa, a32, pb, b32, m); break;
          case 2: BinaryKernel32<2, T, To><<<Blocks(n), kThreads, 0, stream>>>(op, o, pa, a32, pb, b32, m); break;
          case 3: BinaryKernel32<3, T, To><<<Blocks(n), kThreads, 0, stream>>>(op, o, pa, a32, pb, b32, m); break;
          default: BinaryKernel32<4, T, To><<<Blocks(n), kThreads, 0, stream>>>(op, o, pa, a32, pb, b32, m); break;
        }
      } else {
        BinaryKernel<T, To><<<Blocks(n), kThreads, 0, stream>>>(op, o, pa, a_view, pb, b_view, n);
      }
    };
    if (to_bool) {
      launch(static_cast<bool*>(nullptr));
    } else {
      launch(static_cast<T*>(nullptr));
    }
  });
  return cudaGetLastError();
}

cudaError_t LogicalNot(void* out, const void* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  NotKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<bool*>(out), static_cast<const bool*>(in), n);
  return cudaGetLastError();
}

cudaError_t Where(void* out, const void* cond, const StridedView& cond_view, const void* x, const StridedView& x_view,
                  const void* y, const StridedView& y_view, ElemType type, cudaStream_t stream) {
  const int64_t n = Count(x_view);
  if (n == 0) return cudaSuccess;
  detail::ForBytes(ElemBytes(type), [&](auto* tag) {
    using V = std::remove_pointer_t<decltype(tag)>;
    WhereKernel<V><<<Blocks(n), kThreads, 0, stream>>>(static_cast<V*>(out), static_cast<const bool*>(cond), cond_view,
                                                       static_cast<const V*>(x), x_view, static_cast<const V*>(y),
                                                       y_view, n);
  });
  return cudaGetLastError();
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
  // NHWC in whole 16-byte channel groups, same type in and out: a thread per group (as ResizeNearest).
  const int64_t v = 16 / static_cast<int64_t>(in_type == ElemType::kF16 ? sizeof(__half) : sizeof(float));
  const auto whole = [v](const Strides4d& s) { return s.c == 1 && s.n % v == 0 && s.h % v == 0 && s.w % v == 0; };
  if (out_type == in_type && p.c % v == 0 && whole(p.in) && whole(p.out) && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    Pool2d g = p;
    g.c = p.c / v;
    g.in = Strides4d{p.in.n / v, 1, p.in.h / v, p.in.w / v};
    g.out = Strides4d{p.out.n / v, 1, p.out.h / v, p.out.w / v};
    const int64_t groups = total / v;
    return ForType(in_type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (g.n * g.in.n < (int64_t{1} << 30) && g.n * g.out.n < (int64_t{1} << 30)) {
        MaxPoolGroupKernel<int, T><<<Blocks(groups), kThreads, 0, stream>>>(
            static_cast<uint4*>(out), static_cast<const uint4*>(in), g, static_cast<int>(groups));
      } else {
        MaxPoolGroupKernel<int64_t, T><<<Blocks(groups), kThreads, 0, stream>>>(static_cast<uint4*>(out),
                                                                                static_cast<const uint4*>(in), g, groups);
      }
    });
  }
  return ForType(out_type, [&](auto* to) {
    using To = std::remove_pointer_t<decltype(to)>;
    ForType(in_type, [&](auto* ti) {
      using Ti = std::remove_pointer_t<decltype(ti)>;
      const bool small = p.n * p.in.n < (int64_t{1} << 30) && p.n * p.out.n < (int64_t{1} << 30);
      if (small) {
        MaxPoolKernel<int, To, Ti><<<Blocks(total), kThreads, 0, stream>>>(static_cast<To*>(out), static_cast<const Ti*>(in),
                                                                           p, static_cast<int>(total));
      } else {
        MaxPoolKernel<int64_t, To, Ti><<<Blocks(total), kThreads, 0, stream>>>(static_cast<To*>(out),
                                                                               static_cast<const Ti*>(in), p, total);
      }
    });
  });
}

cudaError_t ResizeNearest(void* out, const void* in, ElemType type, int64_t n, int64_t c, int64_t in_w,
                          int64_t out_w, int64_t out_pixels, const int32_t* source, const Strides4d& in_strides,
                          const Strides4d& out_strides, cudaStream_t stream) {
  const int64_t total = n * c * out_pixels;
  if (total == 0) return cudaSuccess;
  // NHWC with whole 16-byte channel groups (8 fp16 or 4 fp32 channels, every pixel 16-byte aligned): the
  // same kernel moves uint4 groups, one thread per group instead of per element. The element-wise form is
  // bound by its index arithmetic, not by memory (ncu, batch-64 YOLOv8n on an H200: 320 GB/s, SM 78 %).
  const int64_t v = 16 / static_cast<int64_t>(type == ElemType::kF16 ? sizeof(__half) : sizeof(float));
  const auto whole = [v](const Strides4d& s) { return s.c == 1 && s.n % v == 0 && s.h % v == 0 && s.w % v == 0; };
  if (c % v == 0 && whole(in_strides) && whole(out_strides) && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const auto groups = [v](const Strides4d& s) { return Strides4d{s.n / v, 1, s.h / v, s.w / v}; };
    const Strides4d is = groups(in_strides), os = groups(out_strides);
    const int64_t total16 = total / v;
    if (n * os.n < (int64_t{1} << 30) && n * is.n < (int64_t{1} << 30)) {
      ResizeNearestKernel<int, uint4><<<Blocks(total16), kThreads, 0, stream>>>(
          static_cast<uint4*>(out), static_cast<const uint4*>(in), static_cast<int>(c / v), static_cast<int>(in_w),
          static_cast<int>(out_w), static_cast<int>(out_pixels), source, is, os, static_cast<int>(total16));
    } else {
      ResizeNearestKernel<int64_t, uint4><<<Blocks(total16), kThreads, 0, stream>>>(
          static_cast<uint4*>(out), static_cast<const uint4*>(in), c / v, in_w, out_w, out_pixels, source, is, os, total16);
    }
    return cudaGetLastError();
  }
  return ForType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (n * out_strides.n < (int64_t{1} << 30) && n * in_strides.n < (int64_t{1} << 30)) {
      ResizeNearestKernel<int, T><<<Blocks(total), kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(in), static_cast<int>(c), static_cast<int>(in_w),
          static_cast<int>(out_w), static_cast<int>(out_pixels), source, in_strides, out_strides, static_cast<int>(total));
    } else {
      ResizeNearestKernel<int64_t, T><<<Blocks(total), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in),
                                                                              c, in_w, out_w, out_pixels, source,
                                                                              in_strides, out_strides, total);
    }
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
