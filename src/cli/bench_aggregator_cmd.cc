// `vigil bench aggregator` — load for a running `vigil aggregator`: simulated edges that speak the product's
// own protocol (transport::MakeFramedLink over MakeTcpDialer, authenticated with the edge key like `vigil edge`)
// and send one Report per frame, as an edge with no coalescing would; it measures what the aggregator stores.
//
//   vigil bench aggregator --target 127.0.0.1:7400 [--edges 4] [--streams 32] [--seconds 10] [--rate 0]
//                          [--window 256] [--event-every 4] [--detections 3] [--motion-px 0] [--layout row]
//                          [--key-hex HEX] [--json FILE]
//
// Every edge (ids bench-0, bench-1, …; one key for all: --key-hex or VIGIL_EDGE_KEY) opens one session, holds
// --streams streams (run = the start time, so every run is new) and sends their frames round robin: every
// --event-every-th frame an event of --detections rows of class 0 ("person"; 80×200 px boxes 100 px apart, moving
// --motion-px to the right per frame of their stream, wrapping at x = 1600: load for confirm.h's tracker; with
// --layout grid the boxes tile the 1920×1080 frame instead, each 80 % of its cell, moving right and wrapping after a
// fifth of the cell's width: a crowded scene of hundreds of boxes), the others progress; a frame's pts_ns is its seq at 30 FPS. At
// most --window Reports per edge await their Ack; --rate caps the reports per second of all edges together (0: as
// fast as the acks allow). The Ack of a Report comes after the aggregator committed it (durable before ack), so
//   - stored/s: Reports acknowledged per second over the timed part (after one warm-up second);
//   - ack latency p50/p99/max (ms): Link::Send to its Ack, the storage queue and the commit included.
// A Reject or an Ack missing for 10 s fails the run (exit 1). The aggregator's own numbers (commit time, CPU,
// pushes) are on its /metrics: tools/bench/aggregator_bench.py starts it and reads both.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/bench_stats.h"
#include "cli/commands.h"
#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/link.h"
#include "vigil/transport/protocol.h"
#include "vigil/transport/connection.h"

namespace vigil::cli {
namespace {

namespace tp = vigil::transport;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};

struct BenchAggregatorArgs {
  std::string target;
  int edges = 4;
  int streams = 32;
  double seconds = 10;
  double rate = 0;
  int window = 256;
  int event_every = 4;
  int detections = 3;
  double motion_px = 0;
  std::string layout = "row";
  std::string key_hex;
  std::string json_file;
};

struct EdgeResult {
  uint64_t sent = 0, acked = 0, acked_timed = 0;
  std::vector<double> latency_ms;  // timed part
  std::string error;
};

int64_t NowNs() { return SystemClock()->WallNs(); }

void RunEdge(const BenchAggregatorArgs& a, int index, const std::string& key, const std::string& host, uint16_t port,
             Clock::time_point t0, Clock::time_point timed_from, Clock::time_point end, EdgeResult* out) {
  std::unique_ptr<tp::Link> link = tp::MakeFramedLink(tp::MakeTcpDialer(host, port), {"tcp", key});
  tp::Hello hello;
  hello.edge = StrCat("bench-", index);
  hello.class_names = {"person", "car", "truck"};
  const uint64_t run = static_cast<uint64_t>(NowNs());
  for (int s = 0; s < a.streams; ++s) hello.streams.push_back({StrCat("cam", s), run});
  StatusOr<tp::Welcome> w = link->Open(hello, kTimeout);
  if (!w.ok()) {
    out->error = StrCat(hello.edge, ": open: ", w.status().message());
    return;
  }
  // In flight: (stream, seq) → send time; the Ack names the stream and seq range.
  Mutex mu;  // guards in_flight (local variables: the analysis cannot annotate them)
  std::map<std::pair<int, uint64_t>, Clock::time_point> in_flight;
  std::counting_semaphore<> credits(a.window);
  std::atomic<bool> done{false}, failed{false};
  std::string reader_error;
  std::thread reader([&] {
    auto progress = SteadyNow();
    for (;;) {
      {
        MutexLock lock(mu);
        if (done.load() && in_flight.empty()) return;
      }
      StatusOr<std::optional<tp::Message>> m = link->Receive(milliseconds(100));
      if (!m.ok()) {
        reader_error = std::string(m.status().message());
        failed = true;
        return;
      }
      const auto now = SteadyNow();
      if (!m->has_value()) {
        if (now - progress > kTimeout) {
          reader_error = StrCat("no Ack within ", kTimeout.count(), " ms");
          failed = true;
          return;
        }
        continue;
      }
      if (const tp::Reject* r = std::get_if<tp::Reject>(&**m)) {
        reader_error = StrCat("Reject ", tp::ToString(r->reason), ": ", r->detail);
        failed = true;
        return;
      }
      const tp::Ack* ack = std::get_if<tp::Ack>(&**m);
      if (ack == nullptr) continue;
      progress = now;
      const int stream = std::stoi(ack->stream.substr(3));
      MutexLock lock(mu);
      auto it = in_flight.find({stream, ack->seq_first});
      if (it == in_flight.end()) continue;
      ++out->acked;
      if (it->second >= timed_from && now <= end) {
        ++out->acked_timed;
        out->latency_ms.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
      }
      in_flight.erase(it);
      credits.release();
    }
  });
  std::vector<uint64_t> seqs(static_cast<size_t>(a.streams), 0);
  const double per_edge_rate = a.rate > 0 ? a.rate / a.edges : 0;
  Status send_status;
  for (uint64_t n = 0; !failed.load(); ++n) {
    if (per_edge_rate > 0) {
      const auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(n / per_edge_rate));
      if (due >= end) break;
      std::this_thread::sleep_until(due);
    } else if (SteadyNow() >= end) {
      break;
    }
    if (!credits.try_acquire_for(kTimeout)) continue;  // the reader reports a stall
    const int s = static_cast<int>(n % static_cast<uint64_t>(a.streams));
    tp::OutboxMessage m;
    tp::Report& r = m.report;
    r.stream = StrCat("cam", s);
    r.run = run;
    r.seq_first = r.seq_last = seqs[static_cast<size_t>(s)]++;
    r.capture_ns = r.publish_ns = NowNs();
    // A 30 FPS source's presentation time: the stream's own clock (confirm.h tracks in it), not the send time —
    // reports leave in bursts as acks free the window, and their send times say nothing of the frames' spacing.
    r.pts_ns = static_cast<int64_t>(r.seq_first) * 1'000'000'000 / 30;
    if (a.event_every > 0 && r.seq_first % static_cast<uint64_t>(a.event_every) == 0) {
      r.kind = tp::ReportKind::kEvent;
      r.severity = tp::Severity::kWarning;
      r.rule = "person";
      r.width = 1920;
      r.height = 1080;
      if (a.layout == "grid" && a.detections > 0) {
        const int cols = static_cast<int>(std::ceil(std::sqrt(a.detections * 16.0 / 9.0)));
        const int rows = (a.detections + cols - 1) / cols;
        const double cw = 1920.0 / cols, ch = 1080.0 / rows;
        const double shift = std::fmod(static_cast<double>(r.seq_first) * a.motion_px, 0.2 * cw);
        for (int d = 0; d < a.detections; ++d) {
          const auto x = static_cast<float>((d % cols) * cw + shift), y = static_cast<float>((d / cols) * ch);
          r.detections.push_back({x, y, x + static_cast<float>(0.8 * cw), y + static_cast<float>(0.8 * ch), 0.8f, 0});
        }
      } else {
        for (int d = 0; d < a.detections; ++d) {
          const float x = 100.0f * static_cast<float>(d) +
                          static_cast<float>(std::fmod(static_cast<double>(r.seq_first) * a.motion_px, 1600.0));
          r.detections.push_back({x, 200, x + 80, 400, 0.8f, 0});
        }
      }
    } else {
      r.kind = tp::ReportKind::kProgress;
    }
    {
      MutexLock lock(mu);
      in_flight[{s, r.seq_first}] = SteadyNow();
    }
    const tp::OutboxMessage* p = &m;
    send_status = link->Send(std::span<const tp::OutboxMessage* const>(&p, 1), kTimeout);
    if (!send_status.ok()) break;
    ++out->sent;
  }
  done = true;
  if (!send_status.ok()) link->Close();
  reader.join();
  link->Close();
  if (!send_status.ok()) out->error = StrCat(hello.edge, ": send: ", send_status.message());
  else if (failed.load()) out->error = StrCat(hello.edge, ": ", reader_error);
}

int BenchAggregator(const BenchAggregatorArgs& a) {
  const size_t colon = a.target.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "vigil bench aggregator: --target %s: expected host:port\n", a.target.c_str());
    return 2;
  }
  const std::string host = a.target.substr(0, colon);
  const int port = std::atoi(a.target.c_str() + colon + 1);
  if (port <= 0 || port > 65535) {
    std::fprintf(stderr, "vigil bench aggregator: --target %s: bad port\n", a.target.c_str());
    return 2;
  }
  std::string key;
  std::string hex = a.key_hex;
  if (hex.empty()) {
    if (const char* env = std::getenv("VIGIL_EDGE_KEY")) hex = env;
  }
  if (!hex.empty()) {
    StatusOr<std::string> k = tp::ParseHexKey(hex, a.key_hex.empty() ? "VIGIL_EDGE_KEY" : "--key-hex");
    if (!k.ok()) {
      std::fprintf(stderr, "vigil bench aggregator: %s\n", std::string(k.status().message()).c_str());
      return 2;
    }
    key = *k;
  }
  const auto t0 = SteadyNow();
  const auto timed_from = t0 + std::chrono::seconds(1);
  const auto end = timed_from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
  std::vector<EdgeResult> results(static_cast<size_t>(a.edges));
  std::vector<std::thread> threads;
  for (int i = 0; i < a.edges; ++i) {
    threads.emplace_back(RunEdge, std::cref(a), i, std::cref(key), std::cref(host), static_cast<uint16_t>(port), t0,
                         timed_from, end, &results[static_cast<size_t>(i)]);
  }
  for (std::thread& t : threads) t.join();
  uint64_t sent = 0, acked = 0, timed = 0;
  std::vector<double> lat;
  std::string errors;
  for (EdgeResult& r : results) {
    sent += r.sent;
    acked += r.acked;
    timed += r.acked_timed;
    lat.insert(lat.end(), r.latency_ms.begin(), r.latency_ms.end());
    if (!r.error.empty()) errors += r.error + "\n";
  }
  const double stored_per_s = static_cast<double>(timed) / a.seconds;
  const Latency l = Summarize(std::move(lat));
  const double p50 = l.p50, p99 = l.p99, max = l.max;
  std::printf("bench aggregator %s: %d edges x %d streams, window %d, %s, event every %d frames (%d rows)\n",
              a.target.c_str(), a.edges, a.streams, a.window,
              a.rate > 0 ? StrCat("offered ", a.rate, " reports/s").c_str() : "as fast as acked", a.event_every,
              a.detections);
  std::printf("sent %llu, acked %llu (the warm-up second included); timed %.1f s: %.0f reports/s stored; ack latency p50 %.2f ms, p99 %.2f ms, "
              "max %.2f ms\n",
              static_cast<unsigned long long>(sent), static_cast<unsigned long long>(acked), a.seconds, stored_per_s,
              p50, p99, max);
  if (!errors.empty()) std::fprintf(stderr, "vigil bench aggregator: %s", errors.c_str());
  if (!a.json_file.empty()) {
    nlohmann::json j = {{"target", a.target},       {"edges", a.edges},         {"streams", a.streams},
                        {"window", a.window},       {"rate", a.rate},           {"event_every", a.event_every},
                        {"detections", a.detections}, {"motion_px", a.motion_px}, {"layout", a.layout}, {"seconds", a.seconds},   {"sent", sent},
                        {"acked", acked},           {"acked_timed", timed},     {"stored_per_s", stored_per_s},
                        {"ack_ms_p50", p50},        {"ack_ms_p99", p99},        {"ack_ms_max", max},
                        {"errors", errors}};
    std::ofstream f(a.json_file);
    f << j.dump(1) << "\n";
  }
  return errors.empty() ? 0 : 1;
}

}  // namespace

void AddBenchAggregatorCommand(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<BenchAggregatorArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "aggregator", "Reports per second a running `vigil aggregator` stores and acknowledges, and the ack latency "
                    "(ms), from simulated edges speaking the product's protocol (one Report per frame)");
  cmd->add_option("--target", a->target, "the aggregator's edge listener, host:port")->required();
  cmd->add_option("--edges", a->edges, "simulated edges (one session each)")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--streams", a->streams, "streams per edge")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--seconds", a->seconds, "timed seconds (after one warm-up second)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--rate", a->rate, "reports per second of all edges together; 0: as fast as the acks allow")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--window", a->window, "Reports awaiting their Ack per edge, at most")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--event-every", a->event_every, "every Nth frame of a stream is an event (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--detections", a->detections, "rows per event")->check(CLI::Range(0, 1000))->capture_default_str();
  cmd->add_option("--motion-px", a->motion_px, "each row's box moves this far right per frame of its stream")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
  cmd->add_option("--layout", a->layout, "row: boxes 100 px apart in a row; grid: tiling the frame (crowded scenes)")
      ->check(CLI::IsMember({"row", "grid"}))
      ->capture_default_str();
  cmd->add_option("--key-hex", a->key_hex, "the edges' key (hex); default: VIGIL_EDGE_KEY");
  cmd->add_option("--json", a->json_file, "also write one JSON object to this file");
  cmd->callback([a, exit_code] { *exit_code = BenchAggregator(*a); });
}

}  // namespace vigil::cli
