// vigil/detect/nms.h — non-maximum suppression as Ultralytics' `non_max_suppression` does it
// (ultralytics/utils/nms.py; torchvision.ops.nms for the greedy step).
//
// Candidates are ordered by score, highest first; equal scores keep their input order (stable
// sort), so the result is deterministic. At most `max_candidates` (30000) of them enter. Greedy:
// a candidate is kept when its IoU with every box kept before it is <= `iou` (IoU on xyxy boxes,
// area = (x2−x1)·(y2−y1), no +1). Class-aware: only boxes of the same class suppress each other —
// the effect of Ultralytics' per-class coordinate offset (class·7680), computed without moving the
// boxes so float32 rounding of the offset coordinates cannot change an IoU; `agnostic` lets every
// box suppress every other. The result holds at most `max_det` boxes, sorted by score.
//
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include "vigil/detect/detection.h"

namespace vigil::detect {

struct NmsOptions {
  float iou = 0.7f;             // suppression threshold. Default: 0.7 (Ultralytics predict)
  int max_det = 300;            // boxes kept per image. Default: 300
  bool agnostic = false;        // suppress across classes. Default: false
  int max_candidates = 30000;   // boxes entering NMS (top by score). Default: 30000 (Ultralytics max_nms)
};

// Intersection over union of two xyxy boxes; 0 when the union is empty.
float IoU(const Detection& a, const Detection& b);

// Greedy NMS of `candidates` (any order) as described above.
std::vector<Detection> NonMaxSuppression(std::vector<Detection> candidates, const NmsOptions& options);

// End-to-end models: no suppression, the `max_det` best by score (stable), sorted by score.
std::vector<Detection> TopByScore(std::vector<Detection> candidates, int max_det);

}  // namespace vigil::detect
