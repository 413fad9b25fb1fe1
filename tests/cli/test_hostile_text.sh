#!/usr/bin/env bash
# Hostile text and hostile streams. Strings from plans and captures (names, keys, attributes,
# paths) are shown escaped: no control character or invalid UTF-8 reaches stdout or stderr,
# one finding stays one line, no line starts with "::" but our own annotations (GitHub
# Actions runs such lines as workflow commands), the JSON reports parse and the JUnit XML is
# well-formed. A stdout that fails (a full disk, a closed pipe, a closed descriptor) is exit
# 2 with "dynemb-dist: error: stdout: ..." while the --json/--junit files are still written;
# a stderr that fails never aborts the process.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
[[ -w /dev/full ]] || { echo "no /dev/full"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, expect_rc, no_temps
# Annotations only where a check asks for them (a GitHub Actions job sets GITHUB_ACTIONS=true).
unset GITHUB_ACTIONS
cd "$tmp" || exit 1

# t NAME ARGS...: the tool, stdout to NAME.out, stderr to NAME.err; its status in $rc.
t() {
  local name=$1
  shift
  "$DYNEMB" "$@" >"$name.out" 2>"$name.err"
  rc=$?
}
# clean MODE FILE...: every file is valid UTF-8 without a control character but '\n', without
# "##[", and with no line whose first non-blank characters are "::" -- under MODE github,
# except our own annotations (`::error file=...::`, `::warning`, `::notice`) at a line's start.
clean() {
  "$DYNEMB_PYTHON" - "$@" <<'EOF' || fail "clean $*"
import re, sys
mode, paths = sys.argv[1], sys.argv[2:]
blank = " \u00a0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
ours = re.compile(r"::(error|warning|notice)( [^:]*)?::")
bad = []
for p in paths:
    try:
        text = open(p, "rb").read().decode("utf-8")
    except UnicodeDecodeError as e:
        bad.append(f"{p}: not UTF-8: {e}")
        continue
    for ch in text:
        if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F or ord(ch) in (0xFFFE, 0xFFFF):
            bad.append(f"{p}: raw control character U+{ord(ch):04X}")
            break
    if "##[" in text:
        bad.append(f"{p}: '##[' (a legacy workflow command)")
    for line in text.split("\n"):
        if line.lstrip(blank).startswith("::") and not (mode == "github" and ours.match(line)):
            bad.append(f"{p}: a workflow command line: {line!r}")
for b in bad:
    print("   ", b)
sys.exit(1 if bad else 0)
EOF
}
# json_ok FILE [EXIT]: FILE parses as JSON (and its summary.exit_code is EXIT).
json_ok() {
  "$DYNEMB_PYTHON" - "$@" <<'EOF' || fail "json_ok $*"
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
if len(sys.argv) > 2 and d["summary"]["exit_code"] != int(sys.argv[2]):
    sys.exit(f"{sys.argv[1]}: exit_code {d['summary']['exit_code']}, want {sys.argv[2]}")
EOF
}
# xml_ok FILE: FILE is well-formed XML (python's xml.etree) with a <testsuites> root.
xml_ok() {
  "$DYNEMB_PYTHON" -c 'import sys, xml.etree.ElementTree as ET; assert ET.parse(sys.argv[1]).getroot().tag == "testsuites"' \
    "$1" || fail "xml_ok $1: not well-formed"
}
# stdout_error NAME WHY: exit 2 and "dynemb-dist: error: stdout: WHY" on stderr.
# row_ok TEXT: "ok: TEXT" when no check failed since the last row_ok.
seen=0
row_ok() {
  [[ $fails -eq $seen ]] && ok "$1"
  seen=$fails
}
stdout_error() {
  expect_rc "$1" 2 "$rc"
  has_text "$1.err" "dynemb-dist: error: stdout: $2" "$1"
}

"$DYNEMB" synth --preset unit-seq-w2 -o c.h5 --store ctx,local_embs,output >/dev/null || fail "synth"
"$DYNEMB_PYTHON" -c 'import sys, h5py; open(sys.argv[2], "wb").write(h5py.File(sys.argv[1], "r")["plan"][()])' \
  c.h5 plan.yaml || fail "extract the plan"
split_ranks c.h5 rank || fail "split c.h5 into per-rank files"

# ---- row 8: a full stdout is exit 2, every subcommand; the files are still written
"$DYNEMB" validate plan.yaml >/dev/full 2>full_validate.err
rc=$?
stdout_error full_validate "No space left on device"
"$DYNEMB" validate plan.yaml --format json >/dev/full 2>full_validate_json.err
rc=$?
stdout_error full_validate_json "No space left on device"
"$DYNEMB" inspect c.h5 >/dev/full 2>full_inspect.err
rc=$?
stdout_error full_inspect "No space left on device"
"$DYNEMB" replay c.h5 --json full.json --junit full.xml >/dev/full 2>full_replay.err
rc=$?
stdout_error full_replay "No space left on device"
json_ok full.json 0
xml_ok full.xml
"$DYNEMB" bench --preset unit-seq-w2 --backend cpu --iters 1 --json bench.json >/dev/full 2>full_bench.err
rc=$?
stdout_error full_bench "No space left on device"
json_ok bench.json
"$DYNEMB" synth --preset unit-seq-w2 -o s.h5 >/dev/full 2>full_synth.err
rc=$?
stdout_error full_synth "No space left on device"
"$DYNEMB" inspect s.h5 >/dev/null 2>&1 || fail "full_synth: s.h5 was not written"
"$DYNEMB" merge rank0.h5 rank1.h5 -o m.h5 >/dev/full 2>full_merge.err
rc=$?
stdout_error full_merge "No space left on device"
"$DYNEMB" inspect m.h5 >/dev/null 2>&1 || fail "full_merge: m.h5 was not written"
"$DYNEMB" --help >/dev/full 2>full_help.err
rc=$?
stdout_error full_help "No space left on device"
"$DYNEMB" replay c.h5 >&- 2>closed_replay.err
rc=$?
stdout_error closed_replay "Bad file descriptor"
no_temps . "row 8"
row_ok "row 8: a full or closed stdout"

# ---- row 5: a closed pipe (`replay ... | head -1`): EPIPE, not death by SIGPIPE
"$DYNEMB_PYTHON" - "$DYNEMB" <<'EOF' || fail "replay into a pipe without reader"
import os, signal, subprocess, sys
r, w = os.pipe()
os.close(r)  # the reader is gone before the first write: every write fails (EPIPE / SIGPIPE)
# SIGPIPE as a shell leaves it (default: death), whatever this interpreter does with it.
p = subprocess.run([sys.argv[1], "replay", "c.h5", "--json", "pipe.json", "--junit", "pipe.xml"],
                   stdout=w, stderr=subprocess.PIPE,
                   preexec_fn=lambda: signal.signal(signal.SIGPIPE, signal.SIG_DFL))
err = p.stderr.decode()
if p.returncode != 2 or "dynemb-dist: error: stdout: Broken pipe" not in err:
    sys.exit(f"exit {p.returncode} (negative: killed by that signal), stderr {err!r}")
EOF
json_ok pipe.json 0
xml_ok pipe.xml
"$DYNEMB" replay c.h5 --json head.json 2>head.err | head -1 >head.out
rc=${PIPESTATUS[0]}
# head may or may not be gone before the last write: either the run's own status or exit 2
# naming stdout, never a signal.
if [[ $rc -ne 0 ]]; then
  stdout_error head "Broken pipe"
fi
json_ok head.json 0
no_temps . "row 5"
row_ok "row 5: a closed pipe"

# ---- row 7: an unwritable stderr on an error path: exit 2, no abort
"$DYNEMB" validate missing.yaml 2>/dev/full
expect_rc "validate 2>/dev/full" 2 $?
"$DYNEMB" validate missing.yaml 2>&-
expect_rc "validate 2>&-" 2 $?
"$DYNEMB" replay missing.h5 --json never.json 2>/dev/full
expect_rc "replay 2>/dev/full" 2 $?
"$DYNEMB" inspect missing.h5 2>&-
expect_rc "inspect 2>&-" 2 $?
"$DYNEMB" replay --no-such-option 2>/dev/full
expect_rc "a usage error 2>/dev/full" 2 $?
"$DYNEMB" validate plan.yaml >/dev/full 2>/dev/full
expect_rc "stdout and stderr full" 2 $?
row_ok "row 7: an unwritable stderr"

# ---- plans and captures with hostile strings (YAML and HDF5 written here, as bytes)
"$DYNEMB_PYTHON" - <<'EOF' || fail "write the hostile plans"
s = open("plan.yaml", "rb").read()
def plan(name, *pairs):
    t = s
    for a, b in pairs:
        assert a in t, a
        t = t.replace(a, b, 1)
    open(name, "wb").write(t)
hostile = b'"t\\e]0;pwn\\a\\r\\n::add-mask::secret\\n::stop-commands::end"'
plan("ff.yaml", (b"name: t0", b"name: t\xff0"))
plan("ff_dup.yaml", (b"name: t0", b"name: t\xff0"), (b"name: t1", b"name: t\xff0"))
plan("ctl.yaml", (b"name: t0", b"name: " + hostile))
plan("ctl_dup.yaml", (b"name: t0", b"name: " + hostile), (b"name: t1", b"name: " + hostile))
plan("nul_dup.yaml", (b"name: t0", b'name: "t\\0x"'), (b"name: t1", b'name: "t\\0x"'))
EOF
"$DYNEMB_PYTHON" - <<'EOF' || fail "write the hostile captures"
import shutil, h5py, numpy as np
def capture(name, edit):
    shutil.copy("c.h5", name)
    with h5py.File(name, "r+") as f:
        edit(f)
def keys(f, first, second):
    d = f["batches/0/rank0/keys"]
    v = list(d[()])
    v[0], v[1] = first, second
    del f["batches/0/rank0/keys"]
    f.create_dataset("batches/0/rank0/keys", data=np.array(v))
def attr(f, value):
    f.attrs["format"] = np.bytes_(value)
capture("key_ff.h5", lambda f: keys(f, b"f\xff0", b"f1"))
capture("key_ctl.h5", lambda f: keys(f, b"f0\x1b[2J\x07", b"f1\r\n::add-mask::secret"))
capture("fmt_ff.h5", lambda f: attr(f, b"dynemb-dist-capture\xff"))
capture("fmt_ctl.h5", lambda f: attr(f, b"x\x1b]0;t\x07\r\n::add-mask::s\n  ::stop-commands::e ##[group]g"))
def plan_text(f, path):
    del f["plan"]
    f.create_dataset("plan", data=np.bytes_(open(path, "rb").read()))
capture("plan_ctl.h5", lambda f: plan_text(f, "ctl.yaml"))
shutil.copy("c.h5", b"path\xff.h5")
shutil.copy("c.h5", b"path\x1b[31m\r\n::add-mask::p.h5")
EOF
pff=$'path\xff.h5'
pctl=$'path\e[31m\r\n::add-mask::p.h5'

# ---- row 9: non-UTF-8 bytes: JSON and XML parse, exit codes right
t ff_json validate ff.yaml --format json
expect_rc ff_json 0 "$rc"
json_ok ff_json.out 0
has_text ff_json.out '"name": "t\\xff0"' ff_json
t ff_text validate ff.yaml
expect_rc ff_text 0 "$rc"
has_text ff_text.out 't\xff0' ff_text
t ff_dup validate ff_dup.yaml --format json
expect_rc ff_dup 2 "$rc"
json_ok ff_dup.out 2
has_text ff_dup.out "duplicate table name 't\\\\xff0'" ff_dup
t path_ff replay "$pff" --json path_ff.json --junit path_ff.xml
expect_rc path_ff 0 "$rc"
json_ok path_ff.json 0
has_text path_ff.json '"path": "path\\xff.h5"' path_ff
xml_ok path_ff.xml
t path_ff_val validate plan.yaml --capture "$pff" --format json
expect_rc path_ff_val 0 "$rc"
json_ok path_ff_val.out 0
t key_ff replay key_ff.h5 --json key_ff.json --junit key_ff.xml
expect_rc key_ff 2 "$rc"
json_ok key_ff.json 2
xml_ok key_ff.xml
has_text key_ff.out 'keys at the input dist are [f\xff0, f1' key_ff
t bench_ff bench "$pff" --backend cpu --iters 1 --json bench_ff.json
expect_rc bench_ff 0 "$rc"
json_ok bench_ff.json
has_text bench_ff.json '"workload": "path\\xff.h5"' bench_ff
t fmt_ff_val validate plan.yaml --capture fmt_ff.h5 --format json
expect_rc fmt_ff_val 2 "$rc"
json_ok fmt_ff_val.out 2
t fmt_ff replay fmt_ff.h5 --json fmt_ff.json --junit fmt_ff.xml
expect_rc fmt_ff 2 "$rc"
json_ok fmt_ff.json 2
xml_ok fmt_ff.xml
has_text fmt_ff.err 'unknown format "dynemb-dist-capture\xff"' fmt_ff
clean none ff_json.out ff_text.out ff_dup.out path_ff.out path_ff.err path_ff_val.out key_ff.out \
  key_ff.err fmt_ff_val.out fmt_ff.out fmt_ff.err bench_ff.out bench_ff.err
row_ok "row 9: non-UTF-8 bytes"

# ---- row 10: ESC, BEL, CR, LF: escaped; no "::" line but our own annotations
for a in none github; do
  t ctl_$a validate ctl.yaml --annotations $a
  expect_rc ctl_$a 0 "$rc"
  t ctl_dup_$a validate ctl_dup.yaml --annotations $a
  expect_rc ctl_dup_$a 2 "$rc"
  t key_ctl_$a replay key_ctl.h5 --annotations $a --json key_ctl_$a.json --junit key_ctl_$a.xml
  expect_rc key_ctl_$a 2 "$rc"
  json_ok key_ctl_$a.json 2
  xml_ok key_ctl_$a.xml
  t fmt_ctl_$a replay fmt_ctl.h5 --annotations $a --json fmt_ctl_$a.json --junit fmt_ctl_$a.xml
  expect_rc fmt_ctl_$a 2 "$rc"
  json_ok fmt_ctl_$a.json 2
  xml_ok fmt_ctl_$a.xml
  t fmt_ctl_val_$a validate plan.yaml --capture fmt_ctl.h5 --annotations $a
  expect_rc fmt_ctl_val_$a 2 "$rc"
  t path_ctl_$a replay "$pctl" --annotations $a --json path_ctl_$a.json --junit path_ctl_$a.xml
  expect_rc path_ctl_$a 0 "$rc"
  json_ok path_ctl_$a.json 0
  xml_ok path_ctl_$a.xml
  clean $a ctl_$a.{out,err} ctl_dup_$a.{out,err} key_ctl_$a.{out,err} fmt_ctl_$a.{out,err} \
    fmt_ctl_val_$a.{out,err} path_ctl_$a.{out,err} key_ctl_$a.json fmt_ctl_$a.json
done
t inspect_ctl inspect plan_ctl.h5
expect_rc inspect_ctl 0 "$rc"
has_text inspect_ctl.out '#   table t\x1b]0;pwn\x07\r\n::add-mask::secret\n::stop-commands::end: 1000 rows' inspect_ctl
t replay_plan_ctl replay plan_ctl.h5 --annotations none
expect_rc replay_plan_ctl 0 "$rc"
t bench_ctl bench "$pctl" --backend cpu --iters 1
expect_rc bench_ctl 0 "$rc"
has_text bench_ctl.out '# dynemb-dist bench: path\x1b[31m\r\n::add-mask::p.h5 (sequence' bench_ctl
clean none inspect_ctl.out inspect_ctl.err replay_plan_ctl.out replay_plan_ctl.err bench_ctl.out bench_ctl.err
# One finding, one line, the name escaped in it; under github one annotation, ours.
has_text ctl_dup_none.out \
  "error: tables[1].name: duplicate table name 't\\x1b]0;pwn\\x07\\r\\n::add-mask::secret\\n::stop-com...' (first at line" \
  ctl_dup_none
[[ $(grep -c '^::' ctl_dup_github.out) -eq 1 ]] || fail "ctl_dup_github: want exactly one annotation"
has_text ctl_dup_github.out '::error file=ctl_dup.yaml,line=' ctl_dup_github
has_text fmt_ctl_none.err \
  'unknown format "x\x1b]0;t\x07\r\n::add-mask::s\n  ::stop-commands::e #\x23[group]g"' fmt_ctl_none
has_text key_ctl_none.out 'ERROR batch 0 rank 0 capture trouble: key_ctl.h5:/batches/0/rank0/keys: the KJT keys at the input dist are [f0\x1b[2J\x07, f1\r\n::add-mask::secret, ' key_ctl_none
has_text path_ctl_none.out '# capture    path\x1b[31m\r\n::add-mask::p.h5  sha256' path_ctl_none
row_ok "row 10: control characters"

# ---- row 11: a NUL inside a table name: the finding line is complete, the report goes on
t nul validate nul_dup.yaml
expect_rc nul 2 "$rc"
has_text nul.out "error: tables[1].name: duplicate table name 't\\x00x' (first at line 11:11)" nul
has_text nul.out "# status: error (1 error, 0 warnings, 0 notes), exit 2" nul
clean none nul.out nul.err
row_ok "row 11: a NUL in a name"

no_temps . "all"
[[ $fails -eq 0 ]]
