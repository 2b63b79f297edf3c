// aggregator/picture_boxes.h without the classifier's media modules (VIGIL_WITH_CLASSIFIER=OFF): the aggregator
// links no vigil_video, so it serves pictures as stored and draws no boxes on them.
#include "aggregator/picture_boxes.h"

namespace vigil::aggregator {

StatusOr<std::string> DrawEventBoxes(const StoredSnapshot&, const StoredEvent&) {
  return absl::UnimplementedError(
      "this vigil was built without VIGIL_WITH_CLASSIFIER (the aggregator links no vigil_video: it cannot draw on a "
      "JPEG)");
}

}  // namespace vigil::aggregator
