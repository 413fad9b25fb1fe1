#!/usr/bin/env bash
# A plan with `input_dist: inference` and uneven continuous shards (what `load --write-plans`
# writes as balanced.yaml): `validate` accepts it and shows the uneven rows per rank; `replay
# --plan` and `synth --plan`, whose engine routes continuous ids by the ceil rule only, refuse it
# with exit 2 and one line, rather than replay the even split under its name.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, run, has, ...
cd "$tmp" || exit 1

# unit-seq-w2 with t0 (1000 rows) split 100 / 900 instead of the ceil rule's 500 / 500.
sed 's/^comm_precision: fp32$/comm_precision: fp32\ninput_dist: inference/' \
  "$DYNEMB_SRC/plans/unit-seq-w2.yaml" |
  awk '{print} /^    features: \[f0\]$/ {
    print "    shards:"
    print "      - {rank: 0, row_offset: 0, rows: 100}"
    print "      - {rank: 1, row_offset: 100, rows: 900}"
  }' >balanced.yaml
grep -q "input_dist: inference" balanced.yaml || fail "balanced.yaml: no input_dist line"

run validate 0 validate balanced.yaml
has validate "input_dist inference"
has validate "# status: ok \(0 errors, 0 warnings, 0 notes\), exit 0"
# Rank 0 holds 100 rows of t0, rank 1 900.
has validate "^     0       100 "
has validate "^     1       900 "

# The same shards under the training input dist break the ceil rule.
grep -v "input_dist" balanced.yaml >training.yaml
run training 2 validate training.yaml
has training "training routes ids \[0,500\) to rank 0 \(blk=500\), but shards give rank 0 rows \[0,100\)"

"$DYNEMB" synth --preset unit-seq-w2 --batches 1 --batch-size 4 --seed 3 -o cap.h5 >/dev/null ||
  fail "synth"
before=$(sha cap.h5)
want="table 't0' has uneven explicit shards under input_dist inference; replay and synth route continuous ids by the ceil rule only"
run replay 2 replay cap.h5 --plan balanced.yaml
has replay "$want"
[[ "$(sha cap.h5)" == "$before" ]] || fail "replay: the capture was changed"
run synth 2 synth balanced.yaml --batches 1 -o out.h5
has synth "balanced.yaml: error: $want"
[[ -e out.h5 ]] && fail "synth: out.h5 written"
# An inference plan whose shards follow the ceil rule routes as training does: replayed.
sed 's/rows: 100}/rows: 500}/; s/row_offset: 100, rows: 900/row_offset: 500, rows: 500/' \
  balanced.yaml >even.yaml
run even 0 replay cap.h5 --plan even.yaml
has even "--plan differs from the capture's plan: input_dist: training \(capture\) -> inference \(--plan\)"

[[ $fails -eq 0 ]] && echo "all ok"
[[ $fails -eq 0 ]]
