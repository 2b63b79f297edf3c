// aggregator/picture_boxes.h — an event's detections drawn onto one of its stored pictures (internal to
// src/aggregator; the HTTP API's snapshot.jpg?boxes=1). With VIGIL_WITH_CLASSIFIER the aggregator links vigil_video
// and picture_boxes.cc draws with video::DrawBoxes; without it picture_boxes_unavailable.cc draws nothing.
//
// The boxes are the detections' source pixels made relative to the picture's region (StoredSnapshot x, y, width,
// height: the whole frame, or a crop), each in its class's colour with "label score"; the result is a JPEG of the
// picture's size at quality 85.
// Thread-safety: reentrant. Ownership: the JPEG is returned by value.
// Errors: Unimplemented — this build cannot draw (VIGIL_WITH_CLASSIFIER=OFF, or no libturbojpeg), the message says
// why; InvalidArgument — the stored JPEG does not decode (video::DrawBoxes).
#pragma once

#include <string>

#include "vigil/aggregator/store.h"
#include "vigil/common/status.h"

namespace vigil::aggregator {

StatusOr<std::string> DrawEventBoxes(const StoredSnapshot& picture, const StoredEvent& event);

}  // namespace vigil::aggregator
