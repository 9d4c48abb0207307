#!/usr/bin/env python3
"""A Kubernetes JobSet for a multi-host scone-jax job on a GPU or TPU node pool.

    launch/k8s_jobset.py --name run1 --image IMAGE --hosts 4 --accelerator gpu --gpus-per-host 8 \\
        --dry-run train CONFIG run_dir=/runs/run1        # print the YAML
    launch/k8s_jobset.py ... train CONFIG ...            # pipe it to `kubectl apply -f -`

One pod per host (an indexed Job of `--hosts` pods). Each pod gets SCONE_COORDINATOR (pod 0's
stable JobSet hostname), SCONE_NUM_PROCESSES, and its process id from the JOB_COMPLETION_INDEX
that Kubernetes sets (scone_jax/runtime/cluster.py). When a pod fails, the others stop (the
watchdog) and JobSet restarts the whole set up to --max-restarts times; each restart resumes
from the last checkpoint, so RUN_DIR must be on a volume every pod shares (--pvc). Options go
before the scone-jax arguments.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import yaml

REPLICATED_JOB = "workers"


def coordinator(name: str, port: int) -> str:
    """Pod 0 of the JobSet: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain = jobset
    name>."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}:{port}"


def manifest(args) -> dict:
    env = {
        "SCONE_COORDINATOR": coordinator(args.name, args.port),
        "SCONE_NUM_PROCESSES": str(args.hosts),
        "PYTHONUNBUFFERED": "1",
        **dict(kv.split("=", 1) for kv in args.env),
    }
    if args.peer_timeout is not None:
        env["SCONE_PEER_TIMEOUT"] = f"{args.peer_timeout:g}"
    container = {
        "name": "scone-jax",
        "image": args.image,
        "command": [args.python, "-m", "scone_jax.cli.main", *args.args],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"containerPort": args.port, "name": "coordinator"}],
        "resources": {"limits": {}},
    }
    pod: dict = {"restartPolicy": "Never", "containers": [container]}
    if args.accelerator == "gpu":
        container["resources"]["limits"]["nvidia.com/gpu"] = args.gpus_per_host
        pod["nodeSelector"] = {"cloud.google.com/gke-accelerator": args.gpu_type}
    else:
        container["resources"]["limits"]["google.com/tpu"] = args.chips_per_host
        container["securityContext"] = {"privileged": True}
        pod["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": args.tpu_type,
            "cloud.google.com/gke-tpu-topology": args.tpu_topology,
        }
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    for kv in args.node_selector:
        key, value = kv.split("=", 1)
        pod.setdefault("nodeSelector", {})[key] = value
    if args.pvc:
        pod["volumes"] = [{"name": "runs", "persistentVolumeClaim": {"claimName": args.pvc}}]
        container["volumeMounts"] = [{"name": "runs", "mountPath": args.mount_path}]
    metadata = {"name": args.name}
    if args.namespace:
        metadata["namespace"] = args.namespace
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": args.max_restarts},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": args.hosts,
                            "completions": args.hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": pod},
                        }
                    },
                }
            ],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="launch/k8s_jobset.py",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s --name NAME --image IMAGE [options] scone-jax-args ...",
    )
    parser.add_argument(
        "args", nargs=argparse.REMAINDER, help="scone-jax arguments (e.g. train CONFIG key=value)"
    )
    parser.add_argument(
        "--name", required=True, help="JobSet name (lowercase letters, digits, '-')"
    )
    parser.add_argument("--image", required=True, help="container image with scone_jax installed")
    parser.add_argument("--hosts", type=int, default=2, help="pods = processes (default 2)")
    parser.add_argument("--accelerator", choices=("gpu", "tpu"), default="gpu")
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument(
        "--gpu-type", default="nvidia-h100-80gb", help="GKE accelerator label of the GPU pool"
    )
    parser.add_argument("--tpu-type", default="tpu-v5p-slice", help="GKE TPU accelerator label")
    parser.add_argument("--tpu-topology", default="2x2x2", help="TPU slice topology label")
    parser.add_argument("--chips-per-host", type=int, default=4, help="TPU chips per host")
    parser.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another node selector (repeatable; overrides the defaults above)",
    )
    parser.add_argument("--port", type=int, default=8476, help="coordinator port (default 8476)")
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="JobSet restarts after a failure (default 3)"
    )
    parser.add_argument(
        "--peer-timeout", type=float, default=None, help="SCONE_PEER_TIMEOUT in seconds"
    )
    parser.add_argument(
        "--pvc", default="", help="a ReadWriteMany PersistentVolumeClaim for run dirs"
    )
    parser.add_argument(
        "--mount-path", default="/runs", help="where --pvc is mounted (default /runs)"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another environment variable for every pod (repeatable)",
    )
    parser.add_argument("--namespace", default="")
    parser.add_argument(
        "--python", default="python3", help="interpreter in the image (default python3)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the YAML, apply nothing")
    args = parser.parse_args(argv)
    if not args.args:
        parser.error("nothing to run: give scone-jax arguments (e.g. train CONFIG)")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", args.name):
        parser.error(
            f"--name {args.name!r}: expected lowercase letters, digits and '-', starting with a "
            "letter"
        )
    if args.hosts < 1:
        parser.error("--hosts must be >= 1")
    for kv in (*args.env, *args.node_selector):
        if "=" not in kv:
            parser.error(f"expected KEY=VALUE, got {kv!r}")
    text = yaml.safe_dump(manifest(args), sort_keys=False)
    if args.dry_run:
        print(text, end="")
        return 0
    return subprocess.run(["kubectl", "apply", "-f", "-"], input=text, text=True).returncode


if __name__ == "__main__":
    sys.exit(main())
