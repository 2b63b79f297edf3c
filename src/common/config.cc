#include "vigil/common/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

namespace vigil {
namespace config_internal {

struct Error {
  YAML::Mark mark;
  std::string text;  // "path: reason"
};

struct MapState {
  struct Entry {
    std::string key;
    YAML::Mark key_mark;
    YAML::Node value;
    bool used = false;
  };
  YAML::Node node;
  std::string path;
  YAML::Mark mark;
  std::vector<Entry> entries;
};

struct State {
  std::string file;
  std::vector<Error> errors;
  std::deque<MapState> maps;  // deque: ConfigMap handles keep pointers to its elements

  void Add(const YAML::Mark& mark, std::string_view path, std::string_view reason) {
    errors.push_back({mark, path.empty() ? std::string(reason) : StrCat(path, ": ", reason)});
  }

  // Opening the same node twice returns the same state, so keys used through either handle count.
  MapState* Open(const YAML::Node& node, std::string path) {
    for (MapState& open : maps) {
      if (open.node.is(node)) return &open;
    }
    MapState& m = maps.emplace_back();
    m.node = node;
    m.path = std::move(path);
    m.mark = node.Mark();
    if (!node.IsMap()) return &m;  // an empty document
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) {
        Add(it->first.Mark(), m.path, "a key must be a string");
        continue;
      }
      const std::string key = it->first.Scalar();
      auto dup = std::find_if(m.entries.begin(), m.entries.end(), [&](const auto& e) { return e.key == key; });
      if (dup != m.entries.end()) {
        Add(it->first.Mark(), Join(m.path, key), StrCat("duplicate key (first at line ", dup->key_mark.line + 1, ")"));
        continue;
      }
      m.entries.push_back({key, it->first.Mark(), it->second});
    }
    return &m;
  }

  static std::string Join(std::string_view parent, std::string_view key) {
    return parent.empty() ? std::string(key) : StrCat(parent, ".", key);
  }
};

}  // namespace config_internal

using config_internal::MapState;
using config_internal::State;

namespace {

std::string Describe(const YAML::Node& n) {
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a sequence";
  if (n.IsNull()) return "nothing (null)";
  return StrCat("'", n.Scalar(), "'");
}

MapState::Entry* Find(MapState* m, std::string_view key) {
  for (auto& e : m->entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

}  // namespace

// ---- ConfigValue --------------------------------------------------------------------------------

bool ConfigValue::TypeError(std::string_view expected) const {
  state_->Add(node_.Mark(), path_, StrCat("expected ", expected, ", got ", Describe(node_)));
  return false;
}

void ConfigValue::Error(std::string_view message) const { state_->Add(node_.Mark(), path_, message); }

bool ConfigValue::As(std::string* out) const {
  if (!node_.IsScalar()) return TypeError("a string");
  *out = node_.Scalar();
  return true;
}

bool ConfigValue::As(bool* out) const {
  bool v = false;
  if (!node_.IsScalar() || !YAML::convert<bool>::decode(node_, v)) return TypeError("true or false");
  *out = v;
  return true;
}

bool ConfigValue::As(int64_t* out, int64_t min, int64_t max) const {
  int64_t v = 0;
  if (!node_.IsScalar() || !YAML::convert<int64_t>::decode(node_, v)) return TypeError("an integer");
  if (v < min || v > max) {
    Error(StrCat(v, " is out of range [", min, ", ", max, "]"));
    return false;
  }
  *out = v;
  return true;
}

bool ConfigValue::As(double* out, double min, double max) const {
  double v = 0;
  if (!node_.IsScalar() || !YAML::convert<double>::decode(node_, v)) return TypeError("a number");
  if (!(v >= min && v <= max)) {
    Error(StrCat(node_.Scalar(), " is out of range [", min, ", ", max, "]"));
    return false;
  }
  *out = v;
  return true;
}

bool ConfigValue::AsOneOf(std::string* out, std::initializer_list<std::string_view> allowed) const {
  std::string s;
  if (!As(&s)) return false;
  if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
    std::string list;
    for (std::string_view a : allowed) list += StrCat(list.empty() ? "" : ", ", a);
    Error(StrCat("'", s, "' is not one of: ", list));
    return false;
  }
  *out = std::move(s);
  return true;
}

bool ConfigValue::AsHostPort(std::string* host, uint16_t* port) const {
  std::string s;
  if (!As(&s)) return false;
  size_t colon = std::string::npos;
  std::string h;
  if (!s.empty() && s[0] == '[') {  // [IPv6]:port
    const size_t close = s.find(']');
    if (close != std::string::npos && close + 1 < s.size() && s[close + 1] == ':') {
      colon = close + 1;
      h = s.substr(1, close - 1);
    }
  } else if (s.find(':') == s.rfind(':')) {  // host:port with exactly one colon
    colon = s.find(':');
    if (colon != std::string::npos) h = s.substr(0, colon);
  }
  if (colon == std::string::npos) {
    Error(StrCat("expected host:port (e.g. 0.0.0.0:7400 or [::1]:7400), got '", s, "'"));
    return false;
  }
  const std::string p = s.substr(colon + 1);
  int64_t v = -1;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || ec == std::errc::invalid_argument || end != p.data() + p.size()) {
    Error(StrCat("port '", p, "' is not an integer"));
    return false;
  }
  if (ec == std::errc::result_out_of_range || v < 0 || v > 65535) {
    Error(StrCat("port ", p, " is out of range [0, 65535]"));
    return false;
  }
  *host = std::move(h);
  *port = static_cast<uint16_t>(v);
  return true;
}

std::vector<ConfigValue> ConfigValue::Items() const {
  if (!node_.IsSequence()) {
    TypeError("a sequence");
    return {};
  }
  std::vector<ConfigValue> items;
  for (size_t i = 0; i < node_.size(); ++i) items.push_back(ConfigValue(state_, node_[i], StrCat(path_, "[", i, "]")));
  return items;
}

std::optional<ConfigMap> ConfigValue::AsMap() const {
  if (!node_.IsMap()) {
    TypeError("a map");
    return std::nullopt;
  }
  return ConfigMap(state_, state_->Open(node_, path_));
}

// ---- ConfigMap ----------------------------------------------------------------------------------

const std::string& ConfigMap::path() const { return map_->path; }

bool ConfigMap::Has(std::string_view key) const { return Find(map_, key) != nullptr; }

std::vector<std::string> ConfigMap::Keys() const {
  std::vector<std::string> out;
  out.reserve(map_->entries.size());
  for (const MapState::Entry& e : map_->entries) out.push_back(e.key);
  return out;
}

std::optional<ConfigValue> ConfigMap::Value(std::string_view key, Need need) const {
  MapState::Entry* e = Find(map_, key);
  if (e == nullptr) {
    if (need == kRequired) state_->Add(map_->mark, map_->path, StrCat("missing required key '", key, "'"));
    return std::nullopt;
  }
  e->used = true;
  return ConfigValue(state_, e->value, State::Join(map_->path, key));
}

bool ConfigMap::Get(std::string_view key, std::string* out, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  return v && v->As(out);
}

bool ConfigMap::Get(std::string_view key, bool* out, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  return v && v->As(out);
}

bool ConfigMap::Get(std::string_view key, double* out, double min, double max, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  return v && v->As(out, min, max);
}

bool ConfigMap::Get(std::string_view key, std::vector<std::string>* out, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  if (!v) return false;
  if (!v->IsSequence()) return v->TypeError("a sequence of strings");
  std::vector<std::string> items;
  bool ok = true;
  for (const ConfigValue& item : v->Items()) ok = item.As(&items.emplace_back()) && ok;
  if (ok) *out = std::move(items);
  return ok;
}

bool ConfigMap::GetOneOf(std::string_view key, std::string* out, std::initializer_list<std::string_view> allowed,
                         Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  return v && v->AsOneOf(out, allowed);
}

bool ConfigMap::GetHostPort(std::string_view key, std::string* host, uint16_t* port, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  return v && v->AsHostPort(host, port);
}

std::optional<ConfigMap> ConfigMap::Map(std::string_view key, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  if (!v) return std::nullopt;
  return v->AsMap();
}

std::vector<ConfigMap> ConfigMap::Maps(std::string_view key, Need need) const {
  std::optional<ConfigValue> v = Value(key, need);
  std::vector<ConfigMap> maps;
  if (!v) return maps;
  for (const ConfigValue& item : v->Items()) {
    if (std::optional<ConfigMap> m = item.AsMap()) maps.push_back(*m);
  }
  return maps;
}

void ConfigMap::Error(std::string_view key, std::string_view message) const {
  if (std::optional<ConfigValue> v = Value(key)) return v->Error(message);
  state_->Add(map_->mark, State::Join(map_->path, key), message);
}

// ---- ConfigFile ---------------------------------------------------------------------------------

ConfigFile::ConfigFile(std::unique_ptr<State> state) : state_(std::move(state)) {}
ConfigFile::ConfigFile(ConfigFile&&) noexcept = default;
ConfigFile& ConfigFile::operator=(ConfigFile&&) noexcept = default;
ConfigFile::~ConfigFile() = default;

StatusOr<ConfigFile> ConfigFile::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot open configuration file: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

StatusOr<ConfigFile> ConfigFile::Parse(std::string_view text, std::string name) {
  auto state = std::make_unique<State>();
  state->file = std::move(name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat(state->file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  if (!root.IsMap() && !root.IsNull()) {
    return absl::InvalidArgumentError(
        StrCat(state->file, ": the top level must be a map of keys, got ", Describe(root)));
  }
  state->Open(root, "");
  return ConfigFile(std::move(state));
}

ConfigMap ConfigFile::root() const { return ConfigMap(state_.get(), &state_->maps.front()); }

Status ConfigFile::Finish() const {
  std::vector<config_internal::Error> errors = state_->errors;
  for (const MapState& m : state_->maps) {
    for (const auto& e : m.entries) {
      if (!e.used) errors.push_back({e.key_mark, StrCat(State::Join(m.path, e.key), ": unknown key")});
    }
  }
  if (errors.empty()) return absl::OkStatus();
  std::stable_sort(errors.begin(), errors.end(), [](const auto& a, const auto& b) {
    return std::pair(a.mark.line, a.mark.column) < std::pair(b.mark.line, b.mark.column);
  });
  std::string msg;
  for (const auto& e : errors) {
    if (!msg.empty()) msg += "\n";
    msg += e.mark.is_null() ? StrCat(state_->file, ": ", e.text)
                            : StrCat(state_->file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.text);
  }
  return absl::InvalidArgumentError(msg);
}

}  // namespace vigil
