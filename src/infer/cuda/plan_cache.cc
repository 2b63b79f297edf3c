// plan_cache.cc — PlanCache (plan_cache.h): the process-wide map and its JSON file.
#include "infer/cuda/plan_cache.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace vigil::cuda {
namespace {

constexpr const char* kFormat = "vigil-cudnn-plan-cache";
constexpr int kVersion = 1;

// The file's text; NotFound when it does not exist.
StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError(StrCat("'", path, "' does not exist"));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in.is_open()) text << in.rdbuf();
  if (!in.is_open() || in.bad()) return absl::InvalidArgumentError(StrCat("cannot read '", path, "': ", std::strerror(errno)));
  return text.str();
}

}  // namespace

PlanCache& PlanCache::Global() {
  static auto* cache = new PlanCache();
  return *cache;
}

std::optional<PlanChoice> PlanCache::Find(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void PlanCache::Put(const std::string& key, const PlanChoice& choice) {
  MutexLock lock(mu_);
  entries_[key] = choice;
}

size_t PlanCache::size() const {
  MutexLock lock(mu_);
  return entries_.size();
}

void PlanCache::Clear() {
  MutexLock lock(mu_);
  entries_.clear();
}

void PlanCache::Record(const PlanCacheStats& load) {
  MutexLock lock(mu_);
  totals_.hits += load.hits;
  totals_.timed += load.timed;
  totals_.failed_restores += load.failed_restores;
}

PlanCacheStats PlanCache::totals() const {
  MutexLock lock(mu_);
  return totals_;
}

std::string PlanCache::Serialize(const std::map<std::string, PlanChoice>& entries) {
  nlohmann::json j = {{"format", kFormat}, {"version", kVersion}, {"entries", nlohmann::json::object()}};
  for (const auto& [key, c] : entries) {
    nlohmann::json knobs = nlohmann::json::array();
    for (const auto& [type, value] : c.knobs) knobs.push_back({type, value});
    j["entries"][key] = {{"engine", c.engine}, {"knobs", knobs}};
  }
  return j.dump(1) + "\n";
}

StatusOr<std::map<std::string, PlanChoice>> PlanCache::Parse(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON (corrupt or truncated)");
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
    return absl::InvalidArgumentError(StrCat("not a vigil cuDNN plan cache (no \"format\": \"", kFormat, "\")"));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    return absl::InvalidArgumentError(
        StrCat("version ", j.contains("version") ? j["version"].dump() : "missing", ", this build reads ", kVersion));
  }
  if (!j.contains("entries") || !j["entries"].is_object()) return absl::InvalidArgumentError("no \"entries\" object");
  std::map<std::string, PlanChoice> out;
  for (const auto& [key, e] : j["entries"].items()) {
    const auto bad = [&key = key](const char* why) {
      return absl::InvalidArgumentError(StrCat("entry '", key, "': ", why));
    };
    if (!e.is_object() || !e.contains("engine") || !e["engine"].is_number_integer() || e["engine"].get<int64_t>() < -1) {
      return bad("\"engine\" is not an integer >= -1");
    }
    if (!e.contains("knobs") || !e["knobs"].is_array()) return bad("\"knobs\" is not an array");
    PlanChoice c;
    c.engine = e["engine"].get<int64_t>();
    for (const auto& k : e["knobs"]) {
      if (!k.is_array() || k.size() != 2 || !k[0].is_number_integer() || !k[1].is_number_integer()) {
        return bad("a knob is not a [type, value] pair of integers");
      }
      c.knobs.emplace_back(k[0].get<int64_t>(), k[1].get<int64_t>());
    }
    out[key] = std::move(c);
  }
  return out;
}

Status PlanCache::Load(const std::string& path) {
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::IsNotFound(text.status()) ? absl::OkStatus()
                                           : Status(text.status().code(), StrCat("cuDNN plan cache: ", text.status().message()));
  }
  StatusOr<std::map<std::string, PlanChoice>> entries = Parse(*text);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(StrCat("cuDNN plan cache '", path, "': ", entries.status().message()));
  }
  MutexLock lock(mu_);
  entries_.insert(entries->begin(), entries->end());  // held entries win
  return absl::OkStatus();
}

Status PlanCache::Save(const std::string& path) const {
  std::map<std::string, PlanChoice> merged;
  if (StatusOr<std::string> text = ReadFile(path); text.ok()) {
    if (auto current = Parse(*text); current.ok()) merged = *std::move(current);
  }
  {
    MutexLock lock(mu_);
    for (const auto& [key, c] : entries_) merged[key] = c;
  }
  const std::string context = StrCat("cuDNN plan cache '", path, "'");
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return absl::InternalError(StrCat(context, ": cannot create its folder: ", ec.message()));
  static std::atomic<int> serial{0};
  const std::string tmp = StrCat(path, ".tmp.", getpid(), ".", serial++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << Serialize(merged);
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return absl::InternalError(StrCat(context, ": cannot write '", tmp, "'"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(StrCat(context, ": rename from '", tmp, "': ", why));
  }
  return absl::OkStatus();
}

}  // namespace vigil::cuda
