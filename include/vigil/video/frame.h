// vigil/video/frame.h — one decoded, upright picture of a stream, as a Source delivers it.
//
// Identity: (stream_id, run, seq) names a frame for good (docs/architecture.md, "Data flow"): seq counts
// the frames a Source delivers within a run from 0, in delivery order, with no holes of its own (frames
// skipped by target_fps get no seq; frames skipped for a resume keep theirs, so seq is reproducible); the
// run is chosen by the owner of the stream (SourceOptions::run) and changes only when the stream starts
// over from scratch — not at a reconnect, not at a loop of a file.
//
// Pixels: 8-bit BGR, interleaved, in host memory: `height` rows of `width` pixels, top row first, row y
// starting at byte y * stride, pixel x of that row at byte x * 3 in the order blue, green, red (OpenCV's
// CV_8UC3). The picture is upright: the stream's display rotation has been applied (`rotation` says by how
// much) and non-square pixels have been resampled to square ones, so width/height are display pixels.
//
// Times: pts_ns is the presentation time on the stream's own timeline, in ns from the start of the stream
// (the first frame of a file's first pass or of a network source's first connection is near 0); it is
// strictly increasing within a Source, also across loops and reconnects (Source documents how).
// capture_time_ns / source_steady_ns are the same instant — when the Source released the frame (after
// decoding and, for realtime files, after pacing) — on two clocks: the system clock, comparable between
// processes and hosts (frame-to-stored latency at the aggregator), and the steady clock, for latencies
// inside this process.
//
// decode_ns is the time the Source spent turning this picture into pixels, on the steady clock: for FFmpeg
// inputs the libavcodec send/receive calls since the previous picture plus the conversion to BGR and the
// rotation (demuxing, network waits, pacing and pictures skipped by target_fps are not included); for
// images, cv::imread (reading the file and decoding it).
//
// Thread-safety: a Frame is a plain value (movable, copyable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vigil::video {

struct Frame {
  std::string stream_id;
  uint64_t run = 0;
  uint64_t seq = 0;
  int64_t pts_ns = 0;            // stream timeline, ns (above)
  int64_t capture_time_ns = 0;   // std::chrono::system_clock, ns since the Unix epoch
  int64_t source_steady_ns = 0;  // std::chrono::steady_clock, ns since its epoch
  int64_t decode_ns = 0;         // decoding + conversion time of this picture, ns (above)
  int width = 0;                 // pixels, upright
  int height = 0;                // pixels, upright
  int stride = 0;                // bytes per row; width * 3 (rows are not padded)
  int rotation = 0;              // degrees clockwise applied to the decoded picture: 0, 90, 180 or 270
  std::vector<uint8_t> bgr;      // height * stride bytes, layout above
};

}  // namespace vigil::video
