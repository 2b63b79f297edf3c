// The edge's sink side (detection_sink.h) with a real ledger on an in-memory store, a FakeClock and recording
// hooks: what a detected batch and a failed one become (ledger reports, counters, stage metrics, the standby's
// results), and the frame-to-ack tallies. No process, no model.
#include "vigil/pipeline/detection_sink.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;

const std::vector<std::string> kNames = {"person", "bicycle", "car"};
const detect::Detection kPerson{10, 20, 30, 40, 0.9f, 0};
const detect::Detection kCar{1, 2, 3, 4, 0.8f, 2};

uint64_t Count(metrics::Registry& reg, const std::string& name, std::vector<double> buckets, metrics::Labels labels) {
  return reg.GetHistogram(name, "", std::move(buckets), std::move(labels)).Snap().cumulative.back();
}
uint64_t StageCount(metrics::Registry& reg, const char* stage) {
  return Count(reg, "vigil_edge_stage_seconds", metrics::LatencyBuckets(), {{"stage", stage}});
}

struct Fixture {
  FakeClock clock;
  metrics::Registry reg;
  HealthWatch health{HealthWatchOptions{"e1", &reg, &clock, {}}};
  TakeoverController takeover{"e1", reg, &clock};
  std::unique_ptr<StreamLedger> ledger;
  StreamMetrics file_metrics{reg, "a", ""}, camera_metrics{reg, "b", ""};
  std::vector<BatchResult> detected;  // on_detected
  std::vector<std::pair<size_t, uint64_t>> mirrored;  // mirror_result: (stream, seq)
  std::unique_ptr<DetectionSink> sink;

  Fixture() {
    RulesConfig persons;
    persons.classes = {"person"};
    LedgerOptions o;
    o.clock = &clock;
    o.store = MakeMemoryStateStore(std::make_shared<MemoryState>());
    o.progress_flush = milliseconds(500);
    o.persist_interval = std::chrono::hours(1);
    o.replayable_wait = milliseconds(0);
    std::vector<LedgerStream> streams;
    streams.push_back({"a", "/videos/a.mp4", false, *RuleEngine::Create(persons, kNames), std::nullopt});
    streams.push_back({"b", "rtsp://10.0.0.1/b", true, *RuleEngine::Create(persons, kNames), std::nullopt});
    ledger = std::move(*StreamLedger::Open(std::move(o), std::move(streams)));
    ledger->Admit({7, {}});
    DetectionSinkOptions so;
    so.devices = {"cpu"};
    so.registry = &reg;
    so.clock = &clock;
    so.health = &health;
    so.takeover = &takeover;
    so.on_detected = [this](const BatchResult& r) { detected.push_back(BatchResult{r.items, r.status, r.detections}); };
    so.mirror_result = [this](size_t stream, const FrameInfo& info, std::span<const detect::Detection>) {
      mirrored.emplace_back(stream, info.seq);
    };
    sink = std::make_unique<DetectionSink>(std::move(so));
    sink->Open({{"a", &file_metrics, false, {}}, {"b", &camera_metrics, false, {}}});
    sink->set_ledger(ledger.get());
  }

  // A detected batch: frame seq of `stream` with `dets`, released by its source at `source_ns`.
  static void Add(BatchResult& r, size_t stream, uint64_t seq, std::vector<detect::Detection> dets, int64_t source_ns) {
    WorkItem item;
    item.stream = stream;
    item.frame.seq = seq;
    item.frame.width = 640;
    item.frame.height = 480;
    item.frame.source_steady_ns = source_ns;
    item.frame.decode_ns = 1'000'000;
    r.items.push_back(std::move(item));
    r.detections.push_back(std::move(dets));
    r.timing.push_back({2'000'000, 8'000'000, 1'000'000, 2});
  }
};

std::vector<transport::Report> Pending(StreamLedger& l) {
  std::vector<transport::Report> out;
  for (const auto& m : l.outbox().PendingFrom(0, 1000)) out.push_back(m->report);
  return out;
}

TEST(DetectionSink, ADetectedBatchGoesThroughTheLedgerTheCountersAndTheStageMetrics) {
  Fixture f;
  const int64_t t0 = f.clock.SteadyNs();
  BatchResult r;
  Fixture::Add(r, 0, 0, {kPerson}, t0);
  Fixture::Add(r, 1, 0, {kCar}, t0);
  r.started_ns = t0 + 3'000'000;
  r.detected_ns = t0 + 15'000'000;
  f.sink->OnBatch(r);

  // The file's person is an event (one report out); the camera's car is a pending progress mark.
  const std::vector<transport::Report> out = Pending(*f.ledger);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].stream, "a");
  EXPECT_EQ(out[0].run, 7u);
  EXPECT_EQ(out[0].seq_first, 0u);
  EXPECT_EQ(f.file_metrics.frames().Value(), 1);
  EXPECT_EQ(f.camera_metrics.frames().Value(), 1);
  EXPECT_EQ(f.sink->frames(), 2u);
  // Per frame: decode, queue, preprocess, inference, postprocess, rules, frame_to_detection; per batch: its size.
  for (const char* stage : {"decode", "queue", "preprocess", "inference", "postprocess", "rules"}) {
    EXPECT_EQ(StageCount(f.reg, stage), 2u) << stage;
  }
  EXPECT_EQ(StageCount(f.reg, "publish"), 1u) << "only the event was handed to the outbox";
  EXPECT_EQ(Count(f.reg, "vigil_edge_frame_to_detection_seconds", metrics::LatencyBuckets(), {}), 2u);
  EXPECT_EQ(Count(f.reg, "vigil_edge_batch_frames", {1, 2, 4, 8, 16, 32, 64, 128, 256}, {}), 1u);
  // Engine time: each frame's 8 ms inference shared by the 2 images of its chunk.
  EXPECT_DOUBLE_EQ(f.reg.GetCounter("vigil_edge_engine_busy_seconds_total", "").Value(), 0.008);
  ASSERT_EQ(f.detected.size(), 1u);
  EXPECT_EQ(f.detected[0].items.size(), 2u);
  EXPECT_EQ(f.mirrored, (std::vector<std::pair<size_t, uint64_t>>{{0, 0}, {1, 0}}));
}

TEST(DetectionSink, AFailedBatchBecomesDetectErrorDropMarks) {
  Fixture f;
  BatchResult r;
  Fixture::Add(r, 1, 0, {}, f.clock.SteadyNs());
  Fixture::Add(r, 1, 1, {}, f.clock.SteadyNs());
  r.detections.clear();
  r.timing.clear();
  r.status = absl::InternalError("engine on fire");
  f.sink->OnBatch(r);
  EXPECT_EQ(f.camera_metrics.dropped("detect_error").Value(), 2);
  EXPECT_EQ(f.camera_metrics.frames().Value(), 0);
  EXPECT_EQ(f.sink->frames(), 0u);
  EXPECT_TRUE(f.detected.empty()) << "a failed batch reaches no on_detected";
  EXPECT_TRUE(f.mirrored.empty());
  f.ledger->Tick(/*force=*/true);
  const std::vector<transport::Report> out = Pending(*f.ledger);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, transport::ReportKind::kDropped);
  EXPECT_EQ(out[0].seq_first, 0u);
  EXPECT_EQ(out[0].seq_last, 1u);
  EXPECT_EQ(StageCount(f.reg, "decode"), 0u);
}

TEST(DetectionSink, FrameToAckIsObservedForTheFramesAnAckCovers) {
  Fixture f;
  const int64_t t0 = f.clock.SteadyNs();
  for (uint64_t seq = 0; seq < 3; ++seq) {
    f.sink->RecordFrame(1, {seq, 0, 0, 640, 480}, std::vector<detect::Detection>{kCar}, nullptr,
                        t0 + static_cast<int64_t>(seq) * 1'000'000);
  }
  EXPECT_EQ(f.sink->unacked(1), 3u);
  EXPECT_EQ(f.sink->Acked(1, std::nullopt, t0 + 50'000'000), 3u) << "nothing acknowledged: nothing observed";
  EXPECT_EQ(StageCount(f.reg, "frame_to_ack"), 0u);
  EXPECT_EQ(f.sink->Acked(1, 1, t0 + 50'000'000), 3u);
  EXPECT_EQ(f.sink->unacked(1), 1u);
  const metrics::Histogram::Snapshot h =
      f.reg.GetHistogram("vigil_edge_stage_seconds", "", metrics::LatencyBuckets(), {{"stage", "frame_to_ack"}}).Snap();
  EXPECT_EQ(h.cumulative.back(), 2u);
  EXPECT_NEAR(h.sum, 0.050 + 0.049, 1e-9);
  EXPECT_EQ(f.sink->unacked(0), 0u);
  EXPECT_EQ(f.sink->Acked(0, 5, t0), 0u);
}

}  // namespace
}  // namespace vigil::pipeline
