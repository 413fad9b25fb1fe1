#!/usr/bin/env bash
# Messages on the I/O paths say why (docs/robustness.md): a missing file vs permission denied
# (errno's reason), a directory or a pipe given as an input, merge's temporary file, libhdf5's
# write failure as one line with the HDF5 path, a tab in YAML indentation, an out-of-range id
# (the id itself and what to set), a FIFO plan nobody writes to (times out like a capture).
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...
cd "$tmp" || exit 1
# run NAME WANT ARGS...: stdout+stderr in NAME.out; a signal exit is a failure.
run() {
  local name=$1 want=$2
  shift 2
  DYNEMB_OPEN_TIMEOUT=2 timeout 30 "$DYNEMB" "$@" >"$name.out" 2>&1
  expect_rc "$name" "$want" $?
}

cp "$DYNEMB_SRC/plans/unit-seq-w2.yaml" p.yaml
"$DYNEMB" synth p.yaml -o c.h5 >/dev/null || fail "synth c.h5"

# ---- missing, a directory, permission denied
run cap_missing 2 replay nope.h5
has_text cap_missing.out "nope.h5:/: cannot open file: No such file or directory" cap_missing
run plan_missing 2 validate nope.yaml
has_text plan_missing.out "nope.yaml: cannot read the plan: No such file or directory" plan_missing
run replay_plan_missing 2 replay c.h5 --plan nope.yaml
has_text replay_plan_missing.out "nope.yaml: cannot read the plan file: No such file or directory" replay_plan_missing
mkdir adir
run cap_dir 2 replay adir
has_text cap_dir.out "adir:/: is a directory, not a capture file" cap_dir
run plan_dir 2 synth adir -o x.h5
has_text plan_dir.out "adir: cannot read the plan: it is a directory" plan_dir
# Permission denied: as the user running the test, or as nobody when that is root (which
# reads anything).
as_user=()
if [[ $(id -u) -eq 0 ]]; then
  if command -v setpriv >/dev/null; then
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    chmod 755 "$tmp"
  else
    as_user=(skip)
  fi
fi
if [[ "${as_user[*]}" != skip ]]; then
  cp c.h5 locked.h5 && chmod 000 locked.h5
  cp p.yaml locked.yaml && chmod 000 locked.yaml
  "${as_user[@]}" "$DYNEMB" inspect locked.h5 >cap_perm.out 2>&1
  expect_rc cap_perm 2 $?
  has_text cap_perm.out "locked.h5:/: cannot open file: Permission denied" cap_perm
  "${as_user[@]}" "$DYNEMB" validate locked.yaml >plan_perm.out 2>&1
  expect_rc plan_perm 2 $?
  has_text plan_perm.out "locked.yaml: cannot read the plan: Permission denied" plan_perm
else
  echo "skipped: permission-denied cases (root without setpriv)"
fi

# ---- a FIFO plan without a writer times out (2 s), with a writer it is read
mkfifo plan.fifo
start=$(date +%s)
run plan_fifo 2 validate plan.fifo
has_text plan_fifo.out "plan.fifo: cannot read the plan: it is a pipe (FIFO) and reading it did not finish in 2 s" plan_fifo
(($(date +%s) - start <= 10)) || fail "plan_fifo: took $(($(date +%s) - start)) s"
run replay_plan_fifo 2 replay c.h5 --plan plan.fifo
has_text replay_plan_fifo.out "reading it did not finish in 2 s" replay_plan_fifo
(sleep 0.3 && cat p.yaml >plan.fifo) &
run plan_fifo_written 0 validate plan.fifo
wait

# ---- a tab in the YAML indentation
printf 'format_version: 1\nworld_size: 2\nmodule: sequence\ntables:\n  - name: t0\n\t num_embeddings: 3\n' >tab.yaml
run tab 2 validate tab.yaml
has_text tab.out "tab.yaml:6:1: error: a tab in the indentation; YAML indents with spaces only" tab

# ---- an id outside its table: the id itself, and the setting that looks it up
"$DYNEMB" synth p.yaml --oob-ids 0.05 --seed 3 --store none -o oob.h5 >/dev/null || fail "synth oob.h5"
run oob 2 replay oob.h5 --quiet
# (rank 1's sample 3 of f0 holds the ids 936, 487, -562; -562 is looked up on rank 0)
has_text oob.out "oob.h5:/batches/0: id -562 of feature f0 (rank 1, sample 3, position 2 in its bag) is outside table t0 (num_embeddings 1000; routed to rank 0). The plan says bounds_check: error; with bounds_check: warn_zero_row such ids are looked up as local row 0 of the rank they are routed to" oob
grep -qE "local row [1-9][0-9]{6,}" oob.out && fail "oob: the message still gives the bucketized local row"

# ---- merge's temporary file: where it would go, and why not
"$DYNEMB" synth p.yaml -o c2.h5 >/dev/null
run merge_nodir 2 merge c.h5 -o nodir/m.h5
has_text merge_nodir.out "nodir/m.h5: cannot write there: directory nodir: No such file or directory" merge_nodir

# ---- libhdf5's write failure: one line, the HDF5 path, errno's reason (no driver dump)
(
  ulimit -f 100
  exec "$DYNEMB" synth --preset unit-seq-w8 -o big.h5
) >hdf5.out 2>&1
expect_rc hdf5_write 2 $?
has_text hdf5.out "big.h5:/batches/0/rank0/local_embs: cannot write: file write failed: File too large" hdf5_write
grep -qE "time = |file descriptor = |bytes this sub-write" hdf5.out && fail "hdf5_write: libhdf5's driver dump is in the message"
[[ $(wc -l <hdf5.out) -eq 1 ]] || fail "hdf5_write: more than one line: $(cat hdf5.out)"
no_temps "$tmp" io_messages

[[ $fails -eq 0 ]] && echo "I/O messages: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
