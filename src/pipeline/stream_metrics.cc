#include "vigil/pipeline/stream_metrics.h"

#include <utility>

namespace vigil::pipeline {

StreamMetrics::StreamMetrics(metrics::Registry& reg, std::string stream, const std::string& hwaccel)
    : reg_(reg), stream_(std::move(stream)), gpu_requested_(!hwaccel.empty() && hwaccel != "cpu") {
  const metrics::Labels labels{{"stream", stream_}};
  frames_ = &reg_.GetCounter("vigil_edge_frames_total", "Frames processed and reported", labels);
  errors_ = &reg_.GetCounter("vigil_edge_stream_errors_total", "Streams that failed to open or ended with an error", labels);
  decode_errors_ = &reg_.GetCounter("vigil_edge_decode_errors_total", "Corrupt packets, frames or images, per stream", labels);
  reconnects_ = &reg_.GetCounter("vigil_edge_reconnects_total", "Successful reconnects of network sources", labels);
  lost_on_restart_ = &reg_.GetCounter("vigil_edge_frames_lost_on_restart_total",
                                      "Seqs a previous instance numbered and never delivered (reported as lost)", labels);
  replayed_ = &reg_.GetCounter("vigil_edge_takeover_replayed_frames_total",
                               "The old primary's mirrored frames the aggregator lacked, taken over after a takeover: "
                               "processed again, or re-published from its mirrored results",
                               labels);
  republished_ = &reg_.GetCounter("vigil_edge_takeover_republished_results_total",
                                  "Of the frames taken over, those whose detections were re-published from the old "
                                  "primary's mirrored results (replication.mirror_results) instead of processed again",
                                  labels);
  for (size_t r = 0; r < std::size(kDropReasons); ++r) {
    dropped_[r] = &reg_.GetCounter("vigil_edge_frames_dropped_total", "Frames numbered but not processed, by reason",
                                   {{"stream", stream_}, {"reason", kDropReasons[r]}});
  }
  for (transport::Severity sev : {transport::Severity::kNone, transport::Severity::kInfo, transport::Severity::kWarning,
                                  transport::Severity::kCritical}) {
    events_[static_cast<int>(sev)] = &reg_.GetCounter(
        "vigil_edge_events_total", "Events raised", {{"stream", stream_}, {"severity", std::string(transport::ToString(sev))}});
  }
  fps_ = &reg_.GetGauge("vigil_edge_fps", "Frames processed per second, per stream", labels);
  reader_depth_ = &reg_.GetGauge("vigil_edge_queue_depth", "Frames or reports waiting, by queue",
                                 {{"queue", "reader"}, {"stream", stream_}});
}

metrics::Counter& StreamMetrics::dropped(std::string_view reason) {
  for (size_t r = 0; r < std::size(kDropReasons); ++r) {
    if (reason == kDropReasons[r]) return *dropped_[r];
  }
  return *dropped_[0];
}

void StreamMetrics::SampleFps(uint64_t frames, int64_t now, int64_t last_ns, bool due) {
  if (!due) return;
  if (last_ns != 0) fps_->Set(static_cast<double>(frames - fps_frames_) * 1e9 / static_cast<double>(now - last_ns));
  fps_frames_ = frames;
}

void StreamMetrics::SampleLedger(const LedgerCounters& c) {
  dropped("backpressure").Inc(static_cast<double>(c.backpressure_drops - last_counters_.backpressure_drops));
  last_counters_ = c;
}

void StreamMetrics::SampleReader(const video::StreamStats& st) {
  reader_depth_->Set(static_cast<double>(st.queue_depth));
  // Where the stream decodes, Prometheus' "info" pattern: 1 on the current decoder's series, 0 on an old one.
  // A stream with hwaccel reports nothing until its Source has decided (StreamStats::hwaccel, first picture).
  const std::string where = !st.hwaccel.empty() ? st.hwaccel : gpu_requested_ ? std::string() : std::string("cpu");
  if (!where.empty() && where != decoder_) {
    auto decoder = [&](const std::string& d) -> metrics::Gauge& {
      return reg_.GetGauge("vigil_edge_stream_decoder", "1 on where the stream decodes now: cpu, cuda:N, cpu (why)",
                           {{"stream", stream_}, {"decoder", d}});
    };
    if (!decoder_.empty()) decoder(decoder_).Set(0);
    decoder(where).Set(1);
    decoder_ = where;
  }
  auto delta = [](uint64_t now_v, uint64_t before) { return static_cast<double>(now_v - before); };
  dropped("queue_full").Inc(delta(st.dropped_queue_full, last_stats_.dropped_queue_full));
  decode_errors_->Inc(delta(st.decode_errors, last_stats_.decode_errors));
  reconnects_->Inc(delta(st.reconnects, last_stats_.reconnects));
  last_stats_ = st;
}

}  // namespace vigil::pipeline
