// Text, JSON and Kubernetes-label reports (vigil/topology/report.h).
#include "vigil/topology/report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace vigil::topology {
namespace {

std::string Bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", double(b) / double(1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1ull << 20));
  return buf;
}

std::string Gflops(double v) {
  if (v <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string Join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : std::string(sep)) + p;
  return out;
}

// Left-aligned columns, two spaces apart.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

CpuList GpuAffinity(const Topology& topo, const Gpu& g) { return Intersect(g.pci.cpus, topo.allowed_cpus); }

std::string NodesText(const std::vector<int>& nodes, char sep) {
  return nodes.empty() ? std::string("unknown") : FormatCpuList(nodes, sep);
}

std::string NicText(const Topology& topo, int gpu) {
  const int n = NearestNic(topo, gpu);
  return n < 0 ? std::string("-") : StrCat(topo.nics[n].name, " (", RelationCode(GpuNicRelation(topo, gpu, n)), ")");
}

std::string DeviceLabel(const DevicePlan& d) {
  if (d.gpu >= 0) return StrCat("gpu", d.gpu);
  return d.numa_node >= 0 ? StrCat("cpu-numa", d.numa_node) : std::string("cpu-nonuma");
}

// Label value from free text: invalid characters become '_', then trimmed to valid ends and 63 chars.
std::string LabelValue(std::string v) {
  for (char& c : v) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  if (v.size() > 63) v.resize(63);
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  while (!v.empty() && !alnum(v.back())) v.pop_back();
  v.erase(v.begin(), std::find_if(v.begin(), v.end(), alnum));
  return v;
}

nlohmann::json OrNull(int v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); }

nlohmann::json TopologyJson(const Topology& t) {
  using nlohmann::json;
  json j;
  j["source"] = t.source;
  j["is_this_system"] = t.is_this_system;
  j["cpus"] = t.cpus;
  j["allowed_cpus"] = t.allowed_cpus;
  j["missing_cpus"] = t.missing_cpus;
  j["cores"] = t.cores.size();
  j["packages"] = json::array();
  for (const Package& p : t.packages) j["packages"].push_back({{"os_index", p.os_index}, {"cpus", p.cpus}, {"numa_nodes", p.numa_nodes}});
  j["numa_nodes"] = json::array();
  for (const NumaNode& n : t.numa_nodes) {
    j["numa_nodes"].push_back({{"os_index", n.os_index}, {"memory_bytes", n.memory_bytes}, {"cpus", n.cpus},
                               {"allowed", n.allowed}, {"kind", n.kind}});
  }
  j["gpus"] = json::array();
  for (const Gpu& g : t.gpus) {
    char dev[8];
    std::snprintf(dev, sizeof dev, "0x%04x", g.device_id);
    const int nic = NearestNic(t, g.index);
    json links = json::array(), nics = json::array();
    for (const Gpu& o : t.gpus) links.push_back(RelationCode(GpuRelation(t, g.index, o.index)));
    for (size_t n = 0; n < t.nics.size(); ++n) nics.push_back(RelationCode(GpuNicRelation(t, g.index, static_cast<int>(n))));
    j["gpus"].push_back({{"index", g.index}, {"bus_id", g.pci.bus_id}, {"device_id", dev}, {"model", g.model},
                         {"cuda_ordinal", OrNull(g.cuda_ordinal)}, {"nvml_index", OrNull(g.nvml_index)},
                         {"os_devices", g.os_devices}, {"numa_nodes", g.pci.numa_nodes},
                         {"cpu_affinity", GpuAffinity(t, g)}, {"nearest_nic", OrNull(nic)},
                         {"gpu_links", links}, {"nic_links", nics}});
  }
  j["nics"] = json::array();
  for (size_t n = 0; n < t.nics.size(); ++n) {
    const Nic& c = t.nics[n];
    j["nics"].push_back({{"index", n}, {"name", c.name}, {"kind", c.kind}, {"rdma", c.rdma}, {"bus_id", c.pci.bus_id},
                         {"os_devices", c.os_devices}, {"numa_nodes", c.pci.numa_nodes}});
  }
  j["nvswitches"] = t.nvswitches;
  j["nvlink_known"] = !t.nvlinks.empty();
  j["notes"] = t.notes;
  return j;
}

nlohmann::json PlanJson(const Topology& t, const Plan& plan) {
  using nlohmann::json;
  json j;
  j["fits"] = plan.fits;
  j["notes"] = plan.notes;
  j["devices"] = json::array();
  for (const DevicePlan& d : plan.devices) {
    j["devices"].push_back({{"device", DeviceLabel(d)}, {"gpu", OrNull(d.gpu)}, {"numa_node", OrNull(d.numa_node)},
                            {"streams", d.streams}, {"load_gflops", d.load_gflops}, {"capacity_gflops", d.capacity_gflops},
                            {"worker_threads", d.worker_threads}, {"decode_threads", d.decode_threads},
                            {"worker_cpus", d.worker_cpus}, {"decode_cpus", d.decode_cpus},
                            {"shares_cores", d.shares_cores}, {"staging_bytes", d.staging_bytes},
                            {"nic", d.nic < 0 ? json(nullptr) : json(t.nics[d.nic].name)}});
  }
  return j;
}

}  // namespace

std::string FormatTopologyText(const Topology& t) {
  std::ostringstream out;
  out << "topology: " << t.source << (t.is_this_system ? "" : " (recorded export)") << "\n";
  out << "packages " << t.packages.size() << ", NUMA nodes " << t.numa_nodes.size() << ", cores " << t.cores.size()
      << ", PUs " << t.cpus.size() << " (allowed " << FormatCpuList(t.allowed_cpus) << ")\n";
  for (const NumaNode& n : t.numa_nodes) {
    out << "  NUMA node " << n.os_index << ": " << Bytes(n.memory_bytes) << ", "
        << (n.cpus.empty() ? std::string("no CPUs (memory only)") : "PUs " + FormatCpuList(n.cpus))
        << (n.kind.empty() ? "" : ", " + n.kind) << (n.allowed ? "" : ", not allowed") << "\n";
  }
  if (t.nvswitches > 0) out << "NVSwitches: " << t.nvswitches << "\n";
  out << "\n";
  if (t.gpus.empty()) {
    out << "no NVIDIA GPUs\n";
  } else {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> head{""};
    for (const Gpu& g : t.gpus) head.push_back(StrCat("GPU", g.index));
    for (size_t n = 0; n < t.nics.size(); ++n) head.push_back(StrCat("NIC", n));
    head.insert(head.end(), {"CPU Affinity", "NUMA", "Nearest NIC"});
    rows.push_back(head);
    for (const Gpu& g : t.gpus) {
      std::vector<std::string> r{StrCat("GPU", g.index)};
      for (const Gpu& o : t.gpus) r.push_back(RelationCode(GpuRelation(t, g.index, o.index)));
      for (size_t n = 0; n < t.nics.size(); ++n) r.push_back(RelationCode(GpuNicRelation(t, g.index, static_cast<int>(n))));
      const CpuList aff = GpuAffinity(t, g);
      r.insert(r.end(), {aff.empty() ? std::string("-") : FormatCpuList(aff), NodesText(g.pci.numa_nodes, ','), NicText(t, g.index)});
      rows.push_back(r);
    }
    out << Table(rows) << "\n";
    rows.clear();
    for (const Gpu& g : t.gpus) {
      rows.push_back({StrCat("GPU", g.index), g.pci.bus_id, g.model.empty() ? "NVIDIA GPU" : g.model,
                      g.cuda_ordinal < 0 ? std::string("CUDA ordinal ?") : StrCat("CUDA ", g.cuda_ordinal),
                      g.os_devices.empty() ? std::string("-") : Join(g.os_devices, ",")});
    }
    out << Table(rows);
  }
  std::vector<std::vector<std::string>> rows;
  for (size_t n = 0; n < t.nics.size(); ++n) {
    const Nic& c = t.nics[n];
    rows.push_back({StrCat("NIC", n), c.name, c.pci.bus_id, c.kind + (c.rdma ? " (RDMA)" : ""),
                    "NUMA " + NodesText(c.pci.numa_nodes, ','), c.os_devices.empty() ? std::string("-") : Join(c.os_devices, ",")});
  }
  out << (rows.empty() ? "no NICs\n" : Table(rows));
  if (!t.gpus.empty()) {
    out << "\nLegend:\n"
           "  X    = self\n"
           "  NV#  = a bonded set of # NVLinks (directly or through NVSwitches)\n"
           "  PIX  = at most one PCIe bridge (same PCIe switch)\n"
           "  PXB  = several PCIe bridges, without a PCIe host bridge\n"
           "  PHB  = through a PCIe host bridge (the CPU's root complex)\n"
           "  NODE = across PCIe host bridges within one NUMA node\n"
           "  SYS  = across NUMA nodes (the socket interconnect)\n";
  }
  if (!t.notes.empty()) {
    out << "\nnotes:\n";
    for (const std::string& n : t.notes) out << "  - " << n << "\n";
  }
  return out.str();
}

std::string FormatPlanText(const Topology& t, const Plan& plan) {
  std::ostringstream out;
  size_t streams = 0;
  for (const DevicePlan& d : plan.devices) streams += d.streams.size();
  out << "plan: " << streams << " streams on " << plan.devices.size()
      << (t.gpus.empty() ? " CPU worker group" : " GPU") << (plan.devices.size() == 1 ? "" : "s")
      << (plan.fits ? "" : " (load exceeds capacity)") << "\n";
  std::vector<std::vector<std::string>> rows{
      {"device", "streams", "GFLOP/s", "capacity", "NUMA", "worker PUs", "decode PUs", "threads w/d", "staging", "NIC"}};
  for (const DevicePlan& d : plan.devices) {
    rows.push_back({DeviceLabel(d), std::to_string(d.streams.size()), Gflops(d.load_gflops), Gflops(d.capacity_gflops),
                    d.numa_node < 0 ? std::string("-") : std::to_string(d.numa_node),
                    FormatCpuList(d.worker_cpus) + (d.shares_cores ? " (shared)" : ""), FormatCpuList(d.decode_cpus),
                    StrCat(d.worker_threads, "/", d.decode_threads), Bytes(d.staging_bytes),
                    d.nic < 0 ? std::string("-") : StrCat(t.nics[d.nic].name, " (", RelationCode(GpuNicRelation(t, d.gpu, d.nic)), ")")});
  }
  out << Table(rows);
  out << "streams:\n";
  for (const DevicePlan& d : plan.devices) {
    if (!d.streams.empty()) out << "  " << DeviceLabel(d) << ": " << Join(d.streams, " ") << "\n";
  }
  if (!plan.notes.empty()) {
    out << "notes:\n";
    for (const std::string& n : plan.notes) out << "  - " << n << "\n";
  }
  return out.str();
}

std::string ToJson(const Topology& topo, const Plan* plan) {
  nlohmann::json j;
  j["topology"] = TopologyJson(topo);
  if (plan) j["plan"] = PlanJson(topo, *plan);
  return j.dump(2);
}

std::vector<std::string> KubernetesLabels(const Topology& t) {
  std::vector<std::string> labels;
  auto add = [&](const std::string& name, const std::string& value) { labels.push_back("vigil.io/" + name + "=" + value); };
  add("gpu-count", std::to_string(t.gpus.size()));
  add("numa-count", std::to_string(t.numa_nodes.size()));
  add("nic-count", std::to_string(t.nics.size()));
  if (t.nvswitches > 0) add("nvswitch-count", std::to_string(t.nvswitches));
  std::map<int, CpuList> gpus_of_node;  // NUMA node → GPU indexes
  for (const Gpu& g : t.gpus) {
    for (int n : g.pci.numa_nodes) gpus_of_node[n].push_back(g.index);
  }
  for (const auto& [node, gpus] : gpus_of_node) {
    std::string v;
    for (int g : gpus) v += (v.empty() ? "" : "_") + std::to_string(g);
    add(StrCat("numa-", node, "-gpus"), v.size() <= 63 ? v : LabelValue(FormatCpuList(gpus, '_')));
  }
  for (const Gpu& g : t.gpus) {
    add(StrCat("gpu-", g.index, "-numa"), NodesText(g.pci.numa_nodes, '_'));
    if (int n = NearestNic(t, g.index); n >= 0) add(StrCat("gpu-", g.index, "-nic"), LabelValue(t.nics[n].name));
  }
  return labels;
}

bool IsValidLabelValue(std::string_view v) {
  if (v.empty()) return true;
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  return v.size() <= 63 && alnum(v.front()) && alnum(v.back()) &&
         std::all_of(v.begin(), v.end(), [&](char c) { return alnum(c) || c == '-' || c == '_' || c == '.'; });
}

bool IsValidLabelKey(std::string_view key) {
  const size_t slash = key.find('/');
  std::string_view name = key;
  if (slash != std::string_view::npos) {
    const std::string_view prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    // DNS subdomain (RFC 1123): dot-separated labels of [a-z0-9-], each starting and ending alphanumeric.
    if (prefix.empty() || prefix.size() > 253) return false;
    size_t start = 0;
    while (start <= prefix.size()) {
      const size_t dot = std::min(prefix.find('.', start), prefix.size());
      const std::string_view part = prefix.substr(start, dot - start);
      auto ok = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
      if (part.empty() || part.size() > 63 || !ok(part.front()) || !ok(part.back()) ||
          !std::all_of(part.begin(), part.end(), [&](char c) { return ok(c) || c == '-'; })) {
        return false;
      }
      start = dot + 1;
    }
  }
  return !name.empty() && IsValidLabelValue(name);
}

}  // namespace vigil::topology
