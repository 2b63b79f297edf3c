#include "vigil/video/snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <opencv2/imgproc.hpp>

#include "vigil/video/jpeg.h"

namespace vigil::video {
namespace {

Status Range(const char* field, double v, double lo, double hi, bool zero_ok) {
  if ((zero_ok && v == 0) || (v >= lo && v <= hi)) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat("snapshot ", field, " ", v, ": must be ", zero_ok ? "0 or " : "", lo, "..", hi));
}

// A host picture as a Frame (pixels only), from a cv::Mat of CV_8UC3.
Frame FromMat(const cv::Mat& m) {
  Frame f;
  f.width = m.cols;
  f.height = m.rows;
  f.stride = m.cols * 3;
  f.bgr.resize(static_cast<size_t>(f.stride) * static_cast<size_t>(f.height));
  for (int y = 0; y < m.rows; ++y) std::copy_n(m.ptr<uint8_t>(y), f.stride, f.bgr.data() + static_cast<size_t>(y) * f.stride);
  return f;
}

// `region` of `src` downscaled (area) so that its width is at most max_w and its longer side at most max_side
// (0: no limit), never upscaled; then JPEG.
StatusOr<SnapshotPicture> Encode(const cv::Mat& src, const cv::Rect& region, int max_w, int max_side, int quality) {
  double scale = 1.0;
  if (max_w > 0 && region.width > max_w) scale = std::min(scale, static_cast<double>(max_w) / region.width);
  const int longer = std::max(region.width, region.height);
  if (max_side > 0 && longer > max_side) scale = std::min(scale, static_cast<double>(max_side) / longer);
  cv::Mat roi = src(region), out;
  if (scale < 1.0) {
    const int w = std::max(1, static_cast<int>(std::lround(region.width * scale)));
    const int h = std::max(1, static_cast<int>(std::lround(region.height * scale)));
    cv::resize(roi, out, cv::Size(w, h), 0, 0, cv::INTER_AREA);
  } else {
    out = roi;
  }
  SnapshotPicture p;
  p.x = region.x;
  p.y = region.y;
  p.width = region.width;
  p.height = region.height;
  p.out_width = out.cols;
  p.out_height = out.rows;
  VIGIL_ASSIGN_OR_RETURN(p.jpeg, EncodeJpeg(FromMat(out), quality));
  return p;
}

}  // namespace

Status ValidateSnapshotOptions(const SnapshotOptions& o) {
  VIGIL_RETURN_IF_ERROR(Range("frame_max_width", o.frame_max_width, 16, kMaxJpegSide, true));
  VIGIL_RETURN_IF_ERROR(Range("crop_max_side", o.crop_max_side, 16, kMaxJpegSide, true));
  VIGIL_RETURN_IF_ERROR(Range("quality", o.quality, 1, 100, false));
  if (!(o.crop_margin >= 0 && o.crop_margin <= 2)) {
    return absl::InvalidArgumentError(StrCat("snapshot crop_margin ", o.crop_margin, ": must be 0..2"));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<SnapshotPicture>> EncodeSnapshots(const Frame& frame, std::span<const SnapshotBox> boxes,
                                                       const SnapshotOptions& options) {
  VIGIL_RETURN_IF_ERROR(ValidateSnapshotOptions(options));
  if (frame.device) {
    return absl::InvalidArgumentError(
        StrCat("snapshot of ", frame.stream_id, " seq ", frame.seq, ": a device frame (download it first)"));
  }
  if (frame.width <= 0 || frame.height <= 0 || frame.stride < frame.width * 3 ||
      frame.bgr.size() < static_cast<size_t>(frame.stride) * static_cast<size_t>(frame.height)) {
    return absl::InvalidArgumentError(StrCat("snapshot of ", frame.stream_id, " seq ", frame.seq, ": a ", frame.width,
                                             "x", frame.height, " frame with stride ", frame.stride, " and ",
                                             frame.bgr.size(), " bytes"));
  }
  const cv::Mat src(frame.height, frame.width, CV_8UC3, const_cast<uint8_t*>(frame.bgr.data()),
                    static_cast<size_t>(frame.stride));
  std::vector<SnapshotPicture> out;
  if (options.frame) {
    VIGIL_ASSIGN_OR_RETURN(SnapshotPicture p, Encode(src, cv::Rect(0, 0, frame.width, frame.height),
                                                     options.frame_max_width, 0, options.quality));
    out.push_back(std::move(p));
  }
  if (!options.crops) return out;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const SnapshotBox& b = boxes[i];
    if (!std::isfinite(b.x1) || !std::isfinite(b.y1) || !std::isfinite(b.x2) || !std::isfinite(b.y2) || b.x2 < b.x1 ||
        b.y2 < b.y1) {
      continue;
    }
    const double mx = (b.x2 - b.x1) * options.crop_margin, my = (b.y2 - b.y1) * options.crop_margin;
    const double x1 = std::clamp(std::floor(b.x1 - mx), 0.0, static_cast<double>(frame.width));
    const double y1 = std::clamp(std::floor(b.y1 - my), 0.0, static_cast<double>(frame.height));
    const double x2 = std::clamp(std::ceil(b.x2 + mx), 0.0, static_cast<double>(frame.width));
    const double y2 = std::clamp(std::ceil(b.y2 + my), 0.0, static_cast<double>(frame.height));
    if (x2 - x1 < 1 || y2 - y1 < 1) continue;
    const cv::Rect region(static_cast<int>(x1), static_cast<int>(y1), static_cast<int>(x2 - x1),
                          static_cast<int>(y2 - y1));
    VIGIL_ASSIGN_OR_RETURN(SnapshotPicture p, Encode(src, region, 0, options.crop_max_side, options.quality));
    p.box = static_cast<int>(i);
    out.push_back(std::move(p));
  }
  return out;
}

void ClassColour(int class_id, uint8_t bgr[3]) {
  // Twenty well-separated colours (BGR), the same for a class everywhere.
  static constexpr uint8_t kPalette[20][3] = {
      {56, 56, 255},  {151, 157, 255}, {31, 112, 255}, {29, 178, 255}, {49, 210, 207}, {10, 249, 72},  {23, 204, 146},
      {134, 219, 61}, {52, 147, 26},   {187, 212, 0},  {168, 153, 44}, {255, 194, 0}, {147, 69, 52},  {255, 115, 100},
      {236, 24, 0},   {255, 56, 132},  {133, 0, 82},   {255, 56, 203}, {200, 149, 255}, {199, 55, 255}};
  const int k = ((class_id % 20) + 20) % 20;
  std::copy_n(kPalette[k], 3, bgr);
}

StatusOr<Tensor> ClassifierInput(std::string_view jpeg, int width, int height, const float mean[3],
                                 const float stddev[3]) {
  if (width < 1 || width > 4096 || height < 1 || height > 4096) {
    return absl::InvalidArgumentError(StrCat("classifier input ", width, "x", height, ": each side must be 1..4096"));
  }
  for (int c = 0; c < 3; ++c) {
    if (!(stddev[c] > 0)) return absl::InvalidArgumentError(StrCat("classifier input: stddev ", stddev[c], " ≤ 0"));
  }
  Frame pic;
  VIGIL_RETURN_IF_ERROR(DecodeJpeg(jpeg, &pic));
  const cv::Mat src(pic.height, pic.width, CV_8UC3, pic.bgr.data(), static_cast<size_t>(pic.stride));
  cv::Mat sized;
  const bool shrink = width * height < pic.width * pic.height;
  cv::resize(src, sized, cv::Size(width, height), 0, 0, shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
  Tensor t(DType::kFloat32, {1, 3, height, width});
  float* out = t.data<float>();
  const size_t plane = static_cast<size_t>(width) * static_cast<size_t>(height);
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = sized.ptr<uint8_t>(y);
    for (int x = 0; x < width; ++x) {
      const size_t at = static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x);
      for (int c = 0; c < 3; ++c) {  // RGB planes from BGR pixels
        const float v = static_cast<float>(row[3 * x + (2 - c)]) / 255.0f;
        out[static_cast<size_t>(c) * plane + at] = (v - mean[c]) / stddev[c];
      }
    }
  }
  return t;
}

StatusOr<std::string> DrawBoxes(std::string_view jpeg, int source_width, int source_height,
                                std::span<const LabeledBox> boxes, int quality) {
  if (source_width <= 0 || source_height <= 0) {
    return absl::InvalidArgumentError(StrCat("draw boxes: source size ", source_width, "x", source_height));
  }
  Frame pic;
  VIGIL_RETURN_IF_ERROR(DecodeJpeg(jpeg, &pic));
  cv::Mat m(pic.height, pic.width, CV_8UC3, pic.bgr.data(), static_cast<size_t>(pic.stride));
  const double sx = static_cast<double>(pic.width) / source_width, sy = static_cast<double>(pic.height) / source_height;
  // At least 2 px: JPEG's 4:2:0 chroma would wash a 1-px line's colour out.
  const int thickness = std::max(2, static_cast<int>(std::lround(std::min(pic.width, pic.height) / 250.0)));
  const double font = std::max(0.35, std::min(pic.width, pic.height) / 900.0);
  for (const LabeledBox& b : boxes) {
    if (!std::isfinite(b.x1) || !std::isfinite(b.y1) || !std::isfinite(b.x2) || !std::isfinite(b.y2)) continue;
    uint8_t c[3];
    ClassColour(b.class_id, c);
    const cv::Scalar colour(c[0], c[1], c[2]);
    const cv::Point p1(static_cast<int>(std::lround(b.x1 * sx)), static_cast<int>(std::lround(b.y1 * sy)));
    const cv::Point p2(static_cast<int>(std::lround(b.x2 * sx)), static_cast<int>(std::lround(b.y2 * sy)));
    cv::rectangle(m, p1, p2, colour, thickness, cv::LINE_8);
    char score[16];
    std::snprintf(score, sizeof score, " %.2f", static_cast<double>(b.score));
    const std::string text = b.label + score;
    int base = 0;
    const cv::Size ts = cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, font, 1, &base);
    const int top = p1.y - ts.height - base - 2 >= 0 ? p1.y - ts.height - base - 2 : p1.y;  // above, or inside
    cv::rectangle(m, cv::Rect(p1.x, top, ts.width + 4, ts.height + base + 2), colour, cv::FILLED);
    cv::putText(m, text, cv::Point(p1.x + 2, top + ts.height + 1), cv::FONT_HERSHEY_SIMPLEX, font,
                cv::Scalar(255, 255, 255), 1, cv::LINE_AA);
  }
  return EncodeJpeg(pic, quality);
}

}  // namespace vigil::video
