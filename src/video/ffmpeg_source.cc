// Files and network streams through FFmpeg 5.1: libavformat demuxes, libavcodec decodes (send/receive
// API; on a GPU with FFmpeg's CUDA hwaccel when asked), libswscale converts to BGR24, OpenCV rotates by the
// display matrix. source.h states the contract; frame.h the device frames and DownloadBgr.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>

#include <opencv2/core.hpp>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/hwcontext.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}
#if VIGIL_HAVE_CUDA
#include <cuda_runtime_api.h>
extern "C" {
#include <libavutil/hwcontext_cuda.h>
}
#endif

#include "vigil/video/ffmpeg_handles.h"
#include "vigil/video/source.h"

namespace vigil::video::internal {
namespace {

constexpr AVRational kNanoseconds{1, 1'000'000'000};
constexpr int kMaxConsecutiveReadErrors = 100;

int64_t SteadyNowNs() { return SystemClock()->SteadyNs(); }

// Set: FFmpeg's error messages on this thread are appended here too (one per line), to say why a call
// failed where its error code does not (a missing driver comes back as EPERM).
thread_local std::string* ffmpeg_errors = nullptr;

// FFmpeg's log lines go to spdlog (warnings and errors at debug, info at trace): the Source reports what
// matters itself, with counters, and a corrupt stream would otherwise print for every frame.
void LogToSpdlog(void* avcl, int level, const char* fmt, va_list args) {
  if (level > AV_LOG_INFO) return;
  if (ffmpeg_errors != nullptr && level <= AV_LOG_ERROR) {
    va_list copy;
    va_copy(copy, args);
    char message[512];
    std::vsnprintf(message, sizeof(message), fmt, copy);
    va_end(copy);
    ffmpeg_errors->append(message);
  }
  const auto spd_level = level <= AV_LOG_WARNING ? spdlog::level::debug : spdlog::level::trace;
  if (!spdlog::default_logger_raw()->should_log(spd_level)) return;
  thread_local std::string line;
  thread_local int print_prefix = 1;
  char buf[1024];
  av_log_format_line2(avcl, level, fmt, args, buf, sizeof(buf), &print_prefix);
  line += buf;
  if (!line.empty() && line.back() == '\n') {
    line.pop_back();
    spdlog::log(spd_level, "ffmpeg: {}", line);
    line.clear();
  }
}

// FFmpeg's CUDA device (NVDEC) on CUDA device `device`, in its primary context — the one the CUDA runtime
// uses, so that runtime kernels can read the frames. Errors quote FFmpeg's reason.
StatusOr<BufferRefPtr> OpenCudaDevice(int device) {
  AVBufferRef* ctx = nullptr;
  AVDictionary* options = nullptr;
  av_dict_set(&options, "primary_ctx", "1", 0);
  std::string said;
  ffmpeg_errors = &said;
  const int r = av_hwdevice_ctx_create(&ctx, AV_HWDEVICE_TYPE_CUDA, std::to_string(device).c_str(), options, 0);
  ffmpeg_errors = nullptr;
  av_dict_free(&options);
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  for (size_t p = said.find('\n'); p != std::string::npos; p = said.find('\n', p)) said.replace(p, 1, "; ");
  if (r < 0) {
    return absl::UnavailableError(StrCat("cannot open CUDA device ", device, ": ", said.empty() ? AvErrorString(r) : said));
  }
  return BufferRefPtr(ctx);
}

#if VIGIL_HAVE_CUDA
// The CUDA stream FFmpeg enqueues a device context's work on (AVCUDADeviceContext::stream).
cudaStream_t StreamOf(const BufferRefPtr& device) {
  const auto* hw = reinterpret_cast<const AVHWDeviceContext*>(device->data);
  return reinterpret_cast<cudaStream_t>(static_cast<const AVCUDADeviceContext*>(hw->hwctx)->stream);
}

// Gives a Source's CUDA device context a non-blocking stream of its own. FFmpeg 5.1 enqueues NVDEC's output
// mapping and its copies on AVCUDADeviceContext::stream, by default the legacy default stream, which every
// decoder of the process would then share: one stream's pictures would wait for every other stream's, and a
// consumer ordering itself after that stream waits for all of them (measured: 64 NVDEC streams on an H200
// held 2 s p99 latency that way). The stream is destroyed with the device context (AVHWDeviceContext::free).
// The calling thread's current CUDA device becomes `ordinal` (never another device: touching a device's
// primary context through the runtime before FFmpeg has set its flags would make FFmpeg refuse it).
Status UseOwnStream(const BufferRefPtr& device, int ordinal) {
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaSetDevice(ordinal);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    return absl::UnavailableError(StrCat("cannot create a CUDA stream on device ", ordinal, ": ", cudaGetErrorString(e)));
  }
  auto* hw = reinterpret_cast<AVHWDeviceContext*>(device->data);
  static_cast<AVCUDADeviceContext*>(hw->hwctx)->stream = reinterpret_cast<CUstream>(stream);
  hw->user_opaque = stream;
  hw->free = [](AVHWDeviceContext* c) { cudaStreamDestroy(static_cast<cudaStream_t>(c->user_opaque)); };
  return absl::OkStatus();
}
#endif

void InitFfmpegOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    av_log_set_callback(&LogToSpdlog);
    avformat_network_init();
  });
}

Status AvStatus(int err, const std::string& message) {
  switch (err) {
    case AVERROR(ENOENT): return absl::NotFoundError(message);
    case AVERROR(EACCES):
    case AVERROR(EPERM): return absl::PermissionDeniedError(message);
    case AVERROR_INVALIDDATA:
    case AVERROR_EOF: return absl::DataLossError(message);
    case AVERROR_EXIT: return absl::DeadlineExceededError(message);
    case AVERROR_PROTOCOL_NOT_FOUND:
    case AVERROR_DEMUXER_NOT_FOUND:
    case AVERROR_DECODER_NOT_FOUND: return absl::UnimplementedError(message);
    default: return absl::UnavailableError(message);
  }
}

// libswscale colour matrix for a frame: its own, or the usual guess for unspecified ones (BT.709 for HD).
int SwsColorspace(AVColorSpace colorspace, int height) {
  switch (colorspace) {
    case AVCOL_SPC_BT709: return SWS_CS_ITU709;
    case AVCOL_SPC_FCC: return SWS_CS_FCC;
    case AVCOL_SPC_SMPTE240M: return SWS_CS_SMPTE240M;
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL: return SWS_CS_BT2020;
    case AVCOL_SPC_BT470BG:
    case AVCOL_SPC_SMPTE170M: return SWS_CS_ITU601;
    default: return height >= 720 ? SWS_CS_ITU709 : SWS_CS_ITU601;
  }
}

// The deprecated full-range "J" formats become their plain twins with full range set explicitly.
AVPixelFormat PlainFormat(AVPixelFormat format, bool* full_range) {
  switch (format) {
    case AV_PIX_FMT_YUVJ420P: *full_range = true; return AV_PIX_FMT_YUV420P;
    case AV_PIX_FMT_YUVJ422P: *full_range = true; return AV_PIX_FMT_YUV422P;
    case AV_PIX_FMT_YUVJ444P: *full_range = true; return AV_PIX_FMT_YUV444P;
    case AV_PIX_FMT_YUVJ440P: *full_range = true; return AV_PIX_FMT_YUV440P;
    case AV_PIX_FMT_YUVJ411P: *full_range = true; return AV_PIX_FMT_YUV411P;
    default: return format;
  }
}

// What libswscale converts a picture from: its pixel format (a "J" format as its plain twin), colour
// matrix and range. The one place that reads a picture's colour, for host and device frames alike.
struct Colour {
  AVPixelFormat format;
  int sws_colorspace;
  bool full_range;
};
Colour ColourOf(const AVFrame& f) {
  bool full_range = f.color_range == AVCOL_RANGE_JPEG;
  const AVPixelFormat format = PlainFormat(AVPixelFormat(f.format), &full_range);
  return {format, SwsColorspace(f.colorspace, f.height), full_range};
}

YuvMatrix MatrixOf(int sws_colorspace) {
  switch (sws_colorspace) {
    case SWS_CS_ITU709: return YuvMatrix::kBt709;
    case SWS_CS_FCC: return YuvMatrix::kFcc;
    case SWS_CS_SMPTE240M: return YuvMatrix::kSmpte240m;
    case SWS_CS_BT2020: return YuvMatrix::kBt2020;
    default: return YuvMatrix::kBt601;
  }
}

// A host picture to BGR24 with libswscale (SWS_BILINEAR) in the picture's colour matrix and range; a width
// other than the picture's resamples it horizontally (to square pixels). Keeps its context between calls.
class BgrConverter {
 public:
  // Writes f.height rows of width * 3 bytes to `dst`. Unimplemented when libswscale cannot read the format.
  Status Convert(const AVFrame& f, int width, uint8_t* dst) {
    const Colour c = ColourOf(f);
    sws_.reset(sws_getCachedContext(sws_.release(), f.width, f.height, c.format, width, f.height, AV_PIX_FMT_BGR24,
                                    SWS_BILINEAR, nullptr, nullptr, nullptr));
    if (!sws_) {
      const char* name = av_get_pix_fmt_name(c.format);
      return absl::UnimplementedError(StrCat("cannot convert pixel format ", name ? name : "?", " to bgr24"));
    }
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(c.format);
    if (desc != nullptr && !(desc->flags & AV_PIX_FMT_FLAG_RGB) &&
        (sws_.get() != configured_ || c.sws_colorspace != colorspace_ || int(c.full_range) != full_range_)) {
      sws_setColorspaceDetails(sws_.get(), sws_getCoefficients(c.sws_colorspace), c.full_range,
                               sws_getCoefficients(SWS_CS_DEFAULT), /*dstRange=*/1, /*brightness=*/0,
                               /*contrast=*/1 << 16, /*saturation=*/1 << 16);
      configured_ = sws_.get();
      colorspace_ = c.sws_colorspace;
      full_range_ = c.full_range;
    }
    uint8_t* planes[1] = {dst};
    const int strides[1] = {width * 3};
    sws_scale(sws_.get(), f.data, f.linesize, 0, f.height, planes, strides);
    return absl::OkStatus();
  }

 private:
  SwsContextPtr sws_;
  SwsContext* configured_ = nullptr;  // the context whose colour details were last set, and for what
  int colorspace_ = -1, full_range_ = -1;
};

AVPixelFormat SwFormat(const AVFrame& f) {
  return f.hw_frames_ctx ? reinterpret_cast<const AVHWFramesContext*>(f.hw_frames_ctx->data)->sw_format
                         : AV_PIX_FMT_NONE;
}

// A CUDA picture copied to host memory (av_hwframe_transfer_data) with its properties (timestamps, colour,
// side data), cropped as the CPU decoder crops (FFmpeg applies only the right/bottom crop to GPU frames).
// NV12 comes back as yuv420p, the chroma plane deinterleaved (lossless): the format the CPU decoder gives,
// so that the conversion to BGR takes the same libswscale path (its unscaled 4:2:0 converter; NV12 would
// take the scaler's, which filters chroma differently) and equals the CPU decode's.
StatusOr<AVFramePtr> HostPicture(const AVFrame& hw) {
  AVFramePtr host(av_frame_alloc()), planar(av_frame_alloc());
  if (!host || !planar) return absl::ResourceExhaustedError("out of memory");
  int r = av_hwframe_transfer_data(host.get(), &hw, 0);
  if (r >= 0) r = av_frame_copy_props(host.get(), &hw);
  if (r >= 0) r = av_frame_apply_cropping(host.get(), AV_FRAME_CROP_UNALIGNED);
  if (r < 0) return absl::InternalError(StrCat("cannot copy the picture from the GPU: ", AvErrorString(r)));
  if (host->format != AV_PIX_FMT_NV12) return host;
  planar->format = AV_PIX_FMT_YUV420P;
  planar->width = host->width;
  planar->height = host->height;
  if ((r = av_frame_get_buffer(planar.get(), 0)) < 0 || (r = av_frame_copy_props(planar.get(), host.get())) < 0) {
    return absl::ResourceExhaustedError(StrCat("cannot allocate a host picture: ", AvErrorString(r)));
  }
  av_image_copy_plane(planar->data[0], planar->linesize[0], host->data[0], host->linesize[0], host->width,
                      host->height);
  for (int y = 0; y < (host->height + 1) / 2; ++y) {
    const uint8_t* uv = host->data[1] + size_t(y) * host->linesize[1];
    uint8_t* u = planar->data[1] + size_t(y) * planar->linesize[1];
    uint8_t* v = planar->data[2] + size_t(y) * planar->linesize[2];
    for (int x = 0; x < (host->width + 1) / 2; ++x) {
      u[x] = uv[2 * x];
      v[x] = uv[2 * x + 1];
    }
  }
  return planar;
}

double Seconds(int64_t ns) { return double(ns) * 1e-9; }

class FfmpegSource final : public Source {
 public:
  FfmpegSource(SourceOptions options, std::string url, bool live)
      : Source(std::move(options), live),
        url_(std::move(url)),
        cuda_device_(ParseHwaccel(options_.hwaccel).value_or(std::nullopt)) {}

  // Opens and probes the input and prepares its video decoder.
  Status Open();
  // Makes what the last Open() found the Source's probed(). REQUIRES: the Source is not shared yet.
  void PublishProbe() { probed_ = opened_; }

 protected:
  StatusOr<std::optional<Picture>> DecodeNext() override;

 private:
  static int InterruptCallback(void* opaque);
  // libavcodec's get_format: CUDA frames when offered for 8-bit 4:2:0 pictures, else a software format.
  static AVPixelFormat GetFormat(AVCodecContext* codec, const AVPixelFormat* formats);
  // Makes `codec` decode on cuda_device_ (before avcodec_open2), or records why it cannot.
  void SetUpHwaccel(AVCodecContext* codec, const AVCodec* decoder);
  void DecodeOnCpu(const std::string& why);
  void WarnOnce(const std::string& message);
  // Moves the CUDA picture in frame_ into `out` as a device frame.
  Status MakeDeviceFrame(Frame& out);
  void SetDeadline(std::chrono::milliseconds timeout) {
    deadline_ns_.store(SteadyNowNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count(),
                       std::memory_order_relaxed);
  }
  Status Cancelled() const { return absl::CancelledError(StrCat(who(), ": stopped")); }
  // Network: opens the input, waiting out the backoff before every attempt but the first.
  Status Connect();
  void Close();
  // True: frame_ holds a decoded picture. False: the input (or connection) has no more pictures.
  StatusOr<bool> ReadPicture();
  void StartDraining();
  StatusOr<Picture> ConvertFrame();
  int RotationFromMatrix(const uint8_t* data, size_t size);
  void CheckTruncation();

  const std::string url_;
  std::atomic<int64_t> deadline_ns_{std::numeric_limits<int64_t>::max()};
  FormatInputPtr format_;
  CodecContextPtr codec_;
  PacketPtr packet_{av_packet_alloc()};
  AVFramePtr frame_{av_frame_alloc()};
  BgrConverter converter_;
  std::vector<uint8_t> scratch_;  // the unrotated picture when a rotation applies
  // GPU decoding (hwaccel): the device, opened at the first Open() that needs it; never retried on failure.
  const std::optional<int> cuda_device_;
  BufferRefPtr hw_device_;
  std::string hw_device_error_;
  bool warned_hwaccel_ = false;
  int64_t decoder_ns_ = 0;        // time in libavcodec since the last picture was handed out (Frame::decode_ns)

  // Per open input.
  int stream_index_ = -1;
  AVRational time_base_{1, 1};
  AVRational stream_sample_aspect_{0, 1};
  int64_t start_pts_ = AV_NOPTS_VALUE;
  int64_t nominal_duration_ns_ = 40'000'000;
  int stream_rotation_ = 0;
  Probe opened_;  // size and rate the last Open() found
  std::optional<int64_t> declared_duration_ns_;
  int64_t declared_packets_ = 0;  // the stream's frame count per its header; 0 when unknown
  int64_t packets_this_input_ = 0;
  bool draining_ = false;
  bool new_input_ = false;  // the next picture is the first of a new pass / connection
  uint64_t pictures_this_input_ = 0;
  std::optional<int64_t> max_pts_ns_;

  // Reconnection (network).
  bool ever_attempted_ = false;
  int attempt_ = 0;  // consecutive attempts that failed or delivered nothing
  std::string reconnect_reason_;
  std::mt19937_64 rng_{std::random_device{}()};
  bool warned_matrix_ = false;
  bool described_ = false;  // declared_frames_ set
};

int FfmpegSource::InterruptCallback(void* opaque) {
  const auto* self = static_cast<const FfmpegSource*>(opaque);
  return self->interrupted() || SteadyNowNs() > self->deadline_ns_.load(std::memory_order_relaxed) ? 1 : 0;
}

Status FfmpegSource::Open() {
  if (!packet_ || !frame_) return absl::ResourceExhaustedError(StrCat(who(), ": out of memory"));
  AVFormatContext* raw = avformat_alloc_context();
  if (raw == nullptr) return absl::ResourceExhaustedError(StrCat(who(), ": out of memory"));
  raw->interrupt_callback.callback = &InterruptCallback;
  raw->interrupt_callback.opaque = this;
  AVDictionary* options = nullptr;
  for (const auto& [key, value] : options_.demuxer_options) av_dict_set(&options, key.c_str(), value.c_str(), 0);
  if (url_.rfind("rtsp", 0) == 0 && !av_dict_get(options, "rtsp_transport", nullptr, 0)) {
    av_dict_set(&options, "rtsp_transport", options_.rtsp_transport.c_str(), 0);
  }
  SetDeadline(options_.connect_timeout);
  int r = avformat_open_input(&raw, url_.c_str(), nullptr, &options);  // frees `raw` on failure
  for (const AVDictionaryEntry* e = nullptr; r >= 0 && (e = av_dict_get(options, "", e, AV_DICT_IGNORE_SUFFIX));) {
    spdlog::warn("{}: demuxer option '{}' was not used", who(), e->key);
  }
  av_dict_free(&options);
  // Past the deadline, the interrupt callback caused the error, whatever code the demuxer made of it.
  auto fail = [&](int err, std::string_view what) {
    if (interrupted()) return Cancelled();
    if (err == AVERROR_EXIT || SteadyNowNs() > deadline_ns_.load(std::memory_order_relaxed)) {
      return absl::DeadlineExceededError(
          StrCat(who(), ": ", what, ": timed out after ", options_.connect_timeout.count(), " ms"));
    }
    return AvStatus(err, StrCat(who(), ": ", what, ": ", AvErrorString(err)));
  };
  if (r < 0) return fail(r, "cannot open");
  FormatInputPtr format(raw);
  if ((r = avformat_find_stream_info(format.get(), nullptr)) < 0) return fail(r, "cannot read stream information");
  const AVCodec* decoder = nullptr;
  const int index = av_find_best_stream(format.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
  if (index == AVERROR_STREAM_NOT_FOUND) return absl::InvalidArgumentError(StrCat(who(), ": no video stream"));
  if (index < 0) return fail(index, "no decoder for the video stream");
  AVStream* stream = format->streams[index];
  CodecContextPtr codec(avcodec_alloc_context3(decoder));
  if (!codec) return absl::ResourceExhaustedError(StrCat(who(), ": out of memory"));
  if ((r = avcodec_parameters_to_context(codec.get(), stream->codecpar)) < 0) return fail(r, "bad codec parameters");
  codec->pkt_timebase = stream->time_base;
  codec->thread_count = options_.decoder_threads;
  if (cuda_device_) SetUpHwaccel(codec.get(), decoder);
  if ((r = avcodec_open2(codec.get(), decoder, nullptr)) < 0) {
    return fail(r, StrCat("cannot open the ", decoder->name, " decoder"));
  }
  for (unsigned i = 0; i < format->nb_streams; ++i) {
    if (int(i) != index) format->streams[i]->discard = AVDISCARD_ALL;
  }

  stream_index_ = index;
  time_base_ = stream->time_base;
  stream_sample_aspect_ = stream->sample_aspect_ratio;
  start_pts_ = stream->start_time;
  const AVRational rate = av_guess_frame_rate(format.get(), stream, nullptr);
  nominal_duration_ns_ = rate.num > 0 && rate.den > 0 ? av_rescale_q(1, av_inv_q(rate), kNanoseconds) : 40'000'000;
  size_t matrix_size = 0;
  const uint8_t* matrix = av_stream_get_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, &matrix_size);
  stream_rotation_ = RotationFromMatrix(matrix, matrix_size);
  declared_packets_ = stream->nb_frames;
  declared_duration_ns_.reset();
  if (stream->duration != AV_NOPTS_VALUE && stream->duration > 0) {
    declared_duration_ns_ = av_rescale_q(stream->duration, time_base_, kNanoseconds);
  } else if (format->duration_estimation_method == AVFMT_DURATION_FROM_STREAM && format->duration > 0) {
    declared_duration_ns_ = av_rescale_q(format->duration, AV_TIME_BASE_Q, kNanoseconds);
  }
  if (!live() && !described_) {  // once, before OpenSource returns: later writes would race with readers
    described_ = true;
    if (declared_packets_ > 0) {
      declared_frames_ = uint64_t(declared_packets_);
    } else if (declared_duration_ns_) {
      declared_frames_ = uint64_t(std::llround(double(*declared_duration_ns_) / double(nominal_duration_ns_)));
    }
  }
  draining_ = false;
  new_input_ = true;
  pictures_this_input_ = 0;
  packets_this_input_ = 0;
  max_pts_ns_.reset();
  int display_width = codec->width;
  const AVRational sar = stream_sample_aspect_;
  if (options_.apply_sample_aspect && sar.num > 0 && sar.den > 0 && sar.num != sar.den) {
    display_width = std::max(1, int(std::lround(double(codec->width) * sar.num / sar.den)));
  }
  const bool transposed = stream_rotation_ == 90 || stream_rotation_ == 270;
  opened_ = {transposed ? codec->height : display_width, transposed ? display_width : codec->height,
             rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0.0};
  spdlog::info("{}: opened {} {}x{} {} at {:.3f} fps, rotation {}", who(), format->iformat->name,
               codec->width, codec->height, decoder->name, rate.den > 0 ? av_q2d(rate) : 0.0, stream_rotation_);
  format_ = std::move(format);
  codec_ = std::move(codec);
  return absl::OkStatus();
}

void FfmpegSource::Close() {
  codec_.reset();
  format_.reset();
}

Status FfmpegSource::Connect() {
  while (true) {
    if (ever_attempted_) {
      stats_.reconnect_attempts.fetch_add(1, std::memory_order_relaxed);
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      const auto delay = BackoffDelay(options_.reconnect, attempt_, uniform(rng_));
      stats_.SetState(StreamState::kReconnecting, who(),
                      StrCat(reconnect_reason_, "; next attempt in ", std::chrono::duration<double>(delay).count(), " s"));
      if (!WaitFor(delay)) return Cancelled();
    }
    const bool reconnect = ever_attempted_;
    ever_attempted_ = true;
    stats_.SetState(StreamState::kConnecting, who());
    const Status opened = Open();
    if (opened.ok()) {
      if (reconnect) stats_.reconnects.fetch_add(1, std::memory_order_relaxed);
      stats_.SetState(StreamState::kStreaming, who());
      return absl::OkStatus();
    }
    if (interrupted()) return Cancelled();
    stats_.connect_failures.fetch_add(1, std::memory_order_relaxed);
    stats_.SetLastError(std::string(opened.message()));
    reconnect_reason_ = std::string(opened.message());
    ++attempt_;
    if (options_.reconnect.max_attempts > 0 && attempt_ >= options_.reconnect.max_attempts) {
      return absl::UnavailableError(StrCat(who(), ": giving up after ", attempt_,
                                           " failed attempts in a row; last: ", opened.message()));
    }
  }
}

void FfmpegSource::StartDraining() {
  draining_ = true;
  avcodec_send_packet(codec_.get(), nullptr);  // enter draining mode; cannot fail on an open decoder
}

StatusOr<bool> FfmpegSource::ReadPicture() {
  int read_errors = 0;
  while (true) {
    int64_t t0 = SteadyNowNs();
    int r = avcodec_receive_frame(codec_.get(), frame_.get());
    decoder_ns_ += SteadyNowNs() - t0;
    if (r == 0) return true;
    if (r == AVERROR_EOF) return false;
    if (r != AVERROR(EAGAIN)) stats_.DecodeError(StrCat(who(), ": decoder: ", AvErrorString(r)));
    if (draining_) return false;
    if (interrupted()) return Cancelled();
    SetDeadline(options_.read_timeout);
    r = av_read_frame(format_.get(), packet_.get());
    if (r == AVERROR_EOF) {
      StartDraining();
      continue;
    }
    if (r < 0) {
      if (interrupted()) return Cancelled();
      if (r == AVERROR_EXIT || SteadyNowNs() > deadline_ns_.load(std::memory_order_relaxed)) {
        return absl::DeadlineExceededError(StrCat(who(), ": no data for ", options_.read_timeout.count(), " ms"));
      }
      if (live()) return AvStatus(r, StrCat(who(), ": read error: ", AvErrorString(r)));
      stats_.DecodeError(StrCat(who(), ": read error: ", AvErrorString(r)));
      if (++read_errors >= kMaxConsecutiveReadErrors) {
        return AvStatus(r, StrCat(who(), ": giving up after ", read_errors, " read errors in a row: ", AvErrorString(r)));
      }
      continue;
    }
    read_errors = 0;
    if (packet_->stream_index == stream_index_) {
      ++packets_this_input_;
      if (packet_->flags & AV_PKT_FLAG_CORRUPT) {
        stats_.DecodeError(StrCat(who(), ": corrupt packet at byte ", packet_->pos));
      }
      t0 = SteadyNowNs();
      r = avcodec_send_packet(codec_.get(), packet_.get());
      decoder_ns_ += SteadyNowNs() - t0;
      if (r < 0 && r != AVERROR(EAGAIN)) {
        stats_.DecodeError(StrCat(who(), ": decoder rejected the packet at byte ", packet_->pos, ": ", AvErrorString(r)));
      }
    }
    av_packet_unref(packet_.get());
  }
}

void FfmpegSource::WarnOnce(const std::string& message) {
  if (warned_hwaccel_) return;
  warned_hwaccel_ = true;
  spdlog::warn("{}: hwaccel {}: {}", who(), options_.hwaccel, message);
}

void FfmpegSource::DecodeOnCpu(const std::string& why) {
  stats_.SetHwaccel(StrCat("cpu (", why, ")"));
  WarnOnce(StrCat("decoding on the CPU: ", why));
}

void FfmpegSource::SetUpHwaccel(AVCodecContext* codec, const AVCodec* decoder) {
  bool has_cuda = false;
  for (int i = 0; const AVCodecHWConfig* config = avcodec_get_hw_config(decoder, i); ++i) {
    has_cuda |= config->device_type == AV_HWDEVICE_TYPE_CUDA &&
                (config->methods & AV_CODEC_HW_CONFIG_METHOD_HW_DEVICE_CTX);
  }
  if (!has_cuda) return DecodeOnCpu(StrCat("the ", decoder->name, " decoder has no CUDA hwaccel in this FFmpeg"));
  if (!hw_device_ && hw_device_error_.empty()) {
    StatusOr<BufferRefPtr> device = OpenCudaDevice(*cuda_device_);
#if VIGIL_HAVE_CUDA
    if (device.ok()) {
      if (Status own = UseOwnStream(*device, *cuda_device_); !own.ok()) device = own;
    }
#endif
    if (device.ok()) {
      hw_device_ = std::move(*device);
    } else {
      hw_device_error_ = std::string(device.status().message());
    }
  }
  if (!hw_device_) return DecodeOnCpu(hw_device_error_);
  codec->hw_device_ctx = av_buffer_ref(hw_device_.get());
  codec->opaque = this;
  codec->get_format = &GetFormat;  // says "cuda:N" (or why not) once the decoder has offered its formats
}

AVPixelFormat FfmpegSource::GetFormat(AVCodecContext* codec, const AVPixelFormat* formats) {
  auto* self = static_cast<FfmpegSource*>(codec->opaque);
  bool cuda_offered = false;
  const AVPixelFormat* software = nullptr;
  for (const AVPixelFormat* p = formats; *p != AV_PIX_FMT_NONE; ++p) {
    cuda_offered |= *p == AV_PIX_FMT_CUDA;
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(*p);
    if (software == nullptr && desc != nullptr && !(desc->flags & AV_PIX_FMT_FLAG_HWACCEL)) software = p;
  }
  // libavcodec sets sw_pix_fmt to what the CPU would decode to; NVDEC gives NV12 for 8-bit 4:2:0 only.
  const AVPixelFormat sw = codec->sw_pix_fmt;
  if (cuda_offered && (sw == AV_PIX_FMT_YUV420P || sw == AV_PIX_FMT_YUVJ420P)) {
    self->stats_.SetHwaccel(StrCat("cuda:", *self->cuda_device_));
    return AV_PIX_FMT_CUDA;
  }
  const char* name = av_get_pix_fmt_name(sw);
  self->DecodeOnCpu(cuda_offered ? StrCat(name ? name : "?", " pictures: GPU frames are 8-bit 4:2:0 only")
                                 : StrCat("the ", codec->codec->name, " decoder does not offer CUDA frames for this ",
                                          name ? name : "?", " stream (a profile NVDEC does not take, or NVDEC failed "
                                          "to start: see the ffmpeg log at debug level)"));
  return software != nullptr ? *software : AV_PIX_FMT_NONE;
}

Status FfmpegSource::MakeDeviceFrame(Frame& out) {
  AVFramePtr ref(av_frame_alloc());
  if (!ref) return absl::ResourceExhaustedError("out of memory");
  av_frame_move_ref(ref.get(), frame_.get());
  // A buffer of our own: FFmpeg 5.1 hands out NVDEC's mapped output surface itself, one of a fixed set
  // (ulNumOutputSurfaces), so frames held by consumers would make decoding fail. av_frame_make_writable
  // copies the picture on the GPU into a buffer of the frames context's pool (unbounded for CUDA) and
  // unmaps the surface; that buffer comes at the pool's full (coded) size, hence the size restored after.
  const int width = ref->width, height = ref->height;
  if (const int r = av_frame_make_writable(ref.get()); r < 0) {
    return absl::InternalError(StrCat("cannot copy the picture on the GPU: ", AvErrorString(r)));
  }
  ref->width = width;
  ref->height = height;
#if VIGIL_HAVE_CUDA
  // The copy is asynchronous on this Source's stream: the picture is complete when it is delivered. (The
  // thread's current device is set to the decoding GPU first, so the runtime touches no other device.)
  cudaError_t e = cudaSetDevice(*cuda_device_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(StreamOf(hw_device_));
  if (e != cudaSuccess) {
    return absl::InternalError(StrCat("cannot copy the picture on the GPU: ", cudaGetErrorString(e)));
  }
#endif
  const Colour colour = ColourOf(*ref);
  out.width = ref->width;
  out.height = ref->height;
  out.device = DeviceFrame{.device = *cuda_device_,
                           .y = ref->data[0],
                           .uv = ref->data[1],
                           .y_pitch = ref->linesize[0],
                           .uv_pitch = ref->linesize[1],
                           .matrix = MatrixOf(colour.sws_colorspace),
                           .full_range = colour.full_range,
                           .keepalive = std::shared_ptr<void>(ref.release(), [](void* p) {
                             auto* f = static_cast<AVFrame*>(p);
                             av_frame_free(&f);
                           })};
  return absl::OkStatus();
}

int FfmpegSource::RotationFromMatrix(const uint8_t* data, size_t size) {
  if (data == nullptr || size < 9 * sizeof(int32_t)) return 0;
  int32_t m[9];
  std::memcpy(m, data, sizeof(m));
  // av_display_rotation_get: the counterclockwise angle the matrix rotates by (libavutil/display.h);
  // the picture must be turned the other way round to display it upright, as FFmpeg's own CLI does.
  const double ccw = av_display_rotation_get(m);
  if (std::isnan(ccw)) return 0;
  const long clockwise = ((std::lround(-ccw) % 360) + 360) % 360;
  const long snapped = (clockwise + 45) / 90 * 90 % 360;
  const bool mirrored = double(m[0]) * m[4] - double(m[1]) * m[3] < 0;
  const bool oblique = std::abs(clockwise - snapped) > 1 && std::abs(clockwise - snapped) < 359;
  if ((mirrored || oblique) && !warned_matrix_) {
    warned_matrix_ = true;
    if (oblique) spdlog::warn("{}: display matrix rotates by {} degrees, not a multiple of 90: ignored", who(), clockwise);
    if (mirrored) spdlog::warn("{}: display matrix mirrors the picture: the mirroring is not applied", who());
  }
  return oblique ? 0 : int(snapped);
}

StatusOr<Source::Picture> FfmpegSource::ConvertFrame() {
  const int64_t t0 = SteadyNowNs();
  AVFrame* f = frame_.get();
  ++pictures_this_input_;
  attempt_ = 0;
  if (f->decode_error_flags != 0 || (f->flags & AV_FRAME_FLAG_CORRUPT)) {
    stats_.DecodeError(StrCat(who(), ": picture ", pictures_this_input_, " of this ", live() ? "connection" : "pass",
                              " decoded with concealed errors"));
  }
  Picture picture;
  const int64_t ts = f->best_effort_timestamp;
  if (ts != AV_NOPTS_VALUE) {
    if (start_pts_ == AV_NOPTS_VALUE) start_pts_ = ts;
    picture.pts_ns = av_rescale_q(ts - start_pts_, time_base_, kNanoseconds);
    max_pts_ns_ = std::max(max_pts_ns_.value_or(*picture.pts_ns), *picture.pts_ns);
  }
  picture.discontinuity = new_input_;
  new_input_ = false;
  picture.nominal_duration_ns = nominal_duration_ns_;
  const AVFrameSideData* side = av_frame_get_side_data(f, AV_FRAME_DATA_DISPLAYMATRIX);
  const int rotation = side ? RotationFromMatrix(side->data, side->size) : stream_rotation_;

  // Square pixels: widen (SAR > 1) or narrow (SAR < 1) to the display aspect ratio.
  const AVRational sar = f->sample_aspect_ratio.num > 0 ? f->sample_aspect_ratio : stream_sample_aspect_;
  const bool resample = options_.apply_sample_aspect && sar.num > 0 && sar.den > 0 && sar.num != sar.den;
  Frame& out = picture.frame;
  auto finish = [&] {
    av_frame_unref(f);
    out.decode_ns = decoder_ns_ + (SteadyNowNs() - t0);
    decoder_ns_ = 0;
    return picture;
  };

  if (f->format == AV_PIX_FMT_CUDA) {  // decoded on the GPU: deliver it there, or go on with a host copy
    std::string host_because;
    if (rotation != 0) host_because = "a display rotation";
    else if (resample) host_because = "non-square pixels";
    else if (SwFormat(*f) != AV_PIX_FMT_NV12) host_because = "a GPU format other than NV12";
    else if (f->crop_left != 0 || f->crop_top != 0) host_because = "a crop at the left or top";
    if (options_.deliver_device_frames && host_because.empty()) {
      if (Status made = MakeDeviceFrame(out); !made.ok()) return Annotate(made, who());
      return finish();
    }
    if (options_.deliver_device_frames) {
      WarnOnce(StrCat("pictures with ", host_because, " are decoded on the GPU and delivered in host memory"));
    }
    StatusOr<AVFramePtr> host = HostPicture(*f);
    if (!host.ok()) return Annotate(host.status(), who());
    av_frame_unref(f);
    av_frame_move_ref(f, host->get());
  }
  const int width = resample ? std::max(1, int(std::lround(double(f->width) * sar.num / sar.den))) : f->width;
  const int height = f->height;

  const bool transposed = rotation == 90 || rotation == 270;
  out.width = transposed ? height : width;
  out.height = transposed ? width : height;
  out.stride = out.width * 3;
  out.rotation = rotation;
  out.bgr.resize(size_t(out.height) * out.stride);
  if (rotation != 0) scratch_.resize(size_t(height) * width * 3);
  if (Status converted = converter_.Convert(*f, width, rotation == 0 ? out.bgr.data() : scratch_.data());
      !converted.ok()) {
    return Annotate(converted, who());
  }
  if (rotation != 0) {
    cv::Mat upright(out.height, out.width, CV_8UC3, out.bgr.data());
    cv::rotate(cv::Mat(height, width, CV_8UC3, scratch_.data()), upright,
               rotation == 90 ? cv::ROTATE_90_CLOCKWISE : rotation == 180 ? cv::ROTATE_180 : cv::ROTATE_90_COUNTERCLOCKWISE);
  }
  return finish();
}

void FfmpegSource::CheckTruncation() {
  std::string why;
  if (declared_packets_ > 0 && packets_this_input_ < declared_packets_) {
    why = StrCat("read ", packets_this_input_, " of the ", declared_packets_, " frames its header declares");
  }
  if (why.empty() && declared_duration_ns_ && max_pts_ns_) {
    const int64_t slack = std::max<int64_t>(2 * nominal_duration_ns_, 500'000'000);
    if (*max_pts_ns_ + slack < *declared_duration_ns_) {
      why = StrCat("the last frame is at ", Seconds(*max_pts_ns_), " s of the ", Seconds(*declared_duration_ns_),
                   " s its header declares");
    }
  }
  if (!why.empty()) stats_.DecodeError(StrCat(who(), ": the file ends early (truncated?): ", why));
}

StatusOr<std::optional<Source::Picture>> FfmpegSource::DecodeNext() {
  while (true) {
    if (interrupted()) return Cancelled();
    if (!format_) {
      if (live()) {
        VIGIL_RETURN_IF_ERROR(Connect());
      } else {
        VIGIL_RETURN_IF_ERROR(Open());  // the next pass of a looped file
      }
    }
    StatusOr<bool> got = ReadPicture();
    if (got.ok() && *got) {
      StatusOr<Picture> picture = ConvertFrame();
      if (picture.ok()) return std::optional<Picture>(*std::move(picture));
      if (!absl::IsInternal(picture.status())) return picture.status();
      stats_.DecodeError(std::string(picture.status().message()));  // a failed GPU copy loses one picture
      continue;
    }
    if (interrupted()) return Cancelled();
    if (live()) {  // a camera does not end: reconnect
      stats_.disconnects.fetch_add(1, std::memory_order_relaxed);
      if (pictures_this_input_ == 0) ++attempt_;
      reconnect_reason_ = got.ok() ? "the server ended the stream" : std::string(got.status().message());
      stats_.SetLastError(StrCat(who(), ": connection lost: ", reconnect_reason_));
      Close();
      continue;
    }
    if (!got.ok()) return got.status();
    CheckTruncation();
    const uint64_t pictures = pictures_this_input_;
    Close();
    if (!options_.loop) return std::optional<Picture>();
    if (pictures == 0) return absl::DataLossError(StrCat(who(), ": no frame could be decoded in a whole pass"));
  }
}

}  // namespace

StatusOr<std::unique_ptr<Source>> OpenFfmpegSource(SourceOptions options, std::string url, bool live) {
  InitFfmpegOnce();
  auto source = std::make_unique<FfmpegSource>(std::move(options), std::move(url), live);
  if (!live) {
    VIGIL_RETURN_IF_ERROR(source->Open());
    source->PublishProbe();
  }
  return std::unique_ptr<Source>(std::move(source));
}

}  // namespace vigil::video::internal

namespace vigil::video {

Status DownloadBgr(Frame& frame) {
  if (!frame.device) return absl::OkStatus();
  const int64_t t0 = internal::SteadyNowNs();
  const std::string who = StrCat("stream '", frame.stream_id, "' frame ", frame.seq);
  std::vector<uint8_t> bgr(size_t(frame.height) * size_t(frame.width) * 3);
  thread_local internal::BgrConverter converter;
  if (frame.device->copy_to_host) {
    // Packed NV12 from the frame's owner, converted as a Source's NV12 picture is (same libswscale path).
    const int w = frame.width, h = frame.height, uv_row = 2 * ((w + 1) / 2);
    std::vector<uint8_t> nv12(size_t(w) * h + size_t(uv_row) * ((h + 1) / 2));
    VIGIL_RETURN_IF_ERROR(Annotate(frame.device->copy_to_host(nv12.data()), who));
    internal::AVFramePtr host(av_frame_alloc());
    if (!host) return absl::ResourceExhaustedError(StrCat(who, ": av_frame_alloc"));
    host->format = AV_PIX_FMT_NV12;
    host->width = w;
    host->height = h;
    host->data[0] = nv12.data();
    host->data[1] = nv12.data() + size_t(w) * h;
    host->linesize[0] = w;
    host->linesize[1] = uv_row;
    host->color_range = frame.device->full_range ? AVCOL_RANGE_JPEG : AVCOL_RANGE_MPEG;
    switch (frame.device->matrix) {
      case YuvMatrix::kBt709: host->colorspace = AVCOL_SPC_BT709; break;
      case YuvMatrix::kFcc: host->colorspace = AVCOL_SPC_FCC; break;
      case YuvMatrix::kSmpte240m: host->colorspace = AVCOL_SPC_SMPTE240M; break;
      case YuvMatrix::kBt2020: host->colorspace = AVCOL_SPC_BT2020_NCL; break;
      default: host->colorspace = AVCOL_SPC_SMPTE170M; break;
    }
    VIGIL_RETURN_IF_ERROR(Annotate(converter.Convert(*host, frame.width, bgr.data()), who));
  } else {
    const auto* hw = static_cast<const AVFrame*>(frame.device->keepalive.get());
    if (hw == nullptr) return absl::InvalidArgumentError(StrCat(who, ": device frame without its FFmpeg frame"));
    StatusOr<internal::AVFramePtr> host = internal::HostPicture(*hw);
    if (!host.ok()) return Annotate(host.status(), who);
    VIGIL_RETURN_IF_ERROR(Annotate(converter.Convert(**host, frame.width, bgr.data()), who));
  }
  frame.bgr = std::move(bgr);
  frame.stride = frame.width * 3;
  frame.device.reset();
  frame.decode_ns += internal::SteadyNowNs() - t0;
  return absl::OkStatus();
}

StatusOr<std::shared_ptr<void>> RetainCudaDecodeDevice(int device) {
  internal::InitFfmpegOnce();
  VIGIL_ASSIGN_OR_RETURN(internal::BufferRefPtr ctx, internal::OpenCudaDevice(device));
  return std::shared_ptr<void>(ctx.release(), [](void* p) {
    AVBufferRef* b = static_cast<AVBufferRef*>(p);
    av_buffer_unref(&b);
  });
}

}  // namespace vigil::video
