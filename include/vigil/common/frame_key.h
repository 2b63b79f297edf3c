// vigil/common/frame_key.h — the one name of a camera frame across the system: (edge, stream, run, seq).
//
// edge: the edge's id (edge.yaml `edge`; a primary and its standby share it). stream: the stream's id on that
// edge. run: the ledger's run of that stream — a new run starts where the edge could not resume the numbering
// (a file read again from the start, a stream whose state was lost); runs only grow. seq: the frame's number in
// its run, from 0, gap-free (a frame not processed is still numbered, and reported as lost or dropped).
// Frames order by (edge, stream, run, seq); within one stream that is the order the camera produced them.
//
// A FrameKey is a value: copy it freely. Thread-safety: as any value type (const use from any thread).
// Errors: none. Where a struct of the protocol, the replication channel or the store carries these fields loose
// (a wire or row layout that must not change), a helper beside it builds the FrameKey, and code that compares,
// orders or looks frames up uses that: transport::Report::first_frame(), replication::MirroredFrame::key(edge)
// and MirroredResult::key(edge) (the channel serves one edge), aggregator::StoredEvent / EventDecision /
// StoredSnapshot::key().
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace vigil {

struct FrameKey {
  std::string edge;
  std::string stream;
  uint64_t run = 0;
  uint64_t seq = 0;

  friend auto operator<=>(const FrameKey&, const FrameKey&) = default;
  friend bool operator==(const FrameKey&, const FrameKey&) = default;

  // The same stream and run (edge, stream and run equal): seqs of one gap-free numbering.
  bool SameRun(const FrameKey& other) const {
    return run == other.run && stream == other.stream && edge == other.edge;
  }
  // "edge/stream/run/seq", for logs and errors.
  std::string ToString() const {
    return edge + "/" + stream + "/" + std::to_string(run) + "/" + std::to_string(seq);
  }
};

struct FrameKeyHash {
  size_t operator()(const FrameKey& k) const {
    size_t h = std::hash<std::string>{}(k.edge);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<std::string>{}(k.stream));
    mix(std::hash<uint64_t>{}(k.run));
    mix(std::hash<uint64_t>{}(k.seq));
    return h;
  }
};

}  // namespace vigil
