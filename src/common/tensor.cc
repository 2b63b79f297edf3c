#include "vigil/common/tensor.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace vigil {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
    case DType::kUndefined: return 0;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kUndefined: return "undefined";
  }
  return "undefined";
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Half conversion after the IEEE 754-2008 binary16 layout: 1 sign, 5 exponent (bias 15), 10 fraction bits.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // overflow after rounding → inf
  if (absx < 0x38800000u) {                          // result is subnormal or zero
    if (absx < 0x33000000u) return sign;             // below half the smallest subnormal
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    // value = m * 2^(e-150) and a half subnormal is k * 2^-24, so k = m >> (126 - e).
    const uint32_t total = 126 - e;
    uint32_t r = m >> total;
    const uint32_t rem = m & ((1u << total) - 1);
    const uint32_t halfway = 1u << (total - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((absx >> 13) - (112u << 10));  // rebias exponent 127 → 15
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

namespace {
std::shared_ptr<void> AllocateAligned(size_t bytes) {
  const size_t n = ((bytes == 0 ? 1 : bytes) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, n);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, n);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
}  // namespace

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  storage_ = AllocateAligned(nbytes());
  data_ = storage_.get();
}

Tensor Tensor::Wrap(DType dtype, Shape shape, void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

namespace {
template <typename Out, typename Fn>
std::vector<Out> ConvertAll(const Tensor& t, Fn&& cast) {
  std::vector<Out> v(static_cast<size_t>(t.numel()));
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kFloat32: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<float>()[i]); break;
    case DType::kFloat16: for (int64_t i = 0; i < n; ++i) v[i] = cast(HalfToFloat(t.data<uint16_t>()[i])); break;
    case DType::kFloat64: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<double>()[i]); break;
    case DType::kInt8: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<int8_t>()[i]); break;
    case DType::kUInt8: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<uint8_t>()[i]); break;
    case DType::kInt16: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<int16_t>()[i]); break;
    case DType::kInt32: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<int32_t>()[i]); break;
    case DType::kInt64: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<int64_t>()[i]); break;
    case DType::kBool: for (int64_t i = 0; i < n; ++i) v[i] = cast(t.data<uint8_t>()[i] != 0); break;
    case DType::kUndefined: break;
  }
  return v;
}
}  // namespace

std::vector<int64_t> Tensor::ToInt64Vector() const {
  return ConvertAll<int64_t>(*this, [](auto x) { return static_cast<int64_t>(x); });
}

std::vector<float> Tensor::ToFloatVector() const {
  return ConvertAll<float>(*this, [](auto x) { return static_cast<float>(x); });
}

Tensor Tensor::ToFloat32() const {
  if (dtype_ == DType::kFloat32) return *this;
  Tensor t(DType::kFloat32, shape_);
  const std::vector<float> v = ToFloatVector();
  if (!v.empty()) std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

}  // namespace vigil
