"""Error measures shared by the model tests (see each docstring for why it is meaningful)."""
from __future__ import annotations

import numpy as np

LOGIT_EPS = {"float32": 1e-3, "float16": 1e-2}


def rel_err(test: np.ndarray, ref: np.ndarray) -> float:
    """max |test - ref| / max |ref|: the worst absolute error relative to the output block's scale.

    Boxes are in input pixels: an error of 1e-4 x 640 = 0.06 px is invisible in any detection, yet a
    wrong stride, anchor, grid offset, resize or padding moves boxes by whole pixels (>= 1.5e-3), and
    fp32 arithmetic in a different summation order stays near 1e-6 of the scale. Normalising by the block
    maximum (not element-wise) avoids blowing up near-zero elements whose absolute error is harmless.
    """
    test, ref = np.asarray(test, np.float64), np.asarray(ref, np.float64)
    if test.shape != ref.shape:
        return float("inf")
    scale = max(np.abs(ref).max(initial=0.0), 1e-12)
    return float(np.abs(test - ref).max(initial=0.0) / scale) if np.isfinite(test).all() else float("inf")


def logit(p: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """Inverse sigmoid of p clipped to [eps, 1 - eps]."""
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    return np.log(p) - np.log1p(-p)


def score_err(test: np.ndarray, ref: np.ndarray, eps: float = 1e-3) -> float:
    """rel_err in logit space, on sigmoid outputs clipped to [eps, 1 - eps].

    Scores are sigmoids: near 0 and 1 a plain difference hides large errors of the underlying
    logit (0.999 vs 0.9999 is a 10x odds error), while in the middle it overstates them. The logit
    is what the network computed; clipping at eps = 1e-3 (fp32) keeps fp32 rounding of saturated
    sigmoids (ulp 6e-8 near 1) from dominating, and no practical threshold lies outside
    [1e-3, 1 - 1e-3]. The error is relative to the largest |logit| (<= 6.9 after clipping).
    """
    if np.shape(test) != np.shape(ref):
        return float("inf")
    return rel_err(logit(test, eps), logit(ref, eps))


def split_output(out: np.ndarray, family: str):
    """(box block, score block) of a raw output [B, ...] for the anchor-based/anchor-free layouts.

    ultralytics [B, 4+nc, N]: rows 0-3 boxes, rows 4.. sigmoided class scores.
    yolov5 / yolox [B, N, 5+nc]: columns 0-3 boxes (decoded for v5, raw for YOLOX), 4.. sigmoids.
    """
    if family == "ultralytics":
        return out[:, :4], out[:, 4:]
    return out[..., :4], out[..., 4:]


def raw_errors(test: np.ndarray, ref: np.ndarray, family: str, eps: float = 1e-3) -> dict:
    """{'box': rel_err of box block, 'score': score_err of score block} (inf on shape mismatch)."""
    if test.shape != ref.shape:
        return {"box": float("inf"), "score": float("inf"), "shape": (test.shape, ref.shape)}
    tb, ts = split_output(test, family)
    rb, rs = split_output(ref, family)
    return {"box": rel_err(tb, rb), "score": score_err(ts, rs, eps)}


def end2end_errors(test: np.ndarray, ref: np.ndarray, eps: float = 1e-3) -> tuple[dict, list[str]]:
    """Compare [B, 300, 6] end-to-end outputs (x1, y1, x2, y2, score, class) as sets.

    TopK ties and near-ties (scores equal to ~1e-7) may order rows differently, and rows whose score
    is within the tolerance of the 300th score may be swapped in/out of the selection. So: every
    reference row with score above (300th score + margin) must have a test row of the *same class*
    whose box matches (rel_err on the 4 coords, scaled by the largest |box| coordinate) and whose score
    matches in logit space; the matched errors are returned as {'box', 'score'}.
    """
    if test.shape != ref.shape:
        return {"box": float("inf"), "score": float("inf")}, [f"shape {test.shape} != {ref.shape}"]
    fails, box_e, sc_e = [], [0.0], [0.0]
    scale = max(np.abs(ref[..., :4]).max(), 1e-12)
    for b in range(ref.shape[0]):
        r, t = ref[b].astype(np.float64), test[b].astype(np.float64)
        floor = r[:, 4].min() + 1e-4
        for row in r[r[:, 4] > floor]:
            same = t[t[:, 5] == row[5]]
            if not len(same):
                fails.append(f"batch {b}: no class {int(row[5])} row for score {row[4]:.5f}")
                continue
            d = np.abs(same[:, :4] - row[:4]).max(1) / scale
            k = int(d.argmin())
            box_e.append(float(d[k]))
            sc_e.append(float(abs(logit(same[k, 4], eps) - logit(row[4], eps)) / abs(logit(r[:, 4], eps)).max()))
    return {"box": max(box_e), "score": max(sc_e)}, fails
