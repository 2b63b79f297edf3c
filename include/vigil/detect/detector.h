// vigil/detect/detector.h — a YOLO detector: letterbox → Engine → decode → NMS → source pixels.
//
//   vigil::detect::DetectorOptions options;
//   options.conf = 0.3f;
//   auto detector = vigil::detect::Detector::Load("yolov8n.onnx", options);
//   if (!detector.ok()) { /* names the file and the reason */ }
//   auto results = (*detector)->Detect(images);  // results->at(i): detections of images[i]
//   std::vector<vigil::detect::DetectTiming> timing;  // optional: where the time went, per image
//   results = (*detector)->Detect(images, &timing);
//
// The family (model_family.h) decides the letterbox style and the decoding; boxes come back in
// source-image pixels, sorted by score, at most max_det per image.
// Batching: the engine's batch size B is fixed at load: options.engine.batch for a model with a
// symbolic batch (else 1); a model with a fixed batch keeps it (a different request is logged as a
// warning, not an error). Detect splits the images into chunks of B, runs one inference per chunk
// and pads the last chunk with blank (zero) slots whose outputs are ignored.
// GPU stages: when the engine runs on CUDA (options.engine.device "cuda:N") and options.gpu_stages is
// true (the default), letterbox, decoding, NMS and the mapping back to source pixels run on the GPU
// (detect/cuda/detect_kernels.h): host frames are copied into page-locked staging and uploaded, the
// letterbox kernel writes the engine's device input, and the detections are a [B, max_det, 6] tensor
// in device memory, copied to the host only for Detect/DetectFrames. The results equal the host
// stages' (same formulas; the letterbox may differ by one grey level where OpenCV truncates twice).
// Thread-safety: Load is thread-safe. A Detector is immutable after Load: Detect and DetectFrames
// may be called from several threads at once; their inferences run one at a time (Engine::Run, and
// the GPU stages' buffers, are serialised), so use one Detector per worker for parallel inference.
// DetectOnDevice's result lives in buffers the next call overwrites: one consumer thread.
// Errors: Load reports the model file's errors (Engine::Load), family errors (DescribeModel) and
// invalid options as InvalidArgument naming the option; Detect reports bad images (empty, wrong
// buffer size) naming their index, and engine errors.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/detect/detection.h"
#include "vigil/detect/image.h"
#include "vigil/detect/model_family.h"
#include "vigil/infer/engine.h"

namespace vigil::detect {

struct DetectorOptions {
  infer::EngineOptions engine;   // device, threads, batch (0 = the model's batch, 1 when symbolic)
  float conf = 0.25f;            // confidence threshold in [0, 1]: keep score > conf. Default: 0.25
  float iou = -1.0f;             // NMS IoU threshold in [0, 1]; negative = the family's default
                                 // (0.7 Ultralytics, 0.45 YOLOv5 and YOLOX; end-to-end: no NMS)
  int max_det = 300;             // detections per image, >= 1. Default: 300
  bool agnostic = false;         // class-agnostic NMS. Default: false
  std::vector<int> classes;      // keep only these class ids; empty = all. Default: empty
  int64_t imgsz_height = 0;      // model input size for models with symbolic H/W, pixels; rounded
  int64_t imgsz_width = 0;       // up to a multiple of 32. 0 = metadata imgsz. A fixed-size model
                                 // accepts only its own size (else InvalidArgument).
  bool gpu_stages = true;        // CUDA engines: pre/post-processing on the GPU (false: on the host,
                                 // as with the CPU backend). Ignored on the CPU backend. Default: true
};

// Where a frame's pixels are, for DetectFrames / DetectOnDevice.
enum class FrameMemory {
  kHost,        // ordinary (pageable) host memory
  kPinnedHost,  // page-locked host memory (cudaMallocHost / cudaHostRegister, HostBufferPool with a
                // pinner): uploaded by DMA without a staging copy
  kDevice,      // device memory of the detector's GPU (e.g. a frame decoded by NVDEC), complete when passed:
                // the detector reads it on its own non-blocking stream without waiting for other work
                // (video::Source delivers device frames complete: frame.h).
};

// Pixel layout of a FrameRef.
enum class PixelFormat {
  kBgr24,  // 8-bit B, G, R interleaved (image.h's layout)
  kNv12,   // 8-bit Y plane, then a half-size plane of interleaved U, V (4:2:0; chroma sample (i, j)
           // covers luma pixels (2i..2i+1, 2j..2j+1)): what NVDEC decodes H.264/HEVC 8-bit into.
           // GPU stages only, device memory only.
};

// A borrowed frame whose rows are `pitch` bytes apart.
struct FrameRef {
  const uint8_t* bgr = nullptr;  // kBgr24: the pixels; kNv12: the Y plane. Not owned; must stay valid
                                 // until the call returns (DetectOnDevice: until Synchronize)
  int width = 0, height = 0;     // pixels, > 0
  int64_t pitch = 0;             // bytes per row, >= width * 3 (kNv12: >= width); 0 = the minimum
  FrameMemory memory = FrameMemory::kHost;
  PixelFormat format = PixelFormat::kBgr24;
  const uint8_t* uv = nullptr;   // kNv12: the interleaved U, V plane: (height + 1) / 2 rows of (width + 1) / 2 pairs
  int64_t uv_pitch = 0;          // kNv12: bytes per UV row (>= width); 0 = pitch
  // kNv12: the Y'CbCr → R'G'B' matrix by its luma weights Kr, Kb (R = Y + 2(1−Kr)Cr, B = Y + 2(1−Kb)Cb,
  // G from Kg = 1 − Kr − Kb; ITU-R BT.601: 0.299, 0.114 — the default; BT.709: 0.2126, 0.0722; the
  // video module's LumaWeights gives them for a decoded picture), and limited (Y 16–235, C 16–240) or
  // full range.
  float kr = 0.299f, kb = 0.114f;
  bool full_range = false;
};

// Detections of one batch in the GPU's memory (DetectOnDevice). rows: float32 [images, max_det, 6],
// each row x1, y1, x2, y2 (source-image pixels), score, class id (as a float), sorted by score;
// counts: int32 [images], rows past counts[b] are undefined. Device pointers on `device`, written by
// work enqueued on `stream` (a cudaStream_t): consume on that stream or after Detector::Synchronize.
struct DeviceDetections {
  int device = 0;
  void* stream = nullptr;
  const float* rows = nullptr;
  const int32_t* counts = nullptr;
  int images = 0;
  int max_det = 0;
};


class GpuStages;  // detect/cuda/gpu_stages.h

// Where Detect spent the time of one image. Durations in nanoseconds of std::chrono::steady_clock
// (wall time of the calling thread; the engine's kernels may use more threads meanwhile).
struct DetectTiming {
  int64_t preprocess_ns = 0;   // letterbox + normalisation of this image into the input tensor
  int64_t inference_ns = 0;    // Engine::Run of the chunk this image was in: shared by the chunk's images,
                               // it is the latency each of them waited, not a per-image share
  int64_t postprocess_ns = 0;  // decoding its output rows, NMS (or top-k), mapping boxes to source pixels
  int chunk_images = 0;        // real images in that Engine::Run (1..B; padding slots not counted), so
                               // Σ inference_ns / chunk_images over all images = total engine time
};

class Detector {
 public:
  ~Detector();
  static StatusOr<std::unique_ptr<Detector>> Load(const std::string& model_path, const DetectorOptions& options);
  // Wraps an already loaded engine (tests, tools). Same checks as Load.
  static StatusOr<std::unique_ptr<Detector>> Create(std::unique_ptr<infer::Engine> engine,
                                                    const DetectorOptions& options);

  // Detections of each image, aligned with `images`. When `timing` is not null it is resized to
  // images.size() and timing->at(i) says where the time of images[i] went (left unspecified on error).
  StatusOr<std::vector<std::vector<Detection>>> Detect(std::span<const Image> images,
                                                       std::vector<DetectTiming>* timing = nullptr) const;
  // The same for borrowed frames (no copy into an Image on the GPU path; on the CPU backend host
  // frames are copied, and kDevice frames are refused with FailedPrecondition).
  // With `kept` (GPU stages only; ignored otherwise): resized to frames.size(), kept->at(i) the device copy
  // of image i's rows (one device-to-device copy per batch into a pooled buffer; empty DeviceRows when the
  // pool's kMaxKeptRowBuffers (64) batches are all still held).
  StatusOr<std::vector<std::vector<Detection>>> DetectFrames(std::span<const FrameRef> frames,
                                                             std::vector<DetectTiming>* timing = nullptr,
                                                             std::vector<DeviceRows>* kept = nullptr) const;
  // GPU stages only: enqueues one batch (1..batch frames) and returns without waiting; the detections
  // stay in device memory. Errors: FailedPrecondition without GPU stages; InvalidArgument for more
  // frames than the batch or a bad frame (naming its index). Errors of the enqueued work surface in
  // Synchronize.
  StatusOr<DeviceDetections> DetectOnDevice(std::span<const FrameRef> frames) const;
  // Waits for the work DetectOnDevice enqueued; reports its errors.
  Status Synchronize() const;
  // True when pre/post-processing run on the GPU (see gpu_stages above).
  bool uses_gpu_stages() const { return gpu_ != nullptr; }

  const ModelInfo& model() const { return model_; }
  const infer::Engine& engine() const { return *engine_; }
  const DetectorOptions& options() const { return options_; }
  float iou() const { return iou_; }  // the NMS threshold in effect
  // The class's name ("class<N>" when the model has no name for it).
  std::string ClassName(int class_id) const;

 private:
  Detector();
  StatusOr<std::vector<std::vector<Detection>>> DetectChunkOnGpu(std::span<const FrameRef> frames, size_t first,
                                                                 std::vector<DeviceRows>* kept,
                                                                 std::vector<DetectTiming>& times) const;
  std::unique_ptr<infer::Engine> engine_;
  std::unique_ptr<GpuStages> gpu_;
  DetectorOptions options_;
  ModelInfo model_;
  float iou_ = 0.7f;
};

}  // namespace vigil::detect
