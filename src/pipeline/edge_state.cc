#include "vigil/pipeline/edge_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace vigil::pipeline {
namespace {

namespace fs = std::filesystem;

std::string FileName(const std::string& id) {
  std::string out;
  for (unsigned char c : id) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out + ".state";
}

StatusOr<std::optional<std::string>> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!fs::exists(path)) return std::optional<std::string>();
    return absl::PermissionDeniedError("cannot read '" + path + "'");
  }
  std::stringstream s;
  s << in.rdbuf();
  return std::optional<std::string>(s.str());
}

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 19) return false;
  *out = std::stoull(s);
  return true;
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError("cannot write '" + tmp + "': " + std::strerror(errno));
  bool ok = ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ok = ::fsync(fd) == 0 && ok;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError("cannot write '" + path + "': " + std::strerror(ok ? errno : err));
  }
  return absl::OkStatus();
}

StatusOr<EdgeState> EdgeState::Open(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "streams", ec);
  if (ec) return absl::InternalError("state dir '" + dir + "': " + ec.message());
  EdgeState s;
  s.dir_ = dir;
  const std::string path = (fs::path(dir) / "epoch").string();
  VIGIL_ASSIGN_OR_RETURN(std::optional<std::string> text, ReadFile(path));
  uint64_t epoch = 0;
  if (text) {
    std::string t = *text;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    if (!ParseU64(t, &epoch)) return absl::DataLossError("'" + path + "': not an epoch number");
  }
  s.epoch_ = epoch + 1;
  VIGIL_RETURN_IF_ERROR(WriteFileAtomic(path, std::to_string(s.epoch_) + "\n"));
  return s;
}

StatusOr<std::optional<StreamCursor>> EdgeState::Load(const std::string& stream_id) const {
  const std::string path = (fs::path(dir_) / "streams" / FileName(stream_id)).string();
  VIGIL_ASSIGN_OR_RETURN(std::optional<std::string> text, ReadFile(path));
  if (!text) return std::optional<StreamCursor>();
  std::istringstream in(*text);
  std::string run_key, run, cursor_key, cursor, source_key, source;
  std::getline(in, run_key, ' ');
  std::getline(in, run);
  std::getline(in, cursor_key, ' ');
  std::getline(in, cursor);
  std::getline(in, source_key, ' ');
  std::getline(in, source);
  StreamCursor c;
  c.source = source;
  uint64_t v = 0;
  const bool ok = run_key == "run" && ParseU64(run, &c.run) && cursor_key == "cursor" &&
                  (cursor == "none" || ParseU64(cursor, &v)) && source_key == "source";
  if (!ok) return absl::DataLossError("'" + path + "': malformed stream state");
  if (cursor != "none") c.cursor = v;
  return std::optional<StreamCursor>(c);
}

Status EdgeState::Save(const std::string& stream_id, const StreamCursor& state) const {
  const std::string path = (fs::path(dir_) / "streams" / FileName(stream_id)).string();
  return WriteFileAtomic(path, "run " + std::to_string(state.run) + "\ncursor " +
                                   (state.cursor ? std::to_string(*state.cursor) : "none") + "\nsource " +
                                   state.source + "\n");
}

}  // namespace vigil::pipeline
