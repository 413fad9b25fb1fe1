#!/usr/bin/env python3
"""Runs the real FBGEMM CPU ops on the worked examples of docs/semantics.md and checks the
page's numbers (§3.2 routing incl. out-of-range and negative ids, §3.4 bucketize, §3.5 VBE
bucketize, §4.3 recat and its per-bag expansion). Exit 0 when every number agrees.
Needs the venv of tools/requirements-torchrec.txt:
  /opt/torchrec-venv/bin/python tools/torchrec_spec_ops.py
"""
import logging
import sys

logging.disable(logging.WARNING)
import torch  # noqa: E402
import fbgemm_gpu  # noqa: E402,F401  (registers torch.ops.fbgemm)
from torchrec.distributed.dist_data import _get_recat  # noqa: E402

fails = 0


def check(got, want, what):
    global fails
    ok = got == want
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {what}: {got}" + ("" if ok else f" (spec: {want})"))


def bucketize(lengths, values, blk, W, sequence=True, bpf=None):
    L = torch.tensor(lengths, dtype=torch.int64)
    V = torch.tensor(values, dtype=torch.int64)
    kw = {}
    if bpf is not None:
        kw = dict(batch_size_per_feature=torch.tensor(bpf, dtype=torch.int64), max_B=max(bpf))
    nl, nv, _, _, perm = torch.ops.fbgemm.block_bucketize_sparse_features(
        L, V, False, sequence, torch.tensor(blk, dtype=torch.int64), W, None, **kw)
    return nl.tolist(), nv.tolist(), (perm.tolist() if perm is not None else None)


# §3.4 worked example, W=2, F=2, B=2, blk = [5, 3]
nl, nv, p = bucketize([2, 1, 0, 3], [1, 7, 5, 4, 0, 2], [5, 3], 2)
check(nl, [1, 0, 0, 2, 1, 1, 0, 1], "§3.4 rank0 new_lengths")
check(nv, [1, 0, 2, 2, 0, 1], "§3.4 rank0 new_values")
check(p, [0, 3, 4, 5, 1, 2], "§3.4 rank0 unbucketize_permute")
nl, nv, p = bucketize([1, 2, 1, 0], [9, 0, 3, 5], [5, 3], 2)
check((nl, nv, p), ([0, 2, 0, 0, 1, 0, 1, 0], [0, 3, 4, 2], [2, 0, 1, 3]), "§3.4 rank1")

# §3.2 routing, N_rows=10, W=4, blk=3: one bag per id, F=1
ids = [10, 11, 12, 13, -1, -2]
nl, nv, _ = bucketize([1] * len(ids), ids, [3], 4)
dest = [next(d for d in range(4) if nl[d * len(ids) + j]) for j in range(len(ids))]
local = {}
for d in range(4):  # new_values are bucket-major
    for j in range(len(ids)):
        if nl[d * len(ids) + j]:
            local[j] = None
order = [j for d in range(4) for j in range(len(ids)) if nl[d * len(ids) + j]]
for pos, j in enumerate(order):
    local[j] = nv[pos]
check(list(zip(ids, dest, [local[j] for j in range(len(ids))])),
      [(10, 3, 1), (11, 3, 2), (12, 0, 3), (13, 1, 3), (-1, 3, 4611686018427387903),
       (-2, 2, 4611686018427387903)], "§3.2 (id, dest, local) for N=10 W=4")

# §3.5 VBE bucketize: r0 batch_size_per_feature=[2,1], r1 [3,1], blk [5,3], W=2
nl, nv, _ = bucketize([1, 1, 1], [1, 6, 4], [5, 3], 2, sequence=False, bpf=[2, 1])
check((nl, nv), ([1, 0, 0, 0, 1, 1], [1, 1, 1]), "§3.5 VBE bucketize r0")
nl, nv, _ = bucketize([1, 0, 1, 2], [0, 8, 2, 3], [5, 3], 2, sequence=False, bpf=[3, 1])
check((nl, nv), ([1, 0, 0, 1, 0, 0, 1, 1], [0, 2, 3, 0]), "§3.5 VBE bucketize r1")

# §4.3 recat
check(_get_recat(2, 2, stagger=1).tolist(), [0, 2, 1, 3], "§4.3 recat F=2 W=2")
check(_get_recat(2, 4, stagger=1).tolist(), [0, 2, 4, 6, 1, 3, 5, 7], "§4.3 recat F=2 W=4")
recat = _get_recat(2, 2, stagger=1)
in_sizes = torch.tensor([2, 2, 3, 3], dtype=torch.int32)           # (s, f) segments: B_s repeated F times
out_sizes = in_sizes[recat]
in_off = torch.ops.fbgemm.asynchronous_complete_cumsum(in_sizes)
out_off = torch.ops.fbgemm.asynchronous_complete_cumsum(out_sizes)
exp = torch.ops.fbgemm.expand_into_jagged_permute(recat, in_off, out_off, int(out_sizes.sum()))
check(exp.tolist(), [0, 1, 4, 5, 6, 2, 3, 7, 8, 9], "§4.3 expanded recat B=[2,3]")
inv = torch.ops.fbgemm.invert_permute(exp)
check(inv.tolist(), [0, 1, 5, 6, 2, 3, 4, 7, 8, 9], "§6.2 forward (inverted) recat B=[2,3]")

print(f"{'all spec numbers agree with FBGEMM' if not fails else f'{fails} disagreement(s)'}")
sys.exit(1 if fails else 0)
