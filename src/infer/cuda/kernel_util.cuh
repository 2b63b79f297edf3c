// kernel_util.cuh — device-side helpers shared by kernels.cu and tensor_kernels.cu (not a public header):
// element loads and stores with the ONNX Cast conversion rules, launch sizes, strided offsets, and the
// ElemType → C++ type dispatch.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <climits>
#include <type_traits>

#include "infer/cuda/kernels.h"

namespace vigil::cuda::detail {

constexpr int kThreads = 256;

// Grid size for n elements with kThreads per block and a grid-stride loop.
inline unsigned Blocks(int64_t n) {
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

inline int64_t Count(const StridedView& v) {
  int64_t n = 1;
  for (int d = 0; d < v.ndim; ++d) n *= v.shape[d];
  return n;
}

// The arithmetic type of a storage type: float for the float types, int64 for the integers and bool.
template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, __half>, float, int64_t>;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ int64_t Load(const int64_t* p, int64_t i) { return p[i]; }
__device__ __forceinline__ int64_t Load(const int32_t* p, int64_t i) { return p[i]; }
__device__ __forceinline__ int64_t Load(const int8_t* p, int64_t i) { return p[i]; }
__device__ __forceinline__ int64_t Load(const uint8_t* p, int64_t i) { return p[i]; }
__device__ __forceinline__ int64_t Load(const bool* p, int64_t i) { return p[i] ? 1 : 0; }

// The integer types' ranges as device constants (std::numeric_limits is host-only without relaxed constexpr).
template <typename D>
struct IntRange;
template <>
struct IntRange<int64_t> {
  static constexpr int64_t lo = INT64_MIN, hi = INT64_MAX;
};
template <>
struct IntRange<int32_t> {
  static constexpr int32_t lo = INT32_MIN, hi = INT32_MAX;
};
template <>
struct IntRange<int8_t> {
  static constexpr int8_t lo = -128, hi = 127;
};
template <>
struct IntRange<uint8_t> {
  static constexpr uint8_t lo = 0, hi = 255;
};

// Float → integer as the host reference's Cast: NaN gives 0, out-of-range values saturate, else truncation.
template <typename D>
__device__ __forceinline__ D SaturateFromFloat(float x) {
  if (x != x) return D(0);
  if (x <= static_cast<float>(IntRange<D>::lo)) return IntRange<D>::lo;
  if (x >= static_cast<float>(IntRange<D>::hi)) return IntRange<D>::hi;
  return static_cast<D>(x);
}

__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void Store(bool* p, int64_t i, float v) { p[i] = v != 0.0f; }
template <typename D>
__device__ __forceinline__ std::enable_if_t<std::is_integral_v<D> && !std::is_same_v<D, bool>> Store(D* p, int64_t i,
                                                                                                       float v) {
  p[i] = SaturateFromFloat<D>(v);
}
__device__ __forceinline__ void Store(float* p, int64_t i, int64_t v) { p[i] = static_cast<float>(v); }
__device__ __forceinline__ void Store(__half* p, int64_t i, int64_t v) { p[i] = __float2half_rn(static_cast<float>(v)); }
__device__ __forceinline__ void Store(bool* p, int64_t i, int64_t v) { p[i] = v != 0; }
template <typename D>
__device__ __forceinline__ std::enable_if_t<std::is_integral_v<D> && !std::is_same_v<D, bool>> Store(D* p, int64_t i,
                                                                                                       int64_t v) {
  p[i] = static_cast<D>(v);  // wraps, as the host reference's static_cast
}

// Calls f(static_cast<T*>(nullptr)) with T the C++ type of `t` (bool for kBool).
template <typename F>
void ForAnyType(ElemType t, F&& f) {
  switch (t) {
    case ElemType::kF32: f(static_cast<float*>(nullptr)); break;
    case ElemType::kF16: f(static_cast<__half*>(nullptr)); break;
    case ElemType::kI64: f(static_cast<int64_t*>(nullptr)); break;
    case ElemType::kI32: f(static_cast<int32_t*>(nullptr)); break;
    case ElemType::kI8: f(static_cast<int8_t*>(nullptr)); break;
    case ElemType::kU8: f(static_cast<uint8_t*>(nullptr)); break;
    case ElemType::kBool: f(static_cast<bool*>(nullptr)); break;
  }
}

// As ForAnyType over the float types only (kF16 → __half, anything else → float).
template <typename F>
void ForFloatType(ElemType t, F&& f) {
  if (t == ElemType::kF16) {
    f(static_cast<__half*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

// Calls f(static_cast<V*>(nullptr)) with V an unsigned type of `bytes` (1, 2, 4 or 8) bytes.
template <typename F>
void ForBytes(int bytes, F&& f) {
  switch (bytes) {
    case 1: f(static_cast<uint8_t*>(nullptr)); break;
    case 2: f(static_cast<uint16_t*>(nullptr)); break;
    case 4: f(static_cast<uint32_t*>(nullptr)); break;
    default: f(static_cast<uint64_t*>(nullptr)); break;
  }
}

}  // namespace vigil::cuda::detail
