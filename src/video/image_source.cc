// Image folders and globs: one frame per readable image, decoded with OpenCV (cv::imread, IMREAD_COLOR,
// which applies the EXIF orientation of JPEG files). An unreadable file is counted, named in the log and
// in last_error, and skipped.
#include <chrono>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "vigil/video/source.h"

namespace vigil::video::internal {
namespace {

class ImageSource final : public Source {
 public:
  ImageSource(SourceOptions options, std::vector<std::string> paths)
      : Source(std::move(options), /*live=*/false),
        paths_(std::move(paths)),
        interval_ns_(static_cast<int64_t>(1e9 / options_.image_fps)) {
    probed_.fps = options_.image_fps;
    declared_frames_ = paths_.size();
    if (StatusOr<std::optional<int>> device = ParseHwaccel(options_.hwaccel); device.ok() && *device) {
      stats_.SetHwaccel("cpu (images are decoded with OpenCV)");
    }
  }

 protected:
  StatusOr<std::optional<Picture>> DecodeNext() override {
    while (true) {
      if (interrupted()) return absl::CancelledError(StrCat(who(), ": stopped"));
      if (next_ == paths_.size()) {
        if (!options_.loop) return std::optional<Picture>();
        if (loaded_this_pass_ == 0) return absl::DataLossError(StrCat(who(), ": no image could be read"));
        next_ = 0;
        loaded_this_pass_ = 0;
        new_pass_ = true;
      }
      const size_t index = next_++;
      const std::string& path = paths_[index];
      cv::Mat image;
      const int64_t t0 = SystemClock()->SteadyNs();
      try {
        image = cv::imread(path, cv::IMREAD_COLOR);
      } catch (const cv::Exception& e) {
        stats_.DecodeError(StrCat(who(), ": ", path, ": cannot decode: ", e.what()));
        continue;
      }
      if (image.empty()) {
        stats_.DecodeError(StrCat(who(), ": ", path, ": cannot read or decode the image"));
        continue;
      }
      ++loaded_this_pass_;
      Picture picture;
      picture.frame.width = image.cols;
      picture.frame.height = image.rows;
      picture.frame.stride = image.cols * 3;
      picture.frame.bgr.resize(size_t(image.rows) * image.cols * 3);
      cv::Mat out(image.rows, image.cols, CV_8UC3, picture.frame.bgr.data());
      image.copyTo(out);
      picture.frame.decode_ns = SystemClock()->SteadyNs() - t0;
      picture.pts_ns = int64_t(index) * interval_ns_;
      picture.discontinuity = new_pass_;
      picture.nominal_duration_ns = interval_ns_;
      new_pass_ = false;
      return std::optional<Picture>(std::move(picture));
    }
  }

 private:
  const std::vector<std::string> paths_;
  const int64_t interval_ns_;
  size_t next_ = 0;
  size_t loaded_this_pass_ = 0;
  bool new_pass_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<Source>> OpenImageSource(SourceOptions options, std::vector<std::string> paths) {
  return std::unique_ptr<Source>(new ImageSource(std::move(options), std::move(paths)));
}

}  // namespace vigil::video::internal
