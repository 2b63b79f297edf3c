// Video files out through FFmpeg 5.1 (send/receive encode API); writer.h states the contract.
#include "vigil/video/writer.h"

#include <cmath>
#include <optional>
#include <string_view>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include "vigil/video/ffmpeg_handles.h"

namespace vigil::video {

using internal::AvErrorString;

struct VideoWriter::Impl {
  std::string path, codec_name;
  internal::FormatOutputPtr format;
  internal::CodecContextPtr codec;
  internal::AVFramePtr frame{av_frame_alloc()};
  internal::PacketPtr packet{av_packet_alloc()};
  internal::SwsContextPtr sws;
  AVStream* stream = nullptr;  // owned by `format`
  int64_t last_pts = 0;  // in codec->time_base
  uint64_t frames = 0, retimed = 0;
  bool header_written = false;
  std::optional<Status> closed;

  Status Fail(int err, std::string_view what) const {
    return absl::UnavailableError(StrCat(path, ": ", what, ": ", AvErrorString(err)));
  }
  // Sends `f` (nullptr = drain) and writes every packet the encoder returns.
  Status Encode(const AVFrame* f) {
    int r = avcodec_send_frame(codec.get(), f);
    if (r < 0) return Fail(r, StrCat("the ", codec_name, " encoder rejected a picture"));
    while ((r = avcodec_receive_packet(codec.get(), packet.get())) >= 0) {
      av_packet_rescale_ts(packet.get(), codec->time_base, stream->time_base);
      packet->stream_index = stream->index;
      r = av_interleaved_write_frame(format.get(), packet.get());  // takes the packet's reference
      if (r < 0) return Fail(r, "cannot write a packet");
    }
    return r == AVERROR(EAGAIN) || r == AVERROR_EOF ? absl::OkStatus() : Fail(r, "encoder failed");
  }
};

VideoWriter::VideoWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VideoWriter::~VideoWriter() { (void)Close(); }
const std::string& VideoWriter::codec_name() const { return impl_->codec_name; }
uint64_t VideoWriter::frames() const { return impl_->frames; }
uint64_t VideoWriter::retimed() const { return impl_->retimed; }

StatusOr<std::unique_ptr<VideoWriter>> VideoWriter::Open(const WriterOptions& o) {
  if (o.width <= 0 || o.height <= 0 || !(o.fps > 0) || !std::isfinite(o.fps)) {
    return absl::InvalidArgumentError(
        StrCat(o.path, ": video size ", o.width, "x", o.height, " at ", o.fps, " fps is not positive"));
  }
  auto impl = std::make_unique<Impl>();
  Impl& d = *impl;
  d.path = o.path;
  if (!d.frame || !d.packet) return absl::ResourceExhaustedError(StrCat(o.path, ": out of memory"));
  AVFormatContext* raw = nullptr;
  int r = avformat_alloc_output_context2(&raw, nullptr, nullptr, o.path.c_str());
  if (r < 0 || raw == nullptr) {
    return absl::InvalidArgumentError(StrCat(o.path, ": no container for this file name: ", AvErrorString(r)));
  }
  d.format.reset(raw);
  const AVCodec* encoder = !o.codec.empty() ? avcodec_find_encoder_by_name(o.codec.c_str())
                           : avcodec_find_encoder_by_name("libx264") ? avcodec_find_encoder_by_name("libx264")
                                                                      : avcodec_find_encoder(AV_CODEC_ID_MPEG4);
  if (encoder == nullptr) {
    return absl::UnimplementedError(StrCat(o.path, ": this FFmpeg has no encoder '", o.codec, "'"));
  }
  d.codec_name = encoder->name;
  d.stream = avformat_new_stream(d.format.get(), nullptr);
  d.codec.reset(avcodec_alloc_context3(encoder));
  if (d.stream == nullptr || !d.codec) return absl::ResourceExhaustedError(StrCat(o.path, ": out of memory"));
  AVCodecContext* c = d.codec.get();
  const bool x264 = d.codec_name == "libx264";
  c->width = o.width;
  c->height = o.height;
  c->framerate = av_d2q(o.fps, 100000);
  c->time_base = d.format->oformat->flags & AVFMT_VARIABLE_FPS ? AVRational{1, 1000} : av_inv_q(c->framerate);
  c->pix_fmt = x264 && (o.width % 2 != 0 || o.height % 2 != 0) ? AV_PIX_FMT_YUV444P : AV_PIX_FMT_YUV420P;
  // libswscale's default RGB → YUV matrix is BT.601, limited range: say so in the stream.
  c->colorspace = AVCOL_SPC_SMPTE170M;
  c->color_range = AVCOL_RANGE_MPEG;
  if (x264) {
    av_opt_set(c->priv_data, "preset", "veryfast", 0);
  } else if (d.codec_name == "mpeg4") {
    c->flags |= AV_CODEC_FLAG_QSCALE;
    c->global_quality = FF_QP2LAMBDA * 3;
  }
  if (d.format->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  if ((r = avcodec_open2(c, encoder, nullptr)) < 0) return d.Fail(r, StrCat("cannot open the ", d.codec_name, " encoder"));
  if ((r = avcodec_parameters_from_context(d.stream->codecpar, c)) < 0) return d.Fail(r, "bad encoder parameters");
  d.stream->time_base = c->time_base;
  d.stream->avg_frame_rate = c->framerate;
  if (!(d.format->oformat->flags & AVFMT_NOFILE) && (r = avio_open(&d.format->pb, o.path.c_str(), AVIO_FLAG_WRITE)) < 0) {
    return d.Fail(r, "cannot create the file");
  }
  if ((r = avformat_write_header(d.format.get(), nullptr)) < 0) return d.Fail(r, "cannot write the header");
  d.header_written = true;
  d.frame->format = c->pix_fmt;
  d.frame->width = o.width;
  d.frame->height = o.height;
  if ((r = av_frame_get_buffer(d.frame.get(), 0)) < 0) return d.Fail(r, "cannot allocate a picture");
  d.sws.reset(sws_getContext(o.width, o.height, AV_PIX_FMT_BGR24, o.width, o.height, c->pix_fmt, SWS_BILINEAR,
                             nullptr, nullptr, nullptr));
  if (!d.sws) return absl::UnimplementedError(StrCat(o.path, ": cannot convert bgr24 for the encoder"));
  return std::unique_ptr<VideoWriter>(new VideoWriter(std::move(impl)));
}

Status VideoWriter::Write(const uint8_t* bgr, int stride, int64_t pts_ns) {
  Impl& d = *impl_;
  if (d.closed) return absl::FailedPreconditionError(StrCat(d.path, ": written after Close"));
  int r = av_frame_make_writable(d.frame.get());  // the encoder may still hold the previous buffer
  if (r < 0) return d.Fail(r, "cannot get a writable picture");
  const uint8_t* src[1] = {bgr};
  const int src_stride[1] = {stride};
  sws_scale(d.sws.get(), src, src_stride, 0, d.codec->height, d.frame->data, d.frame->linesize);
  int64_t pts = av_rescale_q(pts_ns, AVRational{1, 1'000'000'000}, d.codec->time_base);  // rounds to nearest
  if (d.frames > 0 && pts <= d.last_pts) {
    pts = d.last_pts + 1;
    ++d.retimed;
  }
  d.frame->pts = d.last_pts = pts;
  VIGIL_RETURN_IF_ERROR(d.Encode(d.frame.get()));
  ++d.frames;
  return absl::OkStatus();
}

Status VideoWriter::Close() {
  Impl& d = *impl_;
  if (d.closed) return *d.closed;
  Status st = d.Encode(nullptr);
  if (d.header_written) {
    const int r = av_write_trailer(d.format.get());
    if (st.ok() && r < 0) st = d.Fail(r, "cannot write the trailer");
  }
  d.format.reset();  // closes the file
  d.closed = st;
  return st;
}

}  // namespace vigil::video
