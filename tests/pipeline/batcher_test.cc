#include "vigil/pipeline/batcher.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;

struct Tagged {
  int stream = 0;
  int seq = 0;
};

TEST(Batcher, PerStreamOrderPreservedAcrossConcurrentProducers) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kStreams = 4, kFrames = 500;
  Batcher<Tagged> b(3, milliseconds(1), 8);
  std::vector<std::thread> producers;
  for (int s = 0; s < kStreams; ++s) {
    producers.emplace_back([&, s] {
      std::mt19937 rng(seed + static_cast<unsigned>(s));
      for (int i = 0; i < kFrames; ++i) {
        if (rng() % 16 == 0) std::this_thread::yield();
        ASSERT_TRUE(b.Push({s, i}));
      }
    });
  }
  std::thread closer([&] {
    for (auto& t : producers) t.join();
    b.Close();
  });
  std::map<int, int> next;
  std::vector<Tagged> batch;
  size_t total = 0;
  for (;;) {
    auto r = b.NextBatch(&batch, milliseconds(1000));
    if (r == Batcher<Tagged>::Result::kClosed) break;
    EXPECT_LE(batch.size(), 3u);
    for (const Tagged& t : batch) {
      EXPECT_EQ(t.seq, next[t.stream]) << "stream " << t.stream;
      next[t.stream] = t.seq + 1;
    }
    total += batch.size();
  }
  closer.join();
  EXPECT_EQ(total, size_t{kStreams * kFrames});
  EXPECT_FALSE(b.Push({0, 0}));  // closed
}

TEST(Batcher, FullBatchWithoutWaitingAndPartialBatchAfterMaxWait) {
  Batcher<int> b(4, milliseconds(200), 16);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(b.Push(i));
  std::vector<int> batch;
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_EQ(batch, (std::vector<int>{0, 1, 2, 3}));
  // Two left, fewer than max_batch: the batch comes no earlier than max_wait after the first push.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(150));  // pushed just before t0
  EXPECT_EQ(batch, (std::vector<int>{4, 5}));
}

TEST(Batcher, TimeoutWhenIdleAndDrainAfterClose) {
  Batcher<int> b(4, milliseconds(10000), 16);
  std::vector<int> batch;
  EXPECT_EQ(b.NextBatch(&batch, milliseconds(20)), Batcher<int>::Result::kTimeout);
  ASSERT_TRUE(b.Push(7));
  b.Close();  // a partial batch is handed out at once after Close, not after max_wait
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_EQ(batch, std::vector<int>{7});
  EXPECT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kClosed);
}

TEST(Batcher, PushBlocksWhileFull) {
  Batcher<int> b(1, milliseconds(0), 2);
  ASSERT_TRUE(b.Push(0));
  ASSERT_TRUE(b.Push(1));
  std::atomic<bool> pushed{false};
  std::thread t([&] {
    EXPECT_TRUE(b.Push(2));
    pushed = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(pushed.load());
  EXPECT_EQ(b.depth(), 2u);
  std::vector<int> batch;
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  t.join();
  EXPECT_TRUE(pushed.load());
}

}  // namespace
}  // namespace vigil::pipeline
