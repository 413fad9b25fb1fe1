#!/usr/bin/env bash
# cmake/check_layers.cmake: passes on the tree, and fails naming the file and the include on a
# copy of the tree with one include that breaks a rule (cli/ including a kernels/ header, a
# lib/ layer including one above it, kernels/ including lib/engine, bench/ or a lib/ layer
# through <...>).
source "$(dirname "$0")/common.sh"
cmake_bin=${DYNEMB_CMAKE:-cmake}
check() { "$cmake_bin" -DDYNEMB_ROOT="$1" -P "$DYNEMB_SRC/cmake/check_layers.cmake" >"$tmp/out" 2>&1; }

if check "$DYNEMB_SRC"; then ok "the tree passes"; else
  fail "the tree fails the layering check:"
  sed 's/^/    /' "$tmp/out"
fi

# bad NAME DIR LINE: the first source file of DIR (relative to the root) with LINE appended
# fails, naming the file and LINE, and nothing else.
bad() {
  local name=$1 line=$3 root="$tmp/$1" file
  file=$(cd "$DYNEMB_SRC" && find "$2" -maxdepth 1 -type f \( -name '*.cpp' -o -name '*.cu' \) | sort | head -1)
  [[ -n "$file" ]] || { fail "$name: no source file in $2"; return; }
  mkdir -p "$root"
  cp -r "$DYNEMB_SRC/cli" "$DYNEMB_SRC/lib" "$DYNEMB_SRC/kernels" "$root/"
  echo "$line" >>"$root/$file"
  if check "$root"; then
    fail "$name: the check passes with $line in $file"
  elif ! grep -qF "$file: \`$line\`" "$tmp/out"; then
    fail "$name: the failure does not name $file and its include:"
    sed 's/^/    /' "$tmp/out"
  elif ! grep -q "layering broken (1 include" "$tmp/out"; then
    fail "$name: more than the one include reported:"
    sed 's/^/    /' "$tmp/out"
  else
    ok "$name"
  fi
  rm -rf "$root"
}
bad cli_kernels cli '#include "bucketize.hpp"'
bad common_plan lib/common '#include "plan/plan.hpp"'
bad model_engine lib/model '#include "engine/x.hpp"'
bad engine_capture lib/engine '#include "capture/x.hpp"'
bad synth_replay lib/synth '#include "replay/x.hpp"'
bad lib_kernels lib/replay '#include "bucketize.hpp"'
bad kernels_engine kernels '#include "engine/x.hpp"'
bad kernels_capture kernels/bucketize '#include "capture/x.hpp"'
bad kernels_bench kernels '#include "run.hpp"'
bad kernels_backends kernels '#include "cuda/cuda_backend.hpp"'
bad kernels_angle kernels '#include <replay/x.hpp>'
bad kernels_nccl kernels '#include <nccl.h>'

[[ $fails -eq 0 ]]
