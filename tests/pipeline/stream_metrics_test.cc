// One stream's metrics (stream_metrics.h) from hand-made reader and ledger stats: deltas, fps, the decoder info
// gauge. No reader, no clock: times are given.
#include "vigil/pipeline/stream_metrics.h"

#include <gtest/gtest.h>

namespace vigil::pipeline {
namespace {

TEST(StreamMetrics, CountersAreTheDeltasOfWhatTheReaderAndLedgerCounted) {
  metrics::Registry reg;
  StreamMetrics m(reg, "cam", "");
  auto counter = [&](const char* name, metrics::Labels l) { return reg.GetCounter(name, "", std::move(l)).Value(); };
  video::StreamStats st;
  st.dropped_queue_full = 3;
  st.decode_errors = 1;
  st.reconnects = 2;
  st.queue_depth = 4;
  m.SampleReader(st);
  st.dropped_queue_full = 5;
  st.decode_errors = 1;
  st.reconnects = 3;
  m.SampleReader(st);
  EXPECT_EQ(counter("vigil_edge_frames_dropped_total", {{"stream", "cam"}, {"reason", "queue_full"}}), 5);
  EXPECT_EQ(counter("vigil_edge_decode_errors_total", {{"stream", "cam"}}), 1);
  EXPECT_EQ(counter("vigil_edge_reconnects_total", {{"stream", "cam"}}), 3);
  EXPECT_EQ(reg.GetGauge("vigil_edge_queue_depth", "", {{"queue", "reader"}, {"stream", "cam"}}).Value(), 4);
  LedgerCounters c;
  c.backpressure_drops = 2;
  m.SampleLedger(c);
  c.backpressure_drops = 7;
  m.SampleLedger(c);
  EXPECT_EQ(counter("vigil_edge_frames_dropped_total", {{"stream", "cam"}, {"reason", "backpressure"}}), 7);
  m.dropped("shutdown").Inc();
  m.dropped("no such reason").Inc();  // counted as queue_full
  EXPECT_EQ(counter("vigil_edge_frames_dropped_total", {{"stream", "cam"}, {"reason", "shutdown"}}), 1);
  EXPECT_EQ(counter("vigil_edge_frames_dropped_total", {{"stream", "cam"}, {"reason", "queue_full"}}), 6);
  m.Event(transport::Severity::kWarning);
  EXPECT_EQ(counter("vigil_edge_events_total", {{"stream", "cam"}, {"severity", "warning"}}), 1);
}

TEST(StreamMetrics, FpsIsFramesPerSecondBetweenDueSamples) {
  metrics::Registry reg;
  StreamMetrics m(reg, "cam", "");
  const int64_t s = 1'000'000'000;
  m.SampleFps(10, 5 * s, /*last_ns=*/0, /*due=*/true);  // the first: remembered, not set
  EXPECT_EQ(reg.GetGauge("vigil_edge_fps", "", {{"stream", "cam"}}).Value(), 0);
  m.SampleFps(25, 5 * s + s / 2, 5 * s, /*due=*/false);  // not due: nothing
  m.SampleFps(40, 7 * s, 5 * s, /*due=*/true);
  EXPECT_DOUBLE_EQ(reg.GetGauge("vigil_edge_fps", "", {{"stream", "cam"}}).Value(), 15);
}

TEST(StreamMetrics, TheDecoderGaugeFollowsWhereTheStreamDecodes) {
  metrics::Registry reg;
  StreamMetrics m(reg, "cam", "cuda");
  auto decoder = [&](const char* d) {
    return reg.GetGauge("vigil_edge_stream_decoder", "", {{"stream", "cam"}, {"decoder", d}}).Value();
  };
  video::StreamStats st;
  m.SampleReader(st);  // a GPU requested and not decided yet: no series
  EXPECT_EQ(decoder("cpu"), 0);
  st.hwaccel = "cuda:0";
  m.SampleReader(st);
  EXPECT_EQ(decoder("cuda:0"), 1);
  st.hwaccel = "cpu (no NVDEC)";
  m.SampleReader(st);
  EXPECT_EQ(decoder("cuda:0"), 0);
  EXPECT_EQ(decoder("cpu (no NVDEC)"), 1);
  StreamMetrics cpu(reg, "file", "");
  cpu.SampleReader(video::StreamStats{});
  EXPECT_EQ(reg.GetGauge("vigil_edge_stream_decoder", "", {{"stream", "file"}, {"decoder", "cpu"}}).Value(), 1);
}

}  // namespace
}  // namespace vigil::pipeline
