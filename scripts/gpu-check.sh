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
#   sanitize  compute-sanitizer memcheck over a representative subset of the GPU tests
#   models    fp16/fp32 detections on real images vs ONNX Runtime (tools/gpu/check_models.py)
#   bench     vigil-engine vs PyTorch eager / torch.compile (tools/gpu/bench_torch.py), YOLOv8n first
#   placement `vigil-engine bench placement --json`: host->device copies from pageable, pinned and
#             NUMA-local pinned memory (issue 5's benchmark)
#   streams   `vigil-engine bench streams`: the largest number of 1920x1080 30 FPS streams (pre-decoded
#             frames in page-locked memory, GPU letterbox + YOLOv8n fp16 + GPU NMS) one GPU holds with
#             p99 frame-to-detection <= 25 ms; every visible GPU as well when there are several
#             (STREAMS_ONE / STREAMS_MULTI: the stream counts tried; STREAMS_ARGS: more options)
#   video     the GPU decode tests (vigil_video_tests GpuDecode.* and Hwaccel.*; VIDEO_FILTER)
#   nvdec     `vigil bench streams --video`: the same sweep with every stream decoding the H.264 clip, by
#             NVDEC into GPU memory (STREAMS_NVDEC) and, for comparison, on the CPU (STREAMS_CPUDEC)
#   edge      the edge process itself: `vigil aggregator` + `vigil edge` with EDGE_STREAMS streams of the
#             clip, `hwaccel: cuda`, the model on cuda:0 in fp16; every frame must reach the aggregator
#   profile   ncu (--clock-control none) over one batch-64 YOLOv8n fp16 inference (`vigil-engine bench
#             engine --profile-range 1`), summarised per kernel kind (tools/gpu/ncu_summary.py), and the
#             card's measured ceilings (tools/gpu/ceilings.py: cuBLAS fp16 GEMM, device-to-device copy)
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
  ninja -C "$build" vigil vigil-engine vigil_cuda_tests vigil_video_tests
  local ffmin="${FFMPEG_MIN:-$build/ffmpeg-min}" stubs="$build/device-stubs" lib=/lib/x86_64-linux-gnu
  bash "$ROOT/scripts/ffmpeg-min.sh" "$ffmin"
  python3 "$ROOT/tools/gpu/stub_libs.py" --consumer "$lib/libopencv_imgcodecs.so.406" --out "$stubs" \
    --return-zero GDALAllRegister "$lib/libgdal.so.32" "$lib/libgdcmMSFF.so.3.0" "$lib/libgdcmDSED.so.3.0"
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
  # The `nvdec`/`edge` clip: vtest.avi's first 300 frames (10 FPS pedestrians) played at 30 FPS, scaled to
  # 1920x1080, H.264 High without B-frames (as IP cameras send it), 2 s GOP, 6 Mbit/s: 10 s, ~7.5 MB.
  [ -f "$vtest" ] && ffmpeg -loglevel error -y -i "$vtest" -vf "setpts=N/(30*TB),scale=1920:1080" -r 30 \
    -frames:v 300 -c:v libx264 -preset fast -profile:v high -bf 0 -g 60 -b:v 6M -maxrate 6M -bufsize 12M \
    -pix_fmt yuv420p "$DEV/media/vtest_1080p30.mp4"
  ls "$DEV"/whl/ultralytics-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d "$DEV/whl" \
    ultralytics==8.4.190 ultralytics-thop==2.2.3
  du -sh "$DEV"
}

run() {
  : "${OUT:=$ROOT/out/gpu}"
  mkdir -p "$OUT"
  local stages="${*:-export tests sanitize models bench placement streams video nvdec edge profile}" failed=0
  mkdir -p /tmp/vl "$DEV/bin" && tar -xJf "$DEV/libs.tar.xz" -C /tmp/vl && tar -xJf "$DEV/bin.tar.xz" -C "$DEV/bin"
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
      streams|nvdec|edge|profile) timeout "$lim" bash "$ROOT/scripts/gpu-check.sh" "$stage" >"$OUT/$stage.log" 2>&1 || rc=$? ;;
      video) timeout "$lim" "$DEV/bin/vigil_video_tests" --gtest_filter="${VIDEO_FILTER:-GpuDecode.*:Hwaccel.*}" \
          --gtest_output="json:$OUT/video.json" >"$OUT/video.log" 2>&1 || rc=$? ;;
      *) echo "unknown stage '$stage'" >&2; rc=2 ;;
    esac
    echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    tail -n 3 "$OUT/$stage.log" 2>/dev/null | sed 's/^/   /' | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || failed=1
  done
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
  local model frame=/tmp/images-npy/vtest_1080p.npy gpus
  model=$(yolov8n)
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

# `nvdec`: the streams sweep on GPU 0 with every stream decoding the H.264 clip (NVDEC, then the CPU).
nvdec() {
  local model clip="$DEV/media/vtest_1080p30.mp4"
  model=$(yolov8n)
  local args=(--model "$model" --video "$clip" --precision fp16 --json --devices cuda:0 ${STREAMS_ARGS:-})
  "$DEV/bin/vigil" bench streams "${args[@]}" --hwaccel cuda \
    --streams "${STREAMS_NVDEC:-64,128,160,192,208,224}" >"$OUT/nvdec-1gpu.json"
  "$DEV/bin/vigil" bench streams "${args[@]}" --hwaccel cpu \
    --streams "${STREAMS_CPUDEC:-16,32,48,64}" >"$OUT/cpudec-1gpu.json"
}

# `edge`: the edge process with NVDEC streams and the model on the GPU, against a local aggregator.
edge() {
  local model clip="$DEV/media/vtest_1080p30.mp4" n="${EDGE_STREAMS:-16}" dir=/tmp/edge-check i
  model=$(yolov8n)
  rm -rf "$dir" && mkdir -p "$dir"
  printf 'listen: 127.0.0.1:17500\nhttp: 127.0.0.1:17501\ndb: %s/vigil.db\n' "$dir" >"$dir/agg.yaml"
  {
    printf 'edge: gpu-edge\naggregator: 127.0.0.1:17500\nmodel: {path: %s, device: cuda:0, precision: fp16}\n' "$model"
    printf 'batching: {max_batch: 16, max_wait_ms: 10}\nstate_dir: %s/state\nhwaccel: cuda\nstreams:\n' "$dir"
    for i in $(seq "$n"); do printf '  - {id: cam%02d, source: %s, realtime: true}\n' "$i" "$clip"; done
  } >"$dir/edge.yaml"
  "$DEV/bin/vigil" aggregator --config "$dir/agg.yaml" >"$OUT/edge-aggregator.log" 2>&1 &
  local agg=$!
  sleep 2
  local t0=$SECONDS rc=0
  "$DEV/bin/vigil" --log-level info edge --config "$dir/edge.yaml" --metrics-out "$OUT/edge.prom" \
    >"$OUT/edge-process.log" 2>&1 || rc=$?
  echo "edge exit $rc after $((SECONDS - t0)) s"
  curl -s http://127.0.0.1:17501/api/stats >"$OUT/edge-aggregator-stats.json" 2>/dev/null ||
    python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:17501/api/stats").read().decode())' \
      >"$OUT/edge-aggregator-stats.json"
  kill "$agg"; wait "$agg" 2>/dev/null
  python3 - "$dir/vigil.db" "$OUT/edge.prom" "$n" >"$OUT/edge.json" <<'PY'
import json, re, sqlite3, sys
db, prom, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = sqlite3.connect(db)
frames = dict(con.execute("SELECT s.stream, COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id GROUP BY s.stream"))
detections = con.execute("SELECT COUNT(*) FROM detections").fetchone()[0]
decoders = {}
for line in open(prom):
    m = re.match(r'vigil_edge_stream_decoder\{(.*)\} (\S+)', line)
    if m and float(m.group(2)) == 1:
        d = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))["decoder"]
        decoders[d] = decoders.get(d, 0) + 1
ok = len(frames) == n and all(v == 300 for v in frames.values())
print(json.dumps({"streams": n, "frames_per_stream": frames, "detections": detections, "decoders": decoders,
                  "every_frame_stored": ok}, indent=1))
sys.exit(0 if ok else 1)
PY
  return $((rc | $?))
}

# `profile`: ncu over one batch-64 inference, and the card's ceilings.
profile() {
  local model ncu rc=0
  model=$(yolov8n)
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  python3 "$ROOT/tools/gpu/ceilings.py" >"$OUT/ceilings.json" || rc=1
  local bench=("$DEV/bin/vigil-engine" bench engine --model "$model" --device cuda:0 --precision fp16 --batch 64
    --warmup 5 --iters 20 --profile-range 1 --json)
  "$ncu" --profile-from-start off --clock-control none --graph-profiling node -f -o /tmp/b64 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed \
    "${bench[@]}" >"$OUT/profile-bench.json" 2>"$OUT/ncu.err" || rc=1
  "$ncu" --import /tmp/b64.ncu-rep --csv --page raw >"$OUT/ncu-raw.csv" 2>>"$OUT/ncu.err" || rc=1
  python3 "$ROOT/tools/gpu/ncu_summary.py" "$OUT/ncu-raw.csv" --ceilings "$OUT/ceilings.json" --gflop-per-image 8.7 \
    --batch 64 >"$OUT/profile.json" || rc=1
  return $rc
}

case "$mode" in
  pack) pack ;;
  run) run "$@" ;;
  streams|nvdec|edge|profile) "$mode" ;;
  *) echo "usage: $0 pack | run [export tests sanitize models bench placement streams video nvdec edge profile]" >&2
     exit 2 ;;
esac
