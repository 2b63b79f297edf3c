#include "vigil/common/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace vigil {
namespace {

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(ConfigTest, ReadsTypedValuesAndKeepsDefaultsForAbsentKeys) {
  StatusOr<ConfigFile> f = ConfigFile::Parse(
      "listen: 0.0.0.0:7400\n"
      "http: '[::1]:0'\n"
      "workers: 3\n"
      "ratio: 0.25\n"
      "realtime: yes\n"
      "mode: fast\n"
      "tags: [a, b]\n"
      "nested:\n"
      "  depth: -2\n",
      "t.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  ConfigMap root = f->root();
  std::string host, http_host, mode, absent = "default";
  uint16_t port = 1, http_port = 1;
  int workers = 0, depth = 0;
  double ratio = 0;
  bool realtime = false;
  std::vector<std::string> tags;
  EXPECT_TRUE(root.GetHostPort("listen", &host, &port));
  EXPECT_TRUE(root.GetHostPort("http", &http_host, &http_port));
  EXPECT_TRUE(root.Get("workers", &workers, 1, 64));
  EXPECT_TRUE(root.Get("ratio", &ratio, 0.0, 1.0));
  EXPECT_TRUE(root.Get("realtime", &realtime));
  EXPECT_TRUE(root.GetOneOf("mode", &mode, {"fast", "slow"}));
  EXPECT_TRUE(root.Get("tags", &tags));
  std::optional<ConfigMap> nested = root.Map("nested");
  ASSERT_TRUE(nested.has_value());
  EXPECT_EQ(nested->path(), "nested");
  EXPECT_TRUE(nested->Get("depth", &depth, -5, 5));
  EXPECT_FALSE(root.Get("absent", &absent));
  EXPECT_TRUE(f->Finish().ok()) << f->Finish();

  EXPECT_EQ(host, "0.0.0.0");
  EXPECT_EQ(port, 7400);
  EXPECT_EQ(http_host, "::1");
  EXPECT_EQ(http_port, 0);
  EXPECT_EQ(workers, 3);
  EXPECT_EQ(ratio, 0.25);
  EXPECT_TRUE(realtime);
  EXPECT_EQ(mode, "fast");
  EXPECT_EQ(tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(depth, -2);
  EXPECT_EQ(absent, "default");
}

TEST(ConfigTest, UnknownKeyIsNamedWithItsLineAndColumn) {
  StatusOr<ConfigFile> f = ConfigFile::Parse("listen: :7400\nstreams:\n  - url: a.mp4\n    fsp: 30\n", "edge.yaml");
  ASSERT_TRUE(f.ok());
  std::string host, url;
  uint16_t port = 0;
  f->root().GetHostPort("listen", &host, &port);
  for (ConfigMap s : f->root().Maps("streams")) s.Get("url", &url);
  Status st = f->Finish();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(st), "edge.yaml:4:5: streams[0].fsp: unknown key");
  EXPECT_EQ(host, "");
  EXPECT_EQ(port, 7400);
  EXPECT_EQ(url, "a.mp4");
}

TEST(ConfigTest, WrongTypeNamesKeyLineAndWhatWasFound) {
  StatusOr<ConfigFile> f = ConfigFile::Parse("batch:\n  max: many\n  wait_ms: [1]\n", "c.yaml");
  ASSERT_TRUE(f.ok());
  int max = 8;
  double wait = 5;
  std::optional<ConfigMap> b = f->root().Map("batch");
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->Get("max", &max, 1, 64));
  EXPECT_FALSE(b->Get("wait_ms", &wait, 0.0, 1000.0));
  EXPECT_EQ(max, 8);  // unchanged on error
  EXPECT_EQ(Message(f->Finish()),
            "c.yaml:2:8: batch.max: expected an integer, got 'many'\n"
            "c.yaml:3:12: batch.wait_ms: expected a number, got a sequence");
}

TEST(ConfigTest, OutOfRangeValuesAndPorts) {
  StatusOr<ConfigFile> f = ConfigFile::Parse(
      "listen: 0.0.0.0:70000\nhttp: localhost:-1\nport: 65536\nscore: 1.5\nbad: nohost\n", "agg.yaml");
  ASSERT_TRUE(f.ok());
  std::string host;
  uint16_t port = 0, p2 = 0;
  double score = 0;
  ConfigMap r = f->root();
  EXPECT_FALSE(r.GetHostPort("listen", &host, &port));
  EXPECT_FALSE(r.GetHostPort("http", &host, &port));
  EXPECT_FALSE(r.Get("port", &p2, uint16_t{0}, uint16_t{65535}));
  EXPECT_FALSE(r.Get("score", &score, 0.0, 1.0));
  EXPECT_FALSE(r.GetHostPort("bad", &host, &port));
  EXPECT_EQ(Message(f->Finish()),
            "agg.yaml:1:9: listen: port 70000 is out of range [0, 65535]\n"
            "agg.yaml:2:7: http: port -1 is out of range [0, 65535]\n"
            "agg.yaml:3:7: port: 65536 is out of range [0, 65535]\n"
            "agg.yaml:4:8: score: 1.5 is out of range [0, 1]\n"
            "agg.yaml:5:6: bad: expected host:port (e.g. 0.0.0.0:7400 or [::1]:7400), got 'nohost'");
}

TEST(ConfigTest, MissingRequiredDuplicateAndEnumErrors) {
  StatusOr<ConfigFile> f = ConfigFile::Parse("mode: turbo\nmode: slow\nitems:\n  - 3\n  - name: x\n", "d.yaml");
  ASSERT_TRUE(f.ok());
  std::string mode, db, name;
  ConfigMap r = f->root();
  EXPECT_FALSE(r.GetOneOf("mode", &mode, {"fast", "slow"}));
  EXPECT_FALSE(r.Get("db", &db, ConfigMap::kRequired));
  std::vector<ConfigMap> items = r.Maps("items");
  ASSERT_EQ(items.size(), 1u);
  items[0].Get("name", &name);
  EXPECT_EQ(name, "x");
  EXPECT_EQ(Message(f->Finish()),
            "d.yaml:1:1: missing required key 'db'\n"
            "d.yaml:1:7: mode: 'turbo' is not one of: fast, slow\n"
            "d.yaml:2:1: mode: duplicate key (first at line 1)\n"
            "d.yaml:4:5: items[0]: expected a map, got '3'");
}

TEST(ConfigTest, NestedSequencesAndCustomErrors) {
  StatusOr<ConfigFile> f = ConfigFile::Parse("roi: [[0, 0], [10, 0], [10, x]]\nmin: 5\nmax: 3\n", "r.yaml");
  ASSERT_TRUE(f.ok());
  std::vector<std::pair<double, double>> poly;
  std::optional<ConfigValue> roi = f->root().Value("roi");
  ASSERT_TRUE(roi);
  for (const ConfigValue& pt : roi->Items()) {
    std::vector<ConfigValue> xy = pt.Items();
    double x = 0, y = 0;
    if (xy.size() == 2 && xy[0].As(&x, 0.0, 1e4) && xy[1].As(&y, 0.0, 1e4)) poly.emplace_back(x, y);
  }
  int lo = 0, hi = 0;
  f->root().Get("min", &lo, 0, 100);
  f->root().Get("max", &hi, 0, 100);
  if (hi < lo) f->root().Error("max", "must be at least min (5)");
  EXPECT_EQ(poly, (std::vector<std::pair<double, double>>{{0, 0}, {10, 0}}));
  EXPECT_EQ(Message(f->Finish()),
            "r.yaml:1:29: roi[2][1]: expected a number, got 'x'\n"
            "r.yaml:3:6: max: must be at least min (5)");
}

TEST(ConfigTest, SyntaxErrorsMissingFilesAndEmptyFiles) {
  StatusOr<ConfigFile> bad = ConfigFile::Parse("a: [1, 2\nb: 3\n", "s.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Message(bad.status()).starts_with("s.yaml:")) << bad.status();
  EXPECT_NE(Message(bad.status()).find("YAML syntax error"), std::string::npos) << bad.status();

  StatusOr<ConfigFile> list = ConfigFile::Parse("- 1\n- 2\n", "l.yaml");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(Message(list.status()), "l.yaml: the top level must be a map of keys, got a sequence");

  StatusOr<ConfigFile> missing = ConfigFile::Load("/nonexistent/dir/agg.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Message(missing.status()).find("/nonexistent/dir/agg.yaml"), std::string::npos);

  StatusOr<ConfigFile> empty = ConfigFile::Parse("", "e.yaml");
  ASSERT_TRUE(empty.ok()) << empty.status();
  int v = 7;
  EXPECT_FALSE(empty->root().Get("x", &v, 0, 10));
  EXPECT_EQ(v, 7);
  EXPECT_TRUE(empty->Finish().ok());
}

TEST(ConfigTest, LoadsFromDisk) {
  const std::string path = ::testing::TempDir() + "/vigil_config_test.yaml";
  {
    std::ofstream out(path);
    out << "db: /tmp/x.db\nlisten: 127.0.0.1:5\n";
  }
  StatusOr<ConfigFile> f = ConfigFile::Load(path);
  ASSERT_TRUE(f.ok()) << f.status();
  std::string db;
  f->root().Get("db", &db, ConfigMap::kRequired);
  EXPECT_EQ(db, "/tmp/x.db");
  EXPECT_EQ(Message(f->Finish()), path + ":2:1: listen: unknown key");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace vigil
