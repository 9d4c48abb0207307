#!/usr/bin/env bash
# SLURM's daemons and clients and munge for tests/slurm: installed from Debian's slurm-wlm and
# munge when missing (as root, with apt-get); otherwise one line saying what is missing, status 1.
set -euo pipefail
programs=(munged slurmctld slurmd sbatch srun scontrol scancel sinfo squeue setsid)
missing() { for p in "${programs[@]}"; do command -v "$p" >/dev/null || printf '%s ' "$p"; done; }
[[ -z "$(missing)" ]] && exit 0
if [[ "$EUID" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "error: missing $(missing)and cannot install them here: need root and apt-get" \
        "(apt-get install -y slurm-wlm munge)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q slurm-wlm munge
[[ -z "$(missing)" ]] || { echo "error: still missing after apt-get: $(missing)" >&2; exit 1; }
