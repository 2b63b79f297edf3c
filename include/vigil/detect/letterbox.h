// vigil/detect/letterbox.h — resize-and-pad preprocessing into a model's NCHW input, and mapping
// boxes back to the source image.
//
// Two styles, the ones the models were trained with (YOLO-NOTES.md):
//  * Ultralytics (`ultralytics.data.augment.LetterBox`, auto=False, scaleup=True, center=True):
//    r = min(H/h, W/w); resized size (round(w·r), round(h·r)) with Python's round (half to even);
//    bilinear resize (cv::resize INTER_LINEAR) on 8-bit pixels; padding 114 split around the image
//    with left = round(dw − 0.1), top = round(dh − 0.1) where dw, dh are half the slack, so an odd
//    pixel goes to the right/bottom; channels reordered BGR→RGB; values /255 → [0, 1].
//  * YOLOX (`yolox.data.data_augment.preproc`, non-legacy): the same r, resized size truncated
//    (int(w·r), int(h·r)), image at the top-left of a 114-filled canvas, channels kept BGR, values
//    0..255 as floats.
// The resize is skipped when the resized size equals the source size. A resized side that would
// round to 0 pixels (extreme aspect ratios, e.g. 1×10000) is made 1 pixel instead of failing.
// A one-channel model input ([N,1,H,W]) receives the BGR→gray conversion of the letterboxed
// pixels (cv::COLOR_BGR2GRAY), normalised like the three-channel case.
//
// Thread-safety: all functions are pure or write only the tensor slot they are given.
#pragma once

#include <cstdint>
#include <span>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/detect/detection.h"
#include "vigil/detect/image.h"

namespace vigil::detect {

enum class LetterboxStyle { kUltralytics, kYolox };

// Where the source image lies inside the model input.
struct LetterboxInfo {
  double ratio = 1;           // resized / source size (the same factor for x and y)
  int resized_width = 0;      // pixels of the model input covered by the image
  int resized_height = 0;
  int pad_left = 0;           // model-input pixels left of / above the image
  int pad_top = 0;
  int source_width = 0;       // pixels of the source image
  int source_height = 0;
};

// The geometry of letterboxing a source_width×source_height image into target_width×target_height.
// REQUIRES: all sizes > 0.
LetterboxInfo ComputeLetterbox(int source_width, int source_height, int target_width, int target_height,
                               LetterboxStyle style);

// Letterboxes `image` into slot `index` of `batch`, a [N, C, H, W] tensor (C = 3 or 1) of float32 or
// float16 (values are converted to half precision, round to nearest even), and returns the
// geometry. Only that slot is written.
// Errors: InvalidArgument when the tensor is not [N,1|3,H,W] float32/float16, `index` is outside
// [0, N), or the image is empty or its bgr buffer does not hold width·height·3 bytes.
StatusOr<LetterboxInfo> Letterbox(const Image& image, LetterboxStyle style, Tensor& batch, int64_t index);

// Maps boxes from model-input pixels to source pixels in place (Ultralytics `scale_boxes`):
// subtract the left/top pad, divide by the ratio, clip x to [0, source_width] and y to
// [0, source_height]. The pad is the one Letterbox applied (`info`), not recomputed.
void MapToSource(const LetterboxInfo& info, std::span<Detection> boxes);

}  // namespace vigil::detect
