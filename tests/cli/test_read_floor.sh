#!/usr/bin/env bash
# dynemb-dist bench CAPTURE --read-floor (docs/cli.md): every dataset of the file read and
# inflated, its counts equal to h5py's own of the same file (datasets, element count x element
# size, get_storage_size), also with a dataset under two hard links (read once) and /plan as a
# variable-length string (as the dynemb_capture package writes it); a damaged chunk is exit 2
# naming the dataset; a missing file exit 2 naming it; options it does not take are refused.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}"
py=${DYNEMB_PYTHON:-/usr/bin/python3}
"$py" -c 'import h5py, numpy' 2>/dev/null || { echo "SKIP: no h5py for $py"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, run, has

run synth 0 synth --preset unit-seq-w8 --batches 2 -o "$tmp/x.h5"

# floor_matches NAME: bench $tmp/NAME.h5 --read-floor --json, the JSON against h5py's count.
floor_matches() {
  run "$1.floor" 0 bench "$tmp/$1.h5" --read-floor --json "$tmp/$1.json"
  has "$1.floor" "^read floor: .*$1\.h5: [0-9]+ datasets, [0-9.]+ GB logical, [0-9.]+ GB stored, [0-9.]+ s, [0-9.]+ GB/s logical \(inflate: .+, [0-9]+ threads\)$"
  "$py" - "$tmp/$1.h5" "$tmp/$1.json" <<'PY' && ok "$1: JSON equals h5py's count" || fail "$1: JSON against h5py"
import json, sys, h5py
j = json.load(open(sys.argv[2]))
count = logical = stored = largest = 0
with h5py.File(sys.argv[1], "r") as f:
    def visit(name, obj):
        global count, logical, stored, largest
        if isinstance(obj, h5py.Dataset):
            count += 1
            logical += obj.size * obj.dtype.itemsize
            stored += obj.id.get_storage_size()
            if obj.dtype.kind != "O":
                largest = max(largest, obj.size * obj.dtype.itemsize)
    f.visititems(visit)
assert count > 100, count  # the walk found the batches' datasets, not just /plan
want = {"datasets": count, "logical_bytes": logical, "stored_bytes": stored,
        "largest_dataset_bytes": largest}
got = {k: j[k] for k in want}
assert got == want, (got, want)
assert all(type(j[k]) is int for k in want), j
assert j["report"] == "bench-read-floor" and j["tool"]["name"] == "dynemb-dist", j
assert j["seconds"] > 0 and j["threads"] >= 1 and j["inflate"], j
assert abs(j["logical_gbps"] - logical / 1e9 / j["seconds"]) < 1e-6 * j["logical_gbps"], j
PY
}
floor_matches x

# the same dataset under two hard links: one dataset (h5py visits each object once); /plan a
# variable-length string (read by the string reader, 8 bytes per element as h5py counts it)
cp "$tmp/x.h5" "$tmp/links.h5"
"$py" - "$tmp/links.h5" <<'PY' || fail "plant links failed"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["again"] = f["batches/0/rank0/values"]
    plan = f["plan"][()].decode()
    del f["plan"]
    f.create_dataset("plan", data=plan)
    assert h5py.check_string_dtype(f["plan"].dtype).length is None  # variable length
PY
floor_matches links
"$py" - "$tmp/x.json" "$tmp/links.json" <<'PY' && ok "a second hard link adds no dataset" || fail "links: dataset count"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["datasets"] == a["datasets"], (a["datasets"], b["datasets"])
PY

# one chunk that does not inflate (as tests/cli/test_hostile_h5.sh plants them): exit 2 naming
# the file, the dataset and the chunk; the JSON is not written
cp "$tmp/x.h5" "$tmp/bad.h5"
"$py" - "$tmp/bad.h5" <<'PY' || fail "plant bad failed"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    name = "batches/1/rank0/values"
    v = f[name][()]
    attrs = dict(f[name].attrs)
    del f[name]
    d = f.create_dataset(name, data=v, chunks=(16,), compression="gzip", shuffle=True)
    for k, a in attrs.items():
        d.attrs[k] = a
    d.id.write_direct_chunk((16,), bytes(range(256)) * 2, 0)
PY
run bad.floor 2 bench "$tmp/bad.h5" --read-floor --json "$tmp/bad.json"
has bad.floor "bad\.h5:/batches/1/rank0/values: (error: )?chunk 1 \(offset 16\): stored 512 bytes that are not a valid deflate stream"
[[ -e $tmp/bad.json ]] && fail "bad: JSON written" || ok "bad: no JSON"
no_temps "$tmp" "bad"

run missing.floor 2 bench "$tmp/missing.h5" --read-floor
has missing.floor "missing\.h5:/: (error: )?cannot open file: No such file or directory"

# options that do not apply: a usage error naming the option, nothing run
run opt-iters 2 bench "$tmp/x.h5" --read-floor --iters 20
has opt-iters "--read-floor: --iters does not apply"
run opt-backend 2 bench "$tmp/x.h5" --read-floor --backend cpu
has opt-backend "--read-floor: --backend does not apply"
run opt-preset 2 bench --read-floor --preset unit-seq-w2
has opt-preset "--read-floor: --preset does not apply"
run opt-export 2 bench "$tmp/x.h5" --read-floor --export "$tmp/exp"
has opt-export "--read-floor: --export does not apply"
[[ -e $tmp/exp ]] && fail "--export: directory left behind" || ok "--export: no directory"
run opt-none 2 bench --read-floor
has opt-none "--read-floor: give a CAPTURE.h5"

[[ $fails -eq 0 ]]
