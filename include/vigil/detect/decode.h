// vigil/detect/decode.h — raw YOLO outputs → candidate boxes, per family (model_family.h).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/detect/detection.h"
#include "vigil/detect/model_family.h"

namespace vigil::detect {

// Decodes image `index` of `output` (the model's raw output, float32 or float16, shaped as
// `model` says) into candidate boxes in model-input pixels, xyxy (Ultralytics
// `non_max_suppression` up to the NMS call): each box's class is its best class score (first
// index on ties), its score that score (× objectness for YOLOv5/YOLOX); boxes with score <= conf
// are dropped, and so are boxes whose class is not in `classes` (when non-empty). End-to-end
// outputs are thresholded the same way. Order: the output's box order.
// Errors: InvalidArgument when the output's dtype or shape does not match `model` or `index` is
// out of range.
StatusOr<std::vector<Detection>> DecodeOutput(const Tensor& output, int64_t index, const ModelInfo& model,
                                              float conf, std::span<const int> classes);

}  // namespace vigil::detect
