#!/usr/bin/env bash
# `mpiexec -n 2 dynemb-dist replay CAPTURE --backend nccl` (docs/multi-node.md, "NCCL across
# processes"): one NCCL communicator over the two processes' GPUs (one GPU each, through
# CUDA_VISIBLE_DEVICES), the processes in lockstep, process 0 writing the report. Its checks and
# verdict must be the one-process `--backend cpu` report's: the text report, --json and --junit
# equal but for the backend line (and the JSON's argv and backend). Every fixture whose W the two
# GPUs divide (W even). Exits 77 saying why without 2 GPUs, mpiexec, or a build with MPI and NCCL.
# Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC, DYNEMB_PYTHON, DYNEMB_HAVE_MPI, DYNEMB_HAVE_NCCL,
# DYNEMB_MPIEXEC.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
[[ "${DYNEMB_HAVE_MPI:-OFF}" == "ON" ]] || { echo "skipped: this build has no MPI (-DDYNEMB_MPI=ON)"; exit 77; }
[[ "${DYNEMB_HAVE_NCCL:-OFF}" == "ON" ]] || { echo "skipped: this build has no NCCL backend"; exit 77; }
MPIRUN=${DYNEMB_MPIEXEC:-}
[[ -x "$MPIRUN" ]] || MPIRUN=$(command -v mpiexec || command -v mpirun || true)
[[ -n "$MPIRUN" ]] || { echo "skipped: no mpiexec on PATH (apt-get install openmpi-bin)"; exit 77; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  ((${#visible[@]} < gpus)) && gpus=${#visible[@]}
fi
((gpus >= 2)) || { echo "skipped: needs 2 GPUs, found ${gpus:-0}"; exit 77; }
"$DYNEMB_PYTHON" -c 'import h5py' 2>/dev/null || { echo "skipped: no h5py for $DYNEMB_PYTHON"; exit 77; }

source "$DYNEMB_SRC/tests/cli/common.sh"  # tmp, fails, ok, fail, expect_rc
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_hwloc_base_binding_policy=none
cd "$tmp" || exit 1
# Each process its own GPU: its local rank (Open MPI, MPICH/Hydra), of the visible ones.
cat >one_gpu.sh <<'SH'
#!/usr/bin/env bash
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  export CUDA_VISIBLE_DEVICES=${visible[$local_rank]}
else
  export CUDA_VISIBLE_DEVICES=$local_rank
fi
exec "$@"
SH
chmod +x one_gpu.sh
json_same() {  # argv and backend aside
  "$DYNEMB_PYTHON" - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r.pop("argv"); r.pop("backend")
sys.exit(0 if a == b else 1)
PY
}
ran=0
for f in "$DYNEMB_SRC"/fixtures/*.h5; do
  n=$(basename "$f" .h5)
  W=$("$DYNEMB_PYTHON" -c "import h5py, sys; b = h5py.File(sys.argv[1])['batches/0']; print(sum(k.startswith('rank') for k in b))" "$f")
  ((W % 2 == 0)) || continue
  timeout 300 "$DYNEMB" replay "$f" --backend cpu --json "$n.cpu.json" --junit "$n.cpu.xml" >"$n.cpu.txt" 2>"$n.cpu.err"
  rc1=$?
  timeout 600 "$MPIRUN" -n 2 ./one_gpu.sh "$DYNEMB" replay "$f" --backend nccl --json "$n.nccl.json" \
    --junit "$n.nccl.xml" >"$n.nccl.txt" 2>"$n.nccl.err"
  rc2=$?
  expect_rc "$n (mpiexec -n 2, nccl)" "$rc1" "$rc2"
  if ! cmp -s <(grep -v '^# backend' "$n.cpu.txt") <(grep -v '^# backend' "$n.nccl.txt"); then
    fail "$n: the nccl report of 2 processes differs from the cpu report"
    diff "$n.cpu.txt" "$n.nccl.txt" | head -10
    sed 's/^/    /' "$n.nccl.err" | head -20
    continue
  fi
  cmp -s "$n.cpu.xml" "$n.nccl.xml" || { fail "$n: the JUnit reports differ"; continue; }
  json_same "$n.cpu.json" "$n.nccl.json" || { fail "$n: the JSON reports differ"; continue; }
  ok "$n: 2 processes on nccl give the cpu report (exit $rc1)"
  ran=$((ran + 1))
done
((ran > 0)) || fail "no fixture with an even W was compared"
[[ $fails -eq 0 ]]
