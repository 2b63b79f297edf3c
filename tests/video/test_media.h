// Test media for the video tests, generated at test time with the ffmpeg CLI (Debian's ffmpeg package)
// into a temporary folder, and a loopback RTSP server. Nothing generated here is committed.
//
// The RTSP server: FFmpeg 5.1's RTSP muxer cannot listen (`-rtsp_flags listen` is for its demuxer, which
// receives a RECORD; "Error initializing output stream" as a muxer), so it cannot serve a player.
// Instead `ffmpeg -re -stream_loop -1 -c copy -f rtp` sends the clip as RTP to a UDP socket of the test
// (RtpFeed), and RtspRelay answers OPTIONS/DESCRIBE/SETUP/PLAY on 127.0.0.1 for one client at a time
// (RFC 2326; the SDP is ffmpeg's, with a control attribute added) and forwards each RTP datagram to it
// interleaved on the RTSP connection ('$', channel 0, 16-bit length, packet; RFC 2326 §10.12).
// Stopping the relay closes its listening socket and the client's connection: to the client, the
// server went away; starting it again on the same port brings it back.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "vigil/video/source.h"

extern char** environ;

namespace vigil::video::testing {

inline bool HaveFfmpeg() {
  static const bool have = std::system("ffmpeg -version >/dev/null 2>&1") == 0;
  return have;
}

#define VIGIL_REQUIRE_FFMPEG()                                                                   \
  do {                                                                                           \
    if (!::vigil::video::testing::HaveFfmpeg()) {                                                \
      GTEST_SKIP() << "the ffmpeg CLI is not installed (Debian package ffmpeg): cannot generate " \
                      "test media";                                                              \
    }                                                                                            \
  } while (0)

// A fresh folder under /tmp, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "vigil-video-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs `ffmpeg -nostdin -y -loglevel error <args>`; true on success (a failure is reported to gtest).
inline bool Ffmpeg(const std::string& args) {
  const std::string command = "ffmpeg -nostdin -hide_banner -y -loglevel error " + args + " 2>&1";
  const int rc = std::system(command.c_str());
  if (rc != 0) ADD_FAILURE() << "command failed (" << rc << "): " << command;
  return rc == 0;
}

// Four solid quadrants, W×H: top-left red, top-right lime (pure green), bottom-left blue, bottom-right white.
inline std::string QuadrantFilter(int w, int h) {
  std::ostringstream f;
  f << "color=c=black:s=" << w << "x" << h << ",format=rgb24,"
    << "drawbox=x=0:y=0:w=" << w / 2 << ":h=" << h / 2 << ":c=red:t=fill,"
    << "drawbox=x=" << w / 2 << ":y=0:w=" << w - w / 2 << ":h=" << h / 2 << ":c=lime:t=fill,"
    << "drawbox=x=0:y=" << h / 2 << ":w=" << w / 2 << ":h=" << h - h / 2 << ":c=blue:t=fill,"
    << "drawbox=x=" << w / 2 << ":y=" << h / 2 << ":w=" << w - w / 2 << ":h=" << h - h / 2 << ":c=white:t=fill";
  return f.str();
}

// Runs a program (argv[0] looked up in PATH); stops it with SIGTERM (then waits) on destruction.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

inline int BindUdp() {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  return fd;
}

inline int LocalPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A TCP port on 127.0.0.1 that nothing listens on (bound, then released).
inline int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  const int port = LocalPort(fd);
  close(fd);
  return port;
}

inline int ListenTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// `ffmpeg -re -stream_loop -1 -i clip -c copy -f rtp` into two UDP sockets of this process (RTP, RTCP).
class RtpFeed {
 public:
  RtpFeed(const std::string& clip, const std::string& sdp_path) : rtp_(BindUdp()), rtcp_(BindUdp()) {
    const std::string url = "rtp://127.0.0.1:" + std::to_string(LocalPort(rtp_)) +
                            "?rtcpport=" + std::to_string(LocalPort(rtcp_));
    ffmpeg_ = std::make_unique<Child>(std::vector<std::string>{
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", clip,
        "-an", "-c", "copy", "-f", "rtp", "-sdp_file", sdp_path, url});
    for (int i = 0; i < 100 && sdp_.find("m=video") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream in(sdp_path);
      sdp_.assign(std::istreambuf_iterator<char>(in), {});
    }
  }
  ~RtpFeed() {
    ffmpeg_.reset();
    close(rtp_);
    close(rtcp_);
  }
  bool ok() const { return ffmpeg_->running() && sdp_.find("m=video") != std::string::npos; }
  const std::string& sdp() const { return sdp_; }
  int rtp_fd() const { return rtp_; }
  int rtcp_fd() const { return rtcp_; }

 private:
  int rtp_, rtcp_;
  std::unique_ptr<Child> ffmpeg_;
  std::string sdp_;
};

class RtspRelay {
 public:
  RtspRelay(RtpFeed* feed, int port) : feed_(feed), port_(port) {}
  ~RtspRelay() { Stop(); }

  bool Start() {
    listen_fd_ = ListenTcp(port_);
    if (listen_fd_ < 0) return false;
    running_ = true;
    thread_ = std::thread([this] { Serve(); });
    return true;
  }
  void Stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "rtsp://127.0.0.1:" + std::to_string(port_) + "/live"; }

 private:
  void Serve() {
    int client = -1;
    bool playing = false;
    std::string in;
    char buf[65536];
    while (running_) {
      pollfd fds[4] = {{listen_fd_, POLLIN, 0}, {feed_->rtp_fd(), POLLIN, 0}, {feed_->rtcp_fd(), POLLIN, 0},
                       {client, POLLIN, 0}};
      if (poll(fds, client >= 0 ? 4 : 3, 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        if (client >= 0) close(client);
        client = accept(listen_fd_, nullptr, nullptr);
        playing = false;
        in.clear();
      }
      if (fds[1].revents & POLLIN) {
        const ssize_t n = recv(feed_->rtp_fd(), buf + 4, sizeof(buf) - 4, 0);
        if (n > 0 && playing) {
          buf[0] = '$';
          buf[1] = 0;
          buf[2] = char((n >> 8) & 0xff);
          buf[3] = char(n & 0xff);
          if (send(client, buf, size_t(n) + 4, MSG_NOSIGNAL) < 0) playing = false;
        }
      }
      if (fds[2].revents & POLLIN) recv(feed_->rtcp_fd(), buf, sizeof(buf), 0);
      if (client >= 0 && (fds[3].revents & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = recv(client, buf, sizeof(buf), 0);
        if (n <= 0) {
          close(client);
          client = -1;
          continue;
        }
        in.append(buf, size_t(n));
        while (HandleRequest(client, &in, &playing)) {}
      }
    }
    if (client >= 0) close(client);
    close(listen_fd_);
  }

  // Consumes one interleaved packet or one request from `in` and answers the request; false when `in`
  // holds no complete item.
  bool HandleRequest(int client, std::string* in, bool* playing) {
    if (!in->empty() && (*in)[0] == '$') {
      if (in->size() < 4) return false;
      const size_t len = 4 + ((size_t(uint8_t((*in)[2])) << 8) | uint8_t((*in)[3]));
      if (in->size() < len) return false;
      in->erase(0, len);
      return true;
    }
    const size_t end = in->find("\r\n\r\n");
    if (end == std::string::npos) return false;
    const std::string request = in->substr(0, end);
    in->erase(0, end + 4);
    const std::string method = request.substr(0, request.find(' '));
    std::string cseq = "0";
    if (const size_t p = request.find("CSeq:"); p != std::string::npos) {
      cseq = request.substr(p + 5, request.find("\r\n", p) - p - 5);
      cseq.erase(0, cseq.find_first_not_of(' '));
    }
    std::string reply = "RTSP/1.0 200 OK\r\nCSeq: " + cseq + "\r\n";
    std::string body;
    if (method == "OPTIONS") {
      reply += "Public: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN, GET_PARAMETER\r\n";
    } else if (method == "DESCRIBE") {
      body = Sdp();
      reply += "Content-Base: " + url() + "/\r\nContent-Type: application/sdp\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n";
    } else if (method == "SETUP") {
      reply += "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\nSession: 4242\r\n";
    } else if (method == "PLAY") {
      reply += "Session: 4242\r\nRange: npt=0.000-\r\n";
      *playing = true;
    }
    reply += "\r\n" + body;
    send(client, reply.data(), reply.size(), MSG_NOSIGNAL);
    return true;
  }

  // ffmpeg's SDP for the RTP session, as an RTSP session description: port 0, a control attribute.
  std::string Sdp() const {
    std::istringstream lines(feed_->sdp());
    std::string line, out;
    while (std::getline(lines, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("c=", 0) == 0) line = "c=IN IP4 0.0.0.0";
      if (line.rfind("m=video", 0) == 0) {
        out += "m=video 0" + line.substr(line.find(' ', 8)) + "\r\na=control:streamid=0\r\n";
        continue;
      }
      if (line.rfind("SDP:", 0) == 0 || line.empty()) continue;
      out += line + "\r\n";
    }
    return out;
  }

  RtpFeed* feed_;
  const int port_;
  int listen_fd_ = -1;
  std::atomic<bool> running_{false};
  std::thread thread_;
};

// Reads up to `max_frames` frames from `source`; fails the test on an error.
inline std::vector<Frame> ReadAll(Source& source, size_t max_frames = 100000) {
  std::vector<Frame> frames;
  while (frames.size() < max_frames) {
    StatusOr<std::optional<Frame>> next = source.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    frames.push_back(std::move(**next));
  }
  return frames;
}

}  // namespace vigil::video::testing
