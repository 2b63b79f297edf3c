// plan_cache_test.cc — the cuDNN plan cache (infer/cuda/plan_cache.h, cudnn_conv.h PlanKey).
//
// PlanKey*, PlanCacheFormat* and PlanCacheFile* need no GPU (key text, the JSON file, atomic save).
// PlanCacheGpu* load the same small convolution model twice, or through a fresh cache from the file,
// and check the second load times nothing and computes bit-identical outputs; they skip without a GPU.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "infer/cuda/cudnn_conv.h"
#include "vigil/infer/cuda_device.h"
#include "testing/require_gpu.h"
#include "infer/cuda/plan_cache.h"
#include "testing/graph_builder.h"
#include "vigil/infer/engine.h"

namespace vigil {
namespace {

namespace fs = std::filesystem;
using cuda::PlanCache;
using cuda::PlanCacheStats;
using cuda::PlanChoice;
using infer::Engine;
using infer::EngineOptions;
using infer::Precision;

std::string ReadText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("vigil_plan_cache_" + std::to_string(getpid()) + "_" +
                                                 std::to_string(std::random_device{}()))) {
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---- Key ---------------------------------------------------------------------------------------

cuda::ConvSpec BaseSpec() {
  cuda::ConvSpec s;
  s.x_dims = {1, 16, 32, 32};
  s.x_strides = {16 * 32 * 32, 1, 32 * 16, 16};
  s.w_dims = {32, 16, 3, 3};
  s.w_strides = {9 * 16, 1, 3 * 16, 16};
  s.y_dims = {1, 32, 32, 32};
  s.y_strides = {32 * 32 * 32, 1, 32 * 32, 32};
  s.pre_pad = {1, 1};
  s.post_pad = {1, 1};
  s.data_type = CUDNN_DATA_HALF;
  s.fuse_epilogue = true;
  s.has_bias = true;
  s.activation = cuda::ConvActivation::kSiLU;
  return s;
}

TEST(PlanKey, SameSpecSameKeyAnyFieldChangesIt) {
  const std::string dev = "NVIDIA H200|sm90|132sm|cudnn91900";
  EXPECT_EQ(cuda::PlanKey(BaseSpec(), dev), cuda::PlanKey(BaseSpec(), dev));
  const std::vector<std::function<void(cuda::ConvSpec&)>> changes = {
      [](auto& s) { s.x_dims[0] = 2; },          [](auto& s) { s.x_dims[2] = 31; },
      [](auto& s) { s.x_strides[1] = 2; },       [](auto& s) { s.w_dims[3] = 5; },
      [](auto& s) { s.w_strides[0] = 1; },       [](auto& s) { s.y_dims[1] = 33; },
      [](auto& s) { s.y_strides[3] = 64; },      [](auto& s) { s.pre_pad[0] = 0; },
      [](auto& s) { s.post_pad[1] = 2; },        [](auto& s) { s.stride = {2, 1}; },
      [](auto& s) { s.dilation = {1, 2}; },      [](auto& s) { s.data_type = CUDNN_DATA_FLOAT; },
      [](auto& s) { s.fuse_epilogue = false; },  [](auto& s) { s.has_bias = false; },
      [](auto& s) { s.activation = cuda::ConvActivation::kRelu; },
      [](auto& s) { s.allow_tensor_core_fp32 = true; },
      [](auto& s) { s.max_candidates = 2; },     [](auto& s) { s.workspace_limit = 1 << 20; },
  };
  std::set<std::string> keys = {cuda::PlanKey(BaseSpec(), dev)};
  for (size_t i = 0; i < changes.size(); ++i) {
    cuda::ConvSpec s = BaseSpec();
    changes[i](s);
    EXPECT_TRUE(keys.insert(cuda::PlanKey(s, dev)).second) << "change " << i << " left the key unchanged";
  }
  // The device (name, compute capability, SM count, cuDNN version) is part of it too.
  for (const std::string other : {"NVIDIA H100|sm90|132sm|cudnn91900", "NVIDIA H200|sm90|66sm|cudnn91900",
                                  "NVIDIA H200|sm90|132sm|cudnn91800"}) {
    EXPECT_TRUE(keys.insert(cuda::PlanKey(BaseSpec(), other)).second) << other;
  }
}

// ---- File format -------------------------------------------------------------------------------

std::map<std::string, PlanChoice> SomeEntries() {
  return {{"dev|a", PlanChoice{17, {{2, 3}, {25, 0}}}}, {"dev|b", PlanChoice{-1, {}}}, {"dev|c", PlanChoice{0, {{14, 4}}}}};
}

TEST(PlanCacheFormat, RoundTrip) {
  const std::string text = PlanCache::Serialize(SomeEntries());
  auto parsed = PlanCache::Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, SomeEntries());
  // The documented layout, byte for byte where it matters.
  EXPECT_NE(text.find("\"format\": \"vigil-cudnn-plan-cache\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"version\": 1"), std::string::npos) << text;
}

TEST(PlanCacheFormat, RejectsCorruptForeignAndOtherVersions) {
  const std::string good = PlanCache::Serialize(SomeEntries());
  struct Bad {
    std::string text, reason;
  };
  std::string v2 = good;
  v2.replace(v2.find("\"version\": 1"), 12, "\"version\": 2");
  const std::vector<Bad> bad = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {"", "not valid JSON"},
      {"[1, 2]", "not a vigil cuDNN plan cache"},
      {R"({"format": "something-else", "version": 1, "entries": {}})", "not a vigil cuDNN plan cache"},
      {v2, "version 2, this build reads 1"},
      {R"({"format": "vigil-cudnn-plan-cache", "entries": {}})", "version missing"},
      {R"({"format": "vigil-cudnn-plan-cache", "version": 1})", "no \"entries\" object"},
      {R"({"format": "vigil-cudnn-plan-cache", "version": 1, "entries": {"k": {"engine": "x", "knobs": []}}})",
       "entry 'k': \"engine\""},
      {R"({"format": "vigil-cudnn-plan-cache", "version": 1, "entries": {"k": {"engine": -2, "knobs": []}}})",
       "entry 'k': \"engine\""},
      {R"({"format": "vigil-cudnn-plan-cache", "version": 1, "entries": {"k": {"engine": 3, "knobs": [[1]]}}})",
       "entry 'k': a knob"},
      {R"({"format": "vigil-cudnn-plan-cache", "version": 1, "entries": {"k": {"engine": 3}}})",
       "entry 'k': \"knobs\""},
  };
  for (const Bad& b : bad) {
    auto parsed = PlanCache::Parse(b.text);
    ASSERT_FALSE(parsed.ok()) << b.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(parsed.status().message()).find(b.reason), std::string::npos)
        << parsed.status() << " (expected '" << b.reason << "')";
  }
}

// ---- File --------------------------------------------------------------------------------------

TEST(PlanCacheFile, SaveLoadMissingAndAtomic) {
  TempDir dir;
  const fs::path file = dir.path() / "sub" / "plans.json";
  PlanCache missing;
  EXPECT_TRUE(missing.Load(file.string()).ok());  // nothing there yet: fine, nothing merged
  EXPECT_EQ(missing.size(), 0u);

  PlanCache a;
  for (const auto& [k, c] : SomeEntries()) a.Put(k, c);
  ASSERT_TRUE(a.Save(file.string()).ok());  // creates sub/
  // Only the file itself: the temporary was renamed over it.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(file.parent_path())) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], file);

  PlanCache b;
  b.Put("dev|a", PlanChoice{5, {}});  // held entries win over the file's
  ASSERT_TRUE(b.Load(file.string()).ok());
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b.Find("dev|a"), (PlanChoice{5, {}}));
  EXPECT_EQ(b.Find("dev|b"), (PlanChoice{-1, {}}));
  EXPECT_EQ(b.Find("dev|c"), (PlanChoice{0, {{14, 4}}}));
  EXPECT_FALSE(b.Find("dev|d").has_value());

  // Save merges over what the file holds now (another process's entries survive).
  PlanCache c;
  c.Put("dev|d", PlanChoice{9, {{1, 1}}});
  ASSERT_TRUE(c.Save(file.string()).ok());
  auto parsed = PlanCache::Parse(ReadText(file));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto expected = SomeEntries();
  expected["dev|d"] = PlanChoice{9, {{1, 1}}};
  EXPECT_EQ(*parsed, expected);
}

TEST(PlanCacheFile, CorruptFileIsReportedIgnoredAndOverwritten) {
  TempDir dir;
  const fs::path file = dir.path() / "plans.json";
  const std::string good = PlanCache::Serialize(SomeEntries());
  WriteText(file, good.substr(0, good.size() - 7));  // truncated
  PlanCache cache;
  cache.Put("dev|z", PlanChoice{1, {}});
  const Status st = cache.Load(file.string());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(st.message());
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  EXPECT_EQ(cache.size(), 1u);  // nothing merged
  ASSERT_TRUE(cache.Save(file.string()).ok());
  auto parsed = PlanCache::Parse(ReadText(file));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (std::map<std::string, PlanChoice>{{"dev|z", PlanChoice{1, {}}}}));
}

TEST(PlanCacheFile, UnwritableFolderIsAnErrorNamingTheFile) {
  TempDir dir;
  WriteText(dir.path() / "a_file", "x");
  PlanCache cache;
  cache.Put("k", PlanChoice{1, {}});
  const std::string path = (dir.path() / "a_file" / "plans.json").string();
  const Status st = cache.Save(path);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find(path), std::string::npos) << st;
  EXPECT_EQ(ReadText(dir.path() / "a_file"), "x");
}

// ---- On a GPU ----------------------------------------------------------------------------------

using infer::testing::GraphBuilder;
using infer::testing::RandomTensor;

// Five convolutions of different shapes (3-channel input, stride 2, 1x1, depthwise, no activation),
// as in a YOLO stem.
infer::Graph ConvModel() {
  std::mt19937 rng(7);
  GraphBuilder b;
  b.Input("x", {1, 3, 64, 48});
  const auto conv = [&](const std::string& in, const std::string& out, int64_t cin, int64_t cout, int64_t k,
                        int64_t stride, int64_t group, const std::string& act) {
    b.Initializer(out + ".w", RandomTensor(rng, {cout, cin / group, k, k}, -0.3f, 0.3f));
    b.Initializer(out + ".b", RandomTensor(rng, {cout}, -0.5f, 0.5f));
    infer::Node& n = act.empty() ? b.Add("Conv", {in, out + ".w", out + ".b"}, {out})
                                 : b.Add("FusedConv", {in, out + ".w", out + ".b"}, {out}, "vigil");
    n.attrs["kernel_shape"] = std::vector<int64_t>{k, k};
    n.attrs["strides"] = std::vector<int64_t>{stride, stride};
    n.attrs["pads"] = std::vector<int64_t>{k / 2, k / 2, k / 2, k / 2};
    n.attrs["group"] = group;
    if (!act.empty()) n.attrs["activation"] = act;
  };
  conv("x", "c1", 3, 16, 3, 2, 1, "SiLU");
  conv("c1", "c2", 16, 32, 3, 2, 1, "SiLU");
  conv("c2", "c3", 32, 32, 1, 1, 1, "SiLU");
  conv("c3", "c4", 32, 32, 3, 1, 32, "Relu");
  conv("c4", "y", 32, 24, 1, 1, 1, "");
  b.Output("y");
  EXPECT_TRUE(b.Finish().ok());
  return b.graph;
}

struct Loaded {
  std::vector<Tensor> out;
  PlanCacheStats stats;  // this load's look-ups
};

// Loads ConvModel on cuda:0 and runs it on a fixed input.
Loaded LoadAndRun(Precision precision, const std::string& cache_file) {
  PlanCache& cache = PlanCache::Global();
  const PlanCacheStats before = cache.totals();
  EngineOptions options;
  options.device = "cuda:0";
  options.precision = precision;
  options.cudnn_plan_cache = cache_file;
  auto engine = Engine::FromGraph(ConvModel(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  Loaded r;
  if (!engine.ok()) return r;
  const PlanCacheStats after = cache.totals();
  r.stats = {after.hits - before.hits, after.timed - before.timed, after.failed_restores - before.failed_restores};
  std::mt19937 rng(11);
  const std::vector<Tensor> in = {RandomTensor(rng, {1, 3, 64, 48})};
  const Status st = (*engine)->Run(in, &r.out);
  EXPECT_TRUE(st.ok()) << st;
  return r;
}

void ExpectBitIdentical(const Loaded& a, const Loaded& b) {
  ASSERT_EQ(a.out.size(), 1u);
  ASSERT_EQ(b.out.size(), 1u);
  ASSERT_EQ(a.out[0].shape(), b.out[0].shape());
  ASSERT_EQ(a.out[0].dtype(), b.out[0].dtype());
  EXPECT_EQ(std::memcmp(a.out[0].raw(), b.out[0].raw(), a.out[0].nbytes()), 0) << "outputs differ";
}

class PlanCacheGpu : public ::testing::TestWithParam<Precision> {};

TEST_P(PlanCacheGpu, SecondLoadInProcessTimesNothing) {
  VIGIL_REQUIRE_GPU();
  PlanCache::Global().Clear();
  const Loaded first = LoadAndRun(GetParam(), "");
  // At least one look-up per convolution; a layout re-plan inside a load repeats some, as hits.
  EXPECT_GE(first.stats.timed, 5) << "each convolution timed once";
  EXPECT_EQ(first.stats.failed_restores, 0);
  const Loaded second = LoadAndRun(GetParam(), "");
  EXPECT_EQ(second.stats.timed, 0);
  EXPECT_EQ(second.stats.failed_restores, 0);
  EXPECT_EQ(second.stats.hits, first.stats.hits + first.stats.timed) << "the same look-ups, all from the cache";
  ExpectBitIdentical(first, second);
}

TEST_P(PlanCacheGpu, FreshCacheFromFileTimesNothing) {
  VIGIL_REQUIRE_GPU();
  TempDir dir;
  const std::string file = (dir.path() / "plans.json").string();
  PlanCache::Global().Clear();
  const Loaded first = LoadAndRun(GetParam(), file);
  ASSERT_GE(first.stats.timed, 5);
  auto saved = PlanCache::Parse(ReadText(file));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(static_cast<int64_t>(saved->size()), first.stats.timed) << "one entry per timed look-up";

  PlanCache::Global().Clear();  // as a new process would start
  const Loaded second = LoadAndRun(GetParam(), file);
  EXPECT_EQ(second.stats.timed, 0);
  EXPECT_EQ(second.stats.failed_restores, 0);
  EXPECT_EQ(second.stats.hits, first.stats.hits + first.stats.timed);
  ExpectBitIdentical(first, second);
}

TEST_P(PlanCacheGpu, GarbageEntriesAreRetimedAndReplaced) {
  VIGIL_REQUIRE_GPU();
  TempDir dir;
  const std::string file = (dir.path() / "plans.json").string();
  PlanCache::Global().Clear();
  const Loaded first = LoadAndRun(GetParam(), file);
  auto saved = PlanCache::Parse(ReadText(file));
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (auto& [key, c] : *saved) c = PlanChoice{100000, {{2, 999999}}};  // no such engine
  WriteText(file, PlanCache::Serialize(*saved));

  PlanCache::Global().Clear();
  const Loaded second = LoadAndRun(GetParam(), file);
  EXPECT_EQ(second.stats.hits, first.stats.hits);  // only a re-plan's repeats, of the replaced entries
  EXPECT_EQ(second.stats.failed_restores, first.stats.timed);
  EXPECT_EQ(second.stats.timed, first.stats.timed);
  // Re-timed: the winner may differ by timing noise, so compare within the backend's tolerances
  // (cuda_backend_test.cc: fp32 relative 1e-4, fp16 normalised L2 2e-3).
  ASSERT_EQ(second.out.size(), 1u);
  if (GetParam() == Precision::kFp32) {
    EXPECT_LE(infer::testing::RelativeError(second.out[0], first.out[0]), 1e-4);
  } else {
    EXPECT_LE(infer::testing::NormalizedL2(second.out[0], first.out[0]), 2e-3);
  }
  auto rewritten = PlanCache::Parse(ReadText(file));
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_EQ(rewritten->size(), saved->size());
  for (const auto& [key, c] : *rewritten) EXPECT_NE(c.engine, 100000) << key << " kept its garbage entry";
}

INSTANTIATE_TEST_SUITE_P(Precisions, PlanCacheGpu, ::testing::Values(Precision::kFp32, Precision::kFp16),
                         [](const auto& p) { return p.param == Precision::kFp32 ? "fp32" : "fp16"; });

}  // namespace
}  // namespace vigil
