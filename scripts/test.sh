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
# The aggregator without its second model (VIGIL_WITH_CLASSIFIER=OFF) links no infer/detect/video: its link graph
# checked against the table, and its tests built in a tree of their own (run below, with the database).
cmake -S . -B "$build-noclassifier" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} \
  -DVIGIL_WITH_CLASSIFIER=OFF >/dev/null
python3 tools/check_borders.py --build "$build-noclassifier"
cmake --build "$build-noclassifier" -j "$(nproc)" --target vigil_aggregator_tests
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
# The aggregator's tests without the second model: the refusals that name VIGIL_WITH_CLASSIFIER, and everything else.
"$build-noclassifier/tests/vigil_aggregator_tests" --gtest_brief=1
# The protocol decoders under libFuzzer for a minute: a clang build of the protocol code alone (build-fuzz/).
scripts/fuzz.sh run 60
