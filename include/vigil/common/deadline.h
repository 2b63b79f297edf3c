// vigil/common/deadline.h — the end of a blocking wait (a CondVar wait, poll(2), a socket's read or write, a gRPC
// call), in real monotonic time read through the Clock seam's SystemClock().
//
// Two faces of one seam. Code *decides* with its Clock* (what is due, what timed out, how old a thing is), so tests
// drive those decisions with a FakeClock and no sleeps. A thread asleep in the kernel, though, is woken only by real
// time or by a notification — a FakeClock cannot end its wait — so *how long a thread blocks* is bounded by a
// Deadline, which is always real time. A test that fakes the clock never depends on a Deadline passing: it wakes the
// waiter (a notification, a closed socket). Outside src/common/clock.cc no code reads std::chrono's clocks itself;
// tools/check_borders.py fails the build on one that does.
//
// Units: nanoseconds on CLOCK_MONOTONIC (SystemClock()->SteadyNs(), the origin of std::chrono::steady_clock).
// Thread-safety: a Deadline is an immutable value; copy it freely between threads.
// Errors: none. A timeout of a year or more is Never() (no overflow); a timeout ≤ 0 is a deadline already passed.
// Ownership: a value type, nothing owned.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>

#include "vigil/common/clock.h"

namespace vigil {

class Deadline {
 public:
  // `timeout` from now (real time). Any std::chrono duration; compared with a year in its own units first, so
  // milliseconds::max() is Never() rather than an overflow.
  template <class Rep, class Period>
  static Deadline After(std::chrono::duration<Rep, Period> timeout) {
    if (timeout >= kForever) return Never();
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    return Deadline(SystemClock()->SteadyNs() + std::max<int64_t>(ns, 0));
  }
  // A wait without end.
  static Deadline Never() { return Deadline(kNever); }
  // At `steady_ns` on SystemClock()'s steady time (e.g. one computed from an earlier SystemClock()->SteadyNs()).
  static Deadline AtSteadyNs(int64_t steady_ns) { return Deadline(steady_ns); }

  bool never() const { return ns_ == kNever; }
  bool passed() const { return !never() && SystemClock()->SteadyNs() >= ns_; }
  // What is left, ≥ 0; nanoseconds::max() for Never().
  std::chrono::nanoseconds left() const {
    if (never()) return std::chrono::nanoseconds::max();
    return std::chrono::nanoseconds(std::max<int64_t>(ns_ - SystemClock()->SteadyNs(), 0));
  }
  // The timeout to hand poll(2)/epoll_wait: -1 for Never(), 0 once passed, else what is left rounded up to a
  // millisecond (a wait never ends before its deadline), capped at INT_MAX.
  int PollMs() const {
    if (never()) return -1;
    const int64_t ms = (left().count() + 999'999) / 1'000'000;
    return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
  }
  // On std::chrono::steady_clock, for the standard library's timed waits; time_point::max() for Never().
  std::chrono::steady_clock::time_point time_point() const {
    if (never()) return std::chrono::steady_clock::time_point::max();
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns_));
  }
  int64_t steady_ns() const { return ns_; }

  friend bool operator==(Deadline a, Deadline b) { return a.ns_ == b.ns_; }
  friend bool operator<(Deadline a, Deadline b) { return a.ns_ < b.ns_; }
  static Deadline Earlier(Deadline a, Deadline b) { return a.ns_ <= b.ns_ ? a : b; }
  static Deadline Later(Deadline a, Deadline b) { return a.ns_ >= b.ns_ ? a : b; }

 private:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  static constexpr std::chrono::hours kForever{24 * 365};
  explicit Deadline(int64_t ns) : ns_(ns) {}
  int64_t ns_;
};

}  // namespace vigil
