// vigil/common/config.h — reading YAML configuration files (yaml-cpp) with validation.
//
// The code that reads a config is its schema: it asks a ConfigMap for each key it knows, with the
// expected type and range, and ConfigFile::Finish() then reports, in file order, every problem found:
// a wrong type, an out-of-range value, a missing required key, a duplicate key, and every key of an
// opened map that nobody asked for (an unknown key, usually a typo). Each error names the file, the
// 1-based line:column of the offending node, and the key path ("streams[2].roi[0][1]"):
//
//   agg.yaml:4:9: http: port 70000 is out of range [0, 65535]
//   agg.yaml:7:1: lisen: unknown key
//
//   StatusOr<ConfigFile> file = ConfigFile::Load("agg.yaml");
//   ConfigMap root = file->root();
//   root.GetHostPort("listen", &cfg.host, &cfg.port);                  // optional: default stays
//   root.Get("db", &cfg.db_path, ConfigMap::kRequired);
//   for (ConfigMap s : root.Maps("streams")) s.Get("fps", &fps, 0.0, 1000.0);
//   VIGIL_RETURN_IF_ERROR(file->Finish());
//
// A getter never throws and never aborts: it returns true when it stored a value, false when the key
// is absent or invalid (the caller's default stays in *out), and records the error for Finish().
// An empty file reads as an empty map.
//
// Ownership: ConfigMap and ConfigValue are handles into their ConfigFile; they must not outlive it.
// Thread-safety: a ConfigFile and its handles are used from one thread at a time.
// Errors: Load → NotFound (unreadable file) or InvalidArgument (YAML syntax error, root not a map);
// Finish → InvalidArgument with one error per line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"

namespace vigil {

namespace config_internal {
struct State;
struct MapState;
}  // namespace config_internal

class ConfigMap;

// One YAML node and its key path; the typed accessors validate and record errors.
class ConfigValue {
 public:
  const std::string& path() const { return path_; }
  bool IsNull() const { return node_.IsNull(); }
  bool IsScalar() const { return node_.IsScalar(); }
  bool IsSequence() const { return node_.IsSequence(); }
  bool IsMap() const { return node_.IsMap(); }

  // Scalar → *out. Errors: "expected a string, got a map".
  bool As(std::string* out) const;
  // YAML 1.1 booleans (true/false/yes/no/on/off).
  bool As(bool* out) const;
  // An integer in [min, max]. Errors: not an integer, out of range.
  bool As(int64_t* out, int64_t min, int64_t max) const;
  template <std::integral T>
  bool As(T* out, T min, T max) const {
    static_assert(std::is_signed_v<T> || sizeof(T) < sizeof(int64_t), "uint64_t does not fit int64_t");
    int64_t v = 0;
    if (!As(&v, static_cast<int64_t>(min), static_cast<int64_t>(max))) return false;
    *out = static_cast<T>(v);
    return true;
  }
  // A finite or infinite number in [min, max]; NaN is always out of range.
  bool As(double* out, double min, double max) const;
  // A string equal to one of `allowed`. Errors list the allowed values.
  bool AsOneOf(std::string* out, std::initializer_list<std::string_view> allowed) const;
  // "host:port", "[v6addr]:port" or ":port" (host empty = all interfaces); port in [0, 65535],
  // 0 meaning "any free port".
  bool AsHostPort(std::string* host, uint16_t* port) const;
  // The items of a sequence (paths "key[i]"); records an error and returns {} for anything else.
  std::vector<ConfigValue> Items() const;
  // The value as a map (its keys are checked by Finish); nullopt and an error for anything else.
  std::optional<ConfigMap> AsMap() const;

  // Records a custom validation error at this node ("must be smaller than max_wait_ms").
  void Error(std::string_view message) const;

 private:
  friend class ConfigMap;
  ConfigValue(config_internal::State* state, YAML::Node node, std::string path)
      : state_(state), node_(std::move(node)), path_(std::move(path)) {}
  bool TypeError(std::string_view expected) const;

  config_internal::State* state_;
  YAML::Node node_;
  std::string path_;
};

// A YAML map whose keys are consumed by the getters below. Each getter with a key that is absent
// leaves *out unchanged and returns false, recording "missing required key" when need is kRequired.
class ConfigMap {
 public:
  enum Need { kOptional, kRequired };

  const std::string& path() const;  // "" for the root
  bool Has(std::string_view key) const;
  // The keys present, in file order (a map of free keys, e.g. label → label; each is known once a getter read it).
  std::vector<std::string> Keys() const;
  // The value at `key`, marking the key as known. nullopt when absent (error if kRequired).
  std::optional<ConfigValue> Value(std::string_view key, Need need = kOptional) const;

  bool Get(std::string_view key, std::string* out, Need need = kOptional) const;
  bool Get(std::string_view key, bool* out, Need need = kOptional) const;
  template <std::integral T>
  bool Get(std::string_view key, T* out, T min, T max, Need need = kOptional) const {
    std::optional<ConfigValue> v = Value(key, need);
    return v && v->As(out, min, max);
  }
  bool Get(std::string_view key, double* out, double min, double max, Need need = kOptional) const;
  // A sequence of scalars.
  bool Get(std::string_view key, std::vector<std::string>* out, Need need = kOptional) const;
  bool GetOneOf(std::string_view key, std::string* out, std::initializer_list<std::string_view> allowed,
                Need need = kOptional) const;
  bool GetHostPort(std::string_view key, std::string* host, uint16_t* port, Need need = kOptional) const;
  // A nested map; nullopt when absent or not a map.
  std::optional<ConfigMap> Map(std::string_view key, Need need = kOptional) const;
  // A sequence of maps; items that are not maps are reported and skipped.
  std::vector<ConfigMap> Maps(std::string_view key, Need need = kOptional) const;

  // Records a custom error at `key`'s value (or at this map when the key is absent).
  void Error(std::string_view key, std::string_view message) const;

 private:
  friend class ConfigValue;
  friend class ConfigFile;
  ConfigMap(config_internal::State* state, config_internal::MapState* map) : state_(state), map_(map) {}

  config_internal::State* state_;
  config_internal::MapState* map_;
};

class ConfigFile {
 public:
  // Reads and parses `path`.
  static StatusOr<ConfigFile> Load(const std::string& path);
  // Parses `text`; `name` stands for the file in messages.
  static StatusOr<ConfigFile> Parse(std::string_view text, std::string name);

  ConfigFile(ConfigFile&&) noexcept;
  ConfigFile& operator=(ConfigFile&&) noexcept;
  ~ConfigFile();

  ConfigMap root() const;
  // OK when no getter found a problem and every key of every opened map was asked for; otherwise
  // InvalidArgument listing all problems in file order, one per line.
  Status Finish() const;

 private:
  explicit ConfigFile(std::unique_ptr<config_internal::State> state);
  std::unique_ptr<config_internal::State> state_;
};

}  // namespace vigil
