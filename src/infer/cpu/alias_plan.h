// alias_plan.h — values the CPU backend stores inside other values instead of copying them.
//
// When every dimension before the axis is 1 (batch 1 on the channel axis: YOLO's C2f / SPPF / neck
// concatenations), Concat's inputs and Split's outputs are contiguous byte ranges of the larger
// tensor, in NCHW and in the blocked layout alike (layout_plan.h: blocked pieces hold whole channel
// blocks). Reshape / Flatten / Squeeze / Unsqueeze keep the bytes. So:
//  - a Split output, or a reshaped value, lives inside its input (the node then does nothing);
//  - a Concat input lives inside the output at its slot when the whole value it lives in ("root")
//    covers exactly a run of consecutive slots — a Split's input whose outputs are concatenated back
//    in order goes in whole; such a Concat copies only its other inputs.
// Only values produced by nodes (arena values) are placed; graph inputs and initializers never are.
// Aliased values are read-only like all values: a node never writes its inputs, so sharing is safe
// as long as the root stays allocated until the last reader of any value inside it, which
// PlanningGraph arranges for PlanMemory (memory_plan.h).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "infer/cpu/cpu_backend.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

struct Placement {
  std::string root;  // a value that lives in the arena on its own
  size_t offset = 0;  // bytes from the root's start
};

struct AliasPlan {
  std::unordered_map<std::string, Placement> placed;  // values stored inside a root (roots are absent)
  // Per node: true when the node's kernel is replaced by an alias kernel (CreateAliasKernel) because it
  // is a Split / reshape whose outputs are all placed, or a Concat with at least one placed input.
  std::vector<bool> aliased;
};

// REQUIRES: graph shape-inferred (types of every value), nodes topologically sorted.
AliasPlan PlanAliases(const Graph& graph);

// The graph PlanMemory should size: every value renamed to its root, a root produced by the first node
// producing any value inside it, so that the root lives from there to the last reader of any of them.
// Its nodes are index-aligned with `graph.nodes`; it is not meant to run.
Graph PlanningGraph(const Graph& graph, const AliasPlan& aliases);

// The root and byte offset of `value` (itself at 0 when not placed).
Placement Locate(const AliasPlan& aliases, const std::string& value);

// The kernel of a node with AliasPlan::aliased set: copies each Concat input, Split output or
// reshaped value whose bytes are not already where they belong (compared by address), so it is
// correct whatever was placed. Kernel name "alias".
std::unique_ptr<CpuKernel> CreateAliasKernel(const Node& node);

}  // namespace vigil::infer
