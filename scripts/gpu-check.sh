#!/usr/bin/env bash
# gpu-check.sh — every GPU check and benchmark of vigil in one call, for a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh pack          # here (Debian, CUDA toolkit, no GPU needed): build and bundle
#   scripts/gpu-check.sh run [STAGES]  # on the GPU machine, from the repository root; results in $OUT
#
# `pack` builds vigil, vigil-engine and the GPU and video test binaries (build/, CUDA on), then writes
# .device/ (ignored by git): bin.tar.xz with the four binaries, libs.tar.xz with their shared-library closure minus
# glibc, libstdc++ and the NVIDIA driver, cuDNN and cuBLAS (the GPU machine has those: the driver, cuBLAS in
# /usr/local/cuda, cuDNN in the PyTorch virtualenv), models/ (../shared/models and the small generated
# models that PyTorch cannot rebuild there), images/ (darknet's samples), media/ (a 1920x1080 30 FPS H.264
# clip made from vtest.avi) and whl/ (ultralytics wheels, pure Python, so PyTorch there can build the same
# networks for the side-by-side benchmark). The GPU machine has no FFmpeg and the packaged one's closure is
# too large to carry, so the bundle holds Debian's FFmpeg source built with only what vigil uses
# (scripts/ffmpeg-min.sh: same sonames and symbol versions); and OpenCV's imgcodecs links GDAL and GDCM
# (~150 MB with their closures) that vigil never reaches, so those two come as stubs that abort naming the
# symbol if ever called (tools/gpu/stub_libs.py).
#
# `run` (DEVICE.md's recipe) unpacks the libraries, points LD_LIBRARY_PATH at them and at cuDNN, and runs
# the stages given (default: all, in this order):
#   export    the ONNX exports of YOLOv8n/11n/26n/YOLOX-nano at 640 that `bench` times, built there with
#             PyTorch + Ultralytics (seeded), so that `tests` also covers them
#   tests     GPU GoogleTest suite (op grid, device-resident runs, whole models vs the CPU backend),
#             with VIGIL_CUDNN_AUTOTUNE=1 (cuDNN's first plan: correctness needs no timing, loads are faster)
#   sanitize  compute-sanitizer memcheck over a representative subset of the GPU tests (SANITIZE_FILTER: other
#             tests; SANITIZE_TOOL: another tool, e.g. racecheck)
#   confirm   the aggregator's confirmation (issue 20) at CONFIRM_RATE (3840) reports/s of 128 streams, every frame
#             an event of CONFIRM_BOXES (3,30,100,300) moving boxes tiling the frame: `vigil aggregator` (SQLite)
#             with confirm.association.device cpu and cuda:0 (CONFIRM_ASSOCIATION) under `vigil bench aggregator`
#             (tools/bench/aggregator_bench.py): the tracking time per report, side by side (CONFIRM_ARGS: more options)
#   models    fp16/fp32 detections on real images vs ONNX Runtime (tools/gpu/check_models.py)
#   bench     vigil-engine vs PyTorch eager / torch.compile (tools/gpu/bench_torch.py), YOLOv8n first
#   classify  the aggregator's second model (issue 20): `vigil model classify` on cuda:0 vs the CPU backend on crops
#             of the sample pictures, two classifier exports built there (tools/gpu/check_classifier.py), ms per crop
#   placement `vigil-engine bench placement --json`: host->device copies from pageable, pinned and
#             NUMA-local pinned memory (issue 5's benchmark)
#   streams   `vigil bench streams` (the edge pipeline against an in-process aggregator): the largest number
#             of 1920x1080 30 FPS synthetic streams (no decoding; GPU letterbox + YOLOv8n fp16 + GPU NMS)
#             one GPU holds with p99 frame-to-detection <= 25 ms; every visible GPU as well when there are
#             several (STREAMS_ONE / STREAMS_MULTI: the stream counts tried; STREAMS_ARGS: more options)
#   video     the GPU decode tests (vigil_video_tests GpuDecode.* and Hwaccel.*; VIDEO_FILTER)
#   nvdec     `vigil bench streams --video`: the same sweep with every stream decoding the H.264 clip, by
#             NVDEC into GPU memory (STREAMS_NVDEC) and, for comparison, on the CPU (STREAMS_CPUDEC)
#   edge      the edge process itself: `vigil aggregator` + `vigil edge` with EDGE_STREAMS streams of the
#             clip, `hwaccel: cuda`, the model on cuda:0 in fp16; every frame must reach the aggregator
#   snapshots event pictures from NVDEC frames (issue 19): SNAP_STREAMS (4) streams with `snapshots: {crops:
#             true}`, then one decoded on the CPU; every event's pictures accounted, frame pictures equal to the
#             CPU run's
#   ipc       the cuda_ipc link (issue 15): `vigil bench transport` with the rows in GPU memory — cuda_ipc
#             (device-to-device into the aggregator's ring on cuda:0) vs the host-staged tcp path (D2H, TCP,
#             H2D) — and with host rows, and cuda_ipc with a kernel launch per slot (--ring-linger-us 0); then `vigil edge` with links [cuda_ipc, tcp] and IPC_STREAMS NVDEC
#             streams against `vigil aggregator` SIGKILLed twice mid-run (restarted once without cuda_ipc,
#             then with it): every frame stored once, the edge back on cuda_ipc; and a tcp-only run of the same
#             clip whose stored detections must match the cuda_ipc run's (IPC_E2E=0 skips it); then the product
#             sweep (tools/gpu/edge_sweep.py) at IPC_PRODUCT_STREAMS (128) streams over cuda_ipc and over tcp;
#             IPC_COMPARE=FILE adds the cuda_ipc bench with another vigil binary and this one, alternately
#   ucx       the ucx link with PyPI libucx-cu13 (CUDA transports; bundled by `pack` as ucx.tar.xz and put first
#             on LD_LIBRARY_PATH): ucx_info, `vigil bench transport --memory device` over ucx (rows sent from GPU
#             memory, received into the aggregator's), tcp and cuda_ipc, ucx_perftest of the same UCX (am/tag
#             latency, host and CUDA memory, 4 KB), and the edge/aggregator kill run over [ucx, tcp] (ucx.json)
#   standby   hot standby on one GPU (issue 17; tools/gpu/standby_gpu.py): primary and standby `vigil edge` as two
#             processes on cuda:0, STANDBY_STREAMS (32) live cameras (H.264 MPEG-TS over TCP from a server in the
#             tool, .device/media/vtest_1080p30.ts) decoded by NVDEC, STANDBY_KILLS (10) SIGKILLs of the current
#             primary (each restarted to rejoin as the standby): takeover times, lost / stored-twice frames, the
#             mirroring cost on the primary; per STANDBY_RUNS entry mirror:streams[:heartbeat_ms[:kills[/stops]]]
#             (default "shm-gpu:32 channel:32": the picture ring in GPU memory, then JPEGs over the channel; 100 ms;
#             mirror "none" is the cost's baseline, nothing mirrored). Needs .device/certs (pair certificates: `pack`
#             makes them with openssl)
#   product   the product under load (issue 13's benchmark): `vigil aggregator` + `vigil edge` as processes
#             with N NVDEC streams of the clip in real time, N in PRODUCT_STREAMS, the dynamic-batch YOLOv8n
#             (PRODUCT_MODEL=int8: the shared int8 one, batch 1) in fp16 (tools/gpu/edge_sweep.py:
#             frame->detection and frame->stored p50/p99, FPS per stream, drops, CPU per frame), then
#             `vigil bench streams --video` at the same N in the same call, side by side
#   profile   batch-64 YOLOv8n fp16 loads with a cold and a warm cuDNN plan cache (VIGIL_CUDNN_PLAN_CACHE),
#             ncu (--clock-control none) over one inference (`vigil-engine bench engine --profile-range 1`),
#             summarised per kernel kind (tools/gpu/ncu_summary.py), and the card's measured ceilings
#             (tools/gpu/ceilings.py: cuBLAS fp16 GEMM, device-to-device copy)
# Every stage shares one cuDNN plan-cache file (VIGIL_CUDNN_PLAN_CACHE, default /tmp/plan-cache.json), so a
# model and batch planned by an earlier stage load without timing; load times are cold only the first time.
# Each stage logs to $OUT/<stage>.log and writes JSON results beside it; a failing stage does not stop
# the others (STAGE_TIMEOUT seconds each, default 900); the exit status is non-zero when any stage
# failed. At the end everything but summary.txt is packed into $OUT/results.tgz. BENCH_ARGS passes options
# to bench_torch.py, TESTS_FILTER a --gtest_filter to `tests`. Never changes clocks or GPU modes.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEV="$ROOT/.device"
mode="${1:-run}"
shift || true

pack() {
  set -e
  local build="${BUILD_DIR:-$ROOT/build}"
  cmake -S "$ROOT" -B "$build" -G Ninja -DVIGIL_WITH_CUDA=ON >/dev/null
  ninja -C "$build" vigil vigil-engine vigil_cuda_tests vigil_video_tests
  local ffmin="${FFMPEG_MIN:-$build/ffmpeg-min}" stubs="$build/device-stubs" lib=/lib/x86_64-linux-gnu
  bash "$ROOT/scripts/ffmpeg-min.sh" "$ffmin"
  python3 "$ROOT/tools/gpu/stub_libs.py" --consumer "$lib/libopencv_imgcodecs.so.406" --out "$stubs" \
    --return-zero GDALAllRegister "$lib/libgdal.so.32" "$lib/libgdcmMSFF.so.3.0" "$lib/libgdcmDSED.so.3.0"
  if LD_LIBRARY_PATH="$stubs" ldd -r "$lib/libopencv_imgcodecs.so.406" 2>&1 | grep "undefined symbol"; then
    echo "pack: the stubs leave imports of imgcodecs unresolved (above)" >&2; return 1
  fi
  rm -rf "$DEV/bin" "$DEV/models" "$DEV/images" "$DEV/media" "$DEV/libs.tar.xz" "$DEV/bin.tar.xz"
  mkdir -p "$DEV/bin" "$DEV/models" "$DEV/images" "$DEV/media" "$DEV/whl"
  cp "$build/src/vigil" "$build/src/vigil-engine" "$build/tests/vigil_cuda_tests" "$build/tests/vigil_video_tests" \
    "$DEV/bin/"
  strip --strip-debug "$DEV/bin/"*
  LD_LIBRARY_PATH="$stubs:$ffmin/lib" ldd "$DEV"/bin/* | awk '/=>/{print $3}' | sort -u |
    grep -vE 'lib(c|m|dl|pthread|rt)\.so|ld-linux|libstdc\+\+|libgcc_s|libcuda\.|libnvidia|libcudnn|libcublas' \
      >"$DEV/libs.txt"
  if grep -E "^$lib/lib(av|sw|gdal|gdcm)" "$DEV/libs.txt"; then
    echo "pack: the closure above still names packaged FFmpeg/GDAL/GDCM libraries" >&2; return 1
  fi
  tar -chf - --transform 's,.*/,,' -T "$DEV/libs.txt" | xz -6 -T2 >"$DEV/libs.tar.xz"
  tar -cf - -C "$DEV/bin" . | xz -6 -T2 >"$DEV/bin.tar.xz" && rm -rf "$DEV/bin"  # 18 MB -> ~5 MB
  cp "$ROOT"/../shared/models/*.onnx "$DEV/models/" 2>/dev/null || echo "note: ../shared/models absent"
  for m in yolox_nano_416_b1_op11 yolov5n_320_dyn_op17 yolov8n_320_b1_op17_qdq; do
    cp "$build/testmodels/$m.onnx" "$DEV/models/" 2>/dev/null || echo "note: $m absent (run scripts/test.sh first)"
  done
  cp /usr/share/darknet/data/{dog,person,horses,giraffe,kite}.jpg "$DEV/images/" 2>/dev/null || true
  [ -f /usr/share/doc/opencv-doc/examples/data/messi5.jpg ] && cp /usr/share/doc/opencv-doc/examples/data/messi5.jpg "$DEV/images/"
  # A 1920x1080 camera-like frame for `streams`: vtest.avi's frame 100, scaled up.
  local vtest=/usr/share/doc/opencv-doc/examples/data/vtest.avi
  [ -f "$vtest" ] && ffmpeg -loglevel error -y -i "$vtest" -vf "select=eq(n\,100),scale=1920:1080" -frames:v 1 \
    -q:v 2 "$DEV/images/vtest_1080p.jpg"
  # The `nvdec`/`edge`/`product` clip: vtest.avi (795 frames of 10 FPS pedestrians, looped) played at 30 FPS,
  # scaled to 1920x1080, H.264 High without B-frames (as IP cameras send it), 2 s GOP, 2.5 Mbit/s: 900
  # frames, 30 s, ~9.5 MB. Longer than a `product` trial's warm-up and window, so no stream loops (a loop
  # re-opens the file, and NVDEC decoders are created one after another: a benchmark artefact cameras
  # do not have).
  [ -f "$vtest" ] && ffmpeg -loglevel error -y -stream_loop 1 -i "$vtest" -vf "setpts=N/(30*TB),scale=1920:1080" \
    -r 30 -frames:v 900 -c:v libx264 -preset fast -profile:v high -bf 0 -g 60 -b:v 2500k -maxrate 2500k \
    -bufsize 5M -pix_fmt yuv420p "$DEV/media/vtest_1080p30.mp4"
  # The same clip as MPEG-TS for `standby`'s live cameras (a stream a client can join mid-way).
  [ -f "$DEV/media/vtest_1080p30.mp4" ] && ffmpeg -loglevel error -y -i "$DEV/media/vtest_1080p30.mp4" -c copy \
    -f mpegts "$DEV/media/vtest_1080p30.ts"
  # The hot standby pair's certificates for `standby` (one CA, one certificate per node, 2 days).
  if command -v openssl >/dev/null; then
    local py=python3
    [ -x "$build/venv/bin/python" ] && py="$build/venv/bin/python"
    PYTHONPATH="$ROOT/tests/models" "$py" -c 'import sys, pathlib; from test_standby_e2e import make_pair_certs
make_pair_certs(pathlib.Path(sys.argv[1]))' "$DEV/certs" 2>/dev/null ||
      echo "note: no pair certificates (tests/models needs pytest to import; run scripts/test-venv.sh)"
  fi
  # UCX with CUDA transports for the `ucx` stage: PyPI libucx-cu13's libraries, modules and tools (~7 MB).
  if [ ! -f "$DEV/ucx.tar.xz" ]; then
    local uw=/tmp/vigil-ucx-wheel
    rm -rf "$uw" && mkdir -p "$uw/x" "$uw/ucx/lib/ucx" "$uw/ucx/bin"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$uw" "libucx-cu13==${UCX_WHEEL_VERSION:-1.22.0}"
    (cd "$uw/x" && unzip -q "$uw"/libucx_cu13-*.whl)
    cp "$uw"/x/libucx/lib/lib{ucp,ucs,uct,ucm}.so.0 "$uw"/x/libucx_cu13.libs/* "$uw/ucx/lib/"
    cp "$uw"/x/libucx/lib/ucx/*.so.0 "$uw/ucx/lib/ucx/"
    cp "$uw"/x/libucx/bin/{ucx_perftest,ucx_info} "$uw/ucx/bin/"
    tar -cf - -C "$uw" ucx | xz -6 -T2 >"$DEV/ucx.tar.xz" && rm -rf "$uw"
  fi
  ls "$DEV"/whl/ultralytics-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d "$DEV/whl" \
    ultralytics==8.4.190 ultralytics-thop==2.2.3
  du -sh "$DEV"
}

run() {
  : "${OUT:=$ROOT/out/gpu}"
  export OUT
  mkdir -p "$OUT"
  # Packed into one archive at the end only when this run starts with an empty $OUT (never deletes files
  # it did not write).
  local pack_results=0
  [ -z "$(ls -A "$OUT")" ] && pack_results=1
  local stages="${*:-export tests sanitize models classify confirm bench placement streams video nvdec edge snapshots ipc ucx product profile}" failed=0
  mkdir -p /tmp/vl "$DEV/bin" && tar -xJf "$DEV/libs.tar.xz" -C /tmp/vl && tar -xJf "$DEV/bin.tar.xz" -C "$DEV/bin"
  [ -f "$DEV/ucx.tar.xz" ] && tar -xJf "$DEV/ucx.tar.xz" -C /tmp  # /tmp/ucx: PyPI libucx-cu13 (the `ucx` stage only)
  local cudnn
  cudnn="$(python3 -c 'import nvidia.cudnn, os; print(nvidia.cudnn.__path__[0])' 2>/dev/null)/lib"
  export LD_LIBRARY_PATH="/tmp/vl:$cudnn:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export VIGIL_TEST_MODELS="$DEV/models" VIGIL_SHARED_MODELS=/tmp/bench PYTHONUNBUFFERED=1
  # One cuDNN plan-cache file for the whole call: a model planned once (timed) loads in seconds in later
  # stages (the `profile` stage measures cold vs warm loads with a file of its own).
  export VIGIL_CUDNN_PLAN_CACHE="${VIGIL_CUDNN_PLAN_CACHE:-/tmp/plan-cache.json}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$DEV"/whl/*.whl >/dev/null 2>&1 &&
    export PYTHONPATH="/tmp/site:$ROOT/tools/testmodels:${PYTHONPATH:-}"
  # Images as H x W x 3 uint8 BGR .npy for the GPU tests (vigil-engine reads no image files).
  mkdir -p /tmp/images-npy
  python3 -c 'import cv2, numpy as np, pathlib, sys
for p in pathlib.Path(sys.argv[1]).glob("*.jpg"):
    np.save(pathlib.Path(sys.argv[2]) / (p.stem + ".npy"), cv2.imread(str(p)))' "$DEV/images" /tmp/images-npy
  export VIGIL_TEST_IMAGES=/tmp/images-npy
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    nvidia-smi topo -m 2>/dev/null
    "$DEV/bin/vigil-engine" --version
  } >"$OUT/machine.txt" 2>&1
  # The sanitize stage's tests (SANITIZE_FILTER replaces them; SANITIZE_TOOL=racecheck looks for shared-memory races).
  local SANITIZE_DEFAULT='Grid/CudaOpGrid.MatchesReference/yolo_like_chain*:Grid/CudaOpGrid.MatchesReference/matmul*:Grid/CudaOpGrid.MatchesReference/maxpool*:Grid/CudaOpGrid.MatchesReference/reductions*:Grid/CudaOpGrid.MatchesReference/end2end*:Grid/CudaOpGrid.MatchesReference/compare*:Grid/CudaOpGrid.MatchesReference/variadic*:Grid/CudaOpGrid.MatchesReference/pad*:Grid/CudaOpGrid.MatchesReference/batchnorm*:Grid/CudaOpGrid.MatchesReference/quantize*:Grid/CudaOpGrid.MatchesReference/dynamic_fake*:Grid/CudaOpGrid.MatchesReference/channel_slice*:CudaBackend.*:Cases/GpuLetterbox.*/odd_sizes:Cases/GpuLetterbox.*/pitched_rows:Cases/GpuNms.*/ultralytics_low_conf_many_tiles:Cases/GpuNms.*/end2end:Cases/GpuNms.*/yolox_raw:DeviceAssociatorTest.*'
  for stage in $stages; do
    echo "== $stage" | tee -a "$OUT/summary.txt"
    local t0=$SECONDS rc=0
    local lim="${STAGE_TIMEOUT:-900}"
    case "$stage" in
      export) timeout "$lim" python3 "$ROOT/tools/gpu/bench_torch.py" --engine "$DEV/bin/vigil-engine" --work /tmp/bench \
          --out "$OUT/export.json" --export-only >"$OUT/export.log" 2>&1 || rc=$? ;;
      tests) VIGIL_CUDNN_AUTOTUNE=1 timeout "$lim" "$DEV/bin/vigil_cuda_tests" --gtest_filter="${TESTS_FILTER:-*}" --gtest_output="json:$OUT/tests.json" >"$OUT/tests.log" 2>&1 || rc=$? ;;
      sanitize) VIGIL_CUDNN_AUTOTUNE=1 timeout "$lim" compute-sanitizer --tool "${SANITIZE_TOOL:-memcheck}" --error-exitcode 9 "$DEV/bin/vigil_cuda_tests" \
          --gtest_filter="${SANITIZE_FILTER:-$SANITIZE_DEFAULT}" >"$OUT/sanitize.log" 2>&1 || rc=$? ;;
      confirm) timeout "$lim" python3 "$ROOT/tools/bench/aggregator_bench.py" --vigil "$DEV/bin/vigil" --engines sqlite \
          --no-mqtt --confirm on --association "${CONFIRM_ASSOCIATION:-cpu,cuda:0}" --rates "${CONFIRM_RATE:-3840}" \
          --edges 4 --streams 32 --seconds "${CONFIRM_SECONDS:-8}" --event-every 1 --motion-px 4 --layout grid \
          --detections "${CONFIRM_BOXES:-3,30,100,300}" --json "$OUT/confirm.json" ${CONFIRM_ARGS:-} >"$OUT/confirm.log" 2>&1 || rc=$? ;;
      models) timeout "$lim" python3 "$ROOT/tools/gpu/check_models.py" --engine "$DEV/bin/vigil-engine" --models "$DEV/models" \
          --images "$DEV/images" --out "$OUT/models.json" >"$OUT/models.log" 2>&1 || rc=$? ;;
      bench) timeout "$lim" python3 "$ROOT/tools/gpu/bench_torch.py" --engine "$DEV/bin/vigil-engine" --work /tmp/bench \
          --models "$DEV/models" --out "$OUT/bench.json" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1 || rc=$? ;;
      placement) timeout "$lim" "$DEV/bin/vigil-engine" bench placement --json >"$OUT/placement.json" 2>"$OUT/placement.log" || rc=$? ;;
      classify) timeout "$lim" python3 "$ROOT/tools/gpu/check_classifier.py" --vigil "$DEV/bin/vigil" --images "$DEV/images" \
          --out "$OUT/classify.json" >"$OUT/classify.log" 2>&1 || rc=$? ;;
      streams|nvdec|edge|snapshots|ipc|ucx|standby|product|profile) timeout "$lim" bash "$ROOT/scripts/gpu-check.sh" "$stage" >"$OUT/$stage.log" 2>&1 || rc=$? ;;
      video) timeout "$lim" "$DEV/bin/vigil_video_tests" --gtest_filter="${VIDEO_FILTER:-GpuDecode.*:Hwaccel.*}" \
          --gtest_output="json:$OUT/video.json" >"$OUT/video.log" 2>&1 || rc=$? ;;
      *) echo "unknown stage '$stage'" >&2; rc=2 ;;
    esac
    echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    tail -n 3 "$OUT/$stage.log" 2>/dev/null | sed 's/^/   /' | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || failed=1
  done
  # At most 8 files come back from a device call: everything but the summary goes into one archive.
  if [ "$pack_results" = 1 ]; then
    (cd "$OUT" && tar -czf results.tgz --exclude=results.tgz --exclude=summary.txt -- * &&
      find . -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name summary.txt -exec rm -rf {} +)
  fi
  return $failed
}

# The stages below run inside `run`'s environment.
# YOLOv8n at 640 with a dynamic batch, the benchmarks' model (the `export` stage's, else exported now).
yolov8n() {
  local model=/tmp/bench/yolov8n_640_dyn.onnx
  [ -f "$model" ] || python3 "$ROOT/tools/gpu/bench_torch.py" --engine "$DEV/bin/vigil-engine" --work /tmp/bench \
    --out /tmp/export.json --export-only --archs yolov8n >&2
  echo "$model"
}

# `streams`: one GPU, then all of them when there are several.
streams() {
  local model gpus
  model=$(yolov8n)
  gpus=$(nvidia-smi -L | wc -l)
  local args=(--model "$model" --precision fp16 --json ${STREAMS_ARGS:-})
  local rc=0
  "$DEV/bin/vigil" bench streams "${args[@]}" --devices cuda:0 \
    --streams "${STREAMS_ONE:-32,64,96,128,160,176,192,208,224,256}" >"$OUT/streams-1gpu.json" || rc=1
  if [ "$gpus" -gt 1 ]; then
    local devs
    devs=$(seq -s, 0 $((gpus - 1)) | sed 's/\([0-9]*\)/cuda:\1/g')
    "$DEV/bin/vigil" bench streams "${args[@]}" --devices "$devs" \
      --streams "${STREAMS_MULTI:-64,128,192,256,320,352,384,416,448,512}" >"$OUT/streams-${gpus}gpu.json" || rc=1
  fi
  return $rc
}

# `nvdec`: the streams sweep on GPU 0 with every stream decoding the H.264 clip (NVDEC, then the CPU).
nvdec() {
  local model clip="$DEV/media/vtest_1080p30.mp4"
  model=$(yolov8n)
  local args=(--model "$model" --video "$clip" --precision fp16 --json --devices cuda:0 ${STREAMS_ARGS:-})
  local rc=0
  "$DEV/bin/vigil" bench streams "${args[@]}" --hwaccel cuda \
    --streams "${STREAMS_NVDEC:-64,128,160,192,208,224}" >"$OUT/nvdec-1gpu.json" || rc=1
  "$DEV/bin/vigil" bench streams "${args[@]}" --hwaccel cpu \
    --streams "${STREAMS_CPUDEC:-8,16,32}" >"$OUT/cpudec-1gpu.json" || rc=1
  return $rc
}

# `edge`: the edge process with NVDEC streams and the model on the GPU, against a local aggregator; then one
# stream decoded on the CPU with the same model, whose detections the NVDEC run must reproduce.
edge_run() {  # edge_run DIR STREAMS HWACCEL MODEL PORT [TOP-LEVEL YAML]
  local dir=$1 n=$2 hw=$3 model=$4 port=$5 extra=${6:-} i rc=0
  rm -rf "$dir" && mkdir -p "$dir"
  local key
  key=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
  printf 'gpu-edge: %s\n' "$key" >"$dir/keys.yaml" && chmod 600 "$dir/keys.yaml"
  export VIGIL_EDGE_KEY="$key"
  printf 'listen: 127.0.0.1:%s\nhttp: 127.0.0.1:%s\ndb: %s/vigil.db\nauth: {keys_file: %s/keys.yaml}\n' \
    "$port" $((port + 1)) "$dir" "$dir" >"$dir/agg.yaml"
  {
    printf 'edge: gpu-edge\naggregator: 127.0.0.1:%s\nmodel: {path: %s, device: cuda:0, precision: fp16}\n' "$port" "$model"
    [ -n "$extra" ] && printf '%s\n' "$extra"
    printf 'batching: {max_batch: 16, max_wait_ms: 10}\nstate_dir: %s/state\nhwaccel: %s\nstreams:\n' "$dir" "$hw"
    for i in $(seq "$n"); do
      printf '  - {id: cam%02d, source: %s, realtime: true, rules: {min_score: 0.3}}\n' "$i" "$DEV/media/vtest_1080p30.mp4"
    done
  } >"$dir/edge.yaml"
  "$DEV/bin/vigil" aggregator --config "$dir/agg.yaml" >"$dir/aggregator.log" 2>&1 &
  local agg=$! t0=$SECONDS
  sleep 2
  "$DEV/bin/vigil" --log-level info edge --config "$dir/edge.yaml" --metrics-out "$dir/edge.prom" \
    >"$dir/edge.log" 2>&1 || rc=$?
  echo "edge ($n streams, hwaccel $hw): exit $rc after $((SECONDS - t0)) s"
  kill "$agg"; wait "$agg" 2>/dev/null
  return $rc
}

edge() {
  local model="$DEV/models/yolov8n_coco_640_int8dyn.onnx" rc=0
  [ -f "$model" ] || model=$(yolov8n)
  edge_run /tmp/edge-nvdec "${EDGE_STREAMS:-16}" cuda "$model" 17500 || rc=1
  edge_run /tmp/edge-cpu 1 cpu "$model" 17510 || rc=1
  for d in nvdec cpu; do cp /tmp/edge-$d/edge.log "$OUT/edge-$d.log"; cp /tmp/edge-$d/edge.prom "$OUT/edge-$d.prom"; done
  python3 - /tmp/edge-nvdec /tmp/edge-cpu "${EDGE_STREAMS:-16}" >"$OUT/edge.json" <<'PY' || rc=1
import json, re, sqlite3, sys
nv, cpu, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def db(d): return sqlite3.connect(f"{d}/vigil.db")
def frames(d):
    return dict(db(d).execute("SELECT s.stream, COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id GROUP BY s.stream"))
def dets(d, stream):
    out = {}
    for seq, cls, score, *box in db(d).execute(
            "SELECT e.seq, d.class_id, d.score, d.x1, d.y1, d.x2, d.y2 FROM detections d JOIN events e "
            "ON e.id = d.event_id JOIN streams s ON s.id = e.stream_id WHERE s.stream = ?", (stream,)):
        out.setdefault(seq, []).append((cls, score, box))
    return out
def iou(a, b):
    w = max(0, min(a[2], b[2]) - max(a[0], b[0])); h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    u = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / u if u > 0 else 0
def unmatched(x, y, firm=0.4):  # detections of x with score >= firm that y lacks (same class, IoU >= 0.9)
    miss = total = 0
    for seq, ds in x.items():
        for cls, score, box in ds:
            if score < firm: continue
            total += 1
            if not any(c == cls and iou(box, b) >= 0.9 for c, _, b in y.get(seq, [])): miss += 1
    return miss, total
def decoders(d):
    out = {}
    for line in open(f"{d}/edge.prom"):
        m = re.match(r'vigil_edge_stream_decoder\{(.*)\} (\S+)', line)
        if m and float(m.group(2)) == 1:
            k = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))["decoder"]; out[k] = out.get(k, 0) + 1
    return out
def stage_means(d):
    sums = {}
    for line in open(f"{d}/edge.prom"):
        m = re.match(r'vigil_edge_stage_seconds_(sum|count)\{stage="(\w+)"\} (\S+)', line)
        if m: sums.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return {k: round(1e3 * v["sum"] / v["count"], 2) for k, v in sums.items() if v.get("count")}
f_nv, f_cpu = frames(nv), frames(cpu)
a, b = dets(nv, "cam01"), dets(cpu, "cam01")
miss_nv, firm_cpu = unmatched(b, a)
miss_cpu, firm_nv = unmatched(a, b)
ok = (len(f_nv) == n and all(v == 900 for v in f_nv.values()) and f_cpu == {"cam01": 900}
      and firm_cpu > 0 and miss_nv <= 0.02 * firm_cpu and miss_cpu <= 0.02 * firm_nv)
print(json.dumps({
    "nvdec_run": {"streams": n, "frames_per_stream": sorted(set(f_nv.values())), "decoders": decoders(nv),
                  "detections": db(nv).execute("SELECT COUNT(*) FROM detections").fetchone()[0],
                  "stage_mean_ms": stage_means(nv)},
    "cpu_run": {"frames": f_cpu, "decoders": decoders(cpu), "stage_mean_ms": stage_means(cpu)},
    "cam01_nvdec_vs_cpu": {"firm_score": 0.4, "iou": 0.9, "cpu_firm": firm_cpu, "missing_in_nvdec": miss_nv,
                           "nvdec_firm": firm_nv, "missing_in_cpu": miss_cpu},
    "ok": ok}, indent=1))
sys.exit(0 if ok else 1)
PY
  return $rc
}

# `snapshots`: event pictures from NVDEC frames (issue 19): SNAP_STREAMS (4) streams decoded on GPU 0 with the model
# there and `snapshots: {crops: true}`, then one stream decoded on the CPU likewise. Every event has its frame
# picture and a crop per box (or was counted as skipped); the NVDEC run's frame pictures equal the CPU run's for
# the same frames (mean absolute difference of the decoded JPEGs).
snapshots() {
  local model="$DEV/models/yolov8n_coco_640_int8dyn.onnx" rc=0 snap="snapshots: {crops: true, max_width: 640}"
  [ -f "$model" ] || model=$(yolov8n)
  edge_run /tmp/snap-nvdec "${SNAP_STREAMS:-4}" cuda "$model" 17600 "$snap" || rc=1
  edge_run /tmp/snap-cpu 1 cpu "$model" 17610 "$snap" || rc=1
  for d in nvdec cpu; do cp /tmp/snap-$d/edge.log "$OUT/snapshots-$d.log"; cp /tmp/snap-$d/edge.prom "$OUT/snapshots-$d.prom"; done
  python3 - /tmp/snap-nvdec /tmp/snap-cpu "${SNAP_STREAMS:-4}" >"$OUT/snapshots.json" <<'PY' || rc=1
import json, re, sqlite3, sys
import cv2, numpy as np
nv, cpu, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def db(d): return sqlite3.connect(f"{d}/vigil.db")
def outcomes(d):
    out = {}
    for line in open(f"{d}/edge.prom"):
        m = re.match(r'vigil_edge_snapshots_total\{(.*)\} (\S+)', line)
        if m:
            r = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))["result"]; out[r] = out.get(r, 0) + int(float(m.group(2)))
    return out
def per_event(d):  # (stream, seq) -> (detections, pictures)
    q = ("SELECT s.stream, e.seq, (SELECT COUNT(*) FROM detections x WHERE x.event_id = e.id), "
         "(SELECT COUNT(*) FROM snapshots p WHERE p.edge = s.edge AND p.stream = s.stream AND p.run = e.run "
         "AND p.seq = e.seq) FROM events e JOIN streams s ON s.id = e.stream_id")
    return {(st, seq): (nd, npic) for st, seq, nd, npic in db(d).execute(q)}
def frame_pic(d, stream, seq):
    row = db(d).execute("SELECT jpeg, out_width, out_height FROM snapshots WHERE stream = ? AND seq = ? AND box = -1",
                        (stream, seq)).fetchone()
    return None if row is None else cv2.imdecode(np.frombuffer(row[0], np.uint8), cv2.IMREAD_COLOR)
ev_nv, ev_cpu = per_event(nv), per_event(cpu)
o_nv = outcomes(nv)
frames = dict(db(nv).execute("SELECT s.stream, COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id GROUP BY s.stream"))
without = sum(1 for nd, npic in ev_nv.values() if npic == 0)
wrong = [k for k, (nd, npic) in ev_nv.items() if npic not in (0, 1 + nd)]
common = sorted(seq for (st, seq) in ev_nv if st == "cam01" and ("cam01", seq) in ev_cpu)[::30]
diffs = []
for seq in common:
    a, b = frame_pic(nv, "cam01", seq), frame_pic(cpu, "cam01", seq)
    if a is not None and b is not None and a.shape == b.shape:
        diffs.append(float(np.abs(a.astype(int) - b.astype(int)).mean()))
shape = frame_pic(nv, "cam01", common[0]).shape if common else None
ok = (len(frames) == n and all(v == 900 for v in frames.values()) and len(ev_nv) > 100 and not wrong
      and without == o_nv.get("queue_full", 0) and o_nv.get("encode_error", 0) == 0 and diffs
      and max(diffs) < 4 and shape == (360, 640, 3))
print(json.dumps({"nvdec_run": {"streams": n, "events": len(ev_nv), "events_without_pictures": without,
                                "pictures": db(nv).execute("SELECT COUNT(*), SUM(length(jpeg)) FROM snapshots").fetchone(),
                                "edge_outcomes": o_nv, "wrong_picture_counts": wrong[:10]},
                  "cpu_run": {"events": len(ev_cpu), "edge_outcomes": outcomes(cpu)},
                  "cam01_frame_pictures_nvdec_vs_cpu": {"compared": len(diffs), "mean_abs_diff": diffs,
                                                         "shape": shape},
                  "ok": bool(ok)}, indent=1))
sys.exit(0 if ok else 1)
PY
  return $rc
}

# The edge and the aggregator as processes over LINK (cuda_ipc or ucx, tcp as the fallback): IPC_STREAMS file
# streams; the aggregator SIGKILLed once frames are being stored, then a tcp-only aggregator started and killed,
# then one with LINK again; then the same streams over tcp alone to a second aggregator, for the comparison.
# Writes $OUT/LINK.json (every frame once, results as tcp's, the share of messages on LINK, its counters).
link_e2e() {
  local link=$1 model=$2 clip=$3 rc=0 dir=/tmp/e2e-$1
  rm -rf "$dir" && mkdir -p "$dir/state-link" "$dir/state-tcp"
  local key n="${IPC_STREAMS:-8}" i
  key=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
  printf 'gpu-edge: %s\n' "$key" >"$dir/keys.yaml" && chmod 600 "$dir/keys.yaml"
  export VIGIL_EDGE_KEY="$key"
  local base="listen: 127.0.0.1:17600\nhttp: 127.0.0.1:17601\nauth: {keys_file: $dir/keys.yaml}\n" extra
  if [ "$link" = cuda_ipc ]; then extra="cuda_ipc: {socket: $dir/agg.sock, device: cuda:0}"
  else extra="ucx_listen: 127.0.0.1:17602\nucx_device: cuda:0"; fi
  printf "${base}db: $dir/link.db\n$extra\n" >"$dir/agg-link.yaml"
  printf "${base}db: $dir/link.db\n" >"$dir/agg-tcponly.yaml"
  printf "listen: 127.0.0.1:17610\nhttp: 127.0.0.1:17611\nauth: {keys_file: $dir/keys.yaml}\ndb: $dir/tcp.db\n" >"$dir/agg-tcp.yaml"
  edge_yaml() {  # edge_yaml PORT LINKS STATE REALTIME
    printf 'edge: gpu-edge\naggregator: 127.0.0.1:%s\nmodel: {path: %s, device: cuda:0, precision: fp16}\n' "$1" "$model"
    printf 'transport: {links: [%s], cuda_ipc: %s/agg.sock, ucx: 127.0.0.1:17602, probe_interval_ms: 200}\n' "$2" "$dir"
    printf 'batching: {max_batch: 16, max_wait_ms: 10}\nstate_dir: %s\nhwaccel: cuda\nstreams:\n' "$3"
    for i in $(seq "$n"); do
      printf '  - {id: cam%02d, source: %s, realtime: %s, rules: {min_score: 0.3}}\n' "$i" "$clip" "$4"
    done
  }
  edge_yaml 17600 "$link, tcp" "$dir/state-link" true >"$dir/edge-link.yaml"
  edge_yaml 17610 tcp "$dir/state-tcp" false >"$dir/edge-tcp.yaml"
  "$DEV/bin/vigil" aggregator --config "$dir/agg-link.yaml" >"$dir/agg1.log" 2>&1 &
  local agg=$!
  sleep 2
  "$DEV/bin/vigil" --log-level info edge --config "$dir/edge-link.yaml" --metrics-out "$dir/edge-link.prom" \
    >"$dir/edge-link.log" 2>&1 &
  local edge=$! w
  # Kill only once frames are being stored (the model load, cuDNN planning included, comes first).
  for w in $(seq 120); do
    [ "$(python3 -c 'import sqlite3, sys
try: print(sqlite3.connect(sys.argv[1]).execute("SELECT COUNT(*) FROM frames").fetchone()[0])
except Exception: print(0)' "$dir/link.db")" -gt 200 ] && break
    sleep 0.5
  done
  sleep 5; kill -9 "$agg"; wait "$agg" 2>/dev/null; echo "aggregator 1 killed (SIGKILL) 5 s into the stream"
  sleep 1
  "$DEV/bin/vigil" aggregator --config "$dir/agg-tcponly.yaml" >"$dir/agg2.log" 2>&1 & agg=$!
  sleep 5; kill -9 "$agg"; wait "$agg" 2>/dev/null; echo "aggregator 2 (tcp only) killed 5 s later"
  "$DEV/bin/vigil" aggregator --config "$dir/agg-link.yaml" >"$dir/agg3.log" 2>&1 & agg=$!
  # The clip takes 30 s in real time: an edge still running after E2E_EDGE_WAIT s hangs. Its threads'
  # stacks (gdb, else the kernel's view) go into the logs, then it is killed and the logs still come back.
  for w in $(seq "${E2E_EDGE_WAIT:-150}"); do kill -0 "$edge" 2>/dev/null || break; sleep 1; done
  if kill -0 "$edge" 2>/dev/null; then
    echo "edge still running after ${E2E_EDGE_WAIT:-150} s: its stacks in $link-edge-stacks.txt, then SIGKILL"
    { if command -v gdb >/dev/null; then gdb -p "$edge" -batch -ex "thread apply all bt" 2>&1
      else for t in /proc/"$edge"/task/*; do echo "== $t $(cat "$t/comm") $(cat "$t/wchan" 2>/dev/null)"; cat "$t/stack" 2>/dev/null; done; fi
    } >"$OUT/$link-edge-stacks.txt" 2>&1
    kill -9 "$edge"
  fi
  wait "$edge" || rc=1
  echo "edge exit $? ($n streams, links $link, tcp)"
  python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:17601/metrics").read().decode())' \
    >"$dir/agg3.prom" 2>&1
  kill "$agg"; wait "$agg" 2>/dev/null
  "$DEV/bin/vigil" aggregator --config "$dir/agg-tcp.yaml" >"$dir/agg-tcp.log" 2>&1 & agg=$!
  sleep 2
  "$DEV/bin/vigil" --log-level info edge --config "$dir/edge-tcp.yaml" --metrics-out "$dir/edge-tcp.prom" \
    >"$dir/edge-tcp.log" 2>&1 || rc=1
  kill "$agg"; wait "$agg" 2>/dev/null
  for f in edge-link.log edge-link.prom agg1.log agg2.log agg3.log agg3.prom edge-tcp.prom; do cp "$dir/$f" "$OUT/$link-$f"; done
  python3 - "$dir" "$n" "$link" >"$OUT/$link.json" <<'PY' || rc=1
import json, re, sqlite3, sys
d, n, link = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def q(db, sql): return sqlite3.connect(f"{d}/{db}").execute(sql).fetchall()
frames = dict(q("link.db", "SELECT s.stream, COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id GROUP BY s.stream"))
dets = lambda db: sorted(q(db, "SELECT s.stream, e.seq, d.class_id, round(d.score, 4), round(d.x1, 1), round(d.y1, 1), "
    "round(d.x2, 1), round(d.y2, 1) FROM detections d JOIN events e ON e.id = d.event_id JOIN streams s ON s.id = e.stream_id"))
a, b = dets("link.db"), dets("tcp.db")
def iou(p, q):
    w = max(0, min(p[2], q[2]) - max(p[0], q[0])); h = max(0, min(p[3], q[3]) - max(p[1], q[1]))
    u = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - w * h
    return w * h / u if u > 0 else 0
def unmatched(x, y, firm=0.4):  # firm detections of x that y lacks (same frame and class, IoU >= 0.9)
    idx = {}
    for s, seq, c, sc, *box in y: idx.setdefault((s, seq, c), []).append(box)
    miss = total = 0
    for s, seq, c, sc, *box in x:
        if sc < firm: continue
        total += 1
        if not any(iou(box, bb) >= 0.9 for bb in idx.get((s, seq, c), [])): miss += 1
    return miss, total
def prom(path, name):
    out = {}
    for line in open(path):
        m = re.match(name + r'(\{[^}]*\})? (\S+)$', line)
        if m: out[m.group(1) or ""] = float(m.group(2))
    return out
msgs = prom(f"{d}/edge-link.prom", "vigil_edge_link_messages_total")
link_msgs = sum(v for k, v in msgs.items() if f'"{link}"' in k)
tcp_msgs = sum(v for k, v in msgs.items() if '"tcp"' in k)
share = link_msgs / max(1, link_msgs + tcp_msgs)
res = {"streams": n, "frames_per_stream": sorted(set(frames.values())), "streams_stored": len(frames),
       "link": link, "detections_link": len(a), "detections_tcp": len(b), "identical_to_tcp": a == b,
       "firm_missing_in_link_vs_tcp": unmatched(b, a), "firm_missing_in_tcp_vs_link": unmatched(a, b),
       "edge_messages": msgs, "link_share": share,
       "edge_sessions": prom(f"{d}/edge-link.prom", "vigil_edge_link_sessions_total"),
       "edge_transports": prom(f"{d}/edge-link.prom", "vigil_edge_link_transports"),
       "fail_backs": prom(f"{d}/edge-link.prom", "vigil_edge_link_fail_backs_total"),
       "edge_device_reports": {k: prom(f"{d}/edge-link.prom", k) for k in
                               ["vigil_edge_cuda_ipc_device_reports_total", "vigil_edge_cuda_ipc_publisher_launches_total",
                                "vigil_edge_cuda_ipc_slots_total", "vigil_edge_ucx_device_reports_total",
                                "vigil_edge_ucx_cuda_memory", "vigil_edge_events_total"]},
       "agg3": {k: prom(f"{d}/agg3.prom", k) for k in ["vigil_cuda_ipc_slots_total", "vigil_cuda_ipc_slots_rejected_total",
                "vigil_cuda_ipc_device_reports_total", "vigil_cuda_ipc_rings_offered_total",
                "vigil_ucx_rows_messages_total", "vigil_ucx_rows_into_device_total", "vigil_ucx_rows_rejected_total",
                "vigil_ucx_cuda_memory"]}}
m1, t1 = res["firm_missing_in_link_vs_tcp"]; m2, t2 = res["firm_missing_in_tcp_vs_link"]
# fp16 batches of different composition (real time vs as fast as it goes) move scores near the threshold a little
res["ok"] = (len(frames) == n and all(v == 900 for v in frames.values()) and t1 > 0 and m1 <= 0.02 * t1
             and m2 <= 0.02 * t2)  # the tcp share here is the tcp-only aggregator's time: reported, not judged
print(json.dumps(res, indent=1))
sys.exit(0 if res["ok"] else 1)
PY
  return $rc
}

# `ipc`: the cuda_ipc link — the transport benchmark, then the edge and aggregator as processes with the
# aggregator killed mid-run.
ipc() {
  local rc=0 dir=/tmp/ipc model="$DEV/models/yolov8n_coco_640_int8dyn.onnx" clip="$DEV/media/vtest_1080p30.mp4"
  [ -f "$model" ] || model=$(yolov8n)
  [ "${IPC_BENCH:-1}" != 1 ] || "$DEV/bin/vigil" bench transport --links cuda_ipc,tcp --memory device --ring-device cuda:0 \
    --sizes "${IPC_SIZES:-64,4096,65536}" --iters "${IPC_ITERS:-20000}" --warmup 1000 --opens 20 \
    --json "$OUT/ipc-bench-device.json" || rc=1
  [ "${IPC_BENCH:-1}" != 1 ] || "$DEV/bin/vigil" bench transport --links cuda_ipc,tcp --memory host --ring-device cuda:0 \
    --sizes 4096 --iters "${IPC_ITERS:-20000}" --warmup 1000 --opens 20 --json "$OUT/ipc-bench-host.json" || rc=1
  # The same device-rows run with a kernel launch per slot (no resident publisher), for the comparison.
  [ "${IPC_BENCH:-1}" != 1 ] || "$DEV/bin/vigil" bench transport --links cuda_ipc --memory device --ring-device cuda:0 \
    --ring-linger-us 0 --sizes 64,4096 --iters "${IPC_ITERS:-20000}" --warmup 1000 --opens 20 \
    --json "$OUT/ipc-bench-device-launch.json" || rc=1
  # IPC_COMPARE=FILE (another vigil binary, .xz or not, e.g. carried under .device/): the cuda_ipc bench at 109 B
  # and 4 KB, device rows and host rows, with that binary and with this one alternately (other, this, other,
  # this), for a change's before and after in one call on one machine.
  if [ -n "${IPC_COMPARE:-}" ]; then
    local other=/tmp/vigil-compare i who bin mem
    case "$IPC_COMPARE" in *.xz) xz -dc "$IPC_COMPARE" >"$other" ;; *) cp "$IPC_COMPARE" "$other" ;; esac
    chmod +x "$other"
    for i in 1 2; do
      for who in other this; do
        bin="$DEV/bin/vigil"
        [ "$who" = this ] || bin="$other"
        for mem in device host; do
          "$bin" bench transport --links cuda_ipc --memory "$mem" --ring-device cuda:0 --sizes 109,4096 \
            --iters "${IPC_ITERS:-20000}" --warmup 1000 --opens 5 --json "$OUT/ipc-compare-$who-$mem-$i.json" || rc=1
        done
      done
    done
  fi
  [ "${IPC_E2E:-1}" != 1 ] || link_e2e cuda_ipc "$model" "$clip" || rc=1
  # The product at IPC_PRODUCT_STREAMS streams over each link (issue 13's sweep, one N): frame->stored p99.
  if [ -n "${IPC_PRODUCT_STREAMS-128}" ]; then  # IPC_PRODUCT_STREAMS= (empty) skips it
    local link pm
    pm=$(yolov8n)
    for link in cuda_ipc tcp; do
      python3 "$ROOT/tools/gpu/edge_sweep.py" --vigil "$DEV/bin/vigil" --model "$pm" --clip "$clip" \
        --streams "${IPC_PRODUCT_STREAMS-128}" --link "$link" --keep-going >"$OUT/ipc-product-$link.json" || rc=1
    done
  fi
  return $rc
}

# `ucx`: the ucx link with the UCX of PyPI libucx-cu13 (CUDA transports; `pack` bundles its libraries as
# ucx.tar.xz, first on LD_LIBRARY_PATH here, so vigil loads it instead of Debian's 1.13): what UCX offers,
# vigil bench transport with rows in GPU memory (ucx sends them from there) beside tcp and cuda_ipc,
# ucx_perftest of the same UCX (host and CUDA memory), then the edge and aggregator over ucx with the
# aggregator killed mid-run (link_e2e).
ucx() {
  local rc=0 model="$DEV/models/yolov8n_coco_640_int8dyn.onnx" clip="$DEV/media/vtest_1080p30.mp4" port=13337
  [ -f "$model" ] || model=$(yolov8n)
  [ -d /tmp/ucx/lib ] || { echo "ucx: no /tmp/ucx (pack did not bundle PyPI libucx-cu13)"; return 1; }
  export LD_LIBRARY_PATH="/tmp/ucx/lib:$LD_LIBRARY_PATH"
  local info=/tmp/ucx/bin/ucx_info perftest=/tmp/ucx/bin/ucx_perftest
  { "$info" -v; "$info" -d | grep -E "Memory domain|Transport|memory types|Component"; } >"$OUT/ucx-info.txt" 2>&1 || rc=1
  "$DEV/bin/vigil" bench transport --links ucx,tcp,cuda_ipc --memory device --ring-device cuda:0 \
    --sizes "${IPC_SIZES:-64,4096,65536}" --iters "${IPC_ITERS:-20000}" --warmup 1000 --opens 10 \
    --json "$OUT/ucx-bench-device.json" || rc=1
  "$DEV/bin/vigil" bench transport --links ucx,tcp --memory host --sizes 4096 --iters "${IPC_ITERS:-20000}" \
    --warmup 1000 --opens 10 --json "$OUT/ucx-bench-host.json" || rc=1
  local t m
  for t in "ucp_am_lat -m host,host" "ucp_am_lat -m cuda,cuda" "tag_lat -m cuda,cuda" "tag_lat -m host,host"; do
    "$perftest" -p $port >/dev/null 2>&1 &
    local server=$!
    sleep 1
    echo "== ucx_perftest -t $t -s 4096 -n 20000 -w 1000"
    # shellcheck disable=SC2086
    timeout 60 "$perftest" 127.0.0.1 -p $port -t $t -s 4096 -n 20000 -w 1000 2>&1 | tail -n 4 || rc=1
    kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
    port=$((port + 1))
  done >"$OUT/ucx-perftest.txt"
  link_e2e ucx "$model" "$clip" || rc=1
  return $rc
}

# `standby`: primary and standby on one GPU, live NVDEC cameras, SIGKILLs of the primary (tools/gpu/standby_gpu.py).
standby() {
  # STANDBY_MODEL=dyn: the dynamic-batch YOLOv8n export (batches of 32 run whole: what 128 cameras need; the
  # shared int8 model has a fixed batch of 1, one engine run per picture: 1,751 pictures/s at 128 cameras, 2026-12-03).
  local rc=0 model="$DEV/models/yolov8n_coco_640_int8dyn.onnx" ts="$DEV/media/vtest_1080p30.ts" mirror n
  [ "${STANDBY_MODEL:-int8}" = dyn ] && model=$(yolov8n)
  [ -f "$model" ] || model=$(yolov8n)
  [ -f "$ts" ] || { echo "standby: no $ts (pack makes it)"; return 1; }
  [ -f "$DEV/certs/ca.pem" ] || { echo "standby: no $DEV/certs (pack makes them)"; return 1; }
  local run hb kills
  # mirror:streams[:heartbeat_ms[:kills[/stops]]], e.g. shm-gpu:32:100:20/3 (kills default STANDBY_KILLS)
  for run in ${STANDBY_RUNS:-shm-gpu:32 channel:32}; do
    IFS=: read -r mirror n hb kills <<<"$run"
    local stops=""
    [[ "$kills" == */* ]] && { stops="--stops ${kills#*/}"; kills=${kills%%/*}; }
    python3 "$ROOT/tools/gpu/standby_gpu.py" --vigil "$DEV/bin/vigil" --model "$model" --clip-ts "$ts" \
      --certs "$DEV/certs" --streams "$n" --kills "${kills:-${STANDBY_KILLS:-10}}" $stops --mirror "$mirror" --batch 32 --workers 2 \
      --heartbeat-ms "${hb:-100}" --keep-logs "$OUT/standby-logs" \
      ${STANDBY_ARGS:-} >"$OUT/standby-$mirror-n$n.json" 2>"$OUT/standby-$mirror-n$n.err" || rc=1
    tail -n 1 "$OUT/standby-$mirror-n$n.json"
  done
  return $rc
}

# `product`: the edge and the aggregator as processes with N NVDEC streams, then `vigil bench streams` (the same
# pipeline in one process) at the same N.
product() {
  # The dynamic-batch YOLOv8n export by default: the shared int8 model has a fixed batch of 1, so every
  # frame is an engine run of its own (PRODUCT_MODEL=int8 runs it anyway).
  local model clip="$DEV/media/vtest_1080p30.mp4" rc=0
  if [ "${PRODUCT_MODEL:-dyn}" = int8 ]; then model="$DEV/models/yolov8n_coco_640_int8dyn.onnx"; else model=$(yolov8n); fi
  local n="${PRODUCT_STREAMS:-8,32,64,128,192,256}"
  # PRODUCT_EDGE_YAML: top-level lines for the edge (e.g. 'snapshots: {max_width: 640}').
  python3 "$ROOT/tools/gpu/edge_sweep.py" --vigil "$DEV/bin/vigil" --model "$model" --clip "$clip" --streams "$n" \
    --keep-going ${PRODUCT_EDGE_YAML:+--edge-yaml "$PRODUCT_EDGE_YAML"} ${PRODUCT_ARGS:-} >"$OUT/product-edge.json" || rc=1
  "$DEV/bin/vigil" bench streams --model "$model" --video "$clip" --hwaccel cuda --devices cuda:0 --precision fp16 \
    --streams "$n" --warmup-s 3 --seconds 8 --budget-ms 50 --json ${STREAMS_ARGS:-} >"$OUT/product-bench.json" || rc=1
  python3 - "$OUT/product-edge.json" "$OUT/product-bench.json" <<'PY' || rc=1
import json, sys
edge, bench = (json.load(open(p)) for p in sys.argv[1:3])
b = {t["streams"]: t for t in bench["trials"]}
print(f"{'N':>4} {'edge det p50/p99':>18} {'stored p50/p99':>16} {'fps min':>8} {'drop %':>7} {'cpu ms/fr':>9} | "
      f"{'bench det p50/p99':>18} {'stored p50/p99':>16} holds")
for t in edge["trials"]:
    n, d, s = t["streams"], t.get("frame_to_detection_ms", {}), t.get("frame_to_stored_ms", {})
    f = lambda x: "-" if x is None else f"{x:.1f}"
    bt = b.get(n, {})
    print(f"{n:>4} {f(d.get('p50')):>8}/{f(d.get('p99')):<9} {f(s.get('p50')):>7}/{f(s.get('p99')):<8} "
          f"{f(t.get('fps_per_stream', {}).get('min')):>8} {f(100 * t.get('dropped_share', 0)):>7} "
          f"{f(t.get('edge_cpu_ms_per_frame')):>9} | {f(bt.get('latency_ms', {}).get('p50')):>8}/"
          f"{f(bt.get('latency_ms', {}).get('p99')):<9} {f(bt.get('stored_ms', {}).get('p50')):>7}/"
          f"{f(bt.get('stored_ms', {}).get('p99')):<8} {t['holds']}/{bt.get('holds')} {t.get('error', '')}")
PY
  return $rc
}

# `profile`: the card's ceilings; batch-64 YOLOv8n fp16 loaded twice with a fresh cuDNN plan-cache file (cold:
# plans timed, warm: from the file), then ncu over one inference of a third load that takes its plans from
# the file (the same plans as timed, and no timing under the profiler).
profile() {
  local model ncu rc=0 run
  model=$(yolov8n)
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  python3 "$ROOT/tools/gpu/ceilings.py" >"$OUT/ceilings.json" || rc=1
  local bench=("$DEV/bin/vigil-engine" --log-level info bench engine --model "$model" --device cuda:0 --precision fp16
    --batch 64 --warmup 5 --json)
  rm -f /tmp/plan-cache-b64.json
  for run in ${PROFILE_LOADS:-cold warm}; do
    VIGIL_CUDNN_PLAN_CACHE=/tmp/plan-cache-b64.json "${bench[@]}" --iters 50 >"$OUT/b64-$run.json" 2>"$OUT/b64-$run.log" || rc=1
    grep -h "cuDNN plans" "$OUT/b64-$run.log" | head -2
  done
  VIGIL_CUDNN_PLAN_CACHE=/tmp/plan-cache-b64.json timeout "${NCU_TIMEOUT:-300}" "$ncu" --profile-from-start off \
    --clock-control none --graph-profiling node -f -o /tmp/b64 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed \
    "${bench[@]}" --iters 5 --profile-range 1 >"$OUT/ncu-bench.json" 2>"$OUT/ncu.log" || rc=1
  "$ncu" --import /tmp/b64.ncu-rep --csv --page raw >"$OUT/ncu-raw.csv" 2>>"$OUT/ncu.log" || rc=1
  python3 "$ROOT/tools/gpu/ncu_summary.py" "$OUT/ncu-raw.csv" --ceilings "$OUT/ceilings.json" --gflop-per-image 8.7 \
    --batch 64 >"$OUT/profile.json" || rc=1
  return $rc
}

case "$mode" in
  pack) pack ;;
  run) run "$@" ;;
  streams|nvdec|edge|snapshots|ipc|ucx|standby|product|profile) "$mode" ;;
  *) echo "usage: $0 pack | run [export tests sanitize models bench placement streams video nvdec edge snapshots ipc ucx standby product profile]" >&2
     exit 2 ;;
esac
