#include "vigil/topology/hwloc_handle.h"

#include <hwloc.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace vigil::topology::internal {

void HwlocTopologyDeleter::operator()(hwloc_topology* t) const noexcept { hwloc_topology_destroy(t); }
void HwlocBitmapDeleter::operator()(hwloc_bitmap_s* b) const noexcept { hwloc_bitmap_free(b); }

HwlocBitmapPtr NewBitmap() {
  HwlocBitmapPtr b(hwloc_bitmap_alloc());
  if (!b) {
    std::fprintf(stderr, "%s:%d: hwloc_bitmap_alloc: out of memory\n", __FILE__, __LINE__);
    std::abort();
  }
  return b;
}

CpuList BitmapToList(const hwloc_bitmap_s* bitmap) {
  CpuList out;
  if (bitmap == nullptr) return out;
  // An infinite bitmap (all bits set from some index on) is cut at its last unset bit.
  const bool infinite = hwloc_bitmap_weight(bitmap) < 0;
  const int end = infinite ? hwloc_bitmap_last_unset(bitmap) + 1 : 0;
  for (int i = hwloc_bitmap_first(bitmap); i >= 0 && (!infinite || i < end);
       i = hwloc_bitmap_next(bitmap, i)) {
    out.push_back(i);
  }
  return out;
}

HwlocBitmapPtr ListToBitmap(const std::vector<int>& indexes) {
  HwlocBitmapPtr b = NewBitmap();
  for (int i : indexes) hwloc_bitmap_set(b.get(), static_cast<unsigned>(i));
  return b;
}

StatusOr<HwlocTopologyPtr> LoadHwlocTopology(const std::string& xml_path) {
  const std::string what = xml_path.empty() ? std::string("this system's topology")
                                            : StrCat("topology file ", xml_path);
  if (!xml_path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(xml_path, ec)) {
      return absl::NotFoundError(StrCat(what, ": no such file"));
    }
  }
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return absl::InternalError(StrCat(what, ": hwloc_topology_init failed: ", std::strerror(errno)));
  }
  HwlocTopologyPtr topo(raw);
  hwloc_topology_set_flags(raw, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (!xml_path.empty() && hwloc_topology_set_xml(raw, xml_path.c_str()) != 0) {
    return absl::InvalidArgumentError(
        StrCat(what, ": not a readable hwloc XML topology (", std::strerror(errno),
               "; set HWLOC_XML_VERBOSE=1 for the parser's message)"));
  }
  if (hwloc_topology_load(raw) != 0) {
    return absl::InvalidArgumentError(
        StrCat(what, ": hwloc rejected the topology (e.g. it has no NUMA node or an invalid root"
                     " object; set HWLOC_XML_VERBOSE=1 for details)"));
  }
  return topo;
}

}  // namespace vigil::topology::internal
