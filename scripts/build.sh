#!/usr/bin/env bash
# Configures and builds vigil with CMake + Ninja into build/ (or $VIGIL_BUILD_DIR).
# Extra arguments go to the CMake configure step (e.g. -DVIGIL_WITH_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${VIGIL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} "$@"
cmake --build "$build" -j "$(nproc)"
