#!/usr/bin/env bash
# The lock check (issue 41; STYLE.md rule 7): parses every C++ source of the product (src/**/*.cc, with the public
# headers they include) with clang -fsyntax-only -Wthread-safety -Werror=thread-safety, using each file's flags
# from the GCC build's compile_commands.json. A field declared VIGIL_GUARDED_BY(mu) read or written without mu
# held, a VIGIL_REQUIRES function called without its lock, a lock not released: a build error here.
# (nvcc's .cu files are not parsed: device code takes no host locks.)
# Usage: scripts/thread-safety.sh [BUILD_DIR] [FILE...]   (default: build, every product source)
# Needs clang and libomp-dev (scripts/deps.sh test installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${VIGIL_BUILD_DIR:-build}}
shift || true
exec python3 - "$build" "$PWD" "$@" <<'PY'
import concurrent.futures, json, os, shlex, subprocess, sys
build, root, only = sys.argv[1], sys.argv[2], sys.argv[3:]
db_path = os.path.join(build, "compile_commands.json")
if not os.path.isfile(db_path):
    sys.exit(f"thread-safety: {db_path} missing: configure the build first (scripts/build.sh)")
entries = {}
for e in json.load(open(db_path)):
    f = os.path.realpath(os.path.join(e["directory"], e["file"]))
    if f.endswith(".cc") and f.startswith(os.path.join(root, "src") + os.sep) and "/_deps/" not in f:
        entries.setdefault(f, e)  # one flag set per file (a source in two targets is parsed once)
if only:
    wanted = {os.path.realpath(f) for f in only}
    missing = wanted - set(entries)
    if missing:
        sys.exit(f"thread-safety: not product sources in {db_path}: {sorted(missing)}")
    entries = {f: e for f, e in entries.items() if f in wanted}

def command(e):
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    while args and not args[0].startswith("-") and not args[0].endswith(("++", "c++", "g++", "cc", "gcc")):
        args = args[1:]  # a launcher (ccache)
    args = args[1:]  # the compiler
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a == e["file"] or a.startswith("-W"):
            continue  # GCC's warning set is GCC's; this parse checks locks alone
        out.append(a)
    return ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option",
            "-Wno-unused-command-line-argument"] + out + [e["file"]]

def check(item):
    f, e = item
    r = subprocess.run(command(e), cwd=e["directory"], capture_output=True, text=True)
    return f, r.returncode, r.stderr

failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for f, rc, err in pool.map(check, sorted(entries.items())):
        if rc != 0:
            failed += 1
            print(f"thread-safety: {os.path.relpath(f, root)}: FAILED\n{err.rstrip()}")
print(f"thread-safety: {len(entries) - failed} passed, {failed} failed (clang -Wthread-safety over {len(entries)} sources)")
sys.exit(1 if failed else 0)
PY
