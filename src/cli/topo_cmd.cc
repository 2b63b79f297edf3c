// `vigil topo`: the machine's GPU / NUMA / CPU / NIC topology, Kubernetes labels, a placement plan.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"

#ifdef VIGIL_HAVE_HWLOC
#include <filesystem>
#include <fstream>
#include <sstream>

#include <httplib.h>

#include "vigil/topology/placement_check.h"
#include "vigil/topology/planner.h"
#include "vigil/topology/report.h"
#include "vigil/topology/topology.h"
#endif
#ifdef VIGIL_HAVE_PIPELINE
#include "vigil/infer/engine.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/pipeline/placement.h"
#include "vigil/video/source.h"
#endif

namespace vigil::cli {

#ifdef VIGIL_HAVE_HWLOC
namespace {

struct TopoArgs {
  std::string topology;
  bool json = false;
  bool k8s_labels = false;
  std::string plan_config;  // --plan edge.yaml
  bool gpus = false;
  std::string check;        // --check URL | placement.json | state dir
  int plan_streams = 0;
  std::string stream_size = "1920x1080";
  double fps = 30;
  double cost = 8.7;
  topology::PlanOptions plan;
};

// The placement report of a running edge: GET <url>/api/placement, or a placement.json (or the state
// dir holding one).
StatusOr<topology::PlacementReport> FetchReport(const std::string& target) {
  std::string text;
  if (target.rfind("http://", 0) == 0) {
    httplib::Client http(target);
    http.set_connection_timeout(5);
    httplib::Result res = http.Get("/api/placement");
    if (!res) return absl::UnavailableError(StrCat(target, "/api/placement: ", httplib::to_string(res.error())));
    if (res->status != 200) return absl::UnavailableError(StrCat(target, "/api/placement: HTTP ", res->status));
    text = res->body;
  } else {
    std::filesystem::path path = target;
    if (std::filesystem::is_directory(path)) path /= "placement.json";
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(StrCat(path.string(), ": cannot read"));
    std::stringstream buf;
    buf << in.rdbuf();
    text = buf.str();
  }
  StatusOr<topology::PlacementReport> r = topology::PlacementReportFromJson(text);
  if (!r.ok()) return Annotate(r.status(), target);
  return r;
}

int RunCheck(const TopoArgs& a) {
  StatusOr<topology::PlacementReport> report = FetchReport(a.check);
  if (!report.ok()) {
    std::fprintf(stderr, "vigil topo --check: %s\n", std::string(report.status().message()).c_str());
    return 2;
  }
  StatusOr<topology::PlacementCheck> check = topology::CheckPlacement(*report);
  if (!check.ok()) {
    std::fprintf(stderr, "vigil topo --check: pid %d: %s (the edge must run on this machine)\n", static_cast<int>(report->pid),
                 std::string(check.status().message()).c_str());
    return 2;
  }
  std::cout << topology::FormatPlacementCheck(*check);
  return check->ok() ? 0 : 1;
}

#ifdef VIGIL_HAVE_PIPELINE
// The streams of an edge config as the edge would plan them: sizes and rates from the config, else
// probed by opening each source (files and image folders; network sources are not dialled), cost from
// the config, else counted from the model.
StatusOr<std::vector<topology::StreamSpec>> EdgeStreams(const pipeline::EdgeConfig& cfg, std::vector<std::string>* notes) {
  std::vector<video::Source::Probe> probed;
  for (const pipeline::StreamConfig& s : cfg.streams) {
    video::SourceOptions so;
    so.uri = s.source;
    so.stream_id = s.id;
    video::Source::Probe p;
    if (s.width <= 0 || s.fps <= 0) {
      StatusOr<std::unique_ptr<video::Source>> src = video::OpenSource(so);
      if (src.ok()) p = (*src)->probed();
      else notes->push_back(StrCat("stream '", s.id, "': not probed: ", src.status().message()));
    }
    probed.push_back(p);
  }
  double gflop = cfg.placement.gflop_per_frame;
  if (gflop <= 0) {
    infer::EngineOptions eo;
    eo.threads = 1;
    eo.batch = cfg.model_batch;
    StatusOr<std::unique_ptr<infer::Engine>> engine = infer::Engine::Load(cfg.model_path, eo);
    if (!engine.ok()) {
      return Annotate(engine.status(), "model cost per frame (set placement.gflop_per_frame to plan without the model)");
    }
    gflop = pipeline::ModelGflopsPerFrame((*engine)->graph());
    char cost[32];
    std::snprintf(cost, sizeof cost, "%.2f", gflop);
    notes->push_back(StrCat("model cost ", cost, " GFLOP per frame, counted from ", cfg.model_path, " (2 x multiply-adds)"));
  }
  return pipeline::PlanStreams(cfg, probed, gflop, notes);
}
#endif

int RunTopo(const TopoArgs& a) {
  if (!a.check.empty()) return RunCheck(a);
  std::string topology_path = a.topology;
#ifdef VIGIL_HAVE_PIPELINE
  std::optional<pipeline::EdgeConfig> edge_config;
  if (!a.plan_config.empty()) {
    StatusOr<pipeline::EdgeConfig> cfg = pipeline::LoadEdgeConfig(a.plan_config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "vigil topo --plan: %s\n", std::string(cfg.status().message()).c_str());
      return 2;
    }
    edge_config = std::move(*cfg);
    if (topology_path.empty()) topology_path = edge_config->placement.topology;
  }
#else
  if (!a.plan_config.empty()) {
    std::fprintf(stderr, "vigil topo --plan: this build has no edge pipeline (needs FFmpeg)\n");
    return 2;
  }
#endif
  StatusOr<topology::Topology> topo = topology::Discover({topology_path});
  if (!topo.ok()) {
    std::fprintf(stderr, "vigil topo: %s\n", std::string(topo.status().message()).c_str());
    return 2;
  }
  if (a.k8s_labels) {
    for (const std::string& l : topology::KubernetesLabels(*topo)) std::cout << l << "\n";
    return 0;
  }
  StatusOr<topology::Plan> plan = absl::UnknownError("no plan asked for");
  topology::Topology planned_on = *topo;  // what the plan was made on (without GPUs for a CPU plan)
  std::vector<std::string> notes;
#ifdef VIGIL_HAVE_PIPELINE
  if (edge_config) {
    StatusOr<std::vector<topology::StreamSpec>> streams = EdgeStreams(*edge_config, &notes);
    if (!streams.ok()) {
      std::fprintf(stderr, "vigil topo --plan: %s\n", std::string(streams.status().message()).c_str());
      return 2;
    }
    // Planned the way the edge plans it: a model on one CUDA device N (model.device "cuda:N") on that GPU
    // only, on several GPUs on every GPU of the machine.
    int ordinal = -1, gpu_devices = 0;
    for (const std::string& d : edge_config->devices) {
      if (const int n = pipeline::CudaOrdinal(d); n >= 0) {
        ordinal = n;
        ++gpu_devices;
      }
    }
    if (gpu_devices > 1) ordinal = -1;
    const bool use_gpus = a.gpus || gpu_devices > 0;
    planned_on = pipeline::PlanningTopology(*topo, use_gpus, ordinal);
    if (planned_on.gpus.size() != topo->gpus.size()) {
      notes.push_back(planned_on.notes.back() + (use_gpus ? "" : " (--gpus plans them)"));
    }
    plan = topology::MakePlan(planned_on, *streams, a.plan);
    if (!plan.ok()) {
      std::fprintf(stderr, "vigil topo: plan: %s\n", std::string(plan.status().message()).c_str());
      return 2;
    }
  }
#endif
  if (a.plan_streams > 0) {
    int w = 0, h = 0;
    char tail = 0;
    if (std::sscanf(a.stream_size.c_str(), "%dx%d%c", &w, &h, &tail) != 2) {
      std::fprintf(stderr, "vigil topo: --stream-size '%s': expected WIDTHxHEIGHT in pixels, e.g. 1920x1080\n", a.stream_size.c_str());
      return 2;
    }
    std::vector<topology::StreamSpec> streams;
    for (int i = 0; i < a.plan_streams; ++i) streams.push_back({StrCat("cam", i), w, h, a.fps, a.cost});
    plan = topology::MakePlan(*topo, streams, a.plan);
    if (!plan.ok()) {
      std::fprintf(stderr, "vigil topo: plan: %s\n", std::string(plan.status().message()).c_str());
      return 2;
    }
  }
  if (a.json) {
    // With a plan, the topology it was made on (its device indexes refer to that one's GPUs).
    std::cout << topology::ToJson(plan.ok() ? planned_on : *topo, plan.ok() ? &*plan : nullptr) << "\n";
  } else {
    std::cout << topology::FormatTopologyText(*topo);
    if (plan.ok()) std::cout << "\n" << topology::FormatPlanText(planned_on, *plan);
    if (!notes.empty()) std::cout << "plan inputs:\n";
    for (const std::string& n : notes) std::cout << "  - " << n << "\n";
  }
  return plan.ok() && !plan->fits ? 1 : 0;
}

}  // namespace

void AddTopoCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TopoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "topo", "GPU / NUMA / CPU / NIC topology (nvidia-smi topo -m style), Kubernetes labels, placement plan");
  cmd->footer(
      "Exit: 0 ok, 1 the plan's load exceeds capacity or --check found a mismatch, 2 bad arguments,\n"
      "unreadable topology, config or model.\n"
      "--plan edge.yaml plans the config's streams as `vigil edge` does: frame size and rate from\n"
      "streams[].placement, else probed from the file, else 1920x1080 at 25 fps; cost per frame from\n"
      "placement.gflop_per_frame, else counted from the model (2 x multiply-adds of its convolutions and\n"
      "matrix products). While inference runs on the CPU the edge plans CPU workers per NUMA node;\n"
      "--gpus plans the streams onto the GPUs instead. --plan-streams N plans N identical streams.\n"
      "--check TARGET compares a running edge's threads and NUMA-placed memory with its plan; TARGET is\n"
      "its HTTP address (http://127.0.0.1:9100, GET /api/placement) or its state dir / placement.json.");
  cmd->add_option("--topology", args->topology,
                  "hwloc XML export to read instead of this machine (default: $VIGIL_TOPOLOGY_XML, else this machine)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_flag("--k8s-labels", args->k8s_labels, "print Kubernetes node labels, one key=value per line");
  cmd->add_option("--plan", args->plan_config, "print the placement plan of this edge config (edge.yaml)");
  cmd->add_flag("--gpus", args->gpus, "with --plan: place the streams on the GPUs (GPU inference)");
  cmd->add_option("--check", args->check, "check a running edge against its plan: http://HOST:PORT or its state dir");
  cmd->add_option("--plan-streams", args->plan_streams, "plan this many identical streams")->check(CLI::NonNegativeNumber);
  cmd->add_option("--stream-size", args->stream_size, "frame size of each stream, pixels")->capture_default_str();
  cmd->add_option("--fps", args->fps, "frames per second of each stream")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--cost", args->cost, "model cost per frame, GFLOP (YOLOv8n at 640: 8.7)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpu-capacity", args->plan.gpu_capacity_gflops, "GFLOP/s one GPU sustains; 0 = unknown")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--cpu-capacity", args->plan.cpu_capacity_gflops_per_core, "GFLOP/s one CPU core sustains; 0 = unknown")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--workers-per-gpu", args->plan.worker_threads_per_gpu, "inference worker threads per GPU")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--decode-pool", args->plan.decode_pool_threads, "decode threads per device (0: one per stream)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->callback([args, exit_code] { *exit_code = RunTopo(*args); });
}

#else  // built without hwloc

void AddTopoCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("topo", "topology report (not built: needs hwloc)");
  cmd->allow_extras();
  cmd->callback([exit_code] {
    std::fprintf(stderr,
                 "vigil topo: topology support was not built: hwloc 2.x (Debian libhwloc-dev) was not found when "
                 "vigil was configured, or VIGIL_WITH_HWLOC=OFF; install libhwloc-dev and reconfigure\n");
    *exit_code = 2;
  });
}

#endif

}  // namespace vigil::cli
