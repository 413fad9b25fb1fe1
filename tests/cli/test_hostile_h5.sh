#!/usr/bin/env bash
# Hostile HDF5 structure: attributes of another dataspace, type or size than the one integer
# or string the format says, chunks whose record (stored size, filter mask) or decoded size
# is not their dataset's, a filter the reader cannot undo. Each gives exit 2 with one line
# naming the file, the HDF5 path and the field or chunk, from validate --capture, replay (with
# every output asked for) and merge alike; never a crash, a read out of bounds reported as a
# data mismatch, a temporary left behind or an input changed. Where the odd form still holds
# one valid value (a uint64 or int32 seed, a one-element array), the file is accepted.
# Files are made with h5py from a `synth` capture at test time.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, no_temps
# plant NAME BASE PYTHON: $tmp/NAME.h5, a copy of $tmp/BASE.h5 changed by PYTHON (f: the
# h5py.File opened r+, np: numpy, h5py).
plant() {
  cp "$tmp/$2.h5" "$tmp/$1.h5" &&
    "$DYNEMB_PYTHON" - "$tmp/$1.h5" "$3" <<'EOF' || fail "plant $1 failed"
import sys, h5py, numpy as np
def vlen1():  # one variable-length sequence of int64
    a = np.empty(1, dtype=h5py.vlen_dtype(np.int64))
    a[0] = np.arange(3)
    return a
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}
# replay_refuses NAME REGEX: replay of $tmp/NAME.h5 with --json, --junit and --write-output
# exits 2 with a line matching REGEX; the input is unchanged, no temporary is left, the copy
# --write-output names is not written (the reports, which record the trouble, are).
replay_refuses() {
  local name=$1 re=$2 before out="$tmp/out-$1"
  before=$(sha "$tmp/$name.h5")
  mkdir -p "$out"
  run "$name.rep" 2 replay "$tmp/$name.h5" --quiet --json "$out/r.json" --junit "$out/r.xml" \
    --write-output "$out/w.h5"
  has "$name.rep" "$re"
  [[ "$(sha "$tmp/$name.h5")" == "$before" ]] || fail "$name: replay changed its input"
  [[ ! -e "$out/w.h5" ]] || fail "$name: --write-output written from a refused capture"
  [[ -s "$out/r.json" && -s "$out/r.xml" ]] || fail "$name: reports not written"
  no_temps "$out" "$name.rep"
}
# refused NAME REGEX: validate --capture and replay both refuse it (exit 2, REGEX).
refused() {
  run "$1.val" 2 validate "$tmp/plan.yaml" --capture "$tmp/$1.h5"
  has "$1.val" "$2"
  replay_refuses "$1" "$2"
}
# accepted NAME: validate --capture and replay pass (exit 0).
accepted() {
  run "$1.val" 0 validate "$tmp/plan.yaml" --capture "$tmp/$1.h5"
  run "$1.rep" 0 replay "$tmp/$1.h5" --quiet
}

"$DYNEMB" synth --preset unit-seq-w2 --batches 2 --seed 3 -o "$tmp/seq.h5" >/dev/null || fail "synth seq"
"$DYNEMB_PYTHON" -c 'import sys, h5py; open(sys.argv[2], "w").write(h5py.File(sys.argv[1], "r")["plan"][()].decode())' \
  "$tmp/seq.h5" "$tmp/plan.yaml" || fail "extract plan"
accepted seq

# ---- integer attributes of every other form: the one checked read refuses each, naming it
# (an array of 0, 2 or 16 elements, a float, a string, a compound, a vlen, no value; an
# unsigned value int64 cannot hold, printed as it is)
forms=(
  'arr0|np.zeros(0, np.int64)|int64 array of shape \[0\], want one integer'
  'arr2|np.array([1, 1], np.int64)|int64 array of shape \[2\], want one integer'
  'arr16|np.full(16, 0x4141414141414141, np.uint64)|uint64 array of shape \[16\], want one integer'
  'f64|np.float64(1)|float64, want one integer'
  'str|"1"|string, want one integer'
  'cmpd|np.array((1, 2), dtype=[("a", "<i8"), ("b", "<i8")])|compound, want one integer'
  'vlen|vlen1()|vlen array of shape \[1\], want one integer'
  'null|h5py.Empty("<i8")|null dataspace \(no value\), want one integer'
)
for attr in format_version world_size num_batches; do
  for form in "${forms[@]}"; do
    IFS='|' read -r tag value want <<<"$form"
    plant "$attr-$tag" seq "f.attrs[\"$attr\"] = $value"
    refused "$attr-$tag" "$attr-$tag\.h5:/: (error: )?attribute '$attr' is $want"
  done
  plant "$attr-u64" seq "f.attrs[\"$attr\"] = np.uint64(2**64 - 1)"
  refused "$attr-u64" "$attr-u64\.h5:/: (error: )?attribute '$attr' = 18446744073709551615 is out of range"
done

# ---- /oracle seed: 16 elements of 0x4141... overflowed the stack; 2 elements passed; every
# other form of the table is refused too
for form in "${forms[@]}"; do
  IFS='|' read -r tag value want <<<"$form"
  plant "seed-$tag" seq "f[\"oracle\"].attrs[\"seed\"] = $value"
  refused "seed-$tag" "seed-$tag\.h5:/oracle: (error: )?attribute 'seed' is $want"
done
# ... while the seed 3 as uint64, int32 or a one-element array is the seed 3
plant seed-u64 seq 'f["oracle"].attrs["seed"] = np.uint64(3)'
accepted seed-u64
plant seed-i32 seq 'f["oracle"].attrs["seed"] = np.int32(3)'
accepted seed-i32
plant seed-one seq 'f["oracle"].attrs["seed"] = np.array([3], np.int64)'
accepted seed-one
# ... and another seed is another oracle: a mismatch, not trouble
plant seed-other seq 'f["oracle"].attrs["seed"] = np.uint64(2**63 + 3)'
run seed-other.rep 1 replay "$tmp/seed-other.h5" --quiet
# the oracle's kind: one string
plant kind-arr seq 'f["oracle"].attrs["kind"] = np.array([b"hash64", b"hash64"])'
refused kind-arr "kind-arr\.h5:/oracle: (error: )?attribute 'kind': want a single string"
plant kind-int seq 'f["oracle"].attrs["kind"] = np.int64(1)'
refused kind-int "kind-int\.h5:/oracle: (error: )?attribute 'kind': int64, want a string"
# a group's integer attribute
plant vbpf-arr16 seq 'f["batches/0/rank1/ctx"].attrs["variable_batch_per_feature"] = np.full(16, 0x4141414141414141, np.uint64)'
replay_refuses vbpf-arr16 "vbpf-arr16\.h5:/batches/0/rank1/ctx: (error: )?attribute 'variable_batch_per_feature' is uint64 array of shape \[16\]"

# ---- chunks that are not their dataset's: each dataset kind rewritten in chunks of
# shuffle + deflate, then chunk 1 replaced through write_direct_chunk. Modes: raw (no filter
# applied: mask 3) or shuffled only (mask 2), 100 bytes; a filter mask naming a third filter;
# a valid deflate stream of half a chunk, or of a chunk and more; bytes that do not inflate.
# libhdf5's H5Dread read past such a chunk (valgrind: invalid read) and replay reported heap
# garbage as a data mismatch.
# rechunk NAME DATASET ROWS MODE: plants NAME; prints the bytes one chunk of ROWS rows holds.
rechunk() {
  cp "$tmp/seq.h5" "$tmp/$1.h5"
  "$DYNEMB_PYTHON" - "$tmp/$1.h5" "$2" "$3" "$4" <<'EOF' || fail "rechunk $1 failed"
import sys, zlib, h5py, numpy as np
path, name, rows, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with h5py.File(path, "r+") as f:
    v = f[name][()]
    attrs = dict(f[name].attrs)
    del f[name]
    chunk = (rows,) + v.shape[1:]
    d = f.create_dataset(name, data=v, chunks=chunk, compression="gzip", shuffle=True)
    for k, a in attrs.items():
        d.attrs[k] = a
    need = int(np.prod(chunk)) * v.dtype.itemsize
    off = (rows,) + (0,) * (v.ndim - 1)
    if mode == "raw":
        d.id.write_direct_chunk(off, b"\x41" * 100, 3)
    elif mode == "shuf":
        d.id.write_direct_chunk(off, b"\x41" * 100, 2)
    elif mode == "mask":
        d.id.write_direct_chunk(off, zlib.compress(b"\x41" * need), 4)
    elif mode == "short":
        d.id.write_direct_chunk(off, zlib.compress(b"\x41" * (need // 2)), 0)
    elif mode == "long":
        d.id.write_direct_chunk(off, zlib.compress(b"\x41" * (need + 64)), 0)
    elif mode == "junk":
        d.id.write_direct_chunk(off, bytes(range(256)) * 2, 0)
    print(need)
EOF
}
# dataset (1-D: "offset N"; 2-D: "offset [N, 0]"), rows per chunk
for spec in 'batches/1/rank0/values|16|16' 'batches/0/rank1/lengths|8|8' \
  'batches/1/rank1/ctx/sparse_features_recat|4|4' 'batches/0/rank0/ctx/unbucketize_permute|32|32' \
  'batches/1/rank0/output|16|\[16, 0\]' 'batches/0/rank1/local_embs|16|\[16, 0\]' \
  'batches/1/rank0/keys|2|2'; do
  IFS='|' read -r ds rows off <<<"$spec"
  for mode in raw shuf mask short long junk; do
    name="chunk-$(basename "$ds")-$mode"
    need=$(rechunk "$name" "$ds" "$rows" "$mode")
    where="$name\.h5:/$ds: (error: )?chunk 1 \(offset $off\): "
    case $mode in
      raw) refused "$name" "${where}stored 100 bytes, unfiltered chunk needs $need\b" ;;
      shuf) refused "$name" "${where}stored 100 bytes, a shuffled, not deflated chunk needs $need\b" ;;
      mask) refused "$name" "${where}filter mask 0x4 skips filters the dataset does not have" ;;
      # decoded sizes are checked where the data is read (replay reads it all)
      short) replay_refuses "$name" "${where}deflate stream decodes to $((need / 2)) bytes, chunk needs $need\b" ;;
      long) replay_refuses "$name" "${where}deflate stream decodes to more than the $need bytes" ;;
      junk) replay_refuses "$name" "${where}stored 512 bytes that are not a valid deflate stream" ;;
    esac
  done
done
# the same chunks, rewritten intact, read as before
rechunk chunk-intact batches/1/rank0/output 16 none >/dev/null
rechunk chunk-intact2 batches/1/rank0/values 16 none >/dev/null
accepted chunk-intact
accepted chunk-intact2

# ---- a filter this build cannot decode (h5py's lzf): named with its dataset, not as
# libhdf5's "can't open directory .../plugins"
plant lzf seq 'v = f["batches/0/rank1/output"][()]; del f["batches/0/rank1/output"]; f.create_dataset("batches/0/rank1/output", data=v, chunks=(64, 128), compression="lzf")'
refused lzf "lzf\.h5:/batches/0/rank1/output: (error: )?filter lzf \(id 32000\) cannot be decoded"
# ... and one libhdf5 has but whose chunks this reader cannot check before libhdf5 decodes
# them (libhdf5 1.10's fletcher32 reads out of bounds on a short chunk)
plant fletcher seq 'v = f["batches/1/rank0/values"][()]; del f["batches/1/rank0/values"]; f.create_dataset("batches/1/rank0/values", data=v, chunks=(16,), fletcher32=True)'
refused fletcher "fletcher\.h5:/batches/1/rank0/values: (error: )?filter fletcher32 \(id 3\) is not read by dynemb-dist"

# ---- merge: the per-rank files of seq.h5, one of them changed; merge exits 2 naming the
# per-rank file and the field, leaves neither OUT nor its temporary, changes no input
split_ranks "$tmp/seq.h5" "$tmp/rank" || fail "split seq.h5 into per-rank files"
mkdir -p "$tmp/m"
run merge-ok 0 merge "$tmp/rank0.h5" "$tmp/rank1.h5" -o "$tmp/m/ok.h5"
r0=$(sha "$tmp/rank0.h5")
# merge_refuses NAME PYTHON REGEX: rank 1's file changed by PYTHON is refused.
merge_refuses() {
  plant "$1" rank1 "$2"
  local before
  before=$(sha "$tmp/$1.h5")
  run "$1.merge" 2 merge "$tmp/rank0.h5" "$tmp/$1.h5" -o "$tmp/m/$1.h5"
  has "$1.merge" "$3"
  [[ ! -e "$tmp/m/$1.h5" ]] || fail "$1: merge wrote OUT"
  no_temps "$tmp/m" "$1.merge"
  [[ "$(sha "$tmp/$1.h5")" == "$before" && "$(sha "$tmp/rank0.h5")" == "$r0" ]] ||
    fail "$1: merge changed an input"
}
merge_refuses m-seed16 'f["oracle"].attrs["seed"] = np.full(16, 0x4141414141414141, np.uint64)' \
  "m-seed16\.h5:/oracle: attribute 'seed' is uint64 array of shape \[16\], want one integer"
merge_refuses m-seed2 'f["oracle"].attrs["seed"] = np.array([3, 3], np.int64)' \
  "m-seed2\.h5:/oracle: attribute 'seed' is int64 array of shape \[2\], want one integer"
merge_refuses m-rank-arr 'f.attrs["rank"] = np.array([1, 1], np.int64)' \
  "m-rank-arr\.h5:/: attribute 'rank' is int64 array of shape \[2\], want one integer"
merge_refuses m-rank-str 'f.attrs["rank"] = "1"' "m-rank-str\.h5:/: attribute 'rank' is string, want one integer"
merge_refuses m-rank-f64 'f.attrs["rank"] = np.float64(1)' "m-rank-f64\.h5:/: attribute 'rank' is float64, want one integer"
merge_refuses m-rank-null 'f.attrs["rank"] = h5py.Empty("<i8")' \
  "m-rank-null\.h5:/: attribute 'rank' is null dataspace \(no value\), want one integer"
merge_refuses m-rank-u64 'f.attrs["rank"] = np.uint64(2**63 + 5)' \
  "m-rank-u64\.h5:/: attribute 'rank' = 9223372036854775813 is out of range"
merge_refuses m-ws-arr16 'f.attrs["world_size"] = np.full(16, 0x4141414141414141, np.uint64)' \
  "m-ws-arr16\.h5:/: attribute 'world_size' is uint64 array of shape \[16\], want one integer"
merge_refuses m-nb-str 'f.attrs["num_batches"] = "2"' "m-nb-str\.h5:/: attribute 'num_batches' is string, want one integer"
merge_refuses m-fv-arr0 'f.attrs["format_version"] = np.zeros(0, np.int64)' \
  "m-fv-arr0\.h5:/: attribute 'format_version' is int64 array of shape \[0\], want one integer"
merge_refuses m-kind-arr 'f["oracle"].attrs["kind"] = np.array([b"hash64", b"hash64"])' \
  "m-kind-arr\.h5:/oracle: attribute 'kind': want a single string"
merge_refuses m-format-int 'f.attrs["format"] = np.int64(3)' "m-format-int\.h5:/: attribute 'format': int64, want a string"
# ... chunks and filters, named in the per-rank file (not the merge's temporary)
merge_refuses m-lzf 'v = f["batches/0/rank1/output"][()]; del f["batches/0/rank1/output"]; f.create_dataset("batches/0/rank1/output", data=v, chunks=(64, 128), compression="lzf")' \
  "m-lzf\.h5:/batches/0/rank1/output: filter lzf \(id 32000\) cannot be decoded"
merge_refuses m-chunk-raw 'v = f["batches/1/rank1/values"][()]; del f["batches/1/rank1/values"]; d = f.create_dataset("batches/1/rank1/values", data=v, chunks=(16,), compression="gzip", shuffle=True); d.id.write_direct_chunk((16,), b"A" * 100, 3)' \
  "m-chunk-raw\.h5:/batches/1/rank1/values: chunk 1 \(offset 16\): stored 100 bytes, unfiltered chunk needs 128\b"
merge_refuses m-chunk-short 'import zlib; v = f["batches/1/rank1/values"][()]; del f["batches/1/rank1/values"]; d = f.create_dataset("batches/1/rank1/values", data=v, chunks=(16,), compression="gzip", shuffle=True); d.id.write_direct_chunk((16,), zlib.compress(b"A" * 100), 0)' \
  "m-chunk-short\.h5:/batches/1/rank1/values: chunk 1 \(offset 16\): deflate stream decodes to 100 bytes, chunk needs 128\b"

no_temps "$tmp" "all cases"
[[ $fails -eq 0 ]] && echo "all hostile HDF5 cases handled" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
