#include "detect/cuda/gpu_stages.h"

#include <algorithm>
#include <cstring>

#include "detect/cuda/detect_kernels.h"
#include "vigil/infer/cuda_util.h"
#include "vigil/detect/nms.h"

namespace vigil::detect {

using vigil::cuda::DeviceBuffer;
using vigil::cuda::PinnedBuffer;

struct GpuStages::Buffers {
  size_t frame_capacity = 0;      // bytes per slot of `staging` and `frames`
  PinnedBuffer staging;           // batch × frame_capacity: host frames, compact rows
  DeviceBuffer frames;            // batch × frame_capacity: uploaded frames, compact rows
  PinnedBuffer slots_host;        // batch × SlotGeometry
  DeviceBuffer slots;
  std::unique_ptr<GpuPostprocess> post;
  ~Buffers() {
  }
};

struct GpuPostprocess::Buffers {
  DeviceBuffer keys, sorted;      // batch × N uint64
  DeviceBuffer boxes;             // batch × N × 4 float
  DeviceBuffer classes;           // batch × N int
  DeviceBuffer counts;            // batch int: candidates
  DeviceBuffer offsets;           // 2 × batch int: sort segments
  DeviceBuffer sort_temp;
  size_t sort_temp_bytes = 0;
  DeviceBuffer allowed;           // class flags, when options.classes is not empty
  int allowed_count = 0;
  DeviceBuffer rows;              // batch × max_det × 6 float
  DeviceBuffer out_counts;        // batch int
  PinnedBuffer rows_host, counts_host;
};

namespace {

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

cuda::Layout LayoutOf(ModelFamily f) {
  switch (f) {
    case ModelFamily::kUltralytics: return cuda::Layout::kUltralytics;
    case ModelFamily::kYoloV5: return cuda::Layout::kYoloV5;
    case ModelFamily::kYolox: return cuda::Layout::kYolox;
    case ModelFamily::kEnd2End: return cuda::Layout::kEnd2End;
  }
  return cuda::Layout::kUltralytics;
}

Status CheckFrame(const FrameRef& f, size_t index, int device) {
  if (f.bgr == nullptr || f.width <= 0 || f.height <= 0) {
    return absl::InvalidArgumentError(
        StrCat("frame ", index, ": ", f.width, "x", f.height, " at ", f.bgr == nullptr ? "null" : "a buffer",
               " is empty"));
  }
  const bool nv12 = f.format == PixelFormat::kNv12;
  const int64_t row = static_cast<int64_t>(f.width) * (nv12 ? 1 : 3);
  if (f.pitch != 0 && f.pitch < row) {
    return absl::InvalidArgumentError(StrCat("frame ", index, ": pitch ", f.pitch, " bytes is less than ",
                                             nv12 ? "width" : "width*3", " = ", row));
  }
  if (nv12) {
    if (f.memory != FrameMemory::kDevice) {
      return absl::InvalidArgumentError(StrCat("frame ", index, ": NV12 frames are taken from device memory only"));
    }
    if (f.uv == nullptr || (f.uv_pitch != 0 && f.uv_pitch < f.width + f.width % 2)) {
      return absl::InvalidArgumentError(
          StrCat("frame ", index, ": NV12 ", f.width, "x", f.height, " needs a UV plane with pitch >= its row"));
    }
    if (!(f.kr > 0 && f.kb > 0 && f.kr + f.kb < 1)) {
      return absl::InvalidArgumentError(StrCat("frame ", index, ": luma weights Kr ", f.kr, ", Kb ", f.kb,
                                               " are not a Y'CbCr matrix (need Kr, Kb > 0, Kr + Kb < 1)"));
    }
  }
  if (f.memory == FrameMemory::kDevice) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, f.bgr) != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(StrCat("frame ", index, ": marked device memory but CUDA does not know it"));
    }
    if ((a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) || a.device != device) {
      return absl::FailedPreconditionError(StrCat("frame ", index, ": device frame is not in the memory of cuda:",
                                                  device, " (the detector's GPU)"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
T* As(const DeviceBuffer& b) {
  return static_cast<T*>(b.get());
}

}  // namespace

GpuPostprocess::~GpuPostprocess() = default;

StatusOr<std::unique_ptr<GpuPostprocess>> GpuPostprocess::Create(const ModelInfo& model, const DetectorOptions& options,
                                                                 float iou, int device) {
  if (model.strides.size() > 8) {
    return absl::InvalidArgumentError(StrCat("GPU post-processing: ", model.strides.size(), " strides (at most 8)"));
  }
  if (model.batch < 1 || model.num_boxes < 1 || options.max_det < 1) {
    return absl::InvalidArgumentError(StrCat("GPU post-processing: batch ", model.batch, ", ", model.num_boxes,
                                             " boxes, max_det ", options.max_det, " (all must be >= 1)"));
  }
  std::unique_ptr<GpuPostprocess> g(new GpuPostprocess());
  g->model_ = model;
  g->options_ = options;
  g->iou_ = iou;
  g->device_ = device;
  g->buffers_ = std::make_unique<Buffers>();
  Buffers& b = *g->buffers_;
  const size_t batch = static_cast<size_t>(model.batch), n = static_cast<size_t>(model.num_boxes);
  const size_t max_det = static_cast<size_t>(options.max_det);
  const std::string what = StrCat("detector GPU post-processing (batch ", batch, ", ", n, " boxes)");
  VIGIL_ASSIGN_OR_RETURN(b.keys, DeviceBuffer::Allocate(batch * n * sizeof(uint64_t), what));
  VIGIL_ASSIGN_OR_RETURN(b.sorted, DeviceBuffer::Allocate(batch * n * sizeof(uint64_t), what));
  VIGIL_ASSIGN_OR_RETURN(b.boxes, DeviceBuffer::Allocate(batch * n * 4 * sizeof(float), what));
  VIGIL_ASSIGN_OR_RETURN(b.classes, DeviceBuffer::Allocate(batch * n * sizeof(int), what));
  VIGIL_ASSIGN_OR_RETURN(b.counts, DeviceBuffer::Allocate(batch * sizeof(int), what));
  VIGIL_ASSIGN_OR_RETURN(b.offsets, DeviceBuffer::Allocate(2 * batch * sizeof(int), what));
  b.sort_temp_bytes = cuda::SortTempBytes(static_cast<int>(batch), static_cast<int64_t>(n));
  VIGIL_ASSIGN_OR_RETURN(b.sort_temp, DeviceBuffer::Allocate(std::max<size_t>(b.sort_temp_bytes, 256), what));
  VIGIL_ASSIGN_OR_RETURN(b.rows, DeviceBuffer::Allocate(batch * max_det * 6 * sizeof(float), what));
  VIGIL_ASSIGN_OR_RETURN(b.out_counts, DeviceBuffer::Allocate(batch * sizeof(int), what));
  VIGIL_ASSIGN_OR_RETURN(b.rows_host, PinnedBuffer::Allocate(batch * max_det * 6 * sizeof(float), what));
  VIGIL_ASSIGN_OR_RETURN(b.counts_host, PinnedBuffer::Allocate(batch * sizeof(int), what));
  if (!options.classes.empty()) {
    b.allowed_count = *std::max_element(options.classes.begin(), options.classes.end()) + 1;
    std::vector<uint8_t> flags(static_cast<size_t>(b.allowed_count), 0);
    for (int c : options.classes) flags[static_cast<size_t>(c)] = 1;
    VIGIL_ASSIGN_OR_RETURN(b.allowed, DeviceBuffer::Allocate(flags.size(), what));
    VIGIL_CUDA(cudaMemcpy(b.allowed.get(), flags.data(), flags.size(), cudaMemcpyHostToDevice));
  }
  return g;
}

Status GpuPostprocess::Enqueue(const void* output, bool half, int images, const cuda::SlotGeometry* slots,
                               cudaStream_t stream) {
  if (images < 1 || images > model_.batch) {
    return absl::InvalidArgumentError(StrCat("GPU post-processing: ", images, " images for a batch of ", model_.batch));
  }
  Buffers& b = *buffers_;
  cuda::DecodeParams dp;
  dp.layout = LayoutOf(model_.family);
  dp.num_boxes = model_.num_boxes;
  dp.num_classes = static_cast<int>(model_.num_classes);
  dp.half = half;
  dp.raw_boxes = model_.raw_boxes;
  dp.num_strides = static_cast<int>(model_.strides.size());
  for (int k = 0; k < dp.num_strides; ++k) dp.strides[k] = model_.strides[static_cast<size_t>(k)];
  dp.height = static_cast<int>(model_.height);
  dp.width = static_cast<int>(model_.width);
  dp.conf = options_.conf;
  dp.allowed = static_cast<const uint8_t*>(b.allowed.get());
  dp.allowed_count = b.allowed_count;
  VIGIL_CUDA(cudaMemsetAsync(b.counts.get(), 0, sizeof(int) * static_cast<size_t>(images), stream));
  VIGIL_CUDA(cuda::Decode(output, images, dp, As<uint64_t>(b.keys), As<float>(b.boxes), As<int>(b.classes),
                          As<int>(b.counts), stream));
  VIGIL_CUDA(cuda::SortCandidates(As<uint64_t>(b.keys), As<uint64_t>(b.sorted), As<int>(b.counts), As<int>(b.offsets),
                                  images, model_.num_boxes, b.sort_temp.get(), b.sort_temp_bytes, stream));
  const cuda::NmsParams np{.iou = iou_,
                           .max_det = options_.max_det,
                           .agnostic = options_.agnostic,
                           .suppress = model_.family != ModelFamily::kEnd2End,
                           .max_candidates = NmsOptions{}.max_candidates};
  VIGIL_CUDA(cuda::Nms(As<uint64_t>(b.sorted), As<float>(b.boxes), As<int>(b.classes), As<int>(b.counts), images,
                       model_.num_boxes, np, As<float>(b.rows), As<int>(b.out_counts), options_.max_det, stream));
  VIGIL_CUDA(cuda::MapToSource(slots, images, options_.max_det, As<int>(b.out_counts), As<float>(b.rows), stream));
  images_ = images;
  return absl::OkStatus();
}

Status GpuPostprocess::CopyToHost(cudaStream_t stream) {
  Buffers& b = *buffers_;
  const size_t images = static_cast<size_t>(images_), max_det = static_cast<size_t>(options_.max_det);
  VIGIL_CUDA(cudaMemcpyAsync(b.counts_host.get(), b.out_counts.get(), images * sizeof(int), cudaMemcpyDeviceToHost,
                             stream));
  VIGIL_CUDA(cudaMemcpyAsync(b.rows_host.get(), b.rows.get(), images * max_det * 6 * sizeof(float),
                             cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

std::vector<std::vector<Detection>> GpuPostprocess::HostDetections() const {
  const Buffers& b = *buffers_;
  const auto* counts = static_cast<const int*>(b.counts_host.get());
  const auto* rows = static_cast<const float*>(b.rows_host.get());
  std::vector<std::vector<Detection>> out(static_cast<size_t>(images_));
  for (int i = 0; i < images_; ++i) {
    const float* r = rows + static_cast<size_t>(i) * static_cast<size_t>(options_.max_det) * 6;
    out[static_cast<size_t>(i)].reserve(static_cast<size_t>(counts[i]));
    for (int k = 0; k < counts[i]; ++k, r += 6) {
      out[static_cast<size_t>(i)].push_back({r[0], r[1], r[2], r[3], r[4], static_cast<int>(r[5])});
    }
  }
  return out;
}

DeviceDetections GpuPostprocess::device_detections(cudaStream_t stream) const {
  return {.device = device_,
          .stream = stream,
          .rows = static_cast<const float*>(buffers_->rows.get()),
          .counts = static_cast<const int32_t*>(buffers_->out_counts.get()),
          .images = images_,
          .max_det = options_.max_det};
}

GpuStages::~GpuStages() {
  if (pending_) (void)cudaStreamSynchronize(AsStream(stream_));
}

StatusOr<std::unique_ptr<GpuStages>> GpuStages::Create(infer::Engine& engine, const ModelInfo& model,
                                                       const DetectorOptions& options, float iou) {
  const infer::DeviceIo* io = engine.device_io();
  if (io == nullptr) return absl::FailedPreconditionError("GPU stages need an engine on a CUDA device");
  std::unique_ptr<GpuStages> g(new GpuStages());
  g->engine_ = &engine;
  g->model_ = model;
  g->device_ = io->device;
  g->stream_ = io->stream;
  g->buffers_ = std::make_unique<Buffers>();
  Buffers& b = *g->buffers_;
  VIGIL_CUDA(cudaSetDevice(g->device_));
  const size_t batch = static_cast<size_t>(model.batch);
  const std::string what = StrCat("detector GPU stages (batch ", batch, ")");
  VIGIL_ASSIGN_OR_RETURN(b.slots_host, PinnedBuffer::Allocate(batch * sizeof(cuda::SlotGeometry), what));
  VIGIL_ASSIGN_OR_RETURN(b.slots, DeviceBuffer::Allocate(batch * sizeof(cuda::SlotGeometry), what));
  VIGIL_ASSIGN_OR_RETURN(b.post, GpuPostprocess::Create(model, options, iou, g->device_));
  return g;
}

Status GpuStages::EnsureFrameCapacity(size_t bytes) {
  Buffers& b = *buffers_;
  if (bytes <= b.frame_capacity) return absl::OkStatus();
  constexpr size_t kMiB = size_t{1} << 20;
  const size_t capacity = (bytes + kMiB - 1) / kMiB * kMiB;
  const size_t batch = static_cast<size_t>(model_.batch);
  const std::string what = StrCat("frame buffers (", batch, " x ", capacity, " bytes)");
  b.staging = PinnedBuffer();
  b.frames = DeviceBuffer();
  b.frame_capacity = 0;
  VIGIL_ASSIGN_OR_RETURN(b.staging, PinnedBuffer::Allocate(batch * capacity, what));
  VIGIL_ASSIGN_OR_RETURN(b.frames, DeviceBuffer::Allocate(batch * capacity, what));
  b.frame_capacity = capacity;
  return absl::OkStatus();
}

StatusOr<std::vector<LetterboxInfo>> GpuStages::Enqueue(std::span<const FrameRef> frames) {
  if (frames.empty() || static_cast<int64_t>(frames.size()) > model_.batch) {
    return absl::InvalidArgumentError(
        StrCat("GPU stages: ", frames.size(), " frames for a batch of ", model_.batch, " (need 1..", model_.batch, ")"));
  }
  VIGIL_CUDA(cudaSetDevice(device_));
  if (pending_) VIGIL_RETURN_IF_ERROR(Synchronize());  // its staging, slots and results are reused below
  size_t largest = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    VIGIL_RETURN_IF_ERROR(CheckFrame(frames[i], i, device_));
    if (frames[i].memory != FrameMemory::kDevice) {
      largest = std::max(largest, static_cast<size_t>(frames[i].width) * 3 * static_cast<size_t>(frames[i].height));
    }
  }
  VIGIL_RETURN_IF_ERROR(EnsureFrameCapacity(largest));
  Buffers& b = *buffers_;
  const cudaStream_t stream = AsStream(stream_);
  auto* slots = static_cast<cuda::SlotGeometry*>(b.slots_host.get());
  std::vector<LetterboxInfo> infos(frames.size());
  for (int64_t i = 0; i < model_.batch; ++i) slots[i] = cuda::SlotGeometry{};
  for (size_t i = 0; i < frames.size(); ++i) {
    const FrameRef& f = frames[i];
    const size_t row = static_cast<size_t>(f.width) * 3;
    const size_t pitch = f.pitch == 0 ? row : static_cast<size_t>(f.pitch);
    const LetterboxInfo info = ComputeLetterbox(f.width, f.height, static_cast<int>(model_.width),
                                                static_cast<int>(model_.height), model_.letterbox);
    infos[i] = info;
    cuda::SlotGeometry& s = slots[i];
    uint8_t* slot_frame = static_cast<uint8_t*>(b.frames.get()) + i * b.frame_capacity;
    switch (f.memory) {
      case FrameMemory::kHost: {
        uint8_t* stage = static_cast<uint8_t*>(b.staging.get()) + i * b.frame_capacity;
        if (pitch == row) {
          std::memcpy(stage, f.bgr, row * static_cast<size_t>(f.height));
        } else {
          for (int y = 0; y < f.height; ++y) std::memcpy(stage + y * row, f.bgr + y * pitch, row);
        }
        VIGIL_CUDA(cudaMemcpyAsync(slot_frame, stage, row * static_cast<size_t>(f.height), cudaMemcpyHostToDevice, stream));
        s.bgr = slot_frame;
        s.pitch = static_cast<int64_t>(row);
        break;
      }
      case FrameMemory::kPinnedHost:
        VIGIL_CUDA(cudaMemcpy2DAsync(slot_frame, row, f.bgr, pitch, row, static_cast<size_t>(f.height),
                                     cudaMemcpyHostToDevice, stream));
        s.bgr = slot_frame;
        s.pitch = static_cast<int64_t>(row);
        break;
      case FrameMemory::kDevice:
        s.bgr = f.bgr;
        s.pitch = static_cast<int64_t>(f.pitch != 0 ? f.pitch : (f.format == PixelFormat::kNv12 ? f.width : f.width * 3));
        if (f.format == PixelFormat::kNv12) {
          s.uv = f.uv;
          s.uv_pitch = f.uv_pitch != 0 ? f.uv_pitch : s.pitch;
          s.kr = f.kr;
          s.kb = f.kb;
          s.full_range = f.full_range;
        }
        break;
    }
    s.source_width = f.width;
    s.source_height = f.height;
    s.resized_width = info.resized_width;
    s.resized_height = info.resized_height;
    s.pad_left = info.pad_left;
    s.pad_top = info.pad_top;
    s.ratio = info.ratio;
  }
  const int batch = static_cast<int>(model_.batch), images = static_cast<int>(frames.size());
  VIGIL_CUDA(cudaMemcpyAsync(b.slots.get(), slots, sizeof(cuda::SlotGeometry) * static_cast<size_t>(batch),
                             cudaMemcpyHostToDevice, stream));
  const infer::DeviceIo* io = engine_->device_io();
  const bool ultralytics = model_.letterbox == LetterboxStyle::kUltralytics;
  const cuda::LetterboxParams lp{.batch = batch,
                                 .channels = static_cast<int>(model_.channels),
                                 .height = static_cast<int>(model_.height),
                                 .width = static_cast<int>(model_.width),
                                 .half = model_.input_dtype == DType::kFloat16,
                                 .rgb = ultralytics,
                                 .scale = ultralytics ? 1.0f / 255.0f : 1.0f};
  const auto* slots_dev = static_cast<const cuda::SlotGeometry*>(b.slots.get());
  VIGIL_CUDA(cuda::Letterbox(slots_dev, lp, io->inputs[0], stream));
  pending_ = true;
  VIGIL_RETURN_IF_ERROR(engine_->EnqueueOnDevice());
  VIGIL_RETURN_IF_ERROR(b.post->Enqueue(io->outputs[0], engine_->outputs()[0].dtype == DType::kFloat16, images,
                                        slots_dev, stream));
  return infos;
}

Status GpuStages::CopyToHost() { return buffers_->post->CopyToHost(AsStream(stream_)); }

struct GpuStages::RowPool {
  int device = 0;
  size_t bytes = 0;
  Mutex mu;
  std::vector<float*> free VIGIL_GUARDED_BY(mu);
  int made VIGIL_GUARDED_BY(mu) = 0;
  ~RowPool() {
    cudaSetDevice(device);
    for (float* p : free) cudaFree(p);
    cudaGetLastError();
  }
};

StatusOr<std::shared_ptr<const float>> GpuStages::KeepRows() {
  const DeviceDetections d = device_detections();
  const size_t bytes = static_cast<size_t>(d.max_det) * 6 * sizeof(float) * static_cast<size_t>(model_.batch);
  if (!row_pool_) {
    row_pool_ = std::make_shared<RowPool>();
    row_pool_->device = device_;
    row_pool_->bytes = bytes;
  }
  float* buf = nullptr;
  {
    MutexLock lock(row_pool_->mu);
    if (!row_pool_->free.empty()) {
      buf = row_pool_->free.back();
      row_pool_->free.pop_back();
    } else if (row_pool_->made < kMaxKeptRowBuffers) {
      void* p = nullptr;
      VIGIL_CUDA(cudaMalloc(&p, bytes));
      buf = static_cast<float*>(p);
      ++row_pool_->made;
    }
  }
  if (buf == nullptr) return std::shared_ptr<const float>();
  std::shared_ptr<const float> kept(buf, [pool = row_pool_](const float* p) {
    MutexLock lock(pool->mu);
    pool->free.push_back(const_cast<float*>(p));
  });
  VIGIL_CUDA(cudaMemcpyAsync(buf, d.rows, static_cast<size_t>(d.images) * d.max_det * 6 * sizeof(float),
                             cudaMemcpyDeviceToDevice, AsStream(stream_)));
  return kept;
}

Status GpuStages::Synchronize() {
  pending_ = false;
  VIGIL_CUDA(cudaSetDevice(device_));
  return engine_->SynchronizeDevice();
}

std::vector<std::vector<Detection>> GpuStages::HostDetections() const { return buffers_->post->HostDetections(); }

DeviceDetections GpuStages::device_detections() const {
  return buffers_->post->device_detections(AsStream(stream_));
}

}  // namespace vigil::detect
