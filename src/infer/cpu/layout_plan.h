// layout_plan.h — which activations the CPU backend keeps in oneDNN's blocked layout instead of NCHW.
//
// oneDNN's fast float32 convolutions read and write channel-blocked activations, nChw{b}c with b = 16
// on AVX-512 (8 on AVX2): element (n, c, h, w) at (((n·C/b + c/b)·H + h)·W + w)·b + c%b. Given NCHW,
// they take a gemm path ~3x slower, and reordering around every convolution took ~20% of YOLOv8n's
// time, so chains of nodes that can work on blocked data keep their 4-D float32 activations blocked
// and convert only where a value leaves them. A value can be blocked only when its channel count is a
// multiple of b (no padding). Roles (BlockedRole):
//  - kAnyInput: a convolution or MaxPool that oneDNN runs; reads either layout, writes blocked;
//  - kAgnostic: nodes whose reference kernel gives the right answer on blocked data unchanged:
//    elementwise ops (Add, Mul, Sigmoid, ..., and vigil DynamicFakeQuantize: one range over all elements, then
//    elementwise) whose inputs are tensors of the output's shape or
//    one-element tensors, and Concat / Split on the channel axis when every piece's channel count is a
//    multiple of b (each image's channel range [c0, c1) is then one contiguous run in both layouts),
//    and for the same reason a Slice of the channel axis alone, step 1, from a constant multiple of b;
//  - kResize: nearest Resize / Upsample of H and W with constant scales or sizes (blocked_kernels.h).
// Rules: a kAgnostic or kResize node runs blocked only when all its 4-D activation inputs are blocked
// (iterated to a fixpoint); a kAnyInput node runs blocked when its source is blocked or some consumer
// could. A value is blocked when its producer runs blocked. A blocked value that a NCHW node reads, or
// that is a graph output, gets one conversion node (domain kCpuDomain, op kToNchwOp) right after its
// producer, whose output "<value>#nchw" the NCHW readers and the graph output use instead.
// Shapes in Graph::types stay logical [N,C,H,W] whatever the layout. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "vigil/infer/graph.h"

namespace vigil::infer {

enum class Layout : uint8_t { kNchw, kBlocked };

enum class BlockedRole : uint8_t { kNone, kAnyInput, kAgnostic, kResize };

inline constexpr const char* kCpuDomain = "vigil.cpu";
inline constexpr const char* kToNchwOp = "ToNchw";  // input 0 blocked → output 0 NCHW, same logical shape

struct LayoutPlan {
  int64_t block = 0;               // b of nChw{b}c
  Graph graph;                     // the input graph plus conversion nodes; outputs renamed to NCHW values
  std::vector<BlockedRole> roles;  // per node of `graph`: its role when it runs blocked, else kNone
  std::vector<int64_t> origin;     // per node of `graph`: its index in the input graph, -1 for conversions
  std::unordered_set<std::string> blocked_values;
};

// `onednn_runs(node)` says whether oneDNN will run a Conv / FusedConv / MaxPool node; the nodes whose
// indices are in `keep_nchw` run NCHW (the backend re-plans with a node there when its blocked kernel
// cannot be built). REQUIRES: block >= 1, graph shape-inferred, nodes topologically sorted.
LayoutPlan PlanLayouts(const Graph& graph, int64_t block, const std::function<bool(const Node&)>& onednn_runs,
                       const std::unordered_set<size_t>& keep_nchw);

}  // namespace vigil::infer
