// vigil/pipeline/mirror_window.h — a hot standby's window of mirrored live pictures (issue 16).
//
// The primary sends each live picture it numbered as a JPEG (replication/channel.h MirroredFrame). The standby
// keeps, per stream, those the aggregator has not acknowledged: a mirrored ledger state (Follow) drops every
// frame at or below its stream's acked_through and every frame of an older run. At a takeover the ledger is told
// which seqs the window holds (Seqs → LedgerStream::mirrored) and the edge processes those above the
// aggregator's cursor again (Take), so what the dead primary numbered and never got stored is reported, not
// lost.
//
// Bounds: at most `frames_per_stream` frames per stream; a frame beyond it evicts the stream's oldest (counted:
// such a seq is reported lost if the takeover needs it). A frame of a stream the window was not built for is
// ignored (counted as unknown). A frame with the seq of one held replaces it (a primary restarted within its
// persist interval numbers again from its last persisted high-water mark).
// Results: the primary's detections of the pictures it processed (replication/channel.h MirroredResult) are kept
// beside the pictures, with the same bounds and pruning; a seq counts as held when its picture or its result is,
// and Take attaches the result to the frame (MirroredFrame::result; a frame with a result and no picture when
// only the result arrived), so that the takeover re-publishes it instead of processing the picture again.
// Bounds for results: at most `frames_per_stream` per stream too, the oldest evicted beyond (counted).
// Thread-safety: every method is thread-safe (one mutex). Add and AddResult run on the channel's (or the ring's)
// reader thread, Follow on the standby's state writer thread (mirrored_ledger_writer.h).
// Ownership: the window owns the frames it holds; Take hands them over.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/replication/channel.h"

namespace vigil::pipeline {

struct MirrorWindowStats {
  uint64_t received = 0;  // frames Added for this stream
  uint64_t evicted = 0;   // dropped for room (frames_per_stream)
  uint64_t acked = 0;     // dropped by Follow: acknowledged, or of another run
  size_t held = 0;        // frames held now
  size_t bytes = 0;       // their bytes (JPEG, or raw pixels from a frame ring)
  uint64_t results_received = 0;  // results Added for this stream
  size_t results_held = 0;        // results held now
  uint64_t results_evicted = 0;   // results dropped for room (their pictures then run again at a takeover)
};

class MirrorWindow {
 public:
  // `streams`: the stream ids this node serves. frames_per_stream ≥ 1.
  MirrorWindow(std::vector<std::string> streams, size_t frames_per_stream);

  void Add(replication::MirroredFrame frame);
  // Whether Add would keep `frame` (its identity; pixels not needed): false for a picture acknowledged already or
  // of a run the ledger left, counted then as Add counts it (received, acked). A frame ring asks before copying
  // the pixels (FrameRingOptions::wanted). Unknown streams: true (Add counts them).
  bool Wanted(const replication::MirroredFrame& frame);
  void AddResult(replication::MirroredResult result);
  // A mirrored ledger state: per stream, its current run and acknowledged cursor.
  void Follow(const std::vector<StreamRecord>& records);
  // The seqs held for (stream, run), ascending (std::nullopt when none).
  std::optional<MirroredSeqs> Seqs(const std::string& stream, uint64_t run) const;
  // The seqs held for `stream` in the run of the last ledger state followed (std::nullopt: none, or no state).
  std::optional<MirroredSeqs> Held(const std::string& stream) const;
  // Takes the frames of (stream, run) whose seq is in `seqs` (ascending), in seq order, each with its result
  // when one is held; the window forgets every frame and result of the stream.
  std::vector<replication::MirroredFrame> Take(const std::string& stream, uint64_t run, const std::vector<uint64_t>& seqs);
  MirrorWindowStats stats(const std::string& stream) const;
  uint64_t unknown() const;  // frames of streams not served here

 private:
  struct PerStream {
    std::optional<uint64_t> run;             // from the last ledger state
    std::optional<uint64_t> acked_through;   // from the last ledger state
    std::map<std::pair<uint64_t, uint64_t>, replication::MirroredFrame> frames;  // (run, seq) → frame
    std::map<std::pair<uint64_t, uint64_t>, replication::MirroredResult> results;  // (run, seq) → result
    MirrorWindowStats stats;
    // Not kept: acknowledged already, or of a run the ledger left.
    bool Stale(uint64_t frame_run, uint64_t seq) const {
      return (run && frame_run < *run) || (run && frame_run == *run && acked_through && seq <= *acked_through);
    }
  };
  void Forget(PerStream& s, std::map<std::pair<uint64_t, uint64_t>, replication::MirroredFrame>::iterator it);

  const size_t frames_per_stream_;
  mutable Mutex mu_;
  std::map<std::string, PerStream, std::less<>> streams_ VIGIL_GUARDED_BY(mu_);  // keys fixed at construction
  uint64_t unknown_ VIGIL_GUARDED_BY(mu_) = 0;
};

}  // namespace vigil::pipeline
