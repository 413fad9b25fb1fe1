#!/usr/bin/env bash
# The manual page is complete and clean:
# - every long option that `dynemb-dist --help` and `dynemb-dist SUB --help` print appears in
#   the man page, in that subcommand's own section (.SS SUB), and every subcommand has one;
# - it has the sections a user looks for (EXIT STATUS, ENVIRONMENT with NO_COLOR,
#   CUDA_VISIBLE_DEVICES, NCCL_*, GITHUB_ACTIONS, FILES, EXAMPLES);
# - `groff -man -ww -z` prints nothing (what CI lints), and it renders with man -l.
set -uo pipefail
exe=${DYNEMB:?}
src=${DYNEMB_SRC:?}
page="$src/man/dynemb-dist.1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

[[ -f "$page" ]] || { echo "FAIL: no $page"; exit 1; }
# The page's text with roff escapes undone: \- is -, font changes vanish.
sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\&//g' "$page" >"$tmp/page"

# Section of one subcommand: from ".SS sub" to the next .SS or .SH.
section() { awk -v s=".SS $1" '$0 == s {on = 1; next} on && /^\.S[SH] / {exit} on' "$tmp/page"; }

long_opts() { grep -oE -- '--[a-z][a-z0-9-]*' | sort -u; }

# Subcommands as the top-level help lists them.
"$exe" --help >"$tmp/top" 2>&1 || fail "dynemb-dist --help: exit $?"
subs=$(awk '/^Subcommands:/ {on = 1; next} on && /^  [a-z]/ {print $1}' "$tmp/top")
[[ -n "$subs" ]] || fail "no subcommands parsed from --help"
for want in validate synth inspect replay bench merge; do
  grep -qx "$want" <<<"$subs" || fail "--help does not list $want"
done

for opt in $(long_opts <"$tmp/top"); do
  grep -qF -- "$opt" "$tmp/page" && ok "top-level $opt" || fail "top-level $opt not in the man page"
done

for sub in $subs; do
  section "$sub" >"$tmp/sec"
  if [[ ! -s "$tmp/sec" ]]; then
    fail "no '.SS $sub' section"
    continue
  fi
  "$exe" "$sub" --help >"$tmp/help" 2>&1 || fail "$sub --help: exit $?"
  n=0
  for opt in $(long_opts <"$tmp/help"); do
    [[ $opt == --help ]] && continue
    n=$((n + 1))
    # The option as a word of its own (not a prefix of a longer one, e.g. --batch-size(s)).
    grep -qE -- "(^|[^a-z0-9-])${opt}([^a-z0-9-]|$)" "$tmp/sec" || fail "$sub $opt is not in the man page's $sub section"
  done
  ok "$sub: $n long options checked"
done

for s in 'EXIT STATUS' ENVIRONMENT FILES EXAMPLES 'SEE ALSO'; do
  grep -qx "\.SH $s" "$tmp/page" || grep -qx "\.SH \"$s\"" "$tmp/page" && ok ".SH $s" || fail "no .SH $s"
done
env_sec=$(awk '$0 == ".SH ENVIRONMENT" {on = 1; next} on && /^\.SH / {exit} on' "$tmp/page")
for v in NO_COLOR CUDA_VISIBLE_DEVICES 'NCCL_\*' GITHUB_ACTIONS; do
  grep -q "^\.B $v" <<<"$env_sec" && ok "ENVIRONMENT $v" || fail "ENVIRONMENT lacks $v"
done
exit_sec=$(awk '$0 == ".SH EXIT STATUS" {on = 1; next} on && /^\.SH / {exit} on' "$tmp/page")
for c in 0 1 2; do
  grep -qx "\.B $c" <<<"$exit_sec" && ok "EXIT STATUS $c" || fail "EXIT STATUS lacks $c"
done

# The lint CI runs: no output at all.
if command -v groff >/dev/null 2>&1; then
  lint=$(groff -man -ww -z "$page" 2>&1)
  [[ -z "$lint" ]] && ok "groff -man -ww -z: clean" || fail "groff -man -ww -z: $lint"
  out=$(MANWIDTH=80 man -l "$page" 2>"$tmp/err")
  [[ ! -s "$tmp/err" ]] && grep -q 'EXIT STATUS' <<<"$out" && ok "man -l renders without warnings" \
    || fail "man -l: $(cat "$tmp/err")"
else
  echo "skip: groff lint and man -l rendering (groff not installed; CI installs groff-base and lints)"
fi

[[ $fails -eq 0 ]] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
