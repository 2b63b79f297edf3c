#include "vigil/video/ffmpeg_handles.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/buffer.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libswscale/swscale.h>
}

namespace vigil::video::internal {

void FormatInputDeleter::operator()(AVFormatContext* c) const noexcept { avformat_close_input(&c); }
void FormatOutputDeleter::operator()(AVFormatContext* c) const noexcept {
  if (c != nullptr && c->oformat != nullptr && !(c->oformat->flags & AVFMT_NOFILE)) avio_closep(&c->pb);
  avformat_free_context(c);
}
void CodecContextDeleter::operator()(AVCodecContext* c) const noexcept { avcodec_free_context(&c); }
void FrameDeleter::operator()(AVFrame* f) const noexcept { av_frame_free(&f); }
void PacketDeleter::operator()(AVPacket* p) const noexcept { av_packet_free(&p); }
void BufferRefDeleter::operator()(AVBufferRef* b) const noexcept { av_buffer_unref(&b); }
void SwsContextDeleter::operator()(SwsContext* c) const noexcept { sws_freeContext(c); }

std::string AvErrorString(int errnum) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  if (av_strerror(errnum, buf, sizeof(buf)) < 0) return "FFmpeg error " + std::to_string(errnum);
  return buf;
}

}  // namespace vigil::video::internal
