#!/usr/bin/env python3
"""Detection-level check of the CUDA backend against vigil's CPU backend on real images (issue #4).

    python3 tools/gpu/check_models.py --engine vigil-engine --models DIR --images DIR --out result.json

For every model in DIR: the images are letterboxed as the model's family expects
(tools/testmodels/oracle.py) and run through `vigil-engine model run` on the CPU backend (fp32, the
reference, itself checked against ONNX Runtime by the CPU test suite) and on `cuda:0` in fp32 and
fp16 (all images in one process each), then decoded and NMS'd by the same oracle code and matched:
every CPU detection with score >= 0.3 needs a GPU one of the same class with IoU >= 0.9 and
|delta score| <= 0.02 (fp16) / 0.005 (fp32). Pass: every detection matched for the real models (file
name contains "coco"); for the random-weight generated models, whose hundreds of detections per
image sit near the thresholds with degenerate boxes, >= 98% matched (the count is reported). ONNX
Runtime's detections are matched too and reported, for information (int8 models differ from it by
design: ORT quantizes activations). Raw outputs: max |gpu - cpu| / max(1, max |cpu|).
Exit status 1 when any model fails. Test tooling only.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testmodels"))
import oracle  # noqa: E402


def detections(raw, fam, imgsz, gain, pad, shape, path, names):
    if fam == "end2end":
        boxes, scores, cls = oracle.end2end_dets(raw, 0.25, 300)
    else:
        b, s = oracle.decode(raw, fam, imgsz)
        boxes, scores, cls = oracle.non_max_suppression(b, s, 0.25, 0.45 if fam in ("yolov5", "yolox") else 0.7, 300)
    return [{"file": str(path), "class_id": int(c), "name": names[int(c)] if c < len(names) else str(c),
             "score": float(sc), "box": [float(v) for v in bx]}
            for bx, sc, c in zip(oracle.scale_boxes(boxes, gain, pad, shape), scores, cls)]


def check(engine: str, model: Path, images: list[Path]) -> dict:
    sess = oracle.ort_session(model, threads=8)
    inp = sess.get_inputs()[0]
    dims = [d if isinstance(d, int) else None for d in inp.shape]
    imgsz = [dims[2] or 640, dims[3] or 640]
    meta = oracle.model_metadata(model)
    fam = oracle.model_family(sess, imgsz, meta)
    dtype = np.float16 if "float16" in inp.type else np.float32
    result = {"model": model.name, "family": fam, "imgsz": imgsz}
    with tempfile.TemporaryDirectory() as td:
        feeds, prep = [], []
        for i, p in enumerate(images):
            img = cv2.imread(str(p))
            x, gain, pad = oracle.preprocess(img, fam, imgsz)
            f = Path(td) / f"in{i}.npy"
            np.save(f, x[None].astype(dtype))
            feeds.append(f)
            prep.append((p, img.shape[:2], gain, pad, x))
        ort_raw = [next(iter(oracle.ort_run(sess, {inp.name: x[None].astype(dtype)}).values()))[0].astype(np.float32)
                   for (_, _, _, _, x) in prep]
        nc = 80 if fam == "end2end" else oracle.decode(ort_raw[0], fam, imgsz)[1].shape[1]
        names = oracle.class_names(meta, nc)
        ort = [d for (p, shape, gain, pad, _), raw in zip(prep, ort_raw)
               for d in detections(raw, fam, imgsz, gain, pad, shape, p, names)]

        def vigil(device, precision):
            out = Path(td) / f"{device}_{precision}"
            cmd = [engine, "model", "run", "--model", str(model), "--device", device, "--precision", precision,
                   "--output-dir", str(out)] + [a for f in feeds for a in ("--input", f"{inp.name}={f}")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                return None, proc.stderr.strip()[-2000:]
            stem = Path(proc.stdout.split()[0]).name.split(".")[0]  # "<dir>/<output>[.<run>].npy ..."
            return [np.load(out / (f"{stem}.{i}.npy" if len(feeds) > 1 else f"{stem}.npy"))[0].astype(np.float32)
                    for i in range(len(feeds))], ""

        cpu_raw, err = vigil("cpu", "fp32")
        if cpu_raw is None:
            result["error"] = "cpu: " + err
            return result
        ref = [d for (p, shape, gain, pad, _), raw in zip(prep, cpu_raw)
               for d in detections(raw, fam, imgsz, gain, pad, shape, p, names)]
        result["cpu_detections"], result["ort_detections"] = len(ref), len(ort)
        result["cpu_vs_ort_unmatched"] = oracle.match_detections(ort, ref, max_dscore=0.05 if "int8" in model.name else 0.02)
        real = "coco" in model.name
        for precision, dscore in (("fp32", 0.005), ("fp16", 0.02)):
            gpu_raw, err = vigil("cuda:0", precision)
            if gpu_raw is None:
                result[precision] = {"error": err, "ok": False}
                continue
            max_diff = max(float(np.abs(g - c).max() / max(1.0, np.abs(c).max())) for g, c in zip(gpu_raw, cpu_raw))
            test = [d for (p, shape, gain, pad, _), raw in zip(prep, gpu_raw)
                    for d in detections(raw, fam, imgsz, gain, pad, shape, p, names)]
            fails = oracle.match_detections(ref, test, hi=0.3, lo=0.25, min_iou=0.9, max_dscore=dscore)
            checked = sum(1 for r in ref if r["score"] >= 0.3)
            rate = 1.0 - len(fails) / max(1, checked)
            result[precision] = {"detections": len(test), "checked": checked, "matched_rate": rate,
                                 "raw_max_rel_diff": max_diff, "unmatched": fails,
                                 "ok": not fails if real else rate >= 0.98}
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    images = sorted(a.images.glob("*.jpg"))
    results, ok = [], True
    for model in sorted(a.models.glob("*.onnx")):
        if "qdq" in model.name:  # QDQ: compared with the CPU backend by the GoogleTest suite instead
            continue
        r = check(a.engine, model, images)
        results.append(r)
        for p in ("fp32", "fp16"):
            rp = r.get(p, {})
            ok = ok and bool(rp.get("ok"))
            print(f"{model.name:40s} {p}: {'OK ' if rp.get('ok') else 'FAIL'} cpu={r.get('cpu_detections')} "
                  f"gpu={rp.get('detections')} matched={rp.get('matched_rate', 0):.3f} of {rp.get('checked')} "
                  f"raw_rel={rp.get('raw_max_rel_diff', float('nan')):.2e} {r.get('error', '')}"
                  f"{rp.get('error', '')[:300]} {rp.get('unmatched', [])[:3]}")
        print(f"{'':40s} cpu vs ORT: {len(r.get('cpu_vs_ort_unmatched', []))} unmatched of ort={r.get('ort_detections')}")
    a.out.write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
