#!/usr/bin/env python3
"""Compare the machine code of every CUDA kernel between two git revisions.

    bench/sass_compare.py [BEFORE [AFTER]]      (defaults: HEAD~1 and the working tree's HEAD)

BEFORE and AFTER are git revisions, or directories of .cubin files (a SASS_CACHE entry, e.g.
to disassemble on a machine that has cuobjdump but not the repository's history).

Each revision's kernels/**/*.cu is compiled to a cubin with the project's device flags
(nvcc -cubin -arch=sm_XX -O3 -DNDEBUG --expt-relaxed-constexpr -std=c++17). Kernels are
matched by name with the anonymous-namespace tag and the parameter list removed, after
RENAMES below (kernels renamed by a restructuring). For each kernel the script compares

  * the disassembly of `cuobjdump -sass` when cuobjdump is on PATH (addresses and the
    kernel's own name normalised), else
  * the bytes of its ELF section `.text.<mangled name>` (readelf-free: parsed here),

and prints one line per kernel (identical / DIFFERENT / only before / only after) and a
summary. Exit status: 0 when every matched kernel is identical and none is unmatched,
1 otherwise. Environment: NVCC (default nvcc), SASS_ARCH (default 90), KEEP=1 keeps the
temporary directory, SASS_CACHE (default ~/.cache/dynemb-sass) keeps each commit's cubins,
SASS_DIFF_DIR=DIR writes a unified diff of each different kernel's SASS there (cuobjdump only).
"""
import difflib
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

# Kernel renames (before -> after), by the normalised name (see key()).
RENAMES = {
    "dynemb::cuda::onepass_kernel": "dynemb::cuda::bucketize::one_pass_kernel",
    "dynemb::cuda::count_warp_kernel": "dynemb::cuda::bucketize::count_warp_kernel",
    "dynemb::cuda::place_warp_kernel": "dynemb::cuda::bucketize::place_warp_kernel",
    "dynemb::cuda::count_serial_kernel": "dynemb::cuda::bucketize::count_thread_kernel",
    "dynemb::cuda::place_serial_kernel": "dynemb::cuda::bucketize::place_thread_kernel",
    "dynemb::cuda::count_bag_kernel": "dynemb::cuda::bucketize::count_block_kernel",
    "dynemb::cuda::place_bag_kernel": "dynemb::cuda::bucketize::place_block_kernel",
}

# Template parameters added by a restructuring, with the value that gives the old instance:
# (kernel, position, value). The one-pass kernel and the partition's one launch gained Trace
# (false: the untraced instance); the one launch then OneChunk (false: the instance for tiles
# of any size).
ADDED_TEMPLATE_ARGS = [("dynemb::cuda::bucketize::one_pass_kernel", 2, "false"),
                       ("dynemb::cuda::bucketize::partition_resident_kernel", 1, "false"),
                       ("dynemb::cuda::bucketize::partition_resident_kernel", 2, "false")]

NVCC = os.environ.get("NVCC", "nvcc")
ARCH = os.environ.get("SASS_ARCH", "90")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def export(rev, dest):
    """The tree of `rev` (or the working tree for '.') under dest."""
    root = sh(["git", "rev-parse", "--show-toplevel"]).strip()
    if rev == ".":
        shutil.copytree(root, dest, ignore=shutil.ignore_patterns("build*", ".git"))
        return
    os.makedirs(dest)
    tar = subprocess.run(["git", "-C", root, "archive", rev], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", dest], input=tar.stdout, check=True)


def cubins_of(rev, tmp, label):
    """The cubins of `rev`, built in tmp or taken from the cache of an earlier run. A `rev`
    that is a directory holding .cubin files (such a cache entry, copied to a machine without
    the git history) is used as it is."""
    if os.path.isdir(rev) and any(f.endswith(".cubin") for f in os.listdir(rev)):
        return sorted(os.path.join(rev, f) for f in os.listdir(rev) if f.endswith(".cubin"))
    sha = None
    if rev != ".":
        sha = sh(["git", "rev-parse", rev + "^{commit}"]).strip()
        nvcc_version = sh([NVCC, "--version"]).strip().splitlines()[-1]
        cache = os.path.join(os.environ.get("SASS_CACHE", os.path.expanduser("~/.cache/dynemb-sass")),
                             f"{sha}-sm{ARCH}-{hashlib.sha1(nvcc_version.encode()).hexdigest()[:8]}")
        if os.path.isdir(cache) and os.path.exists(os.path.join(cache, "done")):
            return sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".cubin"))
    src = os.path.join(tmp, label)
    export(rev, src)
    out = build(src, os.path.join(tmp, label + "-cubin"))
    if sha:
        os.makedirs(cache, exist_ok=True)
        for c in out:
            shutil.copy(c, cache)
        open(os.path.join(cache, "done"), "w").close()
    return out


def build(src, out):
    os.makedirs(out, exist_ok=True)
    cubins = []
    for dirpath, _, files in os.walk(os.path.join(src, "kernels")):
        for f in sorted(files):
            if not f.endswith(".cu"):
                continue
            cu = os.path.join(dirpath, f)
            rel = os.path.relpath(cu, src).replace("/", "_")
            cubin = os.path.join(out, rel + ".cubin")
            subprocess.run([NVCC, "-cubin", f"-arch=sm_{ARCH}", "-O3", "-DNDEBUG", "-std=c++17",
                            "--expt-relaxed-constexpr", "-DDYNEMB_HAVE_CUDA=1",
                            "-I" + os.path.join(src, "lib"), "-I" + os.path.join(src, "kernels"),
                            "-I" + src, "-o", cubin, cu], check=True)
            cubins.append(cubin)
    return cubins


def elf_sections(path):
    """[(name, sh_info, bytes)] of an ELF64 file's sections."""
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]
    out = []
    for sec in secs:
        end = data.index(b"\0", stroff + sec[0])
        name = data[stroff + sec[0]:end].decode()
        body = data[sec[4]:sec[4] + sec[5]] if sec[1] != 8 else b"\0" * sec[5]  # NOBITS
        out.append((name, sec[7], body))
    return out


def nv_info(body):
    """(attribute, payload) records of a .nv.info section."""
    i, out = 0, []
    while i + 2 <= len(body):
        fmt, attr = body[i], body[i + 1]
        i += 2
        if fmt == 4:  # attribute with a 16-bit size and a payload
            size, = struct.unpack_from("<H", body, i)
            out.append((attr, body[i + 2:i + 2 + size]))
            i += 2 + size
        elif fmt == 3:
            out.append((attr, body[i:i + 2]))
            i += 2
        elif fmt == 2:
            out.append((attr, body[i:i + 1]))
            i += 1
        else:
            out.append((attr, b""))
    return out


def resources(cubins):
    """{mangled: (registers, local frame bytes, static shared bytes)}: EIATTR_REGCOUNT (0x2f)
    and EIATTR_FRAME_SIZE (0x11) of .nv.info for the kernel's symbol (the .text section's
    sh_info), shared memory from the size of .nv.shared.<name>. A frame > 0 means spills or
    local arrays."""
    res = {}
    for c in cubins:
        secs = elf_sections(c)
        regs, frame = {}, {}
        for n, _, b in secs:
            if n == ".nv.info":
                for attr, payload in nv_info(b):
                    if len(payload) == 8:
                        sym, val = struct.unpack("<II", payload)
                        if attr == 0x2F:
                            regs[sym] = val
                        elif attr == 0x11:
                            frame[sym] = val
        shared = {n[len(".nv.shared."):]: len(b) for n, _, b in secs if n.startswith(".nv.shared.")}
        for n, info, _ in secs:
            if n.startswith(".text."):
                m = n[len(".text."):]
                sym = info & 0xFFFFFF
                res[m] = (regs.get(sym, 0), frame.get(sym, 0), shared.get(m, 0))
    return res


def text_sections(path):
    """{section name: bytes} of an ELF64 file's .text.* sections."""
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]

    def name(off):
        end = data.index(b"\0", stroff + off)
        return data[stroff + off:end].decode()

    out = {}
    for s in secs:
        n = name(s[0])
        if n.startswith(".text."):
            out[n[len(".text."):]] = data[s[4]:s[4] + s[5]]
    return out


def demangle(names):
    if not names:
        return []
    res = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return res.stdout.splitlines()


def key(demangled):
    """Name without return type, anonymous-namespace tags and parameter list."""
    d = re.sub(r"_GLOBAL__N__\w+::", "", demangled)
    d = d.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(d)
    for i, c in enumerate(d):  # the parameter list: the first '(' at template depth 0
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            cut = i
            break
    d = d[:cut]
    if d.startswith("void "):
        d = d[5:]
    base, _, targs = d.partition("<")
    base = RENAMES.get(base, base)
    if targs:
        args = [x.strip() for x in targs[:-1].split(",")]
        # Trailing arguments that hold an added parameter's old value go, last first (as C++
        # defaults do): <4, false, false> and <4, false> are both <4>; <4, false, true> stays.
        added = {(kernel, pos): value for kernel, pos, value in ADDED_TEMPLATE_ARGS}
        while args and added.get((base, len(args) - 1)) == args[-1]:
            args.pop()
        targs = ", ".join(args) + ">"
    return base + ("<" + targs if targs else "")


def sass_of(cubin):
    """{mangled: normalised SASS text} from cuobjdump -sass."""
    txt = sh(["cuobjdump", "-sass", cubin])
    out, cur, lines = {}, None, []
    for line in txt.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if cur:
                out[cur] = lines
            cur, lines = m.group(1), []
        elif cur:
            line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # instruction addresses
            if line.strip():
                lines.append(line.strip())
    if cur:
        out[cur] = lines
    return {k: "\n".join(v).replace(k, "<self>") for k, v in out.items()}


def collect(cubins, use_cuobjdump):
    mangled, blobs = [], []
    for c in cubins:
        secs = sass_of(c) if use_cuobjdump else text_sections(c)
        for m, b in secs.items():
            mangled.append(m)
            blobs.append(b)
    res = resources(cubins)
    return {key(d): (m, b, res.get(m, (0, 0, 0)))
            for m, d, b in zip(mangled, demangle(mangled), blobs)}


def main():
    before = sys.argv[1] if len(sys.argv) > 1 else "HEAD~1"
    after = sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    use_cuobjdump = shutil.which("cuobjdump") is not None
    tmp = tempfile.mkdtemp(prefix="sass_compare.")
    try:
        ks = []
        for label, rev in (("before", before), ("after", after)):
            ks.append(collect(cubins_of(rev, tmp, label), use_cuobjdump))
        kb, ka = ks
        how = "cuobjdump -sass" if use_cuobjdump else "ELF .text.<kernel> bytes"
        print(f"# SASS comparison sm_{ARCH}: before {before}, after {after}; compared: {how}")
        bad = 0
        for k in sorted(set(kb) | set(ka)):
            if k not in ka:
                print(f"only before  {k}")
                bad += 1
            elif k not in kb:
                ra, fa, sa = ka[k][2]
                print(f"only after   {k}  ({len(ka[k][1])} bytes, {ra} registers, {fa} B frame, "
                      f"{sa} B shared)")
                bad += 1
            else:
                same = kb[k][1] == ka[k][1]
                size = len(ka[k][1])
                extra = ""
                if not same:  # size, registers, frame and shared memory, before -> after
                    (rb, fb, sb), (ra, fa, sa) = kb[k][2], ka[k][2]
                    extra = (f"; before: {len(kb[k][1])} bytes, {rb} registers, {fb} B frame, "
                             f"{sb} B shared; after: {ra} registers, {fa} B frame, {sa} B shared")
                print(f"{'identical' if same else 'DIFFERENT':<12} {k}  ({size} bytes{extra})")
                diff_dir = os.environ.get("SASS_DIFF_DIR")
                if not same and use_cuobjdump and diff_dir:
                    os.makedirs(diff_dir, exist_ok=True)
                    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", k)[-120:] + ".diff"
                    with open(os.path.join(diff_dir, name), "w") as f:
                        f.writelines(difflib.unified_diff(
                            [x + "\n" for x in kb[k][1].splitlines()],
                            [x + "\n" for x in ka[k][1].splitlines()], before, after))
                bad += 0 if same else 1
        n = len(set(kb) | set(ka))
        print(f"# {n - bad} of {n} kernels identical")
        return 0 if bad == 0 else 1
    finally:
        if os.environ.get("KEEP") == "1":
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
