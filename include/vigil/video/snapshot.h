// vigil/video/snapshot.h — an event's pictures: the whole frame downscaled and/or one crop per detection box,
// as JPEG (video/jpeg.h, libturbojpeg), and boxes with their labels drawn onto such a picture for display.
//
// EncodeSnapshots: from a host Frame (8-bit BGR, frame.h) and boxes in its pixels:
//   - the frame (options.frame): downscaled with area interpolation to at most frame_max_width pixels wide,
//     the aspect ratio kept (heights round to the nearest pixel, at least 1); never upscaled;
//   - a crop per box (options.crops): the box grown by crop_margin × its width (height) on each side, clipped
//     to the frame, in whole pixels (floor of the left/top edge, ceil of the right/bottom); downscaled so its
//     longer side is at most crop_max_side. A box that is not finite or leaves no pixel inside the frame
//     gets no crop (the pictures name their box: SnapshotPicture::box).
// Pictures come in order: the frame first, then the crops in box order.
// DrawBoxes: decodes a JPEG of a picture whose source was source_width × source_height pixels, draws each
// box (given in source pixels, scaled to the picture) in its class's colour with "label score" above it, and
// encodes the result again.
// Costs (2-core VM, one thread): a 1080p frame to 640 px wide ~3 ms; a crop well under 1 ms.
// Thread-safety: reentrant (no shared state). Ownership: results are returned by value.
// Errors: InvalidArgument — options out of range (ValidateSnapshotOptions names the field), a device frame
// (DownloadBgr first), a JPEG that does not decode; Unimplemented — vigil built without libturbojpeg.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/video/frame.h"

namespace vigil::video {

struct SnapshotOptions {
  bool frame = true;          // the whole frame. Default: yes
  int frame_max_width = 640;  // pixels, 16..16384; 0: the source's width. Default: 640
  bool crops = false;         // a crop per box. Default: no
  float crop_margin = 0.15f;  // 0..2, fraction of the box's size added on each side. Default: 0.15
  int crop_max_side = 320;    // pixels, 16..16384; 0: no limit. Default: 320
  int quality = 80;           // JPEG quality 1..100. Default: 80
};

// OK, or InvalidArgument naming the field and its range ("snapshot quality 0: must be 1..100").
Status ValidateSnapshotOptions(const SnapshotOptions& options);

struct SnapshotBox {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // source pixels, x2 ≥ x1, y2 ≥ y1
};

struct SnapshotPicture {
  int box = -1;                             // -1: the whole frame; else the index of its box
  int x = 0, y = 0, width = 0, height = 0;  // the source region it shows, pixels (the frame: all of it)
  int out_width = 0, out_height = 0;        // the JPEG's size, pixels
  std::string jpeg;
};

StatusOr<std::vector<SnapshotPicture>> EncodeSnapshots(const Frame& frame, std::span<const SnapshotBox> boxes,
                                                       const SnapshotOptions& options);

struct LabeledBox {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // source pixels
  int class_id = 0;                      // picks the colour
  std::string label;                     // drawn as "label score" (score with two decimals)
  float score = 0;
};

// The BGR colour boxes of `class_id` are drawn in (a fixed palette of 20, by class id modulo 20).
void ClassColour(int class_id, uint8_t bgr[3]);

StatusOr<std::string> DrawBoxes(std::string_view jpeg, int source_width, int source_height,
                                std::span<const LabeledBox> boxes, int quality);

// A picture for an image classifier (the aggregator's second model): `jpeg` decoded and resized to width × height
// (area interpolation when shrinking, bilinear when growing; the aspect ratio is not kept), as a float32 tensor
// [1, 3, height, width] in RGB order holding (pixel / 255 − mean[c]) / stddev[c].
// Errors: InvalidArgument (not a JPEG, a size outside 1..4096, a stddev ≤ 0). Thread-safe; the tensor is the caller's.
StatusOr<Tensor> ClassifierInput(std::string_view jpeg, int width, int height, const float mean[3],
                                 const float stddev[3]);

}  // namespace vigil::video
