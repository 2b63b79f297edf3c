// PlacementReport JSON and CheckPlacement (vigil/topology/placement_check.h).
#include "vigil/topology/placement_check.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

namespace vigil::topology {
namespace {

using nlohmann::json;

std::string MiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

bool Within(const std::vector<int>& nodes, const std::vector<int>& allowed) {
  return std::all_of(nodes.begin(), nodes.end(),
                     [&](int n) { return std::find(allowed.begin(), allowed.end(), n) != allowed.end(); });
}

}  // namespace

std::string PlacementReportToJson(const PlacementReport& r) {
  json j;
  j["pid"] = r.pid;
  j["topology"] = r.topology;
  j["binding"] = {{"active", r.binding}, {"note", r.binding_note}};
  j["memory_nodes"] = r.memory_nodes;
  j["threads"] = json::array();
  for (const PlacedThread& t : r.threads) {
    j["threads"].push_back({{"tid", t.tid}, {"name", t.name}, {"role", t.role}, {"stream", t.stream},
                            {"device", t.device}, {"cpus", t.cpus}});
  }
  if (!r.plan_json.empty()) j["plan"] = json::parse(r.plan_json, nullptr, /*allow_exceptions=*/false);
  return j.dump(2);
}

StatusOr<PlacementReport> PlacementReportFromJson(std::string_view text) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("placement report: not a JSON object");
  PlacementReport r;
  std::string field;
  try {
    field = "pid";
    r.pid = j.at("pid").get<pid_t>();
    field = "topology";
    r.topology = j.at("topology").get<std::string>();
    field = "binding";
    r.binding = j.at("binding").at("active").get<bool>();
    r.binding_note = j.at("binding").at("note").get<std::string>();
    field = "memory_nodes";
    r.memory_nodes = j.at("memory_nodes").get<std::vector<int>>();
    for (const json& t : j.at("threads")) {
      field = "threads";
      r.threads.push_back({t.at("tid").get<pid_t>(), t.at("name").get<std::string>(), t.at("role").get<std::string>(),
                           t.at("stream").get<std::string>(), t.at("device").get<int>(), t.at("cpus").get<CpuList>()});
    }
    if (j.contains("plan")) r.plan_json = j["plan"].dump(2);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(StrCat("placement report: field '", field, "': ", e.what()));
  }
  if (r.pid <= 0) return absl::InvalidArgumentError(StrCat("placement report: pid ", r.pid, " is not a process id"));
  return r;
}

std::string_view ThreadStateName(ThreadCheck::State state) {
  switch (state) {
    case ThreadCheck::State::kOk: return "ok";
    case ThreadCheck::State::kMismatch: return "MISMATCH";
    case ThreadCheck::State::kUnbound: return "unbound";
    case ThreadCheck::State::kExited: return "exited";
  }
  return "?";
}

bool PlacementCheck::ok() const {
  return std::none_of(threads.begin(), threads.end(), [](const ThreadCheck& t) { return t.state == ThreadCheck::State::kMismatch; }) &&
         std::all_of(mappings.begin(), mappings.end(), [](const MappingCheck& m) { return m.problem.empty(); });
}

StatusOr<PlacementCheck> CheckPlacement(const PlacementReport& report) {
  PlacementCheck out;
  out.report = report;
  VIGIL_ASSIGN_OR_RETURN(std::vector<TaskInfo> tasks, ReadTasks(report.pid));
  auto judge = [&](ThreadCheck& c, const TaskInfo& t) {
    c.actual = t.cpus_allowed;
    c.last_cpu = t.stat.processor;
    c.state = !report.binding ? ThreadCheck::State::kUnbound
              : c.actual == c.planned ? ThreadCheck::State::kOk
                                      : ThreadCheck::State::kMismatch;
  };
  std::vector<bool> seen(tasks.size(), false);
  for (const PlacedThread& p : report.threads) {
    ThreadCheck c{p.tid, p.name, p.role, p.stream, true, p.cpus, {}, -1, ThreadCheck::State::kExited};
    std::vector<ThreadCheck> offspring;
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].stat.comm != p.name || seen[i]) continue;
      seen[i] = true;
      if (tasks[i].tid == p.tid) {
        judge(c, tasks[i]);
      } else if (std::none_of(report.threads.begin(), report.threads.end(), [&](const PlacedThread& q) { return q.tid == tasks[i].tid; })) {
        ThreadCheck o{tasks[i].tid, p.name, p.role, p.stream, false, p.cpus, {}, -1, ThreadCheck::State::kOk};
        judge(o, tasks[i]);
        offspring.push_back(std::move(o));
      }
    }
    out.threads.push_back(std::move(c));
    out.threads.insert(out.threads.end(), offspring.begin(), offspring.end());
  }
  VIGIL_ASSIGN_OR_RETURN(NumaMaps maps, ReadNumaMaps(report.pid));
  out.memory_on_node = maps.bytes_on_node;
  for (NumaMapping& m : maps.placed) {
    MappingCheck mc{std::move(m), ""};
    std::vector<int> on;
    for (const auto& [node, bytes] : mc.mapping.bytes_on_node) on.push_back(node);
    if (report.binding && !Within(mc.mapping.policy_nodes, report.memory_nodes)) {
      mc.problem = StrCat("its policy names node(s) ", FormatCpuList(mc.mapping.policy_nodes), ", outside the plan's ",
                          report.memory_nodes.empty() ? std::string("(none)") : FormatCpuList(report.memory_nodes));
    } else if (mc.mapping.policy == "bind" && !Within(on, mc.mapping.policy_nodes)) {
      mc.problem = StrCat("pages on node(s) ", FormatCpuList(on), " although bound to ", FormatCpuList(mc.mapping.policy_nodes));
    }
    out.mappings.push_back(std::move(mc));
  }
  return out;
}

std::string FormatPlacementCheck(const PlacementCheck& c) {
  const PlacementReport& r = c.report;
  std::ostringstream out;
  out << "placement of pid " << r.pid << " (plan from " << r.topology << "; binding "
      << (r.binding ? std::string("on") : StrCat("off: ", r.binding_note)) << ")\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %8s  %-7s %-12s %-12s %-12s %4s  %s\n", "thread", "tid", "role", "stream",
                "planned", "actual", "last", "state");
  out << line;
  int mismatches = 0, checked = 0;
  for (const ThreadCheck& t : c.threads) {
    checked += t.state == ThreadCheck::State::kOk || t.state == ThreadCheck::State::kMismatch;
    mismatches += t.state == ThreadCheck::State::kMismatch;
    std::snprintf(line, sizeof line, "%-16s %8d  %-7s %-12s %-12s %-12s %4s  %s\n",
                  (t.listed ? t.name : "  +" + t.name).c_str(), static_cast<int>(t.tid), t.role.c_str(),
                  t.stream.empty() ? "-" : t.stream.c_str(), FormatCpuList(t.planned).c_str(),
                  t.actual.empty() ? "-" : FormatCpuList(t.actual).c_str(),
                  t.last_cpu < 0 ? "-" : std::to_string(t.last_cpu).c_str(), std::string(ThreadStateName(t.state)).c_str());
    out << line;
  }
  uint64_t total = 0, planned = 0;
  for (const auto& [node, bytes] : c.memory_on_node) {
    total += bytes;
    if (std::find(r.memory_nodes.begin(), r.memory_nodes.end(), node) != r.memory_nodes.end()) planned += bytes;
  }
  out << "memory:";
  for (const auto& [node, bytes] : c.memory_on_node) out << " node " << node << " " << MiB(bytes) << ";";
  if (total > 0 && !r.memory_nodes.empty()) {
    std::snprintf(line, sizeof line, " %.1f%% on the plan's node(s) %s", 100.0 * static_cast<double>(planned) / static_cast<double>(total),
                  FormatCpuList(r.memory_nodes).c_str());
    out << line;
  }
  out << "\n";
  int bad_mappings = 0;
  for (const MappingCheck& m : c.mappings) {
    bad_mappings += !m.problem.empty();
    std::snprintf(line, sizeof line, "  mapping at 0x%llx %s:%s", static_cast<unsigned long long>(m.mapping.start),
                  m.mapping.policy.c_str(), FormatCpuList(m.mapping.policy_nodes).c_str());
    out << line;
    for (const auto& [node, bytes] : m.mapping.bytes_on_node) out << ", " << MiB(bytes) << " on node " << node;
    out << (m.problem.empty() ? std::string(": ok") : ": MISMATCH: " + m.problem) << "\n";
  }
  if (!r.binding) {
    out << "verdict: binding is off (" << r.binding_note << "): nothing to match\n";
  } else if (c.ok()) {
    out << "verdict: match: " << checked << " threads on their planned PUs, " << c.mappings.size()
        << " NUMA-placed mappings on the plan's nodes\n";
  } else {
    out << "verdict: MISMATCH: " << mismatches << " of " << checked << " threads off their planned PUs, " << bad_mappings
        << " of " << c.mappings.size() << " NUMA-placed mappings off the plan\n";
  }
  return out.str();
}

}  // namespace vigil::topology
