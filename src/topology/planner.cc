// MakePlan (vigil/topology/planner.h).
#include "vigil/topology/planner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

namespace vigil::topology {
namespace {

std::string Fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A core as the planner sees it: its allowed PUs and its NUMA node (-1: none, or one not allowed).
struct UsableCore {
  CpuList cpus;
  int numa_node;
};

CpuList PusOf(const std::vector<UsableCore>& cores, const std::vector<size_t>& which) {
  CpuList out;
  for (size_t i : which) out.insert(out.end(), cores[i].cpus.begin(), cores[i].cpus.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::string DeviceName(const Topology& topo, const DevicePlan& d) {
  if (d.gpu >= 0) return StrCat("GPU ", d.gpu, " (", topo.gpus[d.gpu].pci.bus_id, ")");
  return d.numa_node >= 0 ? StrCat("CPU workers of NUMA node ", d.numa_node) : std::string("CPU workers without a NUMA node");
}

Status Validate(const std::vector<StreamSpec>& streams, const PlanOptions& o) {
  std::set<std::string> ids;
  for (const StreamSpec& s : streams) {
    if (s.id.empty()) return absl::InvalidArgumentError("stream without an id");
    if (!ids.insert(s.id).second) return absl::InvalidArgumentError(StrCat("stream '", s.id, "': id used twice"));
    if (s.width <= 0 || s.height <= 0 || !(s.fps > 0) || !(s.gflop_per_frame >= 0)) {
      return absl::InvalidArgumentError(StrCat("stream '", s.id, "': size ", s.width, "x", s.height, ", fps ", s.fps,
                                               ", cost ", s.gflop_per_frame, " GFLOP/frame: need positive size and fps, cost >= 0"));
    }
  }
  if (o.worker_threads_per_gpu < 1 || o.decode_threads_per_stream < 0 || o.decode_pool_threads < 0 ||
      o.gpu_capacity_gflops < 0 || o.cpu_capacity_gflops_per_core < 0 || o.staging_frames_per_stream < 0) {
    return absl::InvalidArgumentError(
        "plan options: need worker_threads_per_gpu >= 1 and non-negative decode threads, capacities and staging frames");
  }
  return absl::OkStatus();
}

// Splits `cores` (indexes into `all`) between worker and decode threads of one GPU.
void SplitCores(const std::vector<UsableCore>& all, const std::vector<size_t>& cores, int workers, DevicePlan* d) {
  const size_t n = cores.size();
  const size_t nw = n >= 2 ? std::clamp<size_t>(static_cast<size_t>(workers), 1, n - 1) : n;
  const std::vector<size_t> w(cores.begin(), cores.begin() + static_cast<std::ptrdiff_t>(nw));
  d->worker_cpus = PusOf(all, w);
  d->decode_cpus = nw < n ? PusOf(all, std::vector<size_t>(cores.begin() + static_cast<std::ptrdiff_t>(nw), cores.end()))
                          : d->worker_cpus;
}

void PlaceGpus(const Topology& topo, const std::vector<UsableCore>& cores, const std::set<int>& cpu_nodes,
               const PlanOptions& o, Plan* plan) {
  // Home NUMA node per GPU, then the GPUs of each home.
  std::map<int, std::vector<int>> by_home;  // node (-1: none) → GPU indexes
  for (const Gpu& g : topo.gpus) {
    int home = -1;
    for (int n : g.pci.numa_nodes) {
      if (!cpu_nodes.count(n)) continue;
      if (home < 0 || by_home[n].size() < by_home[home].size()) home = n;
    }
    by_home[home].push_back(g.index);
  }
  std::erase_if(by_home, [](const auto& kv) { return kv.second.empty(); });
  plan->devices.resize(topo.gpus.size());
  std::vector<std::vector<size_t>> cores_of(topo.gpus.size());  // GPU → indexes into `cores`
  std::vector<int> users(cores.size(), 0);                       // core → GPUs using it
  for (const auto& [home, gpus] : by_home) {
    std::vector<size_t> local;
    for (size_t c = 0; c < cores.size(); ++c) {
      if (home < 0 || cores[c].numa_node == home) local.push_back(c);
    }
    const size_t g = gpus.size(), n = local.size();
    if (n < g) {
      plan->notes.push_back(StrCat(home >= 0 ? StrCat("NUMA node ", home) : std::string("GPUs without a usable NUMA node"),
                                   ": ", g, " GPUs share ", n, " allowed cores (PUs ", FormatCpuList(PusOf(cores, local)),
                                   "), up to ", (g + n - 1) / n, " GPUs per core"));
    }
    for (size_t k = 0; k < g; ++k) {
      DevicePlan& d = plan->devices[static_cast<size_t>(gpus[k])];
      d.gpu = gpus[k];
      d.numa_node = home;
      d.worker_threads = o.worker_threads_per_gpu;
      std::vector<size_t> mine;
      if (n >= g) {
        const size_t base = n / g, extra = n % g;
        const size_t begin = k * base + std::min(k, extra);
        mine.assign(local.begin() + static_cast<std::ptrdiff_t>(begin),
                    local.begin() + static_cast<std::ptrdiff_t>(begin + base + (k < extra ? 1 : 0)));
      } else {
        mine.push_back(local[k % n]);
      }
      for (size_t c : mine) ++users[c];
      cores_of[static_cast<size_t>(d.gpu)] = mine;
      SplitCores(cores, mine, o.worker_threads_per_gpu, &d);
      d.nic = NearestNic(topo, d.gpu);
      if (home < 0) {
        const std::vector<int>& nodes = topo.gpus[d.gpu].pci.numa_nodes;
        plan->notes.push_back(StrCat("GPU ", d.gpu, " (", topo.gpus[d.gpu].pci.bus_id, "): ",
                                     nodes.empty() ? std::string("its NUMA node is unknown")
                                                   : StrCat("no allowed CPU in its locality (NUMA nodes ", FormatCpuList(nodes), ")"),
                                     "; its threads use any allowed core and its buffers are not NUMA-bound"));
      }
    }
  }
  int sharing = 0;
  for (DevicePlan& d : plan->devices) {
    const auto& mine = cores_of[static_cast<size_t>(d.gpu)];
    d.shares_cores = std::any_of(mine.begin(), mine.end(), [&](size_t c) { return users[c] > 1; });
    sharing += d.shares_cores ? 1 : 0;
  }
  if (sharing > 0) {
    plan->notes.insert(plan->notes.begin(),
                       StrCat("cannot give each GPU its own cores: ", sharing, " of ", topo.gpus.size(), " GPUs share cores (",
                              cores.size(), " allowed cores, ", topo.allowed_cpus.size(), " PUs in all)"));
  }
}

void PlaceCpuGroups(const std::vector<UsableCore>& cores, const std::set<int>& cpu_nodes, Plan* plan) {
  std::vector<int> homes(cpu_nodes.begin(), cpu_nodes.end());
  if (std::any_of(cores.begin(), cores.end(), [](const UsableCore& c) { return c.numa_node < 0; })) homes.push_back(-1);
  for (int home : homes) {
    std::vector<size_t> mine;
    for (size_t c = 0; c < cores.size(); ++c) {
      if (cores[c].numa_node == home) mine.push_back(c);
    }
    DevicePlan d;
    d.numa_node = home;
    d.worker_threads = static_cast<int>(mine.size());
    d.worker_cpus = d.decode_cpus = PusOf(cores, mine);
    if (home < 0) {
      plan->notes.push_back(StrCat("PUs ", FormatCpuList(d.worker_cpus),
                                   " are in no usable NUMA node: they form one more CPU worker group, its buffers not NUMA-bound"));
    }
    plan->devices.push_back(std::move(d));
  }
}

}  // namespace

StatusOr<Plan> MakePlan(const Topology& topo, const std::vector<StreamSpec>& streams, const PlanOptions& o) {
  VIGIL_RETURN_IF_ERROR(Validate(streams, o));
  // Usable cores: those with allowed PUs; their node counts only when it is allowed and has CPUs.
  std::vector<UsableCore> cores;
  std::set<int> cpu_nodes;
  for (const Core& c : topo.cores) {
    CpuList pus = Intersect(c.cpus, topo.allowed_cpus);
    if (pus.empty()) continue;
    const NumaNode* node = topo.FindNumaNode(c.numa_node);
    const int n = node && node->allowed ? c.numa_node : -1;
    if (n >= 0) cpu_nodes.insert(n);
    cores.push_back({std::move(pus), n});
  }
  if (cores.empty()) return absl::FailedPreconditionError(StrCat(topo.source, ": no allowed PU to place threads on"));

  Plan plan;
  if (!topo.gpus.empty()) PlaceGpus(topo, cores, cpu_nodes, o, &plan);
  else PlaceCpuGroups(cores, cpu_nodes, &plan);

  // Capacity per device and the weight that makes loads comparable (cores for CPU groups).
  std::vector<double> weight(plan.devices.size(), 1.0);
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    DevicePlan& d = plan.devices[i];
    if (d.gpu < 0) weight[i] = d.worker_threads;
    d.capacity_gflops = d.gpu >= 0 ? o.gpu_capacity_gflops : o.cpu_capacity_gflops_per_core * d.worker_threads;
  }

  // Largest first onto the least loaded device (LPT).
  std::vector<size_t> order(streams.size());
  std::iota(order.begin(), order.end(), 0);
  auto load = [&](size_t s) { return streams[s].fps * streams[s].gflop_per_frame; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return load(a) > load(b); });
  plan.stream_device.assign(streams.size(), -1);
  for (size_t s : order) {
    size_t best = 0;
    for (size_t i = 1; i < plan.devices.size(); ++i) {
      const double li = (plan.devices[i].load_gflops + load(s)) / weight[i];
      const double lb = (plan.devices[best].load_gflops + load(s)) / weight[best];
      const double eps = 1e-9 * std::max(1.0, lb);
      if (li < lb - eps || (li <= lb + eps && plan.devices[i].streams.size() < plan.devices[best].streams.size())) best = i;
    }
    DevicePlan& d = plan.devices[best];
    d.streams.push_back(streams[s].id);
    d.load_gflops += load(s);
    d.staging_bytes += static_cast<uint64_t>(streams[s].width) * static_cast<uint64_t>(streams[s].height) * 3u *
                       static_cast<uint64_t>(o.staging_frames_per_stream);
    plan.stream_device[s] = static_cast<int>(best);
  }

  for (DevicePlan& d : plan.devices) {
    d.decode_threads = o.decode_pool_threads > 0 ? o.decode_pool_threads
                                                 : static_cast<int>(d.streams.size()) * o.decode_threads_per_stream;
    if (d.capacity_gflops > 0 && d.load_gflops > d.capacity_gflops) {
      plan.fits = false;
      plan.notes.push_back(StrCat(DeviceName(topo, d), ": load ", Fixed1(d.load_gflops), " GFLOP/s exceeds its capacity ",
                                  Fixed1(d.capacity_gflops), " GFLOP/s (", Fixed1(100.0 * d.load_gflops / d.capacity_gflops), "%)"));
    }
  }
  if (!plan.fits) {
    double total = 0, capacity = 0;
    for (const DevicePlan& d : plan.devices) {
      total += d.load_gflops;
      capacity += d.capacity_gflops;
    }
    for (size_t s = 0; s < streams.size(); ++s) {
      const DevicePlan& d = plan.devices[static_cast<size_t>(plan.stream_device[s])];
      if (load(s) > d.capacity_gflops) {
        plan.notes.push_back(StrCat("stream '", streams[s].id, "' alone needs ", Fixed1(load(s)), " GFLOP/s, more than ",
                                    DeviceName(topo, d), " sustains"));
      }
    }
    plan.notes.push_back(total > capacity
                             ? StrCat("total load ", Fixed1(total), " GFLOP/s exceeds the machine's capacity ", Fixed1(capacity),
                                      " GFLOP/s: lower fps, use a smaller model or add devices")
                             : StrCat("total load ", Fixed1(total), " GFLOP/s is within the machine's capacity ", Fixed1(capacity),
                                      " GFLOP/s, but the streams do not split evenly enough: lower fps on the largest streams"));
  }
  return plan;
}

}  // namespace vigil::topology
