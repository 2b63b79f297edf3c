// Events pushed to the plant's systems (aggregator/push.h): the Pusher and the webhook delivery (libcurl).
#include "vigil/aggregator/push.h"
#include "vigil/common/deadline.h"

#include <curl/curl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

namespace vigil::aggregator {
namespace {

using nlohmann::json;

// libcurl's global set-up, once per process, before any handle (not thread-safe itself).
void CurlGlobalInit() {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)init;
}

size_t KeepBody(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  const size_t bytes = size * n;
  if (body->size() < 512) body->append(data, std::min(bytes, 512 - body->size()));  // the start, for the error
  return bytes;
}

class Webhook final : public Delivery {
 public:
  explicit Webhook(WebhookOptions o) : opt_(std::move(o)) {}
  ~Webhook() override {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
    if (headers_ != nullptr) curl_slist_free_all(headers_);
  }
  Status Init() {
    CurlGlobalInit();
    curl_ = curl_easy_init();
    if (curl_ == nullptr) return absl::InternalError(StrCat("push sink '", opt_.sink, "': cannot create a libcurl handle"));
    return absl::OkStatus();
  }
  DeliveryOutcome Deliver(const StoredEvent& event) override {
    const std::string body = EventJson(event);
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, StrCat("Idempotency-Key: ", EventKey(event)).c_str());
    headers = curl_slist_append(headers, StrCat("X-Vigil-Sink: ", opt_.sink).c_str());
    if (!opt_.token.empty()) headers = curl_slist_append(headers, StrCat("Authorization: Bearer ", opt_.token).c_str());
    if (headers_ != nullptr) curl_slist_free_all(headers_);
    headers_ = headers;
    std::string answer;
    char error[CURL_ERROR_SIZE] = {};
    curl_easy_reset(curl_);
    curl_easy_setopt(curl_, CURLOPT_URL, opt_.url.c_str());
    curl_easy_setopt(curl_, CURLOPT_POST, 1L);
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, static_cast<long>(opt_.timeout_ms));
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min<int64_t>(opt_.timeout_ms, 5000)));
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, KeepBody);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl_, CURLOPT_PROTOCOLS_STR, "http,https");
    if (!opt_.ca_file.empty()) curl_easy_setopt(curl_, CURLOPT_CAINFO, opt_.ca_file.c_str());
    const CURLcode rc = curl_easy_perform(curl_);
    if (rc != CURLE_OK) {
      return {DeliveryOutcome::kRetry, StrCat(curl_easy_strerror(rc), error[0] != '\0' ? StrCat(": ", error) : "")};
    }
    long status = 0;
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300) return {DeliveryOutcome::kDelivered, ""};
    const std::string detail = StrCat("HTTP ", status, answer.empty() ? "" : StrCat(": ", answer));
    const bool transient = status == 408 || status == 425 || status == 429 || status >= 500 || status < 200;
    return {transient ? DeliveryOutcome::kRetry : DeliveryOutcome::kRejected, detail};
  }
  std::string describe() const override { return StrCat("webhook ", opt_.url); }

 private:
  const WebhookOptions opt_;
  CURL* curl_ = nullptr;
  curl_slist* headers_ = nullptr;
};

}  // namespace

int64_t BackoffMs(const RetryPolicy& policy, int attempts) {
  int64_t d = std::max<int64_t>(policy.initial_ms, 1);
  for (int i = 1; i < attempts && d < policy.max_ms; ++i) d *= 2;
  return std::min(d, std::max<int64_t>(policy.max_ms, 1));
}

std::string EventKey(const StoredEvent& e) { return StrCat(e.edge, "/", e.stream, "/", e.run, "/", e.seq); }

std::string EventJson(const StoredEvent& e) {
  json dets = json::array();
  for (const StoredDetection& d : e.detections) {
    dets.push_back({{"class_id", d.class_id},
                    {"label", d.label},
                    {"score", d.score},
                    {"box", {d.x1, d.y1, d.x2, d.y2}},
                    {"track_id", d.track_id},
                    {"second_label", d.second_label},
                    {"second_score", d.second_score}});
  }
  const json j = {{"id", e.id},
                  {"key", EventKey(e)},
                  {"edge", e.edge},
                  {"stream", e.stream},
                  {"run", e.run},
                  {"seq", e.seq},
                  {"epoch", e.epoch},
                  {"capture_ns", e.capture_ns},
                  {"pts_ns", e.pts_ns},
                  {"publish_ns", e.publish_ns},
                  {"stored_ns", e.stored_ns},
                  {"severity", e.severity},
                  {"rule", e.rule},
                  {"width", e.width},
                  {"height", e.height},
                  {"state", ToString(e.state)},
                  {"state_reason", e.state_reason},
                  {"decided_ns", e.decided_ns},
                  {"detections", std::move(dets)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

StatusOr<std::unique_ptr<Delivery>> MakeWebhook(const WebhookOptions& options) {
  if (options.url.rfind("http://", 0) != 0 && options.url.rfind("https://", 0) != 0) {
    return absl::InvalidArgumentError(
        StrCat("push sink '", options.sink, "': webhook url '", options.url, "' is not an http:// or https:// URL"));
  }
  auto w = std::make_unique<Webhook>(options);
  VIGIL_RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<Delivery>(std::move(w));
}

Pusher::Pusher(Store* store, std::string sink, std::unique_ptr<Delivery> delivery, RetryPolicy policy, Clock* clock,
               std::function<void(const DeliveryOutcome&, bool, int64_t)> on_outcome)
    : store_(store),
      sink_(std::move(sink)),
      delivery_(std::move(delivery)),
      policy_(policy),
      clock_(clock),
      on_outcome_(std::move(on_outcome)) {}

Pusher::~Pusher() { Stop(); }

StatusOr<std::optional<int64_t>> Pusher::RunDue(int limit) {
  const int64_t now = clock_->WallNs();
  if (now < pause_until_ns_) return std::optional<int64_t>(pause_until_ns_);
  VIGIL_ASSIGN_OR_RETURN(std::vector<OutboxItem> due, store_->PushDue(sink_, now, limit));
  // Delivered rows are deleted in groups (DeliverDue flushes every kDeleteEvery of deliveries, this the rest): a
  // crash before a group's transaction re-delivers its rows — at least once, keyed by the event.
  std::vector<int64_t> delivered;
  Status st = DeliverDue(due, delivered);
  Status del = Flush(delivered);
  if (st.ok()) st = del;
  VIGIL_RETURN_IF_ERROR(st);
  VIGIL_ASSIGN_OR_RETURN(std::optional<int64_t> next, store_->PushNextDue(sink_));
  if (next && *next < pause_until_ns_) next = pause_until_ns_;
  return next;
}

Status Pusher::Flush(std::vector<int64_t>& delivered) {
  if (delivered.empty()) return absl::OkStatus();
  Status del = store_->PushDelivered(delivered);
  delivered.clear();
  if (!del.ok()) {
    MutexLock lock(mu_);
    ++stats_.store_errors;
  }
  return del;
}

Status Pusher::DeliverDue(std::vector<OutboxItem>& due, std::vector<int64_t>& delivered) {
  int64_t group_began = 0;  // when the first delivery of the undeleted group began (steady ns)
  for (OutboxItem& item : due) {
    {
      MutexLock lock(mu_);
      if (stopping_) break;
    }
    if (delivered.empty()) group_began = clock_->SteadyNs();
    const DeliveryOutcome out = delivery_->Deliver(item.event);
    const int attempts = item.attempts + 1;
    const int64_t at = clock_->WallNs();
    bool dead = false;
    Status st;
    if (out.kind == DeliveryOutcome::kDelivered) {
      delivered.push_back(item.id);
    } else if (out.kind == DeliveryOutcome::kRejected || attempts >= policy_.max_attempts) {
      dead = true;
      st = store_->PushDead(item.id, attempts, out.detail, at);
      spdlog::error("push sink '{}': event {} given up after {} attempt(s) ({}): {}", sink_, EventKey(item.event),
                    attempts, delivery_->describe(), out.detail);
    } else {
      st = store_->PushRetry(item.id, attempts, at + BackoffMs(policy_, attempts) * 1'000'000, out.detail);
      if (attempts == 1) {
        spdlog::warn("push sink '{}': event {} not delivered ({}): {}; retrying", sink_, EventKey(item.event),
                     delivery_->describe(), out.detail);
      }
    }
    {
      MutexLock lock(mu_);
      if (!st.ok()) ++stats_.store_errors;
      if (out.kind == DeliveryOutcome::kDelivered) {
        ++stats_.delivered;
      } else if (dead) {
        ++stats_.dead;
      } else {
        ++stats_.retried;
      }
    }
    if (on_outcome_) on_outcome_(out, dead, at - item.event.stored_ns);
    if (!st.ok()) return st;
    // A transient failure says the sink is down or overloaded: the rest waits with it (one delivery probes
    // the sink per backoff step) instead of each due event costing a timeout now.
    if (out.kind == DeliveryOutcome::kRetry) {
      pause_until_ns_ = at + BackoffMs(policy_, ++failures_in_row_) * 1'000'000;
      break;
    }
    if (out.kind == DeliveryOutcome::kDelivered) {
      failures_in_row_ = 0;
      // A slow sink's delivery is deleted at once; fast ones in groups of kDeleteEvery (see RunDue).
      if (clock_->SteadyNs() - group_began >= kDeleteEvery) VIGIL_RETURN_IF_ERROR(Flush(delivered));
    }
  }
  return absl::OkStatus();
}

void Pusher::Start() { thread_ = std::thread([this] { Loop(); }); }

void Pusher::Wake() {
  {
    MutexLock lock(mu_);
    woken_ = true;
  }
  cv_.NotifyAll();
}

void Pusher::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

PusherStats Pusher::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void Pusher::Loop() {
  bool failing = false;
  for (;;) {
    StatusOr<std::optional<int64_t>> next = RunDue();
    int64_t wait_ns = 0;
    if (!next.ok()) {
      if (!failing) spdlog::error("push sink '{}': {}; trying again", sink_, std::string(next.status().message()));
      failing = true;
      wait_ns = 1'000'000'000;
    } else {
      failing = false;
      // Nothing due: sleep until the next row is, or a commit queues one (Wake); at most a minute.
      wait_ns = *next ? std::clamp<int64_t>(**next - clock_->WallNs(), 0, 60'000'000'000) : 60'000'000'000;
    }
    MutexLock lock(mu_);
    // A real-time wait of at most wait_ns, to a deadline fixed now (a spurious wake-up waits only what is left): the
    // Clock seam only times what is due, so a FakeClock in the tests never makes this loop spin.
    const Deadline give_up = Deadline::After(std::chrono::nanoseconds(wait_ns));
    while (wait_ns > 0 && !stopping_ && !woken_) {
      if (!cv_.WaitUntil(lock, give_up)) break;
    }
    if (stopping_) return;
    woken_ = false;
  }
}

}  // namespace vigil::aggregator
