#!/usr/bin/env bash
# Checks that the test cluster made by cluster.sh really works as a multi-node Slurm cluster.
# Run after `cluster.sh up`. Exits non-zero on the first failed check.
#   PYTHON=/path/to/python  interpreter with torch for the DDP check (default: the repo's
#                           .venv/bin/python; the check is skipped when torch is missing)
# shellcheck disable=SC2016  # single-quoted commands are expanded in the jobs
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
eval "$("$HERE/cluster.sh" env)"
WORK="$(mktemp -d /tmp/treb-slurm-smoke.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "sinfo"
sinfo -N -o '%N %c %m %G %t'

# --ntasks-per-node: with -n4 alone Slurm may place 3 + 1 tasks (nodes have 8 CPUs).
step "srun -N2 --ntasks-per-node=2"
out="$(srun -N2 --ntasks-per-node=2 bash -c 'echo $SLURM_PROCID $SLURM_NODEID $(hostname) $SLURM_JOB_NODELIST' | sort)"
echo "$out"
[ "$out" = "$(printf '%s\n' '0 0 tn1 tn[1-2]' '1 0 tn1 tn[1-2]' '2 1 tn2 tn[1-2]' '3 1 tn2 tn[1-2]')" ] \
    || fail "unexpected srun output"

step "srun -p big: every node, 8 tasks each"
nodes="$(sinfo -h -p big -o %D)"
out="$(srun -p big -N "$nodes" --ntasks-per-node=8 hostname | sort | uniq -c | awk '{print $1}' | sort -u)"
[ "$out" = 8 ] || fail "big partition: not 8 tasks on each of its $nodes nodes"
echo "$nodes nodes x 8 tasks"

step "scontrol show hostnames tn[1-2]"
out="$(scontrol show hostnames 'tn[1-2]')"
echo "$out"
[ "$out" = "$(printf 'tn1\ntn2')" ] || fail "hostnames"

step "sbatch --wait (2 nodes x 2 tasks, output into $WORK)"
cat >"$WORK/job.sh" <<JOB
#!/bin/bash
#SBATCH --job-name=treb-smoke
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=00:05:00
#SBATCH --output=$WORK/job_%j.log
echo "batch on \$(hostname) nodes \$SLURM_JOB_NODELIST ntasks \$SLURM_NTASKS"
srun bash -c 'echo "rank \$SLURM_PROCID node \$SLURM_NODEID host \$(hostname)" > $WORK/out_\$SLURM_PROCID.txt'
JOB
sbatch --wait "$WORK/job.sh"
cat "$WORK"/job_*.log "$WORK"/out_*.txt
[ "$(cat "$WORK"/out_*.txt | wc -l)" = 4 ] || fail "expected 4 task files"
grep -q 'host tn2' "$WORK/out_3.txt" || fail "rank 3 not on tn2"
# A file written by the job on tn2 is visible from tn1's namespace too.
nsenter --net=/var/run/netns/tn1 cat "$WORK/out_3.txt" >/dev/null || fail "shared fs"

step "squeue --json"
squeue --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
for j in d["jobs"]:
    print(j["job_id"], j["name"], j["job_state"], j["nodes"])
assert any(j["name"] == "treb-smoke" for j in d["jobs"]), "smoke job missing"
'

step "srun --mpi=pmix -N2 -n2"
if srun --mpi=list 2>&1 | grep -q pmix && [ -e /usr/lib/x86_64-linux-gnu/libpmix.so ]; then
    srun --mpi=pmix -N2 -n2 bash -c 'echo $SLURM_PROCID PMIX_RANK=$PMIX_RANK $(hostname)' | sort
else
    echo "skipped (libpmix-dev not installed)"
fi

step "torch DDP (gloo) across 2 nodes: torchrun per node, 2 procs each"
if "$PYTHON" -c 'import torch' 2>/dev/null; then
    rc=0
    TMPDIR="$WORK" srun -N2 --ntasks-per-node=1 bash -c "'$PYTHON' -m torch.distributed.run --nnodes 2 \
        --node_rank \$SLURM_NODEID --nproc_per_node 2 --master_addr tn1 --master_port 29555 \
        '$HERE/ddp_allreduce.py'" >"$WORK/ddp.log" 2>&1 || rc=$?
    grep -E '^rank' "$WORK/ddp.log" | sort || true
    if [ "$rc" != 0 ] || [ "$(grep -c '^rank .* OK$' "$WORK/ddp.log")" != 4 ]; then
        cat "$WORK/ddp.log"; fail "DDP (rc $rc)"
    fi
    # gloo binds the address the node's hostname resolves to: never loopback.
    ! grep -E '^rank .* addr 127\.' "$WORK/ddp.log" || fail "gloo would bind loopback"
else
    echo "skipped (no torch in $PYTHON)"
fi

echo
echo "smoke: all checks passed"
