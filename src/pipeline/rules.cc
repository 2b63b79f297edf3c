#include "vigil/pipeline/rules.h"

#include <algorithm>
#include <charconv>

namespace vigil::pipeline {

bool PointInPolygon(const Polygon& polygon, double x, double y) {
  bool inside = false;
  for (size_t i = 0, j = polygon.size() - 1; i < polygon.size(); j = i++) {
    const Point& a = polygon[i];
    const Point& b = polygon[j];
    if ((a.y > y) != (b.y > y) && x < (b.x - a.x) * (y - a.y) / (b.y - a.y) + a.x) inside = !inside;
  }
  return inside;
}

StatusOr<RuleEngine> RuleEngine::Create(const RulesConfig& config, const std::vector<std::string>& class_names) {
  RuleEngine r;
  r.config_ = config;
  if (!config.classes.empty()) r.allowed_.assign(class_names.size(), false);
  for (const std::string& c : config.classes) {
    int id = -1;
    auto [end, ec] = std::from_chars(c.data(), c.data() + c.size(), id);
    if (ec != std::errc() || end != c.data() + c.size()) {
      auto it = std::find(class_names.begin(), class_names.end(), c);
      id = it == class_names.end() ? -1 : static_cast<int>(it - class_names.begin());
    }
    if (id < 0 || id >= static_cast<int>(class_names.size())) {
      return absl::InvalidArgumentError("rules: class '" + c + "' is not a class of the model (" +
                                        std::to_string(class_names.size()) + " classes)");
    }
    r.allowed_[static_cast<size_t>(id)] = true;
  }
  return r;
}

Verdict RuleEngine::Evaluate(const std::vector<detect::Detection>& detections, int64_t pts_ns) {
  Verdict v;
  float best = 0;
  for (const detect::Detection& d : detections) {
    if (!allowed_.empty() && (d.class_id < 0 || d.class_id >= static_cast<int>(allowed_.size()) ||
                              !allowed_[static_cast<size_t>(d.class_id)])) {
      continue;
    }
    if (d.score < static_cast<float>(config_.min_score)) continue;  // thresholds compared as scores are: float
    if (!config_.roi.empty()) {
      const double cx = (d.x1 + d.x2) / 2.0, cy = (d.y1 + d.y2) / 2.0;
      if (std::none_of(config_.roi.begin(), config_.roi.end(),
                       [&](const Polygon& p) { return PointInPolygon(p, cx, cy); })) {
        continue;
      }
    }
    best = std::max(best, d.score);
    v.detections.push_back(d);
  }
  const bool qualified = !v.detections.empty();
  window_.push_back(qualified);
  if (window_.size() > static_cast<size_t>(config_.confirm_m)) window_.pop_front();
  const auto hits = std::count(window_.begin(), window_.end(), true);
  const bool cooling = have_event_ && pts_ns < last_event_pts_ns_ + static_cast<int64_t>(config_.cooldown_s * 1e9);
  if (qualified && hits >= config_.confirm_k && !cooling) {
    v.event = true;
    have_event_ = true;
    last_event_pts_ns_ = pts_ns;
    v.severity = best >= static_cast<float>(config_.critical)  ? transport::Severity::kCritical
                 : best >= static_cast<float>(config_.warning) ? transport::Severity::kWarning
                                           : transport::Severity::kInfo;
  }
  return v;
}

}  // namespace vigil::pipeline
