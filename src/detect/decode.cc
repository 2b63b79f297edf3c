#include "vigil/detect/decode.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"

namespace vigil::detect {
namespace {

float At(const float* p, int64_t i) { return p[i]; }
float At(const uint16_t* p, int64_t i) { return HalfToFloat(p[i]); }

bool ClassAllowed(std::span<const int> classes, int c) {
  return classes.empty() || std::find(classes.begin(), classes.end(), c) != classes.end();
}

// One image's output `p` (float or IEEE half elements).
template <typename T>
std::vector<Detection> DecodeImage(const T* p, const ModelInfo& model, float conf, std::span<const int> classes) {
  const int64_t n = model.num_boxes, nc = model.num_classes;
  std::vector<Detection> out;
  if (model.family == ModelFamily::kEnd2End) {  // [K, 6]: x1, y1, x2, y2, score, class
    for (int64_t i = 0; i < n; ++i) {
      const T* b = p + i * 6;
      const float score = At(b, 4);
      const int c = static_cast<int>(At(b, 5));
      if (score > conf && ClassAllowed(classes, c)) out.push_back({At(b, 0), At(b, 1), At(b, 2), At(b, 3), score, c});
    }
    return out;
  }
  // Field f of box i is b[f * field_step] with b = p + i * box_step: [4+nc, N] (Ultralytics) or [N, 5+nc].
  const bool channels_first = model.family == ModelFamily::kUltralytics;
  const int64_t box_step = channels_first ? 1 : 5 + nc, field_step = channels_first ? n : 1;
  const int64_t first_class = channels_first ? 4 : 5;
  // Raw YOLOX boxes: levels in stride order, cells row-major within a level (the meshgrid order of
  // YOLOXHead.decode_outputs); [level_begin, level_end) are the boxes of the current level.
  size_t level = 0;
  int64_t level_begin = 0, level_end = 0, grid_w = 1;
  float stride = 1;
  for (int64_t i = 0; i < n; ++i) {
    const T* b = p + i * box_step;
    int best = 0;
    float best_score = At(b, first_class * field_step);
    for (int64_t c = 1; c < nc; ++c) {
      const float s = At(b, (first_class + c) * field_step);
      if (s > best_score) {
        best_score = s;
        best = static_cast<int>(c);
      }
    }
    float cx = At(b, 0), cy = At(b, field_step), w = At(b, 2 * field_step), h = At(b, 3 * field_step);
    if (model.raw_boxes) {
      while (i >= level_end) {
        const int s = model.strides[level++];
        stride = static_cast<float>(s);
        grid_w = (model.width + s - 1) / s;
        level_begin = level_end;
        level_end += grid_w * ((model.height + s - 1) / s);
      }
      const int64_t cell = i - level_begin;
      cx = (cx + static_cast<float>(cell % grid_w)) * stride;
      cy = (cy + static_cast<float>(cell / grid_w)) * stride;
      w = std::exp(w) * stride;
      h = std::exp(h) * stride;
    }
    const float score = channels_first ? best_score : At(b, 4 * field_step) * best_score;
    if (score > conf && ClassAllowed(classes, best)) {
      out.push_back({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, score, best});
    }
  }
  return out;
}

}  // namespace

StatusOr<std::vector<Detection>> DecodeOutput(const Tensor& output, int64_t index, const ModelInfo& model,
                                              float conf, std::span<const int> classes) {
  Shape expected;
  switch (model.family) {
    case ModelFamily::kUltralytics: expected = {model.batch, 4 + model.num_classes, model.num_boxes}; break;
    case ModelFamily::kYoloV5:
    case ModelFamily::kYolox: expected = {model.batch, model.num_boxes, 5 + model.num_classes}; break;
    case ModelFamily::kEnd2End: expected = {model.batch, model.num_boxes, 6}; break;
  }
  if (output.shape() != expected || (output.dtype() != DType::kFloat32 && output.dtype() != DType::kFloat16)) {
    return absl::InvalidArgumentError(StrCat("decode: output '", model.output_name, "' is ", DTypeName(output.dtype()),
                                             ShapeToString(output.shape()), ", expected float32/float16",
                                             ShapeToString(expected), " (", FamilyName(model.family), ")"));
  }
  if (model.raw_boxes && GridCellCount(model.height, model.width, model.strides) != model.num_boxes) {
    return absl::InvalidArgumentError(StrCat("decode: strides [", absl::StrJoin(model.strides, ","), "] do not give ",
                                             model.num_boxes, " cells for ", model.height, "x", model.width));
  }
  if (index < 0 || index >= model.batch) {
    return absl::InvalidArgumentError(StrCat("decode: image ", index, " is outside the batch of ", model.batch));
  }
  const int64_t per_image = output.numel() / model.batch;
  if (output.dtype() == DType::kFloat32) {
    return DecodeImage(output.data<float>() + index * per_image, model, conf, classes);
  }
  return DecodeImage(output.data<uint16_t>() + index * per_image, model, conf, classes);
}

}  // namespace vigil::detect
