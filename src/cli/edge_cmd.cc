// `vigil edge --config edge.yaml`: runs the edge pipeline (pipeline/edge.h) until every finite stream
// has ended or SIGINT/SIGTERM asks for a graceful stop (flush, wait for acks, persist cursors).
// --metrics-out FILE writes the final metrics (Prometheus text, as /metrics serves them) when the run
// ends, for batch runs and benchmarks that cannot scrape a process that has exited.
// Exit code: 0 done, 1 the metrics file could not be written, 2 bad configuration, model or state dir (also a
// state dir locked by another edge), 3 fenced: the aggregator admitted a newer instance of this edge id, so
// this one stopped publishing (a supervisor should not restart it blindly: two instances are configured).
// Without the pipeline module (a build without FFmpeg) the command exists and says so.
#include <csignal>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"

#ifdef VIGIL_HAVE_PIPELINE
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge.h"
#include "vigil/pipeline/edge_config.h"
#endif

namespace vigil::cli {

#ifdef VIGIL_HAVE_PIPELINE
namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

extern "C" void OnStopSignal(int) { g_stop.store(true); }

}  // namespace

void AddEdgeCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("edge", "Run an edge: streams in, detections and progress to the aggregator");
  auto config_path = std::make_shared<std::string>();
  auto timeout_ms = std::make_shared<int>(10000);
  auto metrics_out = std::make_shared<std::string>();
  cmd->add_option("--config", *config_path,
                  "edge.yaml; keys: edge, aggregator (host:port), model {path, conf, iou, max_det, threads, device, "
                  "workers, precision, batch}, batching {max_batch, max_wait_ms}, hwaccel, http_host, http_port, "
                  "http_allow, http_token_file, http_tls {cert_file, key_file}, state_dir, progress_flush_ms, transport "
                  "{links, key_file, tls {cert_file, key_file, ca_file, server_name}, cuda_ipc, cuda_ipc_linger_us, "
                  "max_outbox, ack_timeout_ms, probe_interval_ms}, placement {bind, bind_single_numa, topology, "
                  "gflop_per_frame}, replication {role, listen, peer, node, tls {cert_file, key_file, ca_file}, "
                  "heartbeat_ms, detector {kind, misses, threshold, min_std_dev_ms, acceptable_pause_ms}, step_down "
                  "{stall_ms, errors}, warm_sources, mirror_frames, jpeg_quality, mirror_window, mirror_via, mirror_socket "
                  "(the primary's), mirror_slots, mirror_slot_mb, mirror_memory (the standby's)}, snapshots {enabled, frame, "
                  "max_width, crops, crop_margin, crop_max_side, quality, queue}, streams [{id, source, "
                  "realtime, loop, target_fps, hwaccel, save_frames, placement {width, height, fps}, rules {classes, "
                  "min_score, roi, cooldown_s, confirm {k, m} (leave cooldown_s and confirm out when the aggregator confirms), "
                  "severity {warning, critical}}, snapshots {enabled, frame, "
                  "max_width, crops, crop_margin, crop_max_side, quality}}] (README, docs/architecture.md)")
      ->required();
  cmd->add_option("--shutdown-timeout-ms", *timeout_ms, "how long to wait for acks at the end")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  cmd->add_option("--metrics-out", *metrics_out, "write the final metrics (Prometheus text) to this file at the end");
  cmd->footer(
      "Exit codes: 0 done (every finite stream ended, or SIGINT/SIGTERM); 1 --metrics-out could not be written; 2 bad "
      "configuration, model or state_dir (also a state_dir locked by another edge, or a standby refused by its "
      "primary); 3 fenced (an edge without replication): the aggregator admitted a newer instance of this edge id (do "
      "not restart blindly: two instances are configured).");
  cmd->callback([=] {
    StatusOr<pipeline::EdgeConfig> config = pipeline::LoadEdgeConfig(*config_path);
    if (!config.ok()) {
      std::fprintf(stderr, "vigil edge: %s\n", std::string(config.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    struct sigaction sa = {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    metrics::Registry registry;
    pipeline::EdgeRunOptions options;
    options.shutdown_timeout = std::chrono::milliseconds(*timeout_ms);
    options.on_started = [](uint16_t port) {
      if (port != 0) std::fprintf(stderr, "vigil edge: http on port %u\n", port);
    };
    Status st = pipeline::RunEdge(*config, g_stop, registry, options);
    if (!st.ok()) {
      std::fprintf(stderr, "vigil edge: %s\n", std::string(st.message()).c_str());
      *exit_code = absl::IsAborted(st) ? 3 : 2;
      if (absl::IsAborted(st) && !metrics_out->empty()) {
        std::ofstream out(*metrics_out, std::ios::trunc);
        out << registry.Render();
      }
      return;
    }
    *exit_code = 0;
    if (!metrics_out->empty()) {
      std::ofstream out(*metrics_out, std::ios::trunc);
      out << registry.Render();
      if (!out.flush()) {
        std::fprintf(stderr, "vigil edge: --metrics-out %s: cannot write\n", metrics_out->c_str());
        *exit_code = 1;
      }
    }
  });
}
#else
void AddEdgeCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("edge", "Run an edge (unavailable: this vigil was built without FFmpeg)");
  cmd->allow_extras();
  cmd->callback([exit_code] {
    std::fprintf(stderr, "vigil edge: this vigil was built without FFmpeg (video ingest); rebuild with it\n");
    *exit_code = 2;
  });
}
#endif

}  // namespace vigil::cli
