"""esync-cluster --backend slurm against a real single-node Slurm 22.05 (munge, slurmctld, slurmd)."""
import json
import signal
import subprocess
import sys

import pytest

from support import (REPO, device_logs, processes_mentioning, run_cluster, wait_for_rounds,
                     write_fashion_dir)

JOB = ["--backend", "slurm", "--nodes", 1, "--node-devices", "cpu,cpu", "--time", 10,
       "-m", "esync", "-b", 8, "-e", 1]


@pytest.fixture(scope="module")
def finished_job(slurm, tmp_path_factory):
    """A 2-worker ESync job run to completion through Slurm: its log folder."""
    tmp = tmp_path_factory.mktemp("slurm-job")
    data = write_fashion_dir(tmp / "data")
    run_cluster(tmp / "logs", data, *JOB, "--max-rounds", 4, timeout=400,
                env={"SLURM_CONF": slurm.env["SLURM_CONF"]})
    return tmp / "logs"


def test_an_esync_job_through_slurm_logs_every_round_in_the_usual_layout(finished_job):
    logs = device_logs(finished_job / "lenet" / "esync")
    assert {name: len(rounds) for name, rounds in logs.items()} == {"cpu0": 4, "cpu1": 4}


def test_the_summary_command_reads_the_logs_of_a_slurm_job(finished_job, tmp_path):
    done = subprocess.run([sys.executable, "-m", "esync.analysis.summary", "-b", finished_job,
                           "-n", "lenet", "-m", "esync"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    summary = json.loads((finished_job / "lenet" / "esync" / "ESync.json").read_text())
    assert (done.returncode, summary["_totals"]["num_devices"]) == (0, 2)


def test_the_drawer_reads_the_logs_of_a_slurm_job(finished_job, tmp_path):
    done = subprocess.run([sys.executable, "-m", "esync.analysis.drawer", "-b", finished_job,
                           "-n", "lenet", "-o", tmp_path / "figures", "--target", "0.1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert (done.returncode, sorted(p.suffix for p in (tmp_path / "figures").iterdir())
            and any((tmp_path / "figures").glob("*.png"))) == (0, True), done.stderr


def start(launcher, slurm, tmp_path, data_dir):
    return launcher("-ld", tmp_path, "-dd", data_dir, "--quiet", *JOB, "--max-seconds", 300,
                    env={"SLURM_CONF": slurm.env["SLURM_CONF"]})


def test_scancel_ends_the_job_and_the_launcher_names_a_role(slurm, launcher, tmp_path,
                                                            fashion_data_dir):
    job = start(launcher, slurm, tmp_path, fashion_data_dir)
    wait_for_rounds(job, tmp_path / "lenet" / "esync", 2)
    subprocess.run(["scancel", *slurm.jobs()], env=slurm.env, check=True)
    _, err = job.communicate(timeout=120)
    assert (job.returncode, "died" in err, "Slurm job" in err and "is CANCELLED" in err) \
        == (1, True, True), err


def test_interrupt_cancels_the_slurm_job_and_leaves_nothing(slurm, launcher, tmp_path,
                                                            fashion_data_dir):
    job = start(launcher, slurm, tmp_path, fashion_data_dir)
    wait_for_rounds(job, tmp_path / "lenet" / "esync", 2)
    job.send_signal(signal.SIGINT)
    job.communicate(timeout=120)
    assert (job.returncode, slurm.jobs(), processes_mentioning(str(tmp_path))) == (130, [], [])
