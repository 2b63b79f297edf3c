// aggregator/config.h — reading the aggregator's configuration (internal to src/aggregator). The public entry
// points, LoadAggregatorConfig and ParseAggregatorConfig, are declared in vigil/aggregator/aggregator.h and defined
// in config.cc with the YAML reading; this header shares what the composition root (aggregator.cc) also needs.
// Thread-safety: pure functions. Errors: none (nullopt).
#pragma once

#include <optional>
#include <string>

namespace vigil::aggregator {

// "cuda:N" → N (0..9999); anything else ("host", "cpu", "cuda:", "cuda:x") → nullopt.
std::optional<int> ParseCudaDevice(const std::string& s);

}  // namespace vigil::aggregator
