#!/usr/bin/env bash
# Sets up everything and runs every test: Debian packages, build, the test virtualenv
# (ONNX Runtime as the oracle, Ultralytics to export random-weight test models), the models, ctest,
# then 60 s of fuzzing the protocol decoders (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${VIGIL_BUILD_DIR:-build}
scripts/deps.sh test
scripts/build.sh
scripts/test-venv.sh "$build/venv"
"$build/venv/bin/python" tools/testmodels/make_models.py --out "$build/testmodels"
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 2400)
# The protocol decoders under libFuzzer for a minute: a clang build of the protocol code alone (build-fuzz/).
scripts/fuzz.sh run 60
