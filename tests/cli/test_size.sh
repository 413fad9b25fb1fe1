#!/usr/bin/env bash
# Size up front (docs/robustness.md): `validate` prints what one batch of a replay and of a
# synth needs (context with its W^2 terms, ids, lookup output); synth and replay refuse a job
# that cannot fit in the machine's memory before starting, with that estimate. A W = 65536
# plan validates clean, but its synth is refused at once instead of dying half-way.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...
cd "$tmp" || exit 1

cat >w65536.yaml <<'EOF'
format_version: 1
world_size: 65536
module: sequence
comm_precision: fp32
tables:
  - name: t0
    num_embeddings: 10000000
    embedding_dim: 128
    data_type: fp32
    dist_type: continuous
    features: [f0]
EOF
plan_sha=$(sha w65536.yaml)
"$DYNEMB" validate w65536.yaml --batch-size 8 --bag-length 4 >val.out 2>&1
expect_rc validate_w65536 0 $?
# W = 65536, F = 1, B = 8: the context's W^2 terms are 65536 * (24 W + 4 W + 8 W + 8 W B) bytes
# = 400.00 GiB; the lookup output N * D * 4 = 65536 * 8 * 4 ids * 128 * 4 bytes = 1.00 GiB.
has_text val.out "# memory per batch: replay ~" validate_w65536
has_text val.out "(B = 8 per rank, 4 ids per bag: context 400.02 GiB of which 400.00 GiB in W^2 terms" validate_w65536
has_text val.out "lookup output 1.00 GiB, output 1.00 GiB)" validate_w65536

# synth refuses at once, before creating anything.
start=$(date +%s)
DYNEMB_MEMORY_LIMIT=64G "$DYNEMB" synth w65536.yaml --batch-size 8 --hotness 4 -o w.h5 >synth.out 2>&1
expect_rc synth_w65536 2 $?
(($(date +%s) - start < 10)) || fail "synth_w65536: took $(($(date +%s) - start)) s to refuse"
# ids 256.09 + context 400.02 GiB, and (one destination at a time) two ranks' lookups, four
# ranks' outputs and one destination's blocks of 16 KiB each.
has_text synth.out "synth: one batch needs about 656.10 GiB, more than the 64.00 GiB this machine has" synth_w65536
has_text synth.out "W = 65536" synth_w65536
[[ ! -e w.h5 ]] || fail "synth_w65536: w.h5 was created"
[[ "$(sha w65536.yaml)" == "$plan_sha" ]] || fail "synth_w65536: the plan was changed"
no_temps "$tmp" synth_w65536

# A job that fits runs (the same limit).
DYNEMB_MEMORY_LIMIT=64G "$DYNEMB" synth --preset unit-seq-w8 --batches 1 -o small.h5 >/dev/null 2>&1
expect_rc synth_fits 0 $?
# synth makes its output dist one destination at a time, with one rank's lookup in memory, and
# is sized so: a batch whose every lookup at once would not fit (696 MiB) is made in 400 MiB
# (it peaks near 240 MiB), and refused when the dist runs whole (the test hook).
pooled=(--preset unit-pooled-w8 --batch-size 4096 --batches 1)
DYNEMB_MEMORY_LIMIT=400M "$DYNEMB" synth "${pooled[@]}" -o bydest.h5 >bydest.out 2>&1
expect_rc synth_by_destination_fits 0 $?
if has_test_hooks; then
  DYNEMB_SYNTH_BY_DESTINATION=off DYNEMB_MEMORY_LIMIT=400M "$DYNEMB" synth "${pooled[@]}" \
    -o whole.h5 >whole.out 2>&1
  expect_rc synth_whole_refused 2 $?
  has_text whole.out "synth: one batch needs about 696.00 MiB, more than the 400.00 MiB" synth_whole
  [[ ! -e whole.h5 ]] || fail "synth_whole: whole.h5 was created"
else
  echo "skipped synth_whole: no test hooks in this build (DYNEMB_SYNTH_BY_DESTINATION)"
fi
# replay refuses a batch that cannot fit, before replaying it; the reports are still written.
# (small.h5 holds every rank's local_embs, so it is replayed one destination rank at a time,
# in about 8 MiB.)
small_sha=$(sha small.h5)
DYNEMB_MEMORY_LIMIT=4M "$DYNEMB" replay small.h5 --json r.json >replay.out 2>&1
expect_rc replay_limit 2 $?
has_text replay.out "small.h5: replaying batch 0 needs about" replay_limit
has_text replay.out "more than the 4.00 MiB this machine has" replay_limit
grep -q '"trouble": "small.h5: replaying batch 0 needs about' r.json || fail "replay_limit: no trouble in the JSON report"
[[ "$(sha small.h5)" == "$small_sha" ]] || fail "replay_limit: the capture was changed"
DYNEMB_MEMORY_LIMIT=1G "$DYNEMB" replay small.h5 --quiet >/dev/null 2>&1
expect_rc replay_fits 0 $?
no_temps "$tmp" size

[[ $fails -eq 0 ]] && echo "size up front: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
