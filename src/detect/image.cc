#include "vigil/detect/image.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

namespace vigil::detect {

StatusOr<Image> LoadImage(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return absl::NotFoundError(StrCat(path, ": no such file"));
  if (fs::is_directory(st)) return absl::InvalidArgumentError(StrCat(path, ": is a directory, not an image"));
  const auto size = fs::file_size(path, ec);
  if (ec) return absl::InvalidArgumentError(StrCat(path, ": cannot read: ", ec.message()));
  if (size == 0) return absl::InvalidArgumentError(StrCat(path, ": empty file (0 bytes)"));
  if (!std::ifstream(path, std::ios::binary)) {
    return absl::PermissionDeniedError(StrCat(path, ": cannot open for reading"));
  }
  cv::Mat mat;
  try {
    mat = cv::imread(path, cv::IMREAD_COLOR);  // applies EXIF orientation; any depth/channels → 8-bit BGR
  } catch (const cv::Exception& e) {
    return absl::DataLossError(StrCat(path, ": cannot decode image: ", e.what()));
  }
  if (mat.empty()) {
    return absl::DataLossError(StrCat(
        path, ": cannot decode image (", size, " bytes; not a supported image format, or corrupt data)"));
  }
  if (mat.type() != CV_8UC3) {
    return absl::DataLossError(StrCat(path, ": decoder returned ", mat.channels(), " channels of depth ",
                                            mat.depth(), " instead of 8-bit BGR"));
  }
  Image image;
  image.width = mat.cols;
  image.height = mat.rows;
  image.bgr.resize(static_cast<size_t>(mat.total()) * 3);
  cv::Mat dst(mat.rows, mat.cols, CV_8UC3, image.bgr.data());
  mat.copyTo(dst);
  return image;
}

bool HasImageExtension(std::string_view path) {
  static constexpr std::array<std::string_view, 20> kExtensions = {
      "bmp", "dib", "jpg", "jpeg", "jpe", "jp2", "png", "webp", "pbm", "pgm",
      "ppm", "pxm", "pnm", "pfm", "sr",  "ras", "tif", "tiff", "hdr", "pic"};
  const size_t dot = path.find_last_of("./");
  if (dot == std::string_view::npos || path[dot] != '.') return false;
  std::string ext(path.substr(dot + 1));
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::find(kExtensions.begin(), kExtensions.end(), ext) != kExtensions.end();
}

}  // namespace vigil::detect
