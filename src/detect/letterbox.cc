#include "vigil/detect/letterbox.h"

#include <algorithm>
#include <cmath>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

namespace vigil::detect {
namespace {

constexpr uint8_t kPadValue = 114;  // Ultralytics LetterBox and YOLOX preproc fill value

// Python 3 round(): to nearest, ties to even (std::nearbyint in the default rounding mode).
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

LetterboxInfo ComputeLetterbox(int source_width, int source_height, int target_width, int target_height,
                               LetterboxStyle style) {
  LetterboxInfo info;
  info.source_width = source_width;
  info.source_height = source_height;
  info.ratio = std::min(static_cast<double>(target_height) / source_height,
                        static_cast<double>(target_width) / source_width);
  const double w = source_width * info.ratio, h = source_height * info.ratio;
  if (style == LetterboxStyle::kUltralytics) {
    info.resized_width = RoundHalfEven(w);
    info.resized_height = RoundHalfEven(h);
  } else {
    info.resized_width = static_cast<int>(w);
    info.resized_height = static_cast<int>(h);
  }
  info.resized_width = std::clamp(info.resized_width, 1, target_width);
  info.resized_height = std::clamp(info.resized_height, 1, target_height);
  if (style == LetterboxStyle::kUltralytics) {
    const double dw = (target_width - info.resized_width) / 2.0, dh = (target_height - info.resized_height) / 2.0;
    info.pad_left = RoundHalfEven(dw - 0.1);
    info.pad_top = RoundHalfEven(dh - 0.1);
  }
  return info;
}

StatusOr<LetterboxInfo> Letterbox(const Image& image, LetterboxStyle style, Tensor& batch, int64_t index) {
  if (batch.rank() != 4 || (batch.dim(1) != 3 && batch.dim(1) != 1) ||
      (batch.dtype() != DType::kFloat32 && batch.dtype() != DType::kFloat16)) {
    return absl::InvalidArgumentError(StrCat("letterbox: target tensor ", DTypeName(batch.dtype()),
                                                   ShapeToString(batch.shape()),
                                                   " is not [N,3|1,H,W] float32/float16"));
  }
  if (index < 0 || index >= batch.dim(0)) {
    return absl::InvalidArgumentError(
        StrCat("letterbox: slot ", index, " is outside the batch of ", batch.dim(0)));
  }
  if (image.width <= 0 || image.height <= 0 ||
      image.bgr.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return absl::InvalidArgumentError(StrCat("letterbox: image ", image.width, "x", image.height, " with ",
                                                   image.bgr.size(), " bytes is empty or not width*height*3"));
  }
  const int channels = static_cast<int>(batch.dim(1));
  const int target_h = static_cast<int>(batch.dim(2)), target_w = static_cast<int>(batch.dim(3));
  const LetterboxInfo info = ComputeLetterbox(image.width, image.height, target_w, target_h, style);

  // Compose the letterboxed 8-bit image, then convert it plane by plane into the tensor slot.
  const cv::Mat source(image.height, image.width, CV_8UC3, const_cast<uint8_t*>(image.bgr.data()));
  cv::Mat canvas(target_h, target_w, CV_8UC3, cv::Scalar::all(kPadValue));
  cv::Mat roi = canvas(cv::Rect(info.pad_left, info.pad_top, info.resized_width, info.resized_height));
  if (info.resized_width == image.width && info.resized_height == image.height) {
    source.copyTo(roi);
  } else {
    cv::resize(source, roi, roi.size(), 0, 0, cv::INTER_LINEAR);
  }
  if (channels == 1) cv::cvtColor(canvas, canvas, cv::COLOR_BGR2GRAY);

  const bool ultralytics = style == LetterboxStyle::kUltralytics;
  const float scale = ultralytics ? 1.0f / 255.0f : 1.0f;
  const int64_t plane = static_cast<int64_t>(target_h) * target_w;
  const int64_t slot = index * channels * plane;
  for (int c = 0; c < channels; ++c) {
    // Ultralytics takes RGB: plane 0 is the canvas's red channel (BGR index 2). YOLOX keeps BGR.
    const int src_c = (channels == 3 && ultralytics) ? 2 - c : c;
    for (int y = 0; y < target_h; ++y) {
      const uint8_t* row = canvas.ptr<uint8_t>(y);
      const int64_t base = slot + c * plane + static_cast<int64_t>(y) * target_w;
      for (int x = 0; x < target_w; ++x) {
        const float v = row[x * channels + src_c] * scale;
        if (batch.dtype() == DType::kFloat32) {
          batch.data<float>()[base + x] = v;
        } else {
          batch.data<uint16_t>()[base + x] = FloatToHalf(v);
        }
      }
    }
  }
  return info;
}

void MapToSource(const LetterboxInfo& info, std::span<Detection> boxes) {
  const auto map = [&](float v, int pad, int limit) {
    return std::clamp(static_cast<float>((v - pad) / info.ratio), 0.0f, static_cast<float>(limit));
  };
  for (Detection& d : boxes) {
    d.x1 = map(d.x1, info.pad_left, info.source_width);
    d.x2 = map(d.x2, info.pad_left, info.source_width);
    d.y1 = map(d.y1, info.pad_top, info.source_height);
    d.y2 = map(d.y2, info.pad_top, info.source_height);
  }
}

}  // namespace vigil::detect
