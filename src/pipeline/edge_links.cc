// MakeEdgeLinks and EdgeWorkerOptions (edge.h): what the edge's configuration makes of its links and its
// worker pool, apart from the Edge that runs them.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "vigil/pipeline/edge.h"
#include "vigil/infer/engine.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/link.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/ucx.h"

namespace vigil::pipeline {

using std::chrono::milliseconds;

StatusOr<std::vector<std::shared_ptr<transport::Link>>> MakeEdgeLinks(const EdgeConfig& config) {
  std::string key;
  if (!config.key_file.empty()) {
    VIGIL_ASSIGN_OR_RETURN(key, transport::ReadKeyFile(config.key_file));
  } else if (const char* env = std::getenv("VIGIL_EDGE_KEY"); env != nullptr && *env != '\0') {
    VIGIL_ASSIGN_OR_RETURN(key, transport::ParseHexKey(env, "environment variable VIGIL_EDGE_KEY"));
  } else {
    spdlog::warn("edge '{}': no key (transport.key_file or VIGIL_EDGE_KEY): the links carry no proof, and this edge "
                 "cannot tell the aggregator from an impostor",
                 config.edge);
  }
  std::vector<std::shared_ptr<transport::Link>> links;
  for (const std::string& kind : config.links) {
    if (kind == "tcp") {
      std::unique_ptr<transport::Dialer> dialer = transport::MakeTcpDialer(config.aggregator_host, config.aggregator_port);
      if (config.tls) {
        transport::TlsOptions to;
        to.ca_file = config.tls_ca_file;
        to.cert_file = config.tls_cert_file;
        to.key_file = config.tls_key_file;
        to.server_name = config.tls_server_name;
        VIGIL_ASSIGN_OR_RETURN(std::shared_ptr<transport::TlsContext> tls, transport::TlsContext::Client(to));
        dialer = transport::MakeTlsDialer(std::move(dialer), std::move(tls), config.tls_server_name);
      }
      links.push_back(transport::MakeFramedLink(std::move(dialer), {"tcp", key}));
    } else if (kind == "ucx") {
#if !VIGIL_HAVE_UCX
      return absl::UnimplementedError("transport.links: ucx: this vigil was built without UCX (Debian libucx-dev)");
#endif
      const std::string host = config.ucx_host.empty() ? config.aggregator_host : config.ucx_host;
      links.push_back(transport::MakeFramedLink(transport::MakeUcxDialer(host, config.ucx_port, {}), {"ucx", key}));
    } else if (kind == "cuda_ipc") {
      // Ring slots are written from the edge's first GPU (where its detections are); -1: the ring's GPU.
      int device = -1;
      for (const std::string& d : config.devices) {
        if (device < 0) device = CudaOrdinal(d);
      }
      links.push_back(transport::MakeCudaIpcLink(config.cuda_ipc_socket, key, device,
                                                     static_cast<uint32_t>(config.cuda_ipc_linger_us)));
    } else {
      return absl::InvalidArgumentError(StrCat("transport.links: unknown link '", kind, "'"));
    }
  }
  return links;
}

WorkerPoolOptions EdgeWorkerOptions(const EdgeConfig& config, const std::function<bool()>& symbolic_batch, int cores) {
  WorkerPoolOptions wo;
  wo.model_path = config.model_path;
  wo.detector.engine.threads = config.threads;
  if (StatusOr<infer::Precision> p = infer::ParsePrecision(config.precision); p.ok()) wo.detector.engine.precision = *p;
  if (StatusOr<infer::Int8Activations> a = infer::ParseInt8Activations(config.int8_activations); a.ok()) {
    wo.detector.engine.int8_activations = *a;
  }
  wo.detector.engine.batch = config.model_batch;
  const bool all_gpus = std::all_of(config.devices.begin(), config.devices.end(),
                                    [](const std::string& d) { return CudaOrdinal(d) >= 0; });
  // On GPUs a model with a symbolic batch runs the cross-stream batches whole: one engine run per batch, not
  // one per frame (a fixed batch stays the model's). A partial batch is padded, which a GPU absorbs; on the
  // CPU padding costs in proportion, so there the engine batch stays 1 unless model.batch says.
  if (config.model_batch == 0 && config.max_batch > 1 && all_gpus && symbolic_batch()) {
    wo.detector.engine.batch = config.max_batch;
  }
  wo.detector.conf = static_cast<float>(config.conf);
  wo.detector.iou = static_cast<float>(config.iou);
  wo.detector.max_det = config.max_det;
  wo.devices = config.devices;
  wo.workers_per_device = config.workers_per_device > 0 ? config.workers_per_device : all_gpus ? 2 : 1;
  if (config.threads == 0 && wo.workers_per_device > 1 &&
      std::find(config.devices.begin(), config.devices.end(), "cpu") != config.devices.end()) {
    // Several CPU Detectors share the cores: each takes its part instead of all of them (oversubscribed
    // OpenMP teams spin against each other).
    wo.detector.engine.threads = std::max(1, std::max(cores, 1) / wo.workers_per_device);
  }
  wo.max_batch = static_cast<size_t>(config.max_batch);
  wo.max_wait = milliseconds(config.max_wait_ms);
  wo.streams = std::max<size_t>(config.streams.size(), 1);
  for (const StreamDevice& sd : AssignStreamDevices(config)) wo.stream_device.push_back(sd.device);
  if (wo.stream_device.empty()) wo.stream_device.push_back(0);
  // Links that can send rows from GPU memory (cuda_ipc; ucx where UCX has CUDA transports): GPU detectors
  // keep each batch's rows there too (one device-to-device copy per batch); every other link sends the host
  // copy the rules read anyway.
  wo.keep_device_rows = std::any_of(config.links.begin(), config.links.end(),
                                    [](const std::string& l) { return l == "cuda_ipc" || l == "ucx"; });
  // Streams with snapshots keep their pictures until the sink hands an event's frame to the Snapshotter.
  for (const StreamConfig& sc : config.streams) wo.keep_pictures.push_back(sc.snapshots.enabled);
  return wo;
}

}  // namespace vigil::pipeline
