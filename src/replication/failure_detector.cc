// The standby's failure detector (replication/failure_detector.h).
#include "vigil/replication/failure_detector.h"

#include <algorithm>
#include <cmath>

namespace vigil::replication {

Status ValidateFailureDetectorOptions(const FailureDetectorOptions& o) {
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(StrCat("failure detector: ", field, " ", why));
  };
  if (o.interval_ns <= 0) return bad("interval", "must be > 0");
  if (o.misses < 1) return bad("misses", "must be ≥ 1");
  if (!(o.phi_threshold > 0)) return bad("phi_threshold", "must be > 0");
  if (o.window < 2) return bad("window", "must be ≥ 2");
  if (o.min_std_dev_ns <= 0) return bad("min_std_dev", "must be > 0");
  if (o.acceptable_pause_ns < 0) return bad("acceptable_pause", "must be ≥ 0");
  if (o.local_pause_ns < 0) return bad("local_pause", "must be ≥ 0");
  return absl::OkStatus();
}

FailureDetector::FailureDetector(FailureDetectorOptions options, int64_t now) : opt_(options), last_(now) {}

void FailureDetector::Heartbeat(int64_t at) {
  if (at <= last_) return;
  const int64_t gap = at - last_;
  last_ = at;
  grace_granted_ = 0;  // a new silence starts: its own grace budget
  gaps_.push_back(gap);
  const double g = static_cast<double>(gap);
  sum_ += g;
  sum_sq_ += g * g;
  if (gaps_.size() > opt_.window) {
    const double old = static_cast<double>(gaps_.front());
    gaps_.pop_front();
    sum_ -= old;
    sum_sq_ -= old * old;
  }
}

double FailureDetector::mean_gap_ns() const {
  if (gaps_.empty()) return static_cast<double>(opt_.interval_ns);
  return sum_ / static_cast<double>(gaps_.size());
}

double FailureDetector::std_dev_ns() const {
  if (gaps_.empty()) return static_cast<double>(opt_.interval_ns) / 4;
  const double n = static_cast<double>(gaps_.size());
  const double mean = sum_ / n;
  return std::sqrt(std::max(0.0, sum_sq_ / n - mean * mean));
}

double FailureDetector::Phi(int64_t now) const {
  const double silent = static_cast<double>(std::max<int64_t>(0, now - last_));
  if (opt_.mode == FailureDetectorOptions::Mode::kFixed) {
    return silent / static_cast<double>(opt_.interval_ns) / opt_.misses * opt_.phi_threshold;
  }
  const double mean = mean_gap_ns() + static_cast<double>(opt_.acceptable_pause_ns);
  const double sd = std::max(std_dev_ns(), static_cast<double>(opt_.min_std_dev_ns));
  // P(gap > silent) for a normal distribution, through the logistic approximation of its CDF
  // (F(y) ≈ 1 / (1 + exp(−y (1.5976 + 0.070566 y²)))), written so neither branch loses precision.
  const double y = (silent - mean) / sd;
  const double e = std::exp(-y * (1.5976 + 0.070566 * y * y));
  const double phi = silent > mean ? -std::log10(e / (1.0 + e)) : -std::log10(1.0 - 1.0 / (1.0 + e));
  return std::isfinite(phi) ? std::max(0.0, phi) : 1e9;  // e → 0: far beyond any threshold
}

int64_t FailureDetector::Checked(int64_t due, int64_t now) {
  const int64_t threshold = opt_.local_pause_ns > 0 ? opt_.local_pause_ns : opt_.interval_ns / 2;
  const int64_t late = now - due;
  if (late <= threshold) return 0;
  ++local_pauses_;
  const int64_t budget = opt_.interval_ns * opt_.misses;
  const int64_t until = now + opt_.interval_ns;
  if (until > grace_until_ && grace_granted_ < budget) {
    const int64_t from = std::max(grace_until_, now);
    const int64_t give = std::min(until - from, budget - grace_granted_);
    grace_granted_ += give;
    grace_until_ = from + give;
  }
  return late;
}

int64_t FailureDetector::SuspectAt(int64_t now) const {
  if (Suspect(now)) return now;
  if (now < grace_until_) return SuspectAtIgnoringGrace(grace_until_);
  return SuspectAtIgnoringGrace(now);
}

int64_t FailureDetector::SuspectAtIgnoringGrace(int64_t now) const {
  const auto over = [this](int64_t t) { return Phi(t) >= opt_.phi_threshold; };
  if (over(now)) return now;
  if (opt_.mode == FailureDetectorOptions::Mode::kFixed) return last_ + opt_.interval_ns * opt_.misses;
  // φ grows monotonically with silence: bisect for the first nanosecond at the threshold.
  int64_t lo = now, hi = now + opt_.interval_ns;
  while (!over(hi)) hi = now + 2 * (hi - now);
  while (hi - lo > 1000) {  // 1 µs is precise enough to wait on
    const int64_t mid = lo + (hi - lo) / 2;
    (over(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace vigil::replication
