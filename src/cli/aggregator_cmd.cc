// `vigil aggregator [--config agg.yaml]`: the aggregation node (vigil/aggregator/aggregator.h), run
// until SIGINT or SIGTERM, then stopped cleanly (what was received is stored and acknowledged).
//
// On start it prints one line to stdout with the bound addresses (port 0 in the config = any free
// port), for scripts and tests:
//   vigil aggregator: edges tcp://0.0.0.0:7400 http http://127.0.0.1:7401 db vigil-aggregator.db
// (tls+tcp:// with TLS; " ucx ucx://host:port" after the tcp address when the ucx link listens, then
// " cuda_ipc unix:PATH (rings on DEVICE)" when the cuda_ipc link does; https://).
// Exit code: 0 after a signal, 1 when it cannot start (port in use, database unusable), 2 for a bad
// configuration (each problem named with its key and line).
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "vigil/aggregator/aggregator.h"

namespace vigil::cli {
namespace {

int RunAggregator(const std::string& config_path) {
  aggregator::AggregatorConfig config;
  if (!config_path.empty()) {
    StatusOr<aggregator::AggregatorConfig> loaded = aggregator::LoadAggregatorConfig(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "vigil aggregator: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = *loaded;
  }
  // Block the stop signals before any thread starts (threads inherit the mask), then wait for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  StatusOr<std::unique_ptr<aggregator::Aggregator>> agg = aggregator::Aggregator::Start(config);
  if (!agg.ok()) {
    std::fprintf(stderr, "vigil aggregator: %s\n", std::string(agg.status().message()).c_str());
    return 1;
  }
  const std::string ucx =
      (config.ucx_enabled ? StrCat(" ucx ucx://", config.ucx_host, ":", (*agg)->ucx_port()) : std::string()) +
      (config.cuda_ipc_enabled
           ? StrCat(" cuda_ipc unix:", config.cuda_ipc_socket, " (rings on ", config.cuda_ipc_device, ")")
           : std::string());
  std::printf("vigil aggregator: edges %s://%s:%u%s http %s://%s:%u db %s\n",
              config.tls_cert_file.empty() ? "tcp" : "tls+tcp", config.listen_host.c_str(), (*agg)->listen_port(),
              ucx.c_str(), config.http_cert_file.empty() ? "http" : "https", config.http_host.c_str(),
              (*agg)->http_port(), aggregator::Store::Redacted(config.db_path).c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "vigil aggregator: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*agg)->Stop();
  return 0;
}

}  // namespace

void AddAggregatorCommand(CLI::App& app, int* exit_code) {
  auto config = std::make_shared<std::string>();
  CLI::App* cmd =
      app.add_subcommand("aggregator", "Run the aggregation node: receive, de-duplicate and store edge reports");
  cmd->add_option("--config", *config,
                  "agg.yaml; keys: listen, ucx_listen, ucx_device, http (host:port), cuda_ipc {socket, device, slots, slot_bytes, "
                  "allow_uids}, allow (CIDR list), auth {keys_file, required}, "
                  "tls {cert_file, key_file, client_ca_file}, http_tls {cert_file, key_file}, http_token_file, db (SQLite file or "
                  "postgresql:// URL), db_password_file|db_password_env, db_synchronous (normal|full), "
                  "retention {max_age_hours, max_events, interval_s}, max_connections, batch_max, queue_max, snapshot_queue_mb, "
                  "peer_timeout_ms, "
                  "push [{name, webhook {url, timeout_ms, token_file|token_env, ca_file} | mqtt {broker, topic_prefix, "
                  "client_id, username, password_file|password_env, ca_file, timeout_ms}, route {edges, streams, "
                  "classes, min_severity}, on (stored|confirmed), once_per_track, retry {initial_ms, max_ms, max_attempts}}], "
                  "confirm {tracker {high_score, low_score, new_track_score, match_iou, low_match_iou, min_hits, "
                  "max_lost_s}, rules {k, m, min_duration_s, min_travel_px}, overrides [{streams, classes, k, m, "
                  "min_duration_s, min_travel_px}], idle_s, association {device (auto|cpu|cuda:N), max_streams, max_tracks, "
                  "max_detections}, classifier {model, device, threads, labels, normalize "
                  "(unit|imagenet), min_score, confirm, reject, relabel, wait_s}}. "
                  "auth.keys_file is required unless auth: {required: false} (docs/architecture.md, Access control)");
  cmd->footer("Exit: 0 stopped by SIGINT/SIGTERM, 1 cannot start, 2 bad configuration.");
  cmd->callback([config, exit_code] { *exit_code = RunAggregator(*config); });
}

}  // namespace vigil::cli
