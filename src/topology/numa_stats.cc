// /proc and /sys readers (vigil/topology/numa_stats.h).
#include "vigil/topology/numa_stats.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace vigil::topology {
namespace {

template <typename T>
bool ParseNumber(std::string_view s, T* out, int base = 10) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, *out, base);
  return ec == std::errc() && p == end;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  }
  return out;
}

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t b = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ProcDir(pid_t pid) { return pid == 0 ? std::string("/proc/self") : StrCat("/proc/", pid); }

}  // namespace

StatusOr<CpuList> ParseCpuList(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  CpuList out;
  if (text.empty()) return out;
  for (std::string_view part : Split(text, ',')) {
    const size_t dash = part.find('-');
    const std::string_view first = part.substr(0, dash), last = dash == std::string_view::npos ? first : part.substr(dash + 1);
    int lo = 0, hi = 0;
    const bool ok = ParseNumber(first, &lo) && ParseNumber(last, &hi);
    if (!ok || lo < 0 || hi < lo || hi - lo > 1 << 20) {
      return absl::InvalidArgumentError(StrCat("cpu list '", text, "': bad item '", part, "'"));
    }
    for (int i = lo; i <= hi; ++i) out.push_back(i);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

StatusOr<NumaMaps> ParseNumaMaps(std::string_view text) {
  NumaMaps out;
  int line_no = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++line_no;
    std::vector<std::string_view> w = Words(line);
    if (w.empty()) continue;
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(StrCat("numa_maps line ", line_no, " '", line, "': ", why));
    };
    NumaMapping m;
    if (w.size() < 2 || !ParseNumber(w[0], &m.start, 16)) return bad("expected '<address> <policy> ...'");
    // The policy is the second word; "weighted interleave:0-1" and "prefer (many):0-1" span two.
    size_t next = 2;
    std::string policy(w[1]);
    if (w.size() > 2 && (policy == "weighted" || w[2].front() == '(')) policy += StrCat(" ", w[next++]);
    const size_t colon = policy.find(':');
    m.policy = policy.substr(0, std::min(colon, policy.find('=')));  // mode flags ("=static") dropped
    if (colon != std::string::npos) {
      StatusOr<CpuList> nodes = ParseCpuList(std::string_view(policy).substr(colon + 1));
      if (!nodes.ok()) return bad(StrCat("policy nodes: ", nodes.status().message()));
      m.policy_nodes = *nodes;
    }
    uint64_t page_kb = 0;
    std::map<int, uint64_t> pages;
    for (size_t i = next; i < w.size(); ++i) {
      const size_t eq = w[i].find('=');
      if (eq == std::string_view::npos) continue;  // "heap", "stack", "huge"
      const std::string_view key = w[i].substr(0, eq), value = w[i].substr(eq + 1);
      if (key == "kernelpagesize_kB") {
        if (!ParseNumber(value, &page_kb) || page_kb == 0) return bad("bad kernelpagesize_kB");
      } else if (key.size() > 1 && key[0] == 'N' && std::all_of(key.begin() + 1, key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        int node = 0;
        uint64_t n = 0;
        if (!ParseNumber(key.substr(1), &node) || !ParseNumber(value, &n)) return bad(StrCat("bad '", w[i], "'"));
        pages[node] += n;
      }
    }
    if (!pages.empty() && page_kb == 0) return bad("pages per node without kernelpagesize_kB");
    for (const auto& [node, n] : pages) {
      m.bytes_on_node[node] = n * page_kb * 1024;
      out.bytes_on_node[node] += n * page_kb * 1024;
    }
    if (!m.policy_nodes.empty()) out.placed.push_back(std::move(m));
  }
  return out;
}

StatusOr<NumaMaps> ReadNumaMaps(pid_t pid) {
  const std::string path = ProcDir(pid) + "/numa_maps";
  VIGIL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  StatusOr<NumaMaps> maps = ParseNumaMaps(text);
  if (!maps.ok()) return Annotate(maps.status(), path);
  return maps;
}

StatusOr<std::map<std::string, uint64_t>> ParseNumastat(std::string_view text) {
  std::map<std::string, uint64_t> out;
  int line_no = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++line_no;
    std::vector<std::string_view> w = Words(line);
    if (w.empty()) continue;
    uint64_t v = 0;
    if (w.size() != 2 || !ParseNumber(w[1], &v)) {
      return absl::InvalidArgumentError(StrCat("numastat line ", line_no, " '", line, "': expected '<name> <pages>'"));
    }
    out[std::string(w[0])] = v;
  }
  return out;
}

StatusOr<NumaStat> ReadNumastat(const std::string& sys_node_dir) {
  NumaStat out;
  DIR* dir = opendir(sys_node_dir.c_str());
  if (!dir) return out;  // no NUMA support in this kernel
  std::vector<int> nodes;
  while (const dirent* e = readdir(dir)) {
    const std::string_view name(e->d_name);
    int node = 0;
    if (name.size() > 4 && name.substr(0, 4) == "node" && ParseNumber(name.substr(4), &node)) nodes.push_back(node);
  }
  closedir(dir);
  for (int node : nodes) {
    const std::string path = StrCat(sys_node_dir, "/node", node, "/numastat");
    StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) continue;  // a node without the file (memory hot-unplugged meanwhile)
    StatusOr<std::map<std::string, uint64_t>> counters = ParseNumastat(*text);
    if (!counters.ok()) return Annotate(counters.status(), path);
    out[node] = std::move(*counters);
  }
  return out;
}

StatusOr<TaskStat> ParseTaskStat(std::string_view text) {
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return absl::InvalidArgumentError(StrCat("task stat '", text.substr(0, 80), "': no '(comm)'"));
  }
  TaskStat out;
  out.comm = std::string(text.substr(open + 1, close - open - 1));
  // Words after ')' are fields 3 (state), 4, ...: field f is rest[f - 3].
  std::vector<std::string_view> rest = Words(text.substr(close + 1));
  if (!rest.empty() && rest.back().back() == '\n') rest.back().remove_suffix(1);
  auto field = [&](size_t f, auto* out_v) { return rest.size() > f - 3 && ParseNumber(rest[f - 3], out_v); };
  if (!field(14, &out.utime_ticks) || !field(15, &out.stime_ticks)) {
    return absl::InvalidArgumentError(StrCat("task stat of '", out.comm, "': no utime/stime (fields 14, 15)"));
  }
  if (!field(39, &out.processor)) out.processor = -1;
  return out;
}

double CpuSeconds(const TaskStat& stat) {
  return static_cast<double>(stat.utime_ticks + stat.stime_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

StatusOr<TaskInfo> ReadTask(pid_t pid, pid_t tid) {
  const std::string dir = StrCat(ProcDir(pid), "/task/", tid);
  TaskInfo out;
  out.tid = tid;
  VIGIL_ASSIGN_OR_RETURN(std::string stat, ReadFile(dir + "/stat"));
  StatusOr<TaskStat> parsed = ParseTaskStat(stat);
  if (!parsed.ok()) return Annotate(parsed.status(), dir + "/stat");
  out.stat = std::move(*parsed);
  VIGIL_ASSIGN_OR_RETURN(std::string status, ReadFile(dir + "/status"));
  constexpr std::string_view kKey = "Cpus_allowed_list:";
  const size_t at = status.find(kKey);
  if (at == std::string::npos) return absl::InvalidArgumentError(StrCat(dir, "/status: no Cpus_allowed_list"));
  const size_t eol = status.find('\n', at);
  std::string_view list = std::string_view(status).substr(at + kKey.size(), eol == std::string::npos ? std::string::npos : eol - at - kKey.size());
  while (!list.empty() && (list.front() == '\t' || list.front() == ' ')) list.remove_prefix(1);
  StatusOr<CpuList> cpus = ParseCpuList(list);
  if (!cpus.ok()) return Annotate(cpus.status(), dir + "/status");
  out.cpus_allowed = std::move(*cpus);
  return out;
}

StatusOr<std::vector<TaskInfo>> ReadTasks(pid_t pid) {
  const std::string dir = ProcDir(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return absl::NotFoundError(StrCat(dir, ": cannot list (no such process?)"));
  std::vector<pid_t> tids;
  while (const dirent* e = readdir(d)) {
    pid_t tid = 0;
    if (ParseNumber(std::string_view(e->d_name), &tid)) tids.push_back(tid);
  }
  closedir(d);
  std::sort(tids.begin(), tids.end());
  std::vector<TaskInfo> out;
  for (pid_t tid : tids) {
    StatusOr<TaskInfo> t = ReadTask(pid, tid);
    if (t.ok()) out.push_back(std::move(*t));
    else if (!absl::IsNotFound(t.status())) return t.status();
  }
  return out;
}

}  // namespace vigil::topology
