#include "vigil/common/deadline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "vigil/common/mutex.h"

namespace vigil {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

TEST(Deadline, ZeroAndNegativeTimeoutsHaveAlreadyPassed) {
  for (const Deadline d : {Deadline::After(nanoseconds(0)), Deadline::After(std::chrono::seconds(-5))}) {
    EXPECT_TRUE(d.passed());
    EXPECT_FALSE(d.never());
    EXPECT_EQ(d.left(), nanoseconds(0));
    EXPECT_EQ(d.PollMs(), 0);
  }
}

TEST(Deadline, NeverWaitsWithoutEnd) {
  const Deadline d = Deadline::Never();
  EXPECT_TRUE(d.never());
  EXPECT_FALSE(d.passed());
  EXPECT_EQ(d.left(), nanoseconds::max());
  EXPECT_EQ(d.PollMs(), -1);
  EXPECT_EQ(d.time_point(), std::chrono::steady_clock::time_point::max());
}

TEST(Deadline, AYearOrMoreIsNeverAndDoesNotOverflow) {
  EXPECT_TRUE(Deadline::After(hours(24 * 365)).never());
  EXPECT_TRUE(Deadline::After(milliseconds::max()).never());
  EXPECT_TRUE(Deadline::After(nanoseconds::max()).never());
  EXPECT_FALSE(Deadline::After(hours(24 * 364)).never());
}

TEST(Deadline, AnHourFromNowIsOnSystemClocksSteadyTime) {
  const int64_t before = SystemClock()->SteadyNs();
  const Deadline d = Deadline::After(hours(1));
  const int64_t after = SystemClock()->SteadyNs();
  constexpr int64_t kHourNs = 3'600'000'000'000;
  EXPECT_GE(d.steady_ns(), before + kHourNs);
  EXPECT_LE(d.steady_ns(), after + kHourNs);
  EXPECT_FALSE(d.passed());
  EXPECT_LE(d.left(), hours(1));
  EXPECT_GT(d.left(), std::chrono::minutes(59));
  // Rounded up to whole milliseconds for poll(2): never less than what is left.
  EXPECT_GE(int64_t{d.PollMs()} * 1'000'000, d.left().count());
  EXPECT_LE(d.PollMs(), 3'600'000);
  EXPECT_EQ(d.time_point().time_since_epoch(), nanoseconds(d.steady_ns()));
}

TEST(Deadline, AtSteadyNsAndOrder) {
  const int64_t now = SystemClock()->SteadyNs();
  const Deadline past = Deadline::AtSteadyNs(now - 1);
  const Deadline future = Deadline::AtSteadyNs(now + 3'600'000'000'000);
  EXPECT_TRUE(past.passed());
  EXPECT_FALSE(future.passed());
  EXPECT_TRUE(past < future);
  EXPECT_TRUE(future < Deadline::Never());
  EXPECT_EQ(Deadline::Earlier(future, past), past);
  EXPECT_EQ(Deadline::Later(future, past), future);
  EXPECT_EQ(Deadline::Later(Deadline::Never(), future), Deadline::Never());
}

TEST(CondVarDeadline, APassedDeadlineReturnsFalseWithoutANotification) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(mu);
  EXPECT_FALSE(cv.WaitUntil(lock, Deadline::After(nanoseconds(0))));
}

TEST(CondVarDeadline, NeverIsWokenByANotification) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::atomic<bool> waiting{false};
  int waits = 0;
  std::thread notifier([&] {
    while (!waiting.load()) std::this_thread::yield();
    // The waiter holds `mu` from setting `waiting` until it sleeps in the wait: taking `mu` here means it sleeps.
    MutexLock lock(mu);
    ready = true;
    cv.NotifyAll();
  });
  {
    MutexLock lock(mu);
    waiting = true;
    while (!ready) {
      EXPECT_TRUE(cv.WaitUntil(lock, Deadline::Never()));
      ++waits;
    }
  }
  notifier.join();
  EXPECT_TRUE(ready);
  EXPECT_GE(waits, 1);  // it did wait (and a Never deadline returned only on the notification)
}

}  // namespace
}  // namespace vigil
