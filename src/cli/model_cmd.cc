// `vigil model inspect` and `vigil model run`.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#if VIGIL_CLI_CLASSIFY
#include "vigil/aggregator/classifier.h"
#endif
#include "vigil/common/npy.h"
#include "vigil/detect/model_family.h"
#include "vigil/infer/engine.h"

namespace vigil::cli {
namespace {

nlohmann::json DimsJson(const infer::ValueInfo& v) {
  nlohmann::json dims = nlohmann::json::array();
  for (const infer::Dim& d : v.dims) {
    if (d.is_static()) dims.push_back(d.value);
    else dims.push_back(d.symbol.empty() ? "?" : d.symbol);
  }
  return dims;
}

std::string DimsText(const infer::ValueInfo& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.dims.size(); ++i) {
    if (i) s += ",";
    s += v.dims[i].is_static() ? std::to_string(v.dims[i].value) : (v.dims[i].symbol.empty() ? "?" : v.dims[i].symbol);
  }
  return s + "]";
}

struct PlanRequest {
  std::string device;  // "": no plan
  std::string precision = "fp32";
  std::string int8_activations = "quantized";
  int64_t batch = 0;
};

int Inspect(const std::string& path, bool json_out, const PlanRequest& req) {
  StatusOr<infer::ModelSummary> summary = infer::InspectModel(path);
  if (!summary.ok()) {
    std::fprintf(stderr, "vigil model inspect: %s\n", std::string(summary.status().message()).c_str());
    return 2;
  }
  // Where each node would run on --device (no device needed: a CUDA plan is made without a GPU).
  std::optional<StatusOr<infer::BackendPlan>> plan;
  infer::EngineOptions plan_options;
  if (!req.device.empty()) {
    plan_options.device = req.device;
    plan_options.batch = req.batch;
    StatusOr<infer::Precision> p = infer::ParsePrecision(req.precision);
    if (!p.ok()) {
      std::fprintf(stderr, "vigil model inspect: --precision: %s\n", std::string(p.status().message()).c_str());
      return 2;
    }
    plan_options.precision = *p;
    StatusOr<infer::Int8Activations> a = infer::ParseInt8Activations(req.int8_activations);
    if (!a.ok()) {
      std::fprintf(stderr, "vigil model inspect: --int8-activations: %s\n", std::string(a.status().message()).c_str());
      return 2;
    }
    plan_options.int8_activations = *a;
    if (StatusOr<int> d = infer::ParseDevice(req.device); !d.ok()) {
      std::fprintf(stderr, "vigil model inspect: --device: %s\n", std::string(d.status().message()).c_str());
      return 2;
    }
    plan = infer::PlanModel(path, plan_options);
  }
  // Load to learn concrete shapes and the family; a load failure is reported, not fatal.
  infer::EngineOptions options;
  options.threads = 1;
  StatusOr<detect::ModelInfo> info = absl::UnknownError("not loaded");
  StatusOr<std::unique_ptr<infer::Engine>> engine = infer::Engine::Load(path, options);
  if (engine.ok()) info = detect::DescribeModel(**engine);
  const std::string family = info.ok() ? std::string(detect::FamilyName(info->family)) : "unknown";

  nlohmann::json j;
  j["path"] = path;
  j["producer"] = summary->producer;
  j["ir_version"] = summary->ir_version;
  j["opset"] = summary->opset;
  for (const auto& v : summary->inputs) j["inputs"].push_back({{"name", v.name}, {"dtype", DTypeName(v.dtype)}, {"shape", DimsJson(v)}});
  for (const auto& v : summary->outputs) j["outputs"].push_back({{"name", v.name}, {"dtype", DTypeName(v.dtype)}, {"shape", DimsJson(v)}});
  j["family"] = family;
  j["names"] = info.ok() ? nlohmann::json(info->names) : nlohmann::json::array();
  j["op_counts"] = summary->op_counts;
  j["unsupported_ops"] = summary->unsupported_ops;
  j["metadata"] = summary->metadata;
  j["load_error"] = engine.ok() ? (info.ok() ? "" : std::string(info.status().message()))
                                : std::string(engine.status().message());
  if (engine.ok()) {
    for (const auto& t : (*engine)->outputs()) j["resolved_outputs"][t.name] = t.shape;
  }
  std::map<std::string, int> kernels;  // kernel → nodes
  if (plan && plan->ok()) {
    nlohmann::json pj;
    pj["device"] = req.device;
    pj["precision"] = req.precision;
    pj["batch"] = req.batch;
    for (const infer::NodePlacement& n : (*plan)->nodes) {
      ++kernels[n.kernel];
      nlohmann::json nj = {{"node", n.node}, {"op", n.op}, {"kernel", n.kernel}, {"channels_last", n.channels_last},
                           {"conversion", n.conversion}};
      if (!n.reason.empty()) nj["reason"] = n.reason;
      pj["nodes"].push_back(std::move(nj));
    }
    pj["kernels"] = kernels;
    pj["host_nodes"] = (*plan)->host_nodes;
    pj["conversions"] = (*plan)->conversions;
    pj["channels_last_values"] = (*plan)->channels_last_values;
    j["plan"] = std::move(pj);
  } else if (plan) {
    j["plan_error"] = std::string(plan->status().message());
  }
  if (json_out) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model     : " << path << "\n"
            << "producer  : " << summary->producer << " (IR " << summary->ir_version << ", opset " << summary->opset << ")\n"
            << "family    : " << family << "\n";
  for (const auto& v : summary->inputs) std::cout << "input     : " << v.name << " " << DTypeName(v.dtype) << " " << DimsText(v) << "\n";
  for (const auto& v : summary->outputs) std::cout << "output    : " << v.name << " " << DTypeName(v.dtype) << " " << DimsText(v) << "\n";
  if (info.ok()) {
    std::cout << "classes   : " << info->names.size();
    for (size_t i = 0; i < info->names.size() && i < 8; ++i) std::cout << (i ? ", " : " (") << info->names[i];
    std::cout << (info->names.size() > 8 ? ", ...)" : info->names.empty() ? "" : ")") << "\n";
  }
  std::cout << "ops       :";
  for (const auto& [op, n] : summary->op_counts) std::cout << " " << op << "=" << n;
  std::cout << "\n";
  if (!summary->unsupported_ops.empty()) {
    for (const auto& u : summary->unsupported_ops) std::cout << "UNSUPPORTED: " << u << "\n";
  }
  if (!j["load_error"].get<std::string>().empty()) std::cout << "load error: " << j["load_error"].get<std::string>() << "\n";
  if (plan && plan->ok()) {
    std::cout << "plan      : " << req.device << " " << req.precision << ", " << (*plan)->nodes.size() << " nodes:";
    for (const auto& [k, n] : kernels) std::cout << " " << k << "=" << n;
    std::cout << "; " << (*plan)->channels_last_values << " values NHWC, " << (*plan)->conversions
              << " layout conversion(s)\n";
    for (const infer::NodePlacement& n : (*plan)->nodes) {
      if (n.kernel == "host") std::cout << "on host   : '" << n.node << "' (" << n.op << "): " << n.reason << "\n";
    }
  } else if (plan) {
    std::cout << "plan error: " << plan->status().message() << "\n";
  }
  return 0;
}

int RunModel(const std::string& path, const std::vector<std::string>& input_args, const std::string& out_dir, int threads,
             bool reference_only, const std::string& device, const std::string& precision, const std::string& int8) {
  infer::EngineOptions options;
  options.threads = threads;
  options.device = device;
  if (StatusOr<infer::Precision> p = infer::ParsePrecision(precision); p.ok()) {
    options.precision = *p;
  } else {
    std::fprintf(stderr, "vigil model run: %s\n", std::string(p.status().message()).c_str());
    return 2;
  }
  if (StatusOr<infer::Int8Activations> a = infer::ParseInt8Activations(int8); a.ok()) {
    options.int8_activations = *a;
  } else {
    std::fprintf(stderr, "vigil model run: --int8-activations: %s\n", std::string(a.status().message()).c_str());
    return 2;
  }
  options.use_onednn = !reference_only;
  // NAME=FILE.npy, repeatable; the same NAME again queues another run (outputs then get ".<run>").
  std::map<std::string, std::vector<Tensor>> feeds;
  for (const std::string& arg : input_args) {
    const size_t eq = arg.find('=');
    const std::vector<std::string> kv = {arg.substr(0, eq), eq == std::string::npos ? "" : arg.substr(eq + 1)};
    if (eq == std::string::npos || kv[0].empty() || kv[1].empty()) {
      std::fprintf(stderr, "vigil model run: --input '%s' is not NAME=FILE.npy\n", arg.c_str());
      return 2;
    }
    StatusOr<Tensor> t = ReadNpy(kv[1]);
    if (!t.ok()) {
      std::fprintf(stderr, "vigil model run: input '%s': %s\n", kv[0].c_str(), std::string(t.status().message()).c_str());
      return 2;
    }
    if (!feeds[kv[0]].empty() && feeds[kv[0]].front().shape() != t->shape()) {
      std::fprintf(stderr, "vigil model run: input '%s': %s has shape %s, the first file %s\n", kv[0].c_str(),
                   kv[1].c_str(), ShapeToString(t->shape()).c_str(), ShapeToString(feeds[kv[0]].front().shape()).c_str());
      return 2;
    }
    options.input_shapes[kv[0]] = t->shape();
    feeds[kv[0]].push_back(*std::move(t));
  }
  StatusOr<std::unique_ptr<infer::Engine>> engine = infer::Engine::Load(path, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "vigil model run: %s\n", std::string(engine.status().message()).c_str());
    return 2;
  }
  size_t runs = 0;
  for (const auto& info : (*engine)->inputs()) {
    auto it = feeds.find(info.name);
    if (it == feeds.end()) {
      std::fprintf(stderr, "vigil model run: no --input for model input '%s' %s\n", info.name.c_str(),
                   ShapeToString(info.shape).c_str());
      return 2;
    }
    if (runs != 0 && it->second.size() != runs) {
      std::fprintf(stderr, "vigil model run: inputs are given different numbers of files\n");
      return 2;
    }
    runs = it->second.size();
  }
  std::filesystem::create_directories(out_dir);
  for (size_t run = 0; run < runs; ++run) {
    std::vector<Tensor> inputs, outputs;
    for (const auto& info : (*engine)->inputs()) inputs.push_back(feeds[info.name][run]);
    if (Status st = (*engine)->Run(inputs, &outputs); !st.ok()) {
      std::fprintf(stderr, "vigil model run: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::string name = (*engine)->outputs()[i].name;
      for (char& c : name) {
        if (c == '/' || c == ':') c = '_';
      }
      if (runs > 1) name += StrCat(".", run);
      const std::string file = (std::filesystem::path(out_dir) / (name + ".npy")).string();
      const Tensor& t = outputs[i];
      const bool is_float = t.dtype() == DType::kFloat16 || t.dtype() == DType::kFloat64;
      if (Status st = WriteNpy(file, is_float ? t.ToFloat32() : t); !st.ok()) {
        std::fprintf(stderr, "vigil model run: %s\n", std::string(st.message()).c_str());
        return 1;
      }
      std::printf("%s %s %s\n", file.c_str(), std::string(DTypeName(t.dtype())).c_str(), ShapeToString(t.shape()).c_str());
    }
  }
  return 0;
}

#if VIGIL_CLI_CLASSIFY
// `vigil model classify`: the aggregator's second model (aggregator/classifier.h) on JPEG pictures, as the aggregator
// runs it on an event's crops: to try a classifier and its labels before deploying it.
int Classify(const aggregator::ClassifierConfig& config, const std::vector<std::string>& images, bool json_out,
             const std::string& save_inputs) {
  StatusOr<std::unique_ptr<aggregator::Classifier>> c = aggregator::Classifier::Load(config);
  if (!c.ok()) {
    std::fprintf(stderr, "vigil model classify: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  nlohmann::json out = nlohmann::json::array();
  int failed = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    std::ifstream f(images[i], std::ios::binary);
    std::string jpeg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    Tensor input;
    StatusOr<std::vector<float>> p =
        !f ? StatusOr<std::vector<float>>(absl::NotFoundError("cannot read the file"))
           : (*c)->Probabilities(jpeg, save_inputs.empty() ? nullptr : &input);
    if (!p.ok()) {
      std::fprintf(stderr, "vigil model classify: %s: %s\n", images[i].c_str(), std::string(p.status().message()).c_str());
      ++failed;
      continue;
    }
    if (!save_inputs.empty()) {
      const std::string npy = StrCat(save_inputs, "/input.", i, ".npy");
      if (Status st = WriteNpy(npy, input); !st.ok()) {
        std::fprintf(stderr, "vigil model classify: %s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    const size_t best = static_cast<size_t>(std::max_element(p->begin(), p->end()) - p->begin());
    if (json_out) {
      out.push_back({{"image", images[i]}, {"index", best}, {"label", (*c)->labels()[best]}, {"score", (*p)[best]},
                     {"probabilities", *p}});
    } else {
      std::printf("%s: %s %.3f (class %zu of %zu)\n", images[i].c_str(), (*c)->labels()[best].c_str(),
                  static_cast<double>((*p)[best]), best, p->size());
    }
  }
  if (json_out) std::printf("%s\n", out.dump(1).c_str());
  return failed > 0 ? 1 : 0;
}
#endif  // VIGIL_CLI_CLASSIFY

}  // namespace

void AddModelCommands(CLI::App& app, int* exit_code) {
  CLI::App* model = app.add_subcommand("model", "Inspect or run an ONNX model");
  model->require_subcommand(1);

  CLI::App* inspect = model->add_subcommand(
      "inspect", "Print inputs, outputs, family, classes, op counts, unsupported ops; with --device, where each node runs");
  static std::string inspect_path;
  static bool inspect_json = false;
  static PlanRequest inspect_plan;
  inspect->add_option("model", inspect_path, "ONNX model file")->required();
  inspect->add_flag("--json", inspect_json, "Print JSON");
  inspect->add_option("--device", inspect_plan.device,
                      "Plan for this device (cpu, cuda:N): each node's kernel, the nodes a GPU runs on the host and "
                      "why, the NHWC region; needs no GPU");
  inspect->add_option("--precision", inspect_plan.precision, "With --device cuda:N: fp32 or fp16")->capture_default_str();
  inspect->add_option("--int8-activations", inspect_plan.int8_activations, kInt8ActivationsHelp)->capture_default_str();
  inspect->add_option("--batch", inspect_plan.batch, "With --device: the batch a symbolic batch dim is fixed to (0: 1)")
      ->capture_default_str();
  inspect->callback([exit_code] { *exit_code = Inspect(inspect_path, inspect_json, inspect_plan); });

  CLI::App* run = model->add_subcommand("run", "Run a model on .npy inputs and write its raw outputs as .npy");
  static std::string run_model, run_out = "out";
  static std::vector<std::string> run_inputs;
  static int run_threads = 0;
  static bool run_reference = false;
  run->add_option("--model", run_model, "ONNX model file")->required();
  run->add_option("--input", run_inputs, "NAME=FILE.npy (repeatable; the file's shape fixes the input's dims; the same NAME again adds a run, outputs <name>.<run>.npy)")->required();
  run->add_option("--output-dir", run_out, "Where <output>.npy files go")->capture_default_str();
  run->add_option("--threads", run_threads, "Kernel threads (0 = all cores)")->capture_default_str();
  run->add_flag("--reference-only", run_reference, "Use the reference kernels only (no oneDNN)");
  static std::string run_device = "cpu", run_precision = "fp32", run_int8 = "quantized";
  run->add_option("--device", run_device, "cpu, or cuda:N")->capture_default_str();
  run->add_option("--precision", run_precision, "CUDA compute precision: fp32 or fp16")->capture_default_str();
  run->add_option("--int8-activations", run_int8, kInt8ActivationsHelp)->capture_default_str();
  run->callback([exit_code] {
    *exit_code =
        RunModel(run_model, run_inputs, run_out, run_threads, run_reference, run_device, run_precision, run_int8);
  });

#if VIGIL_CLI_CLASSIFY
  CLI::App* classify = model->add_subcommand(
      "classify", "Run an image classifier on JPEG pictures as the aggregator's second model does (confirm.classifier)");
  static aggregator::ClassifierConfig cls;
  static std::vector<std::string> cls_images;
  static std::string cls_normalize = "unit", cls_save;
  static bool cls_json = false;
  cls.threads = 0;
  classify->add_option("--model", cls.model, "ONNX classifier: input [1, 3, H, W] RGB, output [1, C]")->required();
  classify->add_option("images", cls_images, "JPEG pictures (e.g. crops the edge sent)")->required();
  classify->add_option("--device", cls.device, "cpu, or cuda:N")->capture_default_str();
  static std::string cls_labels;
  classify->add_option("--labels", cls_labels,
                       "class names by index, comma-separated: a,b,c (default: the model's names, else class N)");
  classify->add_option("--normalize", cls_normalize, "unit: pixel / 255; imagenet: (pixel / 255 - mean) / std")
      ->check(CLI::IsMember({"unit", "imagenet"}))
      ->capture_default_str();
  classify->add_option("--threads", cls.threads, "kernel threads (0 = all cores)")->capture_default_str();
  classify->add_option("--save-inputs", cls_save, "a folder: each picture's model input as input.<i>.npy");
  classify->add_flag("--json", cls_json, "print JSON (every class's probability)");
  classify->callback([exit_code] {
    cls.imagenet = cls_normalize == "imagenet";
    cls.labels.clear();
    for (size_t at = 0; !cls_labels.empty() && at <= cls_labels.size();) {
      const size_t comma = std::min(cls_labels.find(',', at), cls_labels.size());
      cls.labels.push_back(cls_labels.substr(at, comma - at));
      at = comma + 1;
    }
    *exit_code = Classify(cls, cls_images, cls_json, cls_save);
  });
#endif
}

}  // namespace vigil::cli
