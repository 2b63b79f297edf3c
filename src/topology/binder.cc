// Binder and HostBuffer (vigil/topology/binder.h).
#include "vigil/topology/binder.h"

#include <hwloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

namespace vigil::topology {
namespace {

using internal::BitmapToList;
using internal::ListToBitmap;
using internal::NewBitmap;

const char* PolicyName(hwloc_membind_policy_t p) {
  switch (p) {
    case HWLOC_MEMBIND_DEFAULT: return "default";
    case HWLOC_MEMBIND_FIRSTTOUCH: return "firsttouch";
    case HWLOC_MEMBIND_BIND: return "bind";
    case HWLOC_MEMBIND_INTERLEAVE: return "interleave";
    case HWLOC_MEMBIND_NEXTTOUCH: return "nexttouch";
    case HWLOC_MEMBIND_MIXED: return "mixed";
  }
  return "unknown";
}

constexpr size_t kHugePage = size_t{2} << 20;  // x86-64 PMD-level transparent huge page

bool EnvDisablesBinding() {
  const char* v = std::getenv("DISABLE_NUMA_BIND");
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      numa_node_(std::exchange(other.numa_node_, -1)),
      huge_pages_(std::exchange(other.huge_pages_, false)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    HostBuffer gone(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    numa_node_ = std::exchange(other.numa_node_, -1);
    huge_pages_ = std::exchange(other.huge_pages_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (data_) munmap(data_, mapped_);
}

Binder::Binder(BindOptions options) {
  StatusOr<internal::HwlocTopologyPtr> topo = internal::LoadHwlocTopology("");
  if (topo.ok()) {
    topo_ = std::move(*topo);
    numa_nodes_ = hwloc_get_nbobjs_by_type(topo_.get(), HWLOC_OBJ_NUMANODE);
  }
  if (!options.enabled) {
    skip_reason_ = "disabled by configuration (placement: {bind: false})";
  } else if (EnvDisablesBinding()) {
    skip_reason_ = "disabled by DISABLE_NUMA_BIND=1";
  } else if (!topo.ok()) {
    skip_reason_ = std::string(topo.status().message());
  } else if (numa_nodes_ <= 1 && !options.bind_single_numa) {
    skip_reason_ = "single NUMA node: all memory is local, nothing to gain";
  }
  active_ = skip_reason_.empty();
  if (active_) spdlog::info("topology: binding threads and host buffers ({} NUMA nodes)", numa_nodes_);
  else spdlog::info("topology: NUMA binding skipped: {}", skip_reason_);
}

Status Binder::BindCurrentThread(const CpuList& cpus, std::string_view what) {
  if (!active_) return absl::OkStatus();
  Status st;
  internal::HwlocBitmapPtr set = ListToBitmap(cpus);
  if (cpus.empty()) {
    st = absl::InvalidArgumentError(StrCat(what, ": empty CPU set"));
  } else if (!hwloc_bitmap_isincluded(set.get(), hwloc_topology_get_allowed_cpuset(topo_.get()))) {
    st = absl::InvalidArgumentError(StrCat(what, ": PUs ", FormatCpuList(cpus), " are not all allowed here (allowed: ",
                                           FormatCpuList(BitmapToList(hwloc_topology_get_allowed_cpuset(topo_.get()))), ")"));
  } else if (hwloc_set_cpubind(topo_.get(), set.get(), HWLOC_CPUBIND_THREAD) != 0) {
    st = absl::InternalError(StrCat(what, ": binding to PUs ", FormatCpuList(cpus), " failed: ", std::strerror(errno)));
  }
  if (!st.ok()) spdlog::warn("topology: {}", std::string(st.message()));
  return st;
}

StatusOr<CpuList> Binder::CurrentThreadCpus() const {
  if (!topo_) return absl::FailedPreconditionError(skip_reason_);
  internal::HwlocBitmapPtr set = NewBitmap();
  if (hwloc_get_cpubind(topo_.get(), set.get(), HWLOC_CPUBIND_THREAD) != 0) {
    return absl::InternalError(StrCat("reading this thread's CPU binding: ", std::strerror(errno)));
  }
  return BitmapToList(set.get());
}

StatusOr<HostBuffer> Binder::AllocateHostBuffer(size_t bytes, int numa_node, bool huge_pages) {
  if (bytes == 0) return absl::InvalidArgumentError("host buffer of 0 bytes");
  if (numa_node >= 0 && topo_ && !hwloc_get_numanode_obj_by_os_index(topo_.get(), static_cast<unsigned>(numa_node))) {
    return absl::InvalidArgumentError(StrCat("host buffer on NUMA node ", numa_node, ": no such node on this machine"));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  huge_pages = huge_pages && bytes >= kHugePage;
  const size_t unit = huge_pages ? kHugePage : page;
  if (bytes > SIZE_MAX - 2 * unit) return absl::InvalidArgumentError(StrCat("host buffer of ", bytes, " bytes: too large"));
  const size_t mapped = (bytes + unit - 1) / unit * unit;
  // For huge pages, map one extra unit and trim both ends so that the mapping starts on a 2 MiB boundary.
  const size_t reserve = huge_pages ? mapped + unit : mapped;
  void* raw = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError(StrCat("host buffer of ", bytes, " bytes: mmap failed: ", std::strerror(errno)));
  }
  char* p = static_cast<char*>(raw);
  if (huge_pages) {
    const size_t head = (unit - reinterpret_cast<uintptr_t>(p) % unit) % unit;
    if (head > 0) munmap(p, head);
    munmap(p + head + mapped, unit - head);
    p += head;
  }
  HostBuffer buffer(p, bytes, mapped);
  if (huge_pages) {
    buffer.huge_pages_ = madvise(p, mapped, MADV_HUGEPAGE) == 0;
    if (!buffer.huge_pages_) {
      spdlog::info("topology: no transparent huge pages for a {}-byte host buffer ({})", bytes, std::strerror(errno));
    }
  }
  if (active_ && numa_node >= 0) {
    internal::HwlocBitmapPtr nodes = ListToBitmap({numa_node});
    if (hwloc_set_area_membind(topo_.get(), p, mapped, nodes.get(), HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) == 0) {
      buffer.numa_node_ = numa_node;
    } else {
      spdlog::warn("topology: binding a {}-byte host buffer to NUMA node {} failed ({}); it stays unbound", bytes,
                   numa_node, std::strerror(errno));
    }
  }
  // Fault every page in now, so that it lands on its node here rather than on the first frame.
  for (size_t off = 0; off < mapped; off += page) static_cast<volatile char*>(p)[off] = 0;
  return buffer;
}

StatusOr<MemoryPlacement> Binder::QueryMemory(const void* data, size_t bytes) const {
  if (!topo_) return absl::FailedPreconditionError(skip_reason_);
  internal::HwlocBitmapPtr set = NewBitmap();
  hwloc_membind_policy_t policy = HWLOC_MEMBIND_DEFAULT;
  if (hwloc_get_area_membind(topo_.get(), data, bytes, set.get(), &policy, HWLOC_MEMBIND_BYNODESET) != 0) {
    return absl::InternalError(StrCat("reading the memory policy of ", bytes, " bytes at ", data, ": ", std::strerror(errno)));
  }
  MemoryPlacement out{PolicyName(policy), BitmapToList(set.get()), {}};
  if (hwloc_get_area_memlocation(topo_.get(), data, bytes, set.get(), HWLOC_MEMBIND_BYNODESET) != 0) {
    return absl::InternalError(StrCat("reading where ", bytes, " bytes at ", data, " live: ", std::strerror(errno)));
  }
  out.location = BitmapToList(set.get());
  return out;
}

}  // namespace vigil::topology
