// op_lists.h — the per-file op tables that registry.cc assembles (see op_registry.h).
#pragma once

#include <vector>

#include "infer/op_registry.h"

namespace vigil::infer {

std::vector<OpSchema> ElementwiseOps();  // ops/elementwise.cc: unary, binary (broadcasting), Cast, Where, comparisons
std::vector<OpSchema> ReductionOps();    // ops/reduction.cc: Reduce*, ArgMax/ArgMin, Softmax, LogSoftmax
std::vector<OpSchema> MatrixOps();       // ops/matrix.cc: MatMul, Gemm, MatMulInteger
std::vector<OpSchema> QuantOps();        // ops/quant.cc: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, ConvInteger
std::vector<OpSchema> TensorOps();       // ops/tensor_ops.cc: Shape, Reshape, Concat, Split, Slice, Transpose, Gather, TopK, ...
std::vector<OpSchema> NnOps();           // ops/nn.cc: Conv, vigil FusedConv, MaxPool, AveragePool, Resize, ...

}  // namespace vigil::infer
