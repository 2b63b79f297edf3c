#!/usr/bin/env bash
# Test-only Python environment for tests/models, tools/testmodels and tools/bench.
# Never a product dependency. Idempotent: does nothing when VENV_DIR is already current.
#
#   scripts/test-venv.sh [VENV_DIR]          (default: build/venv)
#
# The venv sees Debian's system packages (--system-site-packages): torch 1.13 (CPU), torchvision,
# cv2 4.6 and numpy 1.24 come from apt, never from PyPI (so no CUDA torch and no numpy 2). Every
# PyPI package is pinned and installed with --no-deps; the set below was verified to work together
# (export of all test models, ONNX Runtime, pytest) on Debian 12 with only these apt packages:
#
#   apt-get install -y --no-install-recommends python3 python3-venv python3-pip python3-numpy \
#     python3-opencv python3-torch python3-torchvision python3-yaml python3-pil python3-requests \
#     python3-psutil darknet opencv-doc
#
# (darknet and opencv-doc only supply the sample photos under /usr/share/darknet/data and
#  /usr/share/doc/opencv-doc/examples/data used by the model tests.)
set -euo pipefail

VENV=${1:-build/venv}
PY=/usr/bin/python3

read -r -d '' REQS <<'EOF' || true
onnxruntime==1.32.0
onnx==1.23.2
protobuf==7.36.2
ml_dtypes==0.5.4
flatbuffers==25.12.19
packaging==26.4
typing_extensions==4.16.0
pytest==9.2.0
pluggy==1.7.0
iniconfig==2.3.1
pygments==2.21.0
ultralytics==8.4.190
ultralytics-thop==2.2.3
py-cpuinfo==9.0.0
yolov5==7.0.14
onnxslim==0.1.98
sympy==1.14.0
mpmath==1.3.0
colorama==0.4.6
onnxconverter-common==1.16.0
prometheus_client==0.26.0
EOF
# ml_dtypes 0.5.x is the last line that accepts numpy 1.x; onnxslim needs sympy/mpmath/colorama.
# ultralytics/yolov5 declare many more requirements (opencv-python, polars, matplotlib, pandas, ...)
# that model building and ONNX export do not use; tools/testmodels/make_models.py stubs the four
# plotting/data modules the yolov5 package imports at module level. prometheus_client (no dependencies):
# its text parser checks what /metrics serves (tests/models/test_metrics_scrape.py).

STAMP="$VENV/.vigil-test-venv"
WANT=$(printf '%s\n%s\n' "$($PY --version 2>&1)" "$REQS" | sha256sum | cut -d' ' -f1)

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "test venv $VENV is up to date"
    exit 0
fi

for mod in numpy cv2 torch torchvision yaml PIL requests psutil; do
    $PY -c "import $mod" 2>/dev/null || { echo "missing Debian package for python module '$mod' (see the apt-get line in $0)" >&2; exit 1; }
done

[[ -x "$VENV/bin/python" ]] || $PY -m venv --system-site-packages "$VENV"
REQ_FILE=$(mktemp)
trap 'rm -f "$REQ_FILE"' EXIT
printf '%s\n' "$REQS" > "$REQ_FILE"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
    --only-binary=:all: -r "$REQ_FILE"

# Check: the pinned set imports, and torch/numpy/cv2 are still Debian's.
"$VENV/bin/python" - <<'EOF'
import numpy, cv2, torch, onnx, onnxruntime, pytest, onnxslim, onnxconverter_common, prometheus_client
import ultralytics
assert torch.__file__.startswith("/usr/lib/python3/"), f"torch not from Debian: {torch.__file__}"
assert numpy.__version__.startswith("1."), f"numpy {numpy.__version__} (torch 1.13 needs numpy 1.x)"
print(f"test venv ok: torch {torch.__version__}, numpy {numpy.__version__}, cv2 {cv2.__version__}, "
      f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, ultralytics {ultralytics.__version__}")
EOF
echo "$WANT" > "$STAMP"
