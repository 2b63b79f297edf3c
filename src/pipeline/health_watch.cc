#include "vigil/pipeline/health_watch.h"

#include <cstdio>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

namespace vigil::pipeline {

HealthWatch::HealthWatch(HealthWatchOptions options)
    : edge_(std::move(options.edge)),
      reg_(*options.registry),
      clock_(options.clock != nullptr ? options.clock : SystemClock()),
      sleep_(std::move(options.sleep)) {
  if (!sleep_) sleep_ = [](std::chrono::milliseconds d) { std::this_thread::sleep_for(d); };
}

Status HealthWatch::SetFault(const char* f) {
  if (f == nullptr || *f == '\0') return absl::OkStatus();
  unsigned long long after = 0;
  int ms = 0;
  if (std::sscanf(f, "stall:%llu:%d", &after, &ms) == 2 && after > 0 && ms > 0) {
    fault_ = FaultKind::kStall;
  } else if (std::sscanf(f, "error:%llu", &after) == 1 && after > 0) {
    fault_ = FaultKind::kError;
  } else {
    return absl::InvalidArgumentError(StrCat("VIGIL_FAULT_INFERENCE='", f, "': stall:AFTER:MS or error:AFTER"));
  }
  fault_after_ = after;
  fault_ms_ = ms;
  spdlog::warn("edge '{}': fault injection on (VIGIL_FAULT_INFERENCE={}): for tests only", edge_, f);
  return absl::OkStatus();
}

void HealthWatch::set_on_unhealthy(std::function<void(const std::string&)> f, HealthBounds bounds) {
  on_unhealthy_ = std::move(f);
  bounds_ = bounds;
}

void HealthWatch::Start() {
  last_batch_ns_ = clock_->SteadyNs();
  if (on_unhealthy_) {  // scrapeable at 0 before the first time
    reg_.GetCounter("vigil_edge_unhealthy_total", "Times this edge found its inference stalled or failing (replication)");
  }
}

// An idle pool's stall clock starts with the first frame that waits (a camera that took seconds to connect, or a
// file paused by pacing, is not a stalled inference).
void HealthWatch::Pushing() {
  if (frames_pushed_.load() == frames_done_.load()) last_batch_ns_ = clock_->SteadyNs();
  ++frames_pushed_;
}

void HealthWatch::PushRefused() { --frames_pushed_; }

void HealthWatch::BatchDone(size_t frames, const Status& status) {
  frames_done_ += frames;
  last_batch_ns_ = clock_->SteadyNs();
  failed_in_row_ = status.ok() ? 0 : failed_in_row_ + 1;  // the sink thread is the only writer
  if (!status.ok()) {
    MutexLock lock(mu_);
    last_error_ = std::string(status.message());
  }
}

Status HealthWatch::BeforeBatch() {
  if (fault_ == FaultKind::kNone) return absl::OkStatus();
  const uint64_t n = ++batches_started_;
  if (fault_ == FaultKind::kStall && n == fault_after_) {
    spdlog::warn("edge '{}': VIGIL_FAULT_INFERENCE: batch {} stalls {} ms", edge_, n, fault_ms_);
    sleep_(std::chrono::milliseconds(fault_ms_));
  }
  if (fault_ == FaultKind::kError && n >= fault_after_) {
    return absl::InternalError(StrCat("injected inference error (VIGIL_FAULT_INFERENCE), batch ", n));
  }
  return absl::OkStatus();
}

// The edge's own health (a primary steps down on it): inference stalled with frames waiting, or failing batch
// after batch. Reported once per Run.
void HealthWatch::CheckHealth(int64_t now) {
  if (!on_unhealthy_ || unhealthy_reported_) return;
  HealthSample sample;
  sample.now_ns = now;
  sample.last_batch_ns = last_batch_ns_.load();
  sample.frames_done = frames_done_.load();  // before pushed: a frame counted done was counted pushed
  sample.frames_pushed = frames_pushed_.load();
  sample.failed_in_row = failed_in_row_.load();
  {
    MutexLock lock(mu_);
    sample.last_error = last_error_;
  }
  const std::string why = UnhealthyReason(sample, bounds_);
  if (why.empty()) return;
  unhealthy_reported_ = true;
  reg_.GetCounter("vigil_edge_unhealthy_total", "Times this edge found its inference stalled or failing (replication)")
      .Inc();
  spdlog::error("edge '{}': unhealthy: {}", edge_, why);
  on_unhealthy_(why);
}

// No frame processed for kStallNs while streams are active: one warning per stall, with where things stand, and
// the count of stalls.
void HealthWatch::WatchForStall(int64_t now, int active, uint64_t frames, const std::function<std::string()>& where) {
  if (frames != stall_frames_ || active == 0 || stall_since_ns_ == 0) {
    stall_frames_ = frames;
    stall_since_ns_ = now;
    stall_reported_ = false;
    return;
  }
  if (stall_reported_ || now - stall_since_ns_ < kStallNs) return;
  stall_reported_ = true;
  reg_.GetCounter("vigil_edge_stalls_total", "Times no frame was processed for 10 s while streams were active").Inc();
  spdlog::warn("edge '{}': no frame processed for {} s with {} stream(s) active ({} frames so far); {}", edge_,
               (now - stall_since_ns_) / 1'000'000'000, active, frames, where ? where() : std::string());
}

}  // namespace vigil::pipeline
