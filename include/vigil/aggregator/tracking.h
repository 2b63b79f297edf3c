// vigil/aggregator/tracking.h — following objects across a stream's frames (issue 20, first step: the host
// implementation, the reference for a device one).
//
// Tracker: ByteTrack-style association (Zhang et al., "ByteTrack: Multi-Object Tracking by Associating Every
// Detection Box", ECCV 2022) with a constant-velocity motion model per track. Per frame, in order:
//   1. every track's box is predicted forward to the frame's time (its velocity × the time since it was last seen;
//      velocities are smoothed over matches: v ← β·observed + (1 − β)·v);
//   2. stage one: the high-score detections (score ≥ high_score) are matched to every track (confirmed, tentative,
//      lost) of the same class by IoU with the predicted box — an optimal assignment (Hungarian algorithm) of
//      1 − IoU, pairs below match_iou never matched;
//   3. stage two: the low-score detections (low_score ≤ score < high_score) are matched to the tracks of the same
//      class still unmatched and seen in the previous frame (not lost), pairs below low_match_iou never matched —
//      a box whose score dips (occlusion, blur) keeps its track instead of breaking it;
//   4. unmatched high-score detections with score ≥ new_track_score start tentative tracks; a tentative track
//      becomes confirmed at its min_hits-th match (in consecutive frames), and is dropped when a frame misses it;
//   5. a confirmed track missed by a frame is lost: still predicted and matchable (stage one) until it was missed
//      for longer than max_lost_s, then it ends (Update reports it in `ended`).
// Track ids are positive, unique per Tracker and never reused. Boxes are source pixels (x1, y1, x2, y2).
//
// Association (steps 1–3) is what costs: an IoU matrix and an assignment per stage, O(tracks × detections) and up to
// O(n³) per frame. Update can take it from elsewhere — an Associator (association.h) that computes it for many
// streams at once, on a GPU — and then does only steps 4–5 (O(tracks + detections)). The arithmetic is spelled out
// in float and double with no fused multiply-add (tracking.cc is compiled with -ffp-contract=off), so another
// implementation that keeps to it gets the same association bit for bit.
//
// TrackRules: confirmation over a track (an event is confirmed when its object's track is): seen in at least k of
// the last m frames of its stream, for at least min_duration_s since it was first seen, and travelled at least
// min_travel_px (the distance between its first and its current box centre). Evaluate says confirmed (with the
// rule values met), pending (not yet), or — once the track ended without being confirmed — rejected with the
// reason that failed.
//
// Thread-safety: a Tracker is used by one thread at a time (one per stream). Errors: Update returns
// InvalidArgument for frames out of time order or non-finite boxes (nothing changes). Ownership: values.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::aggregator {

struct TrackBox {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // source pixels, x2 ≥ x1, y2 ≥ y1
};

// IoU of two boxes (0 when either is empty).
float IoU(const TrackBox& a, const TrackBox& b);

struct TrackerOptions {
  float high_score = 0.5f;       // stage one from here (0, 1]. Default: 0.5
  float low_score = 0.1f;        // stage two from here, < high_score. Default: 0.1
  float new_track_score = 0.6f;  // an unmatched detection starts a track from here (≥ high_score). Default: 0.6
  float match_iou = 0.2f;        // stage one: pairs below are never matched (ByteTrack's 0.8 cost = 0.2 IoU)
  float low_match_iou = 0.5f;    // stage two: likewise. Default: 0.5
  int min_hits = 2;              // matches in consecutive frames that confirm a tentative track (1: at once)
  double max_lost_s = 1.0;       // a confirmed track missed this long ends. Default: 1 s (30 frames at 30 FPS)
  double velocity_smoothing = 0.5;  // β above, (0, 1]. Default: 0.5
};
Status ValidateTrackerOptions(const TrackerOptions& o);  // InvalidArgument naming the field

struct TrackInput {  // one detection of the frame
  TrackBox box;
  float score = 0;
  int class_id = 0;
};

enum class TrackState { kTentative, kConfirmed, kLost };
std::string_view ToString(TrackState s);  // "tentative", "confirmed", "lost"

// A track after an Update.
struct Track {
  int64_t id = 0;                // > 0
  int class_id = 0;
  TrackState state = TrackState::kTentative;
  TrackBox box;                  // its last matched box
  TrackBox first_box;            // when it started
  int64_t first_ns = 0, last_seen_ns = 0;  // stream time of its first and last match
  uint64_t first_seq = 0, last_seen_seq = 0;
  uint32_t hits = 0;             // frames it was matched in
  std::deque<uint64_t> recent;   // seqs of its matches within the last TrackRules::m frames (oldest first)
};

struct TrackUpdate {
  // Per input detection (same order): the id of its track, or 0 (a low-score detection no track took, or a
  // high-score one below new_track_score).
  std::vector<int64_t> track_of;
  std::vector<Track> ended;  // tracks that ended in this frame (lost too long, or tentative and missed)
  // The association: per track of tracks() as it was before the frame (same order), the index of the detection
  // it was matched to, or -1.
  std::vector<int> det_of_track;
};

class Tracker {
 public:
  // REQUIRES: ValidateTrackerOptions(options) is OK. `window`: how many recent seqs a track keeps (TrackRules::m).
  explicit Tracker(TrackerOptions options, int window = 30);

  // The next frame of the stream (`seq` increasing, `time_ns` its stream time, not decreasing) and its detections.
  // `association`: the frame's association computed elsewhere (TrackUpdate::det_of_track of the same frame on a
  // copy of this Tracker); null: computed here. A given association is checked before anything changes: one entry
  // per track, each detection at most once, of the track's class, high-score or (a track seen in the previous
  // frame) low-score — InvalidArgument naming what is wrong otherwise (the caller associates here instead).
  StatusOr<TrackUpdate> Update(uint64_t seq, int64_t time_ns, std::span<const TrackInput> detections,
                               const std::vector<int>* association = nullptr);
  // What Update would refuse without changing anything: frames out of order, boxes that are not finite.
  Status Check(uint64_t seq, int64_t time_ns, std::span<const TrackInput> detections) const;

  const std::vector<Track>& tracks() const { return tracks_; }  // live tracks (tentative, confirmed, lost)
  const Track* Find(int64_t id) const;
  const TrackerOptions& options() const { return opt_; }
  // What association needs besides tracks(), for an Associator to copy this state: each track's velocity (box edges
  // per second, same index as tracks()), whether a frame was seen, and the last frame's seq and time.
  const std::vector<TrackBox>& velocities() const { return velocity_; }
  bool started() const { return started_; }
  uint64_t last_seq() const { return last_seq_; }
  int64_t last_ns() const { return last_ns_; }
  // Names this state: every Update and Restart gives a new one, unique in the process (a copy has its original's).
  // An Associator holding a copy of this state knows it by this number.
  uint64_t state_id() const { return state_id_; }

  // Drops every track, as if no frame had been seen (the next Update takes any seq and time); ids go on from
  // where they were, never reused.
  void Restart();
  // Ids come from `*counter` (post-incremented) instead of this Tracker's own count: ids unique across the Trackers
  // sharing it. REQUIRES: *counter > 0 and outlives this Tracker (and its copies). Null: its own count again.
  void set_id_source(int64_t* counter) { id_source_ = counter; }

 private:
  TrackerOptions opt_;
  int window_;
  std::vector<Track> tracks_;
  std::vector<TrackBox> velocity_;  // per track (same index): box edges per second
  int64_t next_id_ = 1;
  int64_t* id_source_ = nullptr;
  bool started_ = false;
  uint64_t last_seq_ = 0;
  int64_t last_ns_ = 0;
  uint64_t state_id_;
};

struct TrackRules {
  int k = 1, m = 1;              // seen in ≥ k of the last m frames (1 ≤ k ≤ m ≤ 1000). Default: 1 of 1
  double min_duration_s = 0;     // ≥ 0. Default: 0
  double min_travel_px = 0;      // ≥ 0. Default: 0
};
Status ValidateTrackRules(const TrackRules& r);

struct TrackVerdict {
  enum Kind { kPending, kConfirmed, kRejected };
  Kind kind = kPending;
  std::string reason;  // why: "seen 3 of 5 frames, 0.40 s, travelled 12 px" / what was missing
};
std::string_view ToString(TrackVerdict::Kind k);  // "pending", "confirmed", "rejected"

// The verdict on `track` at frame `seq` (its stream's latest); `ended`: the track ended (no more matches coming),
// so a rule not met rejects it.
TrackVerdict Evaluate(const TrackRules& rules, const Track& track, uint64_t seq, bool ended);

// The optimal assignment for a cost matrix (rows × cols, row-major; Hungarian algorithm, O(n³)): for each row the
// column it gets, or -1. Pairs whose cost exceeds `max_cost` are never assigned.
std::vector<int> Assign(std::span<const double> cost, size_t rows, size_t cols, double max_cost);

}  // namespace vigil::aggregator
