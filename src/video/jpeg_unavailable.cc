// video/jpeg.h without libturbojpeg (VIGIL_WITH_TURBOJPEG off or not found).
#include "vigil/video/jpeg.h"

namespace vigil::video {
namespace {
Status Missing() {
  return absl::UnimplementedError(
      "jpeg: this vigil was built without libturbojpeg (Debian libturbojpeg0-dev; VIGIL_WITH_TURBOJPEG)");
}
}  // namespace

bool JpegAvailable() { return false; }
StatusOr<std::string> EncodeJpeg(const Frame&, int) { return Missing(); }
Status DecodeJpeg(std::string_view, Frame*) { return Missing(); }

}  // namespace vigil::video
