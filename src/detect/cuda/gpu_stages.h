// gpu_stages.h — the Detector's pre- and post-processing on the GPU (detector.h, "GPU stages").
//
// Per batch, all on the engine's stream (Engine::device_io()): host frames are copied into page-locked
// staging and uploaded (pinned frames are uploaded directly, device frames read in place); one
// letterbox kernel writes the engine's input tensor (blank slots zero); the engine runs
// (EnqueueOnDevice: a CUDA graph replay); then candidate decoding, a segmented sort by score, greedy
// NMS and the mapping to source pixels (detect_kernels.h) fill `rows` [batch, max_det, 6] and `counts`
// [batch] in device memory. CopyToHost enqueues their copy into page-locked host mirrors.
//
// Memory: device — frame buffers batch × the largest frame seen (grown, never shrunk), candidates
// batch × N × (16 + 4 + 16) bytes, the sort's scratch, the detections; host — page-locked staging of
// the same frame size, the slot table and the detection mirrors.
// Thread-safety: none; the Detector serialises calls with mutex() (every call but Create REQUIRES it). Errors: InvalidArgument naming the
// frame index and reason; FailedPrecondition for a device frame on another GPU; ResourceExhausted /
// Internal for CUDA failures, naming the call.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "detect/cuda/detect_kernels.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/detect/detector.h"
#include "vigil/detect/letterbox.h"
#include "vigil/detect/model_family.h"
#include "vigil/infer/engine.h"

namespace vigil::detect {

// Decode + sort + NMS + mapping to source pixels of a model's raw output in device memory: the
// post-processing half of GpuStages, on its own so that it can be tested on given raw outputs.
// Thread-safety: none (one caller at a time).
class GpuPostprocess {
 public:
  // Buffers for model.batch images on CUDA device `device` (made current by the caller).
  static StatusOr<std::unique_ptr<GpuPostprocess>> Create(const ModelInfo& model, const DetectorOptions& options,
                                                          float iou, int device);
  ~GpuPostprocess();
  // Enqueues on `stream`: `output` is the model's first output for `images` (1..batch) images,
  // row-major [batch, ...] as ModelInfo says, float16 when `half`; `slots` (device, `images` entries)
  // give each image's letterbox geometry for the mapping to source pixels.
  Status Enqueue(const void* output, bool half, int images, const cuda::SlotGeometry* slots, cudaStream_t stream);
  // Enqueues the copy of the detections into page-locked host mirrors.
  Status CopyToHost(cudaStream_t stream);
  // Detections per image from the mirrors. REQUIRES: CopyToHost, and the stream synchronised.
  std::vector<std::vector<Detection>> HostDetections() const;
  DeviceDetections device_detections(cudaStream_t stream) const;

 private:
  struct Buffers;
  GpuPostprocess() = default;
  ModelInfo model_;
  DetectorOptions options_;
  float iou_ = 0.7f;
  int device_ = 0;
  int images_ = 0;
  std::unique_ptr<Buffers> buffers_;
};

class GpuStages {
 public:
  // REQUIRES: engine.device_io() != nullptr, `model` describes `engine`. `engine` must outlive this.
  static StatusOr<std::unique_ptr<GpuStages>> Create(infer::Engine& engine, const ModelInfo& model,
                                                     const DetectorOptions& options, float iou);
  ~GpuStages();

  // Enqueues the whole sequence for 1..batch frames (waiting first for a previous batch still in
  // flight, whose buffers are reused) and returns each frame's letterbox geometry.
  StatusOr<std::vector<LetterboxInfo>> Enqueue(std::span<const FrameRef> frames) VIGIL_REQUIRES(mu_);
  // Enqueues the copy of the last batch's detections into the host mirrors (HostDetections).
  Status CopyToHost() VIGIL_REQUIRES(mu_);
  // Waits for everything enqueued; reports the engine's host-kernel errors and CUDA errors.
  Status Synchronize() VIGIL_REQUIRES(mu_);
  // The last batch's detections from the host mirrors. REQUIRES: CopyToHost, then Synchronize.
  std::vector<std::vector<Detection>> HostDetections() const VIGIL_REQUIRES(mu_);
  DeviceDetections device_detections() const VIGIL_REQUIRES(mu_);
  // Enqueues a copy of the last batch's rows ([images, max_det, 6] float) into a buffer of the kept-rows
  // pool (after Enqueue, before Synchronize) and returns it; null when all kMaxKeptRowBuffers buffers are
  // held (the caller uses host rows then). The buffer returns to the pool when the last holder lets go
  // (any thread; no CUDA call); the pool's memory is freed when the GpuStages and every buffer are gone.
  StatusOr<std::shared_ptr<const float>> KeepRows() VIGIL_REQUIRES(mu_);
  static constexpr int kMaxKeptRowBuffers = 64;

  // The lock every call above REQUIRES (held by the Detector around each batch).
  Mutex& mutex() VIGIL_RETURN_CAPABILITY(mu_) { return mu_; }

 private:
  struct Buffers;
  struct RowPool;
  std::shared_ptr<RowPool> row_pool_ VIGIL_GUARDED_BY(mu_);  // made on the first KeepRows
  GpuStages() = default;
  Status EnsureFrameCapacity(size_t bytes) VIGIL_REQUIRES(mu_);

  infer::Engine* engine_ = nullptr;
  ModelInfo model_;
  int device_ = 0;
  void* stream_ = nullptr;
  bool pending_ VIGIL_GUARDED_BY(mu_) = false;  // work enqueued and not yet waited for
  // Made by Create, never replaced; its buffers are used only by the calls that REQUIRE mu_.
  std::unique_ptr<Buffers> buffers_;
  Mutex mu_;
};

}  // namespace vigil::detect
