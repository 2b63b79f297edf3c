// Waiting in tests for something another thread makes true (a connection closed, a counter reached).
// Only for conditions a test cannot observe by a wake-up of its own; never for timing assertions: the
// timeout is an upper bound on a busy 2-core machine, reaching it is a failure.
#pragma once

#include <chrono>
#include <thread>

namespace vigil::testutil {

// Polls `pred` every 2 ms until it holds (true) or `timeout` passes (false). Thread-safety: `pred` runs on
// the calling thread and must be safe to call while other threads work.
template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace vigil::testutil
