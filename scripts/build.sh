#!/usr/bin/env bash
# Configures and builds vigil with CMake + Ninja into build/ (or $VIGIL_BUILD_DIR).
# Extra arguments go to the CMake configure step (e.g. -DVIGIL_WITH_CUDA=OFF). VIGIL_BUILD_TARGETS
# (space-separated) builds only those targets, e.g. VIGIL_BUILD_TARGETS=vigil for the CLI alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${VIGIL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} "$@"
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc)" ${VIGIL_BUILD_TARGETS:+--target $VIGIL_BUILD_TARGETS}
