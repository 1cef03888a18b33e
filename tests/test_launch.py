"""The one-command local cluster: failures stop everything, bad input is refused, runs resume."""
import json
import os
import re
import signal
import socket
import time

import pytest

from support import (REPO, copy_of_finished_run, device_logs, processes_mentioning, processes_of,
                     run_cluster, write_fashion_dir)


def quiet(log_dir, data_dir, *args):
    """The flags of a quiet cluster logging into log_dir."""
    return ["-ld", log_dir, "-dd", data_dir, "--quiet", *args]


def wait_for_rounds(launcher, mode_dir, device, rounds, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise AssertionError(f"launcher ended early: {launcher.communicate()}")
        if len(list(mode_dir.glob(f"*/{device}/iter-*.txt"))) >= rounds:
            return
        time.sleep(0.2)
    raise AssertionError(f"{device} did not reach round {rounds}")


def worker_pid(folder, device):
    """The pid of the worker process on `device` of the cluster logging into `folder`."""
    pids = [p for p in processes_mentioning(str(folder)) if "main.py" in _cmdline(p)
            and f"--device-name {device} " in _cmdline(p) + " "]
    assert len(pids) == 1, pids
    return pids[0]


def wait_until_gone(folder, timeout=15):
    """Wait until no process names `folder`; returns those left after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while processes_of(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_of(folder)


@pytest.mark.parametrize("overlap", [[], ["--overlap", "--policy", "planned"]],
                         ids=["exchange-then-compute", "overlap"])
def test_killed_worker_is_named_and_the_launcher_exits_within_ten_seconds(
        tmp_path, fashion_data_dir, launcher, overlap):
    proc = launcher(*quiet(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 2,
                           "--slowdown", "1,2", "-b", 8, "--max-seconds", 300, *overlap))
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(proc, mode_dir, "cpu1", 2)
    os.kill(worker_pid(tmp_path, "cpu1"), signal.SIGKILL)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "worker-cpu1 died (killed by signal SIGKILL)" in err
    assert processes_of(tmp_path) == []


def test_killed_worker_with_restarts_heals_and_every_round_is_logged_once(
        tmp_path, fashion_data_dir, launcher):
    ROUNDS = 40       # 10 could all end between seeing round 5 and the kill (seen in CI)
    proc = launcher(*quiet(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 2,
                           "--slowdown", "1,2", "-b", 8, "-e", 2, "--max-rounds", ROUNDS,
                           "--max-seconds", 0, "--no-evaluator", "--restarts", 1))
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(proc, mode_dir, "cpu1", 5)       # the kill lands far from the last round
    os.kill(worker_pid(tmp_path, "cpu1"), signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    resumed = re.search(r"resuming from round-(\d+)\.npz", err)
    assert "restart 1/1" in err and resumed and int(resumed.group(1)) < ROUNDS, err
    assert {device: [r["num_iters"] for r in rounds]
            for device, rounds in device_logs(mode_dir).items()} == {
        "cpu0": list(range(1, ROUNDS + 1)), "cpu1": list(range(1, ROUNDS + 1))}
    assert processes_of(tmp_path) == []


def test_wedged_worker_trips_the_watchdog_which_names_it_first(tmp_path, fashion_data_dir,
                                                                launcher):
    proc = launcher(*quiet(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 2,
                           "-b", 8, "--max-seconds", 300, "--stall-timeout", 10))
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(proc, mode_dir, "cpu1", 2)
    os.kill(worker_pid(tmp_path, "cpu1"), signal.SIGSTOP)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 1
    stuck = err[err.index("stuck processes"):].splitlines()
    assert re.match(r"  worker-cpu1: pid \d+, stopped", stuck[1]), err
    assert "the state server's view of the workers:" in err
    assert processes_of(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_every_process_dies_with_the_launcher_even_a_restarted_state_server(
        tmp_path, fashion_data_dir, launcher, sig):
    proc = launcher(*quiet(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 2,
                           "-b", 8, "--max-seconds", 300))
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(proc, mode_dir, "cpu0", 2)
    server_log = mode_dir / "processes" / "state-server.log"
    first = _state_server_pid(tmp_path)
    os.killpg(first, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while _state_server_pid(tmp_path) in (None, first) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server_log.read_text().count("esync-cluster started state-server") == 2
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert wait_until_gone(tmp_path) == []
    if sig != signal.SIGKILL:
        assert proc.returncode == 130 and "interrupted" in err


def _state_server_pid(folder):
    """The gunicorn arbiter serving the cluster of `folder` (its database is under `folder`).

    The arbiter leads its own process group (the launcher starts it in a new session); its
    worker does not, and the lowest pid is not always the arbiter once pids wrap around.
    """
    for pid in sorted(processes_of(folder)):
        if "gunicorn" not in _cmdline(pid):
            continue
        try:
            if os.getpgid(pid) == pid:
                return pid
        except ProcessLookupError:
            continue
    return None


def test_resume_continues_from_the_saved_round(tmp_path, fashion_data_dir, launcher):
    common = ["-m", "sync", "--workers", 2, "-b", 8, "-e", 2, "--max-seconds", 0]
    launcher.run(*quiet(tmp_path, fashion_data_dir, *common, "--max-rounds", 4))
    launcher.run(*quiet(tmp_path, fashion_data_dir, *common, "--max-rounds", 7, "--resume"))
    mode_dir = tmp_path / "lenet" / "sync"
    for rounds in device_logs(mode_dir).values():
        assert [r["num_iters"] for r in rounds] == list(range(1, 8))
        assert rounds[4]["total_time"] > rounds[3]["total_time"]   # the clock goes on too
    evaluated = [json.loads(line)["round"]
                 for line in (mode_dir / "evaluations.jsonl").read_text().splitlines()]
    assert evaluated == [2, 4, 6, 7]


SYNC_NO_EVALUATOR = ["-m", "sync", "--workers", 2, "-b", 8, "-e", 2, "--max-seconds", 0,
                     "--no-evaluator"]
TWO_ROUND_SYNC = [*SYNC_NO_EVALUATOR, "--max-rounds", 2]


@pytest.fixture(scope="module")
def two_round_sync(tmp_path_factory):
    """(data_dir, log_dir) of one finished TWO_ROUND_SYNC run; the tests below each start from
    their own copy of its log folder (``copy_of_finished_run``), so it is trained once."""
    root = tmp_path_factory.mktemp("two-round-sync")
    data_dir, log_dir = write_fashion_dir(root / "data"), root / "logs"
    run_cluster(log_dir, data_dir, *TWO_ROUND_SYNC)
    return data_dir, log_dir


def test_resume_refuses_a_corrupt_checkpoint(tmp_path, two_round_sync, launcher):
    data_dir, log_dir = copy_of_finished_run(two_round_sync, tmp_path)
    checkpoint = log_dir / "lenet" / "sync" / "checkpoints" / "round-00000002.npz"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    done = launcher.run(*quiet(log_dir, data_dir, *SYNC_NO_EVALUATOR, "--max-rounds", 4,
                               "--resume"), check=False)
    assert done.returncode == 2
    assert "round-00000002.npz is corrupt" in done.stderr
    assert processes_mentioning(str(tmp_path)) == []


def test_earlier_logs_are_kept_unless_overwrite_is_given(tmp_path, two_round_sync, launcher):
    data_dir, log_dir = copy_of_finished_run(two_round_sync, tmp_path)
    refused = launcher.run(*quiet(log_dir, data_dir, *TWO_ROUND_SYNC), check=False)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    launcher.run(*quiet(log_dir, data_dir, *TWO_ROUND_SYNC, "--overwrite"))


@pytest.mark.parametrize("args, env, message", [
    (["--workers", 3, "--slowdown", "1,4"], {}, "--slowdown: 2 factors for 3 workers"),
    (["--devices", "gpu0"], {}, "gpu0 asked for, but this machine has 0 GPU(s)"),
    (["--devices", "tpu"], {}, "'tpu' is not 'cpu' or 'gpuN'"),
    (["--workers", 2], {"DMLC_NUM_WORKER": "3"}, "DMLC_NUM_WORKER=3 in the environment"),
    (["-m", "local"], {}, "-m local is one device"),
    (["-b", "-4"], {}, "argument -b/--batch-size: must be a positive integer"),
    (["-m", "async", "--collective", "allreduce"], {}, "-m async cannot run over allreduce"),
    (["--collective", "allreduce", "--servers", 2], {}, "the allreduce has no parameter server"),
    (["--workers", 2, "--local-iters", "1,2,3"], {}, "--local-iters: 3 values for 2 workers"),
    (["--workers", 2, "--local-iters", "0,2"], {}, "all above 0) or none"),
], ids=["slowdown-count", "no-gpu", "bad-device", "num-worker-env", "local", "batch",
        "async-allreduce", "allreduce-servers", "local-iters-count", "local-iters-mixed"])
def test_bad_cluster_input_is_one_clear_line(tmp_path, fashion_data_dir, launcher, args, env,
                                             message):
    done = launcher.run(*quiet(tmp_path, fashion_data_dir, *args), env=env, timeout=60,
                        check=False)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*/*/processes"))


def test_port_in_use_is_refused(tmp_path, fashion_data_dir, launcher):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = launcher.run(*quiet(tmp_path, fashion_data_dir, "-m", "sync", "--port", port),
                            check=False)
    assert done.returncode == 2
    assert f"port {port} is in use" in done.stderr


def test_missing_data_says_how_to_prepare(tmp_path, launcher):
    done = launcher.run(*quiet(tmp_path, tmp_path / "nowhere", "-m", "sync"), check=False)
    assert done.returncode == 2
    assert "scripts/prepare_data.py" in done.stderr


def test_relative_folders_work_from_any_directory(tmp_path, fashion_data_dir, launcher):
    """Workers run from the repository and the state server from state_server/: every path the
    user gives relative to their own directory must still land where they meant."""
    assert fashion_data_dir == tmp_path / "data"
    launcher.run("-ld", "runs", "-dd", "data", "--quiet", "-m", "esync", "--workers", 2, "-b", 8,
                 "--max-rounds", 3, "--max-seconds", 0, "--no-evaluator", cwd=tmp_path,
                 timeout=180, env={"PYTHONPATH": str(REPO)})
    assert len(device_logs(tmp_path / "runs" / "lenet" / "esync")) == 2


def _cmdline(pid):
    return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")


@pytest.mark.parametrize("overlap", [[], ["--overlap", "--policy", "planned"]],
                         ids=["exchange-then-compute", "overlap"])
def test_state_server_killed_mid_job_is_restarted_and_the_job_finishes(
        tmp_path, fashion_data_dir, launcher, overlap):
    proc = launcher(*quiet(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 2,
                           "--slowdown", "1,2", "-b", 8, "--max-rounds", 40,
                           "--max-seconds", 0, "--no-evaluator", *overlap))
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(proc, mode_dir, "cpu0", 5)
    worker = next(p for p in processes_mentioning(str(tmp_path)) if "main.py" in _cmdline(p))
    argv = _cmdline(worker).split()
    port = argv[argv.index("--state-server-port") + 1]
    server = [p for p in processes_mentioning(f"127.0.0.1:{port}") if "gunicorn" in _cmdline(p)]
    assert server
    os.killpg(os.getpgid(server[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "restarting it (1/3)" in err
    logs = device_logs(mode_dir)
    assert [len(rounds) for rounds in logs.values()] == [40, 40]
    assert processes_mentioning(str(tmp_path)) == []
