// `vigil topo`: the machine's GPU / NUMA / CPU / NIC topology, Kubernetes labels, a placement plan.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"

#ifdef VIGIL_HAVE_HWLOC
#include "vigil/topology/planner.h"
#include "vigil/topology/report.h"
#include "vigil/topology/topology.h"
#endif

namespace vigil::cli {

#ifdef VIGIL_HAVE_HWLOC
namespace {

struct TopoArgs {
  std::string topology;
  bool json = false;
  bool k8s_labels = false;
  int plan_streams = 0;
  std::string stream_size = "1920x1080";
  double fps = 30;
  double cost = 8.7;
  topology::PlanOptions plan;
};

int RunTopo(const TopoArgs& a) {
  StatusOr<topology::Topology> topo = topology::Discover({a.topology});
  if (!topo.ok()) {
    std::fprintf(stderr, "vigil topo: %s\n", std::string(topo.status().message()).c_str());
    return 2;
  }
  if (a.k8s_labels) {
    for (const std::string& l : topology::KubernetesLabels(*topo)) std::cout << l << "\n";
    return 0;
  }
  StatusOr<topology::Plan> plan = absl::UnknownError("no plan asked for");
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
    std::cout << topology::ToJson(*topo, plan.ok() ? &*plan : nullptr) << "\n";
  } else {
    std::cout << topology::FormatTopologyText(*topo);
    if (plan.ok()) std::cout << "\n" << topology::FormatPlanText(*topo, *plan);
  }
  return plan.ok() && !plan->fits ? 1 : 0;
}

}  // namespace

void AddTopoCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TopoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "topo", "GPU / NUMA / CPU / NIC topology (nvidia-smi topo -m style), Kubernetes labels, placement plan");
  cmd->footer(
      "Exit: 0 ok, 1 the plan's load exceeds capacity, 2 bad arguments or unreadable topology.\n"
      "A plan from an edge config (--plan edge.yaml) comes with the edge config; until then describe the\n"
      "streams with --plan-streams, --stream-size, --fps and --cost.");
  cmd->add_option("--topology", args->topology,
                  "hwloc XML export to read instead of this machine (default: $VIGIL_TOPOLOGY_XML, else this machine)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_flag("--k8s-labels", args->k8s_labels, "print Kubernetes node labels, one key=value per line");
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
