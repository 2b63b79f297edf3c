// plan_cache.h — remembered cuDNN engine choices, so a convolution is planned by timing only once.
//
// Choosing a cuDNN plan (cudnn_conv.h) finalizes and times up to `max_candidates` engine configs on
// the real buffers; for a YOLO model that is most of a 26–60 s CUDA Engine load. The choice is a
// cuDNN engine (its global index) and its knob settings (cudnnBackendKnobType_t → value), which
// rebuild the same engine config, hence the same kernel, without timing. The key (PlanKey in
// cudnn_conv.h) is a string naming everything that determines the choice: the convolution's
// ConvSpec, the cuDNN version and the device (name, compute capability, SM count).
//
// PlanCache::Global() is shared by every Engine of the process. Optionally it is kept in a file
// (EngineOptions::cudnn_plan_cache / VIGIL_CUDNN_PLAN_CACHE): Load merges the file's entries in,
// Save writes them back atomically (a temporary file in the same folder, then rename(2)). Format, a
// JSON object (nlohmann_json):
//   {"format": "vigil-cudnn-plan-cache", "version": 1,
//    "entries": {"<key>": {"engine": 17, "knobs": [[2, 3], [25, 0]]}, ...}}
// where "engine" −1 records that no engine supports the graph (the caller's fallback applies).
// Entries are never expired: a key names the cuDNN version and device, so an upgrade simply misses;
// delete the file to drop stale entries.
// Thread-safety: all methods are thread-safe. Errors: Load/Save return a Status naming the file and
// the reason (the caller warns and carries on: a cache never fails a load).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"

namespace vigil::cuda {

struct PlanChoice {
  int64_t engine = -1;                              // CUDNN_ATTR_ENGINE_GLOBAL_INDEX; −1: no engine
  std::vector<std::pair<int64_t, int64_t>> knobs;  // (cudnnBackendKnobType_t, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)
  bool operator==(const PlanChoice&) const = default;
};

// Counts of one Engine load's (or the process's) plan look-ups.
struct PlanCacheStats {
  int64_t hits = 0;             // plan rebuilt from a cached choice, nothing timed
  int64_t timed = 0;            // no usable entry: candidates timed as without a cache
  int64_t failed_restores = 0;  // an entry did not rebuild (counted in `timed` too) and was replaced
};

class PlanCache {
 public:
  static PlanCache& Global();

  std::optional<PlanChoice> Find(const std::string& key) const VIGIL_EXCLUDES(mu_);
  void Put(const std::string& key, const PlanChoice& choice) VIGIL_EXCLUDES(mu_);
  size_t size() const VIGIL_EXCLUDES(mu_);
  // Drops every entry (a fresh process's state; for tests). The totals stay.
  void Clear() VIGIL_EXCLUDES(mu_);
  // The process's plan look-ups: each load's counts added by Record.
  void Record(const PlanCacheStats& load) VIGIL_EXCLUDES(mu_);
  PlanCacheStats totals() const VIGIL_EXCLUDES(mu_);

  // Merges the entries of the file at `path` in (entries already held win). A missing file is OK;
  // an unreadable, non-JSON, foreign-format or other-version file is InvalidArgument/NotFound naming
  // the file and the reason, and nothing is merged.
  Status Load(const std::string& path) VIGIL_EXCLUDES(mu_);
  // Writes the held entries, merged over the file's current valid entries (another process may have
  // added some), to `path` atomically; creates missing parent folders.
  Status Save(const std::string& path) const VIGIL_EXCLUDES(mu_);

  // The file format on its own (for Load/Save and tests).
  static std::string Serialize(const std::map<std::string, PlanChoice>& entries);
  static StatusOr<std::map<std::string, PlanChoice>> Parse(const std::string& text);

 private:
  mutable Mutex mu_;
  std::map<std::string, PlanChoice> entries_ VIGIL_GUARDED_BY(mu_);
  PlanCacheStats totals_ VIGIL_GUARDED_BY(mu_);
};

}  // namespace vigil::cuda
