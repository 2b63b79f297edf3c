// Internal: the device associator's kernel (aggregator/association.h). Device code in vigil_cuda; called from
// aggregator/device_association.cc. Everything here is plain data laid out the same on both sides.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace vigil::aggregator::assoc {

// A track as association reads it (tracking.h, Track + its velocity). 64 bytes; a stream's slot holds max_tracks.
struct DevTrack {
  float x1, y1, x2, y2;      // its last matched box, source pixels
  float vx1, vy1, vx2, vy2;  // velocity, box edges per second
  long long last_seen_ns;
  unsigned long long last_seen_seq;
  int class_id;
  unsigned hits;
  int state;  // TrackState: 0 tentative, 1 confirmed, 2 lost
  int pad;
};
static_assert(sizeof(DevTrack) == 64);

// A stream's state besides its tracks (the slot's header).
struct DevHeader {
  int nt;       // live tracks
  int started;  // a frame was seen
  unsigned long long last_seq;
  long long last_ns;
};

struct DevDetection {
  float x1, y1, x2, y2, score;
  int class_id;
};

// One stream of the batch: its frames are frames[frame_first .. frame_first + frame_count).
struct WorkItem {
  int slot;            // its state on the device: slots + slot * max_tracks, headers[slot]
  int sync_first;      // >= 0: copy header `sync` and tracks sync_tracks[sync_first .. + sync.nt) into the slot first
  int frame_first, frame_count;
  DevHeader sync;
};

struct FrameIn {
  unsigned long long seq;
  long long time_ns;
  int det_first, nd;  // dets[det_first .. + nd)
  int out_first;      // det_of_track goes to out_tracks[out_first .. + the tracks before the frame)
  int pad;
};

// The tracker's options, as the arithmetic uses them.
struct DevOptions {
  float high_score, low_score, new_track_score;
  double max_cost_high, max_cost_low;  // 1.0 − match_iou, 1.0 − low_match_iou (double, as Assign's)
  unsigned min_hits;
  double max_lost_s;
  float smoothing;  // (float) velocity_smoothing
  int max_tracks;
};

// Per frame in `out_status`: >= 0 the tracks before it (its det_of_track's length, written at out_first); < 0 not
// associated: kTableFull (its tracks would outgrow max_tracks; the stream's later frames kStopped).
inline constexpr int kTableFull = -1;
inline constexpr int kStopped = -2;

// Shared memory a block needs for frames of up to `n` tracks or detections (the assignment's order).
size_t SharedBytes(int n);

// One block (one warp) per work item, on `stream`. `n`: the largest tracks-before or detections of any frame.
cudaError_t LaunchAssociate(const WorkItem* items, int n_items, const FrameIn* frames, const DevDetection* dets,
                            const DevTrack* sync_tracks, DevTrack* slots, DevHeader* headers, DevOptions options,
                            int* out_status, int* out_tracks, int n, cudaStream_t stream);

// Raises the kernel's dynamic shared memory limit to `bytes` (once, before the first launch of that size).
cudaError_t AllowSharedBytes(size_t bytes);

}  // namespace vigil::aggregator::assoc
