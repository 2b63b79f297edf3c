// vigil/video/stats.h — per-stream counters and state of a Source / StreamReader.
//
// StreamStats is a snapshot (a plain value). StatsRecorder is where a Source accumulates them: the
// decoding thread writes, any thread may take a Snapshot() at any time (counters are atomics, state and
// last error are under a mutex; a snapshot is consistent per field, not across fields).
// Every state change is logged (spdlog, info; failures at warn) and counted in state_changes.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "vigil/common/mutex.h"

namespace vigil::video {

enum class StreamState {
  kIdle,          // created, nothing read yet
  kConnecting,    // opening the input (network sources; a file opens in OpenSource)
  kStreaming,     // delivering frames
  kReconnecting,  // network source: connection lost or refused, waiting out the backoff delay
  kEnded,         // end of the input (file or images, loop off)
  kFailed,        // stopped by an error (Next() returned it)
  kStopped,       // interrupted by its owner (Source::Interrupt / StreamReader::Stop)
};
std::string_view StreamStateName(StreamState state);  // "idle", "connecting", ...

struct StreamStats {
  StreamState state = StreamState::kIdle;
  uint64_t frames_decoded = 0;      // pictures out of the decoder (images loaded), before any skipping
  uint64_t frames_delivered = 0;    // frames returned by Source::Next
  uint64_t skipped_target_fps = 0;  // dropped by the target_fps timestamp filter (no seq given)
  uint64_t skipped_resume = 0;      // decoded with seq <= start_after_seq, not delivered
  uint64_t dropped_queue_full = 0;  // StreamReader, drop-oldest policy: delivered by the Source, dropped unread
  uint64_t decode_errors = 0;       // corrupt packets, packets the decoder rejects, frames with concealed
                                    // errors, demuxer read errors, truncation, unreadable images
  uint64_t timestamp_fixups = 0;    // frames whose pts was missing, not increasing or jumped (re-timed)
  uint64_t connect_failures = 0;    // opens of a network input that failed (refused, timeout, bad stream)
  uint64_t reconnect_attempts = 0;  // opens of a network input after the first one
  uint64_t reconnects = 0;          // of those, the successful ones
  uint64_t disconnects = 0;         // established connections that ended (EOF, read error or read timeout)
  uint64_t state_changes = 0;
  uint64_t queue_depth = 0;         // StreamReader: frames waiting to be popped
  std::string last_error;           // the most recent error or warning, naming the input; empty if none
  std::string hwaccel;              // SourceOptions::hwaccel requested: where the current input decodes,
                                    // "cuda:N", or "cpu (why not on the GPU)"; empty when not requested and
                                    // until the decoder has offered its formats (at the first picture)
};

class StatsRecorder {
 public:
  std::atomic<uint64_t> frames_decoded{0}, frames_delivered{0}, skipped_target_fps{0}, skipped_resume{0},
      decode_errors{0}, timestamp_fixups{0}, connect_failures{0}, reconnect_attempts{0}, reconnects{0},
      disconnects{0};

  // Sets the state; when it differs from the current one, counts and logs "<who>: <old> -> <new>[: why]".
  // kEnded, kFailed and kStopped are final: later calls leave them.
  void SetState(StreamState state, std::string_view who, std::string_view why = {}) VIGIL_EXCLUDES(mu_);
  StreamState state() const VIGIL_EXCLUDES(mu_);
  // Counts one decode error, remembers `message` as last_error and logs it (warn; rate-limited to the
  // first 5 and then every power of two, so a broken stream does not flood the log).
  void DecodeError(std::string_view message);
  void SetLastError(std::string_view message) VIGIL_EXCLUDES(mu_);
  void SetHwaccel(std::string_view hwaccel) VIGIL_EXCLUDES(mu_);
  StreamStats Snapshot() const VIGIL_EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  StreamState state_ VIGIL_GUARDED_BY(mu_) = StreamState::kIdle;
  uint64_t state_changes_ VIGIL_GUARDED_BY(mu_) = 0;
  std::string last_error_ VIGIL_GUARDED_BY(mu_);
  std::string hwaccel_ VIGIL_GUARDED_BY(mu_);
};

}  // namespace vigil::video
