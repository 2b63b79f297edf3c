// Discover(): hwloc topology → Topology (vigil/topology/topology.h).
#include <hwloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <iterator>
#include <string_view>

#include "vigil/topology/hwloc_handle.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {
namespace {

using internal::BitmapToList;

constexpr uint16_t kNvidiaVendor = 0x10de;
constexpr uint16_t kClassVga = 0x0300, kClass3d = 0x0302, kClassBridgeOther = 0x0680;

std::string BusId(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& p) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", static_cast<unsigned>(p.domain), p.bus, p.dev, p.func);
  return buf;
}

std::string Info(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v ? v : "";
}

// "cuda3" → 3 for prefix "cuda"; -1 otherwise.
int IndexAfter(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return -1;
  int v = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

PciLocation Locate(hwloc_topology_t topo, hwloc_obj_t pci) {
  PciLocation loc;
  loc.bus_id = BusId(pci->attr->pcidev);
  for (hwloc_obj_t p = pci->parent; p && p->type == HWLOC_OBJ_BRIDGE; p = p->parent) {
    loc.bridges.insert(loc.bridges.begin(), p->gp_index);
    loc.under_host_bridge = p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
  }
  hwloc_obj_t locality = hwloc_get_non_io_ancestor_obj(topo, pci);
  if (locality) {
    loc.numa_nodes = BitmapToList(locality->nodeset);
    loc.cpus = BitmapToList(locality->cpuset);
  }
  return loc;
}

bool IsNvSwitch(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  return (pci->subtype && std::strcmp(pci->subtype, "NVSwitch") == 0) ||
         (a.vendor_id == kNvidiaVendor && a.class_id == kClassBridgeOther);
}

void ReadCpus(hwloc_topology_t topo, Topology* t) {
  t->cpus = BitmapToList(hwloc_topology_get_topology_cpuset(topo));
  t->allowed_cpus = BitmapToList(hwloc_topology_get_allowed_cpuset(topo));
  internal::HwlocBitmapPtr missing = internal::NewBitmap();
  hwloc_bitmap_andnot(missing.get(), hwloc_topology_get_complete_cpuset(topo), hwloc_topology_get_topology_cpuset(topo));
  t->missing_cpus = BitmapToList(missing.get());

  const hwloc_const_nodeset_t allowed_nodes = hwloc_topology_get_allowed_nodeset(topo);
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n));) {
    t->numa_nodes.push_back({static_cast<int>(n->os_index), n->attr->numanode.local_memory,
                             BitmapToList(n->cpuset), hwloc_bitmap_isset(allowed_nodes, n->os_index) != 0,
                             n->subtype ? n->subtype : ""});
  }
  std::sort(t->numa_nodes.begin(), t->numa_nodes.end(), [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
  for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PACKAGE, p));) {
    t->packages.push_back({static_cast<int>(p->os_index), BitmapToList(p->cpuset), BitmapToList(p->nodeset)});
  }
  // Cores from PUs, so that a topology without Core objects still gives one "core" per PU.
  std::map<hwloc_obj_t, size_t> core_of;
  for (hwloc_obj_t pu = nullptr; (pu = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PU, pu));) {
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
    hwloc_obj_t key = core ? core : pu;
    auto [it, added] = core_of.emplace(key, t->cores.size());
    if (added) {
      hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, pu);
      const CpuList nodes = BitmapToList(pu->nodeset);
      t->cores.push_back({static_cast<int>(key->os_index), pkg ? static_cast<int>(pkg->os_index) : -1,
                          nodes.empty() ? -1 : nodes.front(), {}});
    }
    t->cores[it->second].cpus.push_back(static_cast<int>(pu->os_index));
  }
  for (Core& c : t->cores) std::sort(c.cpus.begin(), c.cpus.end());
}

const char* NicKind(uint16_t class_id) {
  if (class_id == 0x0200) return "Ethernet";
  if (class_id == 0x0207 || class_id == 0x0c06) return "InfiniBand";  // network / serial-bus InfiniBand
  return "network";
}

// GPUs (sorted by bus id) and NICs (hwloc's PCI order), with their OS devices.
void ReadPci(hwloc_topology_t topo, Topology* t, std::map<hwloc_obj_t, int>* gpu_of) {
  std::vector<std::pair<hwloc_obj_t, Gpu>> gpus;
  for (hwloc_obj_t pci = nullptr; (pci = hwloc_get_next_pcidev(topo, pci));) {
    const auto& a = pci->attr->pcidev;
    if (IsNvSwitch(pci)) {
      ++t->nvswitches;
    } else if (a.vendor_id == kNvidiaVendor && (a.class_id == kClass3d || a.class_id == kClassVga)) {
      Gpu g;
      g.pci = Locate(topo, pci);
      g.device_id = a.device_id;
      g.model = Info(pci, "PCIDevice");
      for (hwloc_obj_t os = pci->io_first_child; os; os = os->next_sibling) {
        if (os->type != HWLOC_OBJ_OS_DEVICE || !os->name) continue;
        g.os_devices.push_back(os->name);
        if (int i = IndexAfter(os->name, "cuda"); i >= 0) g.cuda_ordinal = i;
        if (int i = IndexAfter(os->name, "nvml"); i >= 0) g.nvml_index = i;
        if (std::string m = Info(os, "GPUModel"); !m.empty()) g.model = m;
      }
      gpus.emplace_back(pci, std::move(g));
    } else {
      Nic nic{"", {}, false, NicKind(a.class_id), {}};
      for (hwloc_obj_t os = pci->io_first_child; os; os = os->next_sibling) {
        if (os->type != HWLOC_OBJ_OS_DEVICE || !os->name) continue;
        const bool ofed = os->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS;
        if (!ofed && os->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK) continue;
        if (nic.os_devices.empty() || (ofed && !nic.rdma)) nic.name = os->name;
        nic.rdma = nic.rdma || ofed;
        nic.os_devices.push_back(os->name);
      }
      if (nic.os_devices.empty() && (a.class_id >> 8) != 0x02) continue;  // not a network device
      nic.pci = Locate(topo, pci);
      if (nic.name.empty()) nic.name = nic.pci.bus_id;
      t->nics.push_back(std::move(nic));
    }
  }
  std::sort(gpus.begin(), gpus.end(), [](const auto& x, const auto& y) { return x.second.pci.bus_id < y.second.pci.bus_id; });
  for (auto& [obj, g] : gpus) {
    g.index = static_cast<int>(t->gpus.size());
    (*gpu_of)[obj] = g.index;
    t->gpus.push_back(std::move(g));
  }
}

// NVLink counts from hwloc's "NVLinkBandwidth" matrix (filled by its NVML backend: GPUs as NVML OS
// devices, NVSwitches and POWER CPUs as PCI devices). One link is the smallest non-zero bandwidth
// in the matrix. GPUs attached to NVSwitches reach each other through the switch fabric (DGX-2,
// HGX: all switches form one fabric), with as many links as the less connected of the two has.
void ReadNvlinks(hwloc_topology_t topo, Topology* t, const std::map<hwloc_obj_t, int>& gpu_of) {
  unsigned nr = 1;
  hwloc_distances_s* d = nullptr;
  if (hwloc_distances_get_by_name(topo, "NVLinkBandwidth", &nr, &d, 0) != 0 || nr == 0 || !d) return;
  const unsigned n = d->nbobjs;
  hwloc_uint64_t unit = 0;
  for (unsigned i = 0; i < n * n; ++i) {
    if (d->values[i] > 0 && (unit == 0 || d->values[i] < unit)) unit = d->values[i];
  }
  auto gpu_index = [&](hwloc_obj_t o) {
    hwloc_obj_t pci = o->type == HWLOC_OBJ_OS_DEVICE ? o->parent : o;
    auto it = gpu_of.find(pci);
    return it == gpu_of.end() ? -1 : it->second;
  };
  auto links = [&](unsigned i, unsigned j) { return static_cast<int>(std::lround(double(d->values[i * n + j]) / double(unit))); };
  const size_t g = t->gpus.size();
  std::vector<std::vector<int>> nv(g, std::vector<int>(g, 0));
  std::vector<int> to_switch(g, 0);
  for (unsigned i = 0; unit > 0 && i < n; ++i) {
    const int gi = gpu_index(d->objs[i]);
    if (gi < 0) continue;
    for (unsigned j = 0; j < n; ++j) {
      const int gj = gpu_index(d->objs[j]);
      if (gj >= 0 && gj != gi) nv[gi][gj] += links(i, j);
      if (gj < 0 && d->objs[j]->type == HWLOC_OBJ_PCI_DEVICE && IsNvSwitch(d->objs[j])) to_switch[gi] += links(i, j);
    }
  }
  hwloc_distances_release(topo, d);
  bool any = false;
  for (size_t a = 0; a < g; ++a) {
    for (size_t b = 0; b < g; ++b) {
      if (a != b && to_switch[a] > 0 && to_switch[b] > 0) nv[a][b] += std::min(to_switch[a], to_switch[b]);
      any = any || nv[a][b] > 0;
    }
  }
  if (any) t->nvlinks = std::move(nv);
}

void AddNotes(Topology* t) {
  auto& notes = t->notes;
  if (!t->is_this_system) notes.push_back(StrCat("recorded topology (", t->source, "): binding calls on it do nothing"));
  if (!t->missing_cpus.empty()) {
    notes.push_back(StrCat("PUs ", FormatCpuList(t->missing_cpus), " exist but are not in the topology (offline or hidden)"));
  }
  CpuList disallowed;
  std::set_difference(t->cpus.begin(), t->cpus.end(), t->allowed_cpus.begin(), t->allowed_cpus.end(), std::back_inserter(disallowed));
  if (!disallowed.empty()) {
    notes.push_back(StrCat("PUs ", FormatCpuList(disallowed), " are present but not allowed (cgroup cpuset or affinity)"));
  }
  CpuList orphan;
  for (const Core& c : t->cores) {
    if (c.numa_node < 0) orphan.insert(orphan.end(), c.cpus.begin(), c.cpus.end());
  }
  std::sort(orphan.begin(), orphan.end());
  if (!orphan.empty()) notes.push_back(StrCat("PUs ", FormatCpuList(orphan), " belong to no NUMA node in the topology"));
  for (const NumaNode& n : t->numa_nodes) {
    if (n.cpus.empty()) notes.push_back(StrCat("NUMA node ", n.os_index, " has memory but no CPUs (memory-only)"));
    if (!n.allowed) notes.push_back(StrCat("NUMA node ", n.os_index, " is not allowed (cgroup cpuset.mems)"));
  }
  for (const Gpu& g : t->gpus) {
    if (g.pci.numa_nodes.empty()) notes.push_back(StrCat("GPU ", g.index, " (", g.pci.bus_id, "): NUMA node unknown"));
  }
  if (t->gpus.size() >= 2 && t->nvlinks.empty()) {
    notes.push_back(StrCat(t->nvswitches > 0 ? StrCat(t->nvswitches, " NVSwitches present, but ") : std::string(),
                           "the topology carries no NVLink data (hwloc without its NVML plugin): GPU pairs show their"
                           " PCIe relation, where nvidia-smi may show NV#"));
  }
}

}  // namespace

StatusOr<Topology> Discover(const DiscoverOptions& options) {
  std::string path = options.xml_path;
  if (path.empty()) {
    if (const char* env = std::getenv("VIGIL_TOPOLOGY_XML"); env && *env) path = env;
  }
  VIGIL_ASSIGN_OR_RETURN(internal::HwlocTopologyPtr owner, internal::LoadHwlocTopology(path));
  hwloc_topology_t topo = owner.get();
  Topology t;
  t.source = path.empty() ? "this system" : path;
  t.is_this_system = hwloc_topology_is_thissystem(topo) != 0;
  ReadCpus(topo, &t);
  std::map<hwloc_obj_t, int> gpu_of;
  ReadPci(topo, &t, &gpu_of);
  ReadNvlinks(topo, &t, gpu_of);
  AddNotes(&t);
  return t;
}

}  // namespace vigil::topology
