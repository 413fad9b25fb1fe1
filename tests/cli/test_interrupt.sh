#!/usr/bin/env bash
# SIGINT (Ctrl-C) and SIGTERM during synth, replay --write-output / --json and merge
# (docs/robustness.md "Nothing lost"): the temporary "<target>.tmp-<pid>-<random>" is removed, the exit
# status is 130 / 143 (an exit, not a death by signal: the shell would also say 130/143 for
# that, so the test also requires the tool's own line), the target is absent or unchanged, the
# inputs are unchanged. (SIGKILL, which no handler sees: tests/cli/test_nothing_lost.sh.)
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...
cd "$tmp" || exit 1
# Job control: a background job of a script otherwise starts with SIGINT ignored, and the tool
# (rightly) leaves an ignored signal ignored.
set -m

# interrupt NAME SIGNAL WANT_RC TARGET ARGS...: starts the tool, waits until TARGET's temporary
# has grown past 64 KiB (really mid-write), sends SIGNAL, checks the rest.
interrupt() {
  local name=$1 sig=$2 want=$3 target=$4
  shift 4
  local before=""
  [[ -e "$target" ]] && before=$(sha "$target")
  "$DYNEMB" "$@" >"$name.out" 2>&1 &
  local pid=$! waited=0 size=0 tf=""
  while ((waited < 600)); do
    tf=$(temp_of "$target" "$pid")
    size=$( [[ -n "$tf" ]] && stat -c %s "$tf" 2>/dev/null || echo 0)
    ((size > 65536)) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
    waited=$((waited + 1))
  done
  if ! kill -s "$sig" "$pid" 2>/dev/null; then
    fail "$name: finished before the signal (temporary size $size): make the job larger"
    wait "$pid"
    return
  fi
  wait "$pid"
  local rc=$?
  echo "$name: SIG$sig with $size bytes in $tf: exit $rc"
  [[ $rc -eq $want ]] || fail "$name: exit $rc, want $want"
  if [[ "$sig" == INT ]]; then
    has_text "$name.out" "dynemb-dist: interrupted (SIGINT); temporary files removed" "$name"
  elif [[ "$sig" == TERM ]]; then
    has_text "$name.out" "dynemb-dist: terminated (SIGTERM); temporary files removed" "$name"
  else
    has_text "$name.out" "dynemb-dist: stopped by SIG$sig; temporary files removed" "$name"
  fi
  [[ -z "$(temp_of "$target" "$pid")" ]] || fail "$name: the temporary $tf was left"
  if [[ -n "$before" ]]; then
    [[ "$(sha "$target")" == "$before" ]] || fail "$name: the existing $target was changed"
  else
    [[ ! -e "$target" ]] || fail "$name: $target exists after the interrupt"
  fi
  no_temps "$tmp" "$name"
}

"$DYNEMB" synth --preset unit-seq-w8 --batches 6 --seed 1 -o in.h5 >/dev/null || fail "synth in.h5"
in_sha=$(sha in.h5)
plan_sha=$(sha "$DYNEMB_SRC/plans/unit-seq-w8.yaml")

interrupt synth_int INT 130 out.h5 synth --preset unit-seq-w8 --batches 400 --seed 2 -o out.h5
interrupt synth_term TERM 143 out.h5 synth "$DYNEMB_SRC/plans/unit-seq-w8.yaml" --batches 400 -o out.h5
[[ "$(sha "$DYNEMB_SRC/plans/unit-seq-w8.yaml")" == "$plan_sha" ]] || fail "synth changed its plan"
cp in.h5 keep.h5
interrupt synth_over_term TERM 143 keep.h5 synth --preset unit-seq-w8 --batches 400 -o keep.h5 --force

interrupt replay_int INT 130 w.h5 replay in.h5 --quiet --write-output w.h5 --json r.json --junit r.xml
[[ ! -e r.json && ! -e r.xml ]] || fail "replay_int: a report was written although the run was interrupted"
cp in.h5 keep2.h5
interrupt replay_term TERM 143 keep2.h5 replay in.h5 --quiet --write-output keep2.h5 --json r.json
[[ "$(sha in.h5)" == "$in_sha" ]] || fail "replay changed its input"

# Every other signal that ends a process: the same clean end, exit 128 + N.
for sig_rc in HUP:129 USR1:138 USR2:140 ALRM:142 XCPU:152 VTALRM:154; do
  sig=${sig_rc%%:*} rc=${sig_rc##*:}
  interrupt "synth_$sig" "$sig" "$rc" out.h5 synth --preset unit-seq-w8 --batches 400 --seed 2 -o out.h5
  interrupt "replay_$sig" "$sig" "$rc" w.h5 replay in.h5 --quiet --write-output w.h5 --json r.json
  [[ ! -e r.json ]] || fail "replay_$sig: a report was written although the run was stopped"
done
# SIGPIPE is not an end: the run goes on and completes (a closed stdout is a write error).
"$DYNEMB" synth --preset unit-seq-w8 --batches 100 --seed 2 -o piped.h5 >piped.out 2>&1 &
pid=$!
while [[ -z "$(temp_of "$tmp/piped.h5" "$pid")" ]] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
kill -s PIPE "$pid" 2>/dev/null
wait "$pid"
rc=$?
[[ $rc -eq 0 && -s piped.h5 ]] || fail "synth with a SIGPIPE: exit $rc, want 0 and the capture"
no_temps "$tmp" "synth_PIPE"

# merge: per-rank files of a capture with many small batches (thousands of copies: ~2 s)
"$DYNEMB" synth --preset unit-seq-w2 --batches 3000 --store none --seed 1 -o many.h5 >/dev/null ||
  fail "synth many.h5"
split_ranks many.h5 rank || fail "split many.h5 into per-rank files"
ranks_sha=$(cat rank0.h5 rank1.h5 | sha256sum)
interrupt merge_int INT 130 merged.h5 merge rank0.h5 rank1.h5 -o merged.h5
cp in.h5 keep3.h5
interrupt merge_term TERM 143 keep3.h5 merge rank0.h5 rank1.h5 -o keep3.h5 --force
[[ "$(cat rank0.h5 rank1.h5 | sha256sum)" == "$ranks_sha" ]] || fail "merge changed a per-rank file"

[[ $fails -eq 0 ]] && echo "interrupts: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
