// vigil/pipeline/progress.h — coalescing a stream's progress marks into seq ranges.
//
// Frames without an event are reported as progress marks; consecutive seqs (s, s+1, ...) of one
// (stream, run) are merged into one progress Report seq_first..seq_last. A range is handed out
// (returned) when the next mark does not continue it, when it is older than the flush interval
// (TakeIfOlder, called periodically), or on Take (before an event of the same stream, so that reports
// leave in seq order, and at shutdown). The returned Report has kind kProgress, capture/pts of its
// first frame and the frame size; edge and epoch are stamped by the publisher.
//
// Thread-safety: none; one per stream, one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "vigil/transport/protocol.h"

namespace vigil::pipeline {

class ProgressCoalescer {
 public:
  ProgressCoalescer(std::string stream, uint64_t run) : stream_(std::move(stream)), run_(run) {}

  // Adds frame `seq`; returns the previous range when `seq` does not extend it. now_ns: any monotonic
  // clock, the same as TakeIfOlder's.
  std::optional<transport::Report> Add(uint64_t seq, int64_t capture_ns, int64_t pts_ns, uint32_t width,
                                       uint32_t height, int64_t now_ns);
  // The pending range when it was started more than max_age_ns before now_ns.
  std::optional<transport::Report> TakeIfOlder(int64_t now_ns, int64_t max_age_ns);
  // The pending range, if any.
  std::optional<transport::Report> Take();

 private:
  std::string stream_;
  uint64_t run_;
  std::optional<transport::Report> pending_;
  int64_t started_ns_ = 0;
};

}  // namespace vigil::pipeline
