// The edge's engines set up before any stream is read (worker_setup.h).
#include "vigil/pipeline/worker_setup.h"

#include <algorithm>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "vigil/detect/detector.h"
#include "vigil/infer/engine.h"
#include "vigil/pipeline/edge.h"
#include "vigil/replication/frame_ring.h"
#include "vigil/transport/device_memory.h"

namespace vigil::pipeline {

std::set<int> DecodeGpus(const std::vector<std::string>& stream_hwaccel) {
  std::set<int> gpus;
  for (const std::string& hw : stream_hwaccel) {
    if (StatusOr<std::optional<int>> d = video::ParseHwaccel(hw); d.ok() && *d) gpus.insert(**d);
  }
  return gpus;
}

std::vector<int> DeviceGpus(const WorkerPool& pool, size_t devices, const std::set<int>& held) {
  std::vector<int> device_gpu(devices, -1);
  for (size_t w = 0; w < pool.num_workers(); ++w) {
    const detect::Detector& d = pool.detector(w);
    if (d.uses_gpu_stages() && held.count(d.engine().device_io()->device) > 0) {
      device_gpu[pool.worker_device(w)] = d.engine().device_io()->device;
    }
  }
  return device_gpu;
}

// The Detectors, per device, after FFmpeg holds the decoding GPUs' contexts.
StatusOr<EdgeWorkers> LoadEdgeWorkers(const EdgeConfig& config, LoadDetector load_detector) {
  EdgeWorkers out;
  for (StreamDevice& sd : AssignStreamDevices(config)) {  // the device itself: pool->device_of
    out.stream_hwaccel.push_back(std::move(sd.hwaccel));
  }
  // Streams decoded by NVDEC: FFmpeg must make each GPU's primary CUDA context (with its flags) before the
  // model's CUDA runtime touches that GPU; the runtime then shares it (video::RetainCudaDecodeDevice).
  std::set<int> held_gpus;
  for (int gpu : DecodeGpus(out.stream_hwaccel)) {
    StatusOr<std::shared_ptr<void>> held = video::RetainCudaDecodeDevice(gpu);
    if (held.ok()) {
      out.decode_devices.push_back(std::move(*held));
      held_gpus.insert(gpu);
    } else {
      spdlog::warn("hwaccel: {}; its streams decode on the CPU", std::string(held.status().message()));
    }
  }
  // The model file is read for its batch dimension only when the answer changes the engine batch.
  const auto symbolic_batch = [&] {
    StatusOr<infer::ModelSummary> m = infer::InspectModel(config.model_path);
    return m.ok() && !m->inputs.empty() && !m->inputs[0].dims.empty() && m->inputs[0].dims[0].value <= 0;
  };
  WorkerPoolOptions wo =
      EdgeWorkerOptions(config, symbolic_batch, static_cast<int>(std::thread::hardware_concurrency()));
  if (load_detector) wo.load_detector = std::move(load_detector);
  VIGIL_ASSIGN_OR_RETURN(out.pool, WorkerPool::Load(std::move(wo)));
  out.device_gpu = DeviceGpus(*out.pool, config.devices.size(), held_gpus);
  spdlog::info("edge '{}': {} worker(s) on each of {}", config.edge, out.pool->num_workers() / out.pool->num_devices(),
               fmt::join(config.devices, ", "));
  return out;
}

size_t WarmUpEngines(const EdgeConfig& config, const EdgeWorkers& workers, Clock* clock) {
  const WorkerPool& pool = *workers.pool;
  const int64_t t0 = clock->SteadyNs();
  size_t runs = 0;
  for (size_t w = 0; w < pool.num_workers(); ++w) {
    const detect::Detector& d = pool.detector(w);
    detect::Image grey;
    grey.width = static_cast<int>(std::max<int64_t>(d.model().width, 32));
    grey.height = static_cast<int>(std::max<int64_t>(d.model().height, 32));
    grey.bgr.assign(static_cast<size_t>(grey.width) * grey.height * 3, 114);
    const std::vector<detect::Image> batch(static_cast<size_t>(std::max(1, config.max_batch)), grey);
    auto run = [&](size_t n) {
      ++runs;
      if (auto r = d.Detect(std::span<const detect::Image>(batch.data(), n)); !r.ok()) {
        spdlog::warn("edge '{}': warming worker {} up with {} picture(s) failed: {}", config.edge, w, n,
                     std::string(r.status().message()));
      }
    };
    run(1);
    if (batch.size() > 1) run(batch.size());
    // A worker that reads NVDEC pictures in place runs them through other kernels (NV12 letterbox, the rows kept
    // on the device): those too, so a takeover's first batch of camera pictures loads nothing.
    if (const int gpu = workers.device_gpu[pool.worker_device(w)]; gpu >= 0) {
      constexpr size_t kW = 1280, kH = 720;
      const size_t bytes = replication::PackedNv12Bytes(kW, kH);
      StatusOr<std::unique_ptr<transport::device_memory::Buffer>> buf = transport::device_memory::Allocate(gpu, bytes);
      const std::vector<uint8_t> mid_grey(bytes, 128);
      Status st = buf.ok() ? transport::device_memory::Copy2D((*buf)->data(), bytes, mid_grey.data(), bytes, bytes, 1, gpu)
                           : buf.status();
      if (st.ok()) {
        detect::FrameRef f;
        f.bgr = static_cast<const uint8_t*>((*buf)->data());
        f.width = static_cast<int>(kW);
        f.height = static_cast<int>(kH);
        f.pitch = static_cast<int64_t>(kW);
        f.memory = detect::FrameMemory::kDevice;
        f.format = detect::PixelFormat::kNv12;
        f.uv = f.bgr + kW * kH;
        f.uv_pitch = static_cast<int64_t>(kW);
        const std::vector<detect::FrameRef> frames(batch.size(), f);
        std::vector<detect::DeviceRows> kept;
        ++runs;
        st = d.DetectFrames(frames, nullptr, &kept).status();
      }
      if (!st.ok()) {
        spdlog::warn("edge '{}': warming worker {} up with NV12 pictures on cuda:{} failed: {}", config.edge, w, gpu,
                     std::string(st.message()));
      }
    }
  }
  spdlog::info("edge '{}': {} worker engine(s) warmed up in {} ms", config.edge, pool.num_workers(),
               (clock->SteadyNs() - t0) / 1'000'000);
  return runs;
}

std::unique_ptr<EdgePlacement> PlaceEdge(const EdgeConfig& config, const WorkerPool& pool,
                                         const std::vector<video::Source::Probe>& probed) {
  double gflop = config.placement.gflop_per_frame;
  if (gflop <= 0) {
    gflop = ModelGflopsPerFrame(pool.detector().engine().graph());
    spdlog::info("placement: model cost {:.2f} GFLOP per frame (counted from the model)", gflop);
  }
  std::vector<std::string> notes;
  std::vector<topology::StreamSpec> specs = PlanStreams(config, probed, gflop, &notes);
  for (const std::string& n : notes) spdlog::info("placement: {}", n);
  // On one GPU, the plan keeps that GPU: threads (and the staging the workers allocate) on its node; on
  // several, every GPU of the machine.
  std::set<int> gpus;
  for (size_t w = 0; w < pool.num_workers(); ++w) {
    const detect::Detector& d = pool.detector(w);
    if (d.uses_gpu_stages()) gpus.insert(d.engine().device_io()->device);
  }
  return std::make_unique<EdgePlacement>(config.placement, specs, /*use_gpus=*/!gpus.empty(), config.state_dir,
                                         gpus.size() == 1 ? *gpus.begin() : -1);
}

}  // namespace vigil::pipeline
