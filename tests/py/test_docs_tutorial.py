"""Docs that run: executes the shell sessions of docs/*.md and compares their output.

Like CUB's compiled examples, the documentation is the test input, so it cannot rot:

- a ```console block holds `$ command` lines (a trailing backslash continues a command), each
  followed by the output it must print (stdout and stderr together);
- a ```python NAME.py (or ```yaml NAME.yaml) block is written to the file NAME before the
  commands after it run;
- all commands of one document run in one bash session, in a fresh temporary directory that
  holds the repository's fixtures/ and plans/ (as if run from its root), in document order, with `dynemb-dist` and `python3` on PATH being $DYNEMB and $DYNEMB_PYTHON,
  NO_COLOR=1, no GITHUB_ACTIONS, and no visible GPU (so `--backend auto` is cpu everywhere);
- `$ echo $?` prints the previous command's exit status, and a command that exits non-zero
  must be followed by one (so a documented failure is always a checked one);
- before comparing, both sides are normalized: trailing blanks dropped, 64-digit sha256
  values become <sha256>, "host, N threads" becomes "host, N threads"; an output line `...`
  matches any number of lines.

Usage: test_docs_tutorial.py [DOC.md ...]   (default: the documents listed in DOCS)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = ["docs/tutorial.md", "docs/ci.md", "docs/plan-format.md", "docs/mean-pooling.md",
        "docs/capture-format.md", "docs/cli.md", "docs/load.md"]
MARK = "@@dynemb-docs@@"


def parse(path):
    """Returns a list of steps: ("file", name, text) and ("cmd", line_no, command, expected)."""
    steps = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*(\S*)\s*$", lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        lang, name = m.group(1), m.group(2)
        start = i + 1
        j = start
        while j < len(lines) and lines[j] != "```":
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{i + 1}: unterminated code block")
        body = lines[start:j]
        if lang == "console":
            k = 0
            while k < len(body):
                if not body[k].startswith("$ "):
                    raise SystemExit(f"{path}:{start + k + 1}: output before any '$ ' command")
                line_no = start + k + 1
                cmd = body[k][2:]
                while cmd.endswith("\\") and k + 1 < len(body):
                    k += 1
                    cmd = cmd + "\n" + body[k]
                k += 1
                out = []
                while k < len(body) and not body[k].startswith("$ "):
                    out.append(body[k])
                    k += 1
                steps.append(("cmd", line_no, cmd, out))
        elif name and lang in ("python", "yaml", "sh", "text"):
            steps.append(("file", name, "\n".join(body) + "\n"))
        i = j + 1
    return steps


def normalize(lines):
    out = []
    for line in lines:
        line = line.rstrip()
        line = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", line)
        line = re.sub(r"host, \d+ threads?", "host, N threads", line)
        out.append(line)
    while out and out[-1] == "":
        out.pop()
    return out


def matches(want, got):
    """`...` in want matches any run of lines (including none)."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[n:]) for n in range(len(got) + 1))
    return bool(got) and want[0] == got[0] and matches(want[1:], got[1:])


def run_doc(path, dynemb, python):
    steps = parse(path)
    cmds = [s for s in steps if s[0] == "cmd"]
    if not cmds:
        print(f"FAIL {path}: no console commands found")
        return False
    work = tempfile.mkdtemp(prefix="dynemb-docs-")
    try:
        bindir = os.path.join(work, ".bin")
        os.mkdir(bindir)
        os.symlink(os.path.abspath(dynemb), os.path.join(bindir, "dynemb-dist"))
        # The pages run from the repository's root: its bundled captures and plans are there.
        for d in ("fixtures", "plans"):
            os.symlink(os.path.abspath(os.path.join(SRC, d)), os.path.join(work, d))
        # A wrapper, not a symlink: a virtualenv's interpreter finds its site-packages from
        # the path it is started by (pyvenv.cfg beside it), which a symlink here would hide.
        shim = os.path.join(bindir, "python3")
        with open(shim, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\nexec '%s' \"$@\"\n" % python.replace("'", "'\\''"))
        os.chmod(shim, 0o755)
        script = ["exec 2>&1", "__rc=0"]
        for n, s in enumerate(steps):
            if s[0] == "file":
                with open(os.path.join(work, s[1]), "w", encoding="utf-8") as f:
                    f.write(s[2])
                continue
            script.append(f"echo '{MARK} {n}'")
            # `(exit $__rc)` restores the previous command's status for `echo $?`.
            script.append(f"(exit $__rc); {s[2]}\n__rc=$?")
            script.append(f"echo '{MARK} rc' $__rc")
        env = dict(os.environ)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        env["NO_COLOR"] = "1"
        # No GPU: `--backend auto` is cpu, as on the pages, also on a CUDA build with a GPU.
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["DYNEMB_SRC"] = os.path.abspath(SRC)
        env.pop("GITHUB_ACTIONS", None)
        res = subprocess.run(["bash", "--noprofile", "--norc"], input="\n".join(script) + "\n",
                             cwd=work, env=env, capture_output=True, text=True, timeout=600)
        # Split the session's output back into one chunk per command.
        got, rcs, cur = {}, {}, None
        for line in res.stdout.split("\n"):
            if line.startswith(MARK):
                tok = line[len(MARK) + 1:].split()
                if tok[0] == "rc":
                    rcs[cur] = int(tok[1])
                else:
                    cur = int(tok[0])
                    got[cur] = []
            elif cur is not None:
                got[cur].append(line)
        ok = True
        prev_rc, prev_cmd = 0, None
        for n, s in enumerate(steps):
            if s[0] != "cmd":
                continue
            _, line_no, cmd, want = s
            if prev_rc != 0 and cmd.strip() != "echo $?":
                print(f"FAIL {path}:{prev_cmd[1]}: `{prev_cmd[2]}` exited {prev_rc} and the "
                      "document does not show it (add `$ echo $?`)")
                ok = False
            if n not in got or n not in rcs:
                print(f"FAIL {path}:{line_no}: `{cmd}` did not run to completion")
                return False
            w, g = normalize(want), normalize(got[n])
            if not matches(w, g):
                ok = False
                print(f"FAIL {path}:{line_no}: output of `{cmd}` differs from the document")
                print("  --- document")
                for line in w:
                    print("  | " + line)
                print("  --- actual")
                for line in g:
                    print("  | " + line)
            prev_rc = rcs[n] if cmd.strip() != "echo $?" else 0
            prev_cmd = s
        if prev_rc != 0:
            print(f"FAIL {path}:{prev_cmd[1]}: last command exited {prev_rc} undocumented")
            ok = False
        print(f"{'ok  ' if ok else 'FAIL'} {path}: {len(cmds)} commands")
        return ok
    finally:
        shutil.rmtree(work, ignore_errors=True)


def self_test():
    # The comparison itself must be able to fail.
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "..."], ["a"])
    assert not matches(["a", "b"], ["a", "c"])
    assert not matches(["a"], ["a", "b"])
    assert normalize(["x sha256 " + "ab" * 32 + "  "]) == ["x sha256 <sha256>"]
    assert normalize(["cpu (host, 16 threads)"]) == ["cpu (host, N threads)"]


def main():
    self_test()
    dynemb = os.environ.get("DYNEMB")
    if not dynemb or not os.path.exists(dynemb):
        print("DYNEMB (the dynemb-dist binary) is not set")
        return 2
    python = os.environ.get("DYNEMB_PYTHON") or sys.executable
    # The documents' scripts use h5py and numpy: without them there is nothing to check here
    # (CI installs them; a bare GPU machine may not have them).
    if subprocess.run([python, "-c", "import h5py, numpy"], capture_output=True).returncode != 0:
        print(f"SKIP: {python} has no h5py/numpy (the documents' scripts need them)")
        return 77
    docs = sys.argv[1:] or [os.path.join(SRC, d) for d in DOCS]
    ok = True
    for d in docs:
        ok &= run_doc(d, dynemb, python)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
