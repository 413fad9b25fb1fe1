#!/usr/bin/env bash
# compute-sanitizer (memcheck, then racecheck) over whole `replay --backend cuda` commands: a
# pooled and a sequence capture of two batches each, run one destination at a time, so that the
# unit rows are lent to the GPU, the second batch is bucketized on it and the lookups' rows are
# resolved on it. Prints each run's sanitizer summary and the replay's verdict; exits 1 when a
# sanitizer reports an error or a replay does not pass. GPU machine.
#   [DYNEMB=build/dynemb-dist] [TOOLS="memcheck racecheck"] [SAN_T=300] bench/sanitize_replay.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exe=${DYNEMB:-$here/../build/dynemb-dist}
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[[ -x $exe ]] || { echo "sanitize_replay: no dynemb-dist at $exe (set DYNEMB)" >&2; exit 2; }
[[ -x $cs ]] || { echo "sanitize_replay: no compute-sanitizer" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$exe" synth --preset unit-pooled-w8 --batch-size 4096 --batches 2 -o "$dir/pooled.h5" >/dev/null || exit 2
"$exe" synth --preset unit-seq-w8 --batch-size 256 --hotness 0..64 --batches 2 \
  -o "$dir/seq.h5" >/dev/null || exit 2
bad=0
for tool in ${TOOLS:-memcheck racecheck}; do
  for cap in pooled seq; do
    log=$dir/$tool-$cap.log
    timeout "${SAN_T:-300}" "$cs" --tool "$tool" --error-exitcode 42 --print-limit 20 \
      "$exe" replay "$dir/$cap.h5" --backend cuda >"$log" 2>&1
    rc=$?
    summary=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log")
    verdict=$(grep -m1 '^# result:' "$log")
    echo "$tool $cap: rc=$rc ${summary#========= } ${verdict#\# }"
    [[ $rc -eq 0 ]] || { bad=1; tail -20 "$log"; }
  done
done
exit $bad
