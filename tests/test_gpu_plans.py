"""The GPU path without a GPU: what each backend plans for ``--devices gpu0,gpu1,cpu`` (each GPU
worker alone on its GPU, the CPU worker uncapped with the cores left), the staging decision of
mixed collectives, and the install's checks of a wheel against GPUs described by the seam."""
import os
import subprocess
import tomllib

import pytest

from support import REPO
from esync.common.argtypes import slowdown_factors
from esync.common.errors import UsageError
from esync.launch import gpus, resources
from esync.launch.backends import kubernetes, local, slurm
from esync.launch.flags import build_parser, parse
from esync.launch.roles import ClusterConfig, Hosts, coordination_roles, plan_roles

REAL = ["--workers", "3", "--devices", "gpu0,gpu1,cpu"]       # slow-down 1: real devices
VISIBLE = resources.CUDA_VISIBLE_DEVICES


def local_launch(tmp_path, monkeypatch, *argv, cores=32):
    """A local launch on a machine of `cores` cores (what sched_getaffinity would say)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    parser = build_parser()
    args = parser.parse_args(["-ld", str(tmp_path), *argv])
    args.slowdowns = slowdown_factors(args.slowdown_list or "1", args.workers)
    return local.LocalLaunch(args, parser)


def workers(specs):
    return {s.device: s for s in specs if s.kind == "worker"}


# -- local (and netns: the same plan, the same LocalBackend environment) -------------------------

def test_each_local_gpu_worker_sees_only_its_own_gpu_and_trains_on_it_as_gpu0(
        tmp_path, monkeypatch):
    planned = workers(local_launch(tmp_path, monkeypatch, *REAL).plan())
    assert {d: (s.env[VISIBLE], s.argv[s.argv.index("-g") + 1] if "-g" in s.argv else None,
                s.argv[s.argv.index("--device-name") + 1]) for d, s in planned.items()} == {
        "gpu0": ("0", "0", "gpu0"), "gpu1": ("1", "0", "gpu1"), "cpu0": ("", None, "cpu0")}


def test_the_services_and_the_evaluator_see_no_gpu(tmp_path, monkeypatch):
    specs = local_launch(tmp_path, monkeypatch, *REAL).plan()
    assert {s.name: s.env[VISIBLE] for s in specs if s.kind != "worker"} == {
        "state-server": "", "scheduler": "", "server0": "", "evaluator": ""}


def test_a_real_cpu_device_is_uncapped_and_gets_the_cores_the_others_leave(tmp_path,
                                                                          monkeypatch):
    launch = local_launch(tmp_path, monkeypatch, *REAL, cores=32)
    cpu = workers(launch.plan())["cpu0"]
    # 32 cores, less 2 for each GPU worker and 1 for the coordination roles
    assert (cpu.env["OMP_NUM_THREADS"], cpu.cpu_cores, "--emulation" in cpu.argv,
            "ESYNC_CPU_PIN" in cpu.env, launch.emulated) == ("27", None, False, False, False)


def test_the_resolved_threads_and_caps_are_data_on_the_plan(tmp_path, monkeypatch):
    found = local_launch(tmp_path, monkeypatch, *REAL, cores=32).resources()
    assert (found["emulated_devices"], [(w["device"], w["threads"], w["cpu_cores"],
                                         w["cuda_visible_devices"]) for w in found["workers"]]) \
        == (False, [("gpu0", 2, None, "0"), ("gpu1", 2, None, "1"), ("cpu0", 27, None, "")])


def test_threads_given_override_the_rule(tmp_path, monkeypatch):
    planned = workers(local_launch(tmp_path, monkeypatch, *REAL, "--threads", "3").plan())
    assert {d: s.env["OMP_NUM_THREADS"] for d, s in planned.items()} == \
        {"gpu0": "3", "gpu1": "3", "cpu0": "3"}


def test_an_emulated_run_keeps_one_thread_per_worker(tmp_path, monkeypatch):
    launch = local_launch(tmp_path, monkeypatch, "--workers", "2", "--slowdown", "1,4",
                          "--emulation", "sleep")
    assert (launch.emulated, [s.env["OMP_NUM_THREADS"] for s in workers(launch.plan()).values()]) \
        == (True, ["1", "1"])


def test_real_devices_never_ask_for_cpu_caps(tmp_path, monkeypatch):
    """At slow-down 1 the caps are not even tried: no cgroup, no warning."""
    from esync.emulation import cgroups

    def no_caps_wanted():
        raise AssertionError("CPU caps made for real devices")
    monkeypatch.setattr(cgroups, "CpuCaps", no_caps_wanted)
    args = build_parser().parse_args(["-ld", str(tmp_path), "--workers", "2", "--slowdown", "1"])
    args.slowdowns = [1.0, 1.0]
    assert local.cpu_caps(args) == (None, None)


def test_a_speed_schedule_makes_the_run_emulated(tmp_path, monkeypatch):
    launch = local_launch(tmp_path, monkeypatch, "--workers", "2", "--slowdown", "1",
                          "--speed-schedule", "cpu1:1@0,6@30", "--emulation", "sleep")
    assert launch.emulated


def test_a_gpu_index_is_one_of_the_gpus_the_launcher_may_use(tmp_path, monkeypatch):
    specs = workers(local_launch(tmp_path, monkeypatch, *REAL).plan())
    backend = local.LocalBackend(base_env={VISIBLE: "2,3"})
    assert [backend.environment(specs[d])[VISIBLE] for d in ("gpu0", "gpu1", "cpu0")] == \
        ["2", "3", ""]


def test_a_gpu_beyond_the_launchers_gpus_is_refused_with_both_named(tmp_path, monkeypatch):
    specs = workers(local_launch(tmp_path, monkeypatch, *REAL).plan())
    with pytest.raises(UsageError, match=r"gpu1 asked for, but only 1 GPU\(s\).*=5"):
        local.LocalBackend(base_env={VISIBLE: "5"}).environment(specs["gpu1"])


# -- the thread rule -----------------------------------------------------------------------------

@pytest.mark.parametrize("devices, machines, cores, want", [
    (["gpu0", "gpu1", "cpu"], ["a"] * 3, {"a": 32}, [2, 2, 27]),
    (["cpu", "cpu"], ["a", "a"], {"a": 9}, [4, 4]),              # 9 - 1, shared evenly
    (["cpu", "cpu"], ["a", "b"], {"a": 9, "b": 16}, [8, 16]),    # b holds no coordination
    (["gpu0", "cpu"], ["a", "a"], {"a": 2}, [2, 1]),             # at least one each
    (["cpu"], ["a"], {}, [1]),                                   # size unknown: nothing divided
])
def test_worker_threads_of_real_devices(devices, machines, cores, want):
    assert resources.worker_threads(devices, machines, cores, given=None, emulated=False,
                                    coordination_machine="a") == want


def test_coordination_roles_counts_what_plan_roles_starts():
    for collective, servers, state in (("ps", 2, 9000), ("allreduce", 1, None)):
        config = ClusterConfig(mode="esync", devices=("cpu",), slowdowns=(1.0,), port=9,
                               servers=servers, state_port=state, collective=collective)
        specs = plan_roles(config, Hosts.single("h", "10.0.0.1", 1))
        assert sum(s.kind != "worker" for s in specs) == coordination_roles(
            collective=collective, servers=servers, state_server=state is not None,
            evaluator=True)


# -- ssh -------------------------------------------------------------------------------------------

def test_over_ssh_each_gpu_worker_gets_its_gpu_and_the_cpu_the_hosts_cores(
        sshd, tmp_path, fashion_data_dir):
    from esync.launch.backends import ssh
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1 gpu0,gpu1,cpu\n")
    parser = build_parser()
    args = parse(parser, ["-ld", str(tmp_path / "logs"), "-dd", str(fashion_data_dir),
                          "--backend", "ssh", "--hostfile", str(hosts), "--ssh-config",
                          str(sshd.ssh_config)])
    launch = ssh.SshLaunch(args, parser)
    planned = workers(launch.plan())
    commands = {d: launch.backend().remote_command(s, tmp_path / "x.log")
                for d, s in planned.items()}
    cores = launch.cores["127.0.0.1"]
    assert ("CUDA_VISIBLE_DEVICES=1" in commands["gpu1"], "-g 0" in commands["gpu1"],
            "CUDA_VISIBLE_DEVICES= " in commands["cpu0"],
            planned["cpu0"].env["OMP_NUM_THREADS"]) == \
        (True, True, True, str(max(1, cores - 2 * resources.GPU_WORKER_THREADS - 1)))


# -- slurm -----------------------------------------------------------------------------------------

def slurm_launch(tmp_path, data_dir, *argv):
    parser = build_parser()
    args = parse(parser, ["-ld", str(tmp_path), "-dd", str(data_dir), "--backend", "slurm",
                          *argv])
    return slurm.SlurmLaunch(args, parser)


def test_slurm_gpu_workers_ask_for_their_gpus_and_at_least_two_cpus(tmp_path,
                                                                    fashion_data_dir):
    launch = slurm_launch(tmp_path, fashion_data_dir, "--node-devices", "gpu0,gpu1,cpu")
    params = launch.backend().params
    assert (params["cpus_per_task"] >= 2, params.get("slurm_gpus_per_node"),
            "slurm_gres" in params) == (True, 2, False)


def test_slurm_can_ask_for_gpus_as_generic_resources(tmp_path, fashion_data_dir):
    launch = slurm_launch(tmp_path, fashion_data_dir, "--node-devices", "gpu0,gpu1,cpu",
                          "--gpu-request", "gres")
    params = launch.backend().params
    assert (params.get("slurm_gres"), "slurm_gpus_per_node" in params) == ("gpu:2", False)


def test_slurm_plans_visible_gpus_by_name_and_the_cpu_worker_none(tmp_path, fashion_data_dir):
    launch = slurm_launch(tmp_path, fashion_data_dir, "--node-devices", "gpu0,gpu1,cpu")
    planned = workers(launch.plan())
    assert {d: s.env[VISIBLE] for d, s in planned.items()} == {"gpu0": "0", "gpu1": "1",
                                                              "cpu0": ""}


@pytest.mark.parametrize("names, allocated, want", [
    ("gpu1", "5", {"gpu1": "5"}),                    # one name, one GPU: the allocation's
    ("gpu0,gpu2", "3,7", {"gpu0": "3", "gpu2": "7"}),
    ("gpu0,gpu2", None, {"gpu0": "0", "gpu2": "1"}),  # no CUDA_VISIBLE_DEVICES from Slurm
])
def test_slurm_gpu_names_take_the_allocations_gpus_in_order(names, allocated, want):
    devices = names.split(",")
    slots = slurm.gpu_slots(devices)
    assert {d: slurm.task_gpu(resources.visible_devices(d), slots, allocated)
            for d in devices} == want


def test_slurm_asks_for_as_many_gpus_as_distinct_names(tmp_path, fashion_data_dir):
    launch = slurm_launch(tmp_path, fashion_data_dir, "--node-devices", "gpu2,cpu")
    assert launch.backend().params["slurm_gpus_per_node"] == 1


def test_slurm_refuses_fewer_gpus_than_names(tmp_path, fashion_data_dir):
    with pytest.raises(UsageError, match="names 2 distinct GPUs"):
        slurm_launch(tmp_path, fashion_data_dir, "--node-devices", "gpu0,gpu2",
                     "--gpus-per-node", "1")


@pytest.mark.parametrize("kwargs, want", [
    (dict(threads=None, gpus=True, emulated=False, node_cpus=None, tasks=7), 2),
    (dict(threads=None, gpus=True, emulated=False, node_cpus=64, tasks=8), 8),
    (dict(threads=None, gpus=False, emulated=False, node_cpus=2, tasks=6), 1),
    (dict(threads=None, gpus=False, emulated=True, node_cpus=64, tasks=6), 1),
    (dict(threads=1, gpus=True, emulated=False, node_cpus=64, tasks=6), 2),
    (dict(threads=5, gpus=False, emulated=False, node_cpus=64, tasks=6), 5),
])
def test_slurm_cpus_per_task(kwargs, want):
    assert slurm.cpus_per_task(**kwargs) == want


# -- kubernetes ------------------------------------------------------------------------------------

@pytest.fixture
def manifests(tmp_path):
    parser = build_parser()
    args = parse(parser, ["--backend", "kubernetes", "--emit", str(tmp_path / "k8s"), *REAL,
                          "--image", "reg/esync:1", "--gpu-image", "reg/esync-gpu:1"])
    launch = kubernetes.KubernetesLaunch(args, parser)
    launch.manifests.write(tmp_path / "k8s", REPO)
    return tmp_path / "k8s", launch.manifests.objects()


def pod_spec(objects, name):
    job, = objects[f"workers-{name}.yaml"]
    return job["spec"]["template"]["spec"]["containers"][0]


def test_kubernetes_gpu_pods_run_the_cuda_image_with_one_gpu_each(manifests):
    gpu, cpu = pod_spec(manifests[1], "gpu"), pod_spec(manifests[1], "cpu")
    assert (gpu["image"], gpu["resources"]["limits"], cpu["image"], "limits" in cpu["resources"],
            cpu["resources"]["requests"]["cpu"]) == \
        ("reg/esync-gpu:1", {"nvidia.com/gpu": "1"}, "reg/esync:1", False,
         str(kubernetes.CPU_WORKER_CORES))


def test_kubernetes_gpu_image_installs_the_cuda_wheel_instead_of_the_cpu_one(manifests):
    gpu = (manifests[0] / kubernetes.GPU_DOCKERFILE).read_text()
    cpu = (manifests[0] / "Dockerfile").read_text()
    assert (gpu.count("FROM nvidia/cuda:11.2"), '".[cu112]"' in gpu, '".[cpu]"' in gpu,
            '".[cpu]"' in cpu, "FROM python:3.11-slim" in cpu) == (1, True, False, True, True)


def test_kubernetes_gpu_workers_see_the_pods_one_gpu_as_gpu0(manifests):
    import json
    configmap, = manifests[1]["configmap.yaml"]
    plan = json.loads(configmap["data"]["plan.json"])
    assert {s["device"]: s["env"][VISIBLE] for s in plan if s["kind"] == "worker"} == \
        {"gpu0": "0", "gpu1": "0", "cpu0": ""}


def test_a_cpu_only_kubernetes_job_writes_no_gpu_image(tmp_path):
    parser = build_parser()
    args = parse(parser, ["--backend", "kubernetes", "--emit", str(tmp_path / "k8s"),
                          "--workers", "2"])
    kubernetes.KubernetesLaunch(args, parser).manifests.write(tmp_path / "k8s", REPO)
    assert not (tmp_path / "k8s" / kubernetes.GPU_DOCKERFILE).exists()


# -- mixed collectives ---------------------------------------------------------------------------

@pytest.mark.parametrize("nccl", [False, True])
def test_a_mixed_job_stages_every_gpu_rank_to_the_cpu_whatever_horovod_was_built_with(nccl):
    from esync.worker.allreduce import stages_on_cpu
    job = ["gpu", "gpu", "cpu"]
    assert [stages_on_cpu(d, job, nccl=nccl) for d in job] == [True, True, False]


@pytest.mark.parametrize("nccl, asked, want", [
    (True, "auto", False),      # every rank on a GPU, NCCL reduces there
    (False, "auto", True),      # Gloo reduces CPU tensors only
    (True, "cpu", True),        # asked for
])
def test_an_all_gpu_job_stages_only_without_nccl_or_when_asked(nccl, asked, want):
    from esync.worker.allreduce import stages_on_cpu
    assert stages_on_cpu("gpu", ["gpu", "gpu"], nccl=nccl, asked=asked) is want


@pytest.mark.parametrize("job, nccl, why", [
    (["gpu", "cpu"], True, "mixes CPU and GPU workers"),
    (["gpu", "gpu"], False, "no NCCL"),
])
def test_gpu_tensors_where_they_cannot_work_are_refused_with_why(job, nccl, why):
    from esync.worker.allreduce import stages_on_cpu
    with pytest.raises(UsageError, match=why):
        stages_on_cpu("gpu", job, nccl=nccl, asked="device")


# -- the install -----------------------------------------------------------------------------------

def setup_check(flavour, capabilities):
    return subprocess.run(["bash", "scripts/setup.sh", "--gpu", flavour, "--check-only"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, gpus.CAPABILITIES_ENV: capabilities})


def test_setup_accepts_gpus_the_wheel_has_kernels_for():
    done = setup_check("cu112", "8.6,7.0,8.9")
    assert (done.returncode, "runs on this machine's 3 GPU(s)" in done.stdout) == (0, True), \
        done.stderr


def test_setup_says_what_to_do_on_a_hopper_gpu():
    done = setup_check("cu112", "9.0")
    assert (done.returncode, "compute capability 9.0" in done.stderr,
            "build MXNet 1.9.1 from source" in done.stderr) == (1, True, True)


def test_setup_points_an_old_gpu_to_a_wheel_that_runs_on_it():
    done = setup_check("cu112", "3.7")
    assert (done.returncode, "use --gpu cu102 instead" in done.stderr) == (1, True)


def test_setup_refuses_a_cuda_wheel_without_a_gpu():
    done = setup_check("cu110", "")
    assert (done.returncode, "no GPU found" in done.stderr) == (1, True)


def test_setup_refuses_an_unknown_flavour():
    done = setup_check("cu999", "8.6")
    assert (done.returncode, "no MXNet 1.9.1 wheel 'cu999'" in done.stderr) == (2, True)


def test_the_packages_extras_are_the_wheels_the_checks_know():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert ({name: deps for name, deps in extras["optional-dependencies"].items()
             if name in gpus.WHEELS}, any(d.startswith("mxnet") for d in extras["dependencies"])) \
        == ({name: [w.requirement] for name, w in gpus.WHEELS.items()}, False)


@pytest.mark.parametrize("capability, flavour, runs", [
    ((8, 9), "cu112", True),     # sm_86 kernels run on sm_89
    ((8, 6), "cu110", True),     # sm_80 kernels run on sm_86
    ((9, 0), "cu112", False),    # no sm_9x kernels, no PTX
    ((3, 7), "cu110", False),
    ((3, 7), "cu102", True),
])
def test_a_wheel_runs_on_a_gpu_of_its_major_version_at_or_above_a_built_minor(
        capability, flavour, runs):
    assert gpus.runs_on(capability, gpus.WHEELS[flavour].architectures) is runs


def test_mxnet_seeing_fewer_gpus_than_the_driver_is_named():
    problems = gpus.check_gpus("cu112", [(8, 0), (8, 0)], mxnet_gpus=1)
    assert len(problems) == 1 and "MXNet sees 1 GPU(s) where the driver shows 2" in problems[0]


# -- the evaluator ---------------------------------------------------------------------------------

def test_an_evaluator_given_a_gpu_sees_it_alone_as_gpu0():
    config = ClusterConfig(mode="sync", devices=("gpu0", "cpu"), slowdowns=(1.0, 1.0), port=9,
                           evaluator_gpu=1)
    evaluator = next(s for s in plan_roles(config, Hosts.single("h", "10.0.0.1", 2))
                     if s.kind == "evaluator")
    assert (evaluator.env[VISIBLE], evaluator.argv[-4:]) == ("1", ["-c", "0", "-g", "0"])


def test_the_local_evaluator_takes_a_gpu_no_worker_uses_under_a_cuda_wheel(
        tmp_path, monkeypatch):
    monkeypatch.setenv(gpus.CAPABILITIES_ENV, "8.6,8.6,8.6")
    monkeypatch.setattr(gpus, "installed_flavour", lambda: "cu112")
    assert local_launch(tmp_path, monkeypatch, *REAL).config.evaluator_gpu == 2


def test_the_local_evaluator_stays_on_the_cpu_under_the_cpu_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv(gpus.CAPABILITIES_ENV, "8.6,8.6,8.6")
    assert local_launch(tmp_path, monkeypatch, *REAL).config.evaluator_gpu is None
