#!/usr/bin/env python3
"""Checks vigil's module borders (issue 41; STYLE.md rules 10 and 12) against the module table of
docs/architecture.md, the one place they are written down.

The table is the one under the heading "## Modules (folders) and dependencies": a row per module, the
modules it may use in its "depends on" column as backticked names (`common`, `infer`, ...); anything else in
that column (external libraries) is prose. Names inside "(only with OPTION: ...)" are dependencies of a CMake
option (e.g. "(only with VIGIL_WITH_CLASSIFIER: `infer`, `detect`)"): allowed to the module's files as any other,
and with --build linked exactly when OPTION is ON in DIR/CMakeCache.txt (required when ON, forbidden when OFF,
either when the cache does not say). The check fails, naming file, line and rule, when:
  1. a file of module M (src/M/**, include/vigil/M/**) includes the public header of a module that is neither M
     nor in M's row ("vigil/X/..." with X not declared);
  2. any file outside module M includes one of M's internal headers ("M/..." resolved against src/, i.e.
     src/M/...), except the white-box tests and benchmarks listed in WHITE_BOX below;
  3. product code (src/, include/) includes test code (tests/...);
  4. a quoted include names no file (neither under include/, src/, nor beside the including file);
  5. (with --build DIR) a library's direct vigil_* link dependency, as CMake configured it
     (DIR/module_links.txt, written by src/CMakeLists.txt), is not in that module's row; or a declared dependency
     is not linked at all (directly or through another); or the declared graph has a cycle; or a dependency
     "only with" an option that is OFF in the build is linked (directly or through another);
  6. product code (src/, include/) reads real time itself — a std::chrono clock's now() (or an alias's),
     clock_gettime, gettimeofday, time(nullptr) — anywhere but the Clock seam (TIME_SEAM below): code decides with a
     Clock* and bounds blocking waits with a vigil::Deadline (include/vigil/common/deadline.h).
Exit status 0 when clean, 1 with one line per violation, 2 on a malformed table.

Usage: tools/check_borders.py [--root REPO] [--build BUILD_DIR]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HEADING = "## Modules (folders) and dependencies"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = {".cc", ".h", ".cu", ".cuh", ".hpp", ".cpp"}

# White-box code that may read a module's internals: (folder prefix under the repo) -> modules.
WHITE_BOX = {
    "tests/cuda/": {"infer", "detect", "transport", "aggregator"},  # the GPU tests: kernels and plans
    "tests/testing/": {"infer"},  # graph_builder.h builds graphs through the op registry
    "bench/": {"infer"},  # conv_bench times the backends' kernels
}
# The only product files that read real time themselves (rule 6).
TIME_SEAM = {"src/common/clock.cc"}
CHRONO_CLOCK = r"(?:std::)?(?:chrono::)?(?:steady_clock|system_clock|high_resolution_clock|utc_clock|file_clock)"
CLOCK_ALIAS = re.compile(r"\busing\s+(\w+)\s*=\s*" + CHRONO_CLOCK + r"\s*;")
TIME_READ = re.compile(r"\b" + CHRONO_CLOCK + r"::now\s*\(|\bclock_gettime\s*\(|\bgettimeofday\s*\(|"
                       r"\btime\s*\(\s*(?:nullptr|NULL|0)\s*\)|\babsl::Now\s*\(|\bgpr_now\s*\(")
# A library's own clock where its API needs an absolute deadline on that clock: (file, the exact read allowed there).
TIME_READ_ALLOWED = {("src/replication/channel.cc", "gpr_now(GPR_CLOCK_MONOTONIC)")}  # GrpcDeadline: gRPC's clock
# CMake targets that are not named vigil_<module>.
TARGET_MODULE = {"vigil": "cli", "vigil-engine": "cli"}
# vigil_cuda holds the device code of several modules (infer/cuda, detect/cuda, transport/cuda,
# aggregator/cuda: nvcc compiles it apart) and may link only what every one of them may.
DEVICE_CODE_TARGET = "vigil_cuda"


CONDITIONAL = re.compile(r"\(only with ([A-Z][A-Z0-9_]*):([^)]*)\)")


def read_table(doc: Path) -> tuple[dict[str, set[str]], dict[str, dict[str, str]]]:
    """The rows, and per module its dependencies that hold only with a CMake option: {module: {dep: option}}."""
    text = doc.read_text(encoding="utf-8")
    if HEADING not in text:
        raise ValueError(f"{doc}: no heading '{HEADING}'")
    rows: dict[str, set[str]] = {}
    conditional: dict[str, dict[str, str]] = {}
    in_table = False
    for line in text[text.index(HEADING):].splitlines()[1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("module", "") or set(cells[0]) <= set("-: "):
            in_table = True
            continue
        in_table = True
        name = cells[0].strip("`")
        rows[name] = set(re.findall(r"`([a-z_]+)`", cells[1]))
        for option, names in CONDITIONAL.findall(cells[1]):
            for dep in re.findall(r"`([a-z_]+)`", names):
                conditional.setdefault(name, {})[dep] = option
    if not rows:
        raise ValueError(f"{doc}: the table under '{HEADING}' has no rows")
    for m, deps in rows.items():
        unknown = deps - set(rows)
        if unknown:
            raise ValueError(f"{doc}: module '{m}' depends on {sorted(unknown)}, which the table does not list")
    return rows, conditional


def cmake_options(build: Path) -> dict[str, bool]:
    """The VIGIL_WITH_* options CMake was configured with (DIR/CMakeCache.txt), ON or OFF (AUTO: left out)."""
    cache = build / "CMakeCache.txt"
    options: dict[str, bool] = {}
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            m = re.match(r"^(VIGIL_WITH_[A-Z0-9_]+):[A-Z]+=(.*)$", line)
            value = m.group(2).strip().upper() if m else ""
            if value in ("ON", "TRUE", "YES", "Y", "1"):
                options[m.group(1)] = True
            elif value in ("OFF", "FALSE", "NO", "N", "0"):
                options[m.group(1)] = False
    return options


def module_of(rel: str, modules: set[str]) -> str | None:
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2 and parts[1] in modules:
        return parts[1]
    if parts[:2] == ["include", "vigil"] and len(parts) > 3 and parts[2] in modules:
        return parts[2]
    return None


def cycles(table: dict[str, set[str]]) -> list[str]:
    found, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(table[m]):
            if state.get(d) == 1:
                found.append(" -> ".join(path[path.index(d):] + [d]) if d in path else f"{m} -> {d}")
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(table):
        if m not in state:
            visit(m, [m])
    return found


def check_includes(root: Path, table: dict[str, set[str]]) -> list[str]:
    modules = set(table)
    problems = []
    files = []
    for top in ("src", "include", "tests", "bench", "fuzz", "tools"):
        d = root / top
        if d.is_dir():
            files += [p for p in d.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()]
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        own = module_of(rel, modules)
        white = set().union(*[mods for prefix, mods in WHITE_BOX.items() if rel.startswith(prefix)])
        test_of = rel.split("/")[1] if rel.startswith("tests/") and rel.count("/") >= 2 else None
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            parts = inc.split("/")
            where = f"{rel}:{n}: #include \"{inc}\""
            if parts[0] == "vigil" and len(parts) > 2 and parts[1] in modules:
                target = parts[1]
                if not (root / "include" / inc).is_file():
                    problems.append(f"{where}: no such public header include/{inc}")
                elif own is not None and target != own and target not in table[own]:
                    problems.append(f"{where}: module '{own}' uses '{target}', which its row in docs/architecture.md "
                                    f"does not list (depends on: {', '.join(sorted(table[own])) or 'nothing'})")
                continue
            if parts[0] in modules and len(parts) > 1 and (root / "src" / inc).is_file():
                target = parts[0]
                if target != own and target != test_of and target not in white:
                    by = f"module '{own}'" if own else rel.split("/")[0] + "/"
                    problems.append(f"{where}: {by} reaches into module '{target}''s internals (src/{inc}); "
                                    f"use a public header in include/vigil/{target}/")
                continue
            if rel.startswith(("src/", "include/")) and (root / "tests" / inc).is_file():
                problems.append(f"{where}: product code includes test code (tests/{inc}); the product links no test code")
                continue
            if (path.parent / inc).is_file():
                continue  # beside the including file (a module's own internal header, a test's helper)
            if parts[0] in modules or parts[0] == "vigil":
                problems.append(f"{where}: no such header (looked in include/, src/ and beside the file)")
    return problems


def check_time_reads(root: Path) -> list[str]:
    problems = []
    for top in ("src", "include"):
        d = root / top
        if not d.is_dir():
            continue
        for path in sorted(p for p in d.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
            rel = path.relative_to(root).as_posix()
            if rel in TIME_SEAM:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            aliases = CLOCK_ALIAS.findall(text)
            alias_read = re.compile(r"\b(?:" + "|".join(map(re.escape, aliases)) + r")::now\s*\(") if aliases else None
            for n, line in enumerate(text.splitlines(), 1):
                code = line.split("//", 1)[0]
                for f, read in TIME_READ_ALLOWED:
                    if rel == f:
                        code = code.replace(read, "")
                if TIME_READ.search(code) or (alias_read and alias_read.search(code)):
                    problems.append(f"{rel}:{n}: reads real time outside the Clock seam ({line.strip()}); decide with "
                                    f"a Clock* (vigil/common/clock.h), bound a blocking wait with a vigil::Deadline "
                                    f"(vigil/common/deadline.h)")
    return problems


def check_links(build: Path, table: dict[str, set[str]],
                conditional: dict[str, dict[str, str]] | None = None) -> list[str]:
    links_file = build / "module_links.txt"
    if not links_file.is_file():
        return [f"{links_file}: missing (configure the build: src/CMakeLists.txt writes it)"]
    problems = []
    linked: dict[str, set[str]] = {}
    for line in links_file.read_text().splitlines():
        if not line.strip():
            continue
        target, _, deps = line.partition(":")
        target = target.strip()
        dep_mods = {d[len("vigil_"):] for d in deps.split() if d.startswith("vigil_") and d != DEVICE_CODE_TARGET}
        if target == DEVICE_CODE_TARGET:
            extra = dep_mods - {"common"}
            if extra:
                problems.append(f"{links_file}: {target} (device code) links {sorted(extra)}; it may link common only")
            continue
        mod = TARGET_MODULE.get(target, target[len("vigil_"):] if target.startswith("vigil_") else target)
        if mod not in table:
            problems.append(f"{links_file}: target {target} is module '{mod}', which docs/architecture.md does not list")
            continue
        extra = dep_mods - table[mod] - {mod}
        for d in sorted(extra):
            problems.append(f"{links_file}: {target} links vigil_{d}, which module '{mod}''s row in "
                            f"docs/architecture.md does not list")
        linked.setdefault(mod, set()).update(dep_mods)

    def closure(m: str, seen: set[str]) -> set[str]:
        for d in linked.get(m, set()):
            if d not in seen:
                seen.add(d)
                closure(d, seen)
        return seen

    options = cmake_options(build)
    for mod in sorted(linked):
        reached = closure(mod, set())
        required = set(table[mod])
        for d, option in sorted((conditional or {}).get(mod, {}).items()):
            if options.get(option) is None:  # the cache does not say: either way
                required.discard(d)
            elif not options[option]:
                required.discard(d)
                if d in reached:
                    problems.append(f"{links_file}: module '{mod}' links '{d}' (directly or through another), which "
                                    f"its row in docs/architecture.md allows only with {option}, OFF in this build")
        for d in sorted(required - reached):
            problems.append(f"{links_file}: module '{mod}' declares '{d}' in docs/architecture.md but its target "
                            f"does not link it (directly or through another)")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--build", type=Path, help="a configured build directory: check CMake's link dependencies too")
    args = ap.parse_args(argv)
    try:
        table, conditional = read_table(args.root / "docs" / "architecture.md")
    except (OSError, ValueError) as e:
        print(f"check_borders: {e}", file=sys.stderr)
        return 2
    problems = [f"docs/architecture.md: the module graph has a cycle: {c}" for c in cycles(table)]
    problems += check_includes(args.root, table)
    problems += check_time_reads(args.root)
    if args.build:
        problems += check_links(args.build, table, conditional)
    for p in problems:
        print(p)
    print(f"check_borders: {len(table)} modules, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
