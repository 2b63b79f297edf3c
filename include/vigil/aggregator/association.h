// vigil/aggregator/association.h — the association step of many streams' trackers at once (issue 20, item 3).
//
// What it is for. A Tracker's Update (tracking.h) spends its time associating: an IoU matrix and an optimal
// assignment per stage, O(tracks × detections) to O(n³) per frame. At 3 boxes a frame that is a few µs; a crowded
// scene (a yard, a checkpoint, a pallet line: 100–300 boxes a frame) costs the aggregator's storage thread tens of
// µs to milliseconds per report, and 128 such streams saturate it. An Associator computes the association of a whole
// report batch — every stream's frames of the batch, each stream's in its order — somewhere else: on a GPU, one
// stream per thread block, the streams in parallel. The Confirmer (confirm.h) then hands each frame's association
// to Tracker::Update, which applies it (O(tracks + detections)): the decisions, ids and reasons stay the host's.
//
// State. An Associator holds its own copy of each stream's tracker state (the boxes, velocities, classes, states,
// hits and last-seen marks that association reads), known by the Tracker's state_id. Associate() compares, per
// stream, the copy's id with the `tracker` given: a different one (a new stream, Restart, a rolled-back batch, a
// frame associated on the host) is copied in first. After the batch the copy is the state the frames lead to with
// the associations returned; the caller that applied all of a stream's frames with them says so with
// Advanced(stream, tracker.state_id()), and the next batch starts from the copy without copying anything.
//
// Equality. The association an Associator returns is the one Tracker::Update would compute, bit for bit: the same
// float and double operations in the same order, no fused multiply-add, the same tie rules (tracking.h). The
// device implementation is tested against the host one on random multi-stream sequences (tests/cuda).
//
// Limits. A stream whose table would outgrow the device's (max_tracks), or a frame with more than max_detections,
// is not associated there: that frame and the stream's later frames of the batch come back `ok = false` with the
// reason, and the caller associates them on the host (counted). A device error fails the call (Internal or
// Unavailable, naming the CUDA error): the caller associates the batch on the host.
//
// Thread-safety: one thread at a time (the aggregator's storage thread). Ownership: frames' spans and trackers are
// the caller's and need to live only for the call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vigil/aggregator/tracking.h"
#include "vigil/common/status.h"

namespace vigil::aggregator {

// One frame of a batch.
struct AssociationFrame {
  uint64_t stream = 0;               // the caller's stable number for the stream (never reused for another)
  const Tracker* tracker = nullptr;  // the stream's tracker before the batch: the same for all of its frames
  uint64_t seq = 0;                  // as Tracker::Update's (Check passes for it; later frames of a stream follow)
  int64_t time_ns = 0;
  std::span<const TrackInput> detections;
};

struct Association {
  bool ok = false;                // false: not associated here (`why`), associate on the host
  std::vector<int> det_of_track;  // as TrackUpdate::det_of_track: per track before the frame, a detection or -1
  std::string why;                // when !ok: "table over 512 tracks", "1200 detections, over 1024", ...
};

// Counters since construction.
struct AssociatorStats {
  uint64_t batches = 0;     // Associate calls that ran
  uint64_t frames = 0;      // frames associated (ok)
  uint64_t declined = 0;    // frames returned !ok (limits)
  uint64_t copied_in = 0;   // stream states copied in (not Advanced from the batch before)
  uint64_t failures = 0;    // calls that failed (device errors)
};

class Associator {
 public:
  virtual ~Associator() = default;
  // The batch's frames, any streams, each stream's frames in the order they will be applied. Returns one
  // Association per frame (same order).
  virtual StatusOr<std::vector<Association>> Associate(std::span<const AssociationFrame> frames) = 0;
  // The caller applied every frame of `stream` in the last batch with the associations given: its tracker is now
  // the Associator's copy, named `state_id`.
  virtual void Advanced(uint64_t stream, uint64_t state_id) = 0;
  // The stream is gone: its copy can be dropped.
  virtual void Forget(uint64_t stream) = 0;
  virtual std::string where() const = 0;  // "host", "cuda:0"
  virtual AssociatorStats stats() const = 0;
};

// The reference: a Tracker copy per stream, advanced by Tracker::Update on the host (what the device one is held to).
std::unique_ptr<Associator> MakeHostAssociator();

struct DeviceAssociatorOptions {
  int device = 0;              // cuda:N
  uint32_t max_streams = 1024;   // streams whose state stays on the device (more: the least recently used is
                                 // dropped and copied in again when it comes back). 1..65536
  uint32_t max_tracks = 512;     // tracks per stream on the device, 1..4096
  uint32_t max_detections = 1024;  // detections per frame on the device, 1..10000
};
// Association on GPU `options.device`: device memory for max_streams × max_tracks tracks (64 bytes each) is
// allocated here. Errors: InvalidArgument (options), Unimplemented (built without CUDA), Unavailable (no such GPU,
// no memory), naming the reason.
StatusOr<std::unique_ptr<Associator>> MakeDeviceAssociator(DeviceAssociatorOptions options);

}  // namespace vigil::aggregator
