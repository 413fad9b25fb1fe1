#!/usr/bin/env bash
# `dynemb-dist validate` through the real binary: exit codes 0/2, the text of key messages
# with their file:line:col, the per-rank table, the JSON report, --help and usage errors.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC (source root), DYNEMB_PYTHON.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail


# run NAME WANT_RC ARGS...: runs the binary, stdout+stderr to $tmp/NAME.out, checks the status.
run() {
  local name=$1 want=$2
  shift 2
  "$DYNEMB" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then
    fail "$name: exit $rc, want $want ($*)"
    sed 's/^/    /' "$tmp/$name.out"
  fi
}
# has NAME TEXT: the output of NAME contains TEXT (a fixed string).
has() { grep -qF -- "$2" "$tmp/$1.out" || { fail "$1: output lacks: $2"; sed 's/^/    /' "$tmp/$1.out"; }; }
hasnt() { ! grep -qF -- "$2" "$tmp/$1.out" || fail "$1: output should not contain: $2"; }

# ---- every shipped plan validates (exit 0) and prints the per-rank table
for plan in "$DYNEMB_SRC"/plans/*.yaml; do
  name=$(basename "$plan" .yaml)
  run "$name" 0 validate "$plan"
  has "$name" "# per-rank shards"
  has "$name" "# status: ok"
  hasnt "$name" ": error:"
done
# unit-seq-w8: t3 (17 rows, blk=3) is [3,3,3,3,3,2,0,0]; rank 7 holds 1000-875 + 1001-882 +
# 2047-1792 rows of t0..t2 and none of t3.
run w8 0 validate "$DYNEMB_SRC/plans/unit-seq-w8.yaml"
has w8 "       f3     t3       continuous              17      128             3"
grep -qE '^ +7 +125 +64000 +119 +60928 +255 +130560 +0 +0 +499 +255488$' "$tmp/w8.out" ||
  fail "w8: rank 7 row of the per-rank table"
grep -qE '^ +5 .* 2 +1024 +509 +260608$' "$tmp/w8.out" || fail "w8: rank 5 row (t3 has 2 rows)"
has w8 "# status: ok (0 errors, 0 warnings, 0 notes), exit 0"
# A warning does not fail validation.
run criteo 0 validate "$DYNEMB_SRC/plans/ec-bench-criteo.yaml"
has criteo "ec-bench-criteo.yaml:13:21: warning: tables[0].num_embeddings: table 'criteo_cat' has 177944275 x 128 = 22776867200 elements (>= 2^31)"
grep -qE '^ +0 +22243035 +11388433920 +22243035 +11388433920$' "$tmp/criteo.out" ||
  fail "criteo: rank 0 holds 22243035 rows x 128 x 4 B"

write() { cat >"$tmp/$1.yaml"; }

# More than 6 tables: the per-rank table switches to one line per (rank, table).
# table_i: 5+i rows, D=4(i+1), W=2, blk=ceil((5+i)/2).
{
  printf 'format_version: 1\nworld_size: 2\nmodule: pooled\ntables:\n'
  for i in 0 1 2 3 4 5 6 7; do
    printf '  - {name: table_%d, num_embeddings: %d, embedding_dim: %d, features: [f%d]}\n' \
      "$i" $((5 + i)) $((4 * (i + 1))) "$i"
  done
} >"$tmp/eight.yaml"
run eight 0 validate "$tmp/eight.yaml"
grep -qE '^ +0 +table_0 +3 +48$' "$tmp/eight.out" || fail "eight: rank 0 table_0 = 3 rows, 48 B"
grep -qE '^ +1 +table_0 +2 +32$' "$tmp/eight.out" || fail "eight: rank 1 table_0 = 2 rows, 32 B"
grep -qE '^ +1 +total +32 +2656$' "$tmp/eight.out" || fail "eight: rank 1 total"
has eight "# tables 8  features 8  total bytes 5568 (5.44 KiB)"

# ---- broken plans: exit 2 and file:line:col of the token at fault
write bad_dim <<'EOF'
format_version: 1
world_size: 2
module: sequence
tables:
  - name: t0
    num_embeddings: 10
    embedding_dim: 2
    features: [f0]
  - name: t1
    num_embeddings: 6
    embedding_dim: 0
    features: [f1]
EOF
run bad_dim 2 validate "$tmp/bad_dim.yaml"
has bad_dim "$tmp/bad_dim.yaml:11:20: error: tables[1].embedding_dim: must be >= 1, got 0"
has bad_dim "# status: error (1 error, 0 warnings, 0 notes), exit 2"
hasnt bad_dim "# per-rank shards"

write typo <<'EOF'
format_version: 1
world_size: 2
module: sequence
tables:
  - name: t0
    num_embeddings: 10
    embeding_dim: 2
    features: [f0]
world_size: 4
EOF
run typo 2 validate "$tmp/typo.yaml"
has typo "typo.yaml:7:5: error: tables[0].embeding_dim: unknown key 'embeding_dim'; did you mean 'embedding_dim'?"
has typo "typo.yaml:5:5: error: tables[0]: missing required key 'embedding_dim'"
has typo "typo.yaml:9:1: error: duplicate key 'world_size' (first at line 2:1)"

write shards <<'EOF'
format_version: 1
world_size: 2
module: sequence
tables:
  - name: t1
    num_embeddings: 6
    embedding_dim: 2
    features: [f1]
    shards:
      - {rank: 0, row_offset: 0, rows: 4}
      - {rank: 1, row_offset: 4, rows: 2}
EOF
run shards 2 validate "$tmp/shards.yaml"
has shards "shards.yaml:11:40: error: tables[0].shards[1].rows: training routes ids [3,6) to rank 1 (blk=3), but shards give rank 1 rows [4,6)"

write syntax <<'EOF'
format_version: 1
world_size: [2
module: sequence
EOF
run syntax 2 validate "$tmp/syntax.yaml"
has syntax "syntax.yaml:3:7: error: YAML syntax error: end of sequence flow not found"

run missing 2 validate "$tmp/does-not-exist.yaml"
has missing "$tmp/does-not-exist.yaml: cannot read the plan: No such file or directory"

# ---- JSON report
run json_ok 0 validate "$DYNEMB_SRC/plans/unit-pooled-w8.yaml" --format json
"$DYNEMB_PYTHON" - "$tmp/json_ok.out" <<'EOF' || fail "json_ok: JSON content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema_version"] == "1.0.0", j["schema_version"]
assert j["command"] == "validate"
import hashlib, os
plan = os.path.join(os.environ["DYNEMB_SRC"], "plans", "unit-pooled-w8.yaml")
assert j["plan_sha256"] == hashlib.sha256(open(plan, "rb").read()).hexdigest(), j["plan_sha256"]
assert j["summary"] == {"status": "ok", "exit_code": 0, "errors": 0, "warnings": 0, "notes": 0}, j["summary"]
assert j["plan"]["world_size"] == 8 and j["plan"]["module"] == "pooled"
assert j["plan"]["sum_dim"] == 512
assert [f["block_size"] for f in j["plan"]["features"]] == [125, 126, 256, 3]
ranks = j["per_rank"]
assert len(ranks) == 8
assert [s["rows"] for s in ranks[7]["shards"]] == [125, 119, 255, 0]
assert ranks[7]["total_bytes"] == (125 + 119 + 255) * 128 * 4
EOF
run json_bad 2 validate "$tmp/bad_dim.yaml" --format json
"$DYNEMB_PYTHON" - "$tmp/json_bad.out" <<'EOF' || fail "json_bad: JSON content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema_version"] == "1.0.0"
assert j["summary"]["status"] == "error" and j["summary"]["exit_code"] == 2
[f] = j["findings"]
assert (f["line"], f["col"], f["severity"], f["path"]) == (11, 20, "error", "tables[1].embedding_dim"), f
assert f["message"] == "must be >= 1, got 0", f
assert j["plan"] is None
EOF

# ---- help and usage errors (CLI11's own codes never escape: 2)
run help 0 validate --help
has help "--capture"
has help "--format"
has help "Exit status:"
has help "  2  the plan has an error"
run noarg 2 validate
run badfmt 2 validate "$DYNEMB_SRC/plans/unit-seq-w2.yaml" --format xml
run badopt 2 validate "$DYNEMB_SRC/plans/unit-seq-w2.yaml" --frobnicate

# ---- --capture: the capture is checked against the plan without running anything
run capok 0 validate "$DYNEMB_SRC/plans/unit-seq-w2.yaml" --capture "$DYNEMB_SRC/fixtures/seq-w2.h5"
run capmissing 2 validate "$DYNEMB_SRC/plans/unit-seq-w2.yaml" --capture "$tmp/none.h5"
has capmissing "none.h5"
has capmissing "error:"
# A plan of another world size / module than the capture's: exit 2, naming what differs.
run capwrong 2 validate "$DYNEMB_SRC/plans/unit-pooled-w8.yaml" --capture "$DYNEMB_SRC/fixtures/seq-w2.h5"
has capwrong "seq-w2.h5"
has capwrong "world"

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all validate CLI checks passed"
