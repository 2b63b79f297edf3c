// fix_input_shapes.cc — FixInputShapes (passes.h): symbolic input dimensions → concrete values.
//
// Precedence per dimension: ShapeOverrides::input_shapes, then batch/height/width (image inputs),
// then ShapeOverrides::symbols, then defaults (batch: metadata `batch`, else 1; height/width:
// metadata `imgsz`; channels: metadata `channels`, else 3). Ultralytics writes `imgsz` as a Python
// list literal "[640, 640]" ([h, w]) or a single int, and `batch`/`channels` as ints
// (ultralytics/engine/exporter.py, Exporter.__call__ metadata).
#include <charconv>
#include <optional>

#include "infer/passes/passes.h"

#include <spdlog/spdlog.h>

namespace vigil::infer {

// Symbolic H/W of an image input with neither override nor metadata: Ultralytics' default imgsz.
constexpr int64_t kDefaultImageSize = 640;
namespace {

// Positive integers in `text`, e.g. "[640, 480]" → {640, 480}, "32" → {32}.
std::vector<int64_t> ParseInts(const std::string& text) {
  std::vector<int64_t> out;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    int64_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec == std::errc() && next != p) {
      if (v > 0) out.push_back(v);
      p = next;
    } else {
      ++p;
    }
  }
  return out;
}

std::optional<int64_t> MetadataInt(const Graph& graph, const std::string& key, size_t index) {
  auto it = graph.metadata.find(key);
  if (it == graph.metadata.end()) return std::nullopt;
  std::vector<int64_t> v = ParseInts(it->second);
  if (v.size() == 1) return v[0];  // a single value applies to every position (imgsz: 640)
  if (index < v.size()) return v[index];
  return std::nullopt;
}

// [N, C, H, W] with C = 1 or 3 or symbolic: the inputs that batch/height/width apply to.
bool IsImageInput(const ValueInfo& in) {
  return in.dims.size() == 4 && (!in.dims[1].is_static() || in.dims[1].value == 1 || in.dims[1].value == 3);
}

std::string DimName(const ValueInfo& in, size_t i) {
  const Dim& d = in.dims[i];
  return d.is_static() ? StrCat("dimension ", i)
                       : StrCat("dimension ", i, " ('", d.symbol.empty() ? "?" : d.symbol, "')");
}

}  // namespace

Status FixInputShapes(Graph& graph, const ShapeOverrides& overrides) {
  for (const auto& [name, shape] : overrides.input_shapes) {
    bool found = false;
    for (const ValueInfo& in : graph.inputs) found |= in.name == name;
    if (!found) return absl::InvalidArgumentError(StrCat("shape given for '", name, "', which is not a graph input"));
  }
  std::map<std::string, int64_t> symbols = overrides.symbols;  // grows as symbols get values
  for (ValueInfo& in : graph.inputs) {
    if (in.dtype == DType::kUndefined) {
      return absl::InvalidArgumentError(StrCat("graph input '", in.name, "' declares no element type"));
    }
    auto given = overrides.input_shapes.find(in.name);
    if (given != overrides.input_shapes.end()) {
      if (in.has_shape && given->second.size() != in.dims.size()) {
        return absl::InvalidArgumentError(StrCat("graph input '", in.name, "' has rank ", in.dims.size(),
                                                       " but the given shape ", ShapeToString(given->second),
                                                       " has rank ", given->second.size()));
      }
      if (!in.has_shape) {
        in.dims.assign(given->second.size(), Dim{});
        in.has_shape = true;
      }
    } else if (!in.has_shape) {
      return absl::InvalidArgumentError(
          StrCat("graph input '", in.name, "' declares no shape; give it in ShapeOverrides::input_shapes"));
    }
    const bool image = IsImageInput(in);
    Shape shape;
    for (size_t i = 0; i < in.dims.size(); ++i) {
      Dim& d = in.dims[i];
      // The value asked for explicitly, if any, and where it came from (for messages).
      std::optional<int64_t> want;
      std::string source;
      if (given != overrides.input_shapes.end()) {
        want = given->second[i];
        source = "input_shapes";
      } else if (image && i != 1) {
        const int64_t v = i == 0 ? overrides.batch : i == 2 ? overrides.height : overrides.width;
        if (v != 0) {
          want = v;
          source = i == 0 ? "batch" : i == 2 ? "height" : "width";
        }
      }
      if (!want && !d.is_static() && !d.symbol.empty() && symbols.count(d.symbol)) {
        want = symbols[d.symbol];
        source = StrCat("symbol '", d.symbol, "'");
      }
      if (want && *want <= 0) {
        return absl::InvalidArgumentError(StrCat("graph input '", in.name, "' ", DimName(in, i), ": ", source,
                                                       " gives ", *want, ", which is not positive"));
      }
      if (d.is_static()) {
        if (want && *want != d.value) {
          return absl::InvalidArgumentError(StrCat("graph input '", in.name, "' ", DimName(in, i), " is ",
                                                         d.value, " in the model but ", source, " asks for ", *want));
        }
        shape.push_back(d.value);
        continue;
      }
      if (!want && image) {
        if (i == 0) want = MetadataInt(graph, "batch", 0).value_or(1);
        if (i == 1) want = MetadataInt(graph, "channels", 0).value_or(3);
        if (i >= 2) want = MetadataInt(graph, "imgsz", i - 2);
        if (i >= 2 && !want) {
          // No override and no metadata (plain YOLOv5/YOLOX exports): Ultralytics' and YOLOv5's
          // default inference size, said once in the log so users know to pass --imgsz.
          want = kDefaultImageSize;
          spdlog::warn("graph input '{}' {} is symbolic and the model has no imgsz metadata: using {} (set --imgsz)",
                       in.name, DimName(in, i), kDefaultImageSize);
        }
      }
      if (!want) {
        return absl::InvalidArgumentError(StrCat(
            "graph input '", in.name, "' ", DimName(in, i), " has no value: ",
            "set it in ShapeOverrides::symbols or input_shapes"));
      }
      if (!d.symbol.empty()) symbols.emplace(d.symbol, *want);
      d.value = *want;  // the symbol stays, for messages and `model inspect`
      shape.push_back(*want);
    }
    graph.types[in.name] = TensorType{in.dtype, shape};
  }
  return absl::OkStatus();
}

}  // namespace vigil::infer
