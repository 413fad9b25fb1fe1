#!/usr/bin/env python3
"""The torch peer of `dynemb-dist bench`: the same stages on the same data, with the
torch ops a TorchRec user runs on one GPU.

  bucketize      torch composition: routing arithmetic (fmix64 for hash_roundrobin) + a stable
                 sort by (rank, dest, bag) (what a user without fbgemm writes)
  recat permute  index_select(local, 0, row map)         (fbgemm permute_2D_sparse_data's role)
  exchange       torch.cat of the W*W send slices         (all_to_all_single emulated on one GPU)
  unbucketize    index_select(recv, 0, perm)              (SequenceEmbeddingsAwaitable callback)
  sequence dist  the three steps above composed
  pooled reduce  torch.stack(parts).sum(0)                (reduce_scatter_v_sync's sum)

Input: the directory `dynemb-dist bench --export DIR` wrote (meta.json + .npy index data), so
both sides run on identical permutations. Times: torch.cuda.Event, warm-up, median.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch


QUEUE_AHEAD = 200000  # SM cycles spun before each timed repeat, as `dynemb-dist bench`


def timeit(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        # Same method as our bench: the GPU spins while the host enqueues the events and the
        # ops, so the events bracket GPU execution, not launch latency (0: include it).
        if QUEUE_AHEAD > 0:
            torch.cuda._sleep(QUEUE_AHEAD)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


M31 = (1 << 31) - 1


def i64(c):  # a uint64 constant as the int64 with the same bits
    return c - (1 << 64) if c >= (1 << 63) else c


def fmix64(k):
    # int64 tensors: >> is arithmetic, so mask to get the logical shift; * wraps mod 2^64.
    k = k ^ ((k >> 33) & M31)
    k = k * i64(0xFF51AFD7ED558CCD)
    k = k ^ ((k >> 33) & M31)
    k = k * i64(0xC4CEB9FE1A85EC53)
    k = k ^ ((k >> 33) & M31)
    return k


def main():
    global QUEUE_AHEAD
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--queue-ahead", type=int, default=QUEUE_AHEAD,
                    help="SM cycles spun before each timed repeat (0: time launch latency too)")
    ap.add_argument("--json")
    a = ap.parse_args()
    QUEUE_AHEAD = a.queue_ahead
    d = a.export_dir
    meta = json.load(open(os.path.join(d, "meta.json")))
    dev = torch.device("cuda")
    ld = lambda n: torch.from_numpy(np.load(os.path.join(d, n + ".npy"))).to(dev)
    W = int(meta["world_size"])
    stages = []
    notes = []

    n = 1 << 28  # copy ceiling as torch sees it: 1 GiB copy_, bytes read + written
    x = torch.full((n,), 0.5, device=dev)
    y = torch.empty_like(x)
    copy_us = timeit(lambda: y.copy_(x), a.iters)
    copy_gbps = 8.0 * n / (copy_us * 1e3)
    del x, y

    # ---- bucketize
    dist = meta.get("dist_type", 0)
    if os.path.exists(os.path.join(d, "bk_ids.npy")) and meta.get("dist_type_uniform") and (
        dist != 2 or (W & (W - 1)) == 0
    ):
        ids, lengths, bag_blk, rbo = ld("bk_ids"), ld("bk_lengths"), ld("bk_bag_blk"), ld("bk_rank_bag_off")
        L, N = lengths.numel(), ids.numel()
        nb = rbo[1:] - rbo[:-1]
        rank_of_bag = torch.repeat_interleave(torch.arange(W, device=dev), nb)
        j_of_bag = torch.arange(L, device=dev) - rbo[rank_of_bag]
        nl0_of_bag = W * rbo[rank_of_bag] + j_of_bag  # new_lengths index of (bucket 0, bag)
        stride_of_bag = nb[rank_of_bag]

        def bucketize():
            bag = torch.repeat_interleave(torch.arange(L, device=dev), lengths, output_size=N)
            if dist == 2:  # hash_roundrobin, W a power of two: unsigned % W == & (W-1)
                dest = fmix64(ids) & (W - 1)
                local = ids
            elif dist == 1:
                dest, local = ids % W, ids
            else:  # continuous, non-negative ids
                blk = bag_blk[bag]
                inr = ids < blk * W
                dest = torch.where(inr, ids // blk, ids % W)
                local = torch.where(inr, ids % blk, ids // W)
            key = nl0_of_bag[bag] + dest * stride_of_bag[bag]
            order = torch.sort(key, stable=True).indices
            new_values = local[order]
            new_lengths = torch.bincount(key, minlength=W * L)
            pos = torch.empty_like(order)
            pos[order] = torch.arange(N, device=dev)
            return new_values, new_lengths, pos

        us = timeit(bucketize, a.iters)
        _, _, pos = bucketize()
        ids_base = torch.cumsum(torch.nn.functional.pad(lengths, (1, 0)), 0)[rbo[:-1]]
        id_rank = torch.repeat_interleave(
            torch.arange(W, device=dev),
            torch.stack([lengths[rbo[r] : rbo[r + 1]].sum() for r in range(W)]),
        )
        ok = torch.equal(pos - ids_base[id_rank], ld("bk_perm"))
        notes.append("check: torch bucketize == dynemb perm: " + ("ok" if ok else "MISMATCH"))
        stages.append({"name": "bucketize (all ranks)", "time_us": us, "bytes": 8.0 * (3 * N + L + W * L)})

    # ---- sequence: three steps and the unbucketize sweep
    if meta.get("module") == "sequence" and "seq_dim" in meta:
        D, Rl, Ro = meta["seq_dim"], meta["seq_rows_local"], meta["seq_rows_out"]
        perm, recat, sl = ld("seq_perm_global"), ld("seq_recat_rows"), np.load(os.path.join(d, "seq_slices.npy"))
        slices = [(int(sl[2 * i]), int(sl[2 * i + 1])) for i in range(W * W)]
        local = torch.randn(Rl, D, device=dev)
        send = local.index_select(0, recat)
        recv = torch.cat([send[s : s + c] for s, c in slices])
        t_recat = timeit(lambda: local.index_select(0, recat), a.iters)
        t_exch = timeit(lambda: torch.cat([send[s : s + c] for s, c in slices]), a.iters)
        t_unb = timeit(lambda: recv.index_select(0, perm), a.iters)

        def three():
            s_ = local.index_select(0, recat)
            r_ = torch.cat([s_[s : s + c] for s, c in slices])
            return r_.index_select(0, perm)

        t_three = timeit(three, a.iters)
        row = 4.0 * D
        stages += [
            {"name": "recat permute", "time_us": t_recat, "bytes": 2 * row * Rl},
            {"name": "exchange", "time_us": t_exch, "bytes": 2 * row * Ro},
            {"name": "unbucketize", "time_us": t_unb, "bytes": 2 * row * Ro + 8.0 * Ro},
            {"name": "sequence dist (torch 3 steps)", "time_us": t_three, "bytes": 2 * row * Ro + 8.0 * Ro},
        ]
        bk = [s_ for s_ in stages if s_["name"] == "bucketize (all ranks)"]
        if bk:  # torch's composition of the whole GPU side: its bucketize, then its 3 steps
            stages.append({"name": "pipeline (bucketize + fused)",
                           "time_us": bk[0]["time_us"] + t_three,
                           "bytes": bk[0]["bytes"] + 2 * row * Ro + 8.0 * Ro,
                           "note": "torch: bucketize + 3 steps"})
        del local, send, recv
        for Dx in meta.get("dims", []):
            src = torch.randn(Ro, Dx, device=dev)
            us = timeit(lambda: src.index_select(0, perm), a.iters)
            stages.append({"name": f"unbucketize D={Dx} ({4 * Dx} B rows)", "time_us": us,
                           "bytes": 2.0 * 4 * Dx * Ro + 8.0 * Ro})
            del src

    # ---- pooled reduce
    if meta.get("module") == "pooled" and "pool_numel" in meta:
        numel = meta["pool_numel"]
        parts = [torch.randn(numel, device=dev) for _ in range(W)]
        us = timeit(lambda: torch.stack(parts).sum(0), a.iters)
        stages.append({"name": "pooled reduce", "time_us": us, "bytes": 4.0 * numel * (W + 1)})
        st = torch.stack(parts)
        us2 = timeit(lambda: st.sum(0), a.iters)
        stages.append({"name": "pooled reduce (pre-stacked sum)", "time_us": us2, "bytes": 4.0 * numel * (W + 1)})

    print(f"# torch peer {torch.__version__} on {torch.cuda.get_device_name()}: {meta.get('workload')}")
    print(f"# copy bandwidth (torch copy_, read+write): {copy_gbps:.1f} GB/s")
    for s in stages:
        s["gbps"] = s["bytes"] / (s["time_us"] * 1e3)
        s["pct_copy"] = 100.0 * s["gbps"] / copy_gbps
        print(f"  {s['name']:>34} {s['time_us']:>11.2f} us {s['gbps']:>9.1f} GB/s {s['pct_copy']:>6.1f} %")
    for n_ in notes:
        print("# " + n_)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"format": "dynemb-dist-peer", "version": 1, "torch": torch.__version__,
                       "workload": meta.get("workload"), "copy_gbps": copy_gbps, "stages": stages,
                       "notes": notes}, f, indent=2)
        os.replace(a.json + ".tmp", a.json)
    return 0 if all("MISMATCH" not in n_ for n_ in notes) else 1


if __name__ == "__main__":
    sys.exit(main())
