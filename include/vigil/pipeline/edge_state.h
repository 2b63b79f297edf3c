// vigil/pipeline/edge_state.h — what an edge persists in its state dir across restarts.
//
//   <dir>/epoch                 decimal epoch of the last start; Open() increments it (first start: 1)
//   <dir>/streams/<id>.state    per stream, three lines: "run <u64>", "cursor <u64 | none>", "source <uri>"
//                               (<id> with every byte outside [A-Za-z0-9_-] written as %XX)
// Every write is atomic: the content goes to "<file>.tmp", is fsync'ed and renamed over the file, so a
// crash leaves the old or the new content, never a torn one.
// run: chosen once when a stream starts from scratch (no state, or another source) and kept when the
// edge resumes. cursor: the last seq the aggregator acknowledged as contiguously stored (0..cursor).
//
// Thread-safety: one EdgeState per state dir and process; its methods from one thread at a time.
// Errors: Internal / PermissionDenied naming the path and the OS reason; DataLoss for a malformed file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "vigil/common/status.h"

namespace vigil::pipeline {

struct StreamCursor {
  uint64_t run = 0;
  std::optional<uint64_t> cursor;  // nullopt: nothing acknowledged yet in this run
  std::string source;
  bool operator==(const StreamCursor&) const = default;
};

class EdgeState {
 public:
  // Creates `dir` when needed and increments the persisted epoch.
  static StatusOr<EdgeState> Open(const std::string& dir);
  uint64_t epoch() const { return epoch_; }
  // The stream's saved state; nullopt when none.
  StatusOr<std::optional<StreamCursor>> Load(const std::string& stream_id) const;
  Status Save(const std::string& stream_id, const StreamCursor& state) const;

 private:
  std::string dir_;
  uint64_t epoch_ = 0;
};

// Writes `content` to `path` atomically (temp file, fsync, rename).
Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace vigil::pipeline
