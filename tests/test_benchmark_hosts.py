"""esync-benchmark on the user's own machines (--backend ssh / slurm): the emulation's options
refused, bad host files and unreachable hosts refused before anything starts, and the benchmark
run end to end against a real sshd on 127.0.0.1 and a real single-node Slurm (small budgets),
writing the usual report with the hosts and devices named and each device measured alone."""
import json
import shutil
import subprocess
import sys

import pytest

from support import REPO, write_fashion_dir
from esync import benchmark
from esync.benchmark import own_machines
from esync.common.errors import UsageError

# The smallest benchmark that still has a cluster row and one device alone.
SMALL = ["--modes", "esync,local", "--aggregations", "weighted+nesterov=0.9+gl=0.7+share=1+carry",
         "--tune-lr", "none", "--data", "iid", "--repeats", "1", "--budget", "4",
         "--probe-seconds", "2"]


def hostfile(tmp_path, text="127.0.0.1 cpu,cpu\n"):
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return path


def bench(*argv, timeout=900, env=None):
    """``python -m esync.benchmark ARGV`` from the repository, to its end."""
    return subprocess.run([sys.executable, "-m", "esync.benchmark", *map(str, argv)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def parse(tmp_path, data, *argv):
    return benchmark.parse_args(["-dd", str(data), "--out", str(tmp_path / "out"),
                                 *map(str, argv)])


# ----------------------------------------------------------------------------- refused at once

@pytest.mark.parametrize("flags, message", [
    (["--slowdown", "1,2"], "argument --slowdown: emulated slow-downs"),
    (["--workers", "2"], "argument --workers: the number of emulated devices"),
    (["--net", "netns"], "argument --net netns: emulated links"),
    (["--net", "both"], "argument --net both: emulated links"),
    (["--scenarios", "static,shifting"], "argument --scenarios static,shifting: the shifting"),
    (["--cpu-share", "0.5"], "argument --cpu-share: a CPU cap, only on the emulated cluster"),
    (["--bandwidth", "10mbit"], "argument --bandwidth: a shaped link rate"),
    (["--emulation", "cpu-cap"], "argument --emulation cpu-cap: emulated slow devices"),
])
def test_an_emulation_option_with_a_real_backend_is_refused_naming_the_fix(
        tmp_path, fashion_data_dir, flags, message):
    with pytest.raises(UsageError) as caught:
        parse(tmp_path, fashion_data_dir, "--backend", "ssh", "--hostfile", hostfile(tmp_path),
              *flags)
    assert (message in str(caught.value), "every device runs as it is" in str(caught.value),
            f"leave {flags[0]} out" in str(caught.value)) == (True, True, True), caught.value


def test_a_backend_flag_without_its_backend_is_the_launchers_refusal(tmp_path,
                                                                    fashion_data_dir):
    with pytest.raises(UsageError, match="--hostfile belongs to another backend: add --backend"):
        parse(tmp_path, fashion_data_dir, "--hostfile", hostfile(tmp_path))


def test_a_bad_host_file_line_is_the_launchers_message(tmp_path, fashion_data_dir):
    with pytest.raises(UsageError, match="line 1: 'tpu0' is not a device; use cpu or gpuN"):
        parse(tmp_path, fashion_data_dir, "--backend", "ssh", "--hostfile",
              hostfile(tmp_path, "127.0.0.1 cpu,tpu0\n"))


def test_an_unreachable_host_is_refused_before_anything_starts(tmp_path, fashion_data_dir):
    config = tmp_path / "ssh_config"
    config.write_text("Host 127.0.0.1\n  Port 1\n  BatchMode yes\n")
    done = bench("--backend", "ssh", "--hostfile", hostfile(tmp_path), "--ssh-config", config,
                 "-dd", fashion_data_dir, "--out", tmp_path / "out", *SMALL, timeout=300)
    assert (done.returncode, done.stderr.strip().splitlines(),
            (tmp_path / "out").exists()) == (2, [
                "esync-benchmark: error: --hostfile: cannot ssh to 127.0.0.1: ssh: connect to "
                "host 127.0.0.1 port 1: Connection refused (keys must allow logging in without "
                "a password; see --ssh-config)"], False)


@pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm client (sinfo) here")
def test_a_slurm_that_does_not_answer_is_refused_before_anything_starts(
        tmp_path, fashion_data_dir, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    monkeypatch.setattr(own_machines, "SINFO_TIMEOUT_S", 5.0)   # sinfo may wait for a controller
    with pytest.raises(UsageError, match=r"--backend slurm: Slurm does not answer \(.*\): check "
                                         "SLURM_CONF and that slurmctld runs"):
        parse(tmp_path, fashion_data_dir, "--backend", "slurm")


# ----------------------------------------------------------------------------- pure parts

def machines(backend="ssh", devices=(("127.0.0.1", "cpu", "cpu0", 1),)):
    """A hand-made real cluster: (host, device, worker name, threads) per worker."""
    target = (lambda host: host) if backend == "ssh" else (lambda host: own_machines.ANY_NODE)
    return own_machines.Machines(
        backend, [own_machines.PlacedDevice(host, target(host), device, worker, threads)
                  for host, device, worker, threads in devices],
        ["--backend", backend], ssh_base=["ssh", "-T", "-o", "BatchMode=yes"],
        python="/opt/py", repo="/srv/my repo")


def test_slowdowns_are_each_devices_probe_over_the_fastest():
    m = machines(devices=(("a", "cpu", "cpu0", 2), ("a", "gpu0", "gpu0", 2),
                          ("b", "cpu", "cpu1", 4)))
    m.probes = {("a", "cpu"): {"iteration_s": 0.3}, ("a", "gpu0"): {"iteration_s": 0.1},
                ("b", "cpu"): {"iteration_s": None}}
    assert m.slowdowns() == [3.0, 1.0, 1.0]


def test_workers_on_one_device_of_one_host_share_one_probe():
    m = machines(devices=(("a", "cpu", "cpu0", 1), ("a", "cpu", "cpu1", 1),
                          ("b", "cpu", "cpu2", 1)))
    assert [d.key for d in m.distinct] == [("a", "cpu"), ("b", "cpu")]


def test_a_run_on_a_remote_device_gets_a_terminal_its_threads_and_quoted_paths():
    m = machines(devices=(("10.0.0.2", "gpu1", "gpu1", 2),))
    prefix, argv = m.on_device(m.devices[0], [sys.executable, "main.py", "-m", "local", "-c",
                                              "1", "-ld", "/logs/a b"])
    assert prefix[:2] == ["ssh", "-tt"] and prefix[-2] == "10.0.0.2"
    assert ("cd '/srv/my repo' && exec env" in prefix[-1], "OMP_NUM_THREADS=2" in prefix[-1],
            "CUDA_VISIBLE_DEVICES=1" in prefix[-1]) == (True, True, True)
    assert argv == ["/opt/py", "'/srv/my repo/main.py'", "-m", "local", "-c", "0", "-g", "0",
                    "-ld", "'/logs/a b'"]


def test_a_slurm_step_asks_for_the_threads_and_leaves_the_gpu_to_slurm():
    m = machines("slurm", devices=(("node0", "gpu0", "gpu0", 3),))
    prefix, _ = m.on_device(m.devices[0], [sys.executable, "main.py", "-c", "1"])
    export = next(a for a in prefix if a.startswith("--export="))
    assert (prefix[0], prefix[prefix.index("--cpus-per-task") + 1], "--gpus-per-node=1" in prefix,
            "OMP_NUM_THREADS=3" in export, "CUDA_VISIBLE_DEVICES" in export) \
        == ("srun", "3", True, True, False)


def test_the_spelled_out_command_leaves_the_emulation_out_and_names_the_backend():
    class Args:
        machines = machines()
        probe_seconds = 5.0
    argv = ["esync-benchmark", "--workers", "4", "--slowdown", "1,1,4,8", "--net", "both",
            "--budget", "40", "--emulation", "auto", "--no-cpu-pinning", "--out", "o"]
    assert own_machines.canonical_argv(Args, argv) == [
        "esync-benchmark", "--budget", "40", "--out", "o", "--backend", "ssh",
        "--probe-seconds", "5"]


def test_a_device_that_fails_alone_stops_the_benchmark_naming_it_and_its_log(
        tmp_path, fashion_data_dir):
    from esync.benchmark import probes
    from esync.benchmark.runs import Progress
    args = parse(tmp_path, fashion_data_dir, "--modes", "local")
    args.machines = machines(devices=(("10.9.9.9", "gpu3", "gpu3", 1),))
    args.machines.ssh_base = ["sh", "-c", "exit 3", "-T"]   # a remote run that fails at once
    with pytest.raises(probes.ProbeFailed) as caught:
        with probes.RealDevices(args, tmp_path / "out", Progress(1, open(tmp_path / "p", "w"))):
            pass
    assert ("gpu3 on 10.9.9.9 (exit code 3; see" in str(caught.value),
            "probe-gpu3@10.9.9.9.log" in str(caught.value)) == (True, True), caught.value


# ----------------------------------------------------------------------------- over ssh

def ssh_flags(tmp_path, sshd, text="127.0.0.1 cpu,cpu\n"):
    return ["--backend", "ssh", "--hostfile", hostfile(tmp_path, text), "--ssh-config",
            sshd.ssh_config]


def test_a_gpu_the_host_does_not_have_is_refused_naming_its_gpus(sshd, tmp_path,
                                                                 fashion_data_dir):
    with pytest.raises(UsageError) as caught:
        parse(tmp_path, fashion_data_dir, *ssh_flags(tmp_path, sshd, "127.0.0.1 cpu,gpu99\n"))
    assert ("--hostfile: host 127.0.0.1 has" in str(caught.value),
            "not gpu99: fix its line of the host file" in str(caught.value)) == (True, True)


def test_the_plan_runs_every_cluster_row_through_the_backend_without_emulation(
        sshd, tmp_path, fashion_data_dir):
    args = parse(tmp_path, fashion_data_dir, *ssh_flags(tmp_path, sshd), *SMALL)
    from esync.benchmark import plan
    jobs = plan.full_jobs(args, tmp_path / "out", plan.rows(args), plan.settings(args, None),
                          {"esync-weighted-nesterov0.9-gl0.7-share1-carry": 0.001,
                           "local": 0.001})
    cluster = next(j for j in jobs if not j.standalone)
    assert ([j.setting.name for j in jobs], args.workers,
            cluster.argv[cluster.argv.index("--backend"):][:4],
            {"--slowdown", "--workers", "--emulation", "--net"} & set(cluster.argv)) \
        == (["machines", "machines"], 2, ["--backend", "ssh", "--hostfile",
                                           str(tmp_path / "hosts.txt")], set())


@pytest.fixture(scope="module")
def ssh_bench(sshd, tmp_path_factory):
    """The small benchmark run to its end over ssh: (report folder, finished process)."""
    tmp = tmp_path_factory.mktemp("ssh-bench")
    data = write_fashion_dir(tmp / "data", train_per_class=100, test_per_class=30)
    done = bench(*ssh_flags(tmp, sshd), "-dd", data, "--out", tmp / "out", *SMALL)
    return tmp / "out", done


def test_the_benchmark_over_ssh_writes_the_usual_report_files(ssh_bench):
    out, done = ssh_bench
    assert (done.returncode, (out / "report.md").exists(), (out / "benchmark.json").exists(),
            any((out / "figures").glob("*.png"))) == (0, True, True, True), done.stderr


def test_the_report_names_the_hosts_and_devices_with_each_ones_time_alone(ssh_bench):
    out, _ = ssh_bench
    text = (out / "report.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| cpu")]
    assert ("2 real devices on 1 host(s) (127.0.0.1)" in text, "nothing emulated" in text,
            [line.split(" | ")[:3] for line in table]) \
        == (True, True, [["| cpu0", "127.0.0.1", "cpu"], ["| cpu1", "127.0.0.1", "cpu"]])


def test_each_device_was_measured_alone_before_the_runs(ssh_bench):
    out, _ = ssh_bench
    data = json.loads((out / "benchmark.json").read_text())["machines"]
    probes = [d["probe"]["iteration_s"] for d in data["devices"]]
    assert ([d["worker"] for d in data["devices"]], all(t and t > 0 for t in probes),
            data["standalone_device"]) == (["cpu0", "cpu1"], True,
                                           {"host": "127.0.0.1", "device": "cpu"})


def test_the_runs_went_through_the_backend_and_one_device_alone_over_ssh(ssh_bench):
    out, _ = ssh_bench
    runs = json.loads((out / "benchmark.json").read_text())["runs"]
    cluster = next(r for r in runs if r["name"] != "local")
    alone = next(r for r in runs if r["name"] == "local")
    assert (all(r["ok"] for r in runs), "--backend" in cluster["argv"],
            "--slowdown" in cluster["argv"], alone["prefix"][:2]) \
        == (True, True, False, ["ssh", "-tt"])


# ----------------------------------------------------------------------------- through Slurm

def alone_only() -> list[str]:
    """SMALL with one device alone as its only row (the cluster rows' Slurm jobs are the
    launcher's, tested in test_backend_slurm)."""
    argv = list(SMALL)
    argv[argv.index("--modes") + 1] = "local"
    return argv


def test_one_device_alone_and_its_probe_run_as_slurm_steps(slurm, tmp_path):
    data = write_fashion_dir(tmp_path / "data", train_per_class=100, test_per_class=30)
    done = bench("--backend", "slurm", "--node-devices", "cpu,cpu", "--time", 10, "-dd", data,
                 "--out", tmp_path / "out", *alone_only(),
                 env={**slurm.env})
    report = json.loads((tmp_path / "out" / "benchmark.json").read_text())
    alone = next(r for r in report["runs"] if r["name"] == "local")
    probe = report["machines"]["devices"][0]["probe"]
    assert (done.returncode, alone["ok"], alone["prefix"][0], probe["iteration_s"] > 0,
            probe["command"].startswith("srun ")) == (0, True, "srun", True, True), done.stderr
