#include "vigil/pipeline/workers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "testing/fake_yolo.h"
#include "vigil/infer/engine.h"

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;
using testing_fakes::FakeImage;
using testing_fakes::FakeYolo;

// Detectors on the stand-in YOLO (CPU, one thread each): every picture below has one box whose place
// and class say which stream and frame it came from.
WorkerPoolOptions FakeOptions(size_t streams, int workers, size_t max_batch) {
  WorkerPoolOptions o;
  o.devices = {"cpu"};
  o.workers_per_device = workers;
  o.max_batch = max_batch;
  o.max_wait = milliseconds(1);
  o.streams = streams;
  o.detector.engine.threads = 1;
  o.detector.engine.batch = 2;
  o.load_detector = [](const std::string&, size_t) -> StatusOr<std::unique_ptr<detect::Detector>> {
    detect::DetectorOptions d;
    d.engine.threads = 1;
    d.engine.batch = 2;
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<infer::Engine> engine, infer::Engine::FromGraph(FakeYolo(DType::kFloat32), d.engine, "fake_yolo"));
    return detect::Detector::Create(std::move(engine), d);
  };
  return o;
}

// Frame `seq` of `stream`: its box sits at grid index stream (its x1 tells the stream), class seq % 2.
detect::Image PictureOf(size_t stream, uint64_t seq) {
  return FakeImage(static_cast<int>(stream) * 7 % 64, static_cast<uint8_t>(40 + stream * 20), 102, 51, 51,
                   seq % 2 == 0 ? 204 : 0, seq % 2 == 0 ? 0 : 204);
}

WorkItem ItemOf(size_t stream, uint64_t seq) {
  const detect::Image im = PictureOf(stream, seq);
  WorkItem item;
  item.stream = stream;
  item.frame.seq = seq;
  item.frame.width = im.width;
  item.frame.height = im.height;
  item.frame.stride = im.width * 3;
  item.frame.bgr = im.bgr;
  return item;
}

// Several workers finish batches out of order (random extra time per batch); the sink still sees each
// stream's frames in push order, each once, each with its own picture's detections, on one thread.
TEST(WorkerPool, EachStreamInOrderAcrossWorkersWithItsOwnDetections) {
  constexpr size_t kStreams = 8;
  constexpr uint64_t kFrames = 40;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Load(FakeOptions(kStreams, 3, 3));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ((*pool)->num_workers(), 3u);
  // What each picture gives when run alone.
  std::map<std::pair<size_t, uint64_t>, detect::Detection> expected;
  for (size_t s = 0; s < kStreams; ++s) {
    for (uint64_t parity : {0u, 1u}) {
      auto d = (*pool)->detector().Detect(std::vector<detect::Image>{PictureOf(s, parity)});
      ASSERT_TRUE(d.ok()) << d.status();
      ASSERT_EQ((*d)[0].size(), 1u);
      expected[{s, parity}] = (*d)[0][0];
    }
  }
  std::mutex mu;
  std::map<size_t, std::vector<uint64_t>> seen;
  std::set<std::thread::id> sink_threads;
  std::vector<std::string> problems;
  std::atomic<int> batch_no{0};
  (*pool)->Start(
      [&](BatchResult& r) {
        std::lock_guard lock(mu);
        sink_threads.insert(std::this_thread::get_id());
        if (!r.status.ok()) problems.push_back(std::string(r.status.message()));
        if (r.detections.size() != r.items.size()) {
          problems.push_back("detections for " + std::to_string(r.detections.size()) + " of " +
                             std::to_string(r.items.size()) + " frames");
          return;
        }
        EXPECT_LE(r.items.size(), 3u);
        EXPECT_LE(r.started_ns, r.detected_ns);
        for (size_t i = 0; i < r.items.size(); ++i) {
          const WorkItem& it = r.items[i];
          seen[it.stream].push_back(it.frame.seq);
          EXPECT_TRUE(it.frame.bgr.empty()) << "the pixels were not released";
          EXPECT_EQ(it.frame.width, 64);  // everything but the pixels is kept
          ASSERT_EQ(r.detections[i].size(), 1u);
          const detect::Detection& got = r.detections[i][0];
          const detect::Detection& want = expected[{it.stream, it.frame.seq % 2}];
          EXPECT_EQ(got.class_id, want.class_id) << "stream " << it.stream << " seq " << it.frame.seq;
          EXPECT_FLOAT_EQ(got.x1, want.x1) << "stream " << it.stream << " seq " << it.frame.seq;
          EXPECT_FLOAT_EQ(got.score, want.score);
        }
      },
      [&](std::vector<WorkItem>&, size_t device) {
        EXPECT_EQ(device, 0u);
        std::mt19937 rng(seed + static_cast<unsigned>(batch_no++));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));  // batches end out of order
        return absl::OkStatus();
      });
  std::vector<std::thread> producers;
  for (size_t s = 0; s < kStreams; ++s) {
    producers.emplace_back([&, s] {
      for (uint64_t seq = 0; seq < kFrames; ++seq) ASSERT_TRUE((*pool)->Push(s, ItemOf(s, seq)));
    });
  }
  for (std::thread& t : producers) t.join();
  (*pool)->Close();
  ASSERT_TRUE((*pool)->WaitDone(milliseconds(60000)));
  (*pool)->Join();
  EXPECT_FALSE((*pool)->Push(0, ItemOf(0, kFrames)));  // closed
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_EQ(sink_threads.size(), 1u);
  std::vector<uint64_t> all(kFrames);
  for (uint64_t i = 0; i < kFrames; ++i) all[i] = i;
  for (size_t s = 0; s < kStreams; ++s) EXPECT_EQ(seen[s], all) << "stream " << s;
}

// A batch that cannot be run comes back with its error and no detections; the worker goes on.
TEST(WorkerPool, AFailedBatchIsReportedAndTheNextOnesRun) {
  StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Load(FakeOptions(2, 1, 1));
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<std::pair<uint64_t, Status>> results;
  (*pool)->Start([&](BatchResult& r) {
    ASSERT_EQ(r.items.size(), 1u);
    results.emplace_back(r.items[0].frame.seq, r.status);
    EXPECT_EQ(r.detections.size(), r.status.ok() ? 1u : 0u);
  });
  WorkItem bad = ItemOf(1, 1);
  bad.frame.bgr.resize(10);  // not 64 × 64 × 3 bytes
  ASSERT_TRUE((*pool)->Push(0, ItemOf(0, 0)));
  ASSERT_TRUE((*pool)->Push(1, std::move(bad)));
  ASSERT_TRUE((*pool)->Push(0, ItemOf(0, 2)));
  (*pool)->Close();
  (*pool)->Join();
  ASSERT_EQ(results.size(), 3u);
  std::map<uint64_t, Status> by_seq(results.begin(), results.end());
  EXPECT_TRUE(by_seq[0].ok()) << by_seq[0];
  EXPECT_FALSE(by_seq[1].ok());
  EXPECT_TRUE(by_seq[2].ok()) << by_seq[2];
}

// The engine is the bottleneck: every stream always has a frame queued (its producer refills its
// one-frame queue while the slow engine runs; the engine waits for that before it takes the next batch, so
// the test does not depend on the scheduler). The streams are served round-robin: after every batch, their
// counts are within one batch of each other.
TEST(WorkerPool, ASlowEngineServesEveryStreamWithinOneBatch) {
  constexpr size_t kStreams = 8, kBatch = 3, kBatches = 60;
  WorkerPoolOptions o = FakeOptions(kStreams, 1, kBatch);
  o.per_stream_capacity = 1;
  StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Load(std::move(o));
  ASSERT_TRUE(pool.ok()) << pool.status();
  WorkerPool& p = **pool;
  std::vector<size_t> served(kStreams, 0);
  std::vector<std::vector<size_t>> snapshots;  // sink thread until Join
  std::atomic<size_t> batches{0};
  std::atomic<bool> closing{false};
  auto all_queued = [&] {
    for (int i = 0; i < 20000 && !closing.load() && p.queued() < kStreams; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return closing.load() || p.queued() == kStreams;
  };
  std::vector<std::thread> producers;
  for (size_t s = 0; s < kStreams; ++s) {
    producers.emplace_back([&, s] {
      for (uint64_t seq = 0;; ++seq) {
        if (!p.Push(s, ItemOf(s, seq))) return;
      }
    });
  }
  ASSERT_TRUE(all_queued());
  p.Start(
      [&](BatchResult& r) {
        for (const WorkItem& it : r.items) ++served[it.stream];
        snapshots.push_back(served);
        ++batches;
      },
      [&](std::vector<WorkItem>& batch, size_t) {
        if (!closing.load()) {
          EXPECT_EQ(batch.size(), kBatch);
        }
        std::this_thread::sleep_for(milliseconds(1));  // the slow engine
        EXPECT_TRUE(all_queued()) << "a producer did not refill its queue";
        return absl::OkStatus();
      });
  for (int i = 0; i < 60000 && batches.load() < kBatches; ++i) std::this_thread::sleep_for(milliseconds(1));
  closing = true;
  p.Close();
  for (std::thread& t : producers) t.join();
  p.Join();
  ASSERT_GE(snapshots.size(), kBatches);
  for (size_t k = 0; k < snapshots.size(); ++k) {
    const auto [lo, hi] = std::minmax_element(snapshots[k].begin(), snapshots[k].end());
    EXPECT_LE(*hi - *lo, 1u) << "after batch " << k << ": " << ::testing::PrintToString(snapshots[k]);
  }
}

TEST(WorkerPool, BadOptionsAreRefusedByName) {
  WorkerPoolOptions o = FakeOptions(2, 1, 1);
  o.devices = {};
  EXPECT_EQ(WorkerPool::Load(o).status().message(), "worker pool: no device");
  o.devices = {"cpu", "cpu"};
  EXPECT_EQ(WorkerPool::Load(o).status().message(), "worker pool: a device is listed twice");
  o.devices = {"cpu"};
  o.workers_per_device = 0;
  EXPECT_EQ(WorkerPool::Load(o).status().message(), "worker pool: workers per device 0 is not in 1..64");
  o.workers_per_device = 1;
  o.stream_device = {0, 1};
  EXPECT_EQ(WorkerPool::Load(o).status().message(), "worker pool: device index 1 of 1");
  o.stream_device = {0};
  EXPECT_EQ(WorkerPool::Load(o).status().message(), "worker pool: 1 stream devices for 2 streams");
  o.stream_device = {};
  o.load_detector = [](const std::string& device, size_t) -> StatusOr<std::unique_ptr<detect::Detector>> {
    return absl::NotFoundError("model m.onnx on " + device + ": no such file");
  };
  EXPECT_EQ(WorkerPool::Load(o).status().message(), "model m.onnx on cpu: no such file");
}

// A before_detect that refuses a batch fails that batch alone: the sink gets its frames with the status
// and no detections; the batches around it are detected as usual.
TEST(WorkerPool, ABatchRefusedBeforeDetectionFailsAloneWithItsStatus) {
  StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Load(FakeOptions(1, 1, 1));
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::mutex mu;
  std::vector<std::pair<uint64_t, std::string>> results;  // (seq, status message or "ok")
  std::atomic<int> calls{0};
  (*pool)->Start(
      [&](BatchResult& r) {
        std::lock_guard lock(mu);
        ASSERT_EQ(r.items.size(), 1u);
        EXPECT_EQ(r.detections.size(), r.status.ok() ? 1u : 0u);
        results.emplace_back(r.items[0].frame.seq, r.status.ok() ? "ok" : std::string(r.status.message()));
      },
      [&](std::vector<WorkItem>&, size_t) -> Status {
        return ++calls == 2 ? absl::InternalError("injected fault") : absl::OkStatus();
      });
  for (uint64_t seq = 0; seq < 3; ++seq) ASSERT_TRUE((*pool)->Push(0, ItemOf(0, seq)));
  (*pool)->Close();
  ASSERT_TRUE((*pool)->WaitDone(milliseconds(60000)));
  const std::vector<std::pair<uint64_t, std::string>> want = {{0, "ok"}, {1, "injected fault"}, {2, "ok"}};
  EXPECT_EQ(results, want);
}

}  // namespace
}  // namespace vigil::pipeline
