"""Paths, manifest loading and the vigil CLI runner shared by tests/models (test tooling only).

Environment:
  VIGIL_BIN            the vigil CLI binary (tests skip when unset)
  VIGIL_TEST_MODELS    generated models + MANIFEST.json (default <repo>/build/testmodels;
                       make them with tools/testmodels/make_models.py --out DIR)
  VIGIL_SHARED_MODELS  real models (default <repo>/../shared/models)
  VIGIL_TEST_THREADS   --threads passed to vigil (default 2)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "testmodels"))

MODELS_DIR = Path(os.environ.get("VIGIL_TEST_MODELS") or REPO / "build" / "testmodels")
SHARED_DIR = Path(os.environ.get("VIGIL_SHARED_MODELS") or REPO.parent / "shared" / "models")
THREADS = os.environ.get("VIGIL_TEST_THREADS", "2")
TIMEOUT = 600


def vigil_bin() -> str | None:
    p = os.environ.get("VIGIL_BIN")
    return p if p and os.path.isfile(p) and os.access(p, os.X_OK) else None


def vigil(*args, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    """Run the vigil CLI with `args`; returns the CompletedProcess (text stdout/stderr)."""
    binary = vigil_bin()
    if binary is None:
        pytest.skip("VIGIL_BIN not set")
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def describe(p: subprocess.CompletedProcess) -> str:
    """Command, exit code and output for assertion messages."""
    return f"$ {' '.join(map(str, p.args))}\nexit {p.returncode}\nstdout: {p.stdout[-3000:]}\nstderr: {p.stderr[-3000:]}"


def output_file(out_dir: Path, name: str) -> Path:
    """Where `vigil model run` writes output `name`: '/' and ':' replaced by '_', .npy."""
    return Path(out_dir) / (re.sub(r"[/:]", "_", name) + ".npy")


def manifest() -> dict | None:
    f = MODELS_DIR / "MANIFEST.json"
    return json.loads(f.read_text()) if f.is_file() else None


def model_params(pred=lambda e: True, ids=lambda e: e["file"]):
    """pytest params over MANIFEST entries satisfying `pred`; a single skipped param when there is none."""
    m = manifest()
    if m is None:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"no {MODELS_DIR}/MANIFEST.json: run tools/testmodels/make_models.py --out {MODELS_DIR} "
                   "(or set VIGIL_TEST_MODELS)"))]
    return [pytest.param(e, id=ids(e)) for e in m["models"] if pred(e)]


def model_path(entry: dict) -> Path:
    p = MODELS_DIR / entry["file"]
    if not p.is_file():
        pytest.skip(f"{p} missing: regenerate with tools/testmodels/make_models.py")
    return p


def shared_model(name: str) -> Path:
    p = SHARED_DIR / name
    if not p.is_file():
        pytest.skip(f"shared model {p} absent (set VIGIL_SHARED_MODELS)")
    return p


def read_jsonl(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
