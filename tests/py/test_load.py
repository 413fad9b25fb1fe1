"""`dynemb-dist load` against an independent numpy computation (docs/load-report.md).

Every capture's KJTs are read with h5py and routed with the rules of docs/semantics.md §3.2
and §10.2 written here in numpy (fmix64 included); per plan and rank: ids, distinct rows
per batch summed, ids per table and both dists' byte matrices must equal the --json report
exactly. Captures: synth presets with skewed ids (sequence and pooled, VBE, weighted, int32)
and the real TorchRec fixtures. Then a capture whose table's ids all fall in one block: the
captured continuous plan puts them all on one rank (imbalance exactly W), a roundrobin plan
spreads them, and the text report says so.
Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC; run by pytest.
"""

import glob
import json
import os
import subprocess

import h5py
import numpy as np
import pytest
import yaml

DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def run(*args):
    return subprocess.run([DYNEMB, *map(str, args)], capture_output=True, text=True)


def fmix64(k):
    k = k.astype(np.uint64)
    with np.errstate(over="ignore"):
        k ^= k >> np.uint64(33)
        k *= np.uint64(0xFF51AFD7ED558CCD)
        k ^= k >> np.uint64(33)
        k *= np.uint64(0xC4CEB9FE1A85EC53)
        k ^= k >> np.uint64(33)
    return k


def plan_info(text):
    """Features in sharding order: (table index, D_f), and the tables."""
    p = yaml.safe_load(text)
    feats = []
    for t, tab in enumerate(p["tables"]):
        for _ in tab["features"]:
            feats.append((t, int(tab["embedding_dim"])))
    return p, feats


def unsigned(values, i32):
    if i32:
        return values.astype(np.int32).view(np.uint32).astype(np.uint64)
    return values.astype(np.int64).view(np.uint64)


def route(x, tab, W, i32):
    dist = tab.get("dist_type", "continuous")
    W64 = np.uint64(W)
    if dist == "roundrobin":
        return (x % W64).astype(np.int64)
    if dist == "hash_roundrobin":
        h = fmix64(x)
        if i32:
            h &= np.uint64(0xFFFFFFFF)
        return (h % W64).astype(np.int64)
    n = int(tab["num_embeddings"])
    blk = (n + W - 1) // W
    G = blk * W
    if i32:
        G &= 0xFFFFFFFF
    d = np.where(x < np.uint64(G), x // np.uint64(max(blk, 1)), x % W64)
    return d.astype(np.int64)


def read_ranks(f, k, W, F):
    """Batch k's KJTs: per rank (lengths, values, weighted, B_f list or None when not VBE)."""
    out = []
    for s in range(W):
        g = f[f"batches/{k}/rank{s}"]
        lengths, values = g["lengths"][()], g["values"][()]
        Bf = list(g["stride_per_feature"][()]) if "stride_per_feature" in g else None
        out.append((lengths, values, "weights" in g, Bf))
    return out


def resplit(ranks, F, W2):
    """The global batch over W2 ranks: each feature's bags, concatenated in rank order, cut in
    W2 consecutive runs (B / W2 each; VBE: as even as possible, the first ranks one more)."""
    vbe = any(r[3] is not None for r in ranks)
    feats = []  # per feature: (bag lengths, values) of the global batch
    for f in range(F):
        ls, vs = [], []
        for lengths, values, _, Bf in ranks:
            B = Bf if Bf is not None else [len(lengths) // F] * F
            b0 = sum(B[:f])
            bl = lengths[b0:b0 + B[f]]
            v0 = int(lengths[:b0].sum())
            ls.append(bl)
            vs.append(values[v0:v0 + int(bl.sum())])
        feats.append((np.concatenate(ls), np.concatenate(vs)))
    out = [([], [], ranks[0][2], [] if vbe else None) for _ in range(W2)]
    for bl, vals in feats:
        n = len(bl)
        sizes = [n // W2 + (1 if r < n % W2 else 0) for r in range(W2)]
        pos, vpos = 0, 0
        for r in range(W2):
            run = bl[pos:pos + sizes[r]]
            out[r][0].append(run)
            out[r][1].append(vals[vpos:vpos + int(run.sum())])
            if vbe:
                out[r][3].append(sizes[r])
            pos += sizes[r]
            vpos += int(run.sum())
    dt_l, dt_v = ranks[0][0].dtype, ranks[0][1].dtype
    return [(np.concatenate(l).astype(dt_l), np.concatenate(v).astype(dt_v), w, b)
            for l, v, w, b in out]


def reference(path, plan_text):
    """The report's numbers for `plan_text` (re-split when its world size is not the capture's)."""
    p, feats = plan_info(plan_text)
    W, T, F = int(p["world_size"]), len(p["tables"]), len(feats)
    sequence = p["module"] == "sequence"
    dt = p["tables"][0].get("data_type", "fp32")
    cp = p.get("comm_precision", "fp32")
    elem = 2 if cp != "fp32" else (4 if dt == "fp32" else 2)
    ids = np.zeros(W, np.int64)
    uniq = np.zeros(W, np.int64)
    table_ids = np.zeros((T, W), np.int64)
    inp = np.zeros((W, W), np.int64)
    out = np.zeros((W, W), np.int64)
    with h5py.File(path, "r") as f:
        Wc = int(f.attrs["world_size"])
        for k in range(int(f.attrs["num_batches"])):
            ranks = read_ranks(f, k, Wc, F)
            if W != Wc:
                ranks = resplit(ranks, F, W)
            rows = [set() for _ in range(W)]
            for s, (lengths, values, weighted, Bf_or_none) in enumerate(ranks):
                i32 = values.dtype == np.int32
                vbe = Bf_or_none is not None
                Bf = Bf_or_none if vbe else [len(lengths) // F] * F
                x = unsigned(values, i32)
                dest = np.zeros(len(values), np.int64)
                tab_of = np.zeros(len(values), np.int64)
                pos, bag = 0, 0
                for fi, (t, _) in enumerate(feats):
                    n = int(lengths[bag:bag + Bf[fi]].sum())
                    bag += Bf[fi]
                    dest[pos:pos + n] = route(x[pos:pos + n], p["tables"][t], W, i32)
                    tab_of[pos:pos + n] = t
                    pos += n
                sd = np.bincount(dest, minlength=W)
                ids += sd
                for t in range(T):
                    table_ids[t] += np.bincount(dest[tab_of == t], minlength=W)
                for d in range(W):
                    rows[d].update(zip(tab_of[dest == d].tolist(), x[dest == d].tolist()))
                bags = F * max(Bf) if (sequence and vbe) else len(lengths)
                per = bags * lengths.dtype.itemsize + sd * values.dtype.itemsize
                if weighted:
                    per = per + sd * 4
                if vbe and not sequence:
                    per = per + F * 8
                inp[s, :] += per
                if sequence:
                    out[:, s] += sd * feats[0][1] * elem
                else:
                    out[:, s] += sum(int(Bf[fi]) * D for fi, (_, D) in enumerate(feats)) * elem
            uniq += np.array([len(r) for r in rows], np.int64)
    return dict(ids=ids, unique=uniq, table_ids=table_ids, inp=inp, out=out)


def check_plan(jp, ref):
    assert jp["total"]["ids"] == ref["ids"].tolist()
    assert jp["total"]["unique_rows"] == ref["unique"].tolist()
    assert [t["ids"] for t in jp["tables"]] == ref["table_ids"].tolist()
    assert jp["input_dist"]["bytes"] == ref["inp"].tolist()
    assert jp["output_dist"]["bytes"] == ref["out"].tolist()
    off = ~np.eye(len(ref["ids"]), dtype=bool)
    assert jp["input_dist"]["sent"] == (ref["inp"] * off).sum(axis=1).tolist()
    assert jp["output_dist"]["received"] == (ref["out"] * off).sum(axis=0).tolist()
    # Per-batch columns add up to the totals.
    assert np.sum([b["ids"] for b in jp["batches"]], axis=0).tolist() == ref["ids"].tolist()
    hot = int(np.argmax(ref["ids"]))
    assert jp["hottest_rank"] == hot
    assert jp["imbalance"]["ids"] == pytest.approx(ref["ids"].max() * len(ref["ids"]) / ref["ids"].sum())


def load_json(tmp_path, capture, *extra):
    out = tmp_path / "load.json"
    p = run("load", capture, "--json", out, "-q", *extra)
    assert p.returncode == 0, p.stderr
    j = json.loads(out.read_text())
    assert j["schema"] == "dynemb-dist/load" and j["schema_version"] == 1
    return j, p.stdout


def capture_plan_text(path):
    with h5py.File(path, "r") as f:
        v = f["plan"][()]
    return v.decode() if isinstance(v, bytes) else str(v)


SYNTH = [
    ("unit-seq-w8", ["--ids", "zipf:1.2"]),
    ("unit-seq-w8", ["--ids", "zipf:1.2", "--vbe", "--index-type", "int32"]),
    ("unit-seq-w2", ["--weighted", "--batch-sizes", "8,3"]),
    ("mixed-dist-types", ["--ids", "zipf:1.1", "--index-type", "int32"]),
    ("mixed-dist-types", ["--ids", "zipf:1.1", "--vbe"]),
    ("unit-pooled-w8", ["--ids", "zipf:1.2"]),
    ("unit-pooled-w8", ["--ids", "zipf:1.2", "--vbe", "--weighted"]),
    ("odd-dims", ["--vbe", "--index-type", "int32"]),
    ("pooled-mean-mixed-dims", ["--weighted", "--oob-ids", "0.1"]),
]


@pytest.mark.parametrize("preset,args", SYNTH, ids=[f"{p}{''.join(a)}" for p, a in SYNTH])
def test_synth_matches_numpy(tmp_path, preset, args):
    cap = str(tmp_path / "c.h5")
    p = run("synth", "--preset", preset, "-o", cap, "--batches", 3, "--store", "none", *args)
    if p.returncode != 0 and "--oob-ids" in args:
        pytest.skip(p.stderr)
    assert p.returncode == 0, p.stderr
    text = capture_plan_text(cap)
    # An alternative: every table hash_roundrobin, the comm codec fp16.
    alt = yaml.safe_load(text)
    alt["comm_precision"] = "fp16"
    for t in alt["tables"]:
        t["dist_type"] = "hash_roundrobin"
        t.pop("shards", None)
    alt_path = tmp_path / "hashed.yaml"
    alt_path.write_text(yaml.safe_dump(alt, sort_keys=False))
    # Non-VBE global batches must divide: 11 samples (8 + 3) over 1 and 11 ranks.
    sizes = "1,11" if "8,3" in args else "2,16"
    j, _ = load_json(tmp_path, cap, "--plan", alt_path, "--alternatives", "dist-types",
                     "--world-size", sizes)
    names = [q["name"] for q in j["plans"]]
    want = ["w" + w for w in sizes.split(",")]
    assert names[:2] == ["captured", "hashed"] and names[-2:] == want, names
    check_plan(j["plans"][0], reference(cap, text))
    check_plan(j["plans"][1], reference(cap, alt_path.read_text()))
    # The generated ones (every dist_type the capture's plan does not use throughout, the
    # global batch re-split over 2 and 16 ranks), each under the plan its report holds.
    for q in j["plans"][2:]:
        check_plan(q, reference(cap, q["plan_yaml"]))


FIXTURES = sorted(glob.glob(os.path.join(SRC, "fixtures", "torchrec", "*.h5")))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[os.path.basename(f) for f in FIXTURES])
def test_torchrec_fixture_matches_numpy(tmp_path, fixture):
    j, _ = load_json(tmp_path, fixture)
    check_plan(j["plans"][0], reference(fixture, capture_plan_text(fixture)))


def test_hot_rows_exact_when_few(tmp_path):
    cap = str(tmp_path / "c.h5")
    assert run("synth", "--preset", "unit-seq-w2", "-o", cap, "--batches", 2, "--store",
               "none", "--ids", "zipf:1.3").returncode == 0
    j, _ = load_json(tmp_path, cap, "--top-rows", 5)
    p = j["plans"][0]
    _, feats = plan_info(capture_plan_text(cap))
    # unit-seq-w2's tables have far fewer rows than the summary's capacity: counts are exact.
    counts = {}
    with h5py.File(cap, "r") as f:
        for k in range(2):
            for s in range(2):
                g = f[f"batches/{k}/rank{s}"]
                lengths, values = g["lengths"][()], g["values"][()]
                F = len(feats)
                B = len(lengths) // F
                pos = 0
                for fi, (t, _) in enumerate(feats):
                    n = int(lengths[fi * B:(fi + 1) * B].sum())
                    for v in values[pos:pos + n].tolist():
                        counts[(t, v)] = counts.get((t, v), 0) + 1
                    pos += n
    plan, _ = plan_info(capture_plan_text(cap))
    h = p["hottest_rank"]

    def dest(t, v):
        n = plan["tables"][t]["num_embeddings"]
        blk = (n + 1) // 2
        return v // blk if v < 2 * blk else v % 2

    mine = sorted(((c, t, v) for (t, v), c in counts.items() if dest(t, v) == h),
                  key=lambda e: (-e[0], e[1], e[2]))[:5]
    assert [(r["count"], r["table"], r["row"], r["overcount"]) for r in p["hottest_rows"]] == \
        [(c, t, v, 0) for c, t, v in mine]


ONE_BLOCK_PLAN = """format_version: 1
world_size: 4
module: sequence
tables:
  - name: t0
    num_embeddings: {rows}
    embedding_dim: 8
    data_type: fp32
    dist_type: {dist}
    features: [f0]
  - name: t1
    num_embeddings: 400
    embedding_dim: 8
    data_type: fp32
    dist_type: continuous
    features: [f1]
"""


def test_one_block_table_all_on_one_rank(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text(ONE_BLOCK_PLAN.format(rows=64, dist="continuous"))
    cap = str(tmp_path / "c.h5")
    p = run("synth", small, "-o", cap, "--batches", 4, "--batch-size", 64, "--hotness", "4..8",
            "--store", "none")
    assert p.returncode == 0, p.stderr
    # The capture's plan says t0 has a million rows: blk = 250000, every drawn id (< 64) is in
    # rank 0's block.
    with h5py.File(cap, "r+") as f:
        del f["plan"]
        f.create_dataset("plan", data=np.bytes_(ONE_BLOCK_PLAN.format(rows=1000000,
                                                                     dist="continuous")))
    rr = tmp_path / "rr.yaml"
    rr.write_text(ONE_BLOCK_PLAN.format(rows=1000000, dist="roundrobin"))
    j, text = load_json(tmp_path, cap, "--plan", rr, "--alternatives", "dist-types")
    cap_t0 = j["plans"][0]["tables"][0]
    assert cap_t0["ids"][1:] == [0, 0, 0] and cap_t0["ids"][0] > 0
    assert cap_t0["imbalance"] == 4.0
    assert j["plans"][1]["tables"][0]["imbalance"] < 1.1
    assert j["plans"][0]["imbalance"]["ids"] > 1.5
    rr_imb = j["plans"][1]["tables"][0]["imbalance"]
    gen = {q["name"]: q for q in j["plans"]}["roundrobin"]
    gen_imb = gen["tables"][0]["imbalance"]
    assert gen_imb < 1.1 and gen["plan_yaml"].count("dist_type: roundrobin") == 2
    line = [ln for ln in text.splitlines() if ln.startswith("table t0:")]
    assert len(line) == 1, text
    assert line[0].startswith("table t0: all ids on one rank under captured (imbalance 4.00); ")
    assert f"rr ({rr_imb:.2f})" in line[0] and f"roundrobin ({gen_imb:.2f})" in line[0], line
    assert line[0].endswith(" balance it"), line
    for q in j["plans"]:
        check_plan(q, reference(cap, q["plan_yaml"]))
    check_plan(j["plans"][0], reference(cap, capture_plan_text(cap)))
