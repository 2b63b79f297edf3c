// vigil/video/ffmpeg_handles.h — owners for FFmpeg's C handles, for the video module's own sources.
// FFmpeg's types are forward-declared, so including this header pulls in no FFmpeg header.
// Every FFmpeg object the module allocates is held by one of these from the moment it exists.
//
// Thread-safety: each handle belongs to one thread at a time (FFmpeg contexts are not thread-safe).
#pragma once

#include <memory>
#include <string>

struct AVBufferRef;
struct AVFormatContext;
struct AVCodecContext;
struct AVFrame;
struct AVPacket;
struct SwsContext;

namespace vigil::video::internal {

struct FormatInputDeleter {
  void operator()(AVFormatContext* c) const noexcept;  // avformat_close_input (closes the I/O too)
};
using FormatInputPtr = std::unique_ptr<AVFormatContext, FormatInputDeleter>;

struct FormatOutputDeleter {
  void operator()(AVFormatContext* c) const noexcept;  // avio_closep (if it opened a file) + avformat_free_context
};
using FormatOutputPtr = std::unique_ptr<AVFormatContext, FormatOutputDeleter>;

struct CodecContextDeleter {
  void operator()(AVCodecContext* c) const noexcept;  // avcodec_free_context
};
using CodecContextPtr = std::unique_ptr<AVCodecContext, CodecContextDeleter>;

struct FrameDeleter {
  void operator()(AVFrame* f) const noexcept;  // av_frame_free
};
using AVFramePtr = std::unique_ptr<AVFrame, FrameDeleter>;

struct PacketDeleter {
  void operator()(AVPacket* p) const noexcept;  // av_packet_free
};
using PacketPtr = std::unique_ptr<AVPacket, PacketDeleter>;

struct SwsContextDeleter {
  void operator()(SwsContext* c) const noexcept;  // sws_freeContext
};
using SwsContextPtr = std::unique_ptr<SwsContext, SwsContextDeleter>;

struct BufferRefDeleter {
  void operator()(AVBufferRef* b) const noexcept;  // av_buffer_unref (e.g. a hardware device context)
};
using BufferRefPtr = std::unique_ptr<AVBufferRef, BufferRefDeleter>;

// av_strerror's text for an AVERROR code ("Connection refused", "Invalid data found when processing input").
std::string AvErrorString(int errnum);

}  // namespace vigil::video::internal
