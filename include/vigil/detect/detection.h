// vigil/detect/detection.h — one detected object.
//
// Coordinates are pixels of the image they refer to: the model input (after letterboxing) while a
// result is being decoded and suppressed, the source image once mapped back (MapToSource in
// letterbox.h). Everything a Detector returns is in source-image pixels (docs/architecture.md).
// Thread-safety: a plain value.
#pragma once

namespace vigil::detect {

struct Detection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // corners in pixels, x1 <= x2 and y1 <= y2; x right, y down
  float score = 0;                        // confidence in [0, 1]
  int class_id = 0;                       // index into the model's class names
};

}  // namespace vigil::detect
