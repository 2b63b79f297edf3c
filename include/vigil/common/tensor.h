// vigil/common/tensor.h — dense host tensors.
//
// A Tensor is a dtype, a shape and a pointer to contiguous row-major (C order) elements in host
// memory. Strides are implied by the shape (innermost dimension contiguous); sizes are in
// elements unless a name says bytes. A rank-0 tensor (shape {}) holds one element.
//
// Ownership: a Tensor either owns its storage (constructor, Clone) through a shared_ptr — copies
// of such a Tensor share the same bytes — or is a non-owning view (Wrap) whose caller keeps the
// memory alive for as long as the view is used.
// Thread-safety: a Tensor is a value; concurrent reads are safe, concurrent writes to the same
// elements are the caller's business.
// Errors: none are reported here; shapes are validated by the code that builds graphs and kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vigil {

// Element types. Values match no external enum: use the converters in onnx_import for ONNX.
enum class DType : uint8_t {
  kUndefined = 0,
  kFloat32,
  kFloat16,  // IEEE 754 binary16, stored as uint16_t
  kFloat64,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,  // one byte per element, 0 or 1
};

// Size of one element in bytes (0 for kUndefined).
size_t DTypeSize(DType dtype);
// Lower-case name as ONNX spells it ("float32" → "float", etc. are not used): "float32", "float16", "int64", ...
std::string_view DTypeName(DType dtype);

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for rank 0). REQUIRES: every dimension >= 0.
int64_t NumElements(const Shape& shape);
// "[1,3,640,640]".
std::string ShapeToString(const Shape& shape);

template <typename T>
constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kFloat32; }
template <> constexpr DType DTypeOf<double>() { return DType::kFloat64; }
template <> constexpr DType DTypeOf<int8_t>() { return DType::kInt8; }
template <> constexpr DType DTypeOf<uint8_t>() { return DType::kUInt8; }
template <> constexpr DType DTypeOf<int16_t>() { return DType::kInt16; }
template <> constexpr DType DTypeOf<int32_t>() { return DType::kInt32; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kInt64; }
template <> constexpr DType DTypeOf<bool>() { return DType::kBool; }

// IEEE 754 binary16 <-> binary32, round to nearest even; handles subnormals, inf and NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

class Tensor {
 public:
  // An undefined tensor (defined() == false), used for omitted optional inputs.
  Tensor() = default;
  // Allocates zero-filled storage for NumElements(shape) elements, 64-byte aligned.
  Tensor(DType dtype, Shape shape);

  // A non-owning view of `data`, which must hold NumElements(shape) elements of `dtype`.
  static Tensor Wrap(DType dtype, Shape shape, void* data);
  // A rank-0 or rank-1 tensor holding a copy of `values`.
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, Shape shape);
  template <typename T>
  static Tensor Scalar(T value) { return FromVector<T>({value}, {}); }

  bool defined() const { return dtype_ != DType::kUndefined; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Dimension i; negative i counts from the end.
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T>
  T* data() { return static_cast<T*>(data_); }
  template <typename T>
  const T* data() const { return static_cast<const T*>(data_); }

  // Same storage, new shape. REQUIRES: NumElements(shape) == numel().
  Tensor Reshaped(Shape shape) const;
  // Deep copy into new owned storage.
  Tensor Clone() const;
  // Values converted to int64 (integer dtypes) — for shape-like tensors such as Reshape's shape.
  std::vector<int64_t> ToInt64Vector() const;
  // Values converted to float (any numeric dtype).
  std::vector<float> ToFloatVector() const;
  // A new float32 tensor with this tensor's values (float16/float64/integers converted).
  Tensor ToFloat32() const;

 private:
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  std::shared_ptr<void> storage_;  // null for views
  void* data_ = nullptr;
};

template <typename T>
Tensor Tensor::FromVector(const std::vector<T>& values, Shape shape) {
  Tensor t(DTypeOf<T>(), std::move(shape));
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.numel(); ++i) p[i] = values[i];
  return t;
}

}  // namespace vigil
