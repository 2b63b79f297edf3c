// A hot standby's sources before the takeover (standby_gate.h): what is discarded, what is held, and where a
// stream resumes. The reader's side runs on a thread; the test waits for what it asserts, never for time.
#include "vigil/pipeline/standby_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace vigil::pipeline {
namespace {

using Verdict = StandbyGate::Verdict;
using namespace std::chrono_literals;

TEST(StandbyGate, AFileIsDiscardedUpToTheMirroredCursorAndHeldAfterIt) {
  StandbyGate gate(1);
  gate.Raise(0, 2);
  for (uint64_t p = 0; p <= 2; ++p) EXPECT_EQ(gate.Admit(0, /*live=*/false, p), Verdict::kDiscard) << p;
  EXPECT_EQ(gate.next_position(0), 3u);
  EXPECT_EQ(gate.discarded(0), 3u);
  // Position 3 waits: the aggregator has not acknowledged it.
  auto held = std::async(std::launch::async, [&] { return gate.Admit(0, false, 3); });
  EXPECT_EQ(held.wait_for(50ms), std::future_status::timeout) << "position 3 is after the cursor";
  EXPECT_EQ(gate.next_position(0), 3u) << "the stream resumes at the held picture";
  gate.Raise(0, 3);  // the primary's next ack
  EXPECT_EQ(held.get(), Verdict::kDiscard);
  EXPECT_EQ(gate.next_position(0), 4u);
}

TEST(StandbyGate, AHeldPicturePassesAtTheTakeover) {
  StandbyGate gate(2);
  gate.Raise(0, 9);
  auto held = std::async(std::launch::async, [&] { return gate.Admit(0, false, 10); });
  while (gate.next_position(0) != 10) std::this_thread::yield();  // held
  gate.Open();
  EXPECT_EQ(held.get(), Verdict::kPass);
  EXPECT_EQ(gate.next_position(0), 10u);
  EXPECT_EQ(gate.Admit(0, false, 11), Verdict::kPass);
  EXPECT_EQ(gate.Admit(1, /*live=*/true, 0), Verdict::kPass) << "open: cameras pass too";
}

TEST(StandbyGate, AFileWithoutACursorIsHeldAtItsFirstPicture) {
  StandbyGate gate(1);
  auto held = std::async(std::launch::async, [&] { return gate.Admit(0, false, 0); });
  EXPECT_EQ(held.wait_for(50ms), std::future_status::timeout);
  EXPECT_EQ(gate.next_position(0), 0u);
  gate.Raise(0, std::nullopt);  // a mirrored state with nothing acknowledged yet changes nothing
  EXPECT_EQ(held.wait_for(10ms), std::future_status::timeout);
  gate.Open();
  EXPECT_EQ(held.get(), Verdict::kPass);
}

TEST(StandbyGate, CamerasAreReadAndDiscardedWhileTheStandbyWaits) {
  StandbyGate gate(1);
  for (uint64_t p = 0; p < 100; ++p) EXPECT_EQ(gate.Admit(0, /*live=*/true, p), Verdict::kDiscard);
  EXPECT_EQ(gate.discarded(0), 100u);
  EXPECT_EQ(gate.next_position(0), 0u) << "a camera has no position to resume at";
}

TEST(StandbyGate, AnOlderMirroredStateDoesNotLowerTheCursor) {
  StandbyGate gate(1);
  gate.Raise(0, 40);
  gate.Raise(0, 12);
  EXPECT_EQ(gate.cursor(0), std::optional<uint64_t>(40));
  EXPECT_EQ(gate.Admit(0, false, 40), Verdict::kDiscard);
}

TEST(StandbyGate, CloseAndReleaseLetAHeldReaderGo) {
  StandbyGate gate(2);
  auto a = std::async(std::launch::async, [&] { return gate.Admit(0, false, 0); });
  auto b = std::async(std::launch::async, [&] { return gate.Admit(1, false, 0); });
  gate.Release(0);
  EXPECT_EQ(a.get(), Verdict::kStop);
  EXPECT_EQ(b.wait_for(20ms), std::future_status::timeout) << "only stream 0 was released";
  EXPECT_EQ(gate.Admit(0, false, 1), Verdict::kStop) << "a released stream stays released";
  gate.Close();
  EXPECT_EQ(b.get(), Verdict::kStop);
  gate.Open();
  EXPECT_EQ(gate.Admit(1, false, 1), Verdict::kStop) << "closed wins over open";
}

}  // namespace
}  // namespace vigil::pipeline
