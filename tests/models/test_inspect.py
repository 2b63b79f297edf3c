"""`vigil model inspect` on good models, and vigil's errors on bad models and inputs.

Bad inputs must fail with a non-zero exit code (never a signal/crash) and a message on stderr that
lets a user act: the file name, or the op type, node name and opset of an unsupported node.
"""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import oracle  # noqa: E402
from common import THREADS, describe, model_params, model_path, output_file, shared_model, vigil  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DTYPES = {"float32": {"float32", "float", "fp32"}, "float16": {"float16", "half", "fp16"}}


def inspect_json(model) -> dict:
    p = vigil("model", "inspect", model, "--json")
    assert p.returncode == 0, describe(p)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"stdout is not JSON ({e})\n{describe(p)}")


def check_io(got: list, want: list, what: str):
    assert [g["name"] for g in got] == [w["name"] for w in want], what
    for g, w in zip(got, want):
        assert str(g["dtype"]).lower() in DTYPES.get(w["dtype"], {w["dtype"]}), f"{what} {g['name']}: {g['dtype']}"
        assert len(g["shape"]) == len(w["shape"]), f"{what} {g['name']}: {g['shape']} vs {w['shape']}"
        for gd, wd in zip(g["shape"], w["shape"]):
            if isinstance(wd, int):
                assert gd == wd, f"{what} {g['name']}: {g['shape']} vs {w['shape']}"
            else:  # symbolic: any non-positive-int spelling (name, null, -1)
                assert not (isinstance(gd, int) and gd > 0), f"{what} {g['name']}: {g['shape']} vs {w['shape']}"


def op_counts(model) -> dict:
    return dict(collections.Counter(n.op_type for n in onnx.load(str(model)).graph.node))


@pytest.mark.parametrize("entry", model_params())
def test_inspect_generated(entry):
    """Family, 80 names, no unsupported ops, declared I/O and op counts of every generated model."""
    model = model_path(entry)
    j = inspect_json(model)
    assert j["family"] == entry["family"], j["family"]
    assert len(j["names"]) == 80 and j["names"][16] == "dog", j["names"][:20]
    assert j["unsupported_ops"] == [], j["unsupported_ops"]
    check_io(j["inputs"], entry["inputs"], "inputs")
    check_io(j["outputs"], entry["outputs"], "outputs")
    assert j["op_counts"] == op_counts(model)


@pytest.mark.parametrize("name,family", [("yolov8n_coco_640_int8dyn.onnx", "ultralytics"),
                                         ("yolox_nano_coco_416_fp32.onnx", "yolox")])
def test_inspect_shared(name, family):
    model = shared_model(name)
    j = inspect_json(model)
    assert j["family"] == family and len(j["names"]) == 80 and j["unsupported_ops"] == []
    assert j["names"][:3] == ["person", "bicycle", "car"]
    assert j["op_counts"] == op_counts(model)


# ------------------------------------------------------------------ tiny hand-made graphs
def save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=17) -> str:
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="vigil-tests")
    m.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return str(path)


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def assert_clean_failure(p, *needles):
    """Non-zero exit (not killed by a signal) and every needle (case-insensitive) on stderr."""
    assert p.returncode > 0, describe(p)
    for n in needles:
        assert str(n).lower() in p.stderr.lower(), f"stderr should mention {n!r}\n{describe(p)}"


def test_missing_file(tmp_path):
    p = vigil("model", "inspect", tmp_path / "nope.onnx", "--json")
    assert_clean_failure(p, "nope.onnx")


def test_truncated_file(tmp_path):
    src = model_path_or_shared()
    bad = tmp_path / "truncated.onnx"
    data = src.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    assert_clean_failure(vigil("model", "inspect", bad, "--json"), "truncated.onnx")
    x = np.zeros((1, 3, 640, 640), np.float32)
    np.save(tmp_path / "x.npy", x)
    assert_clean_failure(vigil("model", "run", "--model", bad, "--input", f"images={tmp_path / 'x.npy'}",
                               "--output-dir", tmp_path / "o"), "truncated.onnx")


def test_not_onnx(tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("these are not the protobufs you are looking for\n" * 50)
    assert_clean_failure(vigil("model", "inspect", bad, "--json"), "notes.onnx")


def test_unsupported_op(tmp_path):
    """A node with an unknown op type: inspect lists it; running fails naming op type, node and opset."""
    path = save(tmp_path, "weird", [helper.make_node("VigilFrobnicate", ["x"], ["y"], name="mystery_node")],
                [vi("x", [1, 4])], [vi("y", [1, 4])], opset=17)
    j = inspect_json(path)
    assert "VigilFrobnicate" in json.dumps(j["unsupported_ops"]), j["unsupported_ops"]
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    p = vigil("model", "run", "--model", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o")
    assert_clean_failure(p, "VigilFrobnicate", "mystery_node", "17")


def test_inconsistent_shapes(tmp_path):
    """Add of [1,3] and a [1,4] constant cannot broadcast: a clean error naming the node, no crash."""
    c = numpy_helper.from_array(np.ones((1, 4), np.float32), "c")
    path = save(tmp_path, "badshape", [helper.make_node("Add", ["x", "c"], ["y"], name="bad_add")],
                [vi("x", [1, 3])], [vi("y", [1, 3])], [c])
    np.save(tmp_path / "x.npy", np.ones((1, 3), np.float32))
    p = vigil("model", "run", "--model", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o")
    assert_clean_failure(p, "bad_add")
    p = vigil("model", "inspect", path, "--json")
    assert p.returncode >= 0, describe(p)  # may report or refuse, but must not crash


def mlp(tmp_path):
    """features [1,10] -> MatMul -> Add -> Sigmoid -> 'head/scores:0' [1,5]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(10, 5)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(5,)).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["features", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["z"], name="bias"),
             helper.make_node("Sigmoid", ["z"], ["head/scores:0"], name="act")]
    return save(tmp_path, "mlp", nodes, [vi("features", [1, 10])], [vi("head/scores:0", [1, 5])], [w, b])


def test_non_image_model_detect(tmp_path):
    """`vigil detect` with a [1,10]-input model fails clearly (mentions the input), writes no detections."""
    img = next((p for p in oracle.sample_images()), None)
    if img is None:
        pytest.skip("no sample photo")
    out = tmp_path / "d.jsonl"
    p = vigil("detect", "--model", mlp(tmp_path), "--json", out, "--no-save", img)
    assert_clean_failure(p, "input")
    assert not out.is_file() or not out.read_text().strip()


def test_run_generic_graph_and_output_names(tmp_path):
    """`model run` on a non-YOLO graph: output 'head/scores:0' lands in head_scores_0.npy, equal to ORT."""
    path = mlp(tmp_path)
    x = np.random.default_rng(1).normal(size=(1, 10)).astype(np.float32)
    np.save(tmp_path / "f.npy", x)
    p = vigil("model", "run", "--model", path, "--input", f"features={tmp_path / 'f.npy'}",
              "--output-dir", tmp_path / "o", "--threads", THREADS)
    assert p.returncode == 0, describe(p)
    f = output_file(tmp_path / "o", "head/scores:0")
    assert f.name == "head_scores_0.npy" and f.is_file(), describe(p)
    ref = oracle.ort_run(path, {"features": x})["head/scores:0"]
    np.testing.assert_allclose(np.load(f), ref, rtol=1e-5, atol=1e-6)


def test_run_two_inputs(tmp_path):
    """Two --input flags, matched by name (given in the opposite order of the graph inputs)."""
    nodes = [helper.make_node("Sub", ["a", "b"], ["d"], name="sub"), helper.make_node("Mul", ["d", "d"], ["sq"])]
    path = save(tmp_path, "two", nodes, [vi("a", [2, 3]), vi("b", [2, 3])], [vi("sq", [2, 3])])
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    p = vigil("model", "run", "--model", path, "--input", f"b={tmp_path / 'b.npy'}", "--input",
              f"a={tmp_path / 'a.npy'}", "--output-dir", tmp_path / "o")
    assert p.returncode == 0, describe(p)
    np.testing.assert_allclose(np.load(output_file(tmp_path / "o", "sq")), (a - b) ** 2, rtol=1e-6)


def test_run_wrong_input_name(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    path = save(tmp_path, "relu", nodes, [vi("x", [1, 3])], [vi("y", [1, 3])])
    np.save(tmp_path / "x.npy", np.ones((1, 3), np.float32))
    p = vigil("model", "run", "--model", path, "--input", f"nosuch={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o")
    assert_clean_failure(p, "nosuch")


def model_path_or_shared():
    from common import MODELS_DIR, SHARED_DIR

    for p in (MODELS_DIR / "yolov8n_640_b1_op17.onnx", SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"):
        if p.is_file():
            return p
    pytest.skip("no yolov8n model to truncate")


# ------------------------------------------------------------------ where each node runs (--device)
def test_inspect_plans_each_node_for_a_device_without_needing_it(tmp_path):
    """`--device cuda:0` answers on a machine without a GPU: each node's kernel, and the host fallbacks with the
    reason (here DynamicQuantizeLinear, which has no CUDA kernel); `--device cpu` puts every node on the CPU; a bad
    device is refused naming the option."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2")
    # Two chained convolutions: the NHWC region (a lone one would stay NCHW: nothing to chain with).
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("DynamicQuantizeLinear", ["c2"], ["q", "qs", "qz"], name="dql"),
             helper.make_node("DequantizeLinear", ["q", "qs", "qz"], ["s"], name="deq"),
             helper.make_node("Sigmoid", ["s"], ["y"], name="sig")]
    model = save(tmp_path, "plan", nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 8, 16, 16])], [w, w2])
    p = vigil("model", "inspect", model, "--json", "--device", "cuda:0", "--precision", "fp16")
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    if "no CUDA backend" in j.get("plan_error", ""):
        pytest.skip("this build has no CUDA backend")
    plan = j["plan"]
    by = {n["node"]: n for n in plan["nodes"]}
    assert by["dql"]["kernel"] == "host" and by["dql"]["reason"] == "no CUDA kernel: op", by["dql"]
    assert by["deq"]["kernel"] == "cuda" and by["sig"]["kernel"] == "cuda" and "reason" not in by["sig"]
    convs = [n for n in plan["nodes"] if n["op"] in ("Conv", "vigil.FusedConv")]
    assert [n["kernel"] for n in convs] == ["cudnn", "cudnn"], plan["nodes"]
    assert all(n["channels_last"] for n in convs) and not by["dql"]["channels_last"], plan["nodes"]
    assert plan["host_nodes"] == 1 and plan["conversions"] == 1, plan
    assert plan["kernels"]["host"] == 1
    text = vigil("model", "inspect", model, "--device", "cuda:0")
    assert text.returncode == 0, describe(text)
    assert "on host   : 'dql' (DynamicQuantizeLinear): no CUDA kernel: op" in text.stdout, text.stdout

    cpu = json.loads(vigil("model", "inspect", model, "--json", "--device", "cpu").stdout)["plan"]
    assert {n["kernel"] for n in cpu["nodes"]} == {"cpu"} and cpu["host_nodes"] == 0
    assert_clean_failure(vigil("model", "inspect", model, "--device", "gpu"), "--device", "cuda:N")
