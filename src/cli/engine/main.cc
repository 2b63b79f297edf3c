// vigil-engine — the engine-only build of the CLI: `model inspect|run`, `bench engine`, `bench streams`
// and `bench placement`, linked against vigil_detect, vigil_infer, vigil_topology (hwloc) and OpenCV's
// core + imgproc only (no FFmpeg, SQLite, image codecs). For machines that run models but lack the
// media libraries, e.g. a GPU benchmark host the binary is carried to (scripts/gpu-check.sh).
// Same options and exit codes as those `vigil` subcommands (cli/commands.h).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("vigil"));
  CLI::App app{"vigil-engine: run and benchmark ONNX models (engine-only vigil)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vigil-engine 0.1.0");
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  int exit_code = 0;
  vigil::cli::AddModelCommands(app, &exit_code);
  CLI::App* bench = vigil::cli::AddBenchCommands(app, &exit_code);
  vigil::cli::AddBenchPlacementCommand(*bench, &exit_code);
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vigil-engine: error: %s\n", e.what());
    return 2;
  }
  return exit_code;
}
