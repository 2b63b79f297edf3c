// vigil/pipeline/frame_ref.h — a decoded video::Frame as the Detector reads it (detect::FrameRef), for
// the edge and `vigil bench streams --video`. Here rather than in detect or video: detect does not
// depend on video, nor video on detect.
//
// Host frame: BGR24 in pageable host memory, rows `stride` bytes apart. Device frame (NVDEC, Frame::device):
// NV12 in the GPU's memory with its Y and UV planes and pitches, the picture's Y'CbCr matrix as luma
// weights Kr, Kb (video::LumaWeightsOf) and its range. The FrameRef borrows the pixels: `f` (and, for a
// device frame, its keepalive) must outlive the detection that reads it.
// Thread-safety: a pure function.
#pragma once

#include "vigil/detect/detector.h"
#include "vigil/video/frame.h"

namespace vigil::pipeline {

inline detect::FrameRef FrameRefOf(const video::Frame& f) {
  if (!f.device) {
    return {.bgr = f.bgr.data(), .width = f.width, .height = f.height, .pitch = f.stride,
            .memory = detect::FrameMemory::kHost};
  }
  const video::DeviceFrame& d = *f.device;
  const video::LumaWeights w = video::LumaWeightsOf(d.matrix);
  return {.bgr = d.y, .width = f.width, .height = f.height, .pitch = d.y_pitch, .memory = detect::FrameMemory::kDevice,
          .format = detect::PixelFormat::kNv12, .uv = d.uv, .uv_pitch = d.uv_pitch, .kr = static_cast<float>(w.kr),
          .kb = static_cast<float>(w.kb), .full_range = d.full_range};
}

}  // namespace vigil::pipeline
