// aggregator/picture_boxes.h with vigil_video (VIGIL_WITH_CLASSIFIER): video::DrawBoxes, when it has libturbojpeg.
#include "aggregator/picture_boxes.h"

#include <vector>

#if VIGIL_HAVE_TURBOJPEG
#include "vigil/video/snapshot.h"
#endif

namespace vigil::aggregator {

StatusOr<std::string> DrawEventBoxes(const StoredSnapshot& p, const StoredEvent& ev) {
#if VIGIL_HAVE_TURBOJPEG
  std::vector<video::LabeledBox> boxes;
  for (const StoredDetection& d : ev.detections) {
    boxes.push_back({d.x1 - static_cast<float>(p.x), d.y1 - static_cast<float>(p.y), d.x2 - static_cast<float>(p.x),
                     d.y2 - static_cast<float>(p.y), d.class_id, d.label, d.score});
  }
  return video::DrawBoxes(p.jpeg, static_cast<int>(p.width), static_cast<int>(p.height), boxes, 85);
#else
  (void)p;
  (void)ev;
  return absl::UnimplementedError("this vigil was built without libturbojpeg (it cannot draw on a JPEG)");
#endif
}

}  // namespace vigil::aggregator
