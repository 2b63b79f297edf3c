// The MQTT push delivery (aggregator/push.h MakeMqtt), with libmosquitto.
#include <mosquitto.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "vigil/aggregator/push.h"
#include "vigil/common/deadline.h"

namespace vigil::aggregator {
namespace {

void MosquittoInit() {
  static const int init = mosquitto_lib_init();
  (void)init;
}

// A topic level from an id or label: MQTT's wildcards and the level separator are replaced.
std::string Level(std::string s) {
  for (char& c : s) {
    if (c == '+' || c == '#' || c == '/' || c == '\0') c = '_';
  }
  return s.empty() ? std::string("_") : s;
}

class Mqtt final : public Delivery {
 public:
  explicit Mqtt(MqttOptions o) : opt_(std::move(o)) {}
  ~Mqtt() override {
    if (m_ != nullptr) {
      mosquitto_disconnect(m_);
      mosquitto_loop_stop(m_, /*force=*/true);
      mosquitto_destroy(m_);
    }
  }

  Status Init() {
    MosquittoInit();
    const std::string id = opt_.client_id.empty() ? StrCat("vigil-", opt_.sink) : opt_.client_id;
    m_ = mosquitto_new(id.c_str(), /*clean_session=*/true, this);
    if (m_ == nullptr) return absl::InternalError(StrCat("push sink '", opt_.sink, "': cannot create an MQTT client"));
    mosquitto_int_option(m_, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V311);
    mosquitto_connect_callback_set(m_, [](mosquitto*, void* self, int rc) { static_cast<Mqtt*>(self)->OnConnect(rc); });
    mosquitto_disconnect_callback_set(m_, [](mosquitto*, void* self, int rc) {
      static_cast<Mqtt*>(self)->OnDisconnect(rc);
    });
    mosquitto_publish_callback_set(m_, [](mosquitto*, void* self, int mid) { static_cast<Mqtt*>(self)->OnPublish(mid); });
    mosquitto_reconnect_delay_set(m_, 1, 10, true);
    if (!opt_.username.empty() &&
        mosquitto_username_pw_set(m_, opt_.username.c_str(), opt_.password.empty() ? nullptr : opt_.password.c_str()) !=
            MOSQ_ERR_SUCCESS) {
      return absl::InvalidArgumentError(StrCat("push sink '", opt_.sink, "': mqtt credentials refused"));
    }
    if (!opt_.ca_file.empty()) {
      const int rc = mosquitto_tls_set(m_, opt_.ca_file.c_str(), nullptr, nullptr, nullptr, nullptr);
      if (rc != MOSQ_ERR_SUCCESS) {
        return absl::InvalidArgumentError(
            StrCat("push sink '", opt_.sink, "': mqtt ca_file ", opt_.ca_file, ": ", mosquitto_strerror(rc)));
      }
    }
    if (const int rc = mosquitto_loop_start(m_); rc != MOSQ_ERR_SUCCESS) {
      return absl::InternalError(StrCat("push sink '", opt_.sink, "': mqtt network thread: ", mosquitto_strerror(rc)));
    }
    return absl::OkStatus();
  }

  DeliveryOutcome Deliver(const StoredEvent& event) override {
    const Deadline deadline = Deadline::After(std::chrono::milliseconds(opt_.timeout_ms));
    MutexLock lock(mu_);
    if (!connected_) {
      if (!connecting_) {
        connecting_ = true;
        lock.Unlock();
        const int rc = mosquitto_connect_async(m_, opt_.host.c_str(), opt_.port, opt_.keepalive_s);
        lock.Lock();
        if (rc != MOSQ_ERR_SUCCESS) {
          connecting_ = false;
          return {DeliveryOutcome::kRetry, StrCat("mqtt ", opt_.host, ":", opt_.port, ": ", mosquitto_strerror(rc))};
        }
      }
      while (!connected_) {
        if (!cv_.WaitUntil(lock, deadline)) break;
      }
      if (!connected_) {
        return {DeliveryOutcome::kRetry, StrCat("mqtt ", opt_.host, ":", opt_.port, ": not connected within ",
                                                opt_.timeout_ms, " ms", last_error_.empty() ? "" : ": " + last_error_)};
      }
    }
    lock.Unlock();
    // One message per class in the event, on <prefix>/<edge>/<stream>/<label>, and the stream's retained state.
    const std::string payload = EventJson(event);
    const std::string base = StrCat(opt_.topic_prefix, "/", Level(event.edge), "/", Level(event.stream), "/");
    std::set<std::string> labels;
    for (const StoredDetection& d : event.detections) labels.insert(Level(d.label));
    if (labels.empty()) labels.insert("event");
    std::vector<std::pair<std::string, bool>> topics;  // (topic, retain)
    for (const std::string& l : labels) topics.emplace_back(base + l, false);
    topics.emplace_back(base + "state", true);
    std::vector<int> mids;
    for (const auto& [topic, retain] : topics) {
      int mid = 0;
      const int rc = mosquitto_publish(m_, &mid, topic.c_str(), static_cast<int>(payload.size()), payload.data(),
                                       /*qos=*/1, retain);
      if (rc != MOSQ_ERR_SUCCESS) return {DeliveryOutcome::kRetry, StrCat("mqtt publish ", topic, ": ", mosquitto_strerror(rc))};
      mids.push_back(mid);
    }
    lock.Lock();
    // PUBACK for every message (QoS 1): the broker has them.
    while (!AllAcked(mids)) {
      if (!cv_.WaitUntil(lock, deadline)) break;
    }
    const bool acked = AllAcked(mids);
    for (int mid : mids) {
      if (acked_.erase(mid) == 0) abandoned_.insert(mid);  // its PUBACK, if it comes late, claims nothing
    }
    if (!acked) {
      return {DeliveryOutcome::kRetry, StrCat("mqtt ", opt_.host, ":", opt_.port, ": no PUBACK within ",
                                              opt_.timeout_ms, " ms")};
    }
    return {DeliveryOutcome::kDelivered, ""};
  }

  std::string describe() const override {
    return StrCat("mqtt ", opt_.ca_file.empty() ? "" : "(TLS) ", opt_.host, ":", opt_.port, " ", opt_.topic_prefix,
                  "/<edge>/<stream>/<class>");
  }

 private:
  bool AllAcked(const std::vector<int>& mids) const VIGIL_REQUIRES(mu_) {
    for (int mid : mids) {
      if (acked_.count(mid) == 0) return false;
    }
    return true;
  }
  void OnConnect(int rc) {
    {
      MutexLock lock(mu_);
      connected_ = rc == 0;
      if (rc != 0) last_error_ = mosquitto_connack_string(rc);
      acked_.clear();
      abandoned_.clear();  // a new connection: the old mids are gone
    }
    if (rc == 0) spdlog::info("push sink '{}': connected to mqtt {}:{}", opt_.sink, opt_.host, opt_.port);
    cv_.NotifyAll();
  }
  void OnDisconnect(int rc) {
    {
      MutexLock lock(mu_);
      if (connected_ && rc != 0) spdlog::warn("push sink '{}': mqtt connection lost; reconnecting", opt_.sink);
      connected_ = false;
      last_error_ = rc == 0 ? "disconnected" : "connection lost";
    }
    cv_.NotifyAll();
  }
  void OnPublish(int mid) {
    {
      MutexLock lock(mu_);
      if (abandoned_.erase(mid) == 0) acked_.insert(mid);
    }
    cv_.NotifyAll();
  }

  const MqttOptions opt_;
  mosquitto* m_ = nullptr;
  Mutex mu_;
  CondVar cv_;
  bool connected_ VIGIL_GUARDED_BY(mu_) = false;
  bool connecting_ VIGIL_GUARDED_BY(mu_) = false;
  std::string last_error_ VIGIL_GUARDED_BY(mu_);
  std::set<int> acked_ VIGIL_GUARDED_BY(mu_);  // PUBACKs not yet claimed
  std::set<int> abandoned_ VIGIL_GUARDED_BY(mu_);  // mids a timed-out delivery gave up on
};

}  // namespace

StatusOr<std::unique_ptr<Delivery>> MakeMqtt(const MqttOptions& options) {
  if (options.host.empty() || options.port <= 0 || options.port > 65535) {
    return absl::InvalidArgumentError(StrCat("push sink '", options.sink, "': mqtt needs a broker host:port"));
  }
  auto m = std::make_unique<Mqtt>(options);
  VIGIL_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<Delivery>(std::move(m));
}

}  // namespace vigil::aggregator
