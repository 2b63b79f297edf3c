// JPEG encode/decode with libturbojpeg (video/jpeg.h).
#include "vigil/video/jpeg.h"

#include <turbojpeg.h>

#include <memory>
#include <vector>

namespace vigil::video {
namespace {

struct TjDeleter {
  void operator()(void* h) const {
    if (h != nullptr) tjDestroy(h);
  }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

// One handle per thread and kind: libturbojpeg handles are not thread-safe, and creating one per call
// costs more than a small picture's encode.
tjhandle Compressor() {
  thread_local TjHandle h(tjInitCompress());
  return h.get();
}
TjHandle& DecompressorSlot() {
  thread_local TjHandle h(tjInitDecompress());
  return h;
}
tjhandle Decompressor() { return DecompressorSlot().get(); }
// After a picture that failed (or decoded with a warning: a truncated one) the handle is not trusted again: with
// libjpeg-turbo 2.1 the next header read on it answered 0x0 for a good picture. A new one costs ~10 µs.
void ResetDecompressor() { DecompressorSlot().reset(tjInitDecompress()); }

}  // namespace

bool JpegAvailable() { return true; }

StatusOr<std::string> EncodeJpeg(const Frame& f, int quality) {
  const std::string what = StrCat("jpeg: stream '", f.stream_id, "' seq ", f.seq);
  if (f.device) return absl::InvalidArgumentError(StrCat(what, ": a device frame (download it to host memory first)"));
  if (quality < 1 || quality > 100) return absl::InvalidArgumentError(StrCat(what, ": quality ", quality, " not in 1..100"));
  if (f.width <= 0 || f.height <= 0 || f.width > kMaxJpegSide || f.height > kMaxJpegSide || f.stride < f.width * 3 ||
      f.bgr.size() < static_cast<size_t>(f.stride) * static_cast<size_t>(f.height)) {
    return absl::InvalidArgumentError(StrCat(what, ": a ", f.width, "x", f.height, " picture with stride ", f.stride,
                                             " and ", f.bgr.size(), " bytes of pixels is not a valid BGR picture"));
  }
  tjhandle tj = Compressor();
  if (tj == nullptr) return absl::ResourceExhaustedError(StrCat(what, ": cannot create a JPEG compressor"));
  unsigned char* buf = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): libturbojpeg's type
  if (tjCompress2(tj, f.bgr.data(), f.width, f.stride, f.height, TJPF_BGR, &buf, &size, TJSAMP_420, quality,
                  TJFLAG_FASTDCT) != 0) {
    const std::string why = tjGetErrorStr2(tj);
    tjFree(buf);
    return absl::InvalidArgumentError(StrCat(what, ": JPEG encoding failed: ", why));
  }
  std::string out(reinterpret_cast<const char*>(buf), size);
  tjFree(buf);
  return out;
}

Status DecodeJpeg(std::string_view jpeg, Frame* out) {
  if (jpeg.empty()) return absl::InvalidArgumentError("jpeg: an empty picture");
  tjhandle tj = Decompressor();
  if (tj == nullptr) return absl::ResourceExhaustedError("jpeg: cannot create a JPEG decompressor");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  if (tjDecompressHeader3(tj, data, jpeg.size(), &width, &height, &subsamp, &colorspace) != 0) {
    Status st =
        absl::InvalidArgumentError(StrCat("jpeg: not a JPEG picture (", jpeg.size(), " bytes): ", tjGetErrorStr2(tj)));
    ResetDecompressor();
    return st;
  }
  if (width <= 0 || height <= 0 || width > kMaxJpegSide || height > kMaxJpegSide) {
    return absl::InvalidArgumentError(StrCat("jpeg: a ", width, "x", height, " picture is larger than ", kMaxJpegSide,
                                             " pixels a side"));
  }
  std::vector<uint8_t> bgr(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  if (tjDecompress2(tj, data, jpeg.size(), bgr.data(), width, width * 3, height, TJPF_BGR, TJFLAG_FASTDCT) != 0) {
    const bool fatal = tjGetErrorCode(tj) == TJERR_FATAL;
    Status st = absl::InvalidArgumentError(StrCat("jpeg: the picture does not decode: ", tjGetErrorStr2(tj)));
    ResetDecompressor();
    if (fatal) return st;  // a warning (e.g. truncated data): the rest of the picture is grey
  }
  out->bgr = std::move(bgr);
  out->width = width;
  out->height = height;
  out->stride = width * 3;
  out->device.reset();
  return absl::OkStatus();
}

}  // namespace vigil::video
