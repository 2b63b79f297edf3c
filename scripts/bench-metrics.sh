#!/usr/bin/env bash
# Metrics micro-benchmark, before/after issue 23 (docs/benchmarks.md): bench/metrics_bench.cc built against
# the hand-written registry (commit bce48cb, the last one that had it) and against the current one (the CMake
# target vigil_metrics_bench), run alternately RUNS times; prints each run and the median per benchmark.
#
#   scripts/bench-metrics.sh [RUNS]        (default 5; needs build/ configured, libbenchmark-dev)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
build=${VIGIL_BUILD_DIR:-build}
old_commit=bce48cb
old=$build/bench-metrics-before
mkdir -p "$old/include/vigil/metrics" "$old/src"
git show "$old_commit:include/vigil/metrics/registry.h" > "$old/include/vigil/metrics/registry.h"
git show "$old_commit:src/metrics/registry.cc" > "$old/src/registry.cc"
# Same flags as the CMake RelWithDebInfo build of the target.
g++ -O2 -g -DNDEBUG -std=c++20 -I"$old/include" bench/metrics_bench.cc "$old/src/registry.cc" \
    -o "$old/vigil_metrics_bench" -lbenchmark -lpthread
cmake --build "$build" -j2 --target vigil_metrics_bench >/dev/null

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= runs; ++i)); do
  for which in before after; do
    bin=$build/vigil_metrics_bench
    [[ $which == before ]] && bin=$old/vigil_metrics_bench
    "$bin" --benchmark_out_format=json --benchmark_out="$out/$which.$i.json" >/dev/null 2>&1
  done
done
python3 - "$out" "$runs" <<'EOF'
import glob, json, statistics, sys
times, unit = {}, {}  # (benchmark, before|after) -> real time per iteration of each run
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    which = path.rsplit("/", 1)[1].split(".")[0]
    for b in json.load(open(path))["benchmarks"]:
        times.setdefault((b["name"], which), []).append(b["real_time"])
        unit[b["name"]] = b["time_unit"]
print(f"{'benchmark (real time per iteration)':42} {'before: median [min..max]':>30} {'after: median [min..max]':>30}")
for name in sorted({n for n, _ in times}):
    def cell(w):
        t = times[(name, w)]
        return f"{statistics.median(t):.3g} [{min(t):.3g}..{max(t):.3g}] {unit[name]}"
    print(f"{name:42} {cell('before'):>30} {cell('after'):>30}")
print(f"({sys.argv[2]} runs each, alternating before/after)")
EOF
