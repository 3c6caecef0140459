"""A seeded mix of inference and training workloads with DCGM usage samples, for `dralloc plan`.

    python benchmarks/plan_workloads.py --out /tmp/mix [--count 500] [--seed 7]
    dralloc plan -f examples/migrate -f /tmp/mix/workloads.yaml --usage /tmp/mix/usage.csv \
        --fleet benchmarks/fleet-1000.yaml

writes `workloads.yaml` (device-plugin manifests, as teams have them today) and
`usage.csv` (peak framebuffer MiB and engine activity per container). The mix:
vLLM/TGI Deployments of one GPU (a product label on half of them; most small
models far below a GPU's memory and compute), Deployments on MIG resources,
tensor-parallel inference on 2-4 GPUs, training Jobs of 1-8 GPUs, Kubeflow
PyTorchJobs (a master and 1-3 workers of 8 Hopper GPUs) and KubeRay clusters
of one-GPU workers. Training and multi-GPU inference run their GPUs hot.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

import yaml

PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"]


def _container(name: str, image: str, gpus: int, resource: str = "nvidia.com/gpu") -> dict:
    return {"name": name, "image": image, "resources": {"limits": {resource: gpus, "memory": "32Gi"}, "requests": {"cpu": "4"}}}


def _deployment(name: str, ns: str, replicas: int, container: dict, node_selector: dict | None = None) -> dict:
    spec: dict = {"containers": [container]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    }


def generate(count: int, seed: int) -> tuple[list[dict], list[tuple]]:
    rng = random.Random(seed)
    objects: list[dict] = []
    usage: list[tuple] = []
    for i in range(count):
        kind = rng.choices(["infer", "mig", "tp", "job", "pytorch", "ray"], weights=[45, 10, 5, 25, 10, 5])[0]
        name = f"{kind}-{i:03d}"
        if kind == "infer":
            ns = "inference"
            selector = {"nvidia.com/gpu.product": rng.choice(PRODUCTS)} if rng.random() < 0.5 else None
            objects.append(_deployment(name, ns, rng.randint(1, 3), _container("server", "vllm/vllm-openai:v0.6.3", 1), selector))
            size = rng.choices(["small", "medium", "large"], weights=[60, 25, 15])[0]
            memory, util = {"small": ((3000, 15000), (3, 12)), "medium": ((18000, 36000), (15, 45)), "large": ((45000, 76000), (50, 95))}[size]
            usage.append((ns, f"{name}-5f7b9c-abcde", "server", rng.randint(*memory), rng.randint(*util)))
        elif kind == "mig":
            profile = rng.choice(["1g.10gb", "2g.20gb", "3g.40gb"])
            objects.append(
                _deployment(name, "inference", rng.randint(1, 3), _container("triton", "nvcr.io/nvidia/tritonserver:24.08-py3", 1, f"nvidia.com/mig-{profile}"))
            )
        elif kind == "tp":
            objects.append(_deployment(name, "inference", rng.randint(1, 2), _container("server", "vllm/vllm-openai:v0.6.3", rng.choice([2, 4]))))
            usage.append(("inference", f"{name}-5f7b9c-abcde", "server", rng.randint(60000, 78000), rng.randint(70, 99)))
        elif kind == "job":
            gpus = rng.choice([1, 2, 4, 8])
            objects.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": name, "namespace": "training"},
                    "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [_container("train", "nvcr.io/nvidia/pytorch:24.08-py3", gpus)]}}},
                }
            )
            usage.append(("training", f"{name}-x7k2p", "train", rng.randint(50000, 79000), rng.randint(85, 100)))
        elif kind == "pytorch":
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.family", "operator": "In", "values": ["hopper"]}]}]
                    }
                }
            }

            def replica(n: int, affinity: dict = affinity) -> dict:
                return {
                    "replicas": n,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"affinity": affinity, "containers": [_container("pytorch", "nvcr.io/nvidia/pytorch:24.08-py3", 8)]}},
                }

            objects.append(
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "metadata": {"name": name, "namespace": "training"},
                    "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(rng.randint(1, 3))}},
                }
            )
        else:
            objects.append(
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "metadata": {"name": name, "namespace": "inference"},
                    "spec": {
                        "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.35.0"}]}}},
                        "workerGroupSpecs": [
                            {
                                "groupName": "gpu",
                                "replicas": rng.randint(2, 6),
                                "template": {"spec": {"containers": [_container("ray-worker", "rayproject/ray:2.35.0-gpu", 1)]}},
                            }
                        ],
                    },
                }
            )
            usage.append(("inference", f"{name}-gpu-worker-abcde", "ray-worker", rng.randint(4000, 30000), rng.randint(10, 60)))
    return objects, usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Directory to write workloads.yaml and usage.csv into.")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    objects, usage = generate(args.count, args.seed)
    (out / "workloads.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))
    with open(out / "usage.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["namespace", "pod", "container", "peak_memory_mib", "peak_utilization"])
        writer.writerows(usage)
    print(f"{len(objects)} workloads, {len(usage)} usage rows in {out}")


if __name__ == "__main__":
    main()
