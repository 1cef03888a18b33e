"""The job as Kubernetes manifests (written by ``--emit DIR``, applied by ``--apply``).

    esync-cluster --backend kubernetes --emit k8s/ --devices gpu0,gpu1,cpu --image REG/esync:1
    kubectl apply -f k8s/            # or: esync-cluster --backend kubernetes --emit k8s/ --apply

What is written (``NAME`` is ``--k8s-name``, default ``esync``):

- ``service.yaml``: a headless Service ``NAME`` (no cluster IP, addresses published before the
  pods are ready) giving the services' pod the stable DNS name ``ps.NAME``;
- ``ps.yaml``: the Pod ``NAME-ps`` with one container per service role: state server, scheduler,
  parameter server(s) and evaluator, so that ``DMLC_PS_ROOT_URI`` and the state server's address
  are both ``ps.NAME``;
- ``workers-cpu.yaml`` / ``workers-gpu.yaml``: one Indexed Job per device kind; pod i takes the
  i-th worker of its kind from ``JOB_COMPLETION_INDEX``; GPU workers request one
  ``nvidia.com/gpu`` each (the pod sees it as GPU 0) and run the GPU image (``--gpu-image``),
  CPU workers request their threads in CPUs (``esync.launch.resources``);
- ``configmap.yaml``: the ConfigMap ``NAME-plan`` holding ``plan.json``, every role's flags and
  environment (what ``plan_roles`` returns), which ``esync.launch.runner`` picks from;
- ``secret.yaml``: the Secret ``NAME-state-token`` (the state server's token, never in the plan);
- ``volume.yaml``: a ReadWriteMany PersistentVolumeClaim ``NAME-logs`` mounted at ``/logs`` in
  every pod: the usual log layout, which the evaluator reads too;
- ``Dockerfile``: the image of the pods without a GPU (repository in ``/app``, Fashion-MNIST in
  ``/data``, MXNet's CPU wheel); with GPU workers also ``Dockerfile.gpu``, the same on a CUDA
  image with the CUDA wheel of ``--cuda-wheel``; build and push them elsewhere, then give their
  names with ``--image`` and ``--gpu-image``.

Roles write their output to the container's standard output (``kubectl logs``); training logs go
to the volume.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

from esync.common import runlayout
from esync.common.errors import UsageError
from esync.launch import gpus
from esync.launch.backends.base import Backend, Handle
from esync.launch.launches import Launch, planned_devices
from esync.launch.resources import CUDA_VISIBLE_DEVICES
from esync.launch.roles import REPO, ClusterConfig, Host, Hosts, RoleSpec, plan_roles
from esync.launch.runner import device_kind, spec_to_json
from esync.launch.supervisor import Options

KUBERNETES_VERSION = "1.30.0"      # the API version the manifests are written and validated for
APP_DIR, DATA_DIR, LOG_DIR, PLAN_DIR = "/app", "/data", "/logs", "/etc/esync"
SCHEDULER_PORT, STATE_PORT = 9091, 8000
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$")
LABEL = "esync.io/job"

DOCKERFILE = """\
# The image of {which}, for esync-cluster --backend kubernetes.
# Build it from the repository's root and push it where the cluster pulls from:
#   docker build -f {rel}/{name} -t {tag} . && docker push {tag}
FROM {base}
{python}WORKDIR {app}
COPY pyproject.toml README.md config.py main.py ./
COPY esync ./esync
COPY state_server ./state_server
COPY scripts ./scripts
RUN pip install --no-cache-dir ".[{flavour}]" && \\
    python scripts/prepare_data.py --data-dir {data} --quiet
ENV PYTHONUNBUFFERED=1
"""
# The CUDA images are Ubuntu's: Python 3.11 from the deadsnakes archive, in a virtualenv, and
# MXNet's run-time libraries (libquadmath, libgomp).
CUDA_PYTHON = """\
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common \\
        gpg-agent libquadmath0 libgomp1 && \\
    add-apt-repository -y ppa:deadsnakes/ppa && \\
    apt-get install -y --no-install-recommends python3.11 python3.11-venv && \\
    rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
"""
GPU_DOCKERFILE = "Dockerfile.gpu"      # the GPU workers' image, beside the CPU one


def dockerfile(flavour: str, *, rel: str, name: str, tag: str) -> str:
    """The Dockerfile of an image with MXNet's `flavour` wheel (cpu, or a CUDA one)."""
    chosen = gpus.wheel(flavour)
    return DOCKERFILE.format(
        which=f"the GPU workers' pods ({chosen.package}, CUDA {chosen.cuda})" if chosen.cuda
        else "the pods without a GPU (services, evaluator, CPU workers; the CPU wheel)",
        rel=rel, name=name, tag=tag, base=chosen.image,
        python=CUDA_PYTHON if chosen.cuda else "", app=APP_DIR, flavour=flavour, data=DATA_DIR)


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UsageError(f"--k8s-name {name!r}: use lower-case letters, digits and '-', starting "
                         "with a letter (at most 42 characters)")
    return name


# The flags ----------------------------------------------------------------------------------

PLACED_BY = None              # --workers and --devices place the workers
CUDA_WHEELS = tuple(f for f, w in gpus.WHEELS.items() if w.cuda and w.image)
CPU_WORKER_CORES = 4          # a CPU worker pod's CPUs in a run of real devices (--threads: yours)


def add_arguments(parser) -> set[str]:
    """The Kubernetes backend's flags; returns their dests (launcher-only)."""
    k = parser.add_argument_group("kubernetes backend")
    k.add_argument("--emit", metavar="DIR", help="write the manifests and Dockerfile here")
    k.add_argument("--apply", action="store_true",
                   help="also kubectl apply them and watch the job (needs a cluster)")
    k.add_argument("--image", default="esync:latest",
                   help="the image of the pods without a GPU (Dockerfile: the CPU wheel)")
    k.add_argument("--gpu-image", default="esync-gpu:latest",
                   help="the image of the GPU workers' pods (Dockerfile.gpu: the CUDA wheel)")
    k.add_argument("--cuda-wheel", choices=CUDA_WHEELS, default=gpus.GPU_FLAVOUR,
                   help="the MXNet wheel of the GPU image (its CUDA version: the nodes' "
                        "driver must support it)")
    k.add_argument("--k8s-name", default="esync", help="name of the job's objects")
    k.add_argument("--namespace", help="namespace of the objects; default: kubectl's current one")
    k.add_argument("--volume-size", default="10Gi", help="size of the shared log volume")
    k.add_argument("--storage-class", help="storage class of the log volume (ReadWriteMany)")
    return {"emit", "apply", "image", "gpu_image", "cuda_wheel", "k8s_name", "namespace",
            "volume_size", "storage_class"}


def placed_devices(args) -> None:
    """Checks --emit and --k8s-name; the workers are placed by --workers and --devices."""
    if not args.emit:
        raise UsageError("--backend kubernetes needs --emit DIR (where the manifests go)")
    check_name(args.k8s_name)
    return None


def placement(name: str, devices: list[str]) -> Hosts:
    """The services' pod by its DNS name; worker pods by their hostname (``NAME-workers-KIND-I``,
    the log folder); their addresses are the pods' IPs, set when they start."""
    counts = {"cpu": 0, "gpu": 0}
    workers = []
    for device in devices:
        kind = device_kind(device)
        workers.append(Host(f"{name}-workers-{kind}-{counts[kind]}", ""))
        counts[kind] += 1
    return Hosts(ps=Host("ps", f"ps.{name}"), workers=tuple(workers))


def pod_plan(specs: list[RoleSpec]) -> list[dict]:
    """Specs as the pods run them: no token (it comes from the Secret), and each GPU worker on
    the one GPU its pod is given, which it sees as GPU 0 (``CUDA_VISIBLE_DEVICES=0``)."""
    plan = []
    for spec in specs:
        entry = spec_to_json(spec)
        entry["env"].pop("ESYNC_STATE_TOKEN", None)
        if entry["env"].get(CUDA_VISIBLE_DEVICES):
            entry["env"][CUDA_VISIBLE_DEVICES] = "0"
        plan.append(entry)
    return plan


class Manifests:
    """Builds every object of the job from its role specs."""

    def __init__(self, name: str, specs: list[RoleSpec], *, image: str, token: str,
                 gpu_image: str = "esync-gpu:latest", cuda_wheel: str = gpus.GPU_FLAVOUR,
                 volume_size: str = "10Gi", storage_class: str | None = None,
                 namespace: str | None = None):
        self.name, self.specs, self.image, self.token = name, specs, image, token
        self.gpu_image, self.cuda_wheel = gpu_image, cuda_wheel
        self.volume_size = volume_size
        self.storage_class, self.namespace = storage_class, namespace

    def meta(self, name: str, part: str) -> dict:
        meta = {"name": name, "labels": {LABEL: self.name, "esync.io/part": part}}
        if self.namespace:
            meta["namespace"] = self.namespace
        return meta

    def container(self, name: str, pick: list[str], resources: dict, ports=(),
                  image: str | None = None) -> dict:
        env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
               {"name": "ESYNC_STATE_TOKEN", "valueFrom": {"secretKeyRef": {
                   "name": f"{self.name}-state-token", "key": "token"}}}]
        container = {
            "name": name, "image": image or self.image, "workingDir": APP_DIR,
            "command": ["python", "-m", "esync.launch.runner", "--plan",
                        f"{PLAN_DIR}/plan.json", *pick, "--node-host-env", "POD_IP",
                        "--cwd", APP_DIR, "--log", "/dev/stdout"],
            "env": env, "resources": resources,
            "volumeMounts": [{"name": "logs", "mountPath": LOG_DIR},
                             {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True}]}
        if ports:
            container["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"}
                                  for n, p in ports]
        return container

    def volumes(self) -> list[dict]:
        return [{"name": "logs", "persistentVolumeClaim": {"claimName": f"{self.name}-logs"}},
                {"name": "plan", "configMap": {"name": f"{self.name}-plan"}}]

    def cpu(self, count: int) -> dict:
        return {"requests": {"cpu": str(count), "memory": "1Gi"}}

    def objects(self) -> dict[str, list[dict]]:
        """File name -> the objects it holds."""
        files = {
            "configmap.yaml": [{"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": self.meta(f"{self.name}-plan", "plan"),
                                "data": {"plan.json": json.dumps(pod_plan(self.specs),
                                                                 indent=1)}}],
            "secret.yaml": [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                             "metadata": self.meta(f"{self.name}-state-token", "token"),
                             "stringData": {"token": self.token}}],
            "volume.yaml": [self.volume()],
            "service.yaml": [self.service()],
            "ps.yaml": [self.ps_pod()],
        }
        for kind in ("cpu", "gpu"):
            workers = [s for s in self.specs
                       if s.kind == "worker" and device_kind(s.device) == kind]
            if workers:
                files[f"workers-{kind}.yaml"] = [self.worker_job(kind, len(workers))]
        return files

    def volume(self) -> dict:
        spec = {"accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": self.volume_size}}}
        if self.storage_class:
            spec["storageClassName"] = self.storage_class
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": self.meta(f"{self.name}-logs", "logs"), "spec": spec}

    def service(self) -> dict:
        return {"apiVersion": "v1", "kind": "Service", "metadata": self.meta(self.name, "ps"),
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                         "selector": {LABEL: self.name, "esync.io/part": "ps"},
                         "ports": [{"name": "scheduler", "port": SCHEDULER_PORT,
                                    "targetPort": SCHEDULER_PORT, "protocol": "TCP"},
                                   {"name": "state", "port": STATE_PORT,
                                    "targetPort": STATE_PORT, "protocol": "TCP"}]}}

    def ps_pod(self) -> dict:
        containers = []
        for spec in self.specs:
            if spec.kind == "worker":
                continue
            ports = {"scheduler": [("scheduler", SCHEDULER_PORT)],
                     "state": [("state", STATE_PORT)]}.get(spec.kind, [])
            containers.append(self.container(spec.name, ["--role", spec.name],
                                             self.cpu(1), ports))
        return {"apiVersion": "v1", "kind": "Pod", "metadata": self.meta(f"{self.name}-ps", "ps"),
                "spec": {"hostname": "ps", "subdomain": self.name, "restartPolicy": "Never",
                         "containers": containers, "volumes": self.volumes()}}

    def uses_gpus(self) -> bool:
        return any(s.kind == "worker" and device_kind(s.device) == "gpu" for s in self.specs)

    def worker_job(self, kind: str, count: int) -> dict:
        """The Indexed Job of one device kind; each pod requests its worker's threads in CPUs
        (and a GPU pod one ``nvidia.com/gpu``, on the GPU image)."""
        threads = max(int(s.env["OMP_NUM_THREADS"]) for s in self.specs
                      if s.kind == "worker" and device_kind(s.device) == kind)
        resources = self.cpu(threads)
        if kind == "gpu":
            resources = {"requests": {"cpu": str(threads), "memory": "2Gi"},
                         "limits": {"nvidia.com/gpu": "1"}}
        container = self.container("worker", ["--role", "worker", "--group", kind,
                                              "--index-env", "JOB_COMPLETION_INDEX"], resources,
                                   image=self.gpu_image if kind == "gpu" else None)
        name = f"{self.name}-workers-{kind}"
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": self.meta(name, f"workers-{kind}"),
                "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count,
                         "backoffLimit": 0,
                         "template": {"metadata": {"labels": {LABEL: self.name,
                                                              "esync.io/part": f"workers-{kind}"}},
                                      "spec": {"restartPolicy": "Never", "subdomain": self.name,
                                               "containers": [container],
                                               "volumes": self.volumes()}}}}

    def write(self, folder: Path, repo: Path) -> list[Path]:
        import yaml

        from esync.common.files import atomic_write_text
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for file_name, objects in self.objects().items():
            path = folder / file_name
            text = f"# esync job {self.name}: written by esync-cluster --backend kubernetes " \
                   f"for Kubernetes {KUBERNETES_VERSION}\n"
            text += "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects)
            # the token in secret.yaml: readable by its owner only
            atomic_write_text(path, text, perms=0o600 if file_name == "secret.yaml" else None)
            written.append(path)
        try:
            rel = os.path.relpath(folder.resolve(), Path(repo).resolve())
        except ValueError:
            rel = str(folder)
        atomic_write_text(folder / "Dockerfile", dockerfile("cpu", rel=rel, name="Dockerfile",
                                                            tag=self.image))
        if self.uses_gpus():
            atomic_write_text(folder / GPU_DOCKERFILE, dockerfile(
                self.cuda_wheel, rel=rel, name=GPU_DOCKERFILE, tag=self.gpu_image))
        return written


# --apply ----------------------------------------------------------------------------------------

def kubectl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["kubectl", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UsageError("--apply: kubectl is not installed; apply the manifests where it is "
                         "(kubectl apply -f DIR)") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 1, "", f"kubectl {args[0]}: no answer in "
                                                        f"{timeout:.0f} s")


def check_cluster(folder: Path) -> None:
    done = kubectl("version", "--request-timeout=15s", "-o", "json", timeout=30)
    if done.returncode != 0 or '"serverVersion"' not in done.stdout:
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UsageError(f"--apply: no Kubernetes cluster reachable with kubectl ({why}); the "
                         f"manifests are in {folder}: apply them where a cluster is")


class Pods:
    """The job's pods as kubectl sees them (one `kubectl get` per 2 s for every handle)."""

    def __init__(self, name: str, namespace: str | None):
        self.name, self.namespace = name, namespace
        self.items, self.at = [], 0.0

    def ns(self) -> list[str]:
        return ["-n", self.namespace] if self.namespace else []

    def refresh(self) -> list[dict]:
        if time.monotonic() - self.at > 2.0:
            done = kubectl("get", "pods", *self.ns(), "-l", f"{LABEL}={self.name}", "-o", "json")
            if done.returncode == 0:
                self.items = json.loads(done.stdout).get("items", [])
                self.at = time.monotonic()
        return self.items


class KubernetesHandle(Handle):
    def __init__(self, spec: RoleSpec, pods: Pods, pod_part: str, container: str,
                 index: int | None):
        super().__init__(spec)
        self.pods, self.part, self.container, self.index = pods, pod_part, container, index
        self.pod_name: str | None = None

    def _status(self) -> dict | None:
        for pod in self.pods.refresh():
            meta = pod["metadata"]
            if meta.get("labels", {}).get("esync.io/part") != self.part:
                continue
            index = meta.get("annotations", {}).get("batch.kubernetes.io/job-completion-index")
            if self.index is not None and index != str(self.index):
                continue
            self.pod_name = meta["name"]
            for status in pod.get("status", {}).get("containerStatuses", []):
                if status["name"] == self.container:
                    return status
        return None

    def poll(self) -> int | None:
        status = self._status()
        terminated = (status or {}).get("state", {}).get("terminated")
        return None if terminated is None else int(terminated.get("exitCode", 1))

    def terminate(self, hard: bool = False) -> None:
        if self.pod_name and self.poll() is None:
            kubectl("delete", "pod", *self.pods.ns(), self.pod_name, "--wait=false",
                    *(["--grace-period=0", "--force"] if hard else []))

    def tail(self, lines: int = 20) -> str:
        if not self.pod_name:
            return "(no pod yet)"
        done = kubectl("logs", *self.pods.ns(), self.pod_name, "-c", self.container,
                       f"--tail={lines}")
        return done.stdout if done.returncode == 0 else done.stderr.strip()

    def describe(self) -> str:
        return f"pod {self.pod_name}" if self.pod_name else "pod not scheduled yet"

    @property
    def log(self) -> str:
        return f"kubectl logs {self.pod_name or '?'} -c {self.container}"


class KubernetesBackend(Backend):
    """``kubectl apply`` the emitted folder; handles follow the pods; ``close`` deletes it all."""

    def __init__(self, manifests: Manifests, folder: Path, repo: Path):
        self.manifests, self.folder, self.repo = manifests, Path(folder), repo
        self.applied = False

    def start(self, specs: list[RoleSpec], proc_dir: Path) -> list[Handle]:
        if self.applied:
            raise NotImplementedError("restarting one role of a Kubernetes job in place")
        self.manifests.write(self.folder, self.repo)
        done = kubectl("apply", "-f", str(self.folder), timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl apply -f {self.folder} failed: {done.stderr.strip()}")
        self.applied = True
        pods = Pods(self.manifests.name, self.manifests.namespace)
        handles, counts = [], {"cpu": 0, "gpu": 0}
        for spec in specs:
            if spec.kind == "worker":
                kind = device_kind(spec.device)
                handles.append(KubernetesHandle(spec, pods, f"workers-{kind}", "worker",
                                                counts[kind]))
                counts[kind] += 1
            else:
                handles.append(KubernetesHandle(spec, pods, "ps", spec.name, None))
        return handles

    def close(self) -> None:
        if self.applied:
            kubectl("delete", "-f", str(self.folder), "--wait=false", "--ignore-not-found",
                    timeout=120)
            self.applied = False


# The launch ----------------------------------------------------------------------------------

class KubernetesLaunch(Launch):
    """Writes the manifests; with ``--apply`` runs them, else ``emit_only`` is True."""

    def __init__(self, args, parser):
        devices = planned_devices(args)
        # What the pods see: the image's paths and the volume, not this machine's (a copy:
        # the launcher's own flags stay as given).
        pods = argparse.Namespace(**{**vars(args), "log_dir": LOG_DIR,
                                     "data_dir": DATA_DIR})
        if getattr(pods, "tensorboard", None):
            pods.tensorboard = str(runlayout.mode_dir(pods))     # on the volume, by the logs
        super().__init__(pods, parser, hosts=placement(args.k8s_name, devices),
                         devices=devices)
        self.manifests = Manifests(
            args.k8s_name, plan_roles(self.config, self.hosts), image=args.image,
            token=self.token, gpu_image=args.gpu_image, cuda_wheel=args.cuda_wheel,
            volume_size=args.volume_size, storage_class=args.storage_class,
            namespace=args.namespace)
        self.emit_only = not args.apply

    def machines(self) -> tuple[list[str], dict[str, int], str]:
        """Each worker's pod is a machine of its own; a CPU worker's has ``CPU_WORKER_CORES``
        (what it requests), the coordination roles' pod is another."""
        pods = [host.name for host in self.hosts.workers]
        return pods, {pod: CPU_WORKER_CORES for pod in pods}, self.hosts.ps.name

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        return self.config_with(SCHEDULER_PORT, STATE_PORT, resume=resume,
                                overwrite=overwrite, python="python",
                                main_py=f"{APP_DIR}/main.py")

    def restart_plan(self, attempt: int):
        raise RuntimeError("a Kubernetes job is restarted by Kubernetes, not by esync-cluster")

    def prepare(self) -> bool:
        """Write the manifests (and with --apply check that a cluster answers)."""
        written = self.emit()
        print(f"esync-cluster: wrote {len(written)} manifests and a Dockerfile to "
              f"{self.args.emit} (Kubernetes {KUBERNETES_VERSION})")
        return not self.emit_only

    def supervision(self, options: Options) -> Options:
        # The logs are on the cluster's volume: rounds cannot be watched from here.
        options.stall_timeout = options.startup_timeout = float("inf")
        return options

    def finish(self, code: int) -> None:
        if code == 0:
            print(f"esync-cluster: done; the logs are on the volume {self.args.k8s_name}-logs")

    def emit(self) -> list[Path]:
        """Write the manifests; with --apply, then make sure a cluster answers."""
        written = self.manifests.write(Path(self.args.emit), REPO)
        if self.args.apply:
            check_cluster(Path(self.args.emit))
        return written

    def backend(self):
        return KubernetesBackend(self.manifests, Path(self.args.emit), REPO)

    def state_view(self) -> str:
        return f"  (see kubectl logs {self.args.k8s_name}-ps -c state-server)"
