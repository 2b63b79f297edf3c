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
// Or, only from a Source with SourceOptions::hwaccel and deliver_device_frames set, in GPU memory: then
// `device` is set, `bgr` is empty and `stride` is 0 (DeviceFrame below; DownloadBgr turns it into the
// host form). Such a Source may still deliver some frames in host memory (see source.h): a consumer
// handles both forms.
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
// rotation (demuxing, network waits, pacing and pictures skipped by target_fps are not included), plus, for
// pictures decoded on a GPU, the copy to host memory when they are delivered or downloaded in host form;
// for images, cv::imread (reading the file and decoding it); for synthetic sources, copying the
// precomputed pattern into the frame.
//
// Thread-safety: a Frame is a plain value (movable, copyable); copies of a device frame share its GPU
// pixels (read-only), which stay valid while any copy holds them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::video {

// The Y'CbCr -> R'G'B' matrix of a picture, by its luma weights Kr and Kb (Kg = 1 - Kr - Kb):
//   R = Y + 2(1 - Kr) Cr,  B = Y + 2(1 - Kb) Cb,  G = Y - (2 Kb (1 - Kb) Cb + 2 Kr (1 - Kr) Cr) / Kg
// with Y in [0, 1] and Cb, Cr in [-0.5, 0.5] after range scaling (ITU-R BT.601-7 §2.5, BT.709-6 §3).
// It is the matrix the picture declares; unspecified: BT.709 from 720 lines up, else BT.601 (the choice
// the host conversion makes, so a GPU conversion that follows this matches it).
enum class YuvMatrix {
  kBt601,      // ITU-R BT.601 (also BT.470BG, SMPTE 170M): Kr 0.299, Kb 0.114
  kBt709,      // ITU-R BT.709: Kr 0.2126, Kb 0.0722
  kFcc,        // FCC 73.682 (US 1953): Kr 0.30, Kb 0.11
  kSmpte240m,  // SMPTE 240M: Kr 0.212, Kb 0.087
  kBt2020,     // ITU-R BT.2020 non-constant luminance (also used for constant): Kr 0.2627, Kb 0.0593
};

// The luma weights {Kr, Kb} of `matrix`, as listed above.
struct LumaWeights {
  double kr = 0, kb = 0;
};
LumaWeights LumaWeightsOf(YuvMatrix matrix);

// A picture in GPU memory as NVDEC decoded it (FFmpeg's CUDA hwaccel, AV_PIX_FMT_CUDA with sw_format NV12).
// Layout: NV12, 8 bits per sample. The luma plane is Frame::height rows of Frame::width bytes, row r at
// byte y + r * y_pitch. The chroma plane is (height + 1) / 2 rows of (width + 1) / 2 interleaved (Cb, Cr)
// byte pairs, row r at byte uv + r * uv_pitch, pair c of it at byte 2c (Cb) and 2c + 1 (Cr). Pitches are
// in bytes (>= width). The picture is never rotated and has square pixels (a picture needing either is
// delivered in host form); rotation is 0.
// Values: studio swing (Y 16..235, Cb/Cr 16..240) unless full_range (0..255); convert with `matrix`. The
// host conversion (DownloadBgr, libswscale's unscaled 4:2:0 path) gives luma pixel (x, y) the chroma pair
// (x / 2, y / 2), without interpolation; a GPU conversion doing the same agrees with it up to rounding.
//
// Memory: device pointers (CUdeviceptr values) in the *primary* CUDA context of device `device` (the
// context the CUDA runtime API uses), so runtime-API kernels on that device read them directly.
// Ordering: the planes are complete when the Frame is delivered. (In builds with CUDA each GPU-decoding
// Source has a non-blocking stream of its own for FFmpeg's mapping and copies, synchronised before Next()
// returns, so decoders never wait for one another and consumers need no wait. In builds without CUDA,
// FFmpeg copies on the legacy default stream: a consumer on a non-blocking stream must first wait for it.)
// Lifetime: `keepalive` owns a reference to FFmpeg's frame (an AVFrame): the planes stay valid and
// unchanged while any copy of it lives, also after later frames are decoded and after the Source is
// destroyed. Releasing the last copy returns the surface to FFmpeg's pool (a dynamic pool: holding
// frames costs GPU memory, ~1.5 bytes per pixel each, and never stalls the decoder); release it only
// after GPU work reading the planes has completed. Consumers treat the planes as read-only.
// Thread-safety: any thread may read the planes and release the keepalive.
struct DeviceFrame {
  int device = 0;              // CUDA device ordinal (as CUDA_VISIBLE_DEVICES numbers them)
  const uint8_t* y = nullptr;  // device pointer: luma plane
  const uint8_t* uv = nullptr;  // device pointer: interleaved chroma plane
  int y_pitch = 0;             // bytes per luma row
  int uv_pitch = 0;            // bytes per chroma row
  YuvMatrix matrix = YuvMatrix::kBt601;
  bool full_range = false;     // true: full range ("JPEG"/"pc"); false: studio swing ("MPEG"/"tv")
  std::shared_ptr<void> keepalive;  // owns FFmpeg's frame; opaque to consumers
  // A device frame not made by a Source (a hot standby's mirrored picture, replication/frame_ring.h): its owner
  // gives, instead of FFmpeg's frame, a copy of the planes to host memory — `dst` gets the luma plane packed
  // (height rows of width bytes), then the chroma plane packed ((height + 1) / 2 rows of 2 × ((width + 1) / 2)
  // bytes). DownloadBgr uses it. Empty for a Source's frames.
  std::function<Status(uint8_t* dst)> copy_to_host;
};

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
  int stride = 0;                // bytes per row; width * 3 (rows are not padded); 0 for a device frame
  int rotation = 0;              // degrees clockwise applied to the decoded picture: 0, 90, 180 or 270
  std::vector<uint8_t> bgr;      // height * stride bytes, layout above; empty for a device frame
  std::optional<DeviceFrame> device;  // set: the pixels are in GPU memory (above), not in `bgr`
};

// Turns a device frame into the host form: copies the picture to host memory (av_hwframe_transfer_data),
// converts it to BGR exactly as a CPU-decoded picture of the stream is converted (same libswscale path,
// matrix and range: the result equals the CPU decode wherever the decoded Y'CbCr samples do), fills
// `bgr` and `stride`, resets `device` and adds the time taken to decode_ns. A host frame is left as it is.
// A device frame with copy_to_host (not a Source's) is copied with it and converted the same way.
// Errors (the message names the stream and seq; the frame is left unchanged): Internal (the copy from the
// GPU failed), ResourceExhausted (no host memory), InvalidArgument (`device` without FFmpeg's frame in
// keepalive and without copy_to_host).
// Thread-safety: any thread; distinct Frames concurrently (not the same Frame).
Status DownloadBgr(Frame& frame);

}  // namespace vigil::video
