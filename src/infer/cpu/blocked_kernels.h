// blocked_kernels.h — kernels for 4-D float32 activations in oneDNN's blocked layout nChw{b}c
// (layout_plan.h) that no reference kernel can run unchanged: nearest-neighbour Resize / Upsample of
// H and W.
//
// Tensors keep their logical [N,C,H,W] shapes; element (n, c, h, w) lives at
// (((n·C/b + c/b)·H + h)·W + w)·b + c%b. The source pixel of every output pixel is found once, at
// creation, by running the node's reference kernel (op_registry.h) on a tensor whose values are the
// element indices, so the coordinate transformation and rounding rules are exactly the reference's
// (ONNX Resize-10..19, Upsample-7/9).
// Thread-safety: creation is thread-safe; a kernel runs one call at a time (OpenMP inside).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "infer/cpu/cpu_backend.h"
#include "vigil/common/status.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

// For a nearest Resize / Upsample of H and W that keeps N and C: per output pixel oh·OW + ow of one
// plane, its source pixel ih·W + iw, found with the reference kernel as described above (also used by
// the CUDA backend). Errors: as CreateBlockedResize.
StatusOr<std::vector<int64_t>> NearestResizeSources(const Node& node, const Graph& graph, int64_t opset);

// The blocked kernel (b = `block`) of a Resize / Upsample node whose role is kResize (PlanLayouts).
// Errors: InvalidArgument naming the node when the reference kernel's result is not a per-plane
// copy of source pixels, or the input has 2^24 elements or more (indices must be exact in float32);
// the reference kernel's own error.
StatusOr<std::unique_ptr<CpuKernel>> CreateBlockedResize(const Node& node, const Graph& graph, int64_t opset,
                                                         int64_t block);

}  // namespace vigil::infer
