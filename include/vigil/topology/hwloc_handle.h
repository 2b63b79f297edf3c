// vigil/topology/hwloc_handle.h — owners for hwloc's C handles, for the topology module's own
// sources (discovery, binder). Only the topology module calls hwloc (docs/architecture.md); this
// header names hwloc's types by forward declaration so that including it pulls in no hwloc header.
//
// Thread-safety: a loaded topology may be read and used for binding from many threads at once
// (hwloc: functions that do not modify the topology are thread-safe); a bitmap is not shared.
#pragma once

#include <memory>
#include <string>

#include "vigil/common/status.h"
#include "vigil/topology/topology.h"

struct hwloc_topology;  // hwloc_topology_t
struct hwloc_bitmap_s;  // hwloc_bitmap_t (cpuset, nodeset)

namespace vigil::topology::internal {

struct HwlocTopologyDeleter {
  void operator()(hwloc_topology* t) const noexcept;  // hwloc_topology_destroy
};
using HwlocTopologyPtr = std::unique_ptr<hwloc_topology, HwlocTopologyDeleter>;

struct HwlocBitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const noexcept;  // hwloc_bitmap_free
};
using HwlocBitmapPtr = std::unique_ptr<hwloc_bitmap_s, HwlocBitmapDeleter>;

// Loads `xml_path` (hwloc XML), or this system when it is empty, keeping all I/O objects
// (HWLOC_TYPE_FILTER_KEEP_ALL) and disallowed PUs / NUMA nodes (HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED).
// Errors name the file: NotFound when it does not exist, InvalidArgument when hwloc cannot parse
// or accept it.
StatusOr<HwlocTopologyPtr> LoadHwlocTopology(const std::string& xml_path);

HwlocBitmapPtr NewBitmap();  // empty; aborts (a fatal invariant) only when out of memory
// Set bits in order; for an infinite bitmap, those before its last unset bit.
CpuList BitmapToList(const hwloc_bitmap_s* bitmap);
HwlocBitmapPtr ListToBitmap(const std::vector<int>& indexes);

}  // namespace vigil::topology::internal
