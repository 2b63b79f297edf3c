// vigil/video/source.h — where frames come from: video files, network streams, image folders, test patterns.
//
// A Source is a pull interface: Next() decodes until it has the next frame to deliver and returns it,
// std::nullopt at the end of the input, or an error. OpenSource(options) picks the kind from the URI
// (ClassifyUri):
//   * files in any container/codec this FFmpeg (libavformat/libavcodec 5.1) reads;
//   * network URLs (rtsp://, rtmp://, http(s)://, including HLS playlists, any other "scheme://"
//     FFmpeg has a protocol for): live sources that reconnect with exponential backoff and full jitter;
//   * image folders (the files with an image extension, non-recursive) and globs ("dir/*.jpg"),
//     in byte-wise sorted order, decoded with OpenCV (cv::imread, IMREAD_COLOR: EXIF orientation applied);
//   * synthetic test patterns, "synthetic:WIDTHxHEIGHT[?fps=F&frames=N&live=0|1]" (like GStreamer's videotestsrc or
//     FFmpeg's testsrc): no file and no decoder, to run the pipeline without decode cost. WIDTH, HEIGHT:
//     1..16384 pixels; fps: the frame rate of the stream's timeline, 0.001..1000 (Default: 30); frames:
//     how many frames before the end, >= 1 (Default: endless; with loop, the N frames start over). Each
//     parameter at most once, in any order; anything else fails OpenSource (InvalidArgument).
//     Frame k of a pass (k = 0, 1, ...) has pts k * 1e9 / fps ns, rounded (below 0.1 fps a frame step is
//     longer than the default max_pts_jump_ns, so Next() counts each frame as a timestamp fixup and steps
//     by the rounded 1e9 / fps instead), and pixel (x, y) = P(x + (k mod 256), y), where
//       P(u, y) = (B, G, R) = (u mod 256, floor(y * 255 / max(1, HEIGHT - 1)),
//                              255 when floor(u / 32) + floor(y / 32) is odd, else 0):
//     a 256-pixel blue sawtooth and a 32-pixel red checkerboard scrolling left one pixel per frame over a
//     vertical green ramp. Consecutive frames of a pass differ in every pixel; frame k equals frame k + 256
//     and frame k of every other open. P is computed once, at open, into a buffer 256 columns wider than
//     the frame (3 * (WIDTH + 256) * HEIGHT bytes); a frame is one memcpy per row (its decode_ns). Host
//     frames only. Without live=1 it behaves like a file (realtime paces it at fps, a StreamReader blocks
//     rather than drops, resume skips by position; pictures skipped for resume are not generated). With
//     live=1 it is a camera (live() true): picture p is due at open + p / fps by the steady clock whatever
//     `realtime` says (a reader that is late gets it at once), a StreamReader drops rather than blocks, and
//     IsLiveUri says so before it is opened, so the edge numbers it as a live source. It
//     shows no object: a detector finds nothing, so the stages after inference cost what an empty scene
//     costs. The timeline ends (end of input) at pts 2^62 ns. A file whose name starts with "synthetic:"
//     is opened as "./synthetic:...".
//
// What Next() does with each decoded picture, in this order (Frame documents the fields):
//   1. Timeline: pts_ns = the decoder's best_effort_timestamp, in ns from the stream's start_time.
//      A missing pts, a pts that does not increase, or a forward jump larger than max_pts_jump_ns is
//      replaced by the previous pts + the nominal frame duration (from the stream's frame rate, else 40 ms)
//      and counted (timestamp_fixups); later frames keep that offset. A new pass of a looped file and a
//      new network connection continue the timeline the same way, so pts_ns strictly increases.
//   2. target_fps (> 0): a frame is kept when its pts falls into a later slot of length 1/target_fps than
//      the last kept frame (slot = floor((pts - first pts) * target_fps)), so the rate is reduced by
//      timestamps, not by counting; skipped frames get no seq (counted: skipped_target_fps).
//   3. seq = frames kept so far in this Source (0, 1, 2, ...).
//   4. start_after_seq (resume): frames with seq <= it are decoded but not delivered (skipped_resume).
//      Resuming decodes from the start of the file; it does not seek.
//   5. realtime (files, images and synthetic sources; not network sources): waits until the frame is due
//      at the input's native rate, measured from the first delivered frame (a consumer that falls > 1 s
//      behind re-anchors the clock instead of receiving a burst). The wait is on the steady clock.
// Loop: at the end of a file (or image list, or a synthetic source's frames) with loop on, the input is
// reopened and the next pass continues the same run: seq and pts_ns go on increasing. A loop is the same
// endless stream, like a camera; giving each pass a new run would make (stream, run, seq) depend on how
// many passes an edge happened to see before a restart, and resume (start_after_seq) could not name a
// frame across passes.
//
// Real-file handling: display-matrix rotation (stream or frame side data; FFmpeg 5.x demuxers turn a
// "rotate" tag into it) is applied in multiples of 90 degrees (a mirrored or oblique matrix is logged and
// ignored); the decoded size (crop applied by libavcodec) is used, and a sample aspect ratio != 1 widens
// or narrows the picture to square pixels (apply_sample_aspect); conversion to BGR24 is libswscale
// (SWS_BILINEAR) with the frame's colour matrix and range (unspecified: BT.709 from 720 lines up, else
// BT.601); corrupt packets and frames are counted (decode_errors) and decoding goes on; a file that
// ends early — fewer frames than its header declares (MP4, AVI) or its last frame > max(0.5 s, 2 frames)
// before the duration its header declares (Matroska, FLV, IVF) — ends normally with one decode error
// counted (containers without a declared length, such as MPEG-TS, MPEG-PS and Ogg, cannot tell a cut;
// an MP4 cut before its index fails to open, DataLoss); nothing blocks longer than the timeouts.
//
// GPU decode (hwaccel "cuda[:N]", files and network sources; image folders and synthetic sources ignore it
// and deliver host frames, StreamStats::hwaccel saying "cpu (why)" when hwaccel names a GPU, also with
// deliver_device_frames). libavcodec's own
// decoder for the codec (h264, hevc, ...) decodes with FFmpeg's CUDA hwaccel (NVDEC) on device N, in its
// primary CUDA context. With deliver_device_frames, an 8-bit 4:2:0 picture (NV12 on the GPU) that needs no
// rotation, no sample-aspect resampling and no left/top crop is delivered in GPU memory (Frame::device,
// frame.h; the first picture that cannot be is logged once); every other picture is copied to host memory
// and goes through the steps above like a CPU-decoded one (DownloadBgr's path: the same BGR as the CPU
// decoder's wherever the decoded samples are the same). GPU decoding never fails a stream: where it cannot
// be used, the stream is decoded on the CPU as without hwaccel, one warning per Source names the stream
// and the reason, and StreamStats::hwaccel says so ("cpu (reason)"). The reasons: the device cannot be
// opened (no driver, no such GPU; FFmpeg's own message is quoted; checked once per Source), the codec has
// no CUDA hwaccel in this FFmpeg, the decoder does not offer CUDA frames for the stream (an unsupported
// profile, or NVDEC failed to start), or the pictures are not 8-bit 4:2:0 (10-bit, 4:2:2, 4:4:4 would come
// as P010/YUV444 surfaces). The decision is made again for each pass of a looped file and each connection.
// A GPU picture that cannot be copied (a CUDA error) is counted as a decode error and skipped.
// StreamStats::hwaccel says "cuda:N" from the pass's first picture on (when the decoder has offered CUDA
// frames); until then it keeps the previous pass's value ("" before the first). In builds with CUDA each
// GPU-decoding Source has a non-blocking CUDA stream of its own for FFmpeg's mapping and copies (not the
// legacy default stream that all decoders would share) and synchronises it before Next() returns a device
// frame, so the frame is complete; opening such a Source and Next() make device N the calling thread's
// current CUDA device (runtime API) and touch no other device.
// The primary context: FFmpeg 5.1 wants it with flags CU_CTX_SCHED_BLOCKING_SYNC and sets them when it is
// the first to use the device; if the process has already made the context active with other flags (the
// CUDA runtime's default is cudaDeviceScheduleAuto), opening fails ("Primary context already active with
// incompatible flags") and the stream decodes on the CPU. A process that also uses the CUDA runtime opens
// its hwaccel sources before its first CUDA call on that device, or calls
// cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) before it.
//
// Thread-safety: Next() from one thread at a time. Interrupt() and Stats() from any thread, any time.
// Errors (Next / OpenSource), each message naming the stream and its URI (passwords redacted):
//   NotFound (missing file, empty folder or glob), InvalidArgument (no video stream, bad options, a
//   synthetic: URI that does not parse or is out of range, with the reason), Unimplemented (no decoder),
//   DataLoss (unreadable file), Unavailable (network source gave up after max_attempts),
//   ResourceExhausted (a synthetic source's pattern or frame cannot be allocated), Cancelled (after
//   Interrupt()). A failing Source affects no other Source.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/video/frame.h"
#include "vigil/video/stats.h"

namespace vigil::video {

// Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015):
// the wait before reconnect attempt n (n = 0 after a connection that delivered frames, +1 for every
// attempt since that failed or delivered nothing) is uniform in [0, min(max_delay, initial_delay * 2^n)].
struct ReconnectPolicy {
  std::chrono::milliseconds initial_delay{500};  // Default: 0.5 s
  std::chrono::milliseconds max_delay{30000};    // Default: 30 s
  int max_attempts = 0;  // consecutive failed attempts before Next() fails (Unavailable); 0 = never give up
};
// The delay for attempt `n` given a uniform sample `u` in [0, 1]: u * min(max_delay, initial_delay * 2^n).
std::chrono::nanoseconds BackoffDelay(const ReconnectPolicy& policy, int n, double u);

struct SourceOptions {
  std::string uri;        // file path, URL, folder, glob or synthetic:WxH (required)
  std::string stream_id;  // Default: the uri
  uint64_t run = 0;       // the run the owner assigns; a Source never changes it
  // Files, images, synthetic: deliver at the native rate, like a camera. Default: false, as fast as possible
  bool realtime = false;
  bool loop = false;      // files/images/synthetic with frames: start over at the end (same run; seq continues)
  double target_fps = 0;  // > 0: reduce the rate by timestamps; Default: 0 = every frame
  std::optional<uint64_t> start_after_seq;  // resume: deliver only frames with seq > this
  double image_fps = 1.0;                   // images: pts spacing (1 / image_fps s) and realtime rate
  int64_t max_pts_jump_ns = 10'000'000'000;  // a larger forward pts jump is a discontinuity. Default: 10 s
  bool apply_sample_aspect = true;           // resample non-square pixels to square ones
  int decoder_threads = 1;                   // libavcodec thread_count (0 = FFmpeg's choice)
  // Where to decode (files, network): "" or "cpu" = on the CPU; "cuda" = CUDA device 0; "cuda:N" = CUDA
  // device N (NVDEC through FFmpeg's CUDA hwaccel; above). Anything else: InvalidArgument. Default: ""
  std::string hwaccel;
  // With hwaccel: deliver pictures that can stay in GPU memory as device frames (Frame::device, bgr empty).
  // false: every picture is copied to host memory and converted to BGR before Next() returns. Default: false
  bool deliver_device_frames = false;
  // Network sources.
  std::string rtsp_transport = "tcp";                  // FFmpeg rtsp_transport: tcp, udp, udp_multicast, http
  std::chrono::milliseconds connect_timeout{10000};    // open + stream probing, each attempt. Default: 10 s
  std::chrono::milliseconds read_timeout{10000};       // no packet for this long = connection lost. Default: 10 s
  ReconnectPolicy reconnect;
  std::map<std::string, std::string> demuxer_options;  // passed to avformat_open_input (e.g. user_agent)
};

enum class SourceKind { kFile, kNetwork, kImages, kSynthetic };
// kSynthetic for "synthetic:..." (lower case; checked first, also when the rest does not parse); kNetwork
// for "<scheme>://..." other than file://; kImages for a directory, a path with glob characters (*?[) or
// a path with an image extension; kFile otherwise.
SourceKind ClassifyUri(const std::string& uri);
// Whether a source opened from `uri` will be live (Source::live): network URIs and "synthetic:...live=1".
bool IsLiveUri(const std::string& uri);

// The CUDA device a SourceOptions::hwaccel value names: nullopt for "" and "cpu", 0 for "cuda", N for
// "cuda:N" (N decimal, 0..1023). Errors: InvalidArgument naming the option and the value.
StatusOr<std::optional<int>> ParseHwaccel(const std::string& hwaccel);

// Opens FFmpeg's CUDA device (NVDEC) on CUDA device `device` in its primary context, with FFmpeg's context
// flags (CU_CTX_SCHED_BLOCKING_SYNC), and keeps that context alive while the returned handle (or a copy)
// lives. FFmpeg cannot use a primary context that the CUDA runtime has already made active with other
// flags, so a process that decodes with hwaccel and also runs the CUDA runtime on that device (the edge
// with its model on the GPU) calls this before its first runtime call there; the runtime then shares the
// context. Errors: Unavailable quoting FFmpeg's reason (no driver, no such device, flags). Thread-safe.
StatusOr<std::shared_ptr<void>> RetainCudaDecodeDevice(int device);

// "rtsp://user:secret@host/x" -> "rtsp://user:***@host/x"; other strings unchanged.
std::string RedactUri(const std::string& uri);

class Source {
 public:
  virtual ~Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // The next frame; std::nullopt at the end of the input; an error ends the Source (state kFailed, or
  // kStopped for Cancelled). After the end or an error, Next() returns the same again. A network source
  // never ends by itself: it reconnects until Interrupt() or max_attempts.
  StatusOr<std::optional<Frame>> Next();
  // Makes a running or later Next() return Cancelled promptly: it wakes backoff and pacing waits and
  // aborts blocking FFmpeg I/O through its interrupt callback; the state becomes kStopped unless the
  // Source has already ended or failed. Thread-safe; idempotent.
  void Interrupt();
  // realtime: frames with seq ≤ `seq` are delivered at once, not paced (a resumed run whose owner discards
  // what was already reported, or a hot standby following its primary's cursor), and the next paced frame
  // — the first after them, or after this call — is paced from when it is delivered (the clock starts anew).
  // Only raises the bound. Thread-safe (also while Next() runs).
  void DoNotPaceThrough(uint64_t seq) {
    const int64_t to = static_cast<int64_t>(std::min<uint64_t>(seq, std::numeric_limits<int64_t>::max()));
    for (int64_t cur = unpaced_through_.load(); cur < to && !unpaced_through_.compare_exchange_weak(cur, to);) {
    }
    reanchor_.store(true);
  }
  StreamStats Stats() const { return stats_.Snapshot(); }
  bool live() const { return live_; }  // network source: a reader should drop rather than block (files,
                                       // images and synthetic sources: false)
  // Pictures one pass of the input holds by its header (a file's frame count, else its duration × frame
  // rate; an image list's length; a synthetic source's frames), before target_fps and resume skipping;
  // nullopt when unknown or endless (network sources, containers declaring neither, synthetic sources
  // without frames). For progress display: a damaged file may deliver fewer.
  std::optional<uint64_t> declared_frames() const { return declared_frames_; }
  const SourceOptions& options() const { return options_; }

  // What opening the input told before any frame: the upright frame size in display pixels (rotation
  // and sample aspect applied, as Frame has them) and the nominal frame rate of the input (before
  // target_fps). 0 where unknown: network sources connect in the first Next(); image folders give only
  // the rate (image_fps); synthetic sources give all three, from their URI. Set before OpenSource returns
  // and constant afterwards.
  struct Probe {
    int width = 0, height = 0;  // pixels
    double fps = 0;             // frames per second
  };
  const Probe& probed() const { return probed_; }

 protected:
  // A picture from the decoder, before the steps Next() applies.
  struct Picture {
    Frame frame;                    // pixels, width, height, stride, rotation filled in
    std::optional<int64_t> pts_ns;  // from the input's start; nullopt when unknown
    bool discontinuity = false;     // first picture of a new pass / connection
    int64_t nominal_duration_ns = 40'000'000;
  };
  Source(SourceOptions options, bool live);
  // The next picture in presentation order, std::nullopt at the end, or an error (see above).
  virtual StatusOr<std::optional<Picture>> DecodeNext() = 0;

  bool interrupted() const { return interrupted_.load(std::memory_order_relaxed); }
  // Sleeps for `d` or until Interrupt(); false when interrupted.
  bool WaitFor(std::chrono::nanoseconds d) VIGIL_EXCLUDES(wait_mu_);
  const std::string& who() const { return who_; }  // "stream 'id' (uri)" for logs and errors

  SourceOptions options_;
  mutable StatsRecorder stats_;
  Probe probed_;  // set by the opener, before the Source is shared
  std::optional<uint64_t> declared_frames_;  // set by the implementation before OpenSource returns

 private:
  int64_t Retime(const Picture& picture);
  bool KeepForTargetFps(int64_t pts_ns);
  bool Pace(int64_t pts_ns);

  const bool live_;
  const std::string who_;
  std::atomic<bool> interrupted_{false};
  // WaitFor sleeps on wait_cv_; Interrupt sets interrupted_ (an atomic) under wait_mu_ so that the wake-up is
  // not lost between WaitFor's check and its wait. wait_mu_ guards no field.
  Mutex wait_mu_;
  CondVar wait_cv_;
  // Next()'s state (one calling thread).
  std::optional<Status> finished_;  // set when Next() has returned the end or an error
  bool have_pts_ = false;
  int64_t last_pts_ns_ = 0, pts_offset_ns_ = 0;
  bool have_fps_origin_ = false;
  int64_t fps_origin_ns_ = 0, last_fps_slot_ = 0;
  uint64_t next_seq_ = 0;
  bool paced_ = false;
  std::atomic<int64_t> unpaced_through_{-1};  // DoNotPaceThrough; -1: none
  std::atomic<bool> reanchor_{false};          // DoNotPaceThrough: the next paced frame starts the clock
  int64_t pace_anchor_ns_ = 0;  // SystemClock()->SteadyNs() of the paced frame that started the clock
  int64_t pace_anchor_pts_ns_ = 0;
};

// Opens the input named by options.uri. Files are opened and probed here (a missing or unreadable file
// fails now, naming the path); folders and globs are listed here (no image: NotFound); synthetic URIs are
// parsed and their pattern computed here; network sources connect in the first Next(), so that a camera
// that is down does not fail the stream.
StatusOr<std::unique_ptr<Source>> OpenSource(SourceOptions options);

namespace internal {
// The implementations behind OpenSource (ffmpeg_source.cc, image_source.cc, synthetic_source.cc). `url` is
// what FFmpeg opens: the network URL, or "file:" + the path (so that a ':' in a file name is not read as a
// protocol).
StatusOr<std::unique_ptr<Source>> OpenFfmpegSource(SourceOptions options, std::string url, bool live);
StatusOr<std::unique_ptr<Source>> OpenImageSource(SourceOptions options, std::vector<std::string> paths);
// Parses options.uri ("synthetic:..."; errors name the stream and the URI) and computes the pattern.
StatusOr<std::unique_ptr<Source>> OpenSyntheticSource(SourceOptions options);
// Whether "synthetic:..." parses with live=1.
bool SyntheticUriIsLive(const std::string& uri);
}  // namespace internal

}  // namespace vigil::video
