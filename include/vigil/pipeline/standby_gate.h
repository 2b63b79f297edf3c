// vigil/pipeline/standby_gate.h — a hot standby's sources, read before the takeover (issue 16).
//
// A standby opens its streams while it waits and reads them through this gate, so that the takeover does not
// start them from nothing:
//   - a replayable stream (a file, an image folder, a synthetic pattern without live=1) is read up to the
//     cursor mirrored from the primary (the last position the aggregator acknowledged): those pictures are
//     decoded and discarded, and the reader waits with the next one in hand. At takeover it resumes at once
//     instead of decoding the input from its start to the cursor (which grew with the cursor: ~0.5 ms per
//     frame of vtest.avi on one core, hundreds of ms deep in a file);
//   - a live stream (a camera) is read all the time and every picture discarded: the connection is up at the
//     takeover, with no reconnect and no camera time lost to one.
// Open() (the takeover, after the aggregator admitted this node) lets every picture through from then on;
// Close() (a stop) releases a waiting reader with kStop.
//
// Positions are the Source's seq (frames kept by the Source, 0-based, continuing across a looped file's
// passes): the stream ledger numbers a replayable picture by that position, so the standby, the primary and
// a restarted edge agree on which picture a seq names.
//
// Thread-safety: every method from any thread; Admit from one reader thread per stream. Errors: none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "vigil/common/mutex.h"

namespace vigil::pipeline {

class StandbyGate {
 public:
  // `streams`: how many streams (indices 0..streams-1).
  explicit StandbyGate(size_t streams);

  enum class Verdict {
    kDiscard,  // before the takeover: drop this picture (a replayable one at or before the cursor; any live one)
    kPass,     // the gate is open: number and process it
    kStop,     // Close() came: drop it, the edge is stopping
  };
  // The reader of `stream`, for its picture at `position` (replayable) before the ledger numbers it. A
  // replayable picture after the cursor waits here until the cursor reaches it (kDiscard), Open (kPass) or
  // Close (kStop); a live one is never held.
  Verdict Admit(size_t stream, bool live, uint64_t position);
  // The mirrored cursor of `stream`: the aggregator stored its positions 0..acked_through (nullopt: none
  // yet). Only raises it; a lower value (an older state) is ignored.
  void Raise(size_t stream, std::optional<uint64_t> acked_through);
  void Open();
  void Close();
  // Close for one stream only (its reader is being stopped while the others stay held).
  void Release(size_t stream);

  // The first position of `stream` the gate has not discarded: where the stream resumes if the gate opens now
  // (a picture held in Admit has it).
  uint64_t next_position(size_t stream) const;
  uint64_t discarded(size_t stream) const;  // pictures discarded before the takeover
  std::optional<uint64_t> cursor(size_t stream) const;

 private:
  struct PerStream {
    std::optional<uint64_t> through;  // the mirrored cursor
    uint64_t next = 0;                // first position not discarded
    uint64_t discarded = 0;
    bool released = false;            // Release
  };
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<PerStream> streams_ VIGIL_GUARDED_BY(mu_);
  bool open_ VIGIL_GUARDED_BY(mu_) = false;
  bool closed_ VIGIL_GUARDED_BY(mu_) = false;
};

}  // namespace vigil::pipeline
