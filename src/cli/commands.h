// commands.h — the `vigil` subcommands. Each Add*Command registers a CLI11 subcommand on `app`;
// when that subcommand runs, its callback stores the process exit code in *exit_code:
// 0 success, 1 the work ran but failed (e.g. every image unreadable), 2 bad arguments or model.
// Errors go to stderr as one line naming the thing and the reason.
#pragma once

#include <CLI/CLI.hpp>

namespace vigil::cli {

// Help of --int8-activations (EngineOptions::int8_activations), shared by the commands that load a model.
inline constexpr const char* kInt8ActivationsHelp =
    "int8-dynamic models: quantized (as exported: each activation quantized as DynamicQuantizeLinear defines, "
    "ONNX Runtime's results) or float (activations kept in float: faster, borderline boxes differ)";

void AddDetectCommand(CLI::App& app, int* exit_code);  // detect_cmd.cc: `vigil detect`
void AddModelCommands(CLI::App& app, int* exit_code);  // model_cmd.cc: `vigil model inspect|run`
CLI::App* AddBenchCommands(CLI::App& app, int* exit_code);  // bench_cmd.cc: `vigil bench engine`; returns `bench`
void AddBenchPlacementCommand(CLI::App& bench, int* exit_code);  // bench_placement_cmd.cc: `vigil bench placement`
void AddBenchStreamsCommand(CLI::App& bench, int* exit_code);  // bench_streams_cmd.cc: `vigil bench streams`
void AddBenchTransportCommand(CLI::App& bench, int* exit_code);  // bench_transport_cmd.cc: `vigil bench transport`
void AddBenchAggregatorCommand(CLI::App& bench, int* exit_code);  // bench_aggregator_cmd.cc: `vigil bench aggregator`
void AddAggregatorCommand(CLI::App& app, int* exit_code);  // aggregator_cmd.cc: `vigil aggregator`
void AddEdgeCommand(CLI::App& app, int* exit_code);        // edge_cmd.cc: `vigil edge --config edge.yaml`
void AddTopoCommand(CLI::App& app, int* exit_code);    // topo_cmd.cc: `vigil topo` (a stub saying why when built without hwloc)

}  // namespace vigil::cli
