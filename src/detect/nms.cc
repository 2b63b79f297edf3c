#include "vigil/detect/nms.h"

#include <algorithm>

namespace vigil::detect {
namespace {

// Sorts by score, highest first, equal scores in input order; keeps the first `limit`.
void SortByScore(std::vector<Detection>& boxes, size_t limit) {
  std::stable_sort(boxes.begin(), boxes.end(), [](const Detection& a, const Detection& b) { return a.score > b.score; });
  if (boxes.size() > limit) boxes.resize(limit);
}

}  // namespace

float IoU(const Detection& a, const Detection& b) {
  const float iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
  const float ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  const float inter = iw > 0 && ih > 0 ? iw * ih : 0.0f;
  const float uni = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter;
  return uni > 0 ? inter / uni : 0.0f;
}

std::vector<Detection> NonMaxSuppression(std::vector<Detection> candidates, const NmsOptions& options) {
  SortByScore(candidates, static_cast<size_t>(std::max(options.max_candidates, 0)));
  std::vector<Detection> kept;
  const size_t max_det = static_cast<size_t>(std::max(options.max_det, 0));
  // Greedy in score order: a box survives when no kept box suppresses it. Stopping at max_det
  // gives the same boxes as suppressing everything and truncating afterwards.
  for (const Detection& d : candidates) {
    if (kept.size() >= max_det) break;
    const bool suppressed = std::any_of(kept.begin(), kept.end(), [&](const Detection& k) {
      return (options.agnostic || k.class_id == d.class_id) && IoU(k, d) > options.iou;
    });
    if (!suppressed) kept.push_back(d);
  }
  return kept;
}

std::vector<Detection> TopByScore(std::vector<Detection> candidates, int max_det) {
  SortByScore(candidates, static_cast<size_t>(std::max(max_det, 0)));
  return candidates;
}

}  // namespace vigil::detect
