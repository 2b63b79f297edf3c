// Pure functions over the topology model (no hwloc): cpulists, nvidia-smi-style relations, NIC choice,
// PCI bus ids, CUDA ordinals.
#include "vigil/topology/topology.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <map>

namespace vigil::topology {

std::string FormatCpuList(const CpuList& cpus, char sep) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += sep;
    out += std::to_string(cpus[i]);
    if (j > i) out += StrCat("-", cpus[j]);
    i = j + 1;
  }
  return out;
}

CpuList Intersect(const CpuList& a, const CpuList& b) {
  CpuList out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

const NumaNode* Topology::FindNumaNode(int os_index) const {
  for (const NumaNode& n : numa_nodes) {
    if (n.os_index == os_index) return &n;
  }
  return nullptr;
}

std::string RelationCode(const Relation& r) {
  switch (r.link) {
    case Link::kSelf: return "X";
    case Link::kNVLink: return StrCat("NV", r.nvlinks);
    case Link::kPIX: return "PIX";
    case Link::kPXB: return "PXB";
    case Link::kPHB: return "PHB";
    case Link::kNODE: return "NODE";
    case Link::kSYS: return "SYS";
  }
  return "?";
}

Relation PciRelation(const PciLocation& a, const PciLocation& b) {
  size_t common = 0;
  while (common < a.bridges.size() && common < b.bridges.size() &&
         a.bridges[common] == b.bridges[common]) {
    ++common;
  }
  if (common == 0) {
    return {Intersect(a.numa_nodes, b.numa_nodes).empty() ? Link::kSYS : Link::kNODE};
  }
  if (common == 1 && a.under_host_bridge) return {Link::kPHB};
  const bool one_switch = a.bridges.size() - common <= 1 && b.bridges.size() - common <= 1;
  return {one_switch ? Link::kPIX : Link::kPXB};
}

Relation GpuRelation(const Topology& topo, int a, int b) {
  if (a == b) return {Link::kSelf};
  if (!topo.nvlinks.empty() && topo.nvlinks[a][b] > 0) return {Link::kNVLink, topo.nvlinks[a][b]};
  return PciRelation(topo.gpus[a].pci, topo.gpus[b].pci);
}

Relation GpuNicRelation(const Topology& topo, int gpu, int nic) {
  return PciRelation(topo.gpus[gpu].pci, topo.nics[nic].pci);
}

int NearestNic(const Topology& topo, int gpu) {
  int best = -1;
  for (int n = 0; n < static_cast<int>(topo.nics.size()); ++n) {
    if (best < 0) {
      best = n;
      continue;
    }
    const Link ln = GpuNicRelation(topo, gpu, n).link;
    const Link lb = GpuNicRelation(topo, gpu, best).link;
    if (ln < lb || (ln == lb && topo.nics[n].rdma && !topo.nics[best].rdma)) best = n;
  }
  return best;
}

StatusOr<std::string> NormalizePciBusId(std::string_view bus_id) {
  // [domain:]bus:device.function, hex; NVML pads the domain to 8 digits, hwloc and CUDA to 4.
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  const std::string s(bus_id);
  const bool ok = std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) == 4 ||
                  (domain = 0, std::sscanf(s.c_str(), "%x:%x.%x%c", &bus, &dev, &fn, &tail) == 3);
  if (!ok || domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7 ||
      std::any_of(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); })) {
    return absl::InvalidArgumentError(StrCat("PCI bus id '", s, "': expected [domain:]bus:device.function in hex"));
  }
  char out[16];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return std::string(out);
}

Status AssignCudaOrdinals(Topology* topo, const std::vector<std::pair<int, std::string>>& ordinals) {
  std::map<std::string, int> by_bus;
  for (const auto& [ordinal, bus] : ordinals) {
    VIGIL_ASSIGN_OR_RETURN(std::string id, NormalizePciBusId(bus));
    const bool known = std::any_of(topo->gpus.begin(), topo->gpus.end(),
                                   [&](const Gpu& g) { return g.pci.bus_id == id; });
    if (!known) {
      return absl::NotFoundError(StrCat("CUDA device ", ordinal, " at PCI ", id, ": no such GPU in ", topo->source));
    }
    by_bus[id] = ordinal;
  }
  for (Gpu& g : topo->gpus) {
    auto it = by_bus.find(g.pci.bus_id);
    g.cuda_ordinal = it == by_bus.end() ? -1 : it->second;
  }
  return absl::OkStatus();
}

}  // namespace vigil::topology
