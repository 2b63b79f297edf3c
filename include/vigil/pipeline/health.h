// vigil/pipeline/health.h — the edge's own health, as a primary judges it before it steps down (issue 16).
//
// UnhealthyReason looks at one sample of what the edge's worker pool did and says why the edge is unhealthy,
// or "" when it is not. Time comes in with the sample (steady-clock nanoseconds): the edge passes its
// periodic tick's clock reading, tests pass whatever times they need (no sleeps).
//
// Thread-safety: a pure function. Errors: none.
#pragma once

#include <cstdint>
#include <string>

namespace vigil::pipeline {

struct HealthSample {
  int64_t now_ns = 0;            // the clock reading of this sample
  int64_t last_batch_ns = 0;     // when the last batch result came, or the first frame reached an idle pool
  uint64_t frames_pushed = 0;    // frames handed to the worker pool so far
  uint64_t frames_done = 0;      // of them, frames whose batch result came (detected or failed)
  int failed_in_row = 0;         // batches failed since the last one that did not
  std::string last_error;        // the last failed batch's status message
};

struct HealthBounds {
  int stall_ms = 3000;  // no batch result for this long while frames wait: unhealthy. 0: never
  int errors = 3;       // this many failed batches in a row: unhealthy. 0: never
};

// "" when healthy; else why, e.g. "no inference batch completed for 3012 ms with 7 frame(s) waiting" or
// "3 inference batches in a row failed (the last: cudaErrorIllegalAddress ...)". Failing batches are
// reported before a stall. Idle (nothing waiting) is never a stall.
std::string UnhealthyReason(const HealthSample& s, const HealthBounds& bounds);

}  // namespace vigil::pipeline
