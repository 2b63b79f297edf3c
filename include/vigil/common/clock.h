// vigil/common/clock.h — time through a seam, so that timeouts, ages and flush intervals are tested with
// a fake clock instead of sleeps (leveldb's Env, abseil's SimulatedClock).
//
// Units: nanoseconds. SteadyNs: a monotonic clock for intervals (CLOCK_MONOTONIC), arbitrary origin.
// WallNs: CLOCK_REALTIME, ns since the Unix epoch, for timestamps that leave the process.
// Thread-safety: SystemClock() and FakeClock are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace vigil {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t SteadyNs() const = 0;
  virtual int64_t WallNs() const = 0;
};

// The process's real clocks. Never null; lives for the whole process.
Clock* SystemClock();

// SystemClock()'s steady time as a std::chrono::steady_clock time point (the same origin), for code that measures
// real elapsed time with std::chrono arithmetic: benchmarks and their progress reports.
inline std::chrono::steady_clock::time_point SteadyNow() {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(SystemClock()->SteadyNs()));
}

// A clock that moves only when told to. Starts at steady 1 s and wall 2026-01-01T00:00:00Z.
class FakeClock final : public Clock {
 public:
  int64_t SteadyNs() const override { return steady_.load(); }
  int64_t WallNs() const override { return wall_.load(); }
  // Moves both clocks forward by `ns` (≥ 0).
  void Advance(int64_t ns) {
    steady_ += ns;
    wall_ += ns;
  }

 private:
  std::atomic<int64_t> steady_{1'000'000'000};
  std::atomic<int64_t> wall_{1'767'225'600'000'000'000};
};

}  // namespace vigil
