// The CUDA backend's kernels for the detection body: convolutions (cuDNN), pooling, elementwise, concat/split,
// transpose, slices, softmax, resize, MatMul (cuBLAS), reshapes, layout conversions, the host fallback (cuda_build.h).
#include "infer/cuda/cuda_build.h"

namespace vigil::infer::cuda_build {
StatusOr<std::unique_ptr<CudaKernel>> MakeConv(Build& b) {
  const Node& node = b.node;
  const Tensor* w = b.Init(1);
  if (w == nullptr) return b.Unsupported("weights must be an initializer");
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.shape.size() != 4 || w->rank() != 4 || !IsFloat(y.dtype)) return b.Unsupported("only 2-D float convolutions");
  const int64_t group = node.GetInt("group", 1);
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3];
  const int64_t k = w->dim(0), cg = w->dim(1), r = w->dim(2), s = w->dim(3);
  const int64_t oh = y.shape[2], ow = y.shape[3];
  const std::vector<int64_t> strides = node.GetInts("strides", {1, 1}), dil = node.GetInts("dilations", {1, 1});
  const DType dt = y.dtype;
  const bool out_nhwc = y.nhwc;

  auto kernel = std::make_unique<ConvKernel>();
  // Input as cuDNN reads it: y's dtype and layout. A float16 NHWC convolution reading 3 (or any
  // non-multiple-of-8) channels gets them zero-padded to a multiple of 8 so tensor-core engines apply.
  const bool pad = dt == DType::kFloat16 && out_nhwc && group == 1 && c % 8 != 0;
  const int64_t cp = pad ? (c + 7) / 8 * 8 : c;
  const bool convert = pad || x.dtype != dt || x.nhwc != out_nhwc;
  Value xin = x;
  if (convert) {
    xin.dtype = dt;
    xin.nhwc = out_nhwc;
    xin.shape = {n, cp, h, wd};
    VIGIL_ASSIGN_OR_RETURN(xin.ptr, b.res.Alloc(xin.bytes(), node.name + " input"));
    if (!b.res.dry) VIGIL_CUDA(cudaMemset(xin.ptr, 0, xin.bytes()));  // padding channels stay zero
    const cuda::Strides4d ds = StridesOf(xin), ss = StridesOf(x);
    VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView({n, c, h, wd}, {ds.n, ds.c, ds.h, ds.w}));
    VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView({n, c, h, wd}, {ss.n, ss.c, ss.h, ss.w}));
    kernel->convert_ = [=](cudaStream_t st) {
      return Launched(cuda::StridedCopy(xin.ptr, ElemOf(dt), dv, x.ptr, ElemOf(x.dtype), sv, st), "conv input");
    };
  }
  // Weights OIHW → the output's layout (KRSC for NHWC), padded channels zero, in dt.
  const int64_t cgp = pad ? cp : cg;
  std::vector<float> wl(static_cast<size_t>(k * cgp * r * s), 0.0f);
  if (!b.res.dry) {  // a dry run converts no weights (UploadTensor only reserves their room)
    Tensor wf = w->ToFloat32();
    for (int64_t o = 0; o < k; ++o)
      for (int64_t i = 0; i < cg; ++i)
        for (int64_t a = 0; a < r; ++a)
          for (int64_t e = 0; e < s; ++e) {
            const float v = wf.data<float>()[((o * cg + i) * r + a) * s + e];
            const int64_t at = out_nhwc ? ((o * r + a) * s + e) * cgp + i : ((o * cgp + i) * r + a) * s + e;
            wl[static_cast<size_t>(at)] = v;
          }
  }
  VIGIL_ASSIGN_OR_RETURN(void* wdev, b.res.UploadTensor(Tensor::Wrap(DType::kFloat32, {k, cgp, r, s}, wl.data()), dt,
                                                        node.name + " weights"));
  const Tensor* bias = b.Init(2);
  if (node.HasInput(2) && bias == nullptr) return b.Unsupported("bias must be an initializer");
  const std::string act_name = node.GetString("activation", "");
  cuda::ConvActivation act = cuda::ConvActivation::kNone;
  cuda::UnaryOp uact = cuda::UnaryOp::kIdentity;
  if (act_name == "SiLU") act = cuda::ConvActivation::kSiLU, uact = cuda::UnaryOp::kSiLU;
  else if (act_name == "Relu") act = cuda::ConvActivation::kRelu, uact = cuda::UnaryOp::kRelu;
  else if (!act_name.empty()) return b.Unsupported("activation '", act_name, "'");

  cuda::ConvSpec spec;
  const cuda::Strides4d xs = StridesOf(xin), ys = StridesOf(y);
  spec.x_dims = {n, cp, h, wd};
  spec.x_strides = {xs.n, xs.c, xs.h, xs.w};
  spec.w_dims = {k, cgp, r, s};
  spec.w_strides = out_nhwc ? std::array<int64_t, 4>{r * s * cgp, 1, s * cgp, cgp}
                            : std::array<int64_t, 4>{cgp * r * s, r * s, s, 1};
  spec.y_dims = {n, k, oh, ow};
  spec.y_strides = {ys.n, ys.c, ys.h, ys.w};
  for (size_t a = 0; a < 2; ++a) {
    const int64_t in = a == 0 ? h : wd, out = a == 0 ? oh : ow, kk = a == 0 ? r : s;
    auto [pre, post] = Pads(node, a, 2, in, out, kk, strides[a], dil[a]);
    spec.pre_pad[a] = pre;
    spec.post_pad[a] = post;
    spec.stride[a] = strides[a];
    spec.dilation[a] = dil[a];
  }
  spec.data_type = dt == DType::kFloat16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  spec.allow_tensor_core_fp32 = b.res.allow_tf32;
  spec.has_bias = bias != nullptr;
  spec.activation = act;
  spec.workspace_limit = kAutotuneWorkspace;
  spec.max_candidates = b.res.autotune_candidates;

  void* bias_dt = nullptr;
  if (bias) {
    VIGIL_ASSIGN_OR_RETURN(bias_dt, b.res.UploadTensor(*bias, dt, node.name + " bias"));
  }
  spec.fuse_epilogue = bias != nullptr || act != cuda::ConvActivation::kNone;
  if (b.res.dry) return std::unique_ptr<CudaKernel>(std::move(kernel));  // assumed: cuDNN has an engine for it
  auto conv = cuda::CudnnConv::Create(b.res.cudnn, spec, xin.ptr, wdev, bias_dt, y.ptr, b.res.autotune.get(), b.res.stream,
                                   b.res.plan_lookup);
  if (!conv.ok() && spec.fuse_epilogue) {
    spec.fuse_epilogue = false;
    conv = cuda::CudnnConv::Create(b.res.cudnn, spec, xin.ptr, wdev, nullptr, y.ptr, b.res.autotune.get(), b.res.stream,
                                   b.res.plan_lookup);
    if (conv.ok()) {
      void* bias_f = nullptr;
      if (bias) {
        VIGIL_ASSIGN_OR_RETURN(bias_f, b.res.UploadTensor(*bias, DType::kFloat32, node.name + " bias"));
      }
      const int64_t total = NumElements(y.shape), inner = out_nhwc ? 1 : oh * ow;
      kernel->epilogue_ = [=, out = y.ptr](cudaStream_t st) {
        return Launched(cuda::BiasActivation(out, ElemOf(dt), static_cast<const float*>(bias_f), total, k, inner, uact,
                                             0.0f, st),
                        "conv epilogue");
      };
    }
  }
  if (!conv.ok()) return b.Unsupported(conv.status().message());
  kernel->conv_ = *std::move(conv);
  kernel->x_ = xin.ptr;
  kernel->w_ = wdev;
  kernel->bias_ = kernel->epilogue_ ? nullptr : bias_dt;
  kernel->y_ = y.ptr;
  return std::unique_ptr<CudaKernel>(std::move(kernel));
}

StatusOr<std::unique_ptr<CudaKernel>> MakeMaxPool(Build& b) {
  const Node& node = b.node;
  if (node.outputs.size() > 1 && !node.outputs[1].empty()) return b.Unsupported("Indices output");
  if (node.GetInt("storage_order", 0) != 0) return b.Unsupported("storage_order 1");
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.shape.size() != 4 || !IsFloat(x.dtype) || !IsFloat(y.dtype)) return b.Unsupported("only 2-D float pooling");
  const std::vector<int64_t> ks = node.GetInts("kernel_shape"), st = node.GetInts("strides", {1, 1}),
                             dl = node.GetInts("dilations", {1, 1});
  if (ks.size() != 2) return b.Unsupported("only 2-D pooling");
  cuda::Pool2d p{};
  p.n = x.shape[0], p.c = x.shape[1], p.h = x.shape[2], p.w = x.shape[3], p.oh = y.shape[2], p.ow = y.shape[3];
  p.kh = ks[0], p.kw = ks[1], p.sh = st[0], p.sw = st[1], p.dh = dl[0], p.dw = dl[1];
  p.ph = Pads(node, 0, 2, p.h, p.oh, p.kh, p.sh, p.dh).first;
  p.pw = Pads(node, 1, 2, p.w, p.ow, p.kw, p.sw, p.dw).first;
  p.in = StridesOf(x);
  p.out = StridesOf(y);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::MaxPool2d(y.ptr, ElemOf(y.dtype), x.ptr, ElemOf(x.dtype), p, s), "MaxPool");
  });
}

const std::map<std::string, cuda::UnaryOp>& UnaryOps() {
  static const auto* ops = new std::map<std::string, cuda::UnaryOp>{
      {"Sigmoid", cuda::UnaryOp::kSigmoid}, {"Relu", cuda::UnaryOp::kRelu},         {"LeakyRelu", cuda::UnaryOp::kLeakyRelu},
      {"Tanh", cuda::UnaryOp::kTanh},       {"Exp", cuda::UnaryOp::kExp},           {"Log", cuda::UnaryOp::kLog},
      {"Neg", cuda::UnaryOp::kNeg},         {"Abs", cuda::UnaryOp::kAbs},           {"Sqrt", cuda::UnaryOp::kSqrt},
      {"Reciprocal", cuda::UnaryOp::kReciprocal}, {"Floor", cuda::UnaryOp::kFloor}, {"Ceil", cuda::UnaryOp::kCeil},
      {"Erf", cuda::UnaryOp::kErf},         {"HardSigmoid", cuda::UnaryOp::kHardSigmoid},
      {"HardSwish", cuda::UnaryOp::kHardSwish}, {"Softplus", cuda::UnaryOp::kSoftplus}, {"Clip", cuda::UnaryOp::kClip},
      {"Round", cuda::UnaryOp::kRound}};
  return *ops;
}

const std::map<std::string, cuda::BinaryOp>& BinaryOps() {
  static const auto* ops = new std::map<std::string, cuda::BinaryOp>{
      {"Add", cuda::BinaryOp::kAdd}, {"Sub", cuda::BinaryOp::kSub}, {"Mul", cuda::BinaryOp::kMul},
      {"Div", cuda::BinaryOp::kDiv}, {"Pow", cuda::BinaryOp::kPow}, {"Max", cuda::BinaryOp::kMax},
      {"Min", cuda::BinaryOp::kMin}, {"Sum", cuda::BinaryOp::kAdd}, {"Mean", cuda::BinaryOp::kAdd},
      {"Mod", cuda::BinaryOp::kMod}, {"Equal", cuda::BinaryOp::kEqual}, {"Greater", cuda::BinaryOp::kGreater},
      {"GreaterOrEqual", cuda::BinaryOp::kGreaterOrEqual}, {"Less", cuda::BinaryOp::kLess},
      {"LessOrEqual", cuda::BinaryOp::kLessOrEqual}, {"And", cuda::BinaryOp::kAnd}, {"Or", cuda::BinaryOp::kOr}};
  return *ops;
}

const std::map<std::string, cuda::ReduceOp>& ReduceOps() {
  static const auto* ops = new std::map<std::string, cuda::ReduceOp>{
      {"ReduceSum", cuda::ReduceOp::kSum},       {"ReduceMean", cuda::ReduceOp::kMean},
      {"ReduceMax", cuda::ReduceOp::kMax},       {"ReduceMin", cuda::ReduceOp::kMin},
      {"ReduceProd", cuda::ReduceOp::kProd},     {"ReduceL2", cuda::ReduceOp::kL2},
      {"ArgMax", cuda::ReduceOp::kArgMax},       {"ArgMin", cuda::ReduceOp::kArgMin},
      {"GlobalAveragePool", cuda::ReduceOp::kMean}, {"GlobalMaxPool", cuda::ReduceOp::kMax}};
  return *ops;
}

StatusOr<std::unique_ptr<CudaKernel>> MakeUnary(Build& b, cuda::UnaryOp op) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype ", DTypeName(x.dtype));
  float alpha = 0.0f, beta = 0.0f;
  if (node.op_type == "LeakyRelu") alpha = node.GetFloat("alpha", 0.01f);
  if (node.op_type == "HardSigmoid") alpha = node.GetFloat("alpha", 0.2f), beta = node.GetFloat("beta", 0.5f);
  if (node.op_type == "Clip") {
    alpha = -3.402823466e38f, beta = 3.402823466e38f;
    if (b.opset < 11) {
      alpha = node.GetFloat("min", alpha), beta = node.GetFloat("max", beta);
    } else {
      for (size_t i = 1; i < 3; ++i) {
        if (!node.HasInput(i)) continue;
        const Tensor* t = b.Init(i);
        if (t == nullptr || t->numel() != 1) return b.Unsupported("min/max must be initializers");
        (i == 1 ? alpha : beta) = t->ToFloatVector()[0];
      }
    }
  }
  const int64_t n = NumElements(y.shape);
  if (op == cuda::UnaryOp::kIdentity) {
    return Kernel("copy", [=](cudaStream_t s) {
      return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, x.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "Identity");
    });
  }
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Unary(op, alpha, beta, y.ptr, x.ptr, ElemOf(y.dtype), n, s), "unary");
  });
}

// The operands' storage type of an element-wise node: that of its first activation input (initializers
// are uploaded in it), else of input 0.
StatusOr<DType> OperandDType(Build& b) {
  for (size_t i = 0; i < b.node.inputs.size(); ++i) {
    if (b.node.HasInput(i) && !b.IsInit(i)) {
      VIGIL_ASSIGN_OR_RETURN(Value v, b.In(i));
      return v.dtype;
    }
  }
  return b.g.types.at(b.node.inputs[0]).dtype;
}

// Operand i of an element-wise node with output y, read in `dtype`, and its view over y's shape: the
// broadcast strides (NCHW), or same-shape NHWC / one element (NHWC; layout_plan.h kAgnostic).
StatusOr<std::pair<Value, StridedView>> Operand(Build& b, size_t i, const Value& y, DType dtype) {
  VIGIL_ASSIGN_OR_RETURN(Value v, b.In(i, dtype));
  if (v.dtype != dtype) return b.Unsupported("mixed dtypes");
  const bool one = NumElements(v.shape) == 1;
  StridedView view;
  if (y.nhwc) {
    if (!one && (!v.nhwc || v.shape != y.shape)) return b.Unsupported("operand layout");
    VIGIL_ASSIGN_OR_RETURN(view, MakeView({NumElements(y.shape)}, {one ? 0 : 1}));
  } else {
    if (v.nhwc) return b.Unsupported("operand layout");
    VIGIL_ASSIGN_OR_RETURN(view, MakeView(y.shape, BroadcastStrides(v.shape, y.shape)));
  }
  return std::make_pair(v, view);
}

// Binary ops, and the variadic Sum / Mean / Max / Min folded left to right into the output (Mean then
// divides by the count), as the host reference does.
StatusOr<std::unique_ptr<CudaKernel>> MakeBinary(Build& b, cuda::BinaryOp op) {
  const Node& node = b.node;
  const std::string& name = node.op_type;
  const bool variadic = name == "Sum" || name == "Mean" || name == "Max" || name == "Min";
  if (!variadic && node.NumInputs() != 2) return b.Unsupported(node.NumInputs(), " inputs");
  if (node.NumInputs() < 1) return b.Unsupported("no inputs");
  const Value& y = b.Out(0);
  VIGIL_ASSIGN_OR_RETURN(const DType dtype, OperandDType(b));
  ElemType et;
  if (!ElemOfAny(dtype, &et)) return b.Unsupported("dtype ", DTypeName(dtype));
  if (op == cuda::BinaryOp::kPow && !IsFloat(dtype)) return b.Unsupported("integer Pow");
  if (name == "Mod" && node.GetInt("fmod", 0) == 1) op = cuda::BinaryOp::kFMod;
  if (name == "Mean" && !IsFloat(dtype)) return b.Unsupported("integer Mean");
  if (cuda::BinaryWritesBool(op) ? y.dtype != DType::kBool : y.dtype != dtype) return b.Unsupported("output dtype");
  struct Arg {
    Value v;
    StridedView view;
  };
  std::vector<Arg> args;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.HasInput(i)) return b.Unsupported("omitted input");
    VIGIL_ASSIGN_OR_RETURN(auto a, Operand(b, i, y, dtype));
    args.push_back({a.first, a.second});
  }
  // y read back in place by the later steps: a view of the operands' rank (NHWC operands are flat).
  const Shape y_shape = y.nhwc ? Shape{NumElements(y.shape)} : y.shape;
  VIGIL_ASSIGN_OR_RETURN(StridedView yv, MakeView(y_shape, ContiguousStrides(y_shape)));
  VIGIL_ASSIGN_OR_RETURN(StridedView one, MakeView(y_shape, std::vector<int64_t>(y_shape.size(), 0)));
  void* mean_count = nullptr;
  if (name == "Mean") {
    const float count = static_cast<float>(args.size());
    const uint16_t half = FloatToHalf(count);
    VIGIL_ASSIGN_OR_RETURN(mean_count, b.res.Upload(dtype == DType::kFloat16 ? static_cast<const void*>(&half)
                                                                               : static_cast<const void*>(&count),
                                                    DTypeSize(dtype), node.name + " count"));
  }
  return Kernel("cuda", [=](cudaStream_t s) -> Status {
    if (args.size() == 1) {
      return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, args[0].v.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "variadic copy");
    }
    VIGIL_RETURN_IF_ERROR(Launched(cuda::Binary(op, y.ptr, args[0].v.ptr, args[0].view, args[1].v.ptr, args[1].view, et, s),
                                   "binary"));
    // y is contiguous, so each later step reads it back in place.
    for (size_t i = 2; i < args.size(); ++i) {
      VIGIL_RETURN_IF_ERROR(Launched(cuda::Binary(op, y.ptr, y.ptr, yv, args[i].v.ptr, args[i].view, et, s), "variadic"));
    }
    if (mean_count != nullptr) {
      VIGIL_RETURN_IF_ERROR(Launched(cuda::Binary(cuda::BinaryOp::kDiv, y.ptr, y.ptr, yv, mean_count, one, et, s), "Mean"));
    }
    return absl::OkStatus();
  });
}

// Concat (one output, many inputs) or Split (one input, many outputs): copies of [outer, len, inner]
// pieces along the physical axis.
StatusOr<std::unique_ptr<CudaKernel>> MakeConcatSplit(Build& b, bool concat) {
  const Node& node = b.node;
  Value whole;
  if (concat) {
    whole = b.Out(0);
  } else {
    VIGIL_ASSIGN_OR_RETURN(whole, b.In(0));
  }
  if (!Storable(whole.dtype)) return b.Unsupported("dtype ", DTypeName(whole.dtype));
  const int64_t rank = static_cast<int64_t>(whole.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", concat ? -1 : 0), rank));
  const Shape phys = PhysicalShape(whole);
  const int64_t pa = PhysicalAxis(whole, axis);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < pa; ++d) outer *= phys[d];
  for (int64_t d = pa + 1; d < rank; ++d) inner *= phys[d];
  const int64_t total = phys[pa];
  struct Piece {
    void* ptr;
    int64_t offset, len;
    DType dtype;
  };
  std::vector<Piece> pieces;
  int64_t offset = 0;
  const size_t count = concat ? node.inputs.size() : node.outputs.size();
  for (size_t i = 0; i < count; ++i) {
    Value v;
    if (concat) {
      if (node.inputs[i].empty()) continue;
      VIGIL_ASSIGN_OR_RETURN(v, b.In(i, whole.dtype));
    } else {
      if (node.outputs[i].empty()) return b.Unsupported("omitted Split output");
      v = b.Out(i);
    }
    if (v.dtype != whole.dtype || v.nhwc != whole.nhwc) return b.Unsupported("piece dtype or layout");
    const int64_t len = v.shape[static_cast<size_t>(axis)];
    pieces.push_back({v.ptr, offset, len, v.dtype});
    offset += len;
  }
  if (offset != total) return NodeError(node, "pieces cover ", offset, " of ", total, " along axis ", axis);
  std::vector<std::pair<StridedView, StridedView>> views;  // (whole-side, piece-side)
  for (const Piece& p : pieces) {
    VIGIL_ASSIGN_OR_RETURN(StridedView wv, MakeView({outer, p.len, inner}, {total * inner, inner, 1}));
    VIGIL_ASSIGN_OR_RETURN(StridedView pv, MakeView({outer, p.len, inner}, {p.len * inner, inner, 1}));
    views.emplace_back(wv, pv);
  }
  const ElemType et = AnyElemOf(whole.dtype);
  return Kernel("cuda", [=](cudaStream_t s) -> Status {
    for (size_t i = 0; i < pieces.size(); ++i) {
      void* at = Offset(whole.ptr, pieces[i].offset * inner, whole.dtype);
      cudaError_t e = concat ? cuda::StridedCopy(at, et, views[i].first, pieces[i].ptr, et, views[i].second, s)
                             : cuda::StridedCopy(pieces[i].ptr, et, views[i].second, at, et, views[i].first, s);
      VIGIL_RETURN_IF_ERROR(Launched(e, concat ? "Concat" : "Split"));
    }
    return absl::OkStatus();
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeTranspose(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!Storable(x.dtype) || x.dtype != y.dtype || x.nhwc) return b.Unsupported("dtype or layout");
  const size_t r = x.shape.size();
  std::vector<int64_t> perm = b.node.GetInts("perm");
  if (perm.empty())
    for (size_t d = 0; d < r; ++d) perm.push_back(static_cast<int64_t>(r - 1 - d));
  const std::vector<int64_t> xs = ContiguousStrides(x.shape);
  std::vector<int64_t> src(r);
  for (size_t d = 0; d < r; ++d) src[d] = xs[static_cast<size_t>(perm[d])];
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(y.shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(y.shape, ContiguousStrides(y.shape)));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, AnyElemOf(y.dtype), dv, x.ptr, AnyElemOf(x.dtype), sv, s), "Transpose");
  });
}

// Element strides of each logical axis of a value: row-major for NCHW / any rank, channels innermost for NHWC.
std::vector<int64_t> LogicalStrides(const Value& v) {
  if (!v.nhwc) return ContiguousStrides(v.shape);
  const cuda::Strides4d s = StridesOf(v);
  return {s.n, s.c, s.h, s.w};
}

// An integer initializer input as int64 values, Unsupported when it is not an initializer.
StatusOr<std::vector<int64_t>> ConstInts(Build& b, size_t i, std::string_view what) {
  const Tensor* t = b.Init(i);
  if (t == nullptr) return b.Unsupported(what, " must be a constant (an initializer)");
  return t->ToInt64Vector();
}

// Slice-10+ (starts, ends, axes, steps as constant inputs) and Slice-1 (attributes), ONNX clamping rules: a
// strided copy (the output's extent is its inferred shape). In the NHWC region too (a channel Slice, as
// exporters write C2f's chunk: layout_plan.h), reading and writing through the layout's strides.
StatusOr<std::unique_ptr<CudaKernel>> MakeSlice(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!Storable(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> starts, axes, steps;
  if (b.opset < 10) {
    starts = node.GetInts("starts");
    axes = node.GetInts("axes");
  } else {
    VIGIL_ASSIGN_OR_RETURN(starts, ConstInts(b, 1, "starts"));
    if (node.HasInput(3)) {
      VIGIL_ASSIGN_OR_RETURN(axes, ConstInts(b, 3, "axes"));
    }
    if (node.HasInput(4)) {
      VIGIL_ASSIGN_OR_RETURN(steps, ConstInts(b, 4, "steps"));
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  const std::vector<int64_t> xs = LogicalStrides(x);
  std::vector<int64_t> src = xs;
  int64_t base = 0;
  for (size_t i = 0; i < axes.size() && i < starts.size(); ++i) {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, axes[i], r));
    const int64_t dim = x.shape[static_cast<size_t>(a)];
    const int64_t step = i < steps.size() ? steps[i] : 1;
    if (step == 0) return NodeError(node, "step 0 on axis ", a);
    int64_t start = starts[i] < 0 ? starts[i] + dim : starts[i];
    start = step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, 0, dim - 1);
    if (y.shape[static_cast<size_t>(a)] == 0) start = 0;
    base += start * xs[static_cast<size_t>(a)];
    src[static_cast<size_t>(a)] = xs[static_cast<size_t>(a)] * step;
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(y.shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(y.shape, LogicalStrides(y)));
  const void* from = Offset(x.ptr, base, x.dtype);
  const ElemType et = AnyElemOf(x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, et, dv, from, et, sv, s), "Slice");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeSoftmax(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.nhwc || x.dtype != y.dtype) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(b.node, b.node.GetInt("axis", b.opset >= 13 ? -1 : 1), r));
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t d = 0; d < r; ++d) {
    const int64_t v = x.shape[static_cast<size_t>(d)];
    if (d < axis) outer *= v;
    else if (d == axis || b.opset < 13) len *= v;  // Softmax-1/11: the 2-D coercion [outer, rest]
    else inner *= v;
  }
  const bool log = b.node.op_type == "LogSoftmax";
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Softmax(y.ptr, x.ptr, ElemOf(y.dtype), outer, len, inner, log, s), "Softmax");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeResize(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.shape.size() != 4 || x.dtype != y.dtype || x.nhwc != y.nhwc ||
      b.node.GetString("mode", "nearest") != "nearest" || x.shape[0] != y.shape[0] || x.shape[1] != y.shape[1]) {
    return b.Unsupported("only nearest resize of H and W");
  }
  for (size_t i = 1; i < b.node.inputs.size(); ++i) {
    if (b.node.HasInput(i) && !b.IsInit(i)) return b.Unsupported("scales/sizes must be initializers");
  }
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> source, NearestResizeSources(b.node, b.g, b.opset));
  std::vector<int32_t> s32(source.begin(), source.end());
  VIGIL_ASSIGN_OR_RETURN(void* map, b.res.Upload(s32.data(), s32.size() * 4, b.node.name + " map"));
  const cuda::Strides4d is = StridesOf(x), os = StridesOf(y);
  const int64_t pixels = y.shape[2] * y.shape[3];
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::ResizeNearest(y.ptr, x.ptr, ElemOf(y.dtype), y.shape[0], y.shape[1], x.shape[3], y.shape[3],
                                        pixels, static_cast<const int32_t*>(map), is, os, s),
                    "Resize");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeMatMul(Build& b) {
  const Value& y = b.Out(0);
  if (!IsFloat(y.dtype)) return b.Unsupported("dtype");
  VIGIL_ASSIGN_OR_RETURN(Value a, b.In(0, y.dtype));
  VIGIL_ASSIGN_OR_RETURN(Value c, b.In(1, y.dtype));
  if (a.dtype != y.dtype || c.dtype != y.dtype || a.shape.size() < 2 || c.shape.size() < 2 || a.nhwc || c.nhwc) {
    return b.Unsupported("only float operands of rank >= 2");
  }
  const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), n = c.shape.back();
  const int64_t batch = NumElements(y.shape) / (m * n);
  // Each operand's batch dims must equal the output's, or all be 1 (stride 0).
  auto batch_stride = [&](const Value& v, int64_t matrix) -> int64_t {
    const int64_t count = NumElements(v.shape) / matrix;
    return count == batch ? matrix : count == 1 ? 0 : -1;
  };
  const int64_t sa = batch_stride(a, m * k), sc = batch_stride(c, k * n);
  Shape ab(a.shape.begin(), a.shape.end() - 2), cb(c.shape.begin(), c.shape.end() - 2),
      yb(y.shape.begin(), y.shape.end() - 2);
  auto aligned = [&](const Shape& s) { return NumElements(s) == 1 || s == Shape(yb.end() - s.size(), yb.end()); };
  if (sa < 0 || sc < 0 || !aligned(ab) || !aligned(cb)) return b.Unsupported("batch broadcasting");
  const cudaDataType_t dt = y.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_32F;
  cublasHandle_t handle = b.res.cublas;
  return Kernel("cublas", [=](cudaStream_t) -> Status {
    const float one = 1.0f, zero = 0.0f;
    // Row-major C[m,n] = A[m,k]·B[k,n] is column-major C^T = B^T·A^T.
    VIGIL_CUBLAS(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                            static_cast<int>(k), &one, c.ptr, dt, static_cast<int>(n), sc, a.ptr, dt,
                                            static_cast<int>(k), sa, &zero, y.ptr, dt, static_cast<int>(n), m * n,
                                            static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  });
}

// Reshape, Flatten, Squeeze, Unsqueeze: the bytes are unchanged.
StatusOr<std::unique_ptr<CudaKernel>> MakeReshape(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.nhwc || x.dtype != y.dtype) return b.Unsupported("layout");
  return Kernel("copy", [=](cudaStream_t s) {
    return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, x.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "reshape copy");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeToNchw(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  const Shape& s = x.shape;
  const cuda::Strides4d xs = StridesOf(x), ys = StridesOf(y);
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(s, {xs.n, xs.c, xs.h, xs.w}));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(s, {ys.n, ys.c, ys.h, ys.w}));
  return Kernel("cuda", [=](cudaStream_t st) {
    return Launched(cuda::StridedCopy(y.ptr, ElemOf(y.dtype), dv, x.ptr, ElemOf(x.dtype), sv, st), "ToNchw");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeHost(Build& b) {
  const Node& node = b.node;
  const OpSchema* schema = FindOp(node.domain, node.op_type);
  auto kernel = std::make_unique<HostKernel>(node, b.opset, schema->run);
  auto pinned = [&](const Value& v) -> StatusOr<Tensor> {
    VIGIL_ASSIGN_OR_RETURN(PinnedBuffer p, PinnedBuffer::Allocate(std::max<size_t>(v.bytes(), 1), node.name));
    Tensor t = Tensor::Wrap(v.dtype, v.shape, p.get());
    b.res.pinned.push_back(std::move(p));
    return t;
  };
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.HasInput(i)) {
      kernel->inputs_.emplace_back();
    } else if (const Tensor* init = b.Init(i)) {
      kernel->inputs_.push_back(*init);
    } else {
      VIGIL_ASSIGN_OR_RETURN(Value v, b.In(i));
      if (v.nhwc) return NodeError(node, "host kernel cannot read NHWC input ", i);
      VIGIL_ASSIGN_OR_RETURN(Tensor t, pinned(v));
      kernel->in_copies_.push_back({t.raw(), v.ptr, v.bytes()});
      kernel->inputs_.push_back(t);
    }
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.outputs[i].empty()) {
      kernel->outputs_.emplace_back();
      continue;
    }
    const Value& v = b.Out(i);
    VIGIL_ASSIGN_OR_RETURN(Tensor t, pinned(v));
    kernel->out_copies_.push_back({t.raw(), v.ptr, v.bytes()});
    kernel->outputs_.push_back(t);
  }
  return std::unique_ptr<CudaKernel>(std::move(kernel));
}

}  // namespace vigil::infer::cuda_build
