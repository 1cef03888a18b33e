"""esync-cluster --backend slurm against a real single-node Slurm 22.05 (munge, slurmctld, slurmd)."""
import json
import signal
import subprocess
import sys

import pytest

from support import (REPO, device_logs, processes_mentioning, run_cluster, wait_for_rounds,
                     write_fashion_dir)

JOB = ["--backend", "slurm", "--nodes", 1, "--node-devices", "cpu,cpu", "--time", 10,
       "-m", "esync", "-n", "lenet", "-b", 8, "-e", 1]


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


# -- a job that can never start ------------------------------------------------------------------

@pytest.mark.parametrize("reason, final", [
    ("PartitionConfig", True),
    ("PartitionNodeLimit", True),
    ("PartitionTimeLimit", True),
    ("BadConstraints", True),
    ("InvalidAccount", True),
    ("InvalidQOS", True),
    ("QOSMaxCpuPerJobLimit", True),
    ("QOSMaxWallDurationPerJobLimit", True),
    ("QOSMaxGRESPerNode", True),
    ("QOSMinCpuNotSatisfied", True),
    ("AssocMaxNodePerJobLimit", True),
    ("DependencyNeverSatisfied", True),
    ("Resources", False),
    ("Priority", False),
    ("BeginTime", False),
    ("Dependency", False),
    ("None", False),
    ("", False),
    ("JobHeldUser", False),
    ("PartitionDown", False),
    ("QOSMaxCpuPerUserLimit", False),
    ("QOSMaxJobsPerUserLimit", False),
    ("AssocGrpCpuLimit", False),
    ("AssocMaxJobsLimit", False),
    ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
     "partitions", False),
])
def test_pending_reasons_that_can_never_clear_are_told_from_transient_ones(reason, final):
    from esync.launch.backends import slurm as backend
    fix = backend.never_starts(reason)
    assert (fix is not None) == final
    assert fix is None or fix in backend.NEVER_STARTS.values()


@pytest.mark.parametrize("usable, nodes, final", [(None, 1, False), (1, 1, False), (2, 3, True),
                                                  (0, 1, True)])
def test_req_node_not_avail_is_final_only_without_enough_usable_nodes(usable, nodes, final):
    from esync.launch.backends import slurm as backend
    fix = backend.never_starts("ReqNodeNotAvail, UnavailableNodes:n[1-2]", usable_nodes=usable,
                               nodes=nodes)
    assert (fix is not None) == final


def test_usable_nodes_are_those_neither_down_drained_nor_failing():
    from esync.launch.backends import slurm as backend
    sinfo = "n1|idle\nn2|drained\nn3|down*\nn4|mixed\nn4|mixed\nn5|draining\nn6|idle~\nn7|fail\n"
    assert backend.usable_node_count(sinfo) == 3            # n1, n4 (listed twice), n6


def test_a_job_the_node_cannot_hold_ends_the_launcher_at_once_naming_the_reason(
        slurm, launcher, tmp_path, fashion_data_dir):
    """More CPUs per task than the node has: Slurm keeps it pending (PartitionConfig) for ever."""
    before = set(slurm.jobs())
    try:
        job = launcher("-ld", tmp_path, "-dd", fashion_data_dir, "--quiet", *JOB,
                       "--threads", slurm.cpus + 1, env={"SLURM_CONF": slurm.env["SLURM_CONF"]})
        try:
            _, err = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the launcher still waits for a job that can never start")
        assert (job.returncode != 0, "can never start" in err, "PartitionConfig" in err,
                "--threads" in err, set(slurm.jobs()) - before) \
            == (True, True, True, True, set()), err
    finally:                                     # the launcher fixture ends the launcher itself
        left = set(slurm.jobs()) - before
        if left:
            subprocess.run(["scancel", *left], env=slurm.env, capture_output=True)
