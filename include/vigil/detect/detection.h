// vigil/detect/detection.h — one detected object.
//
// Coordinates are pixels of the image they refer to: the model input (after letterboxing) while a
// result is being decoded and suppressed, the source image once mapped back (MapToSource in
// letterbox.h). Everything a Detector returns is in source-image pixels (docs/architecture.md).
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <memory>

#include "vigil/common/status.h"

namespace vigil::detect {

struct Detection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // corners in pixels, x1 <= x2 and y1 <= y2; x right, y down
  float score = 0;                        // confidence in [0, 1]
  int class_id = 0;                       // index into the model's class names
};

// One image's detections kept in device memory past Detector::DetectFrames (its `kept` argument,
// detector.h): `count` rows of 6 float32 — x1, y1, x2, y2 (source pixels), score, class id — the same rows,
// in the same order, as the host Detections; complete when DetectFrames returns. `memory` holds them (a
// buffer of the Detector's pool, shared by the images of one batch; it goes back to the pool when the last
// holder lets go, from any thread). DownloadRows copies them to the host (count × 6 floats at `dst`);
// errors: InvalidArgument (no rows kept), FailedPrecondition (built without CUDA), Internal (a CUDA error).
struct DeviceRows {
  int device = -1;
  const float* rows = nullptr;  // null: none kept (a CPU detector, or the pool's buffers are all held)
  uint32_t count = 0;
  std::shared_ptr<const void> memory;
};
Status DownloadRows(const DeviceRows& rows, float* dst);

}  // namespace vigil::detect
