// vigil — one binary, subcommands per role (docs/architecture.md).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "vigil/transport/ucx.h"

int main(int argc, char** argv) {
  vigil::transport::PrepareUcxEnvironment();  // before any thread: it may setenv
  // Logs go to stderr: stdout carries results (JSON lines, tables, the aggregator's ready line).
  spdlog::set_default_logger(spdlog::stderr_color_mt("vigil"));
  CLI::App app{"vigil: real-time YOLO object detection runtime"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vigil " VIGIL_VERSION);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  int exit_code = 0;
  vigil::cli::AddDetectCommand(app, &exit_code);
  vigil::cli::AddModelCommands(app, &exit_code);
  CLI::App* bench = vigil::cli::AddBenchCommands(app, &exit_code);
  vigil::cli::AddBenchPlacementCommand(*bench, &exit_code);
  vigil::cli::AddBenchStreamsCommand(*bench, &exit_code);
  vigil::cli::AddBenchTransportCommand(*bench, &exit_code);
  vigil::cli::AddBenchAggregatorCommand(*bench, &exit_code);
  vigil::cli::AddTopoCommand(app, &exit_code);
  vigil::cli::AddAggregatorCommand(app, &exit_code);
  vigil::cli::AddEdgeCommand(app, &exit_code);
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {  // a library threw past a command: report, never crash
    std::fprintf(stderr, "vigil: error: %s\n", e.what());
    return 2;
  }
  return exit_code;
}
