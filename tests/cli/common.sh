# Shared by tests/cli/test_*.sh (sourced, not run): a scratch directory removed on exit, and
# the ok/fail reporting every CLI test uses; a test ends with `[[ $fails -eq 0 ]]` or its own
# summary of $fails.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
# Helpers of the nothing-lost tests (tests/cli/test_outputs.sh, test_disk_full.sh, ...):
# sha FILE: its sha256. expect_rc NAME WANT GOT: a signal exit (>= 128) is always a failure.
# no_temps DIR NAME: no "*.tmp-*" left under DIR. has_text FILE TEXT NAME: fixed-string grep.
sha() { sha256sum "$1" | cut -d' ' -f1; }
expect_rc() {
  if (($3 >= 128)); then
    fail "$1: exit $3 (by signal $(($3 - 128))), want $2"
  elif [[ "$3" != "$2" ]]; then
    fail "$1: exit $3, want $2"
  fi
}
no_temps() {
  local left
  left=$(find "$1" -name '*.tmp-*' 2>/dev/null)
  [[ -z "$left" ]] || fail "$2: temporary files left: $left"
}
# temp_of TARGET PID: the temporary "<TARGET>.tmp-<PID>-<random>" of that process, if any.
temp_of() {
  local f
  for f in "$1".tmp-"$2"-*; do
    [[ -e "$f" ]] && { echo "$f"; return; }
  done
}
has_text() {
  grep -qF -- "$2" "$1" || {
    fail "$3: no '$2' in $1:"
    sed 's/^/    /' "$1" | head -20
  }
}
# reports_equal A.json B.json: the two replay reports agree check for check (checks, summary,
# warnings, trouble; timings and the header aside); prints the first difference otherwise.
reports_equal() {
  "${DYNEMB_PYTHON:-python3}" - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for key in ("checks", "summary", "warnings", "trouble"):
    if a.get(key) != b.get(key):
        for x, y in zip(a.get(key) or [], b.get(key) or []):
            if x != y:
                print(f"{sys.argv[1]}:", x, f"\n{sys.argv[2]}:", y)
                break
        print(f"{key} differ")
        sys.exit(1)
EOF
}
# run NAME WANT_RC ARGS...: the tool under a 60 s limit and 4 GiB of address space (plain
# builds only: ASan reserves far more), stdout and stderr in $tmp/NAME.out; a failure shows
# the output. has NAME REGEX: a line of $tmp/NAME.out matches (the whole reason on one line).
asan=0
# grep -c reads all of nm's output: grep -q would stop early, and nm's SIGPIPE would fail the
# pipe in a test that sets -o pipefail.
(($(nm "${DYNEMB:-}" 2>/dev/null | grep -c __asan_init) > 0)) && asan=1
run() {
  local name=$1 want=$2
  shift 2
  (
    [[ $asan -eq 1 ]] || ulimit -v 4194304 2>/dev/null
    exec timeout 60 "$DYNEMB" "$@"
  ) >"$tmp/$name.out" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then
    fail "$name: exit $rc, want $want ($*)"
    sed 's/^/    /' "$tmp/$name.out" | head -30
  fi
}
has() { grep -qE -- "$2" "$tmp/$1.out" || { fail "$1: no line matches: $2"; sed 's/^/    /' "$tmp/$1.out" | head -30; }; }
# split_ranks CAPTURE PREFIX: per-rank files PREFIX0.h5 ... as a live job writes them (the root
# attributes and "rank", /plan, /oracle, and each batch's own rank group), for merge.
split_ranks() {
  "${DYNEMB_PYTHON:-python3}" - "$1" "$2" <<'EOF'
import sys, h5py
src, prefix = sys.argv[1], sys.argv[2]
with h5py.File(src, "r") as f:
    W, nb = int(f.attrs["world_size"]), int(f.attrs["num_batches"])
for r in range(W):
    with h5py.File(src, "r") as f, h5py.File(f"{prefix}{r}.h5", "w") as g:
        for k, v in f.attrs.items():
            g.attrs[k] = v
        g.attrs["rank"] = r
        f.copy("plan", g)
        f.copy("oracle", g)
        b = g.create_group("batches")
        for k in range(nb):
            f.copy(f"batches/{k}/rank{r}", b.create_group(str(k)))
EOF
}
# strip_datasets CAPTURE SUFFIX...: the capture's datasets whose paths end so, removed.
strip_datasets() {
  "${DYNEMB_PYTHON:-python3}" - "$@" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    drop = []
    f.visit(lambda n: drop.append(n) if n.endswith(tuple(sys.argv[2:])) else None)
    for n in drop:
        del f[n]
EOF
}
# skip_rss_under_asan: a test that judges peak RSS skips itself (77) on an ASan build, whose
# RSS is the sanitizer's shadow memory and quarantine, not the tool's.
skip_rss_under_asan() {
  if (($(nm "$DYNEMB" 2>/dev/null | grep -c __asan_init) > 0)); then
    echo "ASan build: RSS includes the sanitizer's shadow memory and quarantine; skipped there"
    exit 77
  fi
}
# has_test_hooks: whether $DYNEMB reads the tests' DYNEMB_* hooks (lib/common/test_hooks.hpp:
# a build configured with -DDYNEMB_TEST_HOOKS=ON, as scripts/test.sh does). Such a build judges
# a hook's value before any work and refuses one that means nothing; any other build ignores
# the hooks, whatever their value. need_test_hooks: a test built on a hook skips itself (77),
# saying why, on a build without them.
has_test_hooks() {
  local said
  said=$(DYNEMB_SLICE_COLUMNS=probe "$DYNEMB" inspect "$tmp/no-such-capture.h5" 2>&1)
  grep -q "DYNEMB_SLICE_COLUMNS='probe'" <<<"$said"
}
need_test_hooks() {
  if ! has_test_hooks; then
    echo "skipped: $DYNEMB reads no test hooks (a build without -DDYNEMB_TEST_HOOKS=ON)"
    exit 77
  fi
}
