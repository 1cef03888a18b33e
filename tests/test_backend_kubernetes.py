"""esync-cluster --backend kubernetes: the emitted manifests, validated offline.

kubernetes-validate checks each object against the bundled OpenAPI schemas of the stated
Kubernetes version (no network, no cluster); --strict rejects any field the schema lacks.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from esync.launch.backends.kubernetes import KUBERNETES_VERSION
from esync.launch.runner import pick

DEVICES = "cpu,cpu,gpu0,gpu1"


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """The manifests of a 4-worker job (2 CPU, 2 GPU workers): {file name: [objects]}."""
    from support import REPO
    folder = tmp_path_factory.mktemp("k8s")
    done = subprocess.run([sys.executable, "-m", "esync.launch", "--backend", "kubernetes",
                           "--emit", str(folder / "manifests"), "--workers", "4", "--devices", DEVICES,
                           "--image", "registry.example/esync:1", "-m", "esync"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = folder / "manifests"
    return out, {p.name: list(yaml.safe_load_all(p.read_text())) for p in out.glob("*.yaml")}


def objects(emitted, kind):
    return [o for docs in emitted[1].values() for o in docs if o["kind"] == kind]


def test_every_emitted_manifest_passes_strict_validation(emitted):
    folder, _ = emitted
    tool = Path(sys.executable).with_name("kubernetes-validate")
    done = subprocess.run([str(tool if tool.exists() else shutil.which("kubernetes-validate")),
                           "--strict", "-k", KUBERNETES_VERSION,
                           *map(str, sorted(folder.glob("*.yaml")))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_job_has_every_object_the_design_names(emitted):
    kinds = sorted(o["kind"] for docs in emitted[1].values() for o in docs)
    assert kinds == ["ConfigMap", "Job", "Job", "PersistentVolumeClaim", "Pod", "Secret",
                     "Service"]


def test_the_service_is_headless_and_names_the_services_pod(emitted):
    service, = objects(emitted, "Service")
    pod, = objects(emitted, "Pod")
    assert (service["spec"]["clusterIP"], pod["spec"]["subdomain"],
            service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()) == \
        ("None", service["metadata"]["name"], True)


def test_the_services_pod_runs_scheduler_server_state_server_and_evaluator(emitted):
    pod, = objects(emitted, "Pod")
    assert [c["name"] for c in pod["spec"]["containers"]] == \
        ["state-server", "scheduler", "server0", "evaluator"]


def test_gpu_workers_request_one_gpu_each_and_cpu_workers_only_cpus(emitted):
    """Real devices (GPU devices: slow-down 1, nothing emulated): a CPU worker pod asks for the
    cores of a real CPU device, not an emulated one's single core."""
    from esync.launch.backends.kubernetes import CPU_WORKER_CORES
    jobs = {j["metadata"]["name"]: j["spec"]["template"]["spec"]["containers"][0]["resources"]
            for j in objects(emitted, "Job")}
    assert (jobs["esync-workers-gpu"]["limits"], "limits" in jobs["esync-workers-cpu"],
            jobs["esync-workers-cpu"]["requests"]["cpu"]) == (
        {"nvidia.com/gpu": "1"}, False, str(CPU_WORKER_CORES))


def test_each_device_kind_is_one_indexed_job_with_a_pod_per_worker(emitted):
    jobs = {j["metadata"]["name"]: j["spec"] for j in objects(emitted, "Job")}
    assert {name: (s["completionMode"], s["completions"], s["parallelism"])
            for name, s in jobs.items()} == {"esync-workers-cpu": ("Indexed", 2, 2),
                                             "esync-workers-gpu": ("Indexed", 2, 2)}


def test_the_completion_index_gives_each_pod_its_own_worker(emitted):
    configmap, = objects(emitted, "ConfigMap")
    plan = json.loads(configmap["data"]["plan.json"])
    picked = [pick(plan, "worker", kind, i)["device"] for kind in ("cpu", "gpu") for i in (0, 1)]
    assert picked == ["cpu0", "cpu1", "gpu0", "gpu1"]


def test_each_gpu_pod_trains_on_the_one_gpu_it_is_given(emitted):
    configmap, = objects(emitted, "ConfigMap")
    plan = json.loads(configmap["data"]["plan.json"])
    gpus = [s["argv"][s["argv"].index("-g") + 1] for s in plan if s["device"].startswith("gpu")]
    assert gpus == ["0", "0"]


def test_the_pods_get_no_path_of_this_machine(emitted):
    configmap, = objects(emitted, "ConfigMap")
    plan = json.loads(configmap["data"]["plan.json"])
    paths = {a for s in plan for a in s["argv"] + list(s["env"].values()) if a.startswith("/")}
    assert sorted(p for p in paths if not p.startswith(("/app/", "/logs", "/data"))) == []


def test_the_state_token_is_in_the_secret_only(emitted):
    secret, = objects(emitted, "Secret")
    token = secret["stringData"]["token"]
    others = "".join(p.read_text() for p in emitted[0].glob("*.yaml") if p.name != "secret.yaml")
    assert (len(token) >= 20, token in others, oct((emitted[0] / "secret.yaml").stat().st_mode
                                                   & 0o777)) == (True, False, "0o600")


def test_the_dockerfile_is_written_beside_the_manifests(emitted):
    text = (emitted[0] / "Dockerfile").read_text()
    assert text.splitlines()[-1].startswith("ENV") and "prepare_data.py" in text


def test_apply_without_a_reachable_cluster_is_one_clear_error(tmp_path):
    from support import REPO
    done = subprocess.run([sys.executable, "-m", "esync.launch", "--backend", "kubernetes",
                           "--emit", str(tmp_path / "k8s"), "--apply"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")})
    assert (done.returncode, done.stderr.startswith("esync-cluster: error: --apply:"),
            len(done.stderr.strip().splitlines())) == (2, True, 1), done.stderr
