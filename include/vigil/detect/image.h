// vigil/detect/image.h — decoded 8-bit BGR images and loading them from files.
//
// Layout of Image::bgr: height rows of width pixels, top row first, each pixel 3 bytes in the
// order blue, green, red (OpenCV's convention), no row padding: the byte of channel c of pixel
// (x, y) is bgr[(y * width + x) * 3 + c], and bgr.size() == width * height * 3.
//
// LoadImage reads what users' cameras and tools write the way they expect (OpenCV
// cv::imread with IMREAD_COLOR): the EXIF orientation tag of JPEG files is applied (the pixels are
// rotated/flipped upright), grayscale is replicated to three channels, alpha is dropped (not
// composited), palette images are expanded, 16-bit samples keep their high byte, CMYK is
// converted to BGR.
// Thread-safety: free functions are thread-safe; an Image is a plain value.
// Errors: LoadImage returns NotFound / InvalidArgument / DataLoss with a message
// "<path>: <reason>" (no such file, is a directory, empty file, cannot read, cannot decode).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::detect {

struct Image {
  int width = 0;              // pixels
  int height = 0;             // pixels
  std::vector<uint8_t> bgr;   // width * height * 3 bytes, layout above
};

// Decodes the image file at `path` (any format OpenCV's imgcodecs reads) into 8-bit BGR.
StatusOr<Image> LoadImage(const std::string& path);

// True when `path` ends in an image extension this build decodes (case-insensitive):
// .bmp .dib .jpg .jpeg .jpe .jp2 .png .webp .pbm .pgm .ppm .pxm .pnm .pfm .sr .ras .tif .tiff .hdr .pic.
bool HasImageExtension(std::string_view path);

}  // namespace vigil::detect
