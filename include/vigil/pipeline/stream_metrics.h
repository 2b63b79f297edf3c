// vigil/pipeline/stream_metrics.h — one edge stream's metrics (edge.h lists the names): the handles, looked up
// once, and the counters sampled from the stream's reader and ledger as deltas since the last sample.
//
// Handles (any thread; metrics::Counter is thread-safe): vigil_edge_frames_total, _stream_errors_total,
// _frames_lost_on_restart_total, _takeover_replayed_frames_total, _takeover_republished_results_total,
// _frames_dropped_total{reason}, _events_total{severity}.
// Sampled (Run's thread, every ~100 ms): vigil_edge_fps (SampleFps), the backpressure drops (SampleLedger), the
// reader's queue depth, queue_full drops, decode errors, reconnects and where it decodes —
// vigil_edge_stream_decoder{decoder}, Prometheus' "info" pattern: 1 on the current decoder, 0 on an old one; a
// stream with a GPU hwaccel shows none until its Source decided (SampleReader).
// Ownership: the Edge owns one per stream; it refers to the registry (outlives it). Thread-safety: the handles
// from any thread; the Sample* calls and last_stats from one thread (Run's). Errors: none.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

#include "vigil/metrics/registry.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/transport/protocol.h"
#include "vigil/video/stats.h"

namespace vigil::pipeline {

class StreamMetrics {
 public:
  // Why a numbered frame was not processed (vigil_edge_frames_dropped_total{reason}).
  static constexpr const char* kDropReasons[] = {"queue_full", "detect_error", "backpressure", "shutdown",
                                                 "mirror_error"};

  // `stream`: its id; `hwaccel`: its configured hwaccel ("" or "cpu": the CPU decodes).
  StreamMetrics(metrics::Registry& registry, std::string stream, const std::string& hwaccel);

  metrics::Counter& frames() { return *frames_; }
  metrics::Counter& errors() { return *errors_; }
  metrics::Counter& lost_on_restart() { return *lost_on_restart_; }
  metrics::Counter& replayed() { return *replayed_; }        // the old primary's unstored pictures taken over
  metrics::Counter& republished() { return *republished_; }  // … of which re-published from its mirrored results
  // The drop counter of `reason` (one of kDropReasons; another counts as queue_full).
  metrics::Counter& dropped(std::string_view reason);
  void Event(transport::Severity severity) { events_[static_cast<int>(severity)]->Inc(); }

  // `frames` processed so far at `now` (steady ns); `last_ns`: the last time fps was due (0: none yet); `due`: a
  // second passed since: vigil_edge_fps is set (from the second time on) and the count remembered.
  void SampleFps(uint64_t frames, int64_t now, int64_t last_ns, bool due);
  void SampleLedger(const LedgerCounters& counters);
  void SampleReader(const video::StreamStats& stats);
  const video::StreamStats& last_stats() const { return last_stats_; }

 private:
  metrics::Registry& reg_;
  const std::string stream_;
  const bool gpu_requested_;
  metrics::Counter *frames_, *errors_, *decode_errors_, *reconnects_, *lost_on_restart_, *replayed_, *republished_;
  metrics::Counter* dropped_[std::size(kDropReasons)] = {};
  metrics::Counter* events_[4] = {};  // by transport::Severity
  metrics::Gauge *fps_, *reader_depth_;
  // Run's thread.
  uint64_t fps_frames_ = 0;
  video::StreamStats last_stats_;
  LedgerCounters last_counters_;
  std::string decoder_;  // the vigil_edge_stream_decoder series at 1 ("" before the first)
};

}  // namespace vigil::pipeline
