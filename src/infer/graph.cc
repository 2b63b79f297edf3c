// graph.cc — Node attribute accessors, validation and topological sorting (graph.h).
#include "vigil/infer/graph.h"

#include <queue>
#include <unordered_set>


namespace vigil::infer {

int64_t Node::GetInt(const std::string& key, int64_t fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return *v;
  return fallback;
}

float Node::GetFloat(const std::string& key, float fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (const auto* f = std::get_if<float>(&it->second)) return *f;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<float>(*i);
  return fallback;
}

std::string Node::GetString(const std::string& key, const std::string& fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return fallback;
}

std::vector<int64_t> Node::GetInts(const std::string& key, const std::vector<int64_t>& fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  return fallback;
}

std::vector<float> Node::GetFloats(const std::string& key, const std::vector<float>& fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (const auto* f = std::get_if<std::vector<float>>(&it->second)) return *f;
  if (const auto* i = std::get_if<std::vector<int64_t>>(&it->second)) return {i->begin(), i->end()};
  return fallback;
}

const Tensor* Node::GetTensor(const std::string& key) const {
  auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : std::get_if<Tensor>(&it->second);
}

size_t Node::NumInputs() const {
  size_t n = inputs.size();
  while (n > 0 && inputs[n - 1].empty()) --n;
  return n;
}

std::string Node::Describe() const { return StrCat("node '", name, "' (", op_type, ")"); }

std::string Node::QualifiedOpType() const {
  return domain.empty() || domain == "ai.onnx" ? op_type : StrCat(domain, ".", op_type);
}

const Tensor* Graph::FindInitializer(const std::string& name) const {
  auto it = initializers.find(name);
  return it == initializers.end() ? nullptr : &it->second;
}

Status ValidateGraph(const Graph& graph) {
  std::unordered_set<std::string> available;
  for (const ValueInfo& in : graph.inputs) {
    if (graph.IsInitializer(in.name)) {
      return absl::InvalidArgumentError(StrCat("graph input '", in.name, "' is also an initializer"));
    }
    if (!available.insert(in.name).second) {
      return absl::InvalidArgumentError(StrCat("graph input '", in.name, "' is declared twice"));
    }
  }
  for (const auto& [name, tensor] : graph.initializers) available.insert(name);
  for (const Node& node : graph.nodes) {
    for (const std::string& in : node.inputs) {
      if (!in.empty() && !available.count(in)) {
        return absl::InvalidArgumentError(StrCat(
            node.Describe(), ": input '", in,
            "' is not a graph input, an initializer or the output of an earlier node"));
      }
    }
    for (const std::string& out : node.outputs) {
      if (!out.empty() && !available.insert(out).second) {
        return absl::InvalidArgumentError(StrCat(
            node.Describe(), ": output '", out, "' is already defined by a graph input, an initializer or another node"));
      }
    }
  }
  for (const ValueInfo& out : graph.outputs) {
    if (!available.count(out.name)) {
      return absl::InvalidArgumentError(StrCat("graph output '", out.name, "' is not produced by any node"));
    }
  }
  return absl::OkStatus();
}

// Kahn's algorithm with a min-heap of node indices, so ready nodes leave in file order.
Status TopologicalSort(Graph& graph) {
  const size_t n = graph.nodes.size();
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& out : graph.nodes[i].outputs) {
      if (out.empty()) continue;
      if (!producer.emplace(out, i).second) {
        return absl::InvalidArgumentError(StrCat(graph.nodes[i].Describe(), ": output '", out,
                                                       "' is also produced by ",
                                                       graph.nodes[producer[out]].Describe()));
      }
    }
  }
  std::unordered_set<std::string> inputs;
  for (const ValueInfo& in : graph.inputs) inputs.insert(in.name);

  std::vector<std::vector<size_t>> consumers(n);
  std::vector<size_t> pending(n, 0);  // inputs of node i whose producer has not been emitted
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    for (const std::string& in : node.inputs) {
      if (in.empty()) continue;
      auto it = producer.find(in);
      if (it != producer.end()) {
        consumers[it->second].push_back(i);
        ++pending[i];
      } else if (!inputs.count(in) && !graph.IsInitializer(in)) {
        return absl::InvalidArgumentError(StrCat(
            node.Describe(), ": input '", in, "' is not a graph input, an initializer or any node's output"));
      }
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t c : consumers[i]) {
      if (--pending[c] == 0) ready.push(c);
    }
  }
  if (order.size() < n) {
    // Every unsorted node waits on an unsorted producer; following those links from any of them
    // must revisit a node, and that node lies on a cycle.
    size_t i = 0;
    while (pending[i] == 0) ++i;
    std::vector<bool> seen(n, false);
    std::string via;
    while (!seen[i]) {
      seen[i] = true;
      for (const std::string& in : graph.nodes[i].inputs) {
        auto it = producer.find(in);
        if (!in.empty() && it != producer.end() && pending[it->second] != 0) {
          i = it->second;
          via = in;
          break;
        }
      }
    }
    return absl::InvalidArgumentError(StrCat(graph.nodes[i].Describe(), " is on a cycle (through value '",
                                                   via, "')"));
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(graph.nodes[i]));
  graph.nodes = std::move(sorted);
  return absl::OkStatus();
}

}  // namespace vigil::infer
