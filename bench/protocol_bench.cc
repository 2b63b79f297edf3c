// Micro-benchmarks of the report protocol's framing (transport/protocol.h): what encoding and decoding a
// Report costs per size, the part of a link's per-message time that is not the wire.
#include <benchmark/benchmark.h>

#include "vigil/transport/protocol.h"

namespace vigil::transport {
namespace {

Report MakeReport(int rows) {
  Report r;
  r.edge = "edge-1";
  r.stream = "cam0";
  r.run = 1;
  r.kind = ReportKind::kEvent;
  r.rule = "person";
  for (int i = 0; i < rows; ++i) {
    const float f = static_cast<float>(i);
    r.detections.push_back({f, f + 1, f + 10, f + 20, 0.5f, static_cast<float>(i % 80)});
  }
  return r;
}

void BM_EncodeReport(benchmark::State& state) {
  const Report r = MakeReport(static_cast<int>(state.range(0)));
  std::string out;
  for (auto _ : state) {
    out.clear();
    AppendReportFrame(r, r.edge, 1, 0, r.detections, &out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * out.size()));
}
BENCHMARK(BM_EncodeReport)->Arg(0)->Arg(166)->Arg(2726);

void BM_DecodeReport(benchmark::State& state) {
  const Report r = MakeReport(static_cast<int>(state.range(0)));
  const std::string frame = EncodeFrame(r);
  for (auto _ : state) {
    StatusOr<Message> m = DecodeFrame(frame);
    benchmark::DoNotOptimize(m);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * frame.size()));
}
BENCHMARK(BM_DecodeReport)->Arg(0)->Arg(166)->Arg(2726);

void BM_ValidateReport(benchmark::State& state) {
  const Report r = MakeReport(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ValidateReport(r));
}
BENCHMARK(BM_ValidateReport)->Arg(166)->Arg(2726);

}  // namespace
}  // namespace vigil::transport

BENCHMARK_MAIN();
