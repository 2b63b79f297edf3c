#!/usr/bin/env bash
# gpu-check.sh — every GPU check and benchmark of vigil in one call, for a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh pack          # here (Debian, CUDA toolkit, no GPU needed): build and bundle
#   scripts/gpu-check.sh run [STAGES]  # on the GPU machine, from the repository root; results in $OUT
#
# `pack` builds vigil-engine and the GPU test binary (build/, CUDA on), then writes .device/ (ignored
# by git): bin/ with both binaries, libs.tar.xz with their shared-library closure minus glibc,
# libstdc++ and the NVIDIA driver, cuDNN and cuBLAS (the GPU machine has those: the driver, cuBLAS in
# /usr/local/cuda, cuDNN in the PyTorch virtualenv), models/ (../shared/models and the small generated
# models that PyTorch cannot rebuild there), images/ (darknet's samples) and whl/ (ultralytics wheels,
# pure Python, so PyTorch there can build the same networks for the side-by-side benchmark).
#
# `run` (DEVICE.md's recipe) unpacks the libraries, points LD_LIBRARY_PATH at them and at cuDNN, and runs
# the stages given (default: all, in this order):
#   export    the ONNX exports of YOLOv8n/11n/26n/YOLOX-nano at 640 that `bench` times, built there with
#             PyTorch + Ultralytics (seeded), so that `tests` also covers them
#   tests     GPU GoogleTest suite (op grid, device-resident runs, whole models vs the CPU backend),
#             with VIGIL_CUDNN_AUTOTUNE=1 (cuDNN's first plan: correctness needs no timing, loads are faster)
#   sanitize  compute-sanitizer memcheck over a representative subset of the GPU tests
#   models    fp16/fp32 detections on real images vs ONNX Runtime (tools/gpu/check_models.py)
#   bench     vigil-engine vs PyTorch eager / torch.compile (tools/gpu/bench_torch.py), YOLOv8n first
#   placement `vigil-engine bench placement --json`: host->device copies from pageable, pinned and
#             NUMA-local pinned memory (issue 5's benchmark)
#   streams   `vigil-engine bench streams`: the largest number of 1920x1080 30 FPS streams (pre-decoded
#             frames in page-locked memory, GPU letterbox + YOLOv8n fp16 + GPU NMS) one GPU holds with
#             p99 frame-to-detection <= 25 ms; every visible GPU as well when there are several
#             (STREAMS_ONE / STREAMS_MULTI: the stream counts tried; STREAMS_ARGS: more options)
# Each stage logs to $OUT/<stage>.log and writes JSON results beside it; a failing stage does not stop
# the others (STAGE_TIMEOUT seconds each, default 900); the exit status is non-zero when any stage
# failed. BENCH_ARGS passes options to bench_torch.py, TESTS_FILTER a --gtest_filter to `tests`. Never changes clocks or GPU modes.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEV="$ROOT/.device"
mode="${1:-run}"
shift || true

pack() {
  set -e
  local build="${BUILD_DIR:-$ROOT/build}"
  cmake -S "$ROOT" -B "$build" -G Ninja -DVIGIL_WITH_CUDA=ON >/dev/null
  ninja -C "$build" vigil-engine vigil_cuda_tests
  rm -rf "$DEV/bin" "$DEV/models" "$DEV/images" "$DEV/libs.tar.xz"
  mkdir -p "$DEV/bin" "$DEV/models" "$DEV/images" "$DEV/whl"
  cp "$build/src/vigil-engine" "$build/tests/vigil_cuda_tests" "$DEV/bin/"
  strip --strip-debug "$DEV/bin/"*
  ldd "$DEV/bin/vigil-engine" "$DEV/bin/vigil_cuda_tests" | awk '/=>/{print $3}' | sort -u |
    grep -vE 'lib(c|m|dl|pthread|rt)\.so|ld-linux|libstdc\+\+|libgcc_s|libcuda\.|libnvidia|libcudnn|libcublas' \
      >"$DEV/libs.txt"
  tar -chf - --transform 's,.*/,,' -T "$DEV/libs.txt" | xz -6 -T2 >"$DEV/libs.tar.xz"
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
  ls "$DEV"/whl/ultralytics-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d "$DEV/whl" \
    ultralytics==8.4.190 ultralytics-thop==2.2.3
  du -sh "$DEV"
}

run() {
  : "${OUT:=$ROOT/out/gpu}"
  mkdir -p "$OUT"
  local stages="${*:-export tests sanitize models bench placement streams}" failed=0
  mkdir -p /tmp/vl && tar -xJf "$DEV/libs.tar.xz" -C /tmp/vl
  local cudnn
  cudnn="$(python3 -c 'import nvidia.cudnn, os; print(nvidia.cudnn.__path__[0])' 2>/dev/null)/lib"
  export LD_LIBRARY_PATH="/tmp/vl:$cudnn:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export VIGIL_TEST_MODELS="$DEV/models" VIGIL_SHARED_MODELS=/tmp/bench PYTHONUNBUFFERED=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$DEV"/whl/*.whl >/dev/null 2>&1 &&
    export PYTHONPATH="/tmp/site:$ROOT/tools/testmodels:${PYTHONPATH:-}"
  # Images as H x W x 3 uint8 BGR .npy for the GPU tests and `streams` (vigil-engine reads no image files).
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
  for stage in $stages; do
    echo "== $stage" | tee -a "$OUT/summary.txt"
    local t0=$SECONDS rc=0
    local lim="${STAGE_TIMEOUT:-900}"
    case "$stage" in
      export) timeout "$lim" python3 "$ROOT/tools/gpu/bench_torch.py" --engine "$DEV/bin/vigil-engine" --work /tmp/bench \
          --out "$OUT/export.json" --export-only >"$OUT/export.log" 2>&1 || rc=$? ;;
      tests) VIGIL_CUDNN_AUTOTUNE=1 timeout "$lim" "$DEV/bin/vigil_cuda_tests" --gtest_filter="${TESTS_FILTER:-*}" --gtest_output="json:$OUT/tests.json" >"$OUT/tests.log" 2>&1 || rc=$? ;;
      sanitize) VIGIL_CUDNN_AUTOTUNE=1 timeout "$lim" compute-sanitizer --tool memcheck --error-exitcode 9 "$DEV/bin/vigil_cuda_tests" \
          --gtest_filter='Grid/CudaOpGrid.MatchesReference/yolo_like_chain*:Grid/CudaOpGrid.MatchesReference/matmul*:Grid/CudaOpGrid.MatchesReference/maxpool*:CudaBackend.*:Cases/GpuLetterbox.*/odd_sizes:Cases/GpuLetterbox.*/pitched_rows:Cases/GpuNms.*/ultralytics_low_conf_many_tiles:Cases/GpuNms.*/end2end:Cases/GpuNms.*/yolox_raw' \
          >"$OUT/sanitize.log" 2>&1 || rc=$? ;;
      models) timeout "$lim" python3 "$ROOT/tools/gpu/check_models.py" --engine "$DEV/bin/vigil-engine" --models "$DEV/models" \
          --images "$DEV/images" --out "$OUT/models.json" >"$OUT/models.log" 2>&1 || rc=$? ;;
      bench) timeout "$lim" python3 "$ROOT/tools/gpu/bench_torch.py" --engine "$DEV/bin/vigil-engine" --work /tmp/bench \
          --models "$DEV/models" --out "$OUT/bench.json" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1 || rc=$? ;;
      placement) timeout "$lim" "$DEV/bin/vigil-engine" bench placement --json >"$OUT/placement.json" 2>"$OUT/placement.log" || rc=$? ;;
      streams) timeout "$lim" bash "$ROOT/scripts/gpu-check.sh" streams >"$OUT/streams.log" 2>&1 || rc=$? ;;
      *) echo "unknown stage '$stage'" >&2; rc=2 ;;
    esac
    echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    tail -n 3 "$OUT/$stage.log" 2>/dev/null | sed 's/^/   /' | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || failed=1
  done
  return $failed
}

# The `streams` stage (run inside `run`'s environment): one GPU, then all of them when there are several.
streams() {
  local model=/tmp/bench/yolov8n_640_dyn.onnx frame=/tmp/images-npy/vtest_1080p.npy gpus
  [ -f "$model" ] || python3 "$ROOT/tools/gpu/bench_torch.py" --engine "$DEV/bin/vigil-engine" --work /tmp/bench \
    --out /tmp/export.json --export-only --archs yolov8n
  gpus=$(nvidia-smi -L | wc -l)
  local args=(--model "$model" --frame "$frame" --precision fp16 --json ${STREAMS_ARGS:-})
  "$DEV/bin/vigil-engine" bench streams "${args[@]}" --devices cuda:0 \
    --streams "${STREAMS_ONE:-32,64,96,128,160,176,192,208,224,256}" >"$OUT/streams-1gpu.json"
  if [ "$gpus" -gt 1 ]; then
    local devs
    devs=$(seq -s, 0 $((gpus - 1)) | sed 's/\([0-9]*\)/cuda:\1/g')
    "$DEV/bin/vigil-engine" bench streams "${args[@]}" --devices "$devs" \
      --streams "${STREAMS_MULTI:-64,128,192,256,320,352,384,416,448,512}" >"$OUT/streams-${gpus}gpu.json"
  fi
}

case "$mode" in
  pack) pack ;;
  run) run "$@" ;;
  streams) streams ;;
  *) echo "usage: $0 pack | run [export tests sanitize models bench placement streams]" >&2; exit 2 ;;
esac
