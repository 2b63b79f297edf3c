// tensor_kernels.cu — reductions, TopK, Gather / GatherElements, Pad, the BatchNormalization affine,
// average pooling and (de)quantization (kernels.h). Semantics follow the host reference kernels
// (src/infer/ops), which follow the ONNX specification.
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_scan.cuh>

#include "infer/cuda/kernel_util.cuh"
#include "infer/cuda/kernels.h"

namespace vigil::cuda {
namespace {

using detail::Blocks;
using detail::Compute;
using detail::Count;
using detail::kThreads;
using detail::Load;
using detail::Offset;
using detail::Store;

// ---- Reductions ------------------------------------------------------------------------------

template <typename C>
__device__ __forceinline__ C ReduceInit(ReduceOp op) {
  if constexpr (std::is_same_v<C, float>) {
    switch (op) {
      case ReduceOp::kMax: return -INFINITY;
      case ReduceOp::kMin: return INFINITY;
      case ReduceOp::kProd: return 1.0f;
      default: return 0.0f;
    }
  } else {
    switch (op) {
      case ReduceOp::kMax: return INT64_MIN;
      case ReduceOp::kMin: return INT64_MAX;
      case ReduceOp::kProd: return 1;
      default: return 0;
    }
  }
}

// acc ⊕ v for one element v.
template <typename C>
__device__ __forceinline__ C ReduceStep(ReduceOp op, C acc, C v) {
  switch (op) {
    case ReduceOp::kMax: return acc < v ? v : acc;
    case ReduceOp::kMin: return v < acc ? v : acc;
    case ReduceOp::kProd: return acc * v;
    case ReduceOp::kL2: return acc + v * v;
    default: return acc + v;
  }
}

// Two partial results combined (the square of L2 is already summed).
template <typename C>
__device__ __forceinline__ C ReduceCombine(ReduceOp op, C a, C b) {
  return op == ReduceOp::kL2 ? a + b : ReduceStep(op, a, b);
}

template <typename C>
__device__ __forceinline__ C ReduceFinish(ReduceOp op, C acc, int64_t count) {
  if (op == ReduceOp::kMean) {
    if constexpr (std::is_same_v<C, float>) return acc / static_cast<float>(count);
    else return count == 0 ? 0 : acc / count;
  }
  if constexpr (std::is_same_v<C, float>) {
    if (op == ReduceOp::kL2) return sqrtf(acc);
  }
  return acc;
}

// One thread per output: small reductions (coalesced when neighbouring outputs are neighbours in memory).
template <typename T>
__global__ void ReduceThreadKernel(ReduceOp op, T* out, const T* in, StridedView kept, StridedView red, int64_t n_out,
                                   int64_t n_red) {
  using C = Compute<T>;
  VIGIL_GRID_STRIDE(o, n_out) {
    const T* base = in + Offset(kept, o);
    C acc = ReduceInit<C>(op);
    if (red.ndim == 1) {  // one reduced axis (a DFL's bins, an ArgMax's classes): no index division
      for (int64_t r = 0; r < n_red; ++r) acc = ReduceStep<C>(op, acc, Load(base, r * red.stride[0]));
    } else {
      for (int64_t r = 0; r < n_red; ++r) acc = ReduceStep<C>(op, acc, Load(base, Offset(red, r)));
    }
    Store(out, o, ReduceFinish<C>(op, acc, n_red));
  }
}

// One block per output: large reductions (global pooling, whole-tensor sums).
template <typename T>
__global__ void ReduceBlockKernel(ReduceOp op, T* out, const T* in, StridedView kept, StridedView red, int64_t n_out,
                                  int64_t n_red) {
  using C = Compute<T>;
  __shared__ C partial[kThreads];
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* base = in + Offset(kept, o);
    C acc = ReduceInit<C>(op);
    for (int64_t r = threadIdx.x; r < n_red; r += blockDim.x) acc = ReduceStep<C>(op, acc, Load(base, Offset(red, r)));
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = blockDim.x / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) partial[threadIdx.x] = ReduceCombine<C>(op, partial[threadIdx.x], partial[threadIdx.x + width]);
      __syncthreads();
    }
    if (threadIdx.x == 0) Store(out, o, ReduceFinish<C>(op, partial[0], n_red));
    __syncthreads();
  }
}

// ArgMax / ArgMin along one axis (red.ndim == 1): the host reference's scan order and tie rule.
template <typename T>
__global__ void ArgKernel(bool max, bool last, int64_t* out, const T* in, StridedView kept, int64_t axis_len,
                          int64_t axis_stride, int64_t n_out) {
  VIGIL_GRID_STRIDE(o, n_out) {
    const T* p = in + Offset(kept, o);
    int64_t best = 0;
    auto b = Load(p, 0);
    for (int64_t i = 1; i < axis_len; ++i) {
      const auto v = Load(p, i * axis_stride);
      const bool better = max ? (v > b || (last && v == b)) : (v < b || (last && v == b));
      if (better) best = i, b = v;
    }
    out[o] = best;
  }
}

// ---- TopK --------------------------------------------------------------------------------------

constexpr int kTopKThreads = 256;

// An order-preserving unsigned key: larger value ⇒ larger key; NaN above every number (all NaNs equal).
__device__ __forceinline__ uint64_t KeyOf(float v) {
  if (v != v) return 0xffffffffull;
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);  // −0 and +0 are equal
  return (bits & 0x80000000u) ? ~bits & 0xffffffffu : bits | 0x80000000u;
}
__device__ __forceinline__ uint64_t KeyOf(int64_t v) { return static_cast<uint64_t>(v) ^ (uint64_t{1} << 63); }

// One block per slice: radix-select the k-th key (8 bits per pass), gather the keys above it and, in index
// order, as many equal to it as k still needs; then sort those k by rank (key, then lower index).
template <typename T>
__global__ void TopKKernel(T* values, int64_t* indices, const T* in, int64_t n, int64_t inner, int64_t k, bool largest,
                           int key_bits, uint64_t* scratch_keys, int64_t* scratch_idx) {
  using Scan = cub::BlockScan<int, kTopKThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ unsigned hist[256];
  __shared__ uint64_t prefix, mask;
  __shared__ int64_t want, taken, ties_taken;
  const int64_t slice = blockIdx.x;
  const int64_t base = (slice / inner) * n * inner + slice % inner;
  const int64_t out_base = (slice / inner) * k * inner + slice % inner;
  uint64_t* cand_key = scratch_keys + slice * k;
  int64_t* cand_idx = scratch_idx + slice * k;
  auto key_at = [&](int64_t j) {
    const uint64_t key = KeyOf(Load(in, base + j * inner));
    return largest ? key : ~key & (key_bits == 64 ? ~uint64_t{0} : 0xffffffffull);
  };
  if (threadIdx.x == 0) prefix = 0, mask = 0, want = k, taken = 0, ties_taken = 0;
  __syncthreads();
  if (k == 0) return;
  for (int shift = key_bits - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint64_t key = key_at(j);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t above = 0;
      int bin = 255;
      for (; bin > 0 && above + hist[bin] < want; --bin) above += hist[bin];
      want -= above;
      prefix |= static_cast<uint64_t>(bin) << shift;
      mask |= uint64_t{255} << shift;
    }
    __syncthreads();
  }
  // prefix is the k-th key; `want` elements equal to it are taken (lowest indices first).
  const uint64_t kth = prefix;
  const int64_t ties_wanted = want;
  for (int64_t chunk = 0; chunk < n; chunk += blockDim.x) {
    const int64_t j = chunk + threadIdx.x;
    const uint64_t key = j < n ? key_at(j) : 0;
    const int tie = j < n && key == kth ? 1 : 0;
    int tie_rank = 0, chunk_ties = 0;
    Scan(scan_storage).ExclusiveSum(tie, tie_rank, chunk_ties);
    __syncthreads();
    const int take = j < n && (key > kth || (tie && ties_taken + tie_rank < ties_wanted)) ? 1 : 0;
    int pos = 0, chunk_taken = 0;
    Scan(scan_storage).ExclusiveSum(take, pos, chunk_taken);
    __syncthreads();
    if (take) {
      cand_key[taken + pos] = key;
      cand_idx[taken + pos] = j;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      taken += chunk_taken;
      const int64_t left = ties_wanted - ties_taken;
      ties_taken += left < chunk_ties ? (left > 0 ? left : 0) : chunk_ties;
    }
    __syncthreads();
  }
  // Rank sort: candidate i goes to the number of candidates ordered before it.
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const uint64_t ki = cand_key[i];
    const int64_t ii = cand_idx[i];
    int64_t rank = 0;
    for (int64_t j = 0; j < k; ++j) {
      const uint64_t kj = cand_key[j];
      rank += (kj > ki || (kj == ki && cand_idx[j] < ii)) ? 1 : 0;
    }
    values[out_base + rank * inner] = in[base + ii * inner];
    indices[out_base + rank * inner] = ii;
  }
}

// ---- Gather ----------------------------------------------------------------------------------------

__device__ __forceinline__ void Report(Fault* fault, int64_t value) {
  if (fault != nullptr && atomicCAS(&fault[0], 0ull, 1ull) == 0ull) fault[1] = static_cast<unsigned long long>(value);
}

template <typename V, typename I>
__global__ void GatherKernel(V* out, const V* data, int64_t dim, int64_t inner, const I* idx, int64_t nidx, int64_t total,
                             Fault* fault) {
  VIGIL_GRID_STRIDE(e, total) {
    const int64_t r = e % inner, rest = e / inner;
    const int64_t j = rest % nidx, o = rest / nidx;
    int64_t i = static_cast<int64_t>(idx[j]);
    if (i < -dim || i >= dim) {
      Report(fault, i);
      out[e] = V{};
      continue;
    }
    if (i < 0) i += dim;
    out[e] = data[(o * dim + i) * inner + r];
  }
}

template <typename V, typename I>
__global__ void GatherElementsKernel(V* out, const V* data, StridedView view, int64_t axis_stride, int64_t dim, const I* idx,
                                     int64_t total, Fault* fault) {
  VIGIL_GRID_STRIDE(e, total) {
    int64_t i = static_cast<int64_t>(idx[e]);
    if (i < -dim || i >= dim) {
      Report(fault, i);
      out[e] = V{};
      continue;
    }
    if (i < 0) i += dim;
    out[e] = data[Offset(view, e) + i * axis_stride];
  }
}

// ---- Pad -----------------------------------------------------------------------------------------

template <typename V>
__global__ void PadKernel(V* out, const V* in, PadSpec spec, int64_t total) {
  VIGIL_GRID_STRIDE(e, total) {
    int64_t rem = e, src = 0, stride = 1;
    bool outside = false;
    for (int d = spec.ndim - 1; d >= 0; --d) {
      const int64_t o = rem % spec.out_shape[d];
      rem /= spec.out_shape[d];
      int64_t i = o - spec.begin[d];
      const int64_t len = spec.in_shape[d];
      if (i < 0 || i >= len) {
        if (spec.mode == PadMode::kConstant) {
          outside = true;
        } else if (spec.mode == PadMode::kEdge) {
          i = i < 0 ? 0 : len - 1;
        } else if (len == 1) {
          i = 0;
        } else {  // reflect without repeating the edge: period 2·(len − 1)
          const int64_t period = 2 * (len - 1);
          i %= period;
          if (i < 0) i += period;
          if (i >= len) i = period - i;
        }
      }
      src += i * stride;
      stride *= len;
    }
    V v;
    if (outside) {
      const unsigned long long bits = spec.value;
      memcpy(&v, &bits, sizeof(V));
    } else {
      v = in[src];
    }
    out[e] = v;
  }
}

// ---- BatchNormalization, AveragePool -------------------------------------------------------------

template <typename T>
__global__ void ChannelAffineKernel(T* y, const T* x, const float* scale, const float* shift, int64_t n, int64_t channels,
                                    int64_t inner) {
  VIGIL_GRID_STRIDE(i, n) {
    const int64_t c = (i / inner) % channels;
    Store(y, i, Load(x, i) * scale[c] + shift[c]);
  }
}

template <typename To, typename Ti>
__global__ void AvgPoolKernel(To* out, const Ti* in, Pool2d p, int64_t pe_h, int64_t pe_w, bool include_pad, int64_t total) {
  VIGIL_GRID_STRIDE(i, total) {
    int64_t r = i;
    const int64_t c = r % p.c; r /= p.c;
    const int64_t ow = r % p.ow; r /= p.ow;
    const int64_t oh = r % p.oh;
    const int64_t n = r / p.oh;
    float sum = 0.0f;
    int64_t inside = 0, padded = 0;
    const int64_t base = n * p.in.n + c * p.in.c;
    for (int64_t ky = 0; ky < p.kh; ++ky) {
      const int64_t y = oh * p.sh - p.ph + ky * p.dh;
      for (int64_t kx = 0; kx < p.kw; ++kx) {
        const int64_t x = ow * p.sw - p.pw + kx * p.dw;
        if (y >= -p.ph && y < p.h + pe_h && x >= -p.pw && x < p.w + pe_w) ++padded;
        if (y < 0 || y >= p.h || x < 0 || x >= p.w) continue;
        sum += Load(in, base + y * p.in.h + x * p.in.w);
        ++inside;
      }
    }
    const int64_t count = include_pad ? padded : inside;
    Store(out, n * p.out.n + c * p.out.c + oh * p.out.h + ow * p.out.w, count > 0 ? sum / static_cast<float>(count) : 0.0f);
  }
}

// ---- Quantization --------------------------------------------------------------------------------

template <typename Q, typename X, typename S>
__global__ void QuantizeKernel(Q* y, const X* x, const S* scale, const Q* zp, int64_t n, int64_t channels, int64_t inner) {
  constexpr float lo = static_cast<float>(detail::IntRange<Q>::lo);
  constexpr float hi = static_cast<float>(detail::IntRange<Q>::hi);
  VIGIL_GRID_STRIDE(i, n) {
    const int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    const float s = Load(scale, c);
    const float z = zp != nullptr ? static_cast<float>(zp[c]) : 0.0f;
    float v = rintf(__fdiv_rn(Load(x, i), s)) + z;
    v = v > lo ? v : lo;
    y[i] = static_cast<Q>(v < hi ? v : hi);
  }
}

template <typename Y, typename Q, typename S>
__global__ void DequantizeKernel(Y* y, const Q* q, const S* scale, const Q* zp, int64_t n, int64_t channels, int64_t inner) {
  VIGIL_GRID_STRIDE(i, n) {
    const int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    const int64_t z = zp != nullptr ? static_cast<int64_t>(zp[c]) : 0;
    Store(y, i, __fmul_rn(static_cast<float>(static_cast<int64_t>(q[i]) - z), Load(scale, c)));
  }
}

// ---- DynamicFakeQuantize ------------------------------------------------------------------------

constexpr int kRangePartials = 1024;

// Block b's [min, max] of its grid-stride share, 0 included (DynamicQuantizeLinear's range includes 0).
template <typename T>
__global__ void RangePartialKernel(float2* partials, const T* x, int64_t n) {
  __shared__ float lo_s[kThreads], hi_s[kThreads];
  float lo = 0.0f, hi = 0.0f;
  VIGIL_GRID_STRIDE(i, n) {
    const float v = Load(x, i);
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  lo_s[threadIdx.x] = lo;
  hi_s[threadIdx.x] = hi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      lo_s[threadIdx.x] = fminf(lo_s[threadIdx.x], lo_s[threadIdx.x + w]);
      hi_s[threadIdx.x] = fmaxf(hi_s[threadIdx.x], hi_s[threadIdx.x + w]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = make_float2(lo_s[0], hi_s[0]);
}

// One block: the partials' range → (scale, zero point) in params[0] as (scale, zp as float); the scale also into
// *scale_out when given.
__global__ void RangeParamsKernel(float2* params, const float2* partials, int count, float* scale_out) {
  __shared__ float lo_s[kThreads], hi_s[kThreads];
  float lo = 0.0f, hi = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) lo = fminf(lo, partials[i].x), hi = fmaxf(hi, partials[i].y);
  lo_s[threadIdx.x] = lo;
  hi_s[threadIdx.x] = hi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      lo_s[threadIdx.x] = fminf(lo_s[threadIdx.x], lo_s[threadIdx.x + w]);
      hi_s[threadIdx.x] = fmaxf(hi_s[threadIdx.x], hi_s[threadIdx.x + w]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float l = lo_s[0], h = hi_s[0];
    const float scale = __fdiv_rn(h == l ? 1.0f : __fsub_rn(h, l), 255.0f);
    float zp = rintf(__fdiv_rn(-l, scale));
    zp = zp > 0.0f ? zp : 0.0f;
    zp = zp < 255.0f ? zp : 255.0f;
    params[0] = make_float2(scale, zp);
    if (scale_out != nullptr) *scale_out = scale;
  }
}

template <typename T>
__global__ void FakeQuantizeKernel(T* y, const T* x, const float2* params, int64_t n, bool centered) {
  const float2 p = params[0];
  const float step = centered ? 1.0f : p.x;
  VIGIL_GRID_STRIDE(i, n) {
    float q = rintf(__fdiv_rn(Load(x, i), p.x)) + p.y;
    q = q > 0.0f ? q : 0.0f;
    q = q < 255.0f ? q : 255.0f;
    Store(y, i, __fmul_rn(__fsub_rn(q, p.y), step));
  }
}

template <typename F>
cudaError_t ForQuant(ElemType t, F&& f) {
  switch (t) {
    case ElemType::kU8: f(static_cast<uint8_t*>(nullptr)); break;
    case ElemType::kI8: f(static_cast<int8_t*>(nullptr)); break;
    case ElemType::kI32: f(static_cast<int32_t*>(nullptr)); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t Reduce(ReduceOp op, void* out, const void* in, ElemType type, const StridedView& kept,
                   const StridedView& reduced, bool select_last, cudaStream_t stream) {
  const int64_t n_out = Count(kept), n_red = Count(reduced);
  if (n_out == 0) return cudaSuccess;
  if (type == ElemType::kBool) return cudaErrorInvalidValue;
  if (op == ReduceOp::kArgMax || op == ReduceOp::kArgMin) {
    if (reduced.ndim != 1 || n_red == 0) return cudaErrorInvalidValue;
    detail::ForAnyType(type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if constexpr (!std::is_same_v<T, bool>) {
        ArgKernel<T><<<Blocks(n_out), kThreads, 0, stream>>>(op == ReduceOp::kArgMax, select_last, static_cast<int64_t*>(out),
                                                             static_cast<const T*>(in), kept, n_red, reduced.stride[0], n_out);
      }
    });
    return cudaGetLastError();
  }
  detail::ForAnyType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (!std::is_same_v<T, bool>) {
      // Few outputs with long reductions: a block each; else a thread each.
      if (n_red >= 128 && n_out < 4096) {
        const unsigned blocks = static_cast<unsigned>(n_out < 65535 * 8 ? n_out : 65535 * 8);
        ReduceBlockKernel<T><<<blocks, kThreads, 0, stream>>>(op, static_cast<T*>(out), static_cast<const T*>(in), kept,
                                                              reduced, n_out, n_red);
      } else {
        ReduceThreadKernel<T><<<Blocks(n_out), kThreads, 0, stream>>>(op, static_cast<T*>(out), static_cast<const T*>(in),
                                                                      kept, reduced, n_out, n_red);
      }
    }
  });
  return cudaGetLastError();
}

size_t TopKScratchBytes(int64_t slices, int64_t k) {
  return static_cast<size_t>(slices * k) * (sizeof(uint64_t) + sizeof(int64_t));
}

cudaError_t TopK(void* values, int64_t* indices, const void* in, ElemType type, int64_t outer, int64_t n, int64_t inner,
                 int64_t k, bool largest, void* scratch, cudaStream_t stream) {
  const int64_t slices = outer * inner;
  if (slices == 0 || k == 0) return cudaSuccess;
  if (type == ElemType::kBool || slices > 0x7fffffff) return cudaErrorInvalidValue;
  auto* keys = static_cast<uint64_t*>(scratch);
  auto* idx = reinterpret_cast<int64_t*>(keys + slices * k);
  detail::ForAnyType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (!std::is_same_v<T, bool>) {
      const int bits = std::is_same_v<Compute<T>, float> ? 32 : 64;
      TopKKernel<T><<<static_cast<unsigned>(slices), kTopKThreads, 0, stream>>>(
          static_cast<T*>(values), indices, static_cast<const T*>(in), n, inner, k, largest, bits, keys, idx);
    }
  });
  return cudaGetLastError();
}

cudaError_t Gather(void* out, const void* data, int elem_bytes, int64_t outer, int64_t dim, int64_t inner,
                   const void* indices, ElemType index_type, int64_t nidx, Fault* fault, cudaStream_t stream) {
  const int64_t total = outer * nidx * inner;
  if (total == 0) return cudaSuccess;
  if (index_type != ElemType::kI64 && index_type != ElemType::kI32) return cudaErrorInvalidValue;
  detail::ForBytes(elem_bytes, [&](auto* tag) {
    using V = std::remove_pointer_t<decltype(tag)>;
    if (index_type == ElemType::kI64) {
      GatherKernel<V, int64_t><<<Blocks(total), kThreads, 0, stream>>>(static_cast<V*>(out), static_cast<const V*>(data), dim,
                                                                       inner, static_cast<const int64_t*>(indices), nidx,
                                                                       total, fault);
    } else {
      GatherKernel<V, int32_t><<<Blocks(total), kThreads, 0, stream>>>(static_cast<V*>(out), static_cast<const V*>(data), dim,
                                                                       inner, static_cast<const int32_t*>(indices), nidx,
                                                                       total, fault);
    }
  });
  return cudaGetLastError();
}

cudaError_t GatherElements(void* out, const void* data, int elem_bytes, const StridedView& out_view, int64_t axis_stride,
                           int64_t dim, const void* indices, ElemType index_type, Fault* fault, cudaStream_t stream) {
  const int64_t total = Count(out_view);
  if (total == 0) return cudaSuccess;
  if (index_type != ElemType::kI64 && index_type != ElemType::kI32) return cudaErrorInvalidValue;
  detail::ForBytes(elem_bytes, [&](auto* tag) {
    using V = std::remove_pointer_t<decltype(tag)>;
    if (index_type == ElemType::kI64) {
      GatherElementsKernel<V, int64_t><<<Blocks(total), kThreads, 0, stream>>>(
          static_cast<V*>(out), static_cast<const V*>(data), out_view, axis_stride, dim, static_cast<const int64_t*>(indices),
          total, fault);
    } else {
      GatherElementsKernel<V, int32_t><<<Blocks(total), kThreads, 0, stream>>>(
          static_cast<V*>(out), static_cast<const V*>(data), out_view, axis_stride, dim, static_cast<const int32_t*>(indices),
          total, fault);
    }
  });
  return cudaGetLastError();
}

cudaError_t Pad(void* out, const void* in, int elem_bytes, const PadSpec& spec, cudaStream_t stream) {
  int64_t total = 1;
  for (int d = 0; d < spec.ndim; ++d) total *= spec.out_shape[d];
  if (total == 0) return cudaSuccess;
  detail::ForBytes(elem_bytes, [&](auto* tag) {
    using V = std::remove_pointer_t<decltype(tag)>;
    PadKernel<V><<<Blocks(total), kThreads, 0, stream>>>(static_cast<V*>(out), static_cast<const V*>(in), spec, total);
  });
  return cudaGetLastError();
}

cudaError_t ChannelAffine(void* y, const void* x, ElemType type, const float* scale, const float* shift, int64_t n,
                          int64_t channels, int64_t inner, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  detail::ForFloatType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ChannelAffineKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(y), static_cast<const T*>(x), scale, shift, n,
                                                               channels, inner);
  });
  return cudaGetLastError();
}

cudaError_t AvgPool2d(void* out, ElemType out_type, const void* in, ElemType in_type, const Pool2d& p, int64_t pe_h,
                      int64_t pe_w, bool count_include_pad, cudaStream_t stream) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total == 0) return cudaSuccess;
  detail::ForFloatType(out_type, [&](auto* to) {
    using To = std::remove_pointer_t<decltype(to)>;
    detail::ForFloatType(in_type, [&](auto* ti) {
      using Ti = std::remove_pointer_t<decltype(ti)>;
      AvgPoolKernel<To, Ti><<<Blocks(total), kThreads, 0, stream>>>(static_cast<To*>(out), static_cast<const Ti*>(in), p, pe_h,
                                                                    pe_w, count_include_pad, total);
    });
  });
  return cudaGetLastError();
}

cudaError_t Quantize(void* y, ElemType q_type, const void* x, ElemType x_type, const void* scale, ElemType scale_type,
                     const void* zero_point, int64_t n, int64_t channels, int64_t inner, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (q_type != ElemType::kU8 && q_type != ElemType::kI8) return cudaErrorInvalidValue;
  const cudaError_t e = ForQuant(q_type, [&](auto* qt) {
    using Q = std::remove_pointer_t<decltype(qt)>;
    detail::ForFloatType(x_type, [&](auto* xt) {
      using X = std::remove_pointer_t<decltype(xt)>;
      detail::ForFloatType(scale_type, [&](auto* st) {
        using S = std::remove_pointer_t<decltype(st)>;
        QuantizeKernel<Q, X, S><<<Blocks(n), kThreads, 0, stream>>>(static_cast<Q*>(y), static_cast<const X*>(x),
                                                                    static_cast<const S*>(scale),
                                                                    static_cast<const Q*>(zero_point), n, channels, inner);
      });
    });
  });
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t Dequantize(void* y, ElemType y_type, const void* q, ElemType q_type, const void* scale, ElemType scale_type,
                       const void* zero_point, int64_t n, int64_t channels, int64_t inner, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const cudaError_t e = ForQuant(q_type, [&](auto* qt) {
    using Q = std::remove_pointer_t<decltype(qt)>;
    detail::ForFloatType(y_type, [&](auto* yt) {
      using Y = std::remove_pointer_t<decltype(yt)>;
      detail::ForFloatType(scale_type, [&](auto* st) {
        using S = std::remove_pointer_t<decltype(st)>;
        DequantizeKernel<Y, Q, S><<<Blocks(n), kThreads, 0, stream>>>(static_cast<Y*>(y), static_cast<const Q*>(q),
                                                                      static_cast<const S*>(scale),
                                                                      static_cast<const Q*>(zero_point), n, channels, inner);
      });
    });
  });
  return e != cudaSuccess ? e : cudaGetLastError();
}

size_t DynamicFakeQuantizeScratchBytes() { return (kRangePartials + 1) * sizeof(float2); }

cudaError_t DynamicFakeQuantize(void* y, const void* x, ElemType type, int64_t n, bool centered, float* scale_out,
                                void* scratch, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto* params = static_cast<float2*>(scratch);
  float2* partials = params + 1;
  const int64_t want = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < kRangePartials ? want : kRangePartials);
  detail::ForFloatType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RangePartialKernel<T><<<blocks, kThreads, 0, stream>>>(partials, static_cast<const T*>(x), n);
    RangeParamsKernel<<<1, kThreads, 0, stream>>>(params, partials, blocks, scale_out);
    FakeQuantizeKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(y), static_cast<const T*>(x), params, n,
                                                              centered);
  });
  return cudaGetLastError();
}

}  // namespace vigil::cuda
