// vigil/pipeline/rules.h — per-stream event rules: which frames become events.
//
// A detection qualifies when its class is in the allow-list (empty = all), score >= min_score, and —
// when ROI polygons are given — its box centre ((x1+x2)/2, (y1+y2)/2, source pixels) lies inside at
// least one polygon (even-odd rule, W. R. Franklin's PNPOLY crossing test; a point exactly on an edge
// may fall either way). A frame qualifies when it has at least one qualifying detection.
// K-of-M confirmation: a qualifying frame raises an event only when at least k of the last m frames
// (itself included) qualified. Cooldown: after an event at stream time t (pts), no event is raised for
// frames with pts < t + cooldown_s. Severity comes from the best qualifying score (edge_config.h).
//
// Thread-safety: a RuleEngine holds per-stream state; one thread at a time.
// Errors: Create returns InvalidArgument for a class name the model does not know.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/detect/detection.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/transport/protocol.h"

namespace vigil::pipeline {

// True when (x, y) is inside `polygon` (even-odd rule).
bool PointInPolygon(const Polygon& polygon, double x, double y);

struct Verdict {
  bool event = false;
  transport::Severity severity = transport::Severity::kNone;
  std::vector<detect::Detection> detections;  // the qualifying detections (also when no event is raised)
};

class RuleEngine {
 public:
  // `class_names`: the model's names, index = class id; rule classes are names or decimal ids.
  static StatusOr<RuleEngine> Create(const RulesConfig& config, const std::vector<std::string>& class_names);

  // Evaluates the next frame of the stream (frames in seq order); pts_ns: the frame's stream time.
  Verdict Evaluate(const std::vector<detect::Detection>& detections, int64_t pts_ns);

 private:
  RulesConfig config_;
  std::vector<bool> allowed_;  // by class id; empty = all
  std::deque<bool> window_;    // last confirm_m frames: qualified?
  bool have_event_ = false;
  int64_t last_event_pts_ns_ = 0;
};

}  // namespace vigil::pipeline
