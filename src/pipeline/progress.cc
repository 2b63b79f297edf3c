#include "vigil/pipeline/progress.h"

#include <utility>

namespace vigil::pipeline {

std::optional<transport::Report> ProgressCoalescer::Add(uint64_t seq, int64_t capture_ns, int64_t pts_ns,
                                                        uint32_t width, uint32_t height, int64_t now_ns) {
  if (pending_ && pending_->seq_last + 1 == seq) {
    pending_->seq_last = seq;
    return std::nullopt;
  }
  std::optional<transport::Report> done = Take();
  transport::Report r;
  r.stream = stream_;
  r.run = run_;
  r.seq_first = r.seq_last = seq;
  r.kind = transport::ReportKind::kProgress;
  r.capture_ns = capture_ns;
  r.pts_ns = pts_ns;
  r.width = width;
  r.height = height;
  pending_ = std::move(r);
  started_ns_ = now_ns;
  return done;
}

std::optional<transport::Report> ProgressCoalescer::TakeIfOlder(int64_t now_ns, int64_t max_age_ns) {
  if (pending_ && now_ns - started_ns_ >= max_age_ns) return Take();
  return std::nullopt;
}

std::optional<transport::Report> ProgressCoalescer::Take() { return std::exchange(pending_, std::nullopt); }

}  // namespace vigil::pipeline
