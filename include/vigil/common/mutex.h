// vigil/common/mutex.h — a mutex, a scoped lock and a condition variable that clang's thread-safety analysis
// checks (leveldb's port::Mutex and abseil's absl::Mutex do the same; STYLE.md rule 7).
//
// Every field a mutex guards is declared `T field VIGIL_GUARDED_BY(mu_);`, every function that must be called
// with the lock held `VIGIL_REQUIRES(mu_)`, every function that takes it itself `VIGIL_EXCLUDES(mu_)`. The clang
// build (scripts/thread-safety.sh, part of .ci/run) compiles every source with -Wthread-safety
// -Werror=thread-safety, so an access without the lock is a build error, not a comment. GCC ignores the
// attributes; the types behave exactly like std::mutex / std::lock_guard / std::condition_variable.
//
// Waiting: write the loop out, so that the analysis sees the guarded reads under the lock (a predicate lambda
// is a function of its own to clang, one that holds no lock):
//     MutexLock lock(mu_);
//     while (!ready_) cv_.Wait(lock);
// A timed wait fixes its Deadline before the loop: `const Deadline d = Deadline::After(timeout);
//     while (!ready_) if (!cv_.WaitUntil(lock, d)) break;`
//
// Thread-safety: Mutex and CondVar are thread-safe; a MutexLock belongs to the thread that made it.
// Errors: none (std::mutex's system_error on a broken platform is not caught).
// Ownership: a MutexLock refers to its Mutex, which outlives it. A CondVar may be used with any Mutex, one at a time.
#pragma once

#include <absl/base/thread_annotations.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "vigil/common/deadline.h"

#define VIGIL_GUARDED_BY(x) ABSL_GUARDED_BY(x)
#define VIGIL_PT_GUARDED_BY(x) ABSL_PT_GUARDED_BY(x)
#define VIGIL_REQUIRES(...) ABSL_EXCLUSIVE_LOCKS_REQUIRED(__VA_ARGS__)
#define VIGIL_EXCLUDES(...) ABSL_LOCKS_EXCLUDED(__VA_ARGS__)
#define VIGIL_ACQUIRED_AFTER(...) ABSL_ACQUIRED_AFTER(__VA_ARGS__)
#define VIGIL_ACQUIRED_BEFORE(...) ABSL_ACQUIRED_BEFORE(__VA_ARGS__)
#define VIGIL_RETURN_CAPABILITY(x) ABSL_LOCK_RETURNED(x)
#define VIGIL_NO_THREAD_SAFETY_ANALYSIS ABSL_NO_THREAD_SAFETY_ANALYSIS

namespace vigil {

class CondVar;

// A non-recursive exclusive lock (std::mutex underneath).
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // true: now held by the caller.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the lock (checked by nothing at run time): for callbacks that a
  // locked caller runs, where the analysis cannot follow the call.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction; Unlock/Lock release and retake it in between (the
// destructor unlocks only when held).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // REQUIRES: held.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mu_.Unlock();
  }
  // REQUIRES: not held (after Unlock).
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    held_ = true;
  }

 private:
  friend class CondVar;
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable over a Mutex held through a MutexLock. Waits may wake spuriously: loop on the condition.
class CondVar {
 public:
  // Releases the lock, waits for a notification (or a spurious wake-up), retakes the lock.
  void Wait(MutexLock& lock) {
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    cv_.wait(native);
    native.release();
  }
  // As Wait, at most until `deadline` (real time: see deadline.h). false: the deadline passed. Never() waits
  // as Wait does.
  bool WaitUntil(MutexLock& lock, Deadline deadline) {
    if (deadline.never()) {
      Wait(lock);
      return true;
    }
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(native, deadline.time_point()) == std::cv_status::no_timeout;
    native.release();
    return woken;
  }
  // As Wait, at most for `timeout`. false: the time passed. In a loop, fix a Deadline once instead (a spurious
  // wake-up would otherwise restart the full wait).
  template <class Rep, class Period>
  bool WaitFor(MutexLock& lock, const std::chrono::duration<Rep, Period>& timeout) {
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    const bool woken = cv_.wait_for(native, timeout) == std::cv_status::no_timeout;
    native.release();
    return woken;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace vigil
