// Edge placement and NUMA metrics (vigil/pipeline/placement.h).
#include "vigil/pipeline/placement.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "vigil/pipeline/atomic_file.h"
#if VIGIL_HAVE_CUDA
#include "vigil/infer/cuda_device.h"
#endif
#include "vigil/topology/numa_stats.h"
#include "vigil/topology/report.h"

namespace vigil::pipeline {
namespace {

int64_t Product(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) p *= s[i];
  return p;
}

const Shape* ShapeOf(const infer::Graph& g, const std::string& name) {
  auto it = g.types.find(name);
  if (it != g.types.end()) return &it->second.shape;
  const Tensor* t = g.FindInitializer(name);
  return t ? &t->shape() : nullptr;
}

}  // namespace

double ModelGflopsPerFrame(const infer::Graph& g) {
  double macs = 0;
  for (const infer::Node& n : g.nodes) {
    const bool conv = (n.op_type == "Conv" && n.domain.empty()) || (n.op_type == "FusedConv" && n.domain == "vigil");
    const bool deconv = n.op_type == "ConvTranspose" && n.domain.empty();
    const bool matmul = (n.op_type == "MatMul" || n.op_type == "Gemm") && n.domain.empty();
    if (!(conv || deconv || matmul) || n.inputs.size() < 2 || n.outputs.empty()) continue;
    const Shape* x = ShapeOf(g, n.inputs[0]);
    const Shape* w = ShapeOf(g, n.inputs[1]);
    const Shape* y = ShapeOf(g, n.outputs[0]);
    if (!x || !w || !y || w->size() < 2 || x->empty()) continue;
    if (conv) {
      // Each output element: C/groups × kernel multiply-adds (W is [M, C/groups, k...]).
      macs += static_cast<double>(NumElements(*y)) * static_cast<double>(Product(*w, 1, w->size()));
    } else if (deconv) {
      // Each input element feeds M/groups × kernel outputs (W is [C, M/groups, k...]).
      macs += static_cast<double>(NumElements(*x)) * static_cast<double>(Product(*w, 1, w->size()));
    } else {
      // Y = A·B: each output element sums over K (A's last dim; Gemm may transpose A).
      const bool trans_a = n.op_type == "Gemm" && n.GetInt("transA", 0) != 0;
      const int64_t k = trans_a ? (*x)[0] : x->back();
      macs += static_cast<double>(NumElements(*y)) * static_cast<double>(k);
    }
  }
  int64_t batch = 1;
  if (!g.inputs.empty()) {
    const Shape* in = ShapeOf(g, g.inputs[0].name);
    if (in && !in->empty() && (*in)[0] > 0) batch = (*in)[0];
  }
  return 2.0 * macs / static_cast<double>(batch) / 1e9;
}

std::vector<topology::StreamSpec> PlanStreams(const EdgeConfig& config, const std::vector<video::Source::Probe>& probed,
                                              double gflop_per_frame, std::vector<std::string>* notes) {
  std::vector<topology::StreamSpec> out;
  for (size_t i = 0; i < config.streams.size(); ++i) {
    const StreamConfig& s = config.streams[i];
    const video::Source::Probe p = i < probed.size() ? probed[i] : video::Source::Probe{};
    topology::StreamSpec spec{s.id, s.width, s.height, s.fps, gflop_per_frame};
    std::vector<std::string> assumed;
    if (spec.width <= 0) {
      spec.width = p.width > 0 ? p.width : 1920;
      spec.height = p.height > 0 ? p.height : 1080;
      if (p.width <= 0) assumed.push_back("1920x1080");
    }
    if (spec.fps <= 0) {
      spec.fps = p.fps > 0 ? p.fps : 25;
      if (p.fps <= 0) assumed.push_back("25 fps");
    }
    if (s.target_fps > 0) spec.fps = std::min(spec.fps, s.target_fps);
    if (!assumed.empty() && notes) {
      notes->push_back(StrCat("stream '", s.id, "': ", assumed.size() == 2 ? StrCat(assumed[0], " at ", assumed[1]) : assumed[0],
                              " assumed (not probed; set streams[].placement)"));
    }
    out.push_back(std::move(spec));
  }
  return out;
}

topology::Topology PlanningTopology(topology::Topology topo, bool use_gpus, int cuda_ordinal) {
  if (!use_gpus && !topo.gpus.empty()) {
    topo.notes.push_back(StrCat("inference runs on the CPU: the ", topo.gpus.size(), " GPU(s) are left out of the plan"));
    topo.gpus.clear();
    topo.nvlinks.clear();
  }
  if (use_gpus && cuda_ordinal >= 0 && !topo.gpus.empty()) {
    auto same = [&](const topology::Gpu& g) { return g.cuda_ordinal == cuda_ordinal; };
    std::string how = StrCat("CUDA device ", cuda_ordinal);
    if (std::none_of(topo.gpus.begin(), topo.gpus.end(), same)) {
      // No CUDA ordinals in the topology (no CUDA OS devices, no CUDA runtime here): PCI bus order,
      // which is CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID.
      how = StrCat("GPU ", cuda_ordinal, " in PCI bus order (CUDA ordinals unknown)");
      const int index = cuda_ordinal;
      std::erase_if(topo.gpus, [&](const topology::Gpu& g) { return g.index != index; });
    } else {
      std::erase_if(topo.gpus, [&](const topology::Gpu& g) { return !same(g); });
    }
    topo.nvlinks.clear();  // one GPU left: no GPU pair to plan around
    if (topo.gpus.empty()) {
      topo.notes.push_back(StrCat("the model's ", how, " is not in this topology: CPU plan"));
    } else {
      topo.notes.push_back(StrCat("inference runs on one GPU: planning on ", how, " only (GPU ", topo.gpus[0].index,
                                  ", ", topo.gpus[0].pci.bus_id, ", is GPU 0 of the plan)"));
      topo.gpus[0].index = 0;  // planner and reports index topo.gpus by Gpu::index
    }
  }
  return topo;
}

EdgePlacement::EdgePlacement(const PlacementConfig& config, const std::vector<topology::StreamSpec>& streams,
                             bool use_gpus, std::string state_dir, int cuda_ordinal)
    : streams_(streams),
      report_path_(state_dir.empty() ? std::string() : (std::filesystem::path(state_dir) / "placement.json").string()) {
  Decide(config, use_gpus, cuda_ordinal);
  WriteReport(Report());  // replaces a previous run's report at once (no other thread yet)
  if (!report_path_.empty()) writer_ = std::thread([this] { WriterLoop(); });
}

EdgePlacement::~EdgePlacement() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (writer_.joinable()) writer_.join();
}

void EdgePlacement::WriterLoop() {
  pthread_setname_np(pthread_self(), "vigil-placement");
  MutexLock lock(mu_);
  for (;;) {
    while (!stopping_ && placed_ == written_) cv_.Wait(lock);
    if (placed_ == written_) return;  // stopping, and everything is written
    // Every thread placed up to now, in one write; those placed meanwhile go in the next.
    const uint64_t placed = placed_;
    const topology::PlacementReport report = ReportLocked();
    lock.Unlock();
    WriteReport(report);
    lock.Lock();
    written_ = placed;
    cv_.NotifyAll();
  }
}

void EdgePlacement::FlushReport() {
  MutexLock lock(mu_);
  while (writer_.joinable() && written_ != placed_) cv_.Wait(lock);
}

namespace {

// This machine's topology is discovered once per process (hwloc's discovery with its I/O devices takes a few
// hundred ms: a standby does it before it takes over); an XML file is read each time.
StatusOr<topology::Topology> DiscoverOnce(const std::string& xml) {
  if (!xml.empty() || std::getenv("VIGIL_TOPOLOGY_XML") != nullptr) return topology::Discover({xml});
  static Mutex mu;
  static std::optional<StatusOr<topology::Topology>> cached VIGIL_GUARDED_BY(mu);
  MutexLock lock(mu);
  if (!cached) cached = topology::Discover({});
  return *cached;
}

}  // namespace

void PrewarmPlacement(const PlacementConfig& config) { (void)DiscoverOnce(config.topology); }

void EdgePlacement::Decide(const PlacementConfig& config, bool use_gpus, int cuda_ordinal) {
  StatusOr<topology::Topology> topo = DiscoverOnce(config.topology);
  if (!topo.ok()) {
    note_ = StrCat("topology unreadable: ", topo.status().message());
    spdlog::info("placement: skipped: {}", note_);
    return;
  }
#if VIGIL_HAVE_CUDA
  if (use_gpus && topo->is_this_system) {  // match CUDA ordinals to the GPUs by PCI bus id
    std::string why;
    std::vector<std::pair<int, std::string>> ordinals;
    for (const cuda::DeviceInfo& d : cuda::ListDevices(&why)) ordinals.emplace_back(d.ordinal, d.pci_bus_id);
    if (Status st = topology::AssignCudaOrdinals(&*topo, ordinals); !st.ok()) {
      spdlog::info("placement: CUDA ordinals not matched to the topology: {}", std::string(st.message()));
    }
  }
#endif
  topo_ = PlanningTopology(std::move(*topo), use_gpus, cuda_ordinal);
  StatusOr<topology::Plan> plan = topology::MakePlan(*topo_, streams_, {});
  if (!plan.ok()) {
    note_ = StrCat("no plan: ", plan.status().message());
    spdlog::info("placement: skipped: {}", note_);
    return;
  }
  plan_ = std::move(*plan);
  if (!topo_->is_this_system) {
    note_ = StrCat("plan from ", topo_->source, ", not this machine");
    spdlog::info("placement: {}: threads are not bound", note_);
  } else {
    binder_.emplace(topology::BindOptions{config.bind, config.bind_single_numa});
    note_ = binder_->skip_reason();
  }
  for (const topology::DevicePlan& d : plan_->devices) {
    spdlog::info("placement: {} stream(s) on {} (NUMA node {}): worker PUs {}, decode PUs {}", d.streams.size(),
                 d.gpu >= 0 ? StrCat("GPU ", d.gpu) : std::string("CPU workers"), d.numa_node,
                 topology::FormatCpuList(d.worker_cpus), topology::FormatCpuList(d.decode_cpus));
  }
  for (const std::string& n : plan_->notes) spdlog::info("placement: {}", n);
}

void EdgePlacement::PlaceThread(ThreadRole role, size_t stream) {
  const std::string name = role == ThreadRole::kWorker ? std::string("vigil-worker")
                           : role == ThreadRole::kSink ? std::string("vigil-sink")
                                                       : StrCat(role == ThreadRole::kDecode ? "vigil-dec-" : "vigil-feed-", stream);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  if (!plan_) return;
  topology::PlacedThread t{gettid(), name.substr(0, 15), role == ThreadRole::kSink ? "sink" : "worker", "", -1, {}};
  if (role == ThreadRole::kWorker || role == ThreadRole::kSink) {
    for (const topology::DevicePlan& d : plan_->devices) t.cpus.insert(t.cpus.end(), d.worker_cpus.begin(), d.worker_cpus.end());
    std::sort(t.cpus.begin(), t.cpus.end());
    t.cpus.erase(std::unique(t.cpus.begin(), t.cpus.end()), t.cpus.end());
  } else {
    if (stream >= plan_->stream_device.size()) return;
    t.role = role == ThreadRole::kDecode ? "decode" : "feed";
    t.stream = streams_[stream].id;
    t.device = plan_->stream_device[stream];
    t.cpus = plan_->devices[static_cast<size_t>(t.device)].decode_cpus;
  }
  if (binding()) (void)binder_->BindCurrentThread(t.cpus, name);  // a failure is logged; the thread goes on unbound
  {
    MutexLock lock(mu_);
    threads_.push_back(std::move(t));
    ++placed_;
  }
  cv_.NotifyAll();  // the report's writer (no file is written on the placed thread)
}

void EdgePlacement::WriteReport(const topology::PlacementReport& report) const {
  if (report_path_.empty()) return;
  if (Status st = WriteFileAtomic(report_path_, topology::PlacementReportToJson(report)); !st.ok()) {
    spdlog::warn("placement: {}", std::string(st.message()));
  }
}

topology::PlacementReport EdgePlacement::Report() const {
  MutexLock lock(mu_);
  return ReportLocked();
}

topology::PlacementReport EdgePlacement::ReportLocked() const {
  topology::PlacementReport r;
  r.pid = getpid();
  r.binding = binding();
  r.binding_note = note_;
  if (!topo_ || !plan_) return r;
  r.topology = topo_->source;
  std::set<int> nodes;
  for (const topology::DevicePlan& d : plan_->devices) {
    if (d.numa_node >= 0) nodes.insert(d.numa_node);
  }
  r.memory_nodes.assign(nodes.begin(), nodes.end());
  r.plan_json = topology::ToJson(*topo_, &*plan_);
  r.threads = threads_;
  return r;
}

void RegisterNumaMetrics(metrics::Registry& registry) {
  struct State {
    Mutex mu;
    topology::NumaStat baseline VIGIL_GUARDED_BY(mu);
    std::map<pid_t, double> cpu VIGIL_GUARDED_BY(mu);  // tid → CPU seconds counted so far
  };
  auto state = std::make_shared<State>();
  if (StatusOr<topology::NumaStat> s = topology::ReadNumastat(); s.ok()) {
    MutexLock lock(state->mu);
    state->baseline = std::move(*s);
  }
  registry.AddCollectHook([&registry, state] {
    MutexLock lock(state->mu);
    if (StatusOr<topology::NumaMaps> maps = topology::ReadNumaMaps(0); maps.ok()) {
      for (const auto& [node, bytes] : maps->bytes_on_node) {
        registry.GetGauge("vigil_process_numa_memory_bytes", "Resident memory of this process per NUMA node (numa_maps), bytes",
                          {{"node", std::to_string(node)}})
            .Set(static_cast<double>(bytes));
      }
    }
    if (StatusOr<topology::NumaStat> now = topology::ReadNumastat(); now.ok()) {
      for (const auto& [node, counters] : *now) {
        for (const auto& [name, pages] : counters) {
          metrics::Counter& c = registry.GetCounter(
              "vigil_numastat_pages_total", "System NUMA allocation counters since the edge started (numastat), pages",
              {{"node", std::to_string(node)}, {"counter", name}});
          const uint64_t base = state->baseline[node].count(name) ? state->baseline[node][name] : 0;
          c.Inc(static_cast<double>(pages - std::min(pages, base)) - c.Value());
        }
      }
    }
    if (StatusOr<std::vector<topology::TaskInfo>> tasks = topology::ReadTasks(0); tasks.ok()) {
      std::map<pid_t, double> seen;
      for (const topology::TaskInfo& t : *tasks) {
        double counted = state->cpu.count(t.tid) ? state->cpu[t.tid] : 0;
        const double now_s = topology::CpuSeconds(t.stat);
        if (now_s < counted) counted = 0;  // the tid now names a new thread
        // Under the thread's current name: a thread that renamed itself goes on counting under its new name.
        registry.GetCounter("vigil_thread_cpu_seconds_total", "CPU time of this process's threads by thread name, seconds",
                            {{"thread", t.stat.comm}})
            .Inc(now_s - counted);
        seen[t.tid] = now_s;
      }
      state->cpu = std::move(seen);  // exited threads keep what they were counted
    }
  });
}

}  // namespace vigil::pipeline
