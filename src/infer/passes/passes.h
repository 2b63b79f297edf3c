// passes.h — graph rewrites run at load, in this order by Engine::Load:
//   FixInputShapes → DequantizeWeights → InferShapesAndFold → RemoveNoOps → SlicesToSplit → FuseConvActivation
//   → EliminateDeadNodes → InferShapesAndFold (re-types rewritten values).
// Each pass keeps the graph valid (ValidateGraph) and returns an error naming the node it could
// not handle; none of them crashes on a malformed graph. Not thread-safe (they mutate the graph).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "vigil/common/status.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

// How symbolic input dimensions are fixed. Zero means "not given".
struct ShapeOverrides {
  int64_t batch = 0;   // dim 0 of 4-D image inputs [N,C,H,W]. Default: 1 when symbolic.
  int64_t height = 0;  // dim 2 of image inputs. Default: metadata imgsz[0], else 640 (logged).
  int64_t width = 0;   // dim 3 of image inputs. Default: metadata imgsz[1], else 640 (logged).
  std::map<std::string, int64_t> symbols;   // dim_param name → value, for any input
  std::map<std::string, Shape> input_shapes;  // input name → full shape (wins over the rest)
};

// Replaces every symbolic dimension of graph inputs with a concrete value and records the input
// types in `graph.types`. A static dimension that an override contradicts is an InvalidArgument
// error naming the input, the dimension and both values; a symbolic dimension with no value is
// an InvalidArgument error naming the input and the symbol.
Status FixInputShapes(Graph& graph, const ShapeOverrides& overrides);

// What DequantizeWeights feeds the float convolution that replaces an integer one.
enum class Int8Activation : uint8_t {
  kFloat,          // x itself: no activation quantization (faster; borderline boxes differ from ONNX Runtime's)
  kFakeQuantized,  // vigil DynamicFakeQuantize(x): quantized as the DynamicQuantizeLinear defined, then
                   // dequantized; weights (W_q − W_zp)·w_scale. For float16 compute (the integer sums overflow it)
  kExactProducts,  // vigil DynamicFakeQuantize(x, centered=1) = q − zp and weights W_q − W_zp unscaled: the float
                   // convolution sums the integer products — exact while the sums stay below 2^24 — and the
                   // export's own scale Mul and bias Add follow: ONNX Runtime's arithmetic
};

// Rewrites dynamically quantized chains into float ops (YOLO-NOTES.md "Dynamically quantized models"):
//   DynamicQuantizeLinear(x) → ConvInteger(x_q, W_q, x_zp, W_zp) → Cast(float) → Mul(x_scale·w_scale) [→ Add(b)]
// becomes, by `activation`:
//   kFloat / kFakeQuantized: Conv(a, (W_q − W_zp)·w_scale) [→ Add(b)] with a = x / DynamicFakeQuantize(x);
//   kExactProducts: Conv(q − zp, W_q − W_zp) → Mul(x_scale·w_scale) [→ Add(b)], x_scale from the same
//   DynamicFakeQuantize;
// one DynamicFakeQuantize per DynamicQuantizeLinear, right after it, shared by every convolution it fed; likewise
// MatMulInteger → MatMul. QDQ weights (DequantizeLinear of an initializer) are left to constant folding.
Status DequantizeWeights(Graph& graph, Int8Activation activation);

// Walks nodes in order, computing every value's TensorType into `graph.types` with the op
// schemas' infer functions, and replaces nodes whose inputs are all known at load (initializers,
// folded values, Shape of a static tensor) by initializers computed with the reference kernels.
// Errors: Unimplemented for an op with no schema ("unsupported op 'X' (node 'n', opset N)"),
// InvalidArgument for inconsistent shapes, both naming node and op.
Status InferShapesAndFold(Graph& graph);

// Removes nodes that do not change their input: Identity, Dropout (inference), Cast to the same
// dtype, Reshape/Flatten/Squeeze/Unsqueeze whose output shape equals the input's; rewires consumers.
Status RemoveNoOps(Graph& graph);

// Sibling Slices that split one value exactly — every Slice of the value along the same single axis, step 1,
// constant bounds, their ranges tiling the axis without gap or overlap, two or more — become one Split (outputs in
// range order, named as the Slices' outputs, placed where the first Slice was): PyTorch's exporter writes
// `chunk` / `split` as Slices where Ultralytics' writes Split, and the two then compile to the same nodes.
Status SlicesToSplit(Graph& graph);

// Conv → Sigmoid → Mul(conv, sigmoid) (SiLU) and Conv → Relu become one node of domain "vigil",
// op "FusedConv": Conv's inputs and attributes plus string attribute "activation" ("SiLU",
// "Relu"). Only fuses when the Conv output has no other consumer and is not a graph output.
// First, a Conv followed by Add of a per-channel constant ([C] or [1,C,1,1]) folds that constant
// into the Conv's bias: dequantized models keep their bias as such an Add between Conv and SiLU.
Status FuseConvActivation(Graph& graph);

// Drops nodes whose outputs reach no graph output, and unused initializers.
Status EliminateDeadNodes(Graph& graph);

}  // namespace vigil::infer
