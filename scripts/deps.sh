#!/usr/bin/env bash
# Installs the Debian 12 packages vigil needs. Usage: scripts/deps.sh [build|test|fuzz|all]
#   build: compilers, CMake/Ninja and the libraries vigil links (plus the sample images/video)
#   test:  build + what the test suites need (Python, Debian's PyTorch for exporting test models)
#   fuzz:  what the libFuzzer build needs alone (clang with its runtimes, CMake/Ninja, abseil): scripts/fuzz.sh
# Only missing packages are installed; nothing happens when all are present.
set -euo pipefail
what=${1:-build}

build_pkgs=(
  build-essential cmake ninja-build pkg-config git ca-certificates python3
  libabsl-dev libprotobuf-dev protobuf-compiler libonnx-dev libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  libopencv-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwloc-dev libnuma-dev libavformat-dev libavcodec-dev libavutil-dev libswscale-dev
  libsqlite3-dev libyaml-cpp-dev libcpp-httplib-dev
  libpq-dev                     # the aggregator's PostgreSQL storage (aggregator/store.h); optional: VIGIL_WITH_POSTGRES=AUTO
  libcurl4-openssl-dev          # the aggregator's webhooks (aggregator/push.h)
  libmosquitto-dev              # the aggregator's MQTT push (aggregator/push.h)
  libssl-dev                    # OpenSSL 3: TLS links (transport/tls.h); the tests make their certificates with it
  zlib1g-dev                    # the protocol's CRC-32
  prometheus-cpp-dev            # metrics: prometheus-cpp core (families, histograms, text exposition)
  libucx-dev                    # the ucx link kind (UCP active messages); optional: VIGIL_WITH_UCX=AUTO
  libturbojpeg0-dev             # JPEG pictures mirrored to the hot standby; optional: VIGIL_WITH_TURBOJPEG=AUTO
  libgrpc++-dev protobuf-compiler-grpc  # the hot standby's replication channel (gRPC, mutual TLS); optional: VIGIL_WITH_GRPC=AUTO
  dpkg-dev file                 # cpack's .deb: dpkg-shlibdeps computes Depends
  opencv-doc darknet            # sample images and video (vtest.avi, dog.jpg, ...)
)
test_pkgs=(
  python3 python3-venv python3-pip python3-numpy python3-opencv
  ffmpeg sqlite3                     # test media generation, the RTP feed behind the loopback RTSP test server
  openssl                            # the CLI, to inspect the certificates the TLS tests write
  python3-torch python3-torchvision   # Debian's CPU PyTorch 1.13: exports test models, no CUDA wheels
  ucx-utils                          # ucx_info / ucx_perftest: what UCX sees and measures on this host
  mosquitto mosquitto-clients        # the MQTT push tests start a broker and subscribe with mosquitto_sub
  postgresql                         # the storage suites run against PostgreSQL too (scripts/postgres.sh starts one)
  chromium chromium-driver python3-selenium  # the dashboard's test drives a headless Chromium
  clang libomp-dev                   # the thread-safety check: clang -Wthread-safety over every source (scripts/thread-safety.sh)
)
fuzz_pkgs=(
  clang libclang-rt-dev              # libFuzzer, ASan/UBSan runtimes
  cmake ninja-build libabsl-dev zlib1g-dev
)

case $what in
  fuzz) pkgs=("${fuzz_pkgs[@]}") ;;
  all) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}" "${fuzz_pkgs[@]}") ;;
  test) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) pkgs=("${build_pkgs[@]}") ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps.sh: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
