#include "vigil/video/stats.h"

#include <spdlog/spdlog.h>

namespace vigil::video {

std::string_view StreamStateName(StreamState state) {
  switch (state) {
    case StreamState::kIdle: return "idle";
    case StreamState::kConnecting: return "connecting";
    case StreamState::kStreaming: return "streaming";
    case StreamState::kReconnecting: return "reconnecting";
    case StreamState::kEnded: return "ended";
    case StreamState::kFailed: return "failed";
    case StreamState::kStopped: return "stopped";
  }
  return "unknown";
}

void StatsRecorder::SetState(StreamState state, std::string_view who, std::string_view why) {
  StreamState old;
  {
    MutexLock lock(mu_);
    const bool terminal = state_ == StreamState::kEnded || state_ == StreamState::kFailed || state_ == StreamState::kStopped;
    if (state_ == state || terminal) return;
    old = state_;
    state_ = state;
    ++state_changes_;
  }
  const auto level = state == StreamState::kFailed || state == StreamState::kReconnecting ? spdlog::level::warn
                                                                                           : spdlog::level::info;
  if (why.empty()) {
    spdlog::log(level, "{}: {} -> {}", who, StreamStateName(old), StreamStateName(state));
  } else {
    spdlog::log(level, "{}: {} -> {}: {}", who, StreamStateName(old), StreamStateName(state), why);
  }
}

StreamState StatsRecorder::state() const {
  MutexLock lock(mu_);
  return state_;
}

void StatsRecorder::DecodeError(std::string_view message) {
  const uint64_t n = decode_errors.fetch_add(1, std::memory_order_relaxed) + 1;
  SetLastError(message);
  if (n <= 5 || (n & (n - 1)) == 0) spdlog::warn("{} (decode error #{})", message, n);
}

void StatsRecorder::SetLastError(std::string_view message) {
  MutexLock lock(mu_);
  last_error_.assign(message.data(), message.size());
}

void StatsRecorder::SetHwaccel(std::string_view hwaccel) {
  MutexLock lock(mu_);
  hwaccel_.assign(hwaccel.data(), hwaccel.size());
}

StreamStats StatsRecorder::Snapshot() const {
  StreamStats s;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  s.frames_decoded = frames_decoded.load(kRelaxed);
  s.frames_delivered = frames_delivered.load(kRelaxed);
  s.skipped_target_fps = skipped_target_fps.load(kRelaxed);
  s.skipped_resume = skipped_resume.load(kRelaxed);
  s.decode_errors = decode_errors.load(kRelaxed);
  s.timestamp_fixups = timestamp_fixups.load(kRelaxed);
  s.connect_failures = connect_failures.load(kRelaxed);
  s.reconnect_attempts = reconnect_attempts.load(kRelaxed);
  s.reconnects = reconnects.load(kRelaxed);
  s.disconnects = disconnects.load(kRelaxed);
  MutexLock lock(mu_);
  s.state = state_;
  s.state_changes = state_changes_;
  s.last_error = last_error_;
  s.hwaccel = hwaccel_;
  return s;
}

}  // namespace vigil::video
