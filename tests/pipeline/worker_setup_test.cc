// The edge's engine set-up (worker_setup.h) on the stand-in YOLO (CPU detectors, no model file, no GPU): the
// decoding GPUs the streams name, the loaded pool and what the decoders learn of it, the warm-up runs and the
// placement plan. No process.
#include "vigil/pipeline/worker_setup.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "testing/fake_yolo.h"
#include "vigil/infer/engine.h"

namespace vigil::pipeline {
namespace {

LoadDetector FakeDetectors(int* loaded) {
  return [loaded](const std::string& device, size_t) -> StatusOr<std::unique_ptr<detect::Detector>> {
    EXPECT_EQ(device, "cpu");
    ++*loaded;
    detect::DetectorOptions d;
    d.engine.threads = 1;
    d.engine.batch = 1;
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<infer::Engine> engine,
                           infer::Engine::FromGraph(testing_fakes::FakeYolo(DType::kFloat32), d.engine, "fake_yolo"));
    return detect::Detector::Create(std::move(engine), d);
  };
}

EdgeConfig ThreeStreamsOnTheCpu(int max_batch) {
  EdgeConfig c;
  c.edge = "e1";
  c.devices = {"cpu"};
  c.workers_per_device = 2;
  c.threads = 1;
  c.max_batch = max_batch;
  c.model_path = "/nonexistent/model.onnx";  // never read: the detectors are the stand-in's
  c.placement.bind = false;
  for (const char* id : {"a", "b", "c"}) {
    StreamConfig s;
    s.id = id;
    s.source = std::string("synthetic:64x64?frames=1#") + id;
    c.streams.push_back(s);
  }
  c.streams[1].hwaccel = "cpu";
  return c;
}

TEST(WorkerSetup, DecodeGpusAreTheOrdinalsTheStreamsHwaccelNames) {
  EXPECT_EQ(DecodeGpus({"", "cpu", "cuda:1", "cuda:0", "cuda:1", "bogus"}), (std::set<int>{0, 1}));
  EXPECT_TRUE(DecodeGpus({"", "cpu"}).empty());
}

TEST(WorkerSetup, LoadsThePoolAndTellsEachStreamHowItDecodes) {
  int loaded = 0;
  StatusOr<EdgeWorkers> w = LoadEdgeWorkers(ThreeStreamsOnTheCpu(4), FakeDetectors(&loaded));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(loaded, 2) << "workers_per_device detectors on the one device";
  EXPECT_EQ(w->pool->num_workers(), 2u);
  EXPECT_EQ(w->pool->num_devices(), 1u);
  EXPECT_EQ(w->stream_hwaccel, (std::vector<std::string>{"", "cpu", ""}));
  EXPECT_TRUE(w->decode_devices.empty()) << "no stream decodes on a GPU";
  EXPECT_EQ(w->device_gpu, (std::vector<int>{-1}));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(w->stream_gpu(i), -1) << i;
  // CPU detectors read no NVDEC frame in place, whatever GPUs are held.
  EXPECT_EQ(DeviceGpus(*w->pool, 1, {0, 1}), (std::vector<int>{-1}));
}

TEST(WorkerSetup, LoadErrorsAreReturned) {
  EdgeConfig c = ThreeStreamsOnTheCpu(1);
  StatusOr<EdgeWorkers> w = LoadEdgeWorkers(c, [](const std::string&, size_t) -> StatusOr<std::unique_ptr<detect::Detector>> {
    return absl::NotFoundError("no such model");
  });
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("no such model"), std::string::npos) << w.status();
}

TEST(WorkerSetup, WarmUpRunsEachWorkerAloneAndAsAFullBatch) {
  int loaded = 0;
  const EdgeConfig batched = ThreeStreamsOnTheCpu(4);
  StatusOr<EdgeWorkers> w = LoadEdgeWorkers(batched, FakeDetectors(&loaded));
  ASSERT_TRUE(w.ok()) << w.status();
  FakeClock clock;
  EXPECT_EQ(WarmUpEngines(batched, *w, &clock), 4u) << "2 workers × (1 picture, then max_batch)";
  const EdgeConfig single = ThreeStreamsOnTheCpu(1);
  EXPECT_EQ(WarmUpEngines(single, *w, &clock), 2u) << "max_batch 1: one run per worker";
}

TEST(WorkerSetup, PlacesTheStreamsOnTheCpuWhenNoWorkerUsesAGpu) {
  int loaded = 0;
  EdgeConfig c = ThreeStreamsOnTheCpu(2);
  StatusOr<EdgeWorkers> w = LoadEdgeWorkers(c, FakeDetectors(&loaded));
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<video::Source::Probe> probed(3);
  probed[0].width = 64;
  probed[0].height = 64;
  std::unique_ptr<EdgePlacement> p = PlaceEdge(c, *w->pool, probed);  // the model's cost counted from its graph
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->binding()) << "placement.bind: false";
  c.placement.gflop_per_frame = 1.5;
  EXPECT_NE(PlaceEdge(c, *w->pool, probed), nullptr);
}

}  // namespace
}  // namespace vigil::pipeline
