// vigil/topology/placement_check.h — what a running process says it placed, and a check of that against
// the kernel's own view of the process: `vigil topo --check`.
//
// A process that binds (the edge) publishes a PlacementReport: its pid, whether binding is on, the NUMA
// nodes its plan puts memory on and, per thread it bound, the tid, name and planned PUs. CheckPlacement
// then reads /proc/PID (numa_stats.h) — each thread's Cpus_allowed_list, the process's numa_maps — and
// says, thread by thread and mapping by mapping, whether they match:
//   - a listed thread matches when its affinity equals its planned PUs; threads it created (OpenMP
//     workers, FFmpeg decoder threads) carry its name and are checked against the same PUs;
//   - a mapping with a NUMA policy (bound host buffers) matches when its policy names only nodes of the
//     plan and its resident pages lie on the nodes its policy names;
//   - with binding off nothing is expected: threads are reported "unbound", never a mismatch.
//
// JSON (PlacementReportToJson): {"pid": 1234, "topology": "this system", "binding": {"active": true,
// "note": ""}, "memory_nodes": [0], "threads": [{"tid": 1240, "name": "vigil-worker", "role": "worker",
// "stream": "", "device": 0, "cpus": [0, 1]}], "plan": {...}} — "plan" is the planner's JSON (report.h),
// carried for people and ignored by the check.
//
// Thread-safety: pure functions over values, plus reads of /proc. Errors: InvalidArgument naming the
// field for bad JSON; NotFound when the process does not exist.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/topology/numa_stats.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {

struct PlacedThread {
  pid_t tid = 0;
  std::string name;    // the thread's name (comm, at most 15 characters), e.g. "vigil-dec-0"
  std::string role;    // "decode", "feed", "worker"
  std::string stream;  // stream id for per-stream threads, else ""
  int device = -1;     // index into the plan's devices; -1 for a thread serving all of them
  CpuList cpus;        // PUs the plan binds it to
};

struct PlacementReport {
  pid_t pid = 0;
  std::string topology;           // where the plan's topology came from (Topology::source)
  bool binding = false;           // the Binder was active
  std::string binding_note;       // why binding is off; "" when on
  std::vector<int> memory_nodes;  // NUMA nodes the plan places memory on
  std::vector<PlacedThread> threads;
  std::string plan_json;          // {"topology": ..., "plan": ...} from ToJson; "" when no plan
};

std::string PlacementReportToJson(const PlacementReport& report);
StatusOr<PlacementReport> PlacementReportFromJson(std::string_view json);

struct ThreadCheck {
  enum class State { kOk, kMismatch, kUnbound, kExited };
  pid_t tid = 0;
  std::string name;
  std::string role, stream;  // of the listed thread (or the one whose name it carries)
  bool listed = true;        // false: not in the report, created by a listed thread (same name)
  CpuList planned, actual;   // actual: empty when exited
  int last_cpu = -1;         // CPU it last ran on
  State state = State::kOk;
};
std::string_view ThreadStateName(ThreadCheck::State state);  // "ok", "MISMATCH", "unbound", "exited"

struct MappingCheck {
  NumaMapping mapping;
  std::string problem;  // "" when it matches
};

struct PlacementCheck {
  PlacementReport report;
  std::vector<ThreadCheck> threads;          // listed threads in report order, each followed by its offspring
  std::vector<MappingCheck> mappings;        // mappings with a NUMA policy
  std::map<int, uint64_t> memory_on_node;    // resident bytes of the process per node
  bool ok() const;                           // no thread mismatch and no mapping problem
};

// Reads /proc/<report.pid>. Errors: NotFound when the process is gone.
StatusOr<PlacementCheck> CheckPlacement(const PlacementReport& report);
// A table of threads, the memory per node and the verdict, for people.
std::string FormatPlacementCheck(const PlacementCheck& check);

}  // namespace vigil::topology
