// Files and network streams through FFmpeg 5.1: libavformat demuxes, libavcodec decodes (send/receive
// API), libswscale converts to BGR24, OpenCV rotates by the display matrix. source.h states the contract.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>

#include <opencv2/core.hpp>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "vigil/video/ffmpeg_handles.h"
#include "vigil/video/source.h"

namespace vigil::video::internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr AVRational kNanoseconds{1, 1'000'000'000};
constexpr int kMaxConsecutiveReadErrors = 100;

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// FFmpeg's log lines go to spdlog (warnings and errors at debug, info at trace): the Source reports what
// matters itself, with counters, and a corrupt stream would otherwise print for every frame.
void LogToSpdlog(void* avcl, int level, const char* fmt, va_list args) {
  if (level > AV_LOG_INFO) return;
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

double Seconds(int64_t ns) { return double(ns) * 1e-9; }

class FfmpegSource final : public Source {
 public:
  FfmpegSource(SourceOptions options, std::string url, bool live)
      : Source(std::move(options), live), url_(std::move(url)) {}

  // Opens and probes the input and prepares its video decoder.
  Status Open();
  // Makes what the last Open() found the Source's probed(). REQUIRES: the Source is not shared yet.
  void PublishProbe() { probed_ = opened_; }

 protected:
  StatusOr<std::optional<Picture>> DecodeNext() override;

 private:
  static int InterruptCallback(void* opaque);
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
  SwsContextPtr sws_;
  SwsContext* sws_configured_ = nullptr;  // the context whose colour details were last set, and for what
  int sws_colorspace_ = -1, sws_full_range_ = -1;
  std::vector<uint8_t> scratch_;  // the unrotated picture when a rotation applies
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
  const AVFrameSideData* side = av_frame_get_side_data(f, AV_FRAME_DATA_DISPLAYMATRIX);
  const int rotation = side ? RotationFromMatrix(side->data, side->size) : stream_rotation_;

  // Square pixels: widen (SAR > 1) or narrow (SAR < 1) to the display aspect ratio.
  AVRational sar = f->sample_aspect_ratio.num > 0 ? f->sample_aspect_ratio : stream_sample_aspect_;
  int width = f->width;
  if (options_.apply_sample_aspect && sar.num > 0 && sar.den > 0 && sar.num != sar.den) {
    width = std::max(1, int(std::lround(double(f->width) * sar.num / sar.den)));
  }
  const int height = f->height;
  bool full_range = f->color_range == AVCOL_RANGE_JPEG;
  const AVPixelFormat format = PlainFormat(AVPixelFormat(f->format), &full_range);
  sws_.reset(sws_getCachedContext(sws_.release(), f->width, f->height, format, width, height, AV_PIX_FMT_BGR24,
                                  SWS_BILINEAR, nullptr, nullptr, nullptr));
  if (!sws_) {
    const char* name = av_get_pix_fmt_name(format);
    return absl::UnimplementedError(StrCat(who(), ": cannot convert pixel format ", name ? name : "?", " to bgr24"));
  }
  const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
  const int colorspace = SwsColorspace(f->colorspace, height);
  if (desc != nullptr && !(desc->flags & AV_PIX_FMT_FLAG_RGB) &&
      (sws_.get() != sws_configured_ || colorspace != sws_colorspace_ || int(full_range) != sws_full_range_)) {
    sws_setColorspaceDetails(sws_.get(), sws_getCoefficients(colorspace), full_range, sws_getCoefficients(SWS_CS_DEFAULT),
                             /*dstRange=*/1, /*brightness=*/0, /*contrast=*/1 << 16, /*saturation=*/1 << 16);
    sws_configured_ = sws_.get();
    sws_colorspace_ = colorspace;
    sws_full_range_ = full_range;
  }

  Picture picture;
  Frame& out = picture.frame;
  const bool transposed = rotation == 90 || rotation == 270;
  out.width = transposed ? height : width;
  out.height = transposed ? width : height;
  out.stride = out.width * 3;
  out.rotation = rotation;
  out.bgr.resize(size_t(out.height) * out.stride);
  if (rotation != 0) scratch_.resize(size_t(height) * width * 3);
  uint8_t* dst[1] = {rotation == 0 ? out.bgr.data() : scratch_.data()};
  const int dst_stride[1] = {width * 3};
  sws_scale(sws_.get(), f->data, f->linesize, 0, f->height, dst, dst_stride);
  if (rotation != 0) {
    cv::Mat upright(out.height, out.width, CV_8UC3, out.bgr.data());
    cv::rotate(cv::Mat(height, width, CV_8UC3, scratch_.data()), upright,
               rotation == 90 ? cv::ROTATE_90_CLOCKWISE : rotation == 180 ? cv::ROTATE_180 : cv::ROTATE_90_COUNTERCLOCKWISE);
  }

  const int64_t ts = f->best_effort_timestamp;
  if (ts != AV_NOPTS_VALUE) {
    if (start_pts_ == AV_NOPTS_VALUE) start_pts_ = ts;
    picture.pts_ns = av_rescale_q(ts - start_pts_, time_base_, kNanoseconds);
    max_pts_ns_ = std::max(max_pts_ns_.value_or(*picture.pts_ns), *picture.pts_ns);
  }
  picture.discontinuity = new_input_;
  new_input_ = false;
  picture.nominal_duration_ns = nominal_duration_ns_;
  av_frame_unref(f);
  out.decode_ns = decoder_ns_ + (SteadyNowNs() - t0);
  decoder_ns_ = 0;
  return picture;
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
      VIGIL_ASSIGN_OR_RETURN(Picture picture, ConvertFrame());
      return std::optional<Picture>(std::move(picture));
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
