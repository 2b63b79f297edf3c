// onednn_kernels.h — oneDNN 2.x fast paths of the CPU backend: 2-D float32 convolution (ONNX Conv and
// vigil FusedConv with bias and a fused SiLU / Relu / LeakyRelu) and 2-D float32 MaxPool.
//
// Weights are reordered once, at creation, into the layout oneDNN picks for the primitive
// (format_tag::any). The caller says in which layout (NCHW or blocked nChw{b}c, layout_plan.h) the
// source and the destination live in the arena. A convolution runs on exactly those layouts when
// oneDNN has a fast kernel for them (jit / brgconv; gemm only for pointwise 1x1 convolutions, which
// need no im2col); otherwise (e.g. a 3x3 on NCHW, where oneDNN would take an im2col + gemm path ~3x
// slower) in the layouts oneDNN picks, reordering its source in and its result out through the shared
// OnednnScratch. MaxPool runs on the source's layout.
// Formulas: ONNX Conv / MaxPool (https://onnx.ai/onnx/operators/onnx__Conv.html, onnx__MaxPool.html):
// y[n, oc, oh, ow] = b[oc] + Σ x[n, g·C/G + ic, oh·s − pad_top + kh·d, ...] · w[oc, ic, kh, kw];
// SiLU(x) = x·sigmoid(x) (oneDNN eltwise_swish with alpha 1), LeakyRelu = eltwise_relu with alpha.
//
// Compiled only with VIGIL_HAVE_ONEDNN. Thread-safety: creation is thread-safe; a kernel runs one call
// at a time. Threads: primitives use OpenMP with omp_get_max_threads() of the creating thread; callers
// must run them with no more threads than that (cpu_backend.cc sets the same count before both).
#pragma once

#ifdef VIGIL_HAVE_ONEDNN

#include <cstddef>
#include <memory>

#include "infer/cpu/cpu_backend.h"
#include "infer/cpu/layout_plan.h"
#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

// 64-byte-aligned scratch memory shared by the oneDNN kernels of one compiled model, for activations
// held in a primitive's own layout during one kernel call (kernels run one at a time).
// Reserve during compilation; data() is stable once compilation is over.
class OnednnScratch {
 public:
  void Reserve(size_t bytes);
  void* data() { return buffer_.raw(); }
  size_t bytes() const { return buffer_.nbytes(); }

 private:
  Tensor buffer_;
};

// The channel block b of the blocked layout oneDNN's float32 kernels use on this CPU: 16 with AVX-512,
// else 8.
int64_t OnednnChannelBlock();

// True when CreateOnednnKernel builds a primitive for `node` unless oneDNN itself refuses: see below.
bool OnednnHandles(const Node& node, const Graph& graph);

// A oneDNN kernel for `node` (types from graph.types, weights from graph.initializers) reading its
// source (input 0) in layout `src` and writing its output in layout `dst` (blocked: b = `block`):
//  - nullptr when the node is not one oneDNN handles here: not Conv / vigil FusedConv / MaxPool, not
//    4-D float32, non-constant weights or bias, an activation without an eltwise equivalent, a MaxPool
//    Indices output, padding that oneDNN cannot express;
//  - an error (Internal naming the node and oneDNN's message) when oneDNN refused to create the
//    primitive; the caller falls back to the reference kernel.
StatusOr<std::unique_ptr<CpuKernel>> CreateOnednnKernel(const Node& node, const Graph& graph, Layout src, Layout dst,
                                                        int64_t block, const std::shared_ptr<OnednnScratch>& scratch);

// A kernel copying a 4-D float32 tensor of logical shape `shape` ([N,C,H,W]) from layout `from` to
// layout `to` (a oneDNN reorder). `label` names it in errors.
StatusOr<std::unique_ptr<CpuKernel>> CreateOnednnReorder(const Shape& shape, Layout from, Layout to, int64_t block,
                                                         std::string label,
                                                         const std::shared_ptr<OnednnScratch>& scratch);

}  // namespace vigil::infer

#endif  // VIGIL_HAVE_ONEDNN
