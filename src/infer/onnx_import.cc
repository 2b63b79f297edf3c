// onnx_import.cc — ModelProto → Graph (onnx_import.h). Field meanings follow onnx/onnx.proto
// (IR spec: https://onnx.ai/onnx/repo-docs/IR.html); typed-field storage per TensorProto's comments.
#include "infer/onnx_import.h"

#include <onnx/onnx_pb.h>  // defines ONNX_API, then includes onnx/onnx-ml.pb.h (ONNX_ML=1)

#include <google/protobuf/io/coded_stream.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>


namespace vigil::infer {
namespace {

constexpr int64_t kMinOpset = 7;
constexpr int64_t kMaxOpset = 21;

DType FromOnnxType(int32_t t) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return DType::kFloat32;
    case onnx::TensorProto::FLOAT16: return DType::kFloat16;
    case onnx::TensorProto::DOUBLE: return DType::kFloat64;
    case onnx::TensorProto::INT8: return DType::kInt8;
    case onnx::TensorProto::UINT8: return DType::kUInt8;
    case onnx::TensorProto::INT16: return DType::kInt16;
    case onnx::TensorProto::INT32: return DType::kInt32;
    case onnx::TensorProto::INT64: return DType::kInt64;
    case onnx::TensorProto::BOOL: return DType::kBool;
    default: return DType::kUndefined;
  }
}

std::string OnnxTypeName(int32_t t) {
  return onnx::TensorProto::DataType_IsValid(t)
             ? onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t))
             : StrCat("type ", t);
}

// "float32[1,3,640,640]".
std::string TypeString(DType dtype, const Shape& shape) { return std::string(DTypeName(dtype)) + ShapeToString(shape); }

template <typename T, typename Field>
void CopyTyped(const Field& field, Tensor& t) {
  T* out = t.data<T>();
  for (int i = 0; i < field.size(); ++i) out[i] = static_cast<T>(field.Get(i));
}

StatusOr<Tensor> ConvertTensor(const onnx::TensorProto& tp) {
  const std::string what = StrCat("tensor '", tp.name(), "'");
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    return absl::UnimplementedError(StrCat(what, " keeps its data in an external file (not supported)"));
  }
  if (tp.has_segment()) {
    return absl::UnimplementedError(StrCat(what, " is segmented (not supported)"));
  }
  const DType dtype = FromOnnxType(tp.data_type());
  if (dtype == DType::kUndefined) {
    return absl::UnimplementedError(
        StrCat(what, " has element type ", OnnxTypeName(tp.data_type()), " (not supported)"));
  }
  Shape shape;
  int64_t numel = 1;
  for (int64_t d : tp.dims()) {
    if (d < 0 || (d > 0 && numel > (int64_t{1} << 40) / d)) {
      return absl::InvalidArgumentError(StrCat(what, " has an invalid dimension ", d));
    }
    numel *= d;
    shape.push_back(d);
  }
  if (tp.has_raw_data()) {
    const size_t expected = static_cast<size_t>(numel) * DTypeSize(dtype);
    if (tp.raw_data().size() != expected) {
      return absl::InvalidArgumentError(StrCat(what, ": raw_data holds ", tp.raw_data().size(),
                                                     " bytes but ", TypeString(dtype, shape),
                                                     " needs ", expected));
    }
    Tensor t(dtype, shape);
    if (expected) std::memcpy(t.raw(), tp.raw_data().data(), expected);  // ONNX raw_data is little-endian, as is the host
    return t;
  }
  int count = 0;
  switch (dtype) {
    case DType::kFloat32: count = tp.float_data_size(); break;
    case DType::kFloat64: count = tp.double_data_size(); break;
    case DType::kInt64: count = tp.int64_data_size(); break;
    default: count = tp.int32_data_size(); break;  // int8/16/32, uint8, bool and float16 bit patterns
  }
  if (count != numel) {
    return absl::InvalidArgumentError(StrCat(what, ": ", count, " typed values but ", TypeString(dtype, shape),
                                                   " needs ", numel));
  }
  Tensor t(dtype, shape);
  switch (dtype) {
    case DType::kFloat32: CopyTyped<float>(tp.float_data(), t); break;
    case DType::kFloat64: CopyTyped<double>(tp.double_data(), t); break;
    case DType::kInt64: CopyTyped<int64_t>(tp.int64_data(), t); break;
    case DType::kInt32: CopyTyped<int32_t>(tp.int32_data(), t); break;
    case DType::kInt16: CopyTyped<int16_t>(tp.int32_data(), t); break;
    case DType::kInt8: CopyTyped<int8_t>(tp.int32_data(), t); break;
    case DType::kUInt8: CopyTyped<uint8_t>(tp.int32_data(), t); break;
    case DType::kFloat16: CopyTyped<uint16_t>(tp.int32_data(), t); break;
    case DType::kBool: {
      uint8_t* out = t.data<uint8_t>();
      for (int i = 0; i < count; ++i) out[i] = tp.int32_data(i) != 0;
      break;
    }
    case DType::kUndefined: break;
  }
  return t;
}

StatusOr<AttrValue> ConvertAttr(const onnx::AttributeProto& a) {
  switch (a.type()) {
    case onnx::AttributeProto::FLOAT: return AttrValue(a.f());
    case onnx::AttributeProto::INT: return AttrValue(static_cast<int64_t>(a.i()));
    case onnx::AttributeProto::STRING: return AttrValue(a.s());
    case onnx::AttributeProto::TENSOR: {
      VIGIL_ASSIGN_OR_RETURN(Tensor t, ConvertTensor(a.t()));
      return AttrValue(std::move(t));
    }
    case onnx::AttributeProto::FLOATS: return AttrValue(std::vector<float>(a.floats().begin(), a.floats().end()));
    case onnx::AttributeProto::INTS: return AttrValue(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
    case onnx::AttributeProto::STRINGS:
      return AttrValue(std::vector<std::string>(a.strings().begin(), a.strings().end()));
    default:
      return absl::UnimplementedError(StrCat(
          "attribute '", a.name(), "' of type ", onnx::AttributeProto::AttributeType_Name(a.type()),
          " is not supported (graph-valued, sparse and type attributes are not)"));
  }
}

// The tensor a Constant node (ONNX Constant, opsets 1..21) defines.
StatusOr<Tensor> ConstantValue(const Node& node) {
  if (node.attrs.size() != 1) {
    return absl::InvalidArgumentError(StrCat(node.Describe(), ": needs exactly one value attribute"));
  }
  const auto& [key, value] = *node.attrs.begin();
  if (key == "value" && std::holds_alternative<Tensor>(value)) return std::get<Tensor>(value);
  if (key == "value_float" && std::holds_alternative<float>(value)) return Tensor::Scalar(std::get<float>(value));
  if (key == "value_int" && std::holds_alternative<int64_t>(value)) return Tensor::Scalar(std::get<int64_t>(value));
  if (key == "value_floats" && std::holds_alternative<std::vector<float>>(value)) {
    const auto& v = std::get<std::vector<float>>(value);
    return Tensor::FromVector(v, {static_cast<int64_t>(v.size())});
  }
  if (key == "value_ints" && std::holds_alternative<std::vector<int64_t>>(value)) {
    const auto& v = std::get<std::vector<int64_t>>(value);
    return Tensor::FromVector(v, {static_cast<int64_t>(v.size())});
  }
  return absl::UnimplementedError(StrCat(node.Describe(), ": constant attribute '", key, "' is not supported"));
}

StatusOr<ValueInfo> ConvertValueInfo(const onnx::ValueInfoProto& v, const std::string& role) {
  ValueInfo info;
  info.name = v.name();
  if (!v.has_type()) return info;
  if (v.type().value_case() != onnx::TypeProto::kTensorType) {
    return absl::UnimplementedError(
        StrCat(role, " '", v.name(), "' is not a tensor (sequence, map and optional types are not supported)"));
  }
  const onnx::TypeProto::Tensor& tt = v.type().tensor_type();
  info.dtype = FromOnnxType(tt.elem_type());
  if (tt.elem_type() != onnx::TensorProto::UNDEFINED && info.dtype == DType::kUndefined) {
    return absl::UnimplementedError(
        StrCat(role, " '", v.name(), "' has element type ", OnnxTypeName(tt.elem_type()), " (not supported)"));
  }
  info.has_shape = tt.has_shape();
  for (const auto& d : tt.shape().dim()) {
    Dim dim;
    if (d.has_dim_value() && d.dim_value() >= 0) {
      dim.value = d.dim_value();
    } else if (d.has_dim_param()) {
      dim.symbol = d.dim_param();
    }
    info.dims.push_back(std::move(dim));
  }
  return info;
}

StatusOr<Graph> ConvertModel(const onnx::ModelProto& model) {
  Graph graph;
  graph.ir_version = model.ir_version();
  graph.producer_name = model.producer_name();
  graph.producer_version = model.producer_version();
  for (const auto& p : model.metadata_props()) graph.metadata[p.key()] = p.value();
  for (const auto& o : model.opset_import()) {
    graph.opset_imports[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  }
  graph.opset = graph.opset_imports.count("") ? graph.opset_imports[""] : 0;
  if (graph.opset < kMinOpset || graph.opset > kMaxOpset) {
    return absl::UnimplementedError(StrCat("ai.onnx opset ", graph.opset, " is not supported (vigil reads ",
                                                 kMinOpset, "..", kMaxOpset, ")"));
  }

  const onnx::GraphProto& gp = model.graph();
  if (gp.sparse_initializer_size() > 0) {
    return absl::UnimplementedError(StrCat("sparse initializer '", gp.sparse_initializer(0).values().name(),
                                                 "' is not supported"));
  }
  for (const onnx::TensorProto& tp : gp.initializer()) {
    VIGIL_ASSIGN_OR_RETURN(Tensor t, ConvertTensor(tp));
    if (!graph.initializers.emplace(tp.name(), std::move(t)).second) {
      return absl::InvalidArgumentError(StrCat("initializer '", tp.name(), "' is defined twice"));
    }
  }
  for (int i = 0; i < gp.node_size(); ++i) {
    const onnx::NodeProto& np = gp.node(i);
    Node node;
    node.op_type = np.op_type();
    node.name = np.name().empty() ? StrCat(np.op_type(), "_", i) : np.name();
    node.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    node.inputs.assign(np.input().begin(), np.input().end());
    node.outputs.assign(np.output().begin(), np.output().end());
    for (const onnx::AttributeProto& a : np.attribute()) {
      StatusOr<AttrValue> v = ConvertAttr(a);
      if (!v.ok()) return Annotate(v.status(), node.Describe());
      node.attrs[a.name()] = *std::move(v);
    }
    ++graph.file_op_counts[node.domain.empty() ? node.op_type : node.domain + "." + node.op_type];
    if (node.op_type == "Constant" && node.domain.empty()) {
      VIGIL_ASSIGN_OR_RETURN(Tensor t, ConstantValue(node));
      if (node.outputs.size() != 1 || node.outputs[0].empty()) {
        return absl::InvalidArgumentError(StrCat(node.Describe(), ": needs exactly one output"));
      }
      if (!graph.initializers.emplace(node.outputs[0], std::move(t)).second) {
        return absl::InvalidArgumentError(
            StrCat(node.Describe(), ": output '", node.outputs[0], "' is already an initializer"));
      }
      continue;
    }
    graph.nodes.push_back(std::move(node));
  }
  for (const onnx::ValueInfoProto& v : gp.input()) {
    if (graph.IsInitializer(v.name())) continue;  // IR < 4 lists initializers as inputs too
    VIGIL_ASSIGN_OR_RETURN(ValueInfo info, ConvertValueInfo(v, "graph input"));
    graph.inputs.push_back(std::move(info));
  }
  for (const onnx::ValueInfoProto& v : gp.output()) {
    VIGIL_ASSIGN_OR_RETURN(ValueInfo info, ConvertValueInfo(v, "graph output"));
    graph.outputs.push_back(std::move(info));
  }
  VIGIL_RETURN_IF_ERROR(TopologicalSort(graph));
  VIGIL_RETURN_IF_ERROR(ValidateGraph(graph));
  return graph;
}

}  // namespace

namespace {

// Moves initializers stored in external files (ONNX external data: keys location, offset, length,
// paths relative to the model's folder) into raw_data. Locations that are absolute or leave the
// folder are rejected, as ONNX's own loader does.
Status LoadExternalData(onnx::ModelProto& model, const std::filesystem::path& dir) {
  for (onnx::TensorProto& tp : *model.mutable_graph()->mutable_initializer()) {
    if (tp.data_location() != onnx::TensorProto::EXTERNAL) continue;
    const std::string what = StrCat("tensor '", tp.name(), "'");
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : tp.external_data()) {
      if (kv.key() == "location") location = kv.value();
      if ((kv.key() == "offset" && !absl::SimpleAtoi(kv.value(), &offset)) ||
          (kv.key() == "length" && !absl::SimpleAtoi(kv.value(), &length))) {
        return absl::InvalidArgumentError(StrCat(what, ": external data ", kv.key(), " '", kv.value(), "' is not a number"));
      }
    }
    const std::filesystem::path rel(location);
    if (location.empty() || rel.is_absolute() || rel.lexically_normal().string().rfind("..", 0) == 0) {
      return absl::InvalidArgumentError(StrCat(what, ": external data location '", location,
                                               "' must be a path inside the model's folder"));
    }
    std::ifstream file(dir / rel, std::ios::binary);
    if (!file) return absl::NotFoundError(StrCat(what, ": cannot open external data file '", (dir / rel).string(), "'"));
    file.seekg(0, std::ios::end);
    const int64_t size = file.tellg();
    if (length < 0) length = size - offset;
    if (offset < 0 || length < 0 || offset + length > size) {
      return absl::InvalidArgumentError(StrCat(what, ": external data [", offset, ", +", length, ") exceeds '",
                                               location, "' (", size, " bytes)"));
    }
    std::string bytes(static_cast<size_t>(length), '\0');
    file.seekg(offset);
    file.read(bytes.data(), length);
    if (!file) return absl::DataLossError(StrCat(what, ": short read from '", location, "'"));
    tp.set_raw_data(std::move(bytes));
    tp.clear_external_data();
    tp.set_data_location(onnx::TensorProto::DEFAULT);
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<Graph> ImportOnnxBytes(std::string_view bytes, std::string_view source_name,
                                 const std::string& external_dir) {
  const std::string quoted = StrCat("'", std::string(source_name), "'");
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(StrCat(quoted, " is not a valid ONNX model: ", why));
  };
  if (bytes.size() > static_cast<size_t>(INT_MAX)) return invalid("larger than 2 GiB, the protobuf limit");
  onnx::ModelProto model;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                             static_cast<int>(bytes.size()));
  in.SetTotalBytesLimit(INT_MAX);
  if (!model.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    return invalid("the protobuf does not parse (truncated or not ONNX)");
  }
  // Protobuf accepts many byte strings that are not models at all (any run of valid tags), so the
  // fields every real export has are required too.
  if (model.ir_version() < 3) return invalid(StrCat("ir_version ", model.ir_version(), " (IR 3 or later is needed)"));
  if (model.opset_import_size() == 0) return invalid("no opset_import");
  if (!model.has_graph()) return invalid("no graph");
  if (model.graph().node_size() == 0) return invalid("the graph has no nodes");
  if (!external_dir.empty()) VIGIL_RETURN_IF_ERROR(Annotate(LoadExternalData(model, external_dir), quoted));
  StatusOr<Graph> graph = ConvertModel(model);
  if (!graph.ok()) return Annotate(graph.status(), quoted);
  return graph;
}

StatusOr<Graph> ImportOnnxFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(StrCat("ONNX model '", path, "' does not exist or is not a regular file"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(StrCat("cannot open ONNX model '", path, "': ", std::strerror(errno)));
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::NotFoundError(StrCat("cannot read ONNX model '", path, "': ", std::strerror(errno)));
  return ImportOnnxBytes(bytes, path, std::filesystem::path(path).parent_path().string().empty()
                                           ? std::string(".")
                                           : std::filesystem::path(path).parent_path().string());
}

}  // namespace vigil::infer
