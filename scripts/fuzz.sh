#!/usr/bin/env bash
# Fuzzes the report protocol's decoders with libFuzzer (fuzz/protocol_fuzz.cc), built with clang,
# ASan and UBSan into build-fuzz/ (or $VIGIL_FUZZ_BUILD_DIR), apart from the gcc build.
#   scripts/fuzz.sh [run [SECONDS]]  fuzzes for SECONDS (default 60) from a copy of fuzz/corpus/protocol;
#                                    new inputs go to build-fuzz/fuzz/run/corpus, never into the repository.
#                                    Exits non-zero on a crash, timeout, leak or OOM, naming the input.
#   scripts/fuzz.sh corpus           regenerates fuzz/corpus/protocol (fuzz/make_corpus.cc; files named by
#                                    the SHA-1 of their content, so a rerun without protocol changes is a no-op)
# VIGIL_FUZZ_SEED sets libFuzzer's -seed (default: a random one, printed so a run can be repeated).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
secs=${2:-60}
build=${VIGIL_FUZZ_BUILD_DIR:-build-fuzz}
seeds=fuzz/corpus/protocol
usage() { echo "usage: scripts/fuzz.sh [run [SECONDS] | corpus]" >&2; exit 2; }
[[ $mode == run || $mode == corpus ]] || usage
[[ $secs =~ ^[0-9]+$ ]] && ((secs > 0)) || usage  # libFuzzer reads -max_total_time=0 as "no limit"

scripts/deps.sh fuzz
# Only the protocol code is compiled (fuzz/CMakeLists.txt): seconds, not the whole project.
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVIGIL_FUZZ=ON >/dev/null
cmake --build "$build" -j "$(nproc)"

if [[ $mode == corpus ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$build/fuzz/vigil_protocol_corpus" "$tmp"
  mkdir -p "$seeds"
  rm -f "$seeds"/*
  for f in "$tmp"/*; do
    sum=$(sha1sum "$f")
    cp "$f" "$seeds/${sum%% *}"
  done
  echo "fuzz.sh: $(find "$seeds" -type f | wc -l) seeds, $(cat "$seeds"/* | wc -c) bytes in $seeds"
  exit 0
fi

# -max_len=70000: the largest single field (a str: 2 + 65535 bytes) fits in one frame with its header and the
# other fields, and mutation, CRC and decoding cost grow with input length, so smaller is faster. Frames up
# to kMaxBodyBytes (1 MiB) are legal, but the decoder's limits (body_length, detection, class and stream
# counts) are checked on the header and count fields, before the bytes, and stay reachable; the one branch
# only a large body reaches, ValidateHello's Welcome-size rule (a Hello of ≥ ~505 KB), is unit-tested
# (tests/transport/protocol_test.cc, ValidateHelloRules).
run=$build/fuzz/run
rm -rf "$run"
mkdir -p "$run/corpus" "$build/fuzz/artifacts"
cp "$seeds"/* "$run/corpus/"
seed=${VIGIL_FUZZ_SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
echo "fuzz.sh: vigil_protocol_fuzz for ${secs} s, seed $seed (VIGIL_FUZZ_SEED=$seed to repeat)," \
  "$(find "$seeds" -type f | wc -l) seeds from $seeds, scratch corpus $run/corpus, log $run/log"
rc=0
"$build/fuzz/vigil_protocol_fuzz" -seed="$seed" -max_total_time="$secs" -max_len=70000 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/fuzz/artifacts/" "$run/corpus" \
  >"$run/log" 2>&1 || rc=$?

final_stat() { sed -n "s/^stat::$1: *//p" "$run/log"; }
if ((rc != 0)); then
  tail -n 80 "$run/log"
  echo "fuzz.sh: FAILED (exit $rc), seed $seed; full log $run/log" >&2
  { grep -o "Test unit written to .*" "$run/log" || true; } | while read -r _ _ _ _ input; do
    echo "fuzz.sh: input that failed: $input (reproduce: $build/fuzz/vigil_protocol_fuzz $input)" >&2
    if (($(stat -c %s "$input") <= 4096)); then echo "fuzz.sh: its base64: $(base64 -w0 "$input")" >&2; fi
  done
  exit 1
fi
grep -E '^INFO: seed corpus|^#[0-9]+[[:space:]]+(INITED|DONE)' "$run/log" || true
done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$run/log" | tail -n 1 || true)
cov=$(sed -E 's/.* cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+)\/([^ ]+).*/\1 edges, \2 features, corpus \3 inputs (\4)/' <<<"$done_line")
echo "fuzz.sh: OK, ${secs} s: $(final_stat number_of_executed_units) inputs, $(final_stat average_exec_per_sec)/s," \
  "coverage $cov, $(final_stat new_units_added) new, peak RSS $(final_stat peak_rss_mb) MB"
