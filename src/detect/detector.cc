#include "vigil/detect/detector.h"

#include <algorithm>
#include <chrono>

#include "spdlog/spdlog.h"
#include "vigil/common/clock.h"
#include "vigil/detect/decode.h"
#include "vigil/detect/letterbox.h"
#include "vigil/detect/nms.h"
#if VIGIL_HAVE_CUDA
#include "vigil/common/cuda_status.h"
#include "detect/cuda/gpu_stages.h"
#endif

namespace vigil::detect {
#if !VIGIL_HAVE_CUDA
class GpuStages {};  // no CUDA backend in this build: never created
#endif
namespace {

Status ValidateOptions(const DetectorOptions& o) {
  if (!(o.conf >= 0 && o.conf <= 1)) return absl::InvalidArgumentError(StrCat("conf ", o.conf, " is not in [0, 1]"));
  if (!(o.iou <= 1)) return absl::InvalidArgumentError(StrCat("iou ", o.iou, " is not in [0, 1]"));
  if (o.max_det < 1) return absl::InvalidArgumentError(StrCat("max_det ", o.max_det, " is not >= 1"));
  for (int c : o.classes) {
    if (c < 0) return absl::InvalidArgumentError(StrCat("class id ", c, " in classes is negative"));
  }
  if (o.imgsz_height < 0 || o.imgsz_width < 0 || (o.imgsz_height == 0) != (o.imgsz_width == 0)) {
    return absl::InvalidArgumentError(
        StrCat("imgsz ", o.imgsz_height, "x", o.imgsz_width, " must give both height and width > 0"));
  }
  return absl::OkStatus();
}

// Ultralytics `check_imgsz`: sizes are rounded up to a multiple of the largest stride.
int64_t RoundUpToStride(int64_t v) {
  constexpr int64_t kStride = 32;
  return (v + kStride - 1) / kStride * kStride;
}

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

// A borrowed view of an Image (host memory, compact rows).
FrameRef ViewOf(const Image& image) {
  return {.bgr = image.bgr.data(), .width = image.width, .height = image.height, .pitch = 0,
          .memory = FrameMemory::kHost};
}

Status CheckImage(const Image& image, size_t index) {
  if (image.width <= 0 || image.height <= 0 ||
      image.bgr.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return absl::InvalidArgumentError(StrCat("image ", index, ": ", image.width, "x", image.height, " with ",
                                             image.bgr.size(), " bytes is empty or not width*height*3"));
  }
  return absl::OkStatus();
}

}  // namespace

Detector::Detector() = default;
Detector::~Detector() = default;

StatusOr<std::unique_ptr<Detector>> Detector::Load(const std::string& model_path, const DetectorOptions& options) {
  VIGIL_RETURN_IF_ERROR(ValidateOptions(options));
  infer::EngineOptions engine_options = options.engine;
  if (options.imgsz_height > 0) {
    engine_options.height = RoundUpToStride(options.imgsz_height);
    engine_options.width = RoundUpToStride(options.imgsz_width);
    if (engine_options.height != options.imgsz_height || engine_options.width != options.imgsz_width) {
      spdlog::warn("imgsz {}x{} is not a multiple of stride 32, using {}x{}", options.imgsz_height,
                   options.imgsz_width, engine_options.height, engine_options.width);
    }
  }
  VIGIL_ASSIGN_OR_RETURN(auto engine, infer::Engine::Load(model_path, engine_options));
  return Create(std::move(engine), options);
}

StatusOr<std::unique_ptr<Detector>> Detector::Create(std::unique_ptr<infer::Engine> engine,
                                                     const DetectorOptions& options) {
  VIGIL_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<Detector> d(new Detector());
  VIGIL_ASSIGN_OR_RETURN(d->model_, DescribeModel(*engine));
  if (options.imgsz_height > 0) {
    const int64_t h = RoundUpToStride(options.imgsz_height), w = RoundUpToStride(options.imgsz_width);
    if (d->model_.height != h || d->model_.width != w) {
      return absl::InvalidArgumentError(StrCat(
          "model ", engine->summary().path, ": input '", d->model_.input_name, "' is fixed at ", d->model_.height,
          "x", d->model_.width, "; imgsz ", h, "x", w, " cannot change it"));
    }
  }
  if (options.engine.batch > 0 && options.engine.batch != d->model_.batch) {
    spdlog::warn("model {}: input '{}' has a fixed batch of {}; running batches of {} instead of {}",
                 engine->summary().path, d->model_.input_name, d->model_.batch, d->model_.batch, options.engine.batch);
  }
  d->iou_ = options.iou < 0 ? d->model_.default_iou : options.iou;
  d->options_ = options;
  d->engine_ = std::move(engine);
#if VIGIL_HAVE_CUDA
  if (options.gpu_stages && d->engine_->device_io() != nullptr) {
    auto gpu = GpuStages::Create(*d->engine_, d->model_, options, d->iou_);
    if (!gpu.ok()) return Annotate(gpu.status(), StrCat("model ", d->engine_->summary().path));
    d->gpu_ = std::move(*gpu);
  }
#endif
  return d;
}

std::string Detector::ClassName(int class_id) const { return detect::ClassName(model_.names, class_id); }

StatusOr<std::vector<std::vector<Detection>>> Detector::Detect(std::span<const Image> images,
                                                               std::vector<DetectTiming>* timing) const {
  if (gpu_ != nullptr) {
    std::vector<FrameRef> frames;
    frames.reserve(images.size());
    for (size_t i = 0; i < images.size(); ++i) {
      VIGIL_RETURN_IF_ERROR(CheckImage(images[i], i));
      frames.push_back(ViewOf(images[i]));
    }
    return DetectFrames(frames, timing);
  }
  const ModelInfo& m = model_;
  const NmsOptions nms{.iou = iou_, .max_det = options_.max_det, .agnostic = options_.agnostic};
  std::vector<std::vector<Detection>> results;
  results.reserve(images.size());
  std::vector<DetectTiming> times(images.size());
  std::vector<Tensor> outputs;
  for (size_t first = 0; first < images.size(); first += static_cast<size_t>(m.batch)) {
    const size_t count = std::min(images.size() - first, static_cast<size_t>(m.batch));
    Tensor input(m.input_dtype, {m.batch, m.channels, m.height, m.width});  // padding slots stay zero
    std::vector<LetterboxInfo> boxes_info(count);
    for (size_t i = 0; i < count; ++i) {
      const int64_t t0 = SteadyNs();
      auto info = Letterbox(images[first + i], m.letterbox, input, static_cast<int64_t>(i));
      if (!info.ok()) return Annotate(info.status(), StrCat("image ", first + i));
      boxes_info[i] = *info;
      times[first + i].preprocess_ns = SteadyNs() - t0;
    }
    const int64_t t_run = SteadyNs();
    VIGIL_RETURN_IF_ERROR(engine_->Run({&input, 1}, &outputs));
    const int64_t run_ns = SteadyNs() - t_run;
    for (size_t i = 0; i < count; ++i) {
      const int64_t t0 = SteadyNs();
      VIGIL_ASSIGN_OR_RETURN(std::vector<Detection> candidates,
                             DecodeOutput(outputs[0], static_cast<int64_t>(i), m, options_.conf, options_.classes));
      std::vector<Detection> kept = m.family == ModelFamily::kEnd2End
                                        ? TopByScore(std::move(candidates), options_.max_det)
                                        : NonMaxSuppression(std::move(candidates), nms);
      MapToSource(boxes_info[i], kept);
      results.push_back(std::move(kept));
      DetectTiming& t = times[first + i];
      t.inference_ns = run_ns;
      t.postprocess_ns = SteadyNs() - t0;
      t.chunk_images = static_cast<int>(count);
    }
  }
  if (timing != nullptr) *timing = std::move(times);
  return results;
}

StatusOr<std::vector<std::vector<Detection>>> Detector::DetectFrames(std::span<const FrameRef> frames,
                                                                     std::vector<DetectTiming>* timing,
                                                                     std::vector<DeviceRows>* kept) const {
  if (kept != nullptr) kept->assign(frames.size(), DeviceRows{});
  if (gpu_ == nullptr) {
    // Host stages: letterbox reads an Image, so each frame is copied once (compact rows).
    std::vector<Image> images(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      const FrameRef& f = frames[i];
      if (f.memory == FrameMemory::kDevice || f.format != PixelFormat::kBgr24) {
        return absl::FailedPreconditionError(
            StrCat("frame ", i, f.memory == FrameMemory::kDevice ? " is in device memory" : " is NV12",
                   "; this detector runs its stages on the host (", engine_->summary().path, ", device ",
                   options_.engine.device, ")"));
      }
      const int64_t row = static_cast<int64_t>(f.width) * 3;
      if (f.bgr == nullptr || f.width <= 0 || f.height <= 0 || (f.pitch != 0 && f.pitch < row)) {
        return absl::InvalidArgumentError(StrCat("frame ", i, ": ", f.width, "x", f.height, " pitch ", f.pitch,
                                                 " is empty or its pitch is less than width*3"));
      }
      const int64_t pitch = f.pitch == 0 ? row : f.pitch;
      images[i].width = f.width;
      images[i].height = f.height;
      images[i].bgr.resize(static_cast<size_t>(row * f.height));
      for (int y = 0; y < f.height; ++y) {
        std::copy_n(f.bgr + y * pitch, row, images[i].bgr.data() + y * row);
      }
    }
    return Detect(images, timing);
  }
  std::vector<std::vector<Detection>> results;
  results.reserve(frames.size());
  std::vector<DetectTiming> times(frames.size());
  const size_t batch = static_cast<size_t>(model_.batch);
  for (size_t first = 0; first < frames.size(); first += batch) {
    const size_t count = std::min(frames.size() - first, batch);
    VIGIL_ASSIGN_OR_RETURN(auto chunk, DetectChunkOnGpu(frames.subspan(first, count), first, kept, times));
    for (auto& r : chunk) results.push_back(std::move(r));
  }
  if (timing != nullptr) *timing = std::move(times);
  return results;
}

StatusOr<std::vector<std::vector<Detection>>> Detector::DetectChunkOnGpu(std::span<const FrameRef> frames,
                                                                         size_t first, std::vector<DeviceRows>* kept,
                                                                         std::vector<DetectTiming>& times) const {
#if VIGIL_HAVE_CUDA
  MutexLock lock(gpu_->mutex());
  const int64_t t0 = SteadyNs();
  auto infos = gpu_->Enqueue(frames);
  if (!infos.ok()) {
    (void)gpu_->Synchronize();
    return Annotate(infos.status(), StrCat("frames ", first, "..", first + frames.size() - 1));
  }
  VIGIL_RETURN_IF_ERROR(gpu_->CopyToHost());
  std::shared_ptr<const float> rows;
  if (kept != nullptr) {
    StatusOr<std::shared_ptr<const float>> k = gpu_->KeepRows();
    if (!k.ok()) {
      (void)gpu_->Synchronize();
      return k.status();
    }
    rows = std::move(*k);
  }
  const int64_t t1 = SteadyNs();
  VIGIL_RETURN_IF_ERROR(gpu_->Synchronize());
  const int64_t t2 = SteadyNs();
  std::vector<std::vector<Detection>> out = gpu_->HostDetections();
  if (rows) {
    const DeviceDetections d = gpu_->device_detections();
    for (size_t i = 0; i < frames.size(); ++i) {
      DeviceRows& k = (*kept)[first + i];
      k.device = d.device;
      k.rows = rows.get() + i * static_cast<size_t>(d.max_det) * 6;
      k.count = static_cast<uint32_t>(out[i].size());
      k.memory = rows;
    }
  }
  const int64_t t3 = SteadyNs();
  const int64_t n = static_cast<int64_t>(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    DetectTiming& t = times[first + i];
    t.preprocess_ns = (t1 - t0) / n;  // the host's share: staging copies and enqueueing
    t.inference_ns = t2 - t1;         // the wait for the device: upload, letterbox, model, decode, NMS, copy back
    t.postprocess_ns = (t3 - t2) / n;
    t.chunk_images = static_cast<int>(frames.size());
  }
  return out;
#else
  (void)frames;
  (void)first;
  (void)kept;
  (void)times;
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

StatusOr<DeviceDetections> Detector::DetectOnDevice(std::span<const FrameRef> frames) const {
#if VIGIL_HAVE_CUDA
  if (gpu_ != nullptr) {
    MutexLock lock(gpu_->mutex());
    auto infos = gpu_->Enqueue(frames);
    if (!infos.ok()) {
      (void)gpu_->Synchronize();
      return infos.status();
    }
    return gpu_->device_detections();
  }
#else
  (void)frames;
#endif
  return absl::FailedPreconditionError(StrCat("DetectOnDevice: detector for ", engine_->summary().path,
                                              " has no GPU stages (device ", options_.engine.device,
                                              options_.gpu_stages ? "" : ", gpu_stages off", ")"));
}

Status Detector::Synchronize() const {
#if VIGIL_HAVE_CUDA
  if (gpu_ != nullptr) {
    MutexLock lock(gpu_->mutex());
    return gpu_->Synchronize();
  }
#endif
  return absl::OkStatus();
}

Status DownloadRows(const DeviceRows& rows, float* dst) {
  if (rows.count == 0) return absl::OkStatus();
  if (rows.rows == nullptr) return absl::InvalidArgumentError("DownloadRows: no rows kept");
#if VIGIL_HAVE_CUDA
  VIGIL_RETURN_IF_ERROR(::vigil::cuda::CudaStatus(cudaSetDevice(rows.device), "DownloadRows: cudaSetDevice"));
  return ::vigil::cuda::CudaStatus(cudaMemcpy(dst, rows.rows, rows.count * 6 * sizeof(float), cudaMemcpyDeviceToHost),
                          "DownloadRows: cudaMemcpy");
#else
  (void)dst;
  return absl::FailedPreconditionError("DownloadRows: this build has no CUDA backend");
#endif
}

}  // namespace vigil::detect
