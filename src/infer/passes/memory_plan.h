// memory_plan.h — static memory plan: one arena, an offset per intermediate value.
//
// Values are node outputs (not graph inputs or initializers). A value is live from the node
// that produces it to its last consumer; graph outputs stay live to the end. Offsets are assigned
// greedily (largest first, first fit among non-overlapping lifetimes), aligned to `alignment`
// bytes, so buffers of values whose lifetimes do not overlap are reused.
// REQUIRES: graph.types complete (after InferShapesAndFold); nodes topologically sorted.
// Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>

#include "vigil/infer/graph.h"

namespace vigil::infer {

struct MemoryPlan {
  size_t arena_bytes = 0;                           // total arena size in bytes
  size_t unshared_bytes = 0;                        // sum of all value sizes (what no reuse would take)
  std::unordered_map<std::string, size_t> offsets;  // value name → byte offset in the arena
};

MemoryPlan PlanMemory(const Graph& graph, size_t alignment = 64);

}  // namespace vigil::infer
