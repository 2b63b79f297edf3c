// SessionHealth and FailbackSchedule (transport/health.h) on times they are told: a fake clock.
#include "vigil/transport/health.h"

#include <gtest/gtest.h>

#include "vigil/common/clock.h"

namespace vigil::transport {
namespace {

constexpr int64_t kMs = 1'000'000;
using Verdict = SessionHealth::Verdict;

SessionHealth::Options Opts() { return {100 * kMs, 1000 * kMs, 400 * kMs}; }

TEST(SessionHealthTest, HeartbeatWhenNothingWasWrittenForAnInterval) {
  FakeClock clock;
  SessionHealth h(Opts(), clock.SteadyNs());
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
  EXPECT_EQ(h.NextCheck(clock.SteadyNs()), clock.SteadyNs() + 100 * kMs);
  clock.Advance(99 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
  clock.Advance(1 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kSendHeartbeat);
  h.Wrote(clock.SteadyNs());
  h.Heard(clock.SteadyNs());
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
}

TEST(SessionHealthTest, SilenceForPeerTimeoutEndsTheSessionEvenWhileWriting) {
  FakeClock clock;
  SessionHealth h(Opts(), clock.SteadyNs());
  for (int i = 0; i < 9; ++i) {  // heartbeats go out, nothing comes back
    clock.Advance(100 * kMs);
    EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kSendHeartbeat) << i;
    h.Wrote(clock.SteadyNs());
  }
  clock.Advance(99 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
  EXPECT_EQ(h.NextCheck(clock.SteadyNs()), clock.SteadyNs() + 1 * kMs);
  clock.Advance(1 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kPeerSilent);
  EXPECT_EQ(h.silent_for(clock.SteadyNs()), 1000 * kMs);
  h.Heard(clock.SteadyNs() - 5 * kMs);  // an echo read a moment ago revives it
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kSendHeartbeat);  // 100 ms since the last heartbeat
  h.Heard(clock.SteadyNs() - 500 * kMs);  // an older time changes nothing
  EXPECT_EQ(h.silent_for(clock.SteadyNs()), 5 * kMs);
}

TEST(SessionHealthTest, AnAckOverdueCountsFromWhenTheOldestWasFirstSeenSent) {
  FakeClock clock;
  SessionHealth h(Opts(), clock.SteadyNs());
  h.Oldest(7, /*sent=*/false, clock.SteadyNs());  // pending, not sent yet: no clock runs
  clock.Advance(500 * kMs);
  h.Heard(clock.SteadyNs());
  h.Wrote(clock.SteadyNs());
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
  h.Oldest(7, true, clock.SteadyNs());
  clock.Advance(300 * kMs);
  h.Heard(clock.SteadyNs());
  h.Wrote(clock.SteadyNs());
  h.Oldest(7, true, clock.SteadyNs());  // still the same one: its clock keeps running
  clock.Advance(99 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
  clock.Advance(1 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kAckOverdue);
  EXPECT_EQ(h.oldest_id(), 7u);
  EXPECT_EQ(h.oldest_unacked_for(clock.SteadyNs()), 400 * kMs);
  h.Oldest(8, true, clock.SteadyNs());  // 7 was acknowledged: 8's clock starts now
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kSendHeartbeat);  // no longer overdue; a heartbeat is due
  h.Oldest(8, false, clock.SteadyNs());  // nothing pending
  clock.Advance(900 * kMs);
  h.Heard(clock.SteadyNs());
  h.Wrote(clock.SteadyNs());
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kOk);
}

TEST(SessionHealthTest, PeerSilenceComesBeforeAckOverdueBeforeHeartbeat) {
  FakeClock clock;
  SessionHealth h(Opts(), clock.SteadyNs());
  h.Oldest(1, true, clock.SteadyNs());
  clock.Advance(2000 * kMs);
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kPeerSilent);
  h.Heard(clock.SteadyNs());
  EXPECT_EQ(h.Check(clock.SteadyNs()), Verdict::kAckOverdue);
}

TEST(FailbackScheduleTest, ProbesOnlyOffThePreferredLinkEveryInterval) {
  FakeClock clock;
  FailbackSchedule f(250 * kMs);
  f.SessionStarted(0, clock.SteadyNs());
  clock.Advance(10'000 * kMs);
  EXPECT_FALSE(f.ProbeDue(clock.SteadyNs()));  // on the preferred link: never
  f.SessionStarted(1, clock.SteadyNs());
  clock.Advance(249 * kMs);
  EXPECT_FALSE(f.ProbeDue(clock.SteadyNs()));
  clock.Advance(1 * kMs);
  EXPECT_TRUE(f.ProbeDue(clock.SteadyNs()));
  f.Probed(clock.SteadyNs());  // failed: the next one an interval later
  EXPECT_FALSE(f.ProbeDue(clock.SteadyNs()));
  EXPECT_EQ(f.next_probe(), clock.SteadyNs() + 250 * kMs);
  clock.Advance(250 * kMs);
  EXPECT_TRUE(f.ProbeDue(clock.SteadyNs()));
}

}  // namespace
}  // namespace vigil::transport
