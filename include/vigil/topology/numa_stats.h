// vigil/topology/numa_stats.h — where a process's memory lives, the system's NUMA allocation counters
// and per-thread CPU time and affinity, read from Linux's /proc and /sys.
//
// Formats (Linux proc(5) and Documentation/admin-guide/numastat.rst, kernel 6.x):
//   /proc/PID/numa_maps — one line per mapping: "<start address hex> <policy> [file=P|heap|stack|huge]
//     key=value ... N<node>=<pages> ... kernelpagesize_kB=<k>"; policy is "default", "local",
//     "bind:<nodes>", "prefer:<node>", "prefer (many):<nodes>", "interleave:<nodes>" or
//     "weighted interleave:<nodes>" (nodes as a cpulist-style list); N<node>=<pages> counts the pages of
//     the mapping resident on that node, each kernelpagesize_kB KiB. Mode flags may follow the mode
//     ("bind=static:1", mm/mempolicy.c mpol_to_str); NumaMapping::policy drops them.
//   /sys/devices/system/node/node<N>/numastat — "name value" lines, in pages: numa_hit, numa_miss,
//     numa_foreign, interleave_hit, local_node, other_node (allocations since boot).
//   /proc/PID/task/TID/stat — "tid (comm) state ..." with utime and stime (fields 14 and 15, clock
//     ticks of sysconf(_SC_CLK_TCK)) and processor (field 39, the CPU it last ran on); comm may hold
//     spaces and parentheses, so fields are counted after the last ')'.
//   /proc/PID/task/TID/status — "Cpus_allowed_list:\t0-3,8" (the thread's affinity).
//
// Units: bytes, pages as named, seconds. Thread-safety: pure parse functions; the readers read files
// and may be called from any thread. Errors: InvalidArgument naming the line and what is wrong for
// malformed text; NotFound naming the path when a file is missing (a thread that has exited).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {

// "0-3,8,10-11" → {0,1,2,3,8,10,11} (Linux cpulist format; also node lists). "" → {}.
StatusOr<CpuList> ParseCpuList(std::string_view text);

// A mapping of numa_maps whose memory policy names nodes (bind, prefer, interleave, ...).
struct NumaMapping {
  uint64_t start = 0;                    // start address
  std::string policy;                    // the mode without flags and nodes: "bind", "prefer (many)", "interleave", ...
  std::vector<int> policy_nodes;         // nodes the policy names
  std::map<int, uint64_t> bytes_on_node; // resident bytes per node
};
struct NumaMaps {
  std::map<int, uint64_t> bytes_on_node;  // resident bytes per node, all mappings
  std::vector<NumaMapping> placed;        // mappings with a node-naming policy, in file order
};
StatusOr<NumaMaps> ParseNumaMaps(std::string_view text);
StatusOr<NumaMaps> ReadNumaMaps(pid_t pid);  // /proc/PID/numa_maps; pid 0 = this process

// node → counter name → pages.
using NumaStat = std::map<int, std::map<std::string, uint64_t>>;
StatusOr<std::map<std::string, uint64_t>> ParseNumastat(std::string_view text);
// Every /sys/devices/system/node/node*/numastat; empty (not an error) on a kernel without NUMA.
StatusOr<NumaStat> ReadNumastat(const std::string& sys_node_dir = "/sys/devices/system/node");

struct TaskStat {
  std::string comm;           // the thread's name (pthread_setname_np; inherited by threads it creates)
  uint64_t utime_ticks = 0;   // user time, clock ticks
  uint64_t stime_ticks = 0;   // system time, clock ticks
  int processor = -1;         // CPU it last ran on
};
StatusOr<TaskStat> ParseTaskStat(std::string_view text);
// CPU seconds of a TaskStat: (utime + stime) / sysconf(_SC_CLK_TCK).
double CpuSeconds(const TaskStat& stat);

struct TaskInfo {
  pid_t tid = 0;
  TaskStat stat;
  CpuList cpus_allowed;  // affinity, from Cpus_allowed_list
};
// The thread `tid` of `pid` (0 = this process). NotFound when it has exited.
StatusOr<TaskInfo> ReadTask(pid_t pid, pid_t tid);
// Every thread of `pid` (0 = this process), by tid; threads exiting meanwhile are left out.
StatusOr<std::vector<TaskInfo>> ReadTasks(pid_t pid);

}  // namespace vigil::topology
