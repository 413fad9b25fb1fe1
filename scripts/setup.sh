#!/usr/bin/env bash
# Installs what building and testing dynemb-dist needs on Debian 12 / Ubuntu 24.04.
# Idempotent: installs only the packages that are missing. Uses sudo when not root.
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config
      libhdf5-dev hdf5-tools libyaml-cpp-dev libcli11-dev libfmt-dev doctest-dev
      nlohmann-json3-dev libssl-dev python3 python3-h5py python3-numpy python3-pytest
      python3-yaml groff-base
      libdeflate-dev
      chromium fonts-dejavu-core python3-pil openmpi-bin libopenmpi-dev)
# chromium: the HTML reports are checked in a real browser (tests/cli/test_html_*.sh);
# Open MPI: `mpirun dynemb-dist replay` (DYNEMB_MPI, docs/multi-node.md).
[ "${DYNEMB_SETUP_EXTRA:-}" != "" ] && pkgs+=(${DYNEMB_SETUP_EXTRA})

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
