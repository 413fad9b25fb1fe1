#!/usr/bin/env bash
# Hostile files and hostile machines, the smaller cases: text inputs read with a bound (a plan
# that is /dev/zero, /dev/urandom, a FIFO, a huge file), a run that checks nothing (a capture of
# 0 batches), output options given an empty name, DYNEMB_* variables with values that mean
# nothing, synth's numeric options out of their domain. Each is exit 2 with one line naming
# what and where, never an exit by signal, a hang or a wrong "PASS".
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
# hasnt NAME REGEX: no line of $tmp/NAME.out matches (run and has: common.sh).
hasnt() { ! grep -qE -- "$2" "$tmp/$1.out" || { fail "$1: a line matches: $2"; sed 's/^/    /' "$tmp/$1.out" | head -30; }; }

"$DYNEMB" synth --preset unit-seq-w2 --batches 2 --seed 3 -o "$tmp/seq.h5" >/dev/null || fail "synth seq"
"$DYNEMB_PYTHON" -c 'import sys, h5py; open(sys.argv[2], "w").write(h5py.File(sys.argv[1], "r")["plan"][()].decode())' \
  "$tmp/seq.h5" "$tmp/plan.yaml" || fail "extract plan"

# ---- plans read with a bound: stopped at 16 MiB while reading, whatever the file is
too_big="the plan( file)? is larger than 16 MiB; refusing it"
for dev in /dev/zero /dev/urandom; do
  n=$(basename "$dev")
  run "val_$n" 2 validate "$dev"
  has "val_$n" "^dynemb-dist: error: $dev: $too_big"
  run "rep_$n" 2 replay "$tmp/seq.h5" --plan "$dev" --quiet
  has "rep_$n" "error: $dev: $too_big"
  hasnt "rep_$n" "seq\.h5: out of memory"
  run "synth_$n" 2 synth "$dev" -o "$tmp/never.h5"
  has "synth_$n" "$dev: $too_big"
  run "inspect_$n" 2 inspect "$tmp/seq.h5" --plan "$dev"
  has "inspect_$n" "$dev: $too_big"
done
[[ -e "$tmp/never.h5" ]] && fail "synth of /dev/zero wrote a capture"
# A regular file of 17 MiB: refused by its size, before it is read.
{ cat "$tmp/plan.yaml"; head -c $((17 << 20)) /dev/zero | tr '\0' '#'; } >"$tmp/huge.yaml"
run val_huge 2 validate "$tmp/huge.yaml"
has val_huge "huge\.yaml: $too_big"
run val_huge_json 2 validate "$tmp/huge.yaml" --format json
has val_huge_json "huge\.yaml: $too_big"
# A FIFO fed more than the bound (the writer never stops): refused at the bound.
mkfifo "$tmp/fifo.yaml"
(head -c $((64 << 20)) /dev/zero >"$tmp/fifo.yaml" 2>/dev/null &)
run val_fifo 2 validate "$tmp/fifo.yaml"
has val_fifo "fifo\.yaml: $too_big"
# A FIFO nobody writes to: the open timeout, as before.
mkfifo "$tmp/idle.yaml"
DYNEMB_OPEN_TIMEOUT=1 run val_idle 2 validate "$tmp/idle.yaml"
has val_idle "idle\.yaml: cannot read the plan: it is a pipe \(FIFO\) and reading it did not finish in 1 s"
# A plan just under the bound is read (and judged on its text).
{ cat "$tmp/plan.yaml"; head -c $(((16 << 20) - 4096)) /dev/zero | tr '\0' '\n'; } >"$tmp/long.yaml"
run val_long 0 validate "$tmp/long.yaml"
# Out of memory while --plan is parsed (15 MiB of list items, 150 MB of address space)
# is the plan's trouble, named so, not the capture's.
if [[ $asan -eq 0 ]]; then
  { cat "$tmp/plan.yaml"; echo "extra:"; yes "  - abcdefghijkl" | head -n 900000; } >"$tmp/many.yaml"
  # The limit is 150 MB above what the binary needs to start (a CUDA-compiled one maps
  # libcudart and libnccl: several hundred MB of address space before main).
  start_kb=0
  for v in $(seq 50000 50000 4000000); do
    (ulimit -v "$v" && exec "$DYNEMB" --version) >/dev/null 2>&1 && { start_kb=$v; break; }
  done
  (ulimit -v $((start_kb + 150000)) && exec timeout 60 "$DYNEMB" replay "$tmp/seq.h5" \
    --plan "$tmp/many.yaml" --quiet) >"$tmp/rep_many.out" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || fail "rep_many: exit $rc, want 2"
  has rep_many "^dynemb-dist: error: [^ ]*many\.yaml(:[0-9]+:[0-9]+: error: extra: unknown key|: out of memory .* while reading this plan \(--plan\))"
  hasnt rep_many "seq\.h5: out of memory"
fi
# An embedded /plan is bounded by its dataset (and the file): one past 16 MiB is refused too.
cp "$tmp/seq.h5" "$tmp/bigplan.h5"
"$DYNEMB_PYTHON" - "$tmp/bigplan.h5" <<'PY' || fail "make bigplan.h5"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    text = f["plan"][()].decode()
    del f["plan"]
    f["plan"] = (text + "#" * (17 << 20)).encode()
PY
run rep_bigplan 2 replay "$tmp/bigplan.h5" --quiet
has rep_bigplan "bigplan\.h5:/plan:1:1: error: plan is [0-9]+ bytes; plans larger than 16 MiB are refused"
# A FIFO with a whole plan in it is read as before.
mkfifo "$tmp/plan.fifo"
(cat "$tmp/plan.yaml" >"$tmp/plan.fifo" &)
run val_fifo_ok 0 validate "$tmp/plan.fifo"

# ---- a run that checks nothing fails: a capture of 0 batches (a job that captured none)
cp "$tmp/seq.h5" "$tmp/nobatch.h5"
"$DYNEMB_PYTHON" - "$tmp/nobatch.h5" <<'PY' || fail "make nobatch.h5"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    del f["batches"]
    f.create_group("batches")
    f.attrs["num_batches"] = np.int64(0)
PY
run nobatch_rep 2 replay "$tmp/nobatch.h5"
has nobatch_rep "^dynemb-dist: error: .*nobatch\.h5: no batches: the capture holds 0"
has nobatch_rep "^# result: ERROR \(exit 2\): .*; 0 checks ran$"
hasnt nobatch_rep "PASS"
run nobatch_json 2 replay "$tmp/nobatch.h5" --quiet --json "$tmp/nobatch.json"
"$DYNEMB_PYTHON" - "$tmp/nobatch.json" <<'PY' || fail "nobatch.json: summary"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["summary"]
assert s["status"] == "error" and s["exit_code"] == 2 and s["checks"] == 0, s
assert "no batches: the capture holds 0" in j["trouble"], j["trouble"]
PY
# structurally valid, so validate passes it, with a warning that says what replay will do
run nobatch_val 0 validate "$tmp/plan.yaml" --capture "$tmp/nobatch.h5"
has nobatch_val "nobatch\.h5:/batches: warning: no batches: the capture holds 0 .*replay refuses it"
run nobatch_inspect 0 inspect "$tmp/nobatch.h5"
has nobatch_inspect "^# batches +0: the capture holds no batches; replay refuses it \(exit 2\)"
# per-rank files of a job that captured no batch: merge refuses them
for r in 0 1; do
  "$DYNEMB_PYTHON" - "$tmp/nobatch.h5" "$tmp/rank$r.h5" "$r" <<'PY' || fail "make rank$r.h5"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f, h5py.File(sys.argv[2], "w") as g:
    for k, v in f.attrs.items():
        g.attrs[k] = v
    g.attrs["rank"] = int(sys.argv[3])
    f.copy("plan", g)
    f.copy("oracle", g)
    g.create_group("batches")
PY
done
run nobatch_merge 2 merge "$tmp/rank0.h5" "$tmp/rank1.h5" -o "$tmp/merged0.h5"
has nobatch_merge "rank0\.h5.*no batches: the per-rank files hold 0"
[[ -e "$tmp/merged0.h5" ]] && fail "merge of 0-batch rank files wrote $tmp/merged0.h5"
no_temps "$tmp" nobatch_merge
# every check skipped (--plan shards a pooled capture differently, and no /oracle or /tables
# to look its rows up): nothing was checked, exit 2
"$DYNEMB" synth --preset unit-pooled-w8 --batches 2 --batch-size 2 --store local_embs,output \
  -o "$tmp/pool.h5" >/dev/null || fail "synth pool"
"$DYNEMB_PYTHON" - "$tmp/pool.h5" "$tmp/pool.yaml" <<'PY' || fail "strip pool.h5"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    del f["oracle"]
    text = f["plan"][()].decode()
open(sys.argv[2], "w").write(text.replace("dist_type: continuous", "dist_type: roundrobin", 1))
PY
run allskip 2 replay "$tmp/pool.h5" --plan "$tmp/pool.yaml"
has allskip "error: .*pool\.h5: nothing was checked: all 16 checks of the 2 replayed batches were skipped"
has allskip "^# result: ERROR \(exit 2\): .*; 0 checks ran, 16 skipped$"
# the summary line says how many checks ran, on a clean run too
run clean 0 replay "$tmp/seq.h5" --quiet
has clean "^# result: PASS \(exit 0\): .*, 0 errors; 56 checks ran$"

# ---- an option given an empty value is a usage error naming it (it was silently ignored:
# no report written, the embedded plan used, every batch replayed)
empty_value() {  # NAME OPTION ARGS...: exit 2, and the line names OPTION
  local name=$1 opt=$2
  shift 2
  run "$name" 2 "$@"
  has "$name" "^dynemb-dist [a-z]+: error: $opt: the value is empty; give one, or leave the option out$"
}
empty_value empty_json --json replay "$tmp/seq.h5" --quiet --json ""
empty_value empty_junit --junit replay "$tmp/seq.h5" --quiet --junit ""
empty_value empty_write --write-output replay "$tmp/seq.h5" --quiet --write-output ""
empty_value empty_plan --plan replay "$tmp/seq.h5" --quiet --plan ""
empty_value empty_batches --batches replay "$tmp/seq.h5" --quiet --batches ""
empty_value empty_synth_o "-o,--output" synth --preset unit-seq-w2 -o ""
empty_value empty_merge_o "-o,--output" merge "$tmp/seq.h5" -o ""
empty_value empty_bench_json --json bench --preset unit-seq-w2 --backend cpu --json ""
empty_value empty_bench_export --export bench --preset unit-seq-w2 --backend cpu --export ""
empty_value empty_val_capture --capture validate "$tmp/plan.yaml" --capture ""
empty_value empty_inspect_plan --plan inspect "$tmp/seq.h5" --plan ""

# ---- DYNEMB_* variables whose value means nothing: exit 2 naming the variable and the value
# (they were silently ignored, the default taking their place)
bad_env() {  # NAME VAR=VALUE WHY-REGEX ARGS...
  local name=$1 setting=$2 why=$3
  shift 3
  local -x "$setting"  # exported to the tool, for this call only
  run "$name" 2 "$@"
  has "$name" "^dynemb-dist: error: ${setting%%=*}='${setting#*=}': $why"
}
for v in lots 0 -1G nan inf 1e30T 12Q; do
  bad_env "mem_$v" "DYNEMB_MEMORY_LIMIT=$v" "not a size in bytes" replay "$tmp/seq.h5" --quiet
done
for v in -5 x nan inf 1e300 5s; do
  bad_env "timeout_$v" "DYNEMB_OPEN_TIMEOUT=$v" "(not a number of seconds|more than 1e9 seconds)" \
    replay "$tmp/seq.h5" --quiet
done
bad_env timeout_validate DYNEMB_OPEN_TIMEOUT=-5 "not a number of seconds" validate "$tmp/plan.yaml"
# The tests' hooks (common/test_hooks.hpp): judged like the settings above by a build that
# reads them; any other build (a user's) ignores them: the command runs as without them.
hooks=0
has_test_hooks && hooks=1
hook_env() {
  if [[ $hooks -eq 1 ]]; then
    bad_env "$@"
    return
  fi
  local name=$1 setting=$2
  shift 3
  local -x "$setting"
  run "$name" 0 "$@"
  ! grep -q "${setting%%=*}" "$tmp/$name.out" || fail "$name: a build without hooks mentions $setting"
}
hook_env slice_cols DYNEMB_SLICE_COLUMNS=-3 "not a whole number of 1 or more" replay "$tmp/seq.h5" --quiet
hook_env dest_rows DYNEMB_DESTINATION_ROWS=many "not a whole number" replay "$tmp/seq.h5" --quiet
hook_env unit_rows DYNEMB_SYNTH_UNIT_ROWS=0 "not a whole number" synth --preset unit-seq-w2 -o "$tmp/u.h5" --force
hook_env by_dest DYNEMB_BY_DESTINATION=of "want 'off' or 'report'" replay "$tmp/seq.h5" --quiet
hook_env hold DYNEMB_HOLD_OUTPUTS=gpu "want 'host'" replay "$tmp/seq.h5" --quiet --backend cpu
hook_env serial DYNEMB_H5_SERIAL_WRITE=yes "want '0' or '1'" synth --preset unit-seq-w2 -o "$tmp/u.h5" --force
hook_env no_space DYNEMB_MERGE_NO_SPACE_CHECK=yes "want '0' or '1'" validate "$tmp/plan.yaml"
# good values still work
DYNEMB_MEMORY_LIMIT=1.5G DYNEMB_OPEN_TIMEOUT=0.5 run good_env 0 replay "$tmp/seq.h5" --quiet
# --max-memory's sizes are read the same way: nan and inf are no size
run maxmem_nan 2 replay "$tmp/seq.h5" --quiet --max-memory nan
has maxmem_nan "--max-memory 'nan': not a size"
run maxmem_inf 2 replay "$tmp/seq.h5" --quiet --max-memory inf
has maxmem_inf "--max-memory 'inf': not a size"

# ---- synth's numeric options out of their domain: usage errors (zipf:nan put every id on
# rank 0 and wrote the capture)
for a in nan inf -inf -1 0 1e9; do
  run "ids_zipf_$a" 2 synth --preset unit-seq-w2 -o "$tmp/z.h5" --force --ids "zipf:$a"
  has "ids_zipf_$a" "^dynemb-dist: error: --ids zipf:.*: want 0 < ALPHA <= 100$"
  run "hot_zipf_$a" 2 synth --preset unit-seq-w2 -o "$tmp/z.h5" --force --hotness "zipf:$a:8"
  has "hot_zipf_$a" "--hotness entry 'zipf:$a:8': want 0 < ALPHA <= 100 and MAX >= 1"
done
[[ -e "$tmp/z.h5" ]] && fail "synth wrote a capture with a Zipf exponent out of its domain"
run ids_zipf_ok 0 synth --preset unit-seq-w2 -o "$tmp/z.h5" --ids zipf:1.2 --hotness zipf:1.5:8

# ---- replay's memory does not grow with the batches: a capture of 4,000 tiny batches peaks
# where one of 1,000 does (each pass was kept whole for the report, ~17 KB a batch at W = 2;
# now counted, and kept compactly only for --json / --junit, which list every check). Peak
# RSS from wait4; not under ASan, whose RSS is its shadow memory and quarantine.
if [[ $asan -eq 1 ]]; then
  echo "skipped: peak RSS under ASan (shadow memory and quarantine, not the tool's)"
else
  for n in 1000 4000; do
    "$DYNEMB" synth --preset unit-seq-w2 --batches $n --batch-size 1 --hotness 1 \
      -o "$tmp/tiny$n.h5" >/dev/null || fail "synth tiny$n"
  done
  "$DYNEMB_PYTHON" - "$DYNEMB" "$tmp/tiny1000.h5" "$tmp/tiny4000.h5" <<'PY' || fail "replay RSS grows with the batches"
import os, subprocess, sys
def run(capture, *more):
    p = subprocess.Popen([sys.argv[1], "replay", capture, "--backend", "cpu", "--quiet", *more],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    assert rc == 0, f"{capture}: exit {rc}: {out[-400:]}"
    return out, ru.ru_maxrss / 1024.0
small, big = run(sys.argv[2]), run(sys.argv[3])
assert "; 28000 checks ran" in small[0] and "; 112000 checks ran" in big[0], (small[0][-200:], big[0][-200:])
grow = big[1] - small[1]
print(f"peak RSS: 1000 batches {small[1]:.1f} MiB, 4000 batches {big[1]:.1f} MiB, growth {grow:.1f} MiB")
assert grow < 8, f"peak RSS grew by {grow:.1f} MiB from 1000 to 4000 batches (want < 8 MiB)"
# With --json and --junit every pass is listed: kept as a 72-byte record, and the reports
# written as they are made (no JSON tree of every check): about 3 MiB a 1,000 batches here
# (it was over 150 MiB).
out = os.path.dirname(sys.argv[2])
listed = run(sys.argv[3], "--json", f"{out}/t.json", "--junit", f"{out}/t.xml")
grow = listed[1] - small[1]
print(f"peak RSS: 4000 batches with --json and --junit {listed[1]:.1f} MiB, growth {grow:.1f} MiB")
assert grow < 32, f"--json/--junit: peak RSS grew by {grow:.1f} MiB (want < 32 MiB)"
PY
fi

# ---- bench --export without CUDA: the arrays it writes are the CUDA stages' (for
# bench/peer_torch.py); on the CPU backend it wrote nothing and exited 0. Now exit 2 with the
# reason, and no directory left behind.
run export_cpu 2 bench --preset unit-seq-w2 --backend cpu --iters 1 --export "$tmp/exp"
has export_cpu "^dynemb-dist: error: bench --export .*exp: it writes the CUDA stages' index data for bench/peer_torch.py, and the backend here is cpu"
[[ -e "$tmp/exp" ]] && fail "export_cpu: $tmp/exp was left behind"

[[ $fails -eq 0 ]]
