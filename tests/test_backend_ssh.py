"""esync-cluster --backend ssh against a real sshd on 127.0.0.1 (key auth from a temporary folder)."""
import importlib.util
import json
import signal
import subprocess

import pytest

from support import device_logs, processes_mentioning, run_cluster, wait_for_rounds

JOB = ["-m", "esync", "-n", "lenet", "-b", 8, "-e", 1]


def hostfile(tmp_path, text="127.0.0.1 cpu,cpu\n"):
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return path


def ssh_args(tmp_path, sshd):
    return ["--backend", "ssh", "--hostfile", hostfile(tmp_path), "--ssh-config",
            sshd.ssh_config]


@pytest.fixture(scope="module")
def finished_job(sshd, tmp_path_factory):
    """A 2-worker ESync job run to completion over ssh: (log folder, launcher result)."""
    from support import write_fashion_dir
    tmp = tmp_path_factory.mktemp("ssh-job")
    data = write_fashion_dir(tmp / "data")
    done = run_cluster(tmp / "logs", data, *ssh_args(tmp, sshd), *JOB, "--max-rounds", 4,
                       timeout=400)
    return tmp / "logs", done


def test_an_esync_job_over_ssh_logs_every_round_in_the_usual_layout(finished_job):
    log_dir, _ = finished_job
    logs = device_logs(log_dir / "lenet" / "esync")
    assert {name: len(rounds) for name, rounds in logs.items()} == {"cpu0": 4, "cpu1": 4}


def test_the_summary_of_an_ssh_job_covers_both_workers(finished_job):
    log_dir, _ = finished_job
    summary = json.loads((log_dir / "lenet" / "esync" / "ESync.json").read_text())
    assert summary["_totals"]["num_devices"] == 2


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is not installed: `bash scripts/setup.sh` builds it (it "
                           "needs cmake and g++)")
def test_an_allreduce_job_over_ssh_runs_horovods_rendezvous_and_every_round(sshd, tmp_path,
                                                                          fashion_data_dir):
    run_cluster(tmp_path / "logs", fashion_data_dir, *ssh_args(tmp_path, sshd), *JOB,
                "--collective", "allreduce", "--max-rounds", 3, "--no-evaluator", timeout=400)
    mode_dir = tmp_path / "logs" / "lenet" / "esync"
    logs = device_logs(mode_dir)
    assert {name: [r["rank"] for r in rounds] for name, rounds in logs.items()} == {
        "cpu0": [0, 0, 0], "cpu1": [1, 1, 1]}
    assert (mode_dir / "processes" / "rendezvous.log").exists()


def test_interrupt_stops_the_processes_on_the_remote_host(sshd, launcher, tmp_path,
                                                          fashion_data_dir):
    job = launcher("-ld", tmp_path, "-dd", fashion_data_dir, "--quiet",
                   *ssh_args(tmp_path, sshd), *JOB, "--max-seconds", 300)
    wait_for_rounds(job, tmp_path / "lenet" / "esync", 2)
    job.send_signal(signal.SIGINT)
    job.communicate(timeout=90)
    assert (job.returncode, processes_mentioning(str(tmp_path))) == (130, [])


def test_a_killed_remote_worker_is_named_with_its_log(sshd, launcher, tmp_path,
                                                      fashion_data_dir):
    job = launcher("-ld", tmp_path, "-dd", fashion_data_dir, "--quiet",
                   *ssh_args(tmp_path, sshd), *JOB, "--max-seconds", 300)
    wait_for_rounds(job, tmp_path / "lenet" / "esync", 2)
    victim = [p for p in processes_mentioning(str(tmp_path))
              if "--device-name cpu1" in _command_line(p)
              and "esync.launch.runner" not in _command_line(p)]
    subprocess.run(["kill", "-KILL", *map(str, victim)], check=True)
    _, err = job.communicate(timeout=90)
    assert "worker-cpu1 died (killed by signal SIGKILL)" in err and "cpu1] round" in err


def _command_line(pid):
    with open(f"/proc/{pid}/cmdline") as f:
        return f.read().replace("\0", " ")


def test_an_unreachable_host_is_refused_before_anything_starts(tmp_path, fashion_data_dir):
    config = tmp_path / "ssh_config"
    config.write_text("Host 127.0.0.1\n  Port 1\n  BatchMode yes\n")
    done = run_cluster(tmp_path / "logs", fashion_data_dir, "--backend", "ssh", "--hostfile",
                       hostfile(tmp_path), "--ssh-config", config, check=False, timeout=120)
    assert (done.returncode, done.stderr.strip().splitlines()[-1].startswith(
        "esync-cluster: error: --hostfile: cannot ssh to 127.0.0.1")) == (2, True)


@pytest.mark.parametrize("text, message", [
    ("127.0.0.1\n", "line 1: expected 'ADDRESS DEVICES'"),
    ("127.0.0.1 cpu,tpu0\n", "line 1: 'tpu0' is not a device"),
    ("# lab\n10.0.0.1 cpu\n10.0.0.1 gpu0\n", "line 3: host 10.0.0.1 is listed twice"),
    ("# nothing\n", "no hosts in it"),
])
def test_a_bad_hostfile_is_one_clear_line(tmp_path, fashion_data_dir, text, message):
    done = run_cluster(tmp_path / "logs", fashion_data_dir, "--backend", "ssh", "--hostfile",
                       hostfile(tmp_path, text), check=False, timeout=120)
    assert (done.returncode, message in done.stderr, len(done.stderr.strip().splitlines())) \
        == (2, True, 1)
