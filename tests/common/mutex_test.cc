#include "vigil/common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace vigil {
namespace {

TEST(Mutex, TryLockFailsWhileHeldElsewhere) {
  Mutex mu;
  mu.Lock();
  bool got = true;
  std::thread other([&] {
    got = mu.TryLock();
    if (got) mu.Unlock();
  });
  other.join();
  EXPECT_FALSE(got);
  mu.Unlock();
  ASSERT_TRUE(mu.TryLock());
  mu.Unlock();
}

TEST(MutexLock, UnlockReleasesAndLockRetakes) {
  Mutex mu;
  MutexLock lock(mu);
  lock.Unlock();
  bool got = false;
  std::thread other([&] {
    got = mu.TryLock();
    if (got) mu.Unlock();
  });
  other.join();
  EXPECT_TRUE(got);  // released
  lock.Lock();
  std::thread again([&] {
    got = mu.TryLock();
    if (got) mu.Unlock();
  });
  again.join();
  EXPECT_FALSE(got);  // held again; the destructor releases it
}

TEST(CondVar, WaitSeesTheNotifiedState) {
  Mutex mu;
  CondVar cv;
  int value = 0;
  std::thread producer([&] {
    MutexLock lock(mu);
    value = 42;
    cv.NotifyAll();
  });
  {
    MutexLock lock(mu);
    while (value == 0) cv.Wait(lock);
    EXPECT_EQ(value, 42);
  }
  producer.join();
  // The lock is released after the wait's scope: another thread takes it.
  ASSERT_TRUE(mu.TryLock());
  mu.Unlock();
}

TEST(CondVar, TimedWaitsReportTheTimeout) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(mu);
  EXPECT_FALSE(cv.WaitFor(lock, std::chrono::milliseconds(1)));
  EXPECT_FALSE(cv.WaitUntil(lock, Deadline::After(std::chrono::nanoseconds(0))));
}

}  // namespace
}  // namespace vigil
