// The standby's failure detector (replication/failure_detector.h) on a fake clock: heartbeat times are
// numbers, nothing sleeps.
#include "vigil/replication/failure_detector.h"

#include <gtest/gtest.h>

#include <random>

namespace vigil::replication {
namespace {

constexpr int64_t kMs = 1'000'000;

FailureDetectorOptions Phi() {
  FailureDetectorOptions o;
  o.mode = FailureDetectorOptions::Mode::kPhiAccrual;
  return o;
}

// Heartbeats every `interval` ± uniform `jitter` from `*t`, `n` of them; returns the last arrival.
int64_t Beat(FailureDetector& d, int64_t* t, int n, int64_t interval, int64_t jitter, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> j(-jitter, jitter);
  for (int i = 0; i < n; ++i) {
    *t += interval + (jitter > 0 ? j(rng) : 0);
    d.Heartbeat(*t);
  }
  return *t;
}

TEST(FailureDetectorTest, FixedModeSuspectsAfterTheConfiguredMisses) {
  FailureDetectorOptions o;  // 500 ms × 3
  FailureDetector d(o, 0);
  int64_t t = 0;
  std::mt19937_64 rng(1);
  Beat(d, &t, 10, 500 * kMs, 0, rng);
  EXPECT_FALSE(d.Suspect(t + 1499 * kMs));
  EXPECT_TRUE(d.Suspect(t + 1500 * kMs));
  EXPECT_EQ(d.SuspectAt(t + 100 * kMs), t + 1500 * kMs);
  d.Heartbeat(t + 1400 * kMs);  // just in time: the count starts again
  EXPECT_FALSE(d.Suspect(t + 2800 * kMs));
  EXPECT_TRUE(d.Suspect(t + 2900 * kMs));
  d.Heartbeat(t);  // an older arrival changes nothing
  EXPECT_EQ(d.silent_for(t + 2900 * kMs), 1500 * kMs);
}

TEST(FailureDetectorTest, PhiGrowsWithSilenceAndCrossesTheThresholdSoonAfterTheUsualGap) {
  FailureDetector d(Phi(), 0);
  int64_t t = 0;
  std::mt19937_64 rng(2);
  Beat(d, &t, 100, 500 * kMs, 20 * kMs, rng);
  EXPECT_NEAR(d.mean_gap_ns(), 500.0 * kMs, 5.0 * kMs);
  double last = -1;
  for (int64_t ms = 0; ms <= 1500; ms += 50) {
    const double phi = d.Phi(t + ms * kMs);
    EXPECT_GE(phi, last) << ms << " ms";
    last = phi;
  }
  EXPECT_LT(d.Phi(t + 500 * kMs), 1.0);       // the usual gap: no suspicion
  EXPECT_FALSE(d.Suspect(t + 600 * kMs));
  EXPECT_TRUE(d.Suspect(t + 1000 * kMs));     // twice the usual gap with a 50 ms spread: certain
  const int64_t at = d.SuspectAt(t);
  EXPECT_GT(at, t + 600 * kMs);
  EXPECT_LT(at, t + 1000 * kMs);
  EXPECT_FALSE(d.Suspect(at - 2000));
  EXPECT_TRUE(d.Suspect(at));
}

TEST(FailureDetectorTest, APeerWhoseHeartbeatsSpreadOnABusyMachineIsSuspectedLater) {
  std::mt19937_64 rng(3);
  FailureDetector steady(Phi(), 0), busy(Phi(), 0);
  int64_t t1 = 0, t2 = 0;
  Beat(steady, &t1, 200, 500 * kMs, 10 * kMs, rng);
  Beat(busy, &t2, 200, 500 * kMs, 300 * kMs, rng);  // gaps anywhere in 200..800 ms
  EXPECT_GT(busy.std_dev_ns(), 5 * steady.std_dev_ns());
  const int64_t steady_after = steady.SuspectAt(t1) - t1, busy_after = busy.SuspectAt(t2) - t2;
  EXPECT_GT(busy_after, steady_after + 200 * kMs) << steady_after / kMs << " vs " << busy_after / kMs << " ms";
  // A gap the busy peer shows now and then (800 ms) is no reason to suspect it.
  EXPECT_FALSE(busy.Suspect(t2 + 800 * kMs));
}

TEST(FailureDetectorTest, BeforeAnyGapTheIntervalSeedsTheDistributionAndTheWindowIsBounded) {
  FailureDetectorOptions o = Phi();
  o.window = 5;
  FailureDetector d(o, 1000);
  EXPECT_EQ(d.samples(), 0u);
  EXPECT_DOUBLE_EQ(d.mean_gap_ns(), 500.0 * kMs);
  EXPECT_FALSE(d.Suspect(1000 + 500 * kMs));
  EXPECT_TRUE(d.Suspect(1000 + 2000 * kMs));
  int64_t t = 1000;
  std::mt19937_64 rng(4);
  Beat(d, &t, 5, 100 * kMs, 0, rng);
  Beat(d, &t, 5, 300 * kMs, 0, rng);  // the old gaps leave the window
  EXPECT_EQ(d.samples(), 5u);
  EXPECT_DOUBLE_EQ(d.mean_gap_ns(), 300.0 * kMs);
  EXPECT_DOUBLE_EQ(d.std_dev_ns(), 0.0);
  // A perfectly regular peer: the floor of the spread (50 ms) keeps a gap just above the mean unsuspected.
  EXPECT_FALSE(d.Suspect(t + 350 * kMs));
  EXPECT_TRUE(d.Suspect(t + 700 * kMs));
}

// A standby whose own check ran late (its process starved on an overloaded host) does not blame the primary
// for the silence it could not hear: no suspicion until one interval after the pause, when the answers queued
// meanwhile have been read.
TEST(FailureDetectorTest, ALocalPauseDefersSuspicionByOneInterval) {
  FailureDetectorOptions o;
  o.interval_ns = 100 * kMs;  // × 3 misses: 300 ms; a check 50 ms late is a pause
  FailureDetector d(o, 0);
  EXPECT_EQ(d.Checked(290 * kMs, 295 * kMs), 0);  // punctual: nothing changes
  EXPECT_TRUE(d.Suspect(300 * kMs));
  FailureDetector p(o, 0);
  EXPECT_EQ(p.Checked(290 * kMs, 450 * kMs), 160 * kMs);  // meant for 290 ms, ran at 450: paused
  EXPECT_EQ(p.local_pauses(), 1u);
  EXPECT_FALSE(p.Suspect(450 * kMs));
  EXPECT_FALSE(p.Suspect(549 * kMs));
  EXPECT_EQ(p.SuspectAt(450 * kMs), 550 * kMs);
  EXPECT_TRUE(p.Suspect(550 * kMs));  // still silent one interval after the pause: the primary is
  // The answer that waited in the socket is read during the grace: no suspicion, and silence counts from it.
  FailureDetector q(o, 0);
  q.Checked(290 * kMs, 450 * kMs);
  q.Heartbeat(470 * kMs);
  EXPECT_FALSE(q.Suspect(769 * kMs));
  EXPECT_TRUE(q.Suspect(770 * kMs));
  // Phi mode: the same grace.
  FailureDetectorOptions po = Phi();
  po.interval_ns = 100 * kMs;
  po.min_std_dev_ns = 10 * kMs;
  FailureDetector r(po, 0);
  const int64_t at = r.SuspectAt(0);
  EXPECT_TRUE(r.Suspect(at));
  EXPECT_GT(r.Checked(at - 10 * kMs, at + 60 * kMs), 0);
  EXPECT_FALSE(r.Suspect(at + 60 * kMs));
  EXPECT_TRUE(r.Suspect(at + 160 * kMs));
}

// Pauses at every check cannot postpone a suspicion forever: at most `misses` intervals of grace per silence; a
// heartbeat gives a fresh budget.
TEST(FailureDetectorTest, LocalPausesDelayASuspicionByAtMostMissesIntervals) {
  FailureDetectorOptions o;
  o.interval_ns = 100 * kMs;
  FailureDetector d(o, 0);
  int64_t now = 0;
  for (int i = 0; i < 100; ++i) {  // every check 80 ms late
    const int64_t due = now + 10 * kMs;
    now = due + 80 * kMs;
    d.Checked(due, now);
    if (d.Suspect(now)) break;
  }
  EXPECT_TRUE(d.Suspect(now));
  EXPECT_LE(now, 600 * kMs + 90 * kMs);  // 300 ms of silence + 300 ms of grace, at the checks' granularity
  EXPECT_GT(now, 300 * kMs);             // but later than without the pauses
  EXPECT_EQ(d.SuspectAt(now), now);
  d.Heartbeat(now);  // the peer again: a new budget
  d.Checked(now + 200 * kMs, now + 290 * kMs);
  EXPECT_FALSE(d.Suspect(now + 300 * kMs));
  EXPECT_TRUE(d.Suspect(now + 390 * kMs));
  FailureDetectorOptions bad = o;
  bad.local_pause_ns = -1;
  EXPECT_NE(ValidateFailureDetectorOptions(bad).message().find("local_pause"), std::string::npos);
}

TEST(FailureDetectorTest, AcceptablePauseDelaysSuspicionAndOptionsAreChecked) {
  FailureDetectorOptions o = Phi();
  FailureDetector plain(o, 0);
  o.acceptable_pause_ns = 1000 * kMs;
  FailureDetector patient(o, 0);
  int64_t a = 0, b = 0;
  std::mt19937_64 rng(5);
  Beat(plain, &a, 50, 500 * kMs, 10 * kMs, rng);
  Beat(patient, &b, 50, 500 * kMs, 10 * kMs, rng);
  EXPECT_TRUE(plain.Suspect(a + 1200 * kMs));
  EXPECT_FALSE(patient.Suspect(b + 1200 * kMs));
  EXPECT_TRUE(patient.Suspect(b + 2200 * kMs));

  EXPECT_TRUE(ValidateFailureDetectorOptions({}).ok());
  FailureDetectorOptions bad;
  bad.misses = 0;
  EXPECT_EQ(std::string(ValidateFailureDetectorOptions(bad).message()), "failure detector: misses must be ≥ 1");
  bad = {};
  bad.window = 1;
  EXPECT_EQ(std::string(ValidateFailureDetectorOptions(bad).message()), "failure detector: window must be ≥ 2");
  bad = {};
  bad.interval_ns = 0;
  EXPECT_EQ(std::string(ValidateFailureDetectorOptions(bad).message()), "failure detector: interval must be > 0");
}

}  // namespace
}  // namespace vigil::replication
