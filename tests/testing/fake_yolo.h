// tests/testing/fake_yolo.h — a stand-in YOLO model whose detections can be computed by hand, and the
// images that drive it (detector and pipeline tests).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "vigil/common/tensor.h"
#include "vigil/detect/image.h"
#include "vigil/infer/graph.h"

namespace vigil::testing_fakes {

// A stand-in YOLO whose output is a reshaped slice of its input, so detections can be computed by
// hand: images [B,3,64,64] → Reshape [B,6,2048] → Slice [:, :, 0:84] → ×(64,64,64,64,1,1) per row →
// output0 [B,6,84], Ultralytics anchor-free layout with 2 classes. Box n's fields come from pixels
// of the letterboxed (RGB, /255) input: row f of the output is flat element f·2048 + n of the
// image, i.e. channel f/2, image row (f%2)·32 + n/64, column n%64 (fields: cx, cy ← red;
// w, h ← green; class 0, class 1 ← blue). A float16 variant casts its input to float first.
inline infer::Graph FakeYolo(DType input_dtype) {
  infer::Graph g;
  g.opset = 13;
  g.inputs.push_back({"images", input_dtype, {{-1, "batch"}, {3, ""}, {64, ""}, {64, ""}}, true});
  g.outputs.push_back({"output0", DType::kFloat32, {}, false});
  g.initializers["shape"] = Tensor::FromVector<int64_t>({0, 6, 2048}, {3});
  g.initializers["starts"] = Tensor::FromVector<int64_t>({0}, {1});
  g.initializers["ends"] = Tensor::FromVector<int64_t>({84}, {1});
  g.initializers["axes"] = Tensor::FromVector<int64_t>({2}, {1});
  g.initializers["scale"] = Tensor::FromVector<float>({64, 64, 64, 64, 1, 1}, {1, 6, 1});
  const auto node = [&](std::string op, std::vector<std::string> in, std::string out) {
    infer::Node n;
    n.name = op;
    n.op_type = std::move(op);
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    g.nodes.push_back(std::move(n));
  };
  std::string x = "images";
  if (input_dtype != DType::kFloat32) {
    node("Cast", {x}, "images_f32");
    g.nodes.back().attrs["to"] = int64_t{1};  // TensorProto FLOAT
    x = "images_f32";
  }
  node("Reshape", {x, "shape"}, "reshaped");
  node("Slice", {"reshaped", "starts", "ends", "axes"}, "sliced");
  node("Mul", {"sliced", "scale"}, "output0");
  return g;
}

// A 64×64 image with one candidate box at grid index n (n < 128): fields as FakeYolo reads them.
inline detect::Image FakeImage(int n, uint8_t cx, uint8_t cy, uint8_t w, uint8_t h, uint8_t cls0, uint8_t cls1) {
  detect::Image im{64, 64, std::vector<uint8_t>(64 * 64 * 3)};
  const auto set = [&](int row, int bgr_channel, uint8_t v) {
    im.bgr[((row + n / 64) * 64 + n % 64) * 3 + bgr_channel] = v;
  };
  set(0, 2, cx);   // red
  set(32, 2, cy);
  set(0, 1, w);    // green
  set(32, 1, h);
  set(0, 0, cls0); // blue
  set(32, 0, cls1);
  return im;
}

}  // namespace vigil::testing_fakes
