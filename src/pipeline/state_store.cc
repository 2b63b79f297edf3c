// The stream ledger's stores: the state_dir (locked, one JSON file written atomically) and memory (tests).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "vigil/pipeline/atomic_file.h"
#include "vigil/pipeline/ledger.h"

namespace vigil::pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Errno() { return std::strerror(errno); }

Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(StrCat("cannot open '", path, "' to sync it: ", Errno()));
  const bool ok = ::fsync(fd) == 0;
  const std::string err = Errno();
  ::close(fd);
  if (!ok) return absl::InternalError(StrCat("cannot fsync '", path, "': ", err));
  return absl::OkStatus();
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(StrCat("cannot write '", tmp, "': ", Errno()));
  size_t done = 0;
  bool ok = true;
  while (ok && done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const std::string err = Errno();
  ::close(fd);
  if (!ok) return absl::InternalError(StrCat("cannot write '", tmp, "': ", err));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(StrCat("cannot rename '", tmp, "' to '", path, "': ", Errno()));
  }
  // The rename itself must survive a power loss.
  const std::string dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path().string() : ".";
  return FsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

namespace {

// "cam%201" → "cam 1" (older vigil wrote every byte outside [A-Za-z0-9_-] of a stream id as %XX).
std::string UnescapeId(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%' && i + 2 < name.size() && std::isxdigit(static_cast<unsigned char>(name[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(name[i + 2]))) {
      out += static_cast<char>(std::stoi(name.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += name[i];
    }
  }
  return out;
}

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoull(s);
  return true;
}

// Reads streams/<id>.state files of an older vigil: "run N", "cursor N|none", "source URI".
StatusOr<std::vector<StreamRecord>> LoadLegacy(const std::string& dir) {
  std::vector<StreamRecord> out;
  const fs::path streams = fs::path(dir) / "streams";
  std::error_code ec;
  if (!fs::is_directory(streams, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(streams, ec)) {
    if (e.path().extension() != ".state") continue;
    std::ifstream in(e.path());
    std::string run_key, run, cursor_key, cursor, source_key, source;
    std::getline(in, run_key, ' ');
    std::getline(in, run);
    std::getline(in, cursor_key, ' ');
    std::getline(in, cursor);
    std::getline(in, source_key, ' ');
    std::getline(in, source);
    StreamRecord r;
    uint64_t c = 0;
    if (run_key != "run" || !ParseU64(run, &r.run) || cursor_key != "cursor" ||
        (cursor != "none" && (!ParseU64(cursor, &c) || c + 1 >= transport::kMaxSeq)) || source_key != "source" ||
        r.run == 0) {
      return absl::DataLossError(StrCat("'", e.path().string(), "': malformed stream state of an older vigil"));
    }
    r.stream = UnescapeId(e.path().stem().string());
    r.source = source;
    if (cursor != "none") r.acked_through = c;
    r.next_seq = r.acked_through ? *r.acked_through + 1 : 0;
    out.push_back(std::move(r));
  }
  return out;
}

class DirStore final : public StateStore {
 public:
  DirStore(std::string dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  ~DirStore() override { ::close(lock_fd_); }  // releases the flock

  StatusOr<std::vector<StreamRecord>> Load() override {
    const std::string path = (fs::path(dir_) / "ledger.json").string();
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::error_code ec;
      if (fs::exists(path, ec)) return absl::PermissionDeniedError(StrCat("cannot read '", path, "'"));
      return LoadLegacy(dir_);
    }
    std::stringstream text;
    text << in.rdbuf();
    const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    auto bad = [&](std::string why) { return absl::DataLossError(StrCat("'", path, "': ", why)); };
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    if (!j.contains("version") || j["version"] != 1) return bad("unknown version (this vigil reads version 1)");
    if (!j.contains("streams") || !j["streams"].is_array()) return bad("no 'streams' array");
    std::vector<StreamRecord> out;
    for (const json& s : j["streams"]) {
      if (!s.is_object() || !s.contains("stream") || !s["stream"].is_string() || !s.contains("source") ||
          !s["source"].is_string() || !s.contains("run") || !s["run"].is_number_unsigned() ||
          !s.contains("next_seq") || !s["next_seq"].is_number_unsigned() || !s.contains("acked_through") ||
          !(s["acked_through"].is_null() || s["acked_through"].is_number_unsigned())) {
        return bad(StrCat("malformed stream entry ", s.dump(-1, ' ', false, json::error_handler_t::replace)));
      }
      StreamRecord r;
      r.stream = s["stream"].get<std::string>();
      r.source = s["source"].get<std::string>();
      r.run = s["run"].get<uint64_t>();
      r.next_seq = s["next_seq"].get<uint64_t>();
      if (!s["acked_through"].is_null()) r.acked_through = s["acked_through"].get<uint64_t>();
      // seqs stay below 2^63; what was acknowledged was assigned.
      if (r.next_seq >= transport::kMaxSeq || r.run == 0 || (r.acked_through && *r.acked_through >= r.next_seq)) {
        return bad(StrCat("stream '", r.stream, "': run ", r.run, ", next_seq ", r.next_seq, " and acked_through ",
                          r.acked_through ? std::to_string(*r.acked_through) : "null",
                          " are not run ≥ 1, acked_through < next_seq < 2^63"));
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  Status Save(const std::vector<StreamRecord>& records) override {
    json streams = json::array();
    for (const StreamRecord& r : records) {
      streams.push_back({{"stream", r.stream},
                         {"source", r.source},
                         {"run", r.run},
                         {"acked_through", r.acked_through ? json(*r.acked_through) : json(nullptr)},
                         {"next_seq", r.next_seq}});
    }
    const json j = {{"version", 1}, {"streams", std::move(streams)}};
    return WriteFileAtomic((fs::path(dir_) / "ledger.json").string(), j.dump(1, ' ', false, json::error_handler_t::replace) + "\n");
  }

  std::string where() const override { return (fs::path(dir_) / "ledger.json").string(); }

 private:
  const std::string dir_;
  const int lock_fd_;
};

class MemoryStore final : public StateStore {
 public:
  explicit MemoryStore(std::shared_ptr<MemoryState> state) : state_(std::move(state)) {}
  StatusOr<std::vector<StreamRecord>> Load() override {
    MemoryState& st = *state_;
    MutexLock lock(st.mu);
    return st.records;
  }
  Status Save(const std::vector<StreamRecord>& records) override {
    MemoryState& st = *state_;
    MutexLock lock(st.mu);
    st.records = records;
    ++st.saves;
    return absl::OkStatus();
  }
  std::string where() const override { return "memory"; }

 private:
  std::shared_ptr<MemoryState> state_;
};

}  // namespace

StatusOr<std::unique_ptr<StateStore>> OpenStateDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(StrCat("state_dir '", dir, "': cannot create it: ", ec.message()));
  const std::string lock_path = (fs::path(dir) / "lock").string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(StrCat("state_dir '", dir, "': cannot open '", lock_path, "': ", Errno()));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string owner = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("unknown");
    while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(StrCat("state_dir '", dir, "' is in use by another vigil edge (pid ",
                                                  owner, "); every edge needs a state_dir of its own"));
    }
    return absl::InternalError(StrCat("state_dir '", dir, "': cannot lock '", lock_path, "': ", std::strerror(err)));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The pid is only for the message a second edge gets; the lock itself holds.
  }
  return std::unique_ptr<StateStore>(new DirStore(dir, fd));
}

std::unique_ptr<StateStore> MakeMemoryStateStore(std::shared_ptr<MemoryState> state) {
  return std::make_unique<MemoryStore>(std::move(state));
}

}  // namespace vigil::pipeline
