#!/usr/bin/env bash
# Outputs on a hostile machine (docs/robustness.md "Nothing lost"): a name planted where a
# temporary would go, an input named like a temporary, files that appear at the target while
# it is written, concurrent writers, read-only outputs, names at the file system's limit,
# signals at any moment (early, mid-run, during and after the commit) and a closed stdout.
# Each: no file but the named outputs touched, no temporary left, a truthful exit status.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_PYTHON:=python3}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...
cd "$tmp" || exit 1
set -m  # background jobs keep SIGINT (a script's background job starts with it ignored)
export DYNEMB

"$DYNEMB" synth --preset unit-seq-w2 --batches 3 --seed 1 -o c.h5 >/dev/null || fail "synth c.h5"
c_sha=$(sha c.h5)

before=$fails
# --- a symbolic link planted at the name a temporary had (predictable from the pid) --------
echo precious >victim
sh -c 'for t in out.json out.xml blessed.h5; do ln -s victim "$t.tmp-$$"; done
       exec "$DYNEMB" replay c.h5 --quiet --json out.json --junit out.xml --write-output blessed.h5' \
  >planted.out 2>&1
rc=$?
expect_rc planted 0 $rc
[[ "$(cat victim)" == precious ]] || fail "planted: the victim behind a planted link was written"
"$DYNEMB_PYTHON" -c 'import json,sys; json.load(open("out.json"))' || fail "planted: out.json"
[[ -s blessed.h5 ]] || fail "planted: no blessed.h5"
for t in out.json out.xml blessed.h5; do
  [[ -z "$(find . -maxdepth 1 -name "$t.tmp-*" -newer victim ! -type l)" ]] ||
    fail "planted: a temporary of $t was left"
done
find . -maxdepth 1 -name '*.tmp-*' -type l -delete
((fails == before)) && ok "a link planted at a temporary's old name is neither followed nor removed"
before=$fails

# --- an input named as its output's temporary would have been -------------------------------
sh -c 'cp c.h5 "golden.h5.tmp-$$"; exec "$DYNEMB" replay "golden.h5.tmp-$$" --quiet --write-output golden.h5' \
  >selfname.out 2>&1
rc=$?
expect_rc selfname 0 $rc
in=$(ls golden.h5.tmp-* 2>/dev/null | head -1)
[[ -n "$in" && "$(sha "$in")" == "$c_sha" ]] || fail "selfname: the input golden.h5.tmp-PID was changed"
[[ -s golden.h5 ]] || fail "selfname: golden.h5 not written"
rm -f golden.h5.tmp-*
((fails == before)) && ok "an input named like the temporary is read, not overwritten"

# --- a file that appears at the target while synth writes (no --force) ----------------------
"$DYNEMB" synth --preset unit-seq-w2 --batches 200 --seed 2 -o appear.h5 >appear.out 2>&1 &
pid=$!
while [[ -z "$(temp_of "$tmp/appear.h5" "$pid")" ]] && kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
echo mine >appear.h5
wait "$pid"
rc=$?
expect_rc appear 2 $rc
[[ "$(cat appear.h5)" == mine ]] || fail "appear: the file made meanwhile was replaced without --force"
has_text appear.out "appear.h5 appeared while it was being written and was kept (use --force to replace it)" appear
no_temps "$tmp" appear

# --- four synths to one new path at once: one writes it, the others say why not -------------
for i in 1 2 3 4; do
  "$DYNEMB" synth --preset unit-seq-w2 --batches 40 --seed "$i" -o race.h5 >"race$i.out" 2>&1 &
  eval "race_pid$i=$!"
done
won=0
for i in 1 2 3 4; do
  eval "wait \$race_pid$i"
  rc=$?
  if [[ $rc -eq 0 ]]; then
    won=$((won + 1))
    grep -q "^wrote race.h5" "race$i.out" || fail "race: winner $i did not say 'wrote'"
  else
    expect_rc "race$i" 2 $rc
    grep -qE "race.h5 (exists|appeared while it was being written)" "race$i.out" ||
      fail "race: loser $i did not say why: $(cat "race$i.out")"
  fi
done
[[ $won -eq 1 ]] || fail "race: $won of 4 concurrent synths to one path said 'wrote', want 1"
"$DYNEMB" inspect race.h5 >/dev/null || fail "race: race.h5 is not a whole capture"
no_temps "$tmp" race

# --- read-only outputs need --force -----------------------------------------------------------
echo "not yet a capture" >ro.h5 && chmod 0444 ro.h5
echo '{"old": true}' >ro.json && chmod 0444 ro.json
ro_sha=$(sha ro.h5)
"$DYNEMB" replay c.h5 --quiet --write-output ro.h5 >ro1.out 2>&1
expect_rc ro_write_output 2 $?
has_text ro1.out "ro.h5 exists and is read-only (mode 0444); use --force to replace it" ro_write_output
[[ "$(sha ro.h5)" == "$ro_sha" ]] || fail "ro: a read-only --write-output file was replaced without --force"
"$DYNEMB" replay c.h5 --quiet --json ro.json >ro2.out 2>&1
expect_rc ro_json 2 $?
grep -q old ro.json || fail "ro: a read-only --json file was replaced without --force"
"$DYNEMB" replay c.h5 --quiet --force --write-output ro.h5 --json ro.json >ro3.out 2>&1
expect_rc ro_force 0 $?
[[ "$(sha ro.h5)" == "$c_sha" && "$(stat -c %a ro.h5)" == 444 ]] ||
  fail "ro: --force did not replace ro.h5 (keeping its mode)"
grep -q '"summary"' ro.json || fail "ro: --force did not replace ro.json"
no_temps "$tmp" read_only

# --- output names at NAME_MAX ----------------------------------------------------------------
for len in 246 250 255; do
  name=$(printf 'n%.0s' $(seq 1 $((len - 3)))).h5
  "$DYNEMB" synth --preset unit-seq-w2 -o "$name" >long.out 2>&1
  expect_rc "long_$len" 0 $?
  [[ -s "$name" ]] || fail "long_$len: a $len-byte output name was not written: $(cat long.out)"
  jname=$(printf 'j%.0s' $(seq 1 $((len - 5)))).json
  "$DYNEMB" replay c.h5 --quiet --json "$jname" >long.out 2>&1
  expect_rc "long_json_$len" 0 $?
  [[ -s "$jname" ]] || fail "long_json_$len: not written: $(cat long.out)"
  rm -f "$name" "$jname"
done
no_temps "$tmp" long_names

# --- SIGINT at any moment: early (before or while the temporaries are made), mid-run,
# during the commit, after it. Either the run was stopped (130, or death by SIGINT itself
# before the handler existed: no output existed then) and no output is there, or it was
# complete (its own status) and every output is. Never some outputs, never a temporary.
# (Python starts and signals the processes: a shell's forked child could run this script's
# EXIT trap if signalled before its exec.)
"$DYNEMB_PYTHON" - "$DYNEMB" <<'EOF' || fail "SIGINT at any moment"
import glob, os, signal, subprocess, sys, time
tool, bad = sys.argv[1], 0
def check(name, rc, outputs):
    global bad
    have = [f for f in outputs if os.path.exists(f)]
    temps = glob.glob("*.tmp-*")
    stopped = rc in (130, -signal.SIGINT)
    if not ((stopped and not have) or (rc == 0 and len(have) == len(outputs))) or temps:
        print(f"FAIL: {name}: exit {rc} with {len(have)} of {len(outputs)} outputs, temporaries {temps}")
        bad += 1
    for f in have:
        os.remove(f)
outs = ["s.json", "s.xml", "s.h5"]
for i in range(24):
    p = subprocess.Popen([tool, "replay", "c.h5", "--quiet", "--json", outs[0], "--junit", outs[1],
                          "--write-output", outs[2]], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    time.sleep((i * 37 % 250) / 1000)  # from at once to about the run's length
    p.send_signal(signal.SIGINT)
    check(f"replay, SIGINT {i}", p.wait(), outs)
for i in range(20):
    p = subprocess.Popen([tool, "synth", "--preset", "unit-seq-w2", "--batches", "2", "-o",
                          "early.h5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.send_signal(signal.SIGINT)  # as early as can be
    check(f"synth, early SIGINT {i}", p.wait(), ["early.h5"])
print("SIGINT at 44 moments: all outputs or none, no temporary")
sys.exit(1 if bad else 0)
EOF

# --- stdout closed early: not killed by SIGPIPE; exit 2 naming stdout; its files complete --
"$DYNEMB" replay c.h5 --json p.json --junit p.xml 2>pipe.err | head -c 1 >/dev/null
rc=${PIPESTATUS[0]}
# 2 when a write came after head left (the usual case: the summary comes last); 0 only if every
# write reached the pipe's buffer while head still held it open (a machine that stalls head).
if [[ $rc -ne 0 ]]; then
  expect_rc closed_stdout 2 "$rc"
  has_text pipe.err "dynemb-dist: error: stdout: Broken pipe" closed_stdout
fi
"$DYNEMB_PYTHON" -c 'import json; json.load(open("p.json"))' || fail "closed stdout: p.json"
no_temps "$tmp" closed_stdout

[[ "$(sha c.h5)" == "$c_sha" ]] || fail "the input capture was changed"
[[ $fails -eq 0 ]] && echo "hostile outputs: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
