#!/usr/bin/env bash
# dynemb-dist load (docs/load.md): bad input is exit 2 with one clear line and no temporary
# left; --write-plans writes plans `validate` accepts; a generated roundrobin alternative of an
# oracle capture replays PASS with `replay --plan`; --world-size re-splits the global batch
# (the ids are the same in all, spread over more ranks).
set -uo pipefail
exe=${DYNEMB:?}
src=${DYNEMB_SRC:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, run, has, no_temps

cd "$tmp" || exit 1
"$exe" synth --preset unit-seq-w8 -o c.h5 --batches 2 --ids zipf:1.2 --store none >/dev/null ||
  fail "synth"

# ---- bad input: exit 2, the reason on one line, nothing left behind
run missing 2 load nope.h5
has missing 'nope\.h5.*No such file'
sed 's/\[f0\]/[g0]/' "$src/plans/unit-seq-w8.yaml" >other.yaml
run other_features 2 load c.h5 --plan other.yaml --json r1.json
has other_features "^other\.yaml:[0-9]+:[0-9]+: error: feature 0 is 'g0', the capture's plan \(c\.h5:/plan\) has 'f0'"
[[ ! -e r1.json ]] || fail "other_features: r1.json written"
sed 's/embedding_dim: 128/embedding_dim: 64/' "$src/plans/unit-seq-w8.yaml" >dims.yaml
run other_dims 2 load c.h5 --plan dims.yaml
has other_dims "^dims\.yaml:[0-9]+:[0-9]+: error: feature 'f0' has embedding_dim 64, 128 in the capture's plan"
sed 's/module: sequence/module: pooled/' "$src/plans/unit-seq-w8.yaml" >pooled.yaml
run other_module 2 load c.h5 --plan pooled.yaml
has other_module "^pooled\.yaml: error: module is pooled, the capture's plan \(c\.h5:/plan\) has sequence"
run ws0 2 load c.h5 --world-size 0
has ws0 '^dynemb-dist: error: --world-size 0: every world size must be >= 1'
run link0 2 load c.h5 --link-gbps 0
has link0 '^dynemb-dist: error: --link-gbps 0: must be a positive number'
run linkneg 2 load c.h5 --link-gbps -3
has linkneg '^dynemb-dist: error: --link-gbps -3: must be a positive number'
mkdir adir
run json_dir 2 load c.h5 --json adir
has json_dir 'adir'
touch afile
run json_under_file 2 load c.h5 --json afile/r.json
has json_under_file 'afile'
run json_is_capture 2 load c.h5 --json c.h5
has json_is_capture 'c\.h5'
no_temps "$tmp" "bad input"

# ---- the report itself
run report 0 load c.h5 --json r.json --link-gbps 25 --top-rows 3
has report '^# link +25 Gbit/s per rank and direction \(estimates only'
has report '^== plan captured \(W=8, sequence\)'
has report '^  imbalance \(max/mean\): ids [0-9.]+, unique rows'
has report '^  estimate \(critical path, all batches\): input dist'
"$py" - r.json <<'PY' || fail "r.json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "dynemb-dist/load" and j["schema_version"] == 1
assert j["link_gbps"] == 25 and j["num_batches"] == 2 and j["capture_world_size"] == 8
p = j["plans"][0]
assert p["name"] == "captured" and len(p["hottest_rows"]) == 3
assert p["plan_yaml"].startswith("#") and "world_size: 8" in p["plan_yaml"]
PY
no_temps "$tmp" "report"

# ---- the memory budget: a batch that cannot fit is refused before it is read (nothing
# written); one that fits alone is counted without reading ahead, to the same report
run mem_small 2 load c.h5 --max-memory 64K --json m1.json
has mem_small '^dynemb-dist: error: c\.h5: batch 0: counting its KJTs needs about [0-9.]+ KiB, more than the 64\.00 KiB this run may use \(--max-memory\)'
[[ ! -e m1.json ]] || fail "mem_small: m1.json written"
DYNEMB_MEMORY_LIMIT=64K run mem_env 2 load c.h5
has mem_env 'more than the 64\.00 KiB this run may use \(the machine.s usable memory, DYNEMB_MEMORY_LIMIT\)'
run mem_bad 2 load c.h5 --max-memory lots
has mem_bad "^dynemb-dist: error: --max-memory 'lots': not a size"
need=$(sed -n 's/.*needs about \([0-9.]*\) KiB.*/\1/p' mem_small.out | head -1)
one=$(awk -v n="$need" 'BEGIN { printf "%dK", n * 1.5 }')  # one batch fits, two do not
run mem_in_turn 0 load c.h5 --max-memory "$one" --json m2.json --link-gbps 25 --top-rows 3
cmp -s <(grep -v '"tool"' r.json) <(grep -v '"tool"' m2.json) ||
  fail "mem_in_turn: the report read in turn differs from the one read ahead"
no_temps "$tmp" "memory"

# A capture of no batches: every count 0, said in the header.
cp c.h5 z.h5
"$py" -c "
import h5py, numpy as np
with h5py.File('z.h5', 'r+') as f:
    del f['batches']; f.create_group('batches'); f.attrs['num_batches'] = np.int64(0)
" || fail "z.h5"
run zero 0 load z.h5 --alternatives dist-types
has zero '^# batches +0: the capture holds no batches, every count is 0'
has zero '^  roundrobin +8 +- +- '

# Above 64 ranks: the 8 with most ids and the 8 with fewest.
run w128 0 load c.h5 --world-size 128 -q
has w128 '^ +\.\.\. \(112 ranks elided: the table shows the 8 with most ids and the 8 with fewest\)'

# ---- generated alternatives
run ws3 2 load c.h5 --world-size 3
has ws3 "^dynemb-dist: error: plan 'w3' \(world size 3\), batch 0: re-split: the global batch of 1024 samples does not divide by world size 3"
run wp_file 2 load c.h5 --world-size 4 --write-plans afile
has wp_file '^dynemb-dist: error: --write-plans afile: not a directory'
run wp_alone 2 load c.h5 --write-plans pl
has wp_alone '^dynemb-dist: error: --write-plans writes generated alternatives'
no_temps "$tmp" "generated: bad input"

# An oracle capture with every optional part: its generated plans are valid, and the roundrobin
# one replays PASS (the oracle gives every row, so any routing checks out: docs/load.md).
"$exe" synth --preset unit-seq-w8 -o o.h5 --batches 2 --ids zipf:1.2 >/dev/null || fail "synth o.h5"
run gen 0 load o.h5 --alternatives dist-types --world-size 4,16 --balance-rows --write-plans pl \
  --json gen.json
for name in roundrobin hash_roundrobin w4 w16 balanced; do
  if [[ -f pl/$name.yaml ]]; then
    if "$exe" validate "pl/$name.yaml" >"$tmp/v.out" 2>&1; then
      ok "validate pl/$name.yaml"
    else
      fail "validate pl/$name.yaml"
      sed 's/^/    /' "$tmp/v.out" | head
    fi
  else
    fail "--write-plans: no pl/$name.yaml"
  fi
done
[[ ! -e pl/captured.yaml && ! -e pl/continuous.yaml ]] || fail "--write-plans wrote a plan it did not generate"
no_temps "$tmp" "--write-plans"
run replay_rr 0 replay o.h5 --plan pl/roundrobin.yaml
has replay_rr '^# result: PASS \(exit 0\)'
has gen '^  balanced +8 '
has gen '^  w16 +16 '
"$py" - gen.json pl <<'PY' || fail "gen.json"
import json, sys
j = json.load(open(sys.argv[1]))
names = [p["name"] for p in j["plans"]]
assert names == ["captured", "roundrobin", "hash_roundrobin", "w4", "w16", "balanced"], names
# Re-split: the same ids, over 4 and 16 ranks.
totals = {p["name"]: sum(p["total"]["ids"]) for p in j["plans"]}
assert len(set(totals.values())) == 1, totals
sizes = {p["name"]: len(p["total"]["ids"]) for p in j["plans"]}
assert sizes["w4"] == 4 and sizes["w16"] == 16 and sizes["captured"] == 8, sizes
# --write-plans wrote what the report holds.
for p in j["plans"][1:]:
    assert open(f"{sys.argv[2]}/{p['name']}.yaml").read() == p["plan_yaml"], p["name"]
# The balanced plan evens the ids of the captured one.
imb = {p["name"]: p["imbalance"]["ids"] for p in j["plans"]}
assert imb["balanced"] < imb["captured"], imb
PY

[[ $fails -eq 0 ]]
