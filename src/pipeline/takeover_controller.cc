#include "vigil/pipeline/takeover_controller.h"

#include <utility>

#include <spdlog/spdlog.h>

#include "vigil/common/status.h"

namespace vigil::pipeline {
namespace {

constexpr const char* kPhaseHelp =
    "The last takeover, step by step: seconds from the old primary's last contact to each step "
    "(pipeline/takeover_timeline.h)";

}  // namespace

TakeoverController::TakeoverController(std::string edge, metrics::Registry& registry, Clock* clock)
    : edge_(std::move(edge)), reg_(registry), clock_(clock != nullptr ? clock : SystemClock()) {}

bool TakeoverController::Covers(const transport::Ack& a, const std::optional<FrameKey>& key) {
  return key && a.stream == key->stream && a.run == key->run && a.seq_first <= key->seq && key->seq <= a.seq_last;
}

bool TakeoverController::FirstBatch(const BatchResult& r, const std::string& stream) {
  if (!timeline_.started() || r.items.empty() || !Mark(TakeoverTimeline::kDetected)) return false;
  const video::Frame& f = r.items.front().frame;
  MutexLock lock(mu_);
  first_processed_ = FrameKey{edge_, stream, f.run, f.seq};
  // Where the first batch's time went ("detected" is the takeover's slowest step): its wait in the queue, and the
  // worker's own stages.
  const detect::DetectTiming t = r.timing.empty() ? detect::DetectTiming{} : r.timing.front();
  spdlog::info("takeover: first batch on worker {}: {} frames, waited {:.1f} ms in the queue, {:.1f} ms in the worker "
               "(preprocess {:.1f}, inference {:.1f}, postprocess {:.1f} ms of its first frame)",
               r.worker, r.items.size(), static_cast<double>(r.started_ns - f.source_steady_ns) * 1e-6,
               static_cast<double>(r.detected_ns - r.started_ns) * 1e-6, static_cast<double>(t.preprocess_ns) * 1e-6,
               static_cast<double>(t.inference_ns) * 1e-6, static_cast<double>(t.postprocess_ns) * 1e-6);
  return true;
}

std::optional<FrameKey> TakeoverController::first_processed() const {
  MutexLock lock(mu_);
  return first_processed_;
}

void TakeoverController::Republishing(const FrameKey& key) {
  if (!timeline_.started()) return;
  MutexLock lock(mu_);
  if (Mark(TakeoverTimeline::kRepublished)) first_republished_ = key;
}

void TakeoverController::OnAck(const transport::Ack& a) {
  if (timeline_.Seconds(TakeoverTimeline::kRepublished) && !timeline_.Seconds(TakeoverTimeline::kRepublishedStored)) {
    MutexLock lock(mu_);
    if (Covers(a, first_republished_) && Mark(TakeoverTimeline::kRepublishedStored)) LogRepublishedStored();
  }
  if (timeline_.started() && !timeline_.Seconds(TakeoverTimeline::kStored)) {
    // The takeover is complete when the first frame this node processed is stored (a lost or drop mark stored
    // before it is not a detection).
    MutexLock lock(mu_);
    const bool covers = Covers(a, first_processed_);
    lock.Unlock();
    if (covers && Mark(TakeoverTimeline::kStored)) LogTimeline();
  }
}

void TakeoverController::FirstLiveFrame(const std::string& stream, uint64_t seq) {
  if (!contact_ || contact_->load() <= 0) return;
  // Camera time no node saw: from the old primary's last contact to this node's first picture (its
  // numbered-but-unstored frames are reported apart, as lost_on_restart).
  const double gap_s = static_cast<double>(clock_->SteadyNs() - contact_->load()) * 1e-9;
  reg_.GetGauge("vigil_edge_takeover_camera_gap_seconds",
                "Live camera time missed by the last takeover: the old primary's last contact to this node's "
                "first frame",
                {{"stream", stream}})
      .Set(gap_s);
  spdlog::warn("stream '{}': {} ms of camera time missed in the takeover (the old primary's last contact to "
               "this node's first frame, seq {})",
               stream, static_cast<int64_t>(gap_s * 1000), seq);
}

// The old primary's own results re-published and stored: said on its own (a takeover whose camera ended may never
// process a picture of its own, and then logs no timeline line).
void TakeoverController::LogRepublishedStored() {
  for (const TakeoverTimeline::Phase p : {TakeoverTimeline::kRepublished, TakeoverTimeline::kRepublishedStored}) {
    reg_.GetGauge("vigil_edge_takeover_phase_seconds", kPhaseHelp, {{"phase", TakeoverTimeline::Name(p)}})
        .Set(timeline_.Seconds(p).value_or(0));
  }
  spdlog::info("edge '{}': takeover: the old primary's own results re-published at {:.1f} ms and the first stored at "
               "{:.1f} ms after its last contact",
               edge_, timeline_.Seconds(TakeoverTimeline::kRepublished).value_or(0) * 1e3,
               timeline_.Seconds(TakeoverTimeline::kRepublishedStored).value_or(0) * 1e3);
}

void TakeoverController::LogTimeline() {
  for (size_t i = 0; i < TakeoverTimeline::kPhases; ++i) {
    const auto p = static_cast<TakeoverTimeline::Phase>(i);
    if (std::optional<double> s = timeline_.Seconds(p)) {
      reg_.GetGauge("vigil_edge_takeover_phase_seconds", kPhaseHelp, {{"phase", TakeoverTimeline::Name(p)}}).Set(*s);
    }
  }
  const double stored_s = timeline_.Seconds(TakeoverTimeline::kStored).value_or(0);
  reg_.GetGauge("vigil_edge_takeover_seconds",
                "The primary's last contact to the first frame this edge processed stored, last takeover")
      .Set(stored_s);
  const std::optional<double> republished_s = timeline_.Seconds(TakeoverTimeline::kRepublishedStored);
  spdlog::warn("replication: takeover of edge '{}' complete: first report stored {} ms after the primary's last "
               "contact{}",
               edge_, static_cast<int64_t>(stored_s * 1000),
               republished_s ? StrCat(" (the old primary's own results, re-published, from ",
                                      static_cast<int64_t>(*republished_s * 1000), " ms)")
                             : std::string());
  spdlog::info("edge '{}': takeover timeline, ms after the old primary's last contact: {}", edge_, timeline_.Format());
}

}  // namespace vigil::pipeline
