"""The build's own checks fail when they should (issue 41): the module-border check (tools/check_borders.py)
against a copy of the tree with a deliberate cross-border include, and the lock check (scripts/thread-safety.sh)
against a source that reads a guarded field without its lock. Neither needs the vigil binary."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tools" / "check_borders.py"
pytestmark = pytest.mark.no_vigil


def run_check(root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root), *extra], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the sources, public headers, tests and the module table."""
    for top in ("src", "include", "tests", "bench", "docs"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("*.onnx", "*.npy", "__pycache__"))
    return tmp_path


def test_the_tree_as_committed_is_clean():
    r = run_check(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 violation(s)" in r.stdout


def test_an_include_of_another_modules_internals_fails(tree: Path):
    target = tree / "src" / "detect" / "nms.cc"
    target.write_text(target.read_text() + '#include "transport/ring.h"\n')
    r = run_check(tree)
    assert r.returncode == 1
    lines = [l for l in r.stdout.splitlines() if "src/detect/nms.cc" in l]
    assert len(lines) == 1, r.stdout
    assert "module 'detect' reaches into module 'transport''s internals (src/transport/ring.h)" in lines[0]
    assert "1 violation(s)" in r.stdout


def test_a_public_header_of_an_undeclared_module_fails(tree: Path):
    # detect's row declares infer and common; the aggregator sits above it.
    target = tree / "include" / "vigil" / "detect" / "nms.h"
    target.write_text('#include "vigil/aggregator/store.h"\n' + target.read_text())
    r = run_check(tree)
    assert r.returncode == 1
    assert "include/vigil/detect/nms.h:1: #include \"vigil/aggregator/store.h\": module 'detect' uses 'aggregator'" \
        in r.stdout


def test_declaring_the_dependency_in_the_table_allows_it(tree: Path):
    target = tree / "src" / "video" / "stats.cc"
    target.write_text(target.read_text() + '#include "vigil/metrics/registry.h"\n')
    assert run_check(tree).returncode == 1
    doc = tree / "docs" / "architecture.md"
    text = doc.read_text()
    row = next(l for l in text.splitlines() if l.startswith("| video |"))
    doc.write_text(text.replace(row, row.replace("| `common`;", "| `common`, `metrics`;", 1)))
    r = run_check(tree)
    assert r.returncode == 0, r.stdout


def test_product_code_including_test_code_fails(tree: Path):
    target = tree / "src" / "cli" / "main.cc"
    target.write_text(target.read_text() + '#include "testing/test_certs.h"\n')
    r = run_check(tree)
    assert r.returncode == 1
    assert "src/cli/main.cc" in r.stdout and "product code includes test code (tests/testing/test_certs.h)" in r.stdout


@pytest.mark.parametrize("read", [
    "std::chrono::steady_clock::now()",
    "std::chrono::system_clock::now()",
    "Wall::now()",  # through an alias of a std::chrono clock
    "::clock_gettime(CLOCK_MONOTONIC, &ts)",
])
def test_a_time_read_outside_the_clock_seam_fails(tree: Path, read: str):
    target = tree / "src" / "detect" / "nms.cc"
    target.write_text(target.read_text() + "using Wall = std::chrono::system_clock;\n"
                      f"inline void Peek() {{ timespec ts; (void)ts; auto t = {read}; (void)t; }}\n")
    r = run_check(tree)
    assert r.returncode == 1
    lines = [l for l in r.stdout.splitlines() if "src/detect/nms.cc" in l]
    assert len(lines) == 1, r.stdout
    assert "reads real time outside the Clock seam" in lines[0] and read in lines[0]
    assert "1 violation(s)" in r.stdout


def test_the_clock_seam_itself_may_read_time(tree: Path):
    seam = tree / "src" / "common" / "clock.cc"
    assert "steady_clock::now()" in seam.read_text()
    # A comment that names a clock's now() is not a read.
    target = tree / "src" / "detect" / "nms.cc"
    target.write_text(target.read_text() + "// never std::chrono::steady_clock::now() here\n")
    r = run_check(tree)
    assert "src/detect/nms.cc" not in r.stdout and "src/common/clock.cc" not in r.stdout, r.stdout


def test_a_cycle_in_the_table_fails(tree: Path):
    doc = tree / "docs" / "architecture.md"
    text = doc.read_text()
    row = next(l for l in text.splitlines() if l.startswith("| common |"))
    doc.write_text(text.replace(row, row.replace("| — ;", "| `transport`;", 1)))
    r = run_check(tree)
    assert r.returncode == 1
    assert "the module graph has a cycle" in r.stdout and "common -> transport -> common" in r.stdout


def test_a_link_dependency_not_in_the_table_fails(tree: Path, tmp_path: Path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "module_links.txt").write_text("vigil_common: \nvigil_detect: vigil_infer vigil_video\n"
                                            "vigil_infer: vigil_common\nvigil_video: vigil_common\n")
    r = run_check(tree, "--build", str(build))
    assert r.returncode == 1
    assert "vigil_detect links vigil_video, which module 'detect''s row in docs/architecture.md does not list" \
        in r.stdout


# The aggregator's row: `infer`, `detect`, `video` only with VIGIL_WITH_CLASSIFIER (docs/architecture.md).
BASE_LINKS = ("vigil_common: \nvigil_infer: vigil_common\nvigil_detect: vigil_infer vigil_common\n"
              "vigil_video: vigil_common\nvigil_metrics: vigil_common\nvigil_transport: vigil_common\n")


def fake_build(tmp_path: Path, aggregator_links: str, classifier: str | None) -> Path:
    build = Path(tempfile.mkdtemp(prefix="build-", dir=tmp_path))
    (build / "module_links.txt").write_text(BASE_LINKS + f"vigil_aggregator: {aggregator_links}\n")
    if classifier is not None:
        (build / "CMakeCache.txt").write_text(f"VIGIL_WITH_CUDA:STRING=AUTO\nVIGIL_WITH_CLASSIFIER:STRING={classifier}\n")
    return build


def test_a_dependency_only_with_an_option_follows_the_option_in_the_build(tmp_path: Path):
    with_model = "vigil_transport vigil_metrics vigil_infer vigil_detect vigil_video"
    without = "vigil_transport vigil_metrics"
    # ON: linked, as any declared dependency; OFF: not linked; the cache silent: either.
    for links, option in ((with_model, "ON"), (without, "OFF"), (with_model, None), (without, None)):
        r = run_check(REPO, "--build", str(fake_build(tmp_path, links, option)))
        assert r.returncode == 0, (links, option, r.stdout)
    r = run_check(REPO, "--build", str(fake_build(tmp_path, with_model, "OFF")))
    assert r.returncode == 1
    for d in ("infer", "detect", "video"):
        assert (f"module 'aggregator' links '{d}' (directly or through another), which its row in "
                f"docs/architecture.md allows only with VIGIL_WITH_CLASSIFIER, OFF in this build") in r.stdout, r.stdout
    assert "3 violation(s)" in r.stdout
    # Through another module counts too: the transport linking video would bring it in.
    build = fake_build(tmp_path, without, "OFF")
    (build / "module_links.txt").write_text(BASE_LINKS.replace("vigil_transport: vigil_common",
                                                               "vigil_transport: vigil_common vigil_video")
                                            + f"vigil_aggregator: {without}\n")
    r = run_check(REPO, "--build", str(build))
    assert "module 'aggregator' links 'video' (directly or through another)" in r.stdout, r.stdout
    r = run_check(REPO, "--build", str(fake_build(tmp_path, without, "ON")))
    assert r.returncode == 1
    assert "module 'aggregator' declares 'infer' in docs/architecture.md but its target does not link it" in r.stdout


def test_the_configured_build_matches_the_table():
    build = Path(os.environ.get("VIGIL_BUILD_DIR") or REPO / "build")
    if not (build / "module_links.txt").is_file():
        pytest.skip(f"{build}/module_links.txt missing: configure the build (scripts/build.sh)")
    r = run_check(REPO, "--build", str(build))
    assert r.returncode == 0, r.stdout


GUARDED = """
#include "vigil/common/mutex.h"
class Counter {
 public:
  void Add() { vigil::MutexLock lock(mu_); ++n_; }
  int Peek() const { return n_; }  // BUG: reads n_ without mu_
 private:
  mutable vigil::Mutex mu_;
  int n_ VIGIL_GUARDED_BY(mu_) = 0;
};
int main() { Counter c; c.Add(); return c.Peek(); }
"""


@pytest.mark.skipif(shutil.which("clang++") is None, reason="clang++ missing (scripts/deps.sh test installs it)")
def test_the_lock_check_fails_on_an_unguarded_read(tmp_path: Path):
    src = tmp_path / "src" / "demo"
    src.mkdir(parents=True)
    bad = src / "counter.cc"
    bad.write_text(GUARDED)
    build = tmp_path / "build"
    build.mkdir()
    entry = {"directory": str(build), "file": str(bad),
             "command": f"/usr/bin/c++ -std=c++20 -Wall -I{REPO / 'include'} -o x.o -c {bad}"}
    (build / "compile_commands.json").write_text(json.dumps([entry]))
    script = REPO / "scripts" / "thread-safety.sh"
    # The script checks the sources under <its repo>/src; point it at the demo tree with a copy of it.
    (tmp_path / "scripts").mkdir()
    shutil.copy(script, tmp_path / "scripts" / "thread-safety.sh")
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "thread-safety.sh"), str(build)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "reading variable 'n_' requires holding mutex 'mu_'" in r.stdout
    assert "0 passed, 1 failed" in r.stdout
    bad.write_text(GUARDED.replace("int Peek() const { return n_; }  // BUG: reads n_ without mu_",
                                   "int Peek() const { vigil::MutexLock lock(mu_); return n_; }"))
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "thread-safety.sh"), str(build)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 0 failed" in r.stdout
