"""Readable numpy reference ("oracle") for YOLO ONNX models (test tooling only).

- ONNX Runtime runner (CPU, 1 thread by default),
- Ultralytics-exact and YOLOX letterboxes (numpy + cv2),
- decoders for the four output layouts of ../../shared/design/YOLO-NOTES.md,
- Ultralytics-style NMS and a whole-image ``detect`` that returns vigil's JSONL records,
- a detection matcher used by the tests.

Only numpy, cv2 and (for ``ort_*``/``detect``) onnxruntime + onnx are needed.
"""
from __future__ import annotations

import ast
from pathlib import Path

import cv2
import numpy as np

COCO80 = [
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear",
    "hair drier", "toothbrush",
]

# Real photos shipped by Debian packages `darknet` and `opencv-doc` (fixed order: tests rely on it).
DARKNET_DATA = Path("/usr/share/darknet/data")
OPENCV_DATA = Path("/usr/share/doc/opencv-doc/examples/data")
SAMPLE_IMAGES = [
    DARKNET_DATA / "dog.jpg", OPENCV_DATA / "messi5.jpg", DARKNET_DATA / "person.jpg",
    OPENCV_DATA / "basketball1.png", DARKNET_DATA / "horses.jpg", DARKNET_DATA / "giraffe.jpg",
]
STRIDES = (8, 16, 32)
FAMILIES = ("ultralytics", "yolov5", "yolox", "end2end")


def sample_images(n: int | None = None) -> list[Path]:
    """The existing files of SAMPLE_IMAGES (first n)."""
    found = [p for p in SAMPLE_IMAGES if p.is_file()]
    return found[:n] if n else found


# ---------------------------------------------------------------- ONNX Runtime
def ort_session(model: str | Path, threads: int = 1):
    """CPU InferenceSession with `threads` intra-op threads (sequential execution)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_run(model, feeds: dict[str, np.ndarray], threads: int = 1) -> dict[str, np.ndarray]:
    """Run `model` (path or session) on `feeds`; returns {output name: array}."""
    sess = model if hasattr(model, "run") else ort_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def model_metadata(model: str | Path) -> dict[str, str]:
    """metadata_props of an ONNX file (Ultralytics/yolov5 store names, stride, imgsz, end2end there)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    return {p.key: p.value for p in m.metadata_props}


def class_names(meta: dict[str, str], nc: int) -> list[str]:
    """Class names from the `names` metadata (a Python dict/list literal), else COCO-80 / str(i)."""
    if "names" in meta:
        v = ast.literal_eval(meta["names"])
        names = [v[k] for k in sorted(v)] if isinstance(v, dict) else list(v)
        if len(names) == nc:
            return [str(n) for n in names]
    return list(COCO80) if nc == 80 else [str(i) for i in range(nc)]


def n_cells(h: int, w: int, strides=STRIDES) -> int:
    """Number of grid cells over all strides (8400 at 640x640)."""
    return sum((h // s) * (w // s) for s in strides)


def model_family(sess, imgsz, meta: dict[str, str] | None = None) -> str:
    """Family of a loaded session: from the declared output shape, or a zero-input probe when symbolic."""
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
    shape = out.shape
    if not all(isinstance(d, int) for d in shape):
        dtype = np.float16 if "float16" in inp.type else np.float32
        shape = sess.run([out.name], {inp.name: np.zeros((1, 3, *imgsz), dtype)})[0].shape
    return infer_family(shape, imgsz, meta)


def infer_family(out_shape, imgsz, meta: dict[str, str] | None = None) -> str:
    """Family from metadata and the concrete output shape [B, ., .] at input size imgsz=(h, w)."""
    meta = meta or {}
    _, d1, d2 = out_shape
    if meta.get("end2end") == "True" or (d2 == 6 and d1 == 300):
        return "end2end"
    cells = n_cells(*imgsz)
    if d2 == cells and d1 < d2:
        return "ultralytics"
    if d1 == cells:
        return "yolox"
    if d1 == 3 * cells:
        return "yolov5"
    raise ValueError(f"unknown YOLO layout {out_shape} at imgsz {imgsz}")


# ---------------------------------------------------------------- preprocessing
def letterbox_ultralytics(img: np.ndarray, new_shape=(640, 640), color=114):
    """Ultralytics LetterBox(auto=False, center=True) + to-tensor.

    r = min(Ht/h, Wt/w); resized (round(w r), round(h r)) (Python round, at least 1) with cv2.INTER_LINEAR;
    pad `color` with top = round(dh - 0.1), bottom = round(dh + 0.1) (same for left/right, dh = half
    the padding) so odd padding goes bottom/right; BGR->RGB; /255; CHW float32.
    Returns (chw, (gain_y, gain_x), (left, top)); boxes map back by (b - pad) / gain.
    """
    h, w = img.shape[:2]
    ht, wt = new_shape
    r = min(ht / h, wt / w)
    nw, nh = max(round(w * r), 1), max(round(h * r), 1)
    if (nw, nh) != (w, h):
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    dw, dh = (wt - nw) / 2, (ht - nh) / 2
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(color,) * 3)
    chw = np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1), dtype=np.float32) / 255.0
    # ultralytics.utils.ops.scale_boxes maps back with per-axis gains new/old of the rounded size
    return chw, (nh / h, nw / w), (left, top)


def letterbox_yolox(img: np.ndarray, new_shape=(416, 416), color=114):
    """YOLOX preproc: r = min(Ht/h, Wt/w), resize to (int(w r), int(h r)) (truncated) with INTER_LINEAR,
    paste at the top-left of a `color` canvas, keep BGR and 0..255, CHW float32.
    Returns (chw, (r, r), (0, 0))."""
    h, w = img.shape[:2]
    r = min(new_shape[0] / h, new_shape[1] / w)
    nw, nh = int(w * r), int(h * r)
    canvas = np.full((new_shape[0], new_shape[1], 3), color, np.uint8)
    canvas[:nh, :nw] = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32), (r, r), (0, 0)


def preprocess(img, family: str, imgsz):
    """The letterbox a family's models were trained with (YOLOX: BGR 0..255 top-left; else Ultralytics)."""
    return (letterbox_yolox if family == "yolox" else letterbox_ultralytics)(img, tuple(imgsz))


def make_batch(family: str, batch: int, imgsz, dtype=np.float32, images=None) -> np.ndarray:
    """[batch, 3, h, w] of `batch` different real images (cycled if fewer exist), letterboxed for `family`."""
    paths = images or sample_images()
    if not paths:
        raise FileNotFoundError("no sample images: install Debian packages darknet and opencv-doc")
    chws = [preprocess(cv2.imread(str(paths[i % len(paths)])), family, imgsz)[0] for i in range(batch)]
    return np.stack(chws).astype(dtype)


# ---------------------------------------------------------------- decoding
def yolox_grids(imgsz, strides=STRIDES):
    """(grid_xy [N,2], stride [N,1]) in YOLOX's order: per stride, row-major over (y, x)."""
    grids, strd = [], []
    for s in strides:
        hs, ws = imgsz[0] // s, imgsz[1] // s
        yv, xv = np.meshgrid(np.arange(hs), np.arange(ws), indexing="ij")
        grids.append(np.stack((xv, yv), -1).reshape(-1, 2))
        strd.append(np.full((hs * ws, 1), s))
    return np.concatenate(grids).astype(np.float32), np.concatenate(strd).astype(np.float32)


def xywh2xyxy(b: np.ndarray) -> np.ndarray:
    xy, wh = b[:, :2], b[:, 2:4] / 2
    return np.concatenate((xy - wh, xy + wh), 1)


def decode(out: np.ndarray, family: str, imgsz):
    """One image's raw output -> (boxes xyxy in input pixels [N,4], class scores [N,nc]).

    ultralytics [4+nc, N]: cx,cy,w,h + sigmoided class scores.   yolov5 [N, 5+nc]: cx,cy,w,h, obj, cls
    (score = obj*cls).   yolox [N, 5+nc]: raw xy/wh decoded with grids, obj*cls.   end2end is not
    decoded here (see `end2end_dets`).
    """
    out = out.astype(np.float32)
    if family == "ultralytics":
        p = out.T
        return xywh2xyxy(p[:, :4]), p[:, 4:]
    if family == "yolov5":
        return xywh2xyxy(out[:, :4]), out[:, 5:] * out[:, 4:5]
    if family == "yolox":
        grid, stride = yolox_grids(imgsz)
        xy = (out[:, :2] + grid) * stride
        wh = np.exp(out[:, 2:4]) * stride
        return xywh2xyxy(np.concatenate((xy, wh), 1)), out[:, 5:] * out[:, 4:5]
    raise ValueError(family)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix [len(a), len(b)] of xyxy boxes (areas without +1, as torchvision)."""
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:4], b[None, :, 2:4])
    inter = np.clip(br - tl, 0, None).prod(2)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-12)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_thres: float) -> np.ndarray:
    """Greedy NMS (torchvision.ops.nms semantics: suppress IoU > thres), indices by descending score."""
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        if order.size == 1:
            break
        iou = box_iou(boxes[i:i + 1], boxes[order[1:]])[0]
        order = order[1:][iou <= iou_thres]
    return np.array(keep, dtype=np.int64)


def non_max_suppression(boxes, cls_scores, conf=0.25, iou=0.7, max_det=300, agnostic=False,
                        max_nms=30000, max_wh=7680):
    """Ultralytics `non_max_suppression` for one image.

    Confidence = best class score (already x objectness for v5/YOLOX), keep conf > `conf`; at most
    `max_nms` highest enter NMS; class-aware by offsetting boxes by class*max_wh (unless agnostic);
    keep at most `max_det`. Returns (boxes [K,4], scores [K], class ids [K]) sorted by score.
    """
    cls_id = cls_scores.argmax(1)
    score = cls_scores[np.arange(len(cls_id)), cls_id]
    m = score > conf
    boxes, score, cls_id = boxes[m], score[m], cls_id[m]
    if len(score) > max_nms:
        top = np.argsort(-score, kind="stable")[:max_nms]
        boxes, score, cls_id = boxes[top], score[top], cls_id[top]
    offset = 0 if agnostic else cls_id[:, None].astype(np.float32) * max_wh
    keep = nms(boxes + offset, score, iou)[:max_det]
    return boxes[keep], score[keep], cls_id[keep]


def end2end_dets(out: np.ndarray, conf=0.25, max_det=300):
    """[300, 6] rows (x1, y1, x2, y2, score, class) -> thresholded (boxes, scores, class ids); no NMS."""
    out = out[out[:, 4] > conf][:max_det]
    return out[:, :4].astype(np.float32), out[:, 4], out[:, 5].astype(np.int64)


def scale_boxes(boxes: np.ndarray, gain, pad, img_shape) -> np.ndarray:
    """Input-pixel xyxy -> source-image pixels: subtract (left, top) pad, divide by gain, clip."""
    b = boxes.astype(np.float64).copy()
    b[:, [0, 2]] = (b[:, [0, 2]] - pad[0]) / gain[1]
    b[:, [1, 3]] = (b[:, [1, 3]] - pad[1]) / gain[0]
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, img_shape[1])
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, img_shape[0])
    return b


# ---------------------------------------------------------------- whole pipeline
def detect(model, image_paths, conf=0.25, iou=0.7, max_det=300, agnostic=False, imgsz=None, family=None,
           threads=1) -> list[dict]:
    """Reference of `vigil detect`: letterbox, ORT, decode, NMS, scale back.

    One image per run (batch 1). `imgsz` (h, w) is required when the model's H/W are symbolic.
    Returns vigil's JSONL records {"file", "class_id", "name", "score", "box"}; unreadable files are skipped.
    """
    images = ((str(p), cv2.imread(str(p))) for p in image_paths)
    return detect_images(model, ((name, img) for name, img in images if img is not None), conf, iou, max_det,
                         agnostic, imgsz, family, threads)


def detect_images(model, images, conf=0.25, iou=0.7, max_det=300, agnostic=False, imgsz=None, family=None,
                  threads=1) -> list[dict]:
    """`detect` on decoded pictures: `images` yields (name, BGR uint8 array [h, w, 3]); records carry the
    name as "file"."""
    sess = ort_session(model, threads)
    inp = sess.get_inputs()[0]
    dtype = np.float16 if "float16" in inp.type else np.float32
    if imgsz is None:
        imgsz = [int(d) for d in inp.shape[2:]]
    meta = model_metadata(model)
    fam = family or model_family(sess, imgsz, meta)
    recs = []
    for name, img in images:
        x, gain, pad = preprocess(img, fam, imgsz)
        raw = next(iter(ort_run(sess, {inp.name: x[None].astype(dtype)}).values()))[0].astype(np.float32)
        if fam == "end2end":
            boxes, scores, cls = end2end_dets(raw, conf, max_det)
            nc = 80
        else:
            b, s = decode(raw, fam, imgsz)
            boxes, scores, cls = non_max_suppression(b, s, conf, iou, max_det, agnostic)
            nc = s.shape[1]
        names = class_names(meta, nc)
        for box, sc, c in zip(scale_boxes(boxes, gain, pad, img.shape[:2]), scores, cls):
            recs.append({"file": name, "class_id": int(c), "name": names[int(c)] if c < len(names) else str(c),
                         "score": float(sc), "box": [float(v) for v in box]})
    return recs


def match_detections(ref: list[dict], test: list[dict], hi=0.3, lo=0.25, min_iou=0.9, max_dscore=0.05,
                     box_atol=1.0) -> list[str]:
    """Each `ref` detection with score >= hi must have a `test` detection of the same file and class with
    score >= lo, |score difference| <= max_dscore and IoU >= min_iou -- or all box coordinates within
    `box_atol` pixels, since IoU is ill-conditioned for tiny or degenerate (clipped to zero-area) boxes.
    Returns failure messages."""
    fails = []
    for r in ref:
        if r["score"] < hi:
            continue
        cands = [t for t in test if Path(t["file"]).name == Path(r["file"]).name and t["class_id"] == r["class_id"]
                 and t["score"] >= lo and abs(t["score"] - r["score"]) <= max_dscore]
        ok = False
        if cands:
            tb = np.array([t["box"] for t in cands], np.float64)
            rb = np.array([r["box"]], np.float64)
            ok = bool(((box_iou(rb, tb)[0] >= min_iou) | (np.abs(tb - rb).max(1) <= box_atol)).any())
        if not ok:
            fails.append(f"{Path(r['file']).name}: {r['name']}({r['class_id']}) {r['score']:.3f} "
                         f"{[round(v, 1) for v in r['box']]} unmatched")
    return fails


def upcast_fp16_model(model: str | Path) -> bytes:
    """The fp32-compute twin of an fp16 model: fp16 initializers/constants -> fp32 (exact), Cast-to-fp16
    -> Cast-to-fp32, fp16 graph I/O -> fp32. It computes what an engine that upcasts fp16 weights
    and runs in fp32 computes (ORT's own fp16 kernels round intermediates to fp16)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    m = onnx.load(str(model))
    g = m.graph

    def up(t):
        if t.data_type == TensorProto.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))

    for t in g.initializer:
        up(t)
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT16:
                a.i = TensorProto.FLOAT
            if a.type == onnx.AttributeProto.TENSOR:
                up(a.t)
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    del g.value_info[:]
    return m.SerializeToString()


def float_twin_of_dynamic_quant(model: str | Path) -> bytes:
    """The float model a dynamically quantized one approximates (YOLO-NOTES.md): each
    DynamicQuantizeLinear(x) -> ConvInteger(x_q, W_q, x_zp, W_zp) -> Cast(float) -> Mul(x_scale * w_scale)
    chain becomes Conv(x, (W_q - W_zp) * w_scale) writing the Mul's output; the bias Add that follows
    stays. Written independently of vigil's C++ pass (plain onnx graph surgery), so ORT on the twin is
    an exact fp32 oracle for an engine that dequantizes weights and keeps activations in float."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(model))
    g = m.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    drop, add = set(), []
    for n in g.node:
        if n.op_type != "ConvInteger":
            continue
        dql = producer[n.input[0]]
        assert dql.op_type == "DynamicQuantizeLinear", dql.op_type
        (cast,) = consumers[n.output[0]]
        (mul,) = consumers[cast.output[0]]
        scale_name = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
        scale_mul = producer[scale_name]  # x_scale * w_scale
        w_scale_name = next(i for i in scale_mul.input if i in inits)
        w_q = inits[n.input[1]].astype(np.float32)
        w_zp = inits[n.input[3]].astype(np.float32) if len(n.input) > 3 and n.input[3] else np.float32(0)
        w_scale = inits[w_scale_name].astype(np.float32)
        if w_zp.ndim == 1 and w_zp.size > 1:
            w_zp = w_zp.reshape(-1, 1, 1, 1)
        if w_scale.ndim == 1 and w_scale.size > 1:
            w_scale = w_scale.reshape(-1, 1, 1, 1)
        w_name = n.input[1] + "_float_twin"
        g.initializer.append(numpy_helper.from_array(((w_q - w_zp) * w_scale).astype(np.float32), w_name))
        add.append(helper.make_node("Conv", [dql.input[0], w_name], [mul.output[0]], name=n.name + "_float",
                                    **{a.name: helper.get_attribute_value(a) for a in n.attribute}))
        drop.update({id(n), id(cast), id(mul)})
    keep = [n for n in g.node if id(n) not in drop] + add
    del g.node[:]
    g.node.extend(keep)
    m = onnx.shape_inference.infer_shapes(m)
    # Topological order for ORT: a node after all producers of its inputs.
    done = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    order, pending = [], list(g.node)
    while pending:
        ready = [n for n in pending if all(i in done for i in n.input)]
        assert ready, "cycle while ordering the float twin"
        for n in ready:
            order.append(n)
            done.update(n.output)
        pending = [n for n in pending if all(n is not r for r in ready)]
    del g.node[:]
    g.node.extend(order)
    return m.SerializeToString()
