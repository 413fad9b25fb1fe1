#!/usr/bin/env bash
# The writer compresses large chunked datasets on every core (lib/capture/h5chunks): the file is
# byte for byte the one H5Dwrite's deflate filter writes (DYNEMB_H5_SERIAL_WRITE=1 forces that
# path), it holds datasets of several chunks (so the chunk path ran), and it replays clean.
# Env: DYNEMB (binary), DYNEMB_PYTHON (python3 with h5py + numpy).
set -uo pipefail
exe=${DYNEMB:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
need_test_hooks

# Sequence (fp32 rows of D=128, edge chunks of 2048 x 128), then mixed dims and dtypes.
check() {
  local name=$1
  shift
  DYNEMB_H5_SERIAL_WRITE=1 "$exe" synth "$@" -o "$tmp/$name-serial.h5" >/dev/null ||
    fail "$name: synth with DYNEMB_H5_SERIAL_WRITE=1"
  "$exe" synth "$@" -o "$tmp/$name-chunks.h5" >/dev/null || fail "$name: synth"
  if cmp -s "$tmp/$name-serial.h5" "$tmp/$name-chunks.h5"; then
    ok "$name: the chunk path writes H5Dwrite's bytes ($(stat -c %s "$tmp/$name-chunks.h5") bytes)"
  else
    fail "$name: files differ: $(cmp "$tmp/$name-serial.h5" "$tmp/$name-chunks.h5" 2>&1)"
  fi
  "$exe" replay "$tmp/$name-chunks.h5" --quiet >/dev/null && ok "$name: replays clean" ||
    fail "$name: replay exit $?"
}
check seq --preset unit-seq-w8 --batch-size 64 --hotness 0..64 --batches 1
check mixed --preset pooled-mean-mixed-dims --store ctx,local_embs,output,module_output

# The sequence file has datasets of several deflated chunks, so the comparison above is
# one of the chunk path (a file of single-chunk datasets would prove little).
if "$py" -c "import h5py" 2>/dev/null; then
  "$py" - "$tmp/seq-chunks.h5" <<'PY' && ok "seq: 16 datasets of several deflated chunks" || fail "seq: chunk layout"
import sys, h5py
multi = []
with h5py.File(sys.argv[1], "r") as f:
    def visit(name, o):
        if isinstance(o, h5py.Dataset) and o.chunks and o.id.get_num_chunks() > 1:
            assert o.compression == "gzip" and o.shuffle, name
            for i in range(o.id.get_num_chunks()):
                assert o.id.get_chunk_info(i).filter_mask == 0, (name, i)
            multi.append(name)
    f.visititems(visit)
assert len(multi) == 16, multi  # local_embs and output of 8 ranks
PY
else
  echo "skip: chunk layout check ($py has no h5py)"
fi
[[ $fails -eq 0 ]]
