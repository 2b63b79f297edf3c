// tests/testing/colour_classifier.h — a classifier whose answer is known (the crop's dominant colour) and crops to
// feed it, for the aggregator's second model (issue 20).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "vigil/video/jpeg.h"

namespace vigil::testing {

// [1, 3, 16, 16] → GlobalAveragePool → Flatten → [1, 3]: the logits are the mean of each RGB plane, so the top
// class is the crop's dominant colour (class 0 red, 1 green, 2 blue) with probability softmax of the means.
inline onnx::ModelProto ColourModel(bool with_names) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("vigil-test");
  m.add_opset_import()->set_version(17);
  if (with_names) {
    auto* meta = m.add_metadata_props();
    meta->set_key("names");
    meta->set_value("{0: 'red', 1: 'green', 2: 'blue'}");
  }
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("colour");
  auto value = [](onnx::ValueInfoProto* v, const char* name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value(g->add_input(), "images", {1, 3, 16, 16});
  value(g->add_output(), "logits", {1, 3});
  onnx::NodeProto* pool = g->add_node();
  pool->set_op_type("GlobalAveragePool");
  pool->add_input("images");
  pool->add_output("pooled");
  onnx::NodeProto* flat = g->add_node();
  flat->set_op_type("Flatten");
  flat->add_input("pooled");
  flat->add_output("logits");
  return m;
}

inline std::string Crop(uint8_t b, uint8_t g, uint8_t r, int w = 40, int h = 24) {
  video::Frame f;
  f.width = w;
  f.height = h;
  f.stride = 3 * w;
  f.bgr.resize(static_cast<size_t>(f.stride) * static_cast<size_t>(h));
  for (size_t i = 0; i < f.bgr.size(); i += 3) {
    f.bgr[i] = b;
    f.bgr[i + 1] = g;
    f.bgr[i + 2] = r;
  }
  StatusOr<std::string> jpeg = video::EncodeJpeg(f, 95);
  EXPECT_TRUE(jpeg.ok()) << jpeg.status();
  return jpeg.ok() ? *jpeg : std::string();
}

}  // namespace vigil::testing
