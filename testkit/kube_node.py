"""The node the Kubernetes tests run on: a simulated node of five pods (cgroup v1 and v2,
containerd, Docker and CRI-O, a static pod, one the API does not know), and the API
objects and kubelet assignments that describe them."""

from __future__ import annotations

from otel_vgpu.sim.proc_tree import container_id
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.kube_api_double import KubeApiDouble, pod_object
from testkit.kubelet_double import KubeletDouble

NODE = "node-a"
U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
TRAINER = "7fda01c4-0ece-403d-88b4-c371d66d132a"
API = "2c9f8a79-5391-454b-88cb-86190881cb96"
IDLE = "a5c1f8d5-1919-434d-add7-4afaafdaef89"
ORPHAN = "0e886e9a-3879-45f9-b44d-86ef9df03224"
STATIC_HASH = "09a70ae9ccc491e651e5c773579b3490"
SCENARIO = f"""
gpus:
  - {{memory: 80GiB, uuid: {U0}}}
  - {{memory: 80GiB, uuid: {U1}}}
pods:
  - name: sim-trainer
    uid: {TRAINER}
    cgroup: {{version: 2, driver: systemd, runtime: containerd}}
    processes:
      - {{gpu: 0, memory: 10GiB, sm: 0.5, container: trainer}}
      - {{gpu: 1, memory: 4GiB, sm: 0.25, container: trainer}}
      - {{gpu: 0, memory: 2GiB, sm: 0.1, container: sidecar}}
  - name: sim-api
    uid: {API}
    cgroup: {{version: 1, driver: cgroupfs, runtime: docker}}
    processes:
      - {{gpu: 1, memory: 3GiB, sm: 0.0}}
  - name: sim-idle
    uid: {IDLE}
  - name: sim-probe
    static: true
    uid: {STATIC_HASH}
    cgroup: {{version: 2, driver: cgroupfs, runtime: crio}}
    processes:
      - {{gpu: 0, memory: 256MiB, sm: 0.02}}
  - name: sim-orphan
    uid: {ORPHAN}
    processes:
      - {{gpu: 1, memory: 1GiB, sm: 0.05}}
host_processes:
  - {{gpu: 0, memory: 512MiB, sm: 0.0}}
"""
SIM = {pod.name: pod for pod in parse_scenario(SCENARIO, "k8s.yaml").pods}


def cid(sim_name: str, container: str) -> str:
    return container_id(SIM[sim_name], container)


def populate(api: KubeApiDouble, kubelet: KubeletDouble) -> None:
    api.put(
        pod_object(
            "ml",
            "trainer-7f9c",
            TRAINER,
            NODE,
            containers={"trainer": cid("sim-trainer", "trainer"), "sidecar": cid("sim-trainer", "sidecar")},
            gpu_limits={"trainer": 3},
        )
    )
    api.put(pod_object("web", "api-0", API, NODE, containers={"main": cid("sim-api", "main")}, gpu_limits={"main": 1}))
    api.put(pod_object("web", "idle-0", IDLE, NODE, gpu_limits={"main": 1}))
    api.put(
        pod_object(
            "kube-system",
            "gpu-probe-node-a",
            "f3b5c0de-0000-4000-8000-000000000001",
            NODE,
            annotations={
                "kubernetes.io/config.hash": STATIC_HASH,
                "kubernetes.io/config.mirror": STATIC_HASH,
                "kubernetes.io/config.source": "file",
            },
        )
    )
    api.put(pod_object("web", "elsewhere", "99999999-0000-4000-8000-000000000000", "node-b"))
    kubelet.assign("ml", "trainer-7f9c", {"trainer": [f"{U0}::0", f"{U0}::1", f"{U1}::0"]})
    kubelet.assign("web", "api-0", {"main": [f"{U1}::1"]})
    kubelet.assign("web", "idle-0", {"main": [f"{U0}::2"]})
    kubelet.list_pod("kube-system", "gpu-probe-node-a")  # listed, as every pod is, with no device
