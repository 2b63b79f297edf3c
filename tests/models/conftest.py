"""tests/models: end-to-end checks of the vigil CLI against ONNX Runtime and a numpy reference.

Every test here needs the vigil binary (env VIGIL_BIN); without it they are all skipped with one
clear reason, except those marked `no_vigil` (self-checks of the reference itself).
Python dependencies come from scripts/test-venv.sh (onnxruntime, onnx, pytest; cv2/numpy from Debian).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import vigil_bin  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "no_vigil: runs without the vigil binary (checks the reference only)")


def pytest_collection_modifyitems(config, items):
    if vigil_bin() is not None:
        return
    value = os.environ.get("VIGIL_BIN")
    reason = ("VIGIL_BIN is not set: export VIGIL_BIN=<path to the built vigil CLI> to run the model tests"
              if not value else f"VIGIL_BIN={value} is not an executable file")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents and "no_vigil" not in item.keywords:
            item.add_marker(skip)
