#!/usr/bin/env bash
# `dynemb-dist replay` output checks and the golden workflow: a golden changed by one ulp is
# caught in exact mode (and accepted by ulp:1) as a *data* mismatch with the tensor's own
# coordinates; a wrong captured lookup is blamed on local_embs; --write-output blesses a new
# golden without touching the input; options and trouble give exit 2 with a clear message.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
run() {  # run NAME WANT_RC ARGS...
  local name=$1 want=$2
  shift 2
  "$DYNEMB" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then
    fail "$name: exit $rc, want $want ($*)"
    sed 's/^/    /' "$tmp/$name.out" | head -40
  fi
}
has() { grep -qE -- "$2" "$tmp/$1.out" || { fail "$1: no line matches: $2"; sed 's/^/    /' "$tmp/$1.out" | head -40; }; }
hasnt() { ! grep -qE -- "$2" "$tmp/$1.out" || fail "$1: a line matches what should not be there: $2"; }
mutate() {
  "$DYNEMB_PYTHON" - "$1" "$2" <<'EOF' || fail "mutate $1 failed"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}
plant() {  # plant NAME BASE PYTHON: a copy of BASE.h5 with one defect
  cp "$tmp/$2.h5" "$tmp/$1.h5"
  mutate "$tmp/$1.h5" "$3"
}

"$DYNEMB" synth --preset unit-seq-w2 --batches 3 --seed 3 -o "$tmp/seq.h5" >/dev/null || fail "synth seq"
"$DYNEMB" synth --preset unit-pooled-w8 --batches 2 --seed 3 -o "$tmp/pooled.h5" >/dev/null || fail "synth pooled"
"$DYNEMB" synth --preset unit-pooled-w8 --vbe --batches 2 --seed 3 -o "$tmp/vbe.h5" >/dev/null || fail "synth vbe"

# ---- one ulp up on one golden element of sequence output [N_r, D=128]: row 3, column 5
ULP='d = f["batches/1/rank0/output"]; v = d[...]; v[3, 5] = np.nextafter(v[3, 5], np.float32(np.inf), dtype=np.float32); d[...] = v'
plant ulp seq "$ULP"
run ulp 1 replay "$tmp/ulp.h5"
has ulp "^FAIL +batch 1 rank 0 output golden: 1 of [0-9]+ elements differ \(exact\); first at feature f[0-3], sample [0-9]+, position [0-9]+, column 5: replayed [-0-9.e]+, golden [-0-9.e]+; max abs err [0-9.e-]+, max rel err [0-9.e-]+ \[cause: data \(golden output\)\]"
hasnt ulp "^FAIL .* ctx "
hasnt ulp "^FAIL .* output reference"
has ulp "^# result: FAIL \(exit 1\): 0 context mismatches, 0 lookup mismatches, 1 output mismatches \(1 data\)"
run ulp_tol 0 replay "$tmp/ulp.h5" --tolerance ulp:1
run ulp_rtol 0 replay "$tmp/ulp.h5" --tolerance rtol:1e-6,atol:0
# The coordinates are those of row 3 of rank 0's own KJT: check with h5py.
want=$("$DYNEMB_PYTHON" - "$tmp/seq.h5" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    g = f["batches/1/rank0"]
    lengths = g["lengths"][...]; F = 4; B = len(lengths) // F
    off = np.concatenate([[0], np.cumsum(lengths)])
    j = int(np.searchsorted(off, 3, side="right") - 1)
    print(f"feature f{j // B}, sample {j % B}, position {3 - off[j]}, column 5")
EOF
)
has ulp "first at ${want}: "

# ---- pooled [B_r, sum_D]: sample, feature, column within the feature (rank 5, row 7, col 300)
plant pooled_bad pooled 'd = f["batches/0/rank5/output"]; v = d[...]; v[7, 300] += 0.5; d[...] = v'
run pooled_bad 1 replay "$tmp/pooled_bad.h5"
has pooled_bad "^FAIL +batch 0 rank 5 output golden: 1 of 65536 elements differ \(exact\); first at sample 7, feature f2, column 44: .*max abs err 0.5, .*\[cause: data \(golden output\)\]"

# ---- pooled VBE 1-D [f][b][d]: feature, sample, column (first element of rank 3)
plant vbe_bad vbe 'd = f["batches/1/rank3/output"]; v = d[...]; v[0] = np.float32(np.nan); d[...] = v'
run vbe_bad 1 replay "$tmp/vbe_bad.h5"
has vbe_bad "^FAIL +batch 1 rank 3 output golden: 1 of [0-9]+ elements differ \(exact\); first at feature f0, sample 0, column 0: replayed [-0-9.e]+, golden nan"

# ---- a captured lookup that is wrong: the lookup check fails and the cause is local_embs
plant lookup_bad seq 'd = f["batches/0/rank1/local_embs"]; v = d[...]; v[2, 7] += 1; d[...] = v'
run lookup_bad 1 replay "$tmp/lookup_bad.h5"
has lookup_bad "^FAIL +batch 0 rank 1 lookup local_embs: 1 of [0-9]+ elements differ \(exact\); first at feature f[0-3], source_rank [01], sample [0-9]+, position [0-9]+, column 7: captured"
has lookup_bad "^FAIL +batch 0 rank [01] output reference: .*\[cause: lookup/local_embs\]"
hasnt lookup_bad "^FAIL .* ctx "
# with --ctx derived, the derived lookup is used and the outputs agree
run lookup_derived 1 replay "$tmp/lookup_bad.h5" --ctx derived
hasnt lookup_derived "^FAIL .* output "

# ---- no embedding source (/oracle removed): the output dist runs on the captured local_embs,
# the lookup check and the reference are skipped with a warning, a wrong golden is still caught
plant noref seq 'del f["oracle"]'
run noref 0 replay "$tmp/noref.h5"
has noref "^# warning: the capture has no /oracle and no /tables weights"
hasnt noref "^# lookup "
plant noref_bad noref 'd = f["batches/1/rank0/output"]; v = d[...]; v[0, 0] += 1; d[...] = v'
run noref_bad 1 replay "$tmp/noref_bad.h5"
has noref_bad "^FAIL +batch 1 rank 0 output golden: 1 of [0-9]+ elements differ .*\[cause: undetermined \(no embedding source for a reference\)\]"
plant noref_nolocal noref 'del f["batches/0/rank1/local_embs"]'
run noref_nolocal 0 replay "$tmp/noref_nolocal.h5"
has noref_nolocal "^# warning: some ranks have no local_embs and there is no embedding source"
has noref_nolocal "^# output +[0-9]+ +[0-9]+ +0 +0 +[1-9]"

# ---- bless: --write-output writes this replay's outputs; the input is not modified
before=$(sha256sum <"$tmp/ulp.h5")
run bless 1 replay "$tmp/ulp.h5" --write-output "$tmp/blessed.h5"
[[ "$(sha256sum <"$tmp/ulp.h5")" == "$before" ]] || fail "bless: the input capture changed"
[[ -f "$tmp/blessed.h5" ]] || fail "bless: no output file"
ls "$tmp" | grep -q "blessed.h5.tmp" && fail "bless: a temporary file was left behind"
run blessed 0 replay "$tmp/blessed.h5"
"$DYNEMB_PYTHON" - "$tmp/blessed.h5" "$tmp/seq.h5" <<'EOF' || fail "blessed output differs from the original golden"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    assert a.attrs["num_batches"] == b.attrs["num_batches"]
    for k in range(int(b.attrs["num_batches"])):
        for r in range(2):
            p = f"batches/{k}/rank{r}"
            for name in ("output", "values", "lengths", "local_embs"):
                assert np.array_equal(a[p][name][...], b[p][name][...]), (p, name)
EOF
# --batches with --write-output: unselected batches are copied as they are
run bless_part 0 replay "$tmp/ulp.h5" --batches 0 --write-output "$tmp/part.h5"
run part_check 1 replay "$tmp/part.h5"
has part_check "^FAIL +batch 1 rank 0 output golden"
# refuse to overwrite the input, through another spelling of its path too
run same 2 replay "$tmp/seq.h5" --write-output "$tmp/./seq.h5"
has same "output .*seq.h5 \(--write-output\) is the same file as the input .*seq.h5 \(capture\)"

# ---- --batches
run batches 0 replay "$tmp/seq.h5" --batches 0,2
has batches "^# module +sequence, world size 2, 3 batches in the capture, 2 replayed"
run batches_ulp 0 replay "$tmp/ulp.h5" --batches 0,2   # the bad batch 1 is not replayed
run batches_bad 2 replay "$tmp/seq.h5" --batches 0-5
has batches_bad "--batches '0-5': batch 5 does not exist \(the capture has 3 batches, 0..2\)"
run batches_syntax 2 replay "$tmp/seq.h5" --batches 2-1
has batches_syntax "runs backwards"

# ---- colour and progress only on a terminal (script(1) provides one), never with NO_COLOR
hasnt ulp $'\x1b'
if command -v script >/dev/null; then
  env -u NO_COLOR script -qec "'$DYNEMB' replay '$tmp/ulp.h5'" /dev/null >"$tmp/tty.out" 2>&1
  has tty $'\x1b\\[31;1mFAIL'
  has tty "replay \\[#+\\] 100%  3/3 batches, 6/6 rank-batches"
  has tty $'rank-batches[^\r]*\r\x1b\\[K'  # erased once the work is done
  NO_COLOR=1 script -qec "'$DYNEMB' replay '$tmp/ulp.h5'" /dev/null >"$tmp/tty_nc.out" 2>&1
  hasnt tty_nc $'\x1b\\[3'
  has tty_nc "100%  3/3 batches, 6/6 rank-batches"
  env -u NO_COLOR script -qec "'$DYNEMB' replay '$tmp/ulp.h5' --quiet" /dev/null >"$tmp/tty_q.out" 2>&1
  hasnt tty_q "rank-batches"
  hasnt tty_q "^FAIL"
fi

# ---- usage errors and trouble: exit 2
run tol_bad 2 replay "$tmp/seq.h5" --tolerance ulp:x
has tol_bad "--tolerance 'ulp:x'"
run ctx_bad 2 replay "$tmp/seq.h5" --ctx sometimes
if [[ "${DYNEMB_HAVE_CUDA:-OFF}" != "ON" ]]; then
  run cuda 2 replay "$tmp/seq.h5" --backend cuda
  has cuda "--backend cuda: this build has no CUDA backend"
elif ! nvidia-smi -L >/dev/null 2>&1; then
  # The CUDA backend starts on another thread where there is a GPU (start_backend); without
  # one it is refused at once, before the capture is read.
  run cuda 2 replay "$tmp/seq.h5" --backend cuda
  has cuda "CUDA device 0 is not available"
  hasnt cuda "# capture"
  # A GPU's device node without a usable device (a driver that cannot start): the backend's
  # start fails on its own thread, and the replay reports that as its trouble. (The node is
  # named through a test hook: not in a build without them.)
fi
if [[ "${DYNEMB_HAVE_CUDA:-OFF}" == "ON" ]] && ! nvidia-smi -L >/dev/null 2>&1 && has_test_hooks; then
  DYNEMB_GPU_NODE=/dev/null run cuda_node 2 replay "$tmp/seq.h5" --backend cuda
  has cuda_node "CUDA device 0 is not available"
  DYNEMB_GPU_NODE=/dev/null run cuda_node_json 2 replay "$tmp/seq.h5" --backend cuda \
    --json "$tmp/node.json"
  "$DYNEMB_PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert "CUDA device 0 is not available" in r["trouble"], r["trouble"]
assert r["summary"]["exit_code"] == 2, r["summary"]
' "$tmp/node.json" || fail "cuda_node_json: the report's trouble"
fi
# --backend nccl is trouble without an NCCL build or a GPU; with both it is a normal replay.
if "$DYNEMB" --version | grep -q nccl && nvidia-smi -L >/dev/null 2>&1; then
  run nccl 0 replay "$tmp/seq.h5" --backend nccl --quiet
  has nccl "backend +nccl"
else
  run nccl 2 replay "$tmp/seq.h5" --backend nccl
  has nccl "--backend nccl"
fi
run missing 2 replay "$tmp/nonexistent.h5"
has missing "nonexistent.h5"
plant broken seq 'del f["batches/1/rank1/values"]'
run broken 2 replay "$tmp/broken.h5" --json "$tmp/broken.json" --junit "$tmp/broken.xml"
has broken "batches/1/rank1"
[[ -f "$tmp/broken.json" && -f "$tmp/broken.xml" ]] || fail "broken: reports not written on trouble"
grep -q '<error type="trouble"' "$tmp/broken.xml" || fail "broken: no <error> in the JUnit file"

# ---- --plan override that agrees with the capture
"$DYNEMB_PYTHON" -c "import h5py; f = h5py.File('$tmp/seq.h5'); p = f['plan'][()]; open('$tmp/plan.yaml', 'wb').write(p if isinstance(p, bytes) else p.encode())"
run plan_override 0 replay "$tmp/seq.h5" --plan "$tmp/plan.yaml"
has plan_override "^# plan +.*plan.yaml  sha256 [0-9a-f]{64}"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
