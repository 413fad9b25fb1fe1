#!/usr/bin/env bash
# Outputs never overwrite inputs (docs/robustness.md "Nothing lost"): every output of every
# command is compared with every input and with the other outputs by device and inode, before
# any work; `synth -o` onto an existing file needs --force; an output that is a symbolic link is
# written through (the link is kept); every output's temporary is created up front, so an
# unwritable report is found before the replay, and the text result line agrees with the exit
# status. Each case checks the exit status (never a signal), the inputs' sha256 before and
# after, that no "*.tmp-*" is left, and the message.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...

cd "$tmp" || exit 1
cp "$DYNEMB_SRC/plans/unit-seq-w2.yaml" p.yaml
"$DYNEMB" synth p.yaml --batches 2 --seed 5 -o c.h5 >/dev/null || fail "synth c.h5"
plan_sha=$(sha p.yaml)
cap_sha=$(sha c.h5)
# run NAME WANT ARGS...: exit status WANT (never a signal), inputs unchanged, no temporaries.
run() {
  local name=$1 want=$2
  shift 2
  "$DYNEMB" "$@" >"$name.out" 2>&1
  expect_rc "$name" "$want" $?
  [[ "$(sha p.yaml)" == "$plan_sha" ]] || fail "$name: the plan p.yaml was changed"
  [[ "$(sha c.h5)" == "$cap_sha" ]] || fail "$name: the capture c.h5 was changed"
  no_temps "$tmp" "$name"
}

# ---- synth onto its own plan, by four spellings
run synth_self 2 synth p.yaml -o p.yaml
has_text synth_self.out "output p.yaml (-o) is the same file as the input p.yaml (plan)" synth_self
run synth_self_abs 2 synth p.yaml -o "$tmp/p.yaml" --force
has_text synth_self_abs.out "is the same file as the input p.yaml (plan) (same device and inode)" synth_self_abs
ln -s p.yaml plink.yaml
run synth_self_link 2 synth p.yaml -o plink.yaml --force
has_text synth_self_link.out "output plink.yaml (-o) is the same file as the input p.yaml" synth_self_link
ln p.yaml phard.yaml
run synth_self_hard 2 synth p.yaml -o phard.yaml --force
has_text synth_self_hard.out "output phard.yaml (-o) is the same file as the input p.yaml" synth_self_hard

# ---- synth onto an existing file needs --force
cp c.h5 existing.h5
ex_sha=$(sha existing.h5)
run synth_existing 2 synth p.yaml -o existing.h5
has_text synth_existing.out "existing.h5 exists (use --force to replace it)" synth_existing
[[ "$(sha existing.h5)" == "$ex_sha" ]] || fail "synth_existing: existing.h5 changed without --force"
run synth_force 0 synth p.yaml --seed 9 -o existing.h5 --force
[[ "$(sha existing.h5)" != "$ex_sha" ]] || fail "synth_force: existing.h5 was not replaced"

# ---- replay: each report and --write-output onto the plan and onto the capture
for opt in --json --junit --write-output; do
  n=${opt#--}
  run "replay_plan_$n" 2 replay c.h5 --plan p.yaml "$opt" p.yaml
  has_text "replay_plan_$n.out" "output p.yaml ($opt) is the same file as the input p.yaml (--plan)" "replay_plan_$n"
  run "replay_cap_$n" 2 replay c.h5 "$opt" ./c.h5
  has_text "replay_cap_$n.out" "output ./c.h5 ($opt) is the same file as the input c.h5 (capture)" "replay_cap_$n"
  # Nothing was replayed: the check comes before any work.
  grep -q "result:" "replay_cap_$n.out" && fail "replay_cap_$n: the replay ran before the clash was found"
done

# ---- bench --json onto its capture
run bench_cap 2 bench c.h5 --backend cpu --iters 1 --json "$tmp/c.h5"
has_text bench_cap.out "(--json) is the same file as the input c.h5 (capture)" bench_cap
run bench_ok 0 bench c.h5 --backend cpu --iters 1 --json bench.json
grep -q '"stages"' bench.json || fail "bench_ok: no JSON written"
# bench --export DIR writes .npy files and meta.json: each is checked like any other output
mkdir ex && ln -s ../c.h5 ex/meta.json
run bench_export_cap 2 bench c.h5 --backend cpu --iters 1 --export ex
has_text bench_export_cap.out "output ex/meta.json (--export meta.json) is the same file as the input c.h5 (capture)" bench_export_cap
run bench_export_json 2 bench c.h5 --backend cpu --iters 1 --export ./ex2 --json ex2/bk_ids.npy
has_text bench_export_json.out "is the same file as the output ex2/bk_ids.npy (--json)" bench_export_json

# ---- two outputs on one file
run replay_two 2 replay c.h5 --json x.out.json --junit ./x.out.json
has_text replay_two.out "output ./x.out.json (--junit) is the same file as the output x.out.json (--json)" replay_two
[[ ! -e x.out.json ]] || fail "replay_two: x.out.json was written"
ln -s r1.json r1link.json
run replay_two_link 2 replay c.h5 --json r1.json --junit r1link.json
has_text replay_two_link.out "(--junit) is the same file as the output r1.json (--json)" replay_two_link

# ---- an output that is a symbolic link: written through, the link kept
mkdir -p reports
echo old >reports/real.json
ln -s reports/real.json rlink.json
run replay_link 0 replay c.h5 --quiet --json rlink.json
[[ -L rlink.json ]] || fail "replay_link: the symbolic link became a plain file"
[[ "$(readlink rlink.json)" == "reports/real.json" ]] || fail "replay_link: the link now points elsewhere"
grep -q '"schema_version"' reports/real.json || fail "replay_link: the link's target does not hold the report"
# A link to a file that does not exist yet: the file is created where the link points.
ln -s reports/new.h5 dangling.h5
run synth_dangling 0 synth p.yaml -o dangling.h5
[[ -L dangling.h5 && -s reports/new.h5 ]] || fail "synth_dangling: not written through the link"
# A directory or a pipe as an output: refused, nothing written.
run out_dir 2 synth p.yaml -o reports
has_text out_dir.out "reports: is a directory; give a file name" out_dir
mkfifo fifo.json
run out_fifo 2 replay c.h5 --json fifo.json
has_text out_fifo.out "fifo.json: not a regular file" out_fifo

# ---- every output proven writable up front: a missing directory or a read-only one is
# reported at once, before the replay (no result line), and the exit status agrees.
run nodir 2 replay c.h5 --json nodir/r.json
has_text nodir.out "nodir/r.json: cannot write there: directory nodir: No such file or directory" nodir
grep -q "result:" nodir.out && fail "nodir: the replay ran although its report cannot be written"
# A directory the user may not write to (as nobody when the test runs as root).
mkdir ro && chmod 555 ro
as_user=()
[[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null &&
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups) && chmod 755 "$tmp" && chmod 644 c.h5
if [[ $(id -u) -ne 0 || ${#as_user[@]} -gt 0 ]]; then
  "${as_user[@]}" "$DYNEMB" replay c.h5 --junit ro/r.xml >rodir.out 2>&1
  expect_rc rodir 2 $?
  has_text rodir.out "ro/r.xml: cannot create the temporary file $tmp/ro/r.xml.tmp-" rodir
  has_text rodir.out ": Permission denied" rodir
  grep -q "result:" rodir.out && fail "rodir: the replay ran although its report cannot be written"
fi
# The result line always agrees with the exit status.
run pass 0 replay c.h5 --json ok.json --junit ok.xml
has_text pass.out "result: PASS (exit 0)" pass
[[ -s ok.json && -s ok.xml ]] || fail "pass: reports missing"

# ---- merge onto one of its inputs, by every spelling (the per-rank files from a live job
# cannot be re-taken)
split_ranks c.h5 rank || fail "split c.h5 into per-rank files"
r0=$(sha rank0.h5)
r1=$(sha rank1.h5)
ln -s rank1.h5 r1sym.h5
ln rank1.h5 r1hard.h5
for spelling in rank1.h5 ./rank1.h5 "$tmp/rank1.h5" "$tmp/./rank1.h5" r1sym.h5 r1hard.h5; do
  run "merge_self" 2 merge rank0.h5 rank1.h5 -o "$spelling" --force
  has_text merge_self.out "is the same file as the input rank1.h5 (per-rank file)" "merge -o $spelling"
  [[ "$(sha rank0.h5)" == "$r0" && "$(sha rank1.h5)" == "$r1" ]] ||
    fail "merge -o $spelling --force: a per-rank file was changed"
done
run merge_ok 0 merge rank0.h5 rank1.h5 -o merged.h5
run merge_exists 2 merge rank0.h5 rank1.h5 -o merged.h5
has_text merge_exists.out "merged.h5 exists (use --force to replace it)" merge_exists

[[ $fails -eq 0 ]] && echo "outputs: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
