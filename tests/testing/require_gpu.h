// Test helper: VIGIL_REQUIRE_GPU() skips the calling GoogleTest, with the reason, where no CUDA device is
// visible (the CPU machines and CI); scripts/gpu-check.sh runs the GPU suites on one.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "vigil/infer/cuda_device.h"

#define VIGIL_REQUIRE_GPU()                                                                                  \
  do {                                                                                                       \
    std::string vigil_why_;                                                                                  \
    if (::vigil::cuda::ListDevices(&vigil_why_).empty()) {                                                   \
      GTEST_SKIP() << "no CUDA device (" << (vigil_why_.empty() ? "no device" : vigil_why_)                  \
                   << "); GPU tests run via scripts/gpu-check.sh";                                           \
    }                                                                                                        \
  } while (0)
