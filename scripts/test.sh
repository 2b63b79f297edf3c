#!/usr/bin/env bash
# Sets up everything and runs every test: Debian packages, build, the module-border and lock checks, the test virtualenv
# (ONNX Runtime as the oracle, Ultralytics to export random-weight test models), the models, ctest,
# then 60 s of fuzzing the protocol decoders (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${VIGIL_BUILD_DIR:-build}
scripts/deps.sh test
scripts/build.sh
# The borders between modules (docs/architecture.md's table) and the locks (clang -Wthread-safety), checked.
python3 tools/check_borders.py --build "$build"
# The aggregator without its second model (VIGIL_WITH_CLASSIFIER=OFF) links no infer/detect/video: configured only
# (building it is a second tree, minutes without a warm ccache) and its link graph checked against the table.
cmake -S . -B "$build-noclassifier" -G Ninja -DVIGIL_WITH_CLASSIFIER=OFF >/dev/null
python3 tools/check_borders.py --build "$build-noclassifier"
scripts/thread-safety.sh "$build"
scripts/test-venv.sh "$build/venv"
"$build/venv/bin/python" tools/testmodels/make_models.py --out "$build/testmodels"
# A PostgreSQL server of the tests' own on loopback: the storage suites and the aggregator e2e tests run against
# it as well as SQLite (testing/test_database.h); required here, so they cannot pass by skipping.
pg_dir=$(mktemp -d /tmp/vigil-postgres.XXXXXX)
VIGIL_TEST_POSTGRES=$(scripts/postgres.sh start "$pg_dir")
export VIGIL_TEST_POSTGRES VIGIL_REQUIRE_POSTGRES=1
trap 'scripts/postgres.sh stop "$pg_dir"; rm -rf "$pg_dir"' EXIT
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 2400)
# The protocol decoders under libFuzzer for a minute: a clang build of the protocol code alone (build-fuzz/).
scripts/fuzz.sh run 60
