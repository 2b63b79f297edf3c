#include "vigil/pipeline/batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "vigil/common/clock.h"

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
  Batcher<Tagged> b(3, milliseconds(1), 2, kStreams);
  std::vector<std::thread> producers;
  for (int s = 0; s < kStreams; ++s) {
    producers.emplace_back([&, s] {
      std::mt19937 rng(seed + static_cast<unsigned>(s));
      for (int i = 0; i < kFrames; ++i) {
        if (rng() % 16 == 0) std::this_thread::yield();
        ASSERT_TRUE(b.Push(static_cast<size_t>(s), {s, i}));
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
  EXPECT_FALSE(b.Push(0, {0, 0}));  // closed
}

TEST(Batcher, FullBatchWithoutWaitingAndPartialBatchAfterMaxWait) {
  Batcher<int> b(4, milliseconds(200), 16, 1);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(b.Push(0, i));
  std::vector<int> batch;
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_EQ(batch, (std::vector<int>{0, 1, 2, 3}));
  // Two left, fewer than max_batch: the batch comes no earlier than max_wait after the first push.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(150));  // pushed just before t0
  EXPECT_EQ(batch, (std::vector<int>{4, 5}));
}

TEST(Batcher, MaxWaitIsMeasuredByItsClock) {
  FakeClock clock;
  Batcher<int> b(4, std::chrono::hours(1), 16, 1, &clock);
  ASSERT_TRUE(b.Push(0, 1));
  ASSERT_TRUE(b.Push(0, 2));
  clock.Advance(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::hours(1)).count());
  // By the batcher's clock the oldest item has waited max_wait: the partial batch goes at once.
  std::vector<int> batch;
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_EQ(batch, (std::vector<int>{1, 2}));
  EXPECT_EQ(b.depth(), 0u);
}

TEST(Batcher, TimeoutWhenIdleAndDrainAfterClose) {
  Batcher<int> b(4, milliseconds(10000), 16, 1);
  std::vector<int> batch;
  EXPECT_EQ(b.NextBatch(&batch, milliseconds(20)), Batcher<int>::Result::kTimeout);
  ASSERT_TRUE(b.Push(0, 7));
  b.Close();  // a partial batch is handed out at once after Close, not after max_wait
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  EXPECT_EQ(batch, std::vector<int>{7});
  EXPECT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kClosed);
}

TEST(Batcher, PushBlocksWhileFull) {
  Batcher<int> b(1, milliseconds(0), 2, 2);
  ASSERT_TRUE(b.Push(0, 0));
  ASSERT_TRUE(b.Push(0, 1));
  ASSERT_TRUE(b.Push(1, 10)) << "another stream's queue has room";
  std::atomic<bool> pushed{false};
  std::thread t([&] {
    EXPECT_TRUE(b.Push(0, 2));
    pushed = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(pushed.load());
  EXPECT_EQ(b.depth(), 3u);
  std::vector<int> batch;
  ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<int>::Result::kBatch);
  t.join();
  EXPECT_TRUE(pushed.load());
}

TEST(Batcher, RoundRobinStartsAfterTheLastStreamServed) {
  Batcher<Tagged> b(3, milliseconds(0), 8, 4);
  for (int i = 0; i < 4; ++i) {
    for (int s = 0; s < 4; ++s) ASSERT_TRUE(b.Push(static_cast<size_t>(s), {s, i}));
  }
  std::vector<Tagged> batch;
  std::vector<int> order;
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<Tagged>::Result::kBatch);
    for (const Tagged& t : batch) order.push_back(t.stream);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
}

// A slow engine and 8 live sources that always have a frame ready: every stream is served equally.
// The engine is the bottleneck: every stream has an item queued whenever a batch is taken (the consumer
// waits for the producers to refill before it takes the next one, so the scheduler cannot make a stream
// miss its turn). The first streams push fastest, so a FIFO would serve them first; round-robin keeps the
// per-stream counts within one of each other after every batch.
TEST(Batcher, ASlowEngineServesEveryStreamWithinOneBatchOfTheOthers) {
  constexpr size_t kStreams = 8, kBatch = 3;
  Batcher<Tagged> b(kBatch, milliseconds(2), 2, kStreams);
  std::vector<std::thread> producers;
  for (size_t s = 0; s < kStreams; ++s) {
    producers.emplace_back([&, s] {
      for (int i = 0;; ++i) {
        if (!b.Push(s, {static_cast<int>(s), i})) return;
        if (s >= 4) std::this_thread::yield();
      }
    });
  }
  auto all_full = [&] {  // both slots of every stream
    for (int i = 0; i < 20000 && b.depth() < 2 * kStreams; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    return b.depth() == 2 * kStreams;
  };
  std::vector<size_t> served(kStreams, 0);
  std::vector<Tagged> batch;
  for (int k = 0; k < 200; ++k) {
    ASSERT_TRUE(all_full()) << "batch " << k;
    ASSERT_EQ(b.NextBatch(&batch, milliseconds(1000)), Batcher<Tagged>::Result::kBatch);
    ASSERT_EQ(batch.size(), kBatch);
    for (const Tagged& t : batch) ++served[static_cast<size_t>(t.stream)];
    const auto [lo, hi] = std::minmax_element(served.begin(), served.end());
    ASSERT_LE(*hi - *lo, 1u) << "after batch " << k << ": " << ::testing::PrintToString(served);
  }
  b.Close();
  for (std::thread& t : producers) t.join();
}

// Several consumers: each batch gets the next ticket, and a consumer that finds the items taken waits on
// instead of returning an empty batch.
TEST(Batcher, TicketsNumberTheBatchesOfSeveralConsumers) {
  Batcher<int> b(2, milliseconds(1), 64, 1);
  std::mutex mu;
  std::vector<uint64_t> tickets;
  std::atomic<bool> empty_batch{false};
  std::vector<std::thread> consumers;
  for (int c = 0; c < 3; ++c) {
    consumers.emplace_back([&] {
      std::vector<int> out;
      for (;;) {
        uint64_t ticket = 0;
        const auto r = b.NextBatch(&out, milliseconds(1000), &ticket);
        if (r == Batcher<int>::Result::kClosed) return;
        if (r != Batcher<int>::Result::kBatch) continue;
        if (out.empty()) empty_batch = true;
        std::lock_guard lock(mu);
        tickets.push_back(ticket);
      }
    });
  }
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(b.Push(0, i));
  b.Close();
  for (std::thread& t : consumers) t.join();
  EXPECT_FALSE(empty_batch.load());
  std::sort(tickets.begin(), tickets.end());
  for (size_t i = 0; i < tickets.size(); ++i) ASSERT_EQ(tickets[i], i);
  EXPECT_GE(tickets.size(), 100u);
}

}  // namespace
}  // namespace vigil::pipeline
