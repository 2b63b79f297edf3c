#include "vigil/detect/model_family.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace vigil::detect {
namespace {

std::string MetadataValue(const infer::ModelSummary& summary, const std::string& key) {
  const auto it = summary.metadata.find(key);
  return it == summary.metadata.end() ? std::string() : it->second;
}

// Whether the Ultralytics export arguments (a Python dict literal) contain 'nms': True.
bool ArgsSayNms(const std::string& args) {
  std::string compact;
  for (char c : args) {
    if (c != ' ') compact += c;
  }
  return absl::StrContains(compact, "'nms':True") || absl::StrContains(compact, "\"nms\":True");
}

std::vector<std::string> ResolveNames(const infer::ModelSummary& summary, int64_t num_classes) {
  std::vector<std::string> names;
  const std::string literal = MetadataValue(summary, "names");
  if (!literal.empty()) {
    auto parsed = ParseClassNames(literal);
    if (parsed.ok()) {
      names = std::move(*parsed);
    } else {
      spdlog::warn("{}: ignoring metadata 'names': {}", summary.path, std::string(parsed.status().message()));
    }
  }
  if (names.empty() && (num_classes == 80 || num_classes == 0)) names = CocoClassNames();
  for (auto i = static_cast<int64_t>(names.size()); i < num_classes; ++i) names.push_back(StrCat("class", i));
  return names;
}

}  // namespace

int64_t GridCellCount(int64_t height, int64_t width, std::span<const int> strides) {
  int64_t cells = 0;
  for (int s : strides) cells += ((height + s - 1) / s) * ((width + s - 1) / s);
  return cells;
}

std::string_view FamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kUltralytics: return "ultralytics";
    case ModelFamily::kYoloV5: return "yolov5";
    case ModelFamily::kYolox: return "yolox";
    case ModelFamily::kEnd2End: return "end2end";
  }
  return "unknown";
}

StatusOr<ModelInfo> DescribeModel(const infer::ModelSummary& summary, std::span<const infer::TensorInfo> inputs,
                                  std::span<const infer::TensorInfo> outputs) {
  const std::string model = summary.path.empty() ? std::string("model") : StrCat("model ", summary.path);
  const std::string task = MetadataValue(summary, "task");
  if (!task.empty() && task != "detect") {
    return absl::UnimplementedError(StrCat(model, ": task '", task, "' is not supported (object detection only)"));
  }
  if (inputs.size() != 1) {
    std::vector<std::string> names;
    for (const auto& in : inputs) names.push_back(StrCat("'", in.name, "'"));
    return absl::InvalidArgumentError(StrCat(model, ": has ", inputs.size(), " inputs (", absl::StrJoin(names, ", "),
                                             "); a detector takes one image input"));
  }
  const infer::TensorInfo& in = inputs[0];
  const Shape& is = in.shape;
  if (is.size() != 4 || (is[1] != 3 && is[1] != 1) || is[0] < 1 || is[2] < 1 || is[3] < 1) {
    return absl::InvalidArgumentError(StrCat(model, ": input '", in.name, "' has shape ", ShapeToString(is),
                                             ", not an image tensor [N,3,H,W] or [N,1,H,W]"));
  }
  if (in.dtype != DType::kFloat32 && in.dtype != DType::kFloat16) {
    return absl::InvalidArgumentError(StrCat(model, ": input '", in.name, "' is ", DTypeName(in.dtype),
                                             ShapeToString(is), "; an image input must be float32 or float16"));
  }
  if (outputs.empty()) return absl::InvalidArgumentError(StrCat(model, ": has no outputs"));
  const infer::TensorInfo& out = outputs[0];
  const Shape& os = out.shape;
  const auto bad_output = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat(model, ": output '", out.name, "' has shape ", ShapeToString(os),
                                             " for input ", ShapeToString(is), ": ", why));
  };
  if (os.size() != 3 || os[0] != is[0]) return bad_output("expected rank 3 [B, ...] with the input's batch size");
  if (out.dtype != DType::kFloat32 && out.dtype != DType::kFloat16) {
    return bad_output(StrCat("dtype ", DTypeName(out.dtype), " is not float32/float16"));
  }

  ModelInfo info;
  info.input_name = in.name;
  info.input_dtype = in.dtype;
  info.batch = is[0];
  info.channels = is[1];
  info.height = is[2];
  info.width = is[3];
  info.output_name = out.name;

  int64_t max_stride = 0;
  const bool stride_known = absl::SimpleAtoi(MetadataValue(summary, "stride"), &max_stride);
  std::vector<std::vector<int>> stride_sets;
  if (!stride_known || max_stride != 64) stride_sets.push_back({8, 16, 32});
  if (!stride_known || max_stride == 64) stride_sets.push_back({8, 16, 32, 64});
  const bool end2end = MetadataValue(summary, "end2end") == "True" || ArgsSayNms(MetadataValue(summary, "args"));

  // Tries the grid layouts at one stride set; true when one matches.
  const auto match_grid = [&](const std::vector<int>& strides) {
    const int64_t cells = GridCellCount(info.height, info.width, strides);
    info.strides = strides;
    if (os[2] == cells && os[1] >= 5) {
      info.family = ModelFamily::kUltralytics;
      info.num_boxes = cells;
      info.num_classes = os[1] - 4;
    } else if (os[1] == 3 * cells && os[2] >= 6) {
      info.family = ModelFamily::kYoloV5;
      info.num_boxes = os[1];
      info.num_classes = os[2] - 5;
      info.default_iou = 0.45f;
    } else if (os[1] == cells && os[2] >= 6) {
      info.family = ModelFamily::kYolox;
      info.num_boxes = cells;
      info.num_classes = os[2] - 5;
      info.raw_boxes = summary.op_counts.count("Exp") == 0;  // in-graph decoding computes exp(wh)
      info.letterbox = LetterboxStyle::kYolox;
      info.default_iou = 0.45f;
    } else {
      info.strides.clear();
      return false;
    }
    return true;
  };
  const bool grid = !end2end && std::any_of(stride_sets.begin(), stride_sets.end(), match_grid);
  if (!grid) {
    if (os[2] != 6) {
      const int64_t cells = GridCellCount(info.height, info.width, stride_sets[0]);
      return bad_output(end2end ? std::string("an end-to-end model outputs [B, K, 6] (x1, y1, x2, y2, score, class)")
                                : StrCat("matches no YOLO layout (expected [B,4+nc,", cells, "] Ultralytics, [B,",
                                         3 * cells, ",5+nc] YOLOv5, [B,", cells, ",5+nc] YOLOX or [B,K,6] end-to-end)"));
    }
    info.family = ModelFamily::kEnd2End;
    info.num_boxes = os[1];
  }
  info.names = ResolveNames(summary, info.num_classes);
  if (info.family == ModelFamily::kEnd2End) info.num_classes = static_cast<int64_t>(info.names.size());
  return info;
}

StatusOr<ModelInfo> DescribeModel(const infer::Engine& engine) {
  return DescribeModel(engine.summary(), engine.inputs(), engine.outputs());
}

}  // namespace vigil::detect
