// The CUDA backend's kernels for the rest of the reference op set (issue 21 item 2): copies, logic, Where, Cast,
// Expand/Tile, Depth/SpaceToDepth, reductions, TopK, Gather, Pad, BatchNorm, AveragePool, Q/DQ, Gemm; MakeGpuKernel (cuda_build.h).
#include "infer/cuda/cuda_build.h"

namespace vigil::infer::cuda_build {
// ---- Kernels of the reference op set beyond the detection body (issue 21 item 2) ------------------

// A 4-byte-aligned copy of the whole value (Identity, Dropout at inference, Reshape and friends).
StatusOr<std::unique_ptr<CudaKernel>> MakeCopy(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype or layout");
  if (b.node.outputs.size() > 1 && !b.node.outputs[1].empty()) return b.Unsupported("Dropout mask output");
  return Kernel("copy", [=](cudaStream_t s) {
    return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, x.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "copy");
  });
}

// A pinned word pair the index kernels report a bad index in (cuda::Fault); Check reads it after the
// stream synchronised. Null in a dry run.
class FaultWord {
 public:
  static StatusOr<FaultWord> Create(Resources& res, const std::string& what) {
    FaultWord f;
    if (res.dry) return f;
    VIGIL_ASSIGN_OR_RETURN(PinnedBuffer p, PinnedBuffer::Allocate(2 * sizeof(cuda::Fault), what));
    f.word_ = static_cast<cuda::Fault*>(p.get());
    f.word_[0] = f.word_[1] = 0;
    res.pinned.push_back(std::move(p));
    return f;
  }
  cuda::Fault* get() const { return word_; }
  // The error for a reported index (then cleared), or OK.
  Status Take(const Node& node, int64_t dim) const {
    if (word_ == nullptr || word_[0] == 0) return absl::OkStatus();
    const auto index = static_cast<int64_t>(word_[1]);
    word_[0] = word_[1] = 0;
    return NodeError(node, "index ", index, " is out of range for an axis of size ", dim);
  }

 private:
  cuda::Fault* word_ = nullptr;
};

class IndexKernel final : public CudaKernel {
 public:
  IndexKernel(const Node& node, int64_t dim, FaultWord fault, LambdaKernel::Fn fn)
      : node_(node), dim_(dim), fault_(fault), fn_(std::move(fn)) {}
  std::string_view name() const override { return "cuda"; }
  Status Enqueue(cudaStream_t stream) override { return fn_(stream); }
  Status Check() override { return fault_.Take(node_, dim_); }

 private:
  Node node_;
  int64_t dim_;
  FaultWord fault_;
  LambdaKernel::Fn fn_;
};

StatusOr<std::unique_ptr<CudaKernel>> MakeNot(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.dtype != DType::kBool || y.dtype != DType::kBool) return b.Unsupported("dtype");
  const int64_t n = NumElements(y.shape);
  return Kernel("cuda", [=](cudaStream_t s) { return Launched(cuda::LogicalNot(y.ptr, x.ptr, n, s), "Not"); });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeWhere(Build& b) {
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(y.dtype, &et) || y.nhwc) return b.Unsupported("dtype or layout");
  VIGIL_ASSIGN_OR_RETURN(auto c, Operand(b, 0, y, DType::kBool));
  VIGIL_ASSIGN_OR_RETURN(auto x, Operand(b, 1, y, y.dtype));
  VIGIL_ASSIGN_OR_RETURN(auto z, Operand(b, 2, y, y.dtype));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Where(y.ptr, c.first.ptr, c.second, x.first.ptr, x.second, z.first.ptr, z.second, et, s), "Where");
  });
}

// Cast: a converting copy (ONNX Cast rules, kernels.h StridedCopy). CastLike likewise.
StatusOr<std::unique_ptr<CudaKernel>> MakeCast(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType xt, yt;
  if (!ElemOfAny(x.dtype, &xt) || !ElemOfAny(y.dtype, &yt) || x.nhwc || y.nhwc) {
    return b.Unsupported("cast ", DTypeName(x.dtype), " to ", DTypeName(y.dtype));
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView v, MakeView({NumElements(y.shape)}, {1}));
  return Kernel("cuda", [=](cudaStream_t s) { return Launched(cuda::StridedCopy(y.ptr, yt, v, x.ptr, xt, v, s), "Cast"); });
}

// Expand (broadcast strides) and Tile (each repeated axis split in (repeats, size) with stride 0 on the first).
StatusOr<std::unique_ptr<CudaKernel>> MakeExpandTile(Build& b, bool tile) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype != y.dtype || x.nhwc || y.nhwc) return b.Unsupported("dtype or layout");
  StridedView sv, dv;
  if (!tile) {
    VIGIL_ASSIGN_OR_RETURN(sv, MakeView(y.shape, BroadcastStrides(x.shape, y.shape)));
    VIGIL_ASSIGN_OR_RETURN(dv, MakeView(y.shape, ContiguousStrides(y.shape)));
  } else {
    if (x.shape.size() != y.shape.size()) return b.Unsupported("rank");
    const std::vector<int64_t> xs = ContiguousStrides(x.shape);
    Shape shape;
    std::vector<int64_t> src;
    for (size_t d = 0; d < x.shape.size(); ++d) {
      const int64_t reps = x.shape[d] == 0 ? 0 : y.shape[d] / x.shape[d];
      if (reps != 1) shape.push_back(reps), src.push_back(0);
      shape.push_back(x.shape[d]), src.push_back(xs[d]);
    }
    VIGIL_ASSIGN_OR_RETURN(sv, MakeView(shape, src));
    VIGIL_ASSIGN_OR_RETURN(dv, MakeView(shape, ContiguousStrides(shape)));
  }
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, et, dv, x.ptr, et, sv, s), tile ? "Tile" : "Expand");
  });
}

// DepthToSpace (DCR / CRD) and SpaceToDepth: 6-D strided copies.
StatusOr<std::unique_ptr<CudaKernel>> MakeDepthSpace(Build& b, bool to_space) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype != y.dtype || x.nhwc || y.nhwc || x.shape.size() != 4) {
    return b.Unsupported("dtype, layout or rank");
  }
  const int64_t bs = b.node.GetInt("blocksize", 0);
  if (bs <= 0) return NodeError(b.node, "blocksize must be positive");
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  Shape shape;
  std::vector<int64_t> src;
  if (to_space) {  // y [n, c/bs², h·bs, w·bs] as [n, c', h, bs, w, bs]
    const int64_t cp = c / (bs * bs);
    const bool crd = b.node.GetString("mode", "DCR") == "CRD";
    shape = {n, cp, h, bs, w, bs};
    // x channel of (c', i, j): DCR (i·bs + j)·c' + c'; CRD c'·bs² + i·bs + j.
    const int64_t hw = h * w;
    src = {c * hw, (crd ? bs * bs : 1) * hw, w, (crd ? bs : bs * cp) * hw, 1, (crd ? 1 : cp) * hw};
  } else {  // y [n, c·bs², h/bs, w/bs] as [n, bs, bs, c, h', w'] (channel (i·bs + j)·c + c)
    shape = {n, bs, bs, c, h / bs, w / bs};
    src = {c * h * w, w, 1, h * w, bs * w, bs};
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(shape, ContiguousStrides(shape)));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, et, dv, x.ptr, et, sv, s), to_space ? "DepthToSpace" : "SpaceToDepth");
  });
}

// Reduce* (axes as the host reference reads them), ArgMax / ArgMin, GlobalAveragePool / GlobalMaxPool.
StatusOr<std::unique_ptr<CudaKernel>> MakeReduce(Build& b, cuda::ReduceOp op) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype == DType::kBool) return b.Unsupported("dtype ", DTypeName(x.dtype));
  if (op == cuda::ReduceOp::kL2 && !IsFloat(x.dtype)) return b.Unsupported("integer ReduceL2");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  const std::string& name = node.op_type;
  std::vector<int64_t> axes;
  bool select_last = false;
  if (name == "GlobalAveragePool" || name == "GlobalMaxPool") {
    for (int64_t d = 2; d < r; ++d) axes.push_back(d);
  } else if (name == "ArgMax" || name == "ArgMin") {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, node.GetInt("axis", 0), r));
    axes = {a};
    select_last = node.GetInt("select_last_index", 0) != 0;
  } else {
    const int64_t axes_input = name == "ReduceSum" ? 13 : 18;
    if (b.opset >= axes_input) {
      if (node.HasInput(1)) {
        VIGIL_ASSIGN_OR_RETURN(axes, ConstInts(b, 1, "axes"));
      }
    } else {
      axes = node.GetInts("axes");
    }
    if (axes.empty()) {
      if (node.GetInt("noop_with_empty_axes", 0) != 0) return MakeCopy(b);
      for (int64_t d = 0; d < r; ++d) axes.push_back(d);
    }
    VIGIL_ASSIGN_OR_RETURN(axes, NormalizeAxes(node, axes, r));
  }
  // Kept and reduced axes through the input's own strides (NHWC too: global pooling in the region's reader).
  const std::vector<int64_t> xs = LogicalStrides(x);
  Shape kept_shape, red_shape;
  std::vector<int64_t> kept_strides, red_strides;
  for (int64_t d = 0; d < r; ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    (reduced ? red_shape : kept_shape).push_back(x.shape[static_cast<size_t>(d)]);
    (reduced ? red_strides : kept_strides).push_back(xs[static_cast<size_t>(d)]);
  }
  if (y.nhwc) return b.Unsupported("layout");
  VIGIL_ASSIGN_OR_RETURN(StridedView kept, MakeView(kept_shape, kept_strides));
  VIGIL_ASSIGN_OR_RETURN(StridedView red, MakeView(red_shape, red_strides));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Reduce(op, y.ptr, x.ptr, et, kept, red, select_last, s), "reduce");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeTopK(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& values = b.Out(0);
  const Value& indices = b.Out(1);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype == DType::kBool || x.nhwc || values.dtype != x.dtype) {
    return b.Unsupported("dtype or layout");
  }
  const int64_t r = static_cast<int64_t>(x.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", -1), r));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < r; ++d) inner *= x.shape[static_cast<size_t>(d)];
  const int64_t n = x.shape[static_cast<size_t>(axis)], k = values.shape[static_cast<size_t>(axis)];
  const bool largest = b.opset < 11 || node.GetInt("largest", 1) != 0;
  VIGIL_ASSIGN_OR_RETURN(void* scratch, b.res.Alloc(cuda::TopKScratchBytes(outer * inner, k), node.name + " scratch"));
  auto* idx = static_cast<int64_t*>(indices.ptr);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::TopK(values.ptr, idx, x.ptr, et, outer, n, inner, k, largest, scratch, s), "TopK");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeGather(Build& b, bool elements) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value data, b.In(0));
  VIGIL_ASSIGN_OR_RETURN(Value idx, b.In(1));
  const Value& y = b.Out(0);
  if (!Storable(data.dtype) || data.nhwc || y.dtype != data.dtype) return b.Unsupported("dtype or layout");
  if (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) return b.Unsupported("index dtype");
  const int64_t r = static_cast<int64_t>(data.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", 0), r));
  const int64_t dim = data.shape[static_cast<size_t>(axis)];
  const int bytes = static_cast<int>(DTypeSize(data.dtype));
  const ElemType it = AnyElemOf(idx.dtype);
  VIGIL_ASSIGN_OR_RETURN(FaultWord fault, FaultWord::Create(b.res, node.name + " index check"));
  if (!elements) {
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data.shape[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < r; ++d) inner *= data.shape[static_cast<size_t>(d)];
    const int64_t nidx = NumElements(idx.shape);
    return std::unique_ptr<CudaKernel>(std::make_unique<IndexKernel>(node, dim, fault, [=](cudaStream_t s) {
      return Launched(cuda::Gather(y.ptr, data.ptr, bytes, outer, dim, inner, idx.ptr, it, nidx, fault.get(), s), "Gather");
    }));
  }
  std::vector<int64_t> strides = ContiguousStrides(data.shape);
  const int64_t axis_stride = strides[static_cast<size_t>(axis)];
  strides[static_cast<size_t>(axis)] = 0;
  VIGIL_ASSIGN_OR_RETURN(StridedView view, MakeView(idx.shape, strides));
  return std::unique_ptr<CudaKernel>(std::make_unique<IndexKernel>(node, dim, fault, [=](cudaStream_t s) {
    return Launched(cuda::GatherElements(y.ptr, data.ptr, bytes, view, axis_stride, dim, idx.ptr, it, fault.get(), s),
                    "GatherElements");
  }));
}

// Pad-2/11/13/18: pads (and axes) constant; the value constant too; constant, reflect or edge.
StatusOr<std::unique_ptr<CudaKernel>> MakePad(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!Storable(x.dtype) || x.nhwc || y.dtype != x.dtype) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r > cuda::kMaxDims) return b.Unsupported("rank ", r);
  cuda::PadSpec spec;
  const std::string mode = node.GetString("mode", "constant");
  if (mode == "reflect") spec.mode = cuda::PadMode::kReflect;
  else if (mode == "edge") spec.mode = cuda::PadMode::kEdge;
  else if (mode != "constant") return b.Unsupported("mode '", mode, "'");
  std::vector<int64_t> pads, axes;
  float value = 0.0f;
  if (b.opset < 11) {
    pads = node.GetInts("pads");
    value = node.GetFloat("value", 0.0f);
  } else {
    VIGIL_ASSIGN_OR_RETURN(pads, ConstInts(b, 1, "pads"));
    if (node.HasInput(3)) {
      VIGIL_ASSIGN_OR_RETURN(axes, ConstInts(b, 3, "axes"));
    }
  }
  if (axes.empty())
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  if (pads.size() != 2 * axes.size()) return NodeError(node, pads.size(), " pads for ", axes.size(), " axes");
  spec.ndim = static_cast<int>(r);
  for (int64_t d = 0; d < r; ++d) {
    spec.in_shape[d] = x.shape[static_cast<size_t>(d)];
    spec.out_shape[d] = y.shape[static_cast<size_t>(d)];
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, axes[i], r));
    spec.begin[a] = pads[i];
  }
  // The constant's bytes in the element type: the input's own bytes when it has x's dtype, else converted.
  bool have_bytes = false;
  if (b.opset >= 11 && node.HasInput(2)) {
    const Tensor* t = b.Init(2);
    if (t == nullptr) return b.Unsupported("constant_value must be a constant");
    if (t->numel() == 1 && t->dtype() == x.dtype) {
      std::memcpy(&spec.value, t->raw(), DTypeSize(x.dtype));
      have_bytes = true;
    } else if (t->numel() == 1) {
      value = t->ToFloatVector()[0];
    }
  }
  if (!have_bytes) {
    Tensor one(x.dtype, {});
    switch (x.dtype) {
      case DType::kFloat32: *one.data<float>() = value; break;
      case DType::kFloat16: *one.data<uint16_t>() = FloatToHalf(value); break;
      case DType::kInt64: *one.data<int64_t>() = static_cast<int64_t>(value); break;
      case DType::kInt32: *one.data<int32_t>() = static_cast<int32_t>(value); break;
      case DType::kInt8: *one.data<int8_t>() = static_cast<int8_t>(value); break;
      case DType::kUInt8: *one.data<uint8_t>() = static_cast<uint8_t>(value); break;
      default: *one.data<bool>() = value != 0.0f; break;
    }
    std::memcpy(&spec.value, one.raw(), DTypeSize(x.dtype));
  }
  const int bytes = static_cast<int>(DTypeSize(x.dtype));
  return Kernel("cuda", [=](cudaStream_t s) { return Launched(cuda::Pad(y.ptr, x.ptr, bytes, spec, s), "Pad"); });
}

// BatchNormalization at inference (scale, B, mean, var constant): y = x · s + t with s = scale / sqrt(var + ε),
// t = B − mean · s, folded here in double.
StatusOr<std::unique_ptr<CudaKernel>> MakeBatchNorm(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc || x.shape.size() < 2) {
    return b.Unsupported("dtype, layout or rank");
  }
  if (node.outputs.size() > 1) return b.Unsupported("training outputs");
  std::vector<float> p[4];
  for (size_t i = 0; i < 4; ++i) {
    const Tensor* t = b.Init(i + 1);
    if (t == nullptr) return b.Unsupported("scale, B, mean and var must be constants");
    p[i] = t->ToFloatVector();
  }
  const int64_t c = x.shape[1];
  for (const auto& v : p) {
    if (static_cast<int64_t>(v.size()) != c) return NodeError(node, "parameters of ", v.size(), " values for ", c, " channels");
  }
  const double eps = node.GetFloat("epsilon", 1e-5f);
  std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (size_t i = 0; i < scale.size(); ++i) {
    const double s = p[0][i] / std::sqrt(static_cast<double>(p[3][i]) + eps);
    scale[i] = static_cast<float>(s);
    shift[i] = static_cast<float>(p[1][i] - p[2][i] * s);
  }
  VIGIL_ASSIGN_OR_RETURN(void* sd, b.res.Upload(scale.data(), scale.size() * 4, node.name + " scale"));
  VIGIL_ASSIGN_OR_RETURN(void* td, b.res.Upload(shift.data(), shift.size() * 4, node.name + " shift"));
  const int64_t n = NumElements(x.shape), inner = x.nhwc ? 1 : n / (x.shape[0] * c);
  const ElemType et = ElemOf(x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::ChannelAffine(y.ptr, x.ptr, et, static_cast<const float*>(sd), static_cast<const float*>(td), n, c,
                                        inner, s),
                    "BatchNormalization");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeAvgPool(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.shape.size() != 4 || !IsFloat(x.dtype) || !IsFloat(y.dtype)) return b.Unsupported("only 2-D float pooling");
  const std::vector<int64_t> ks = node.GetInts("kernel_shape"), st = node.GetInts("strides", {1, 1});
  const std::vector<int64_t> dl = b.opset >= 19 ? node.GetInts("dilations", {1, 1}) : std::vector<int64_t>{1, 1};
  if (ks.size() != 2) return b.Unsupported("only 2-D pooling");
  cuda::Pool2d p{};
  p.n = x.shape[0], p.c = x.shape[1], p.h = x.shape[2], p.w = x.shape[3], p.oh = y.shape[2], p.ow = y.shape[3];
  p.kh = ks[0], p.kw = ks[1], p.sh = st[0], p.sw = st[1], p.dh = dl[0], p.dw = dl[1];
  const auto [ph, peh] = Pads(node, 0, 2, p.h, p.oh, p.kh, p.sh, p.dh);
  const auto [pw, pew] = Pads(node, 1, 2, p.w, p.ow, p.kw, p.sw, p.dw);
  p.ph = ph, p.pw = pw;
  p.in = StridesOf(x);
  p.out = StridesOf(y);
  const bool include_pad = node.GetInt("count_include_pad", 0) != 0;
  const int64_t eh = peh, ew = pew;
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::AvgPool2d(y.ptr, ElemOf(y.dtype), x.ptr, ElemOf(x.dtype), p, eh, ew, include_pad, s), "AveragePool");
  });
}

// QuantizeLinear / DequantizeLinear: scale and zero point device values (constants or activations), per tensor
// or per axis.
StatusOr<std::unique_ptr<CudaKernel>> MakeQuant(Build& b, bool quantize) {
  const Node& node = b.node;
  if (node.GetInt("block_size", 0) != 0) return b.Unsupported("blocked quantization");
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  VIGIL_ASSIGN_OR_RETURN(Value scale, b.In(1));
  const Value& y = b.Out(0);
  if (x.nhwc || y.nhwc || !IsFloat(scale.dtype)) return b.Unsupported("layout or scale dtype");
  Value zp;
  if (node.HasInput(2)) {
    VIGIL_ASSIGN_OR_RETURN(zp, b.In(2));
  }
  const Value& q = quantize ? y : x;
  if (q.dtype != DType::kUInt8 && q.dtype != DType::kInt8 && !(q.dtype == DType::kInt32 && !quantize)) {
    return b.Unsupported("quantized dtype ", DTypeName(q.dtype));
  }
  if (zp.ptr != nullptr && zp.dtype != q.dtype) return b.Unsupported("zero point dtype");
  const int64_t n = NumElements(x.shape), channels = NumElements(scale.shape);
  int64_t inner = 1;
  if (channels != 1) {
    VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", 1), static_cast<int64_t>(x.shape.size())));
    for (size_t d = static_cast<size_t>(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  }
  const ElemType qt = AnyElemOf(q.dtype), ft = ElemOf(quantize ? x.dtype : y.dtype), st = ElemOf(scale.dtype);
  if (quantize) {
    return Kernel("cuda", [=](cudaStream_t s) {
      return Launched(cuda::Quantize(y.ptr, qt, x.ptr, ft, scale.ptr, st, zp.ptr, n, channels, inner, s), "QuantizeLinear");
    });
  }
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Dequantize(y.ptr, ft, x.ptr, qt, scale.ptr, st, zp.ptr, n, channels, inner, s), "DequantizeLinear");
  });
}

// vigil DynamicFakeQuantize (int8-dynamic models as exported): elementwise given its global range, so in the NHWC
// region too (layout_plan.h).
StatusOr<std::unique_ptr<CudaKernel>> MakeFakeQuantize(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype or layout");
  const bool centered = b.node.GetInt("centered", 0) != 0;
  float* scale = nullptr;
  if (b.node.outputs.size() > 1 && !b.node.outputs[1].empty()) {
    const Value& s = b.Out(1);
    if (s.dtype != DType::kFloat32) return b.Unsupported("scale dtype");
    scale = static_cast<float*>(s.ptr);
  }
  VIGIL_ASSIGN_OR_RETURN(void* scratch, b.res.Alloc(cuda::DynamicFakeQuantizeScratchBytes(), b.node.name + " range"));
  const int64_t n = NumElements(x.shape);
  const ElemType et = ElemOf(x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::DynamicFakeQuantize(y.ptr, x.ptr, et, n, centered, scale, scratch, s), "DynamicFakeQuantize");
  });
}

// Gemm-11/13: y = alpha · A' · B' + beta · C (A' = transA ? Aᵀ : A; C broadcast to [M, N]) on cuBLAS; C is
// first copied into y, then the product accumulated onto it.
StatusOr<std::unique_ptr<CudaKernel>> MakeGemm(Build& b) {
  const Node& node = b.node;
  const Value& y = b.Out(0);
  if (!IsFloat(y.dtype) || y.shape.size() != 2) return b.Unsupported("dtype");
  VIGIL_ASSIGN_OR_RETURN(Value a, b.In(0, y.dtype));
  VIGIL_ASSIGN_OR_RETURN(Value w, b.In(1, y.dtype));
  if (a.dtype != y.dtype || w.dtype != y.dtype || a.shape.size() != 2 || w.shape.size() != 2 || a.nhwc) {
    return b.Unsupported("operands");
  }
  const bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.0f), beta_attr = node.GetFloat("beta", 1.0f);
  const int64_t m = y.shape[0], n = y.shape[1], k = ta ? a.shape[0] : a.shape[1];
  Value c;
  StridedView cv, yv;
  const bool has_c = node.HasInput(2);
  if (has_c) {
    VIGIL_ASSIGN_OR_RETURN(c, b.In(2, y.dtype));
    if (c.dtype != y.dtype) return b.Unsupported("C dtype");
    VIGIL_ASSIGN_OR_RETURN(cv, MakeView(y.shape, BroadcastStrides(c.shape, y.shape)));
    VIGIL_ASSIGN_OR_RETURN(yv, MakeView(y.shape, ContiguousStrides(y.shape)));
  }
  const float beta = has_c ? beta_attr : 0.0f;
  const cudaDataType_t dt = y.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_32F;
  const ElemType et = ElemOf(y.dtype);
  cublasHandle_t handle = b.res.cublas;
  return Kernel("cublas", [=](cudaStream_t s) -> Status {
    if (has_c) VIGIL_RETURN_IF_ERROR(Launched(cuda::StridedCopy(y.ptr, et, yv, c.ptr, et, cv, s), "Gemm C"));
    // Row-major Y[m,n] = A'[m,k]·B'[k,n] is column-major Yᵀ = B'ᵀ·A'ᵀ; a row-major X read column-major is Xᵀ.
    VIGIL_CUBLAS(cublasGemmEx(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, w.ptr, dt,
                              static_cast<int>(tb ? k : n), a.ptr, dt, static_cast<int>(ta ? m : k), &beta, y.ptr, dt,
                              static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  });
}

// The GPU kernel of a node, Unimplemented when there is none (the caller falls back).
StatusOr<std::unique_ptr<CudaKernel>> MakeGpuKernel(Build& b) {
  const Node& n = b.node;
  if (n.domain == kCpuDomain && n.op_type == kToNchwOp) return MakeToNchw(b);
  if ((n.domain.empty() && n.op_type == "Conv") || (n.domain == "vigil" && n.op_type == "FusedConv")) return MakeConv(b);
  if (n.domain == "vigil" && n.op_type == "DynamicFakeQuantize") return MakeFakeQuantize(b);
  if (!n.domain.empty()) return b.Unsupported("domain '", n.domain, "'");
  const std::string& op = n.op_type;
  if (op == "MaxPool") return MakeMaxPool(b);
  if (op == "Identity" || op == "Dropout") return MakeCopy(b);
  if (auto u = UnaryOps().find(op); u != UnaryOps().end()) return MakeUnary(b, u->second);
  if (auto bi = BinaryOps().find(op); bi != BinaryOps().end()) return MakeBinary(b, bi->second);
  if (op == "Concat") return MakeConcatSplit(b, true);
  if (op == "Split") return MakeConcatSplit(b, false);
  if (op == "Transpose") return MakeTranspose(b);
  if (op == "Slice") return MakeSlice(b);
  if (op == "Softmax" || op == "LogSoftmax") return MakeSoftmax(b);
  if (op == "Resize" || op == "Upsample") return MakeResize(b);
  if (op == "MatMul") return MakeMatMul(b);
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") return MakeReshape(b);
  if (op == "Not") return MakeNot(b);
  if (op == "Where") return MakeWhere(b);
  if (op == "Cast") return MakeCast(b);
  if (op == "Expand" || op == "Tile") return MakeExpandTile(b, op == "Tile");
  if (op == "DepthToSpace" || op == "SpaceToDepth") return MakeDepthSpace(b, op == "DepthToSpace");
  if (auto r = ReduceOps().find(op); r != ReduceOps().end()) return MakeReduce(b, r->second);
  if (op == "TopK") return MakeTopK(b);
  if (op == "Gather" || op == "GatherElements") return MakeGather(b, op == "GatherElements");
  if (op == "Pad") return MakePad(b);
  if (op == "BatchNormalization") return MakeBatchNorm(b);
  if (op == "AveragePool") return MakeAvgPool(b);
  if (op == "QuantizeLinear" || op == "DequantizeLinear") return MakeQuant(b, op == "QuantizeLinear");
  if (op == "Gemm") return MakeGemm(b);
  return b.Unsupported("op");
}

// Which convolutions and pools the layout planner may put in the NHWC region.

}  // namespace vigil::infer::cuda_build
