// vigil/video/writer.h — encodes BGR pictures into a video file with FFmpeg 5.1 (libavformat muxes,
// libavcodec encodes, libswscale converts BGR24 to the encoder's YUV).
//
//   vigil::video::WriterOptions o;
//   o.path = "runs/detect/vtest.mp4";  o.width = 768;  o.height = 576;  o.fps = 10;
//   auto writer = vigil::video::VideoWriter::Open(o);      // error names the file and the reason
//   (*writer)->Write(bgr, 768 * 3, pts_ns);                 // once per picture, pts increasing
//   (*writer)->Close();                                     // flushes the encoder, writes the index
//
// Codec: options.codec, else H.264 through libx264 when this FFmpeg has it (Debian's does), else
// MPEG-4 Part 2 (FFmpeg's own "mpeg4" encoder, always built in). Pixel format: yuv420p, or yuv444p for
// an odd width or height with libx264 (4:2:0 needs even sizes). Quality: libx264 CRF 23 (its default),
// preset "veryfast"; mpeg4 a fixed quantiser of 3. The container comes from the file extension
// (avformat_alloc_output_context2); .mp4, .mkv, .avi and .mov all take both codecs.
// Timestamps: containers that take any timestamps (FFmpeg's AVFMT_VARIABLE_FPS: Matroska, MPEG-TS, FLV)
// get a 1/1000 s time base; the others (AVI, MP4, MOV) a time base of 1/fps, each picture in the frame
// slot nearest its pts_ns (as the ffmpeg CLI's default constant-frame-rate mode for them, but no picture is
// duplicated or dropped: AVI counts frames, it has no timestamps). A pts that does not advance by at
// least one tick is moved one tick after the previous one (counted in retimed()).
//
// Pixels: `bgr` points at `height` rows of `width` BGR pixels (8-bit, interleaved, OpenCV CV_8UC3), row y
// at bgr + y * stride bytes; stride >= width * 3.
// Thread-safety: one thread at a time. Errors: InvalidArgument (bad size, unknown container),
// Unimplemented (no such encoder), Unavailable/DataLoss with FFmpeg's message (cannot create the file,
// encoder or muxer failures); the file name is in every message. Destroying an unclosed writer closes it
// (errors then are lost: call Close to see them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "vigil/common/status.h"

namespace vigil::video {

struct WriterOptions {
  std::string path;        // output file (required); its extension picks the container
  int width = 0;           // pixels, > 0
  int height = 0;          // pixels, > 0
  double fps = 25;         // nominal frame rate, > 0 (stream header; the pts give the real timing). Default: 25
  std::string codec;       // libavcodec encoder name; "" = libx264 if present, else mpeg4. Default: ""
};

class VideoWriter {
 public:
  static StatusOr<std::unique_ptr<VideoWriter>> Open(const WriterOptions& options);
  ~VideoWriter();
  VideoWriter(const VideoWriter&) = delete;
  VideoWriter& operator=(const VideoWriter&) = delete;

  // Encodes one picture shown at pts_ns. REQUIRES: Close() not called yet.
  Status Write(const uint8_t* bgr, int stride, int64_t pts_ns);
  // Drains the encoder and writes the trailer; idempotent (a second call returns the first's result).
  Status Close();

  const std::string& codec_name() const;  // the encoder in use, e.g. "libx264"
  uint64_t frames() const;                // pictures written
  uint64_t retimed() const;               // pictures whose pts was moved (above)

 private:
  struct Impl;
  explicit VideoWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::video
