// cpu_backend.h — internals of the CPU backend (CreateCpuBackend in infer/backend.h).
//
// Compile (cpu_backend.cc) takes a shape-inferred graph with static shapes and:
//  - with oneDNN (built with VIGIL_HAVE_ONEDNN and CompileOptions::use_onednn), plans which 4-D
//    activations stay in oneDNN's blocked layout and where they are converted back to NCHW
//    (layout_plan.h);
//  - binds every node to a CpuKernel: oneDNN (onednn_kernels.h) for Conv / vigil FusedConv / MaxPool
//    and the blocked → NCHW conversions, a blocked kernel (blocked_kernels.h) for nearest Resize on
//    blocked data, else the op's reference RunFn (op_registry.h), also on blocked data where the
//    result is the same (layout_plan.h: kAgnostic). When a fast kernel
//    cannot be built the node is re-planned NCHW on the reference kernel, and one warning per compile
//    names the first such node;
//  - stores Concat inputs, Split outputs and reshaped values inside the tensor they are part of where
//    they are contiguous in it (alias_plan.h; the node then copies nothing or less);
//  - plans one 64-byte-aligned arena for every other node output, conversions included (PlanMemory,
//    memory_plan.h): node outputs are views into it, graph inputs are views of the caller's tensors
//    (never written), initializers are tensors shared with the graph (no copy). Graph outputs are
//    copied out of the arena by Run.
// Threads: CompileOptions::threads (0 = the CPUs of the process's affinity mask) is applied with
// omp_set_num_threads() at Compile and at the start of every Run, on the calling thread. That OpenMP
// setting belongs to the calling thread and stays after the call: any other OpenMP code later run
// on that thread (another engine, the reference kernels, oneDNN) uses the same count. oneDNN here
// uses OpenMP, and its primitives must not run with more threads than they were created with, hence
// the Run-time call. Every oneDNN primitive and parallel reference kernel is an OpenMP fork-join, so
// when other processes keep the same cores busy, each join waits for a preempted worker: YOLOv8n 640
// with 2 threads on a 2-core host running two compilers took ~700 ms a run instead of ~60 ms
// (OMP_WAIT_POLICY=passive, read at process start: ~230 ms; 1 thread: ~150 ms). Use fewer threads
// than busy cores there.
// Profile: with CompileOptions::profile, each node's wall time (std::chrono::steady_clock) is summed
// over calls; without it no clock is read. Conversions appear as nodes of op type "ToNchw".
#pragma once

#include <span>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"

namespace vigil::infer {

// One node's compiled kernel. Run receives the node's inputs and outputs index-aligned with
// Node::inputs / Node::outputs (an omitted optional one is an undefined Tensor); outputs are
// preallocated with the inferred dtype and shape. A kernel writes its outputs, never its inputs.
// Thread-safety: used by one Run at a time. Errors: the kernel's Status (Internal for oneDNN failures).
class CpuKernel {
 public:
  virtual ~CpuKernel() = default;
  // "onednn", "blocked" (blocked_kernels.h), "alias" (alias_plan.h) or "reference": NodeTiming::kernel.
  virtual std::string_view name() const = 0;
  virtual Status Run(std::span<const Tensor> inputs, std::span<Tensor> outputs) = 0;
};

}  // namespace vigil::infer
