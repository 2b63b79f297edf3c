// The edge's own health (health.h).
#include "vigil/pipeline/health.h"

#include "vigil/common/status.h"

namespace vigil::pipeline {

std::string UnhealthyReason(const HealthSample& s, const HealthBounds& bounds) {
  if (bounds.errors > 0 && s.failed_in_row >= bounds.errors) {
    return StrCat(s.failed_in_row, " inference batches in a row failed (the last: ", s.last_error, ")");
  }
  if (bounds.stall_ms > 0 && s.frames_pushed > s.frames_done) {
    const int64_t idle_ms = (s.now_ns - s.last_batch_ns) / 1'000'000;
    if (idle_ms >= bounds.stall_ms) {
      return StrCat("no inference batch completed for ", idle_ms, " ms with ", s.frames_pushed - s.frames_done,
                    " frame(s) waiting");
    }
  }
  return "";
}

}  // namespace vigil::pipeline
