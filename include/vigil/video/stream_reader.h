// vigil/video/stream_reader.h — runs a Source on its own thread into a bounded queue.
//
// Queue policy (docs/architecture.md, "Data flow"): a live source drops the oldest queued frame when the
// queue is full (latest frame wins; counted in dropped_queue_full — its seq then never reaches the
// consumer, a visible gap), a file source blocks until the consumer pops, so offline runs lose nothing.
// kAuto picks drop-oldest for network sources and block for files and images (also in realtime mode).
//
// Thread-safety: all methods may be called from any thread; Pop() from one consumer thread at a time.
// Stop() returns promptly (the Source is interrupted: FFmpeg I/O, backoff and pacing waits abort) and is
// called by the destructor.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/video/frame.h"
#include "vigil/video/source.h"
#include "vigil/video/stats.h"

namespace vigil::video {

enum class QueuePolicy { kAuto, kBlock, kDropOldest };
enum class DropReason {
  kQueueFull,  // a live queue was full: the oldest queued frame made room (counted in dropped_queue_full)
  kStopped,    // Stop() came while a blocking reader waited for room with this frame in hand
};

struct StreamReaderOptions {
  size_t queue_capacity = 4;  // frames; REQUIRES: >= 1. Default: 4
  QueuePolicy policy = QueuePolicy::kAuto;
  // Runs first on the reading thread, before the Source is read (e.g. to name the thread and bind it to
  // CPUs: threads the decoder creates inherit both). Default: none
  std::function<void()> on_thread_start;
  // Runs on the reading thread for every frame the Source delivers, before it is queued; false discards the
  // frame (e.g. the stream ledger numbers frames here and skips those a resumed file already delivered).
  // Default: none (every frame is queued)
  std::function<bool(Frame&)> on_frame;
  // Runs on the reading thread, outside the queue's lock, for a frame that passed on_frame and will never
  // be popped (DropReason). Default: none
  std::function<void(const Frame&, DropReason)> on_drop;
};

class StreamReader {
 public:
  // Starts the reading thread. REQUIRES: source != nullptr.
  explicit StreamReader(std::unique_ptr<Source> source, StreamReaderOptions options = {});
  ~StreamReader();
  StreamReader(const StreamReader&) = delete;
  StreamReader& operator=(const StreamReader&) = delete;

  enum class PopResult {
    kFrame,    // *frame holds the next frame
    kTimeout,  // nothing arrived within the timeout; the stream goes on
    kEnd,      // the queue is empty and the Source has finished: final_status() says how
  };
  PopResult Pop(Frame* frame, std::chrono::nanoseconds timeout) VIGIL_EXCLUDES(mu_);

  // Interrupts the Source, wakes a blocked producer and joins the thread. Frames already queued can still
  // be popped. Idempotent.
  void Stop() VIGIL_EXCLUDES(mu_, join_mu_);
  // After kEnd: OK when the input ended or Stop() ended it, else the error that ended the Source.
  Status final_status() const VIGIL_EXCLUDES(mu_);
  // The Source's counters plus dropped_queue_full and queue_depth.
  StreamStats Stats() const VIGIL_EXCLUDES(mu_);
  const SourceOptions& source_options() const { return source_->options(); }

 private:
  void Run() VIGIL_EXCLUDES(mu_);

  const std::unique_ptr<Source> source_;
  const size_t capacity_;
  const bool drop_oldest_;
  const std::function<bool(Frame&)> on_frame_;
  const std::function<void(const Frame&, DropReason)> on_drop_;
  mutable Mutex mu_;
  CondVar cv_;  // signalled on push, pop, finish and stop
  std::deque<Frame> queue_ VIGIL_GUARDED_BY(mu_);
  bool finished_ VIGIL_GUARDED_BY(mu_) = false;
  bool stop_ VIGIL_GUARDED_BY(mu_) = false;
  Status final_status_ VIGIL_GUARDED_BY(mu_);
  uint64_t dropped_ VIGIL_GUARDED_BY(mu_) = 0;
  Mutex join_mu_;  // serialises Stop()'s join
  std::thread thread_ VIGIL_GUARDED_BY(join_mu_);  // last: started after everything above is initialised
};

}  // namespace vigil::video
