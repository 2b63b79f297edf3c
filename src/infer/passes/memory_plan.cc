// memory_plan.cc — PlanMemory (memory_plan.h): greedy-by-size offset assignment over lifetime
// intervals (the "greedy by size" strategy of Pisarchyk & Lee, "Efficient Memory Management for
// Deep Neural Net Inference", 2020, arXiv:2001.03288).
#include "infer/passes/memory_plan.h"

#include <algorithm>

namespace vigil::infer {
namespace {

struct Value {
  std::string name;
  size_t bytes = 0;   // rounded up to the alignment
  size_t first = 0;   // index of the producing node
  size_t last = 0;    // index of the last consuming node (nodes.size() for graph outputs)
  size_t offset = 0;
};

}  // namespace

MemoryPlan PlanMemory(const Graph& graph, size_t alignment) {
  std::vector<Value> values;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const std::string& in : graph.nodes[i].inputs) {
      auto it = index.find(in);
      if (!in.empty() && it != index.end()) values[it->second].last = i;
    }
    for (const std::string& out : graph.nodes[i].outputs) {
      auto t = graph.types.find(out);
      if (out.empty() || t == graph.types.end() || graph.IsInitializer(out)) continue;
      const size_t bytes = static_cast<size_t>(NumElements(t->second.shape)) * DTypeSize(t->second.dtype);
      index[out] = values.size();
      values.push_back(Value{out, (bytes + alignment - 1) / alignment * alignment, i, i, 0});
    }
  }
  for (const ValueInfo& out : graph.outputs) {
    auto it = index.find(out.name);
    if (it != index.end()) values[it->second].last = graph.nodes.size();
  }

  std::vector<size_t> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a].bytes > values[b].bytes; });

  MemoryPlan plan;
  std::vector<size_t> placed;  // indices into `values`, in placement order
  for (size_t v : order) {
    Value& cur = values[v];
    // Blocks of already placed values whose lifetimes overlap this one, by offset.
    std::vector<const Value*> busy;
    for (size_t p : placed) {
      const Value& o = values[p];
      if (o.first <= cur.last && cur.first <= o.last) busy.push_back(&o);
    }
    std::sort(busy.begin(), busy.end(), [](const Value* a, const Value* b) { return a->offset < b->offset; });
    size_t offset = 0;  // first fit: the lowest gap that holds the value
    for (const Value* o : busy) {
      if (o->offset >= offset + cur.bytes) break;
      offset = std::max(offset, o->offset + o->bytes);
    }
    cur.offset = offset;
    placed.push_back(v);
    plan.offsets[cur.name] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + cur.bytes);
    plan.unshared_bytes += cur.bytes;
  }
  return plan;
}

}  // namespace vigil::infer
