#!/usr/bin/env bash
# Nothing lost: `synth` and `replay --write-output` killed by SIGKILL mid-write leave
# no partial file under the target name (a target that existed before keeps its bytes), and
# the inputs are unchanged (sha256 before / after). What a SIGKILL can leave is the temporary
# "<target>.tmp-<pid>-<random>" (no handler runs): documented in docs/robustness.md, and checked to be
# the only leftover.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_PYTHON.
set -u
: "${DYNEMB:?}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
sha() { sha256sum "$1" | cut -d' ' -f1; }

# kill_mid NAME TARGET ARGS...: starts the tool, waits until its temp file has grown past
# 64 KiB (so it is really mid-write), SIGKILLs it, then checks TARGET.
kill_mid() {
  local name=$1 target=$2
  shift 2
  local before=""
  [[ -e "$target" ]] && before=$(sha "$target")
  "$DYNEMB" "$@" >"$tmp/$name.out" 2>&1 &
  local pid=$! waited=0 size=0 tf=""
  while ((waited < 600)); do
    tf=$(temp_of "$target" "$pid")
    size=$( [[ -n "$tf" ]] && stat -c %s "$tf" 2>/dev/null || echo 0)
    ((size > 65536)) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
    waited=$((waited + 1))
  done
  if ! kill -KILL "$pid" 2>/dev/null; then
    fail "$name: finished before it could be killed (temp size $size): make the job larger"
    wait "$pid"
    return
  fi
  wait "$pid" 2>/dev/null
  echo "$name: killed pid $pid with $size bytes in $tf"
  if [[ -n "$before" ]]; then
    [[ "$(sha "$target")" == "$before" ]] || fail "$name: the existing $target was changed"
  else
    [[ ! -e "$target" ]] || fail "$name: a partial file exists under the target name $target"
  fi
  # The only leftover is the temp of the killed process.
  local left
  left=$(cd "$(dirname "$target")" && ls -1 | grep -F "$(basename "$target")." | grep -v "^$(basename "$target")\.tmp-$pid-" || true)
  [[ -z "$left" ]] || fail "$name: unexpected leftovers: $left"
  rm -f "$target".tmp-"$pid"-*
}

# Input: a capture big enough that both jobs take a few seconds.
"$DYNEMB" synth --preset unit-seq-w8 --batches 6 --seed 1 -o "$tmp/in.h5" >/dev/null || fail "synth input"
in_sha=$(sha "$tmp/in.h5")
plan_sha=$(sha "$DYNEMB_SRC/plans/unit-seq-w8.yaml")

kill_mid synth_new "$tmp/out.h5" synth --preset unit-seq-w8 --batches 400 --seed 2 -o "$tmp/out.h5"
kill_mid synth_plan "$tmp/outp.h5" synth "$DYNEMB_SRC/plans/unit-seq-w8.yaml" --batches 400 --seed 2 -o "$tmp/outp.h5"
[[ "$(sha "$DYNEMB_SRC/plans/unit-seq-w8.yaml")" == "$plan_sha" ]] || fail "synth changed its plan"
# An existing target survives a killed overwrite byte for byte.
cp "$tmp/in.h5" "$tmp/keep.h5"
kill_mid synth_over "$tmp/keep.h5" synth --preset unit-seq-w8 --batches 400 --seed 3 -o "$tmp/keep.h5" --force

kill_mid replay_new "$tmp/blessed.h5" replay "$tmp/in.h5" --quiet --write-output "$tmp/blessed.h5"
[[ "$(sha "$tmp/in.h5")" == "$in_sha" ]] || fail "replay --write-output changed its input"
cp "$tmp/in.h5" "$tmp/keep2.h5"
kill_mid replay_over "$tmp/keep2.h5" replay "$tmp/in.h5" --quiet --write-output "$tmp/keep2.h5"
[[ "$(sha "$tmp/in.h5")" == "$in_sha" ]] || fail "replay --write-output changed its input"

# Completed runs do rename: the target exists, no temp is left, the input is unchanged.
"$DYNEMB" replay "$tmp/in.h5" --quiet --write-output "$tmp/done.h5" >/dev/null || fail "replay --write-output"
[[ -s "$tmp/done.h5" ]] || fail "no output after a complete replay --write-output"
ls "$tmp" | grep -q 'done\.h5\.tmp-' && fail "a complete replay --write-output left its temp"
[[ "$(sha "$tmp/in.h5")" == "$in_sha" ]] || fail "replay --write-output changed its input"
# Writing onto the input itself must not destroy it.
"$DYNEMB" replay "$tmp/in.h5" --quiet --write-output "$tmp/in.h5" >"$tmp/self.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "replay --write-output onto its own input: exit $rc, want 2"
[[ "$(sha "$tmp/in.h5")" == "$in_sha" ]] || fail "replay --write-output onto its own input changed it"
"$DYNEMB" replay "$tmp/in.h5" --quiet >/dev/null || fail "the input is no longer a valid capture after --write-output onto itself"

[[ $fails -eq 0 ]] && echo "nothing lost" || echo "$fails failures"
[[ $fails -eq 0 ]]
