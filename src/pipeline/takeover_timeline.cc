#include "vigil/pipeline/takeover_timeline.h"

#include <cstdio>

namespace vigil::pipeline {

const char* TakeoverTimeline::Name(Phase p) {
  static const char* const kNames[kPhases] = {"decided",  "drained", "serving", "ledger",
                                              "welcomed", "durable", "resumed", "fed",
                                              "detected", "stored",  "republished", "republished_stored"};
  return p < kPhases ? kNames[p] : "?";
}

void TakeoverTimeline::Start(int64_t contact_ns) {
  for (auto& a : at_) a.store(0, std::memory_order_relaxed);
  contact_ns_.store(contact_ns, std::memory_order_release);
}

bool TakeoverTimeline::Mark(Phase p, int64_t now_ns) {
  if (p >= kPhases || !started()) return false;
  if (at_[p].load(std::memory_order_relaxed) != 0) return false;  // the common case: one load, no write
  int64_t expected = 0;
  return at_[p].compare_exchange_strong(expected, now_ns, std::memory_order_acq_rel);
}

std::optional<double> TakeoverTimeline::Seconds(Phase p) const {
  if (p >= kPhases || !started()) return std::nullopt;
  const int64_t at = at_[p].load(std::memory_order_acquire);
  if (at == 0) return std::nullopt;
  return static_cast<double>(at - contact_ns_.load(std::memory_order_acquire)) * 1e-9;
}

std::string TakeoverTimeline::Format() const {
  std::string out;
  for (size_t i = 0; i < kPhases; ++i) {
    const Phase p = static_cast<Phase>(i);
    if (!out.empty()) out += ", ";
    out += Name(p);
    out += ' ';
    if (std::optional<double> s = Seconds(p)) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.1f", *s * 1e3);
      out += buf;
    } else {
      out += '-';
    }
  }
  return out;
}

}  // namespace vigil::pipeline
