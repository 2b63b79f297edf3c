#!/usr/bin/env python3
"""Generate random-weight YOLO ONNX test models + MANIFEST.json (test tooling only; no downloads).

    build/venv/bin/python tools/testmodels/make_models.py --out build/testmodels [--force]

Families: Ultralytics YOLOv8n / YOLO11n / YOLOv5nu ([B,84,N]), YOLO26n end-to-end ([B,300,6]),
anchor-based YOLOv5n from the PyPI `yolov5` package ([B,3N,85]), YOLOX-Nano (./yolox_nano.py, raw
[B,N,85]); plus fp16, dynamic-int8 and QDQ-int8 derivatives of YOLOv8n at 320.

Weights are random (fixed seeds) but *conditioned* (see `calibrate`) so the network is neither
chaotic nor constant and its outputs follow the image: BatchNorm statistics are recalibrated on the
first 4 sample photos with a variance floor, and the final head convolutions are rescaled so boxes
have sensible sizes and score logits do not saturate (10-80 detections above conf 0.25 on those
photos; other photos may give more). Output is deterministic except Ultralytics' `date` metadata.
Takes ~75 s of CPU on 2 cores (ONNX export, onnxslim, quantization).

Skips work when DIR/MANIFEST.json exists with the same generator hash (this file, yolox_nano.py,
oracle.py) and all listed files are present.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Ultralytics: no network, no settings in $HOME, quiet.  Must be set before importing it.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "vigil-yolo-config"))

import numpy as np  # noqa: E402

import oracle  # noqa: E402

SEED = 20240601
CALIB_N = 4  # calibration photos

# Ultralytics variants: (arch yaml, [(imgsz, batch, opset, dynamic, simplify)]).  Defaults first.
ULTRA = {
    "yolov8n": [((640, 640), 1, 17, False, True), ((256, 320), 4, 12, False, True),
                ((320, 320), 1, 17, True, False), ((320, 320), 1, 17, False, True)],
    "yolo11n": [((640, 640), 1, 17, False, True), ((320, 320), 4, 12, False, True)],
    "yolov5nu": [((640, 640), 1, 17, False, True), ((256, 320), 1, 12, True, True)],
    "yolo26n": [((640, 640), 1, 17, False, True), ((320, 320), 4, 12, False, True),
                ((320, 320), 1, 17, True, True)],
}
YOLOX = [((416, 416), 1, 11, False, True), ((256, 320), 1, 17, True, False)]  # dynamic = batch only
YOLOV5 = [((640, 640), 1, 12, False, False), ((320, 320), 1, 17, True, False)]
BN_VAR_FLOOR = 0.25
# Score-logit targets: tuned for tens of detections above conf 0.25 on each sample photo.
SCORE_TOP = 3.0  # largest score logit on the calibration photos (p = 0.95)
OBJ_T, OBJCLS_T = (0.05, 0.0), (1e-3, -0.5)  # YOLOX / YOLOv5: (fraction, logit) for obj and class logits
QUANT_BASE = "yolov8n_320_b1_op17.onnx"
EQUIVALENT_ARCH = "yolov8n"  # make_equivalent's network


def script_hash() -> str:
    h = hashlib.sha256()
    for f in ("make_models.py", "yolox_nano.py", "oracle.py", "plain_export.py"):
        h.update((HERE / f).read_bytes())
    return h.hexdigest()


def fname(arch, imgsz, batch, opset, dynamic, suffix=""):
    size = f"{imgsz[0]}" if imgsz[0] == imgsz[1] else f"{imgsz[0]}x{imgsz[1]}"
    return f"{arch}_{size}_{'dyn' if dynamic else f'b{batch}'}_op{opset}{suffix}.onnx"


# ------------------------------------------------------------------ weight conditioning
def calibrate(model, x, head_convs, rng):
    """Condition random weights on the photo batch `x`.

    1. Randomise BN affine params and recompute BN running stats on `x` (train-mode pass with
       cumulative averaging), so every layer sees ~unit-variance activations; add a variance floor
       (BN_VAR_FLOOR x the layer's median variance) so no channel gets a huge gain.
    2. Rescale the output channels of each final 1x1 head conv affinely. Targets are
       (channel slice, "std", mean, std): per-channel mean/std (box channels); or
       (channel slice, "score", frac, logit): score logits, whose random-net distribution is very
       heavy-tailed: first project the weight rows orthogonal to the between-photo differences of the
       per-photo mean input (scores then vary within a photo more than between photos), standardise
       per channel, then map the block's (1 - frac) quantile to `logit` and its maximum to SCORE_TOP,
       so about frac of the logits pass the threshold and none saturate the sigmoid.

    head_convs: list of (conv, [target, ...]).
    """
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None
                m.weight.copy_(torch.from_numpy(rng.uniform(0.6, 1.4, m.num_features)).float())
                m.bias.copy_(torch.from_numpy(rng.normal(0, 0.2, m.num_features)).float())
        model.train()
        model(x)
        model.eval()
        for m in model.modules():  # variance floor: bounds BN gains, else the random net is chaotic
            if isinstance(m, torch.nn.BatchNorm2d):  # (1e-3 input noise moved outputs by ~30%; now ~1%)
                m.running_var += BN_VAR_FLOOR * m.running_var.median()
        inputs = {}
        hooks = [c.register_forward_hook(lambda mod, i, o, k=k: inputs.__setitem__(k, i[0])) for k, (c, _) in
                 enumerate(head_convs)]
        model(x)
        for h in hooks:
            h.remove()
        for k, (conv, targets) in enumerate(head_convs):
            feats = inputs[k]  # [B, C, H, W]
            d = feats.mean((2, 3))
            d = d - d.mean(0)  # [B, C] between-image differences
            q = torch.linalg.svd(d, full_matrices=False)[2][: len(d) - 1]  # [B-1, C] orthonormal rows
            w, b = conv.weight, conv.bias  # [O, C, 1, 1], [O]
            for sl, kind, p1, p2 in targets:
                idx = torch.arange(conv.out_channels)[sl]
                if kind == "score":  # project out between-photo differences
                    wi = w[idx, :, 0, 0]
                    w[idx] = (wi - (wi @ q.T) @ q)[:, :, None, None]
                o = torch.nn.functional.conv2d(feats, w[idx], b[idx]).transpose(0, 1).flatten(1)
                mean, std = o.mean(1), o.std(1).clamp_min(1e-6)
                g, t = 1 / std, torch.zeros(len(idx))  # standardise each channel ...
                if kind == "std":  # ... then to mean p1, std p2
                    g, t = g * p2, t + p1
                else:  # ... then one affine map for the block: quantile (1 - p1) -> logit p2, max -> SCORE_TOP
                    z = ((o - mean[:, None]) / std[:, None]).flatten()
                    zq = torch.quantile(z[torch.randperm(len(z))[:1 << 24]], 1 - p1)
                    a = (SCORE_TOP - p2) / (z.max() - zq).clamp_min(1e-3)
                    g, t = g * a, t + p2 - a * zq
                w[idx] *= g.view(-1, 1, 1, 1)
                b[idx] = (b[idx] - mean) * g + t


def calib_batch(family, imgsz):
    import torch

    return torch.from_numpy(oracle.make_batch(family, CALIB_N, imgsz))


# ------------------------------------------------------------------ exporters
def make_ultralytics(out: Path, rng):
    import torch
    from ultralytics import YOLO

    files = []
    for arch, variants in ULTRA.items():
        torch.manual_seed(SEED)
        yolo = YOLO(f"{arch}.yaml")
        net = yolo.model
        net.names = dict(enumerate(oracle.COCO80))
        head = net.model[-1]
        box_t = [(slice(None), "std", 1.5, 0.5)] if head.reg_max == 1 else [(slice(None), "std", 0.0, 1.5)]
        cls_t = [(slice(None), "score", 1e-4, -1.1)]
        convs = [(seq[-1], box_t) for seq in head.cv2] + [(seq[-1], cls_t) for seq in head.cv3]
        if getattr(head, "one2one_cv2", None) is not None:
            convs += [(seq[-1], box_t) for seq in head.one2one_cv2] + [(seq[-1], cls_t) for seq in head.one2one_cv3]
        calibrate(net, calib_batch("ultralytics", (640, 640)), convs, rng)
        for imgsz, batch, opset, dynamic, simplify in variants:
            name = fname(arch, imgsz, batch, opset, dynamic)
            with tempfile.TemporaryDirectory() as td, contextlib.chdir(td):
                p = yolo.export(format="onnx", imgsz=list(imgsz), batch=batch, opset=opset, dynamic=dynamic,
                                simplify=simplify, nms=False, device="cpu", verbose=False)
                shutil.move(p, out / name)
            family = "end2end" if net.yaml.get("end2end") else "ultralytics"
            files.append(dict(file=name, family=family, arch=arch, opset=opset, imgsz=list(imgsz), dynamic=dynamic,
                              batch="dynamic" if dynamic else batch, dynamic_hw=dynamic, simplified=simplify,
                              exporter="ultralytics"))
        if arch == EQUIVALENT_ARCH:
            files += make_equivalent(out, yolo)
    return files


def make_equivalent(out: Path, yolo) -> list[dict]:
    """Equivalent exports of one calibrated YOLOv8n at 320 (issue 21): each names its twin (`equivalent_to`) and what
    differs (`spelling`). The simplified op17 file (the ULTRA entry) is the pairs' anchor; against it: the same
    export unsimplified, the same at opset 11, PyTorch's own exporter from the module (C2f's chunk as channel
    Slices) and that with the DFL as softmax * arange ReduceSum."""
    import plain_export

    base = fname(EQUIVALENT_ARCH, (320, 320), 1, 17, False)
    meta = dict(family="ultralytics", arch=EQUIVALENT_ARCH, imgsz=[320, 320], dynamic=False, batch=1, dynamic_hw=False)
    files = []
    for opset, simplify, suffix, spelling in ((17, False, "_nosimp", "unsimplified"), (11, True, "", "opset 11")):
        name = fname(EQUIVALENT_ARCH, (320, 320), 1, opset, False, suffix)
        with tempfile.TemporaryDirectory() as td, contextlib.chdir(td):
            p = yolo.export(format="onnx", imgsz=[320, 320], batch=1, opset=opset, dynamic=False, simplify=simplify,
                            nms=False, device="cpu", verbose=False)
            shutil.move(p, out / name)
        files.append(dict(meta, file=name, opset=opset, simplified=simplify, exporter="ultralytics",
                          equivalent_to=base, spelling=spelling))
    for dfl, suffix, spelling in (("conv", "_plain", "torch.onnx.export: channel Slices"),
                                  ("reducesum", "_plain_rsdfl", "torch.onnx.export: channel Slices, ReduceSum DFL")):
        name = fname(EQUIVALENT_ARCH, (320, 320), 1, 17, False, suffix)
        plain_export.export_plain(yolo, out / name, imgsz=(320, 320), batch=1, opset=17, dfl=dfl, metadata=out / base)
        files.append(dict(meta, file=name, opset=17, simplified=False, exporter="torch.onnx.export",
                          equivalent_to=base, spelling=spelling))
    return files


def make_yolox(out: Path, rng):
    import torch

    import yolox_nano

    torch.manual_seed(SEED)
    model = yolox_nano.yolox_nano()
    h = model.head
    reg_t = [(slice(0, 2), "std", 0.5, 0.3), (slice(2, 4), "std", 1.5, 0.5)]  # xy offset (cells), log wh
    convs = [(c, reg_t) for c in h.reg_preds] + [(c, [(slice(None), "score", *OBJ_T)]) for c in h.obj_preds] + \
            [(c, [(slice(None), "score", *OBJCLS_T)]) for c in h.cls_preds]
    calibrate(model, calib_batch("yolox", (416, 416)), convs, rng)
    files = []
    for imgsz, batch, opset, dynamic, simplify in YOLOX:
        name = fname("yolox_nano", imgsz, batch, opset, dynamic)
        yolox_nano.export_onnx(model, str(out / name), imgsz, batch, opset, dynamic)
        if simplify:  # YOLOX's exporter runs onnx-simplifier; onnxslim does the same job here
            import onnxslim

            with contextlib.redirect_stdout(sys.stderr):
                onnxslim.slim(str(out / name), str(out / name))
        files.append(dict(file=name, family="yolox", arch="yolox_nano", opset=opset, imgsz=list(imgsz),
                          dynamic=dynamic, batch="dynamic" if dynamic else batch, dynamic_hw=False,
                          simplified=simplify, exporter="yolox-style (tools/testmodels/yolox_nano.py)"))
    return files


def import_yolov5():
    """Import the PyPI `yolov5` package's model code; its plotting/data-only imports (pandas, tqdm,
    matplotlib, seaborn) are stubbed when absent since model building and export never use them."""
    from unittest import mock

    for _ in range(10):
        try:
            from yolov5.models import yolo
            return yolo
        except ModuleNotFoundError as e:
            if e.name.split(".")[0] not in {"pandas", "tqdm", "matplotlib", "seaborn"}:
                raise
            sys.modules[e.name] = mock.MagicMock(name=e.name)
            for k in [k for k in sys.modules if k.startswith("yolov5")]:
                del sys.modules[k]
    raise ImportError("yolov5")


def make_yolov5(out: Path, rng):
    """Anchor-based YOLOv5n exported as yolov5/export.py does (Detect.export=True, fused, names/stride
    metadata) -> [B, 3*cells, 85]."""
    import onnx
    import torch

    yolo = import_yolov5()
    torch.manual_seed(SEED)
    with contextlib.redirect_stdout(sys.stderr):
        model = yolo.Model(str(Path(yolo.__file__).parent / "yolov5n.yaml"), ch=3, nc=80)
    det = model.model[-1]
    no = det.no
    t = []
    for a in range(det.na):
        t += [(slice(a * no, a * no + 2), "std", 0.0, 1.0), (slice(a * no + 2, a * no + 4), "std", 0.0, 0.5),
              (slice(a * no + 4, a * no + 5), "score", *OBJ_T), (slice(a * no + 5, (a + 1) * no), "score", *OBJCLS_T)]
    calibrate(model, calib_batch("yolov5", (640, 640)), [(c, t) for c in det.m], rng)
    with contextlib.redirect_stdout(sys.stderr):
        model = model.fuse().eval()
    model.names = dict(enumerate(oracle.COCO80))
    files = []
    for imgsz, batch, opset, dynamic, _ in YOLOV5:
        for m in model.modules():
            if isinstance(m, yolo.Detect):
                m.inplace, m.dynamic, m.export = True, dynamic, True
        im = torch.zeros(batch, 3, *imgsz)
        for _ in range(2):
            model(im)
        name = fname("yolov5n", imgsz, batch, opset, dynamic)
        axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 1: "anchors"}}
        torch.onnx.export(model, im, str(out / name), opset_version=opset, do_constant_folding=True,
                          input_names=["images"], output_names=["output0"], dynamic_axes=axes if dynamic else None)
        mo = onnx.load(str(out / name))
        for k, v in {"stride": int(max(model.stride)), "names": model.names}.items():
            meta = mo.metadata_props.add()
            meta.key, meta.value = k, str(v)
        onnx.save(mo, str(out / name))
        files.append(dict(file=name, family="yolov5", arch="yolov5n", opset=opset, imgsz=list(imgsz), dynamic=dynamic,
                          batch="dynamic" if dynamic else batch, dynamic_hw=dynamic, simplified=False,
                          exporter="yolov5/export.py-style (PyPI yolov5 7.0.14 model code)"))
    return files


def make_derived(out: Path, base: dict):
    """fp16 (weights+I/O, onnxconverter-common), dynamic int8 (quantize_dynamic, QUInt8 weights like the
    shared yolov8n) and static QDQ int8 (quantize_static on 4 photos) copies of `base`."""
    import onnx
    from onnxconverter_common import float16
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static

    src = out / base["file"]
    stem = base["file"][:-5]
    files = []

    with warnings.catch_warnings():  # "float32 number ... truncated" for tiny weights
        warnings.simplefilter("ignore")
        fp16 = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=False)
    del fp16.graph.value_info[:]  # stale float32 value_info around the Cast-wrapped Resize breaks ORT's load
    onnx.save(fp16, str(out / f"{stem}_fp16.onnx"))
    files.append(dict(base, file=f"{stem}_fp16.onnx", precision="fp16", exporter="onnxconverter-common float16"))

    quantize_dynamic(str(src), str(out / f"{stem}_int8dyn.onnx"), weight_type=QuantType.QUInt8)
    files.append(dict(base, file=f"{stem}_int8dyn.onnx", precision="int8-dynamic",
                      exporter="onnxruntime quantize_dynamic"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            x = oracle.make_batch("ultralytics", CALIB_N, base["imgsz"])
            self.it = iter([{"images": x[i:i + 1]} for i in range(len(x))])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(out / f"{stem}_qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=False,
                    op_types_to_quantize=["Conv"])  # all ops would put boxes and scores on one uint8 scale
    files.append(dict(base, file=f"{stem}_qdq.onnx", precision="int8-qdq", exporter="onnxruntime quantize_static QDQ"))
    for f in files:  # quantizers keep metadata_props; make sure the fp16 converter did too
        m = onnx.load(str(out / f["file"]))
        if not m.metadata_props:
            m.metadata_props.extend(onnx.load(str(src)).metadata_props)
            onnx.save(m, str(out / f["file"]))
    return files


# ------------------------------------------------------------------ manifest
def describe(out: Path, e: dict) -> dict:
    """Fill declared I/O, test shapes and concrete output shapes (from an ORT run) into entry `e`."""
    import onnx

    m = onnx.load(str(out / e["file"]))
    tname = {1: "float32", 10: "float16", 7: "int64"}

    def io(v):
        t = v.type.tensor_type
        return dict(name=v.name, dtype=tname.get(t.elem_type, str(t.elem_type)),
                    shape=[d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim])

    e.setdefault("precision", "fp32")
    e["inputs"] = [io(v) for v in m.graph.input]
    e["outputs"] = [io(v) for v in m.graph.output]
    e["opset"] = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    e["end2end"] = e["family"] == "end2end"
    e["nc"] = 80
    e["metadata"] = sorted(p.key for p in m.metadata_props)
    h, w = e["imgsz"]
    if e["dynamic"]:  # batch 4 at the export size, and batch 1 at another size when H/W are symbolic
        e["test_inputs"] = [[4, 3, h, w]] + ([[1, 3, h + 64, w - 64 if w > 256 else w + 64]] if e["dynamic_hw"] else [])
    else:
        e["test_inputs"] = [[e["batch"], 3, h, w]]
    e["expected_outputs"] = []
    sess = oracle.ort_session(out / e["file"], threads=2)
    dtype = np.float16 if e["inputs"][0]["dtype"] == "float16" else np.float32
    for shp in e["test_inputs"]:
        x = oracle.make_batch(e["family"], shp[0], shp[2:], dtype)
        outs = oracle.ort_run(sess, {e["inputs"][0]["name"]: x})
        e["expected_outputs"].append({k: list(v.shape) for k, v in outs.items()})
        if shp == e["test_inputs"][0]:  # detections above 0.25 on the first photo: a sanity statistic
            raw = next(iter(outs.values()))[0].astype(np.float32)
            if e["end2end"]:
                e["dets_at_0.25"] = int((raw[:, 4] > 0.25).sum())
            else:
                b, s = oracle.decode(raw, e["family"], shp[2:])
                e["dets_at_0.25"] = len(oracle.non_max_suppression(b, s)[1])
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--force", action="store_true", help="regenerate even if the manifest is current")
    ap.add_argument("--only", default="", help="comma list of steps (ultralytics,yolox,yolov5) for development;"
                    " writes no manifest")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    out = a.out.resolve()
    digest = script_hash()
    mf = out / "MANIFEST.json"
    if mf.is_file() and not a.force:
        old = json.loads(mf.read_text())
        if old.get("generator_sha256") == digest and all((out / e["file"]).is_file() for e in old["models"]):
            print(f"{mf}: up to date ({len(old['models'])} models)")
            return
    if not oracle.sample_images(CALIB_N):
        sys.exit("need sample photos: apt-get install darknet opencv-doc")
    import onnx
    import onnxruntime
    import torch
    import ultralytics

    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(SEED)
    out.mkdir(parents=True, exist_ok=True)
    mf.unlink(missing_ok=True)
    t0 = time.time()
    models = []
    steps = (make_ultralytics, make_yolox, make_yolov5)
    if a.only:
        for step in steps:
            if step.__name__[5:] in a.only.split(","):
                step(out, rng)
        return
    for step in steps:
        t = time.time()
        models += step(out, rng)
        print(f"{step.__name__}: {time.time() - t:.1f}s", file=sys.stderr)
    t = time.time()
    models += make_derived(out, next(e for e in models if e["file"] == QUANT_BASE))
    print(f"make_derived: {time.time() - t:.1f}s", file=sys.stderr)
    models = [describe(out, e) for e in models]
    manifest = dict(generator_sha256=digest, seed=SEED, seconds=round(time.time() - t0, 1),
                    versions=dict(torch=torch.__version__, ultralytics=ultralytics.__version__,
                                  onnx=onnx.__version__, onnxruntime=onnxruntime.__version__),
                    sample_images=[str(p) for p in oracle.sample_images()], models=models)
    mf.write_text(json.dumps(manifest, indent=1))
    print(f"{mf}: {len(models)} models in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
