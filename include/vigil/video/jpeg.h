// vigil/video/jpeg.h — JPEG pictures for the hot standby's frame mirror (libturbojpeg, Debian
// libturbojpeg0-dev; VIGIL_WITH_TURBOJPEG).
//
// EncodeJpeg: a host Frame (frame.h: 8-bit BGR, `height` rows of `stride` bytes) → a baseline JPEG of the
// same width × height, 4:2:0 chroma, `quality` 1..100 (libjpeg's scale; 85 keeps boxes within ~1 px of the
// original's on COCO-like scenes). DecodeJpeg: a JPEG → `out`'s bgr / width / height / stride (rows not
// padded: stride = width * 3); the other fields of `out` are left as they are.
// Sizes: up to 16384 × 16384 pixels (larger is refused before anything is allocated).
// Thread-safety: both are reentrant (one compressor / decompressor handle per calling thread).
// Errors: InvalidArgument — a device frame (download it first: DownloadBgr), empty or inconsistent pixels,
// quality out of range, a JPEG that does not decode (the message carries libturbojpeg's reason) or is too
// large; Unimplemented — vigil built without libturbojpeg.
#pragma once

#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/video/frame.h"

namespace vigil::video {

inline constexpr int kMaxJpegSide = 16384;

// Whether this build has JPEG support (libturbojpeg).
bool JpegAvailable();

StatusOr<std::string> EncodeJpeg(const Frame& frame, int quality);
Status DecodeJpeg(std::string_view jpeg, Frame* out);

}  // namespace vigil::video
