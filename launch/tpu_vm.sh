#!/usr/bin/env bash
# Run scone-jax on every worker of a Cloud TPU VM slice, one process per host.
#
#   launch/tpu_vm.sh --tpu NAME --zone ZONE [--project P] [--workdir DIR] [--python PY]
#                    [--env KEY=VALUE]... [--dry-run] -- train CONFIG key=value ...
#
# Runs `gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`; each worker runs
# `cd DIR && SCONE_DISTRIBUTED=auto PY -m scone_jax.cli.main ARGS`, and jax finds the
# coordinator, process count and process id from the TPU metadata. The code and its
# environment must already be on every worker (e.g. `gcloud compute tpus tpu-vm scp
# --worker=all`, or a shared image), and RUN_DIR on storage every worker shares.
# --dry-run prints the gcloud command instead of running it.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
# an option's value, or one line naming the option that lacks it
value() { [[ $# -ge 2 && "$2" != --* ]] || { echo "tpu_vm.sh: $1 needs a value" >&2; exit 2; }; }

tpu="" zone="" project="" workdir="~/scone_jax" python="python3" dry_run=0
envs=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tpu) value "$@"; tpu="$2"; shift 2 ;;
        --zone) value "$@"; zone="$2"; shift 2 ;;
        --project) value "$@"; project="$2"; shift 2 ;;
        --workdir) value "$@"; workdir="$2"; shift 2 ;;
        --python) value "$@"; python="$2"; shift 2 ;;
        --env) value "$@"; envs+=("$2"); shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage 0 ;;
        --) shift; break ;;
        *) echo "tpu_vm.sh: unknown option $1 (scone-jax arguments go after --)" >&2; usage ;;
    esac
done
[[ -n "$tpu" && -n "$zone" ]] || { echo "tpu_vm.sh: --tpu and --zone are required" >&2; usage; }
[[ $# -gt 0 ]] || { echo "tpu_vm.sh: nothing to run: give scone-jax arguments after --" >&2; usage; }
for kv in "${envs[@]+"${envs[@]}"}"; do
    [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "tpu_vm.sh: --env expects KEY=VALUE, got '$kv'" >&2; exit 2; }
done

# single-quote a word for a POSIX shell unless it is plainly safe (like Python's shlex.quote)
quote() {
    if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"
    else printf "'%s'" "${1//\'/\'\"\'\"\'}"; fi
}

# the remote command, quoted for the worker's shell (the workdir stays unquoted so ~ expands)
remote="cd $workdir && env SCONE_DISTRIBUTED=auto"
for kv in "${envs[@]+"${envs[@]}"}"; do remote+=" $(quote "$kv")"; done
remote+=" $(quote "$python") -m scone_jax.cli.main"
for arg in "$@"; do remote+=" $(quote "$arg")"; done

cmd=(gcloud compute tpus tpu-vm ssh "$tpu" "--zone=$zone")
[[ -n "$project" ]] && cmd+=("--project=$project")
cmd+=(--worker=all "--command=$remote")

if [[ $dry_run == 1 ]]; then
    line=""
    for word in "${cmd[@]}"; do line+="${line:+ }$(quote "$word")"; done
    printf '%s\n' "$line"
    exit 0
fi
exec "${cmd[@]}"
