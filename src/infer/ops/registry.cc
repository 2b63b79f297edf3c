#include <algorithm>
#include <vector>

#include "infer/op_registry.h"
#include "infer/ops/op_lists.h"

namespace vigil::infer {
namespace {

const std::vector<OpSchema>& Table() {
  static const std::vector<OpSchema> table = [] {
    std::vector<OpSchema> all;
    for (auto list : {ElementwiseOps, ReductionOps, MatrixOps, QuantOps, TensorOps, NnOps}) {
      std::vector<OpSchema> part = list();
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return table;
}

}  // namespace

const OpSchema* FindOp(std::string_view domain, std::string_view op_type) {
  if (domain == "ai.onnx") domain = "";
  for (const OpSchema& s : Table()) {
    if (s.domain == domain && s.op_type == op_type) return &s;
  }
  return nullptr;
}

std::vector<const OpSchema*> AllOps() {
  std::vector<const OpSchema*> out;
  for (const OpSchema& s : Table()) out.push_back(&s);
  return out;
}

}  // namespace vigil::infer
