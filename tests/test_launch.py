"""The one-command local cluster: failures stop everything, bad input is refused, runs resume."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from support import REPO, device_logs, processes_mentioning, run_cluster


def start_launcher(log_dir, data_dir, *args):
    command = [sys.executable, "-m", "esync.launch", "-ld", str(log_dir), "-dd", str(data_dir),
               "--quiet", *map(str, args)]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for_rounds(launcher, mode_dir, device, rounds, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise AssertionError(f"launcher ended early: {launcher.communicate()}")
        if len(list(mode_dir.glob(f"*/{device}/iter-*.txt"))) >= rounds:
            return
        time.sleep(0.2)
    raise AssertionError(f"{device} did not reach round {rounds}")


def test_killed_worker_stops_the_cluster_and_is_named(tmp_path, fashion_data_dir):
    launcher = start_launcher(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 3,
                              "--slowdown", "1,1,2", "-b", 8, "--max-seconds", 300)
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(launcher, mode_dir, "cpu1", 3)
    victims = [p for p in processes_mentioning(str(tmp_path))
               if "--device-name cpu1" in open(f"/proc/{p}/cmdline").read().replace("\0", " ")]
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode != 0
    assert "worker-cpu1 died (killed by signal SIGKILL)" in err
    assert processes_mentioning(str(tmp_path)) == []


def test_interrupt_stops_every_process(tmp_path, fashion_data_dir):
    launcher = start_launcher(tmp_path, fashion_data_dir, "-m", "sync", "--workers", 2,
                              "-b", 8, "--max-seconds", 300)
    wait_for_rounds(launcher, tmp_path / "lenet" / "sync", "cpu0", 2)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert "interrupted" in err
    assert processes_mentioning(str(tmp_path)) == []


def test_resume_continues_from_the_saved_round(tmp_path, fashion_data_dir):
    common = ["-m", "sync", "--workers", 2, "-b", 8, "-e", 2, "--max-seconds", 0]
    run_cluster(tmp_path, fashion_data_dir, *common, "--max-rounds", 4)
    run_cluster(tmp_path, fashion_data_dir, *common, "--max-rounds", 7, "--resume")
    mode_dir = tmp_path / "lenet" / "sync"
    for rounds in device_logs(mode_dir).values():
        assert [r["num_iters"] for r in rounds] == list(range(1, 8))
        assert rounds[4]["total_time"] > rounds[3]["total_time"]   # the clock goes on too
    evaluated = [json.loads(line)["round"]
                 for line in (mode_dir / "evaluations.jsonl").read_text().splitlines()]
    assert evaluated == [2, 4, 6, 7]


def test_resume_refuses_a_corrupt_checkpoint(tmp_path, fashion_data_dir):
    common = ["-m", "sync", "--workers", 2, "-b", 8, "-e", 2, "--max-seconds", 0,
              "--no-evaluator"]
    run_cluster(tmp_path, fashion_data_dir, *common, "--max-rounds", 2)
    checkpoint = tmp_path / "lenet" / "sync" / "checkpoints" / "round-00000002.npz"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    done = run_cluster(tmp_path, fashion_data_dir, *common, "--max-rounds", 4, "--resume",
                       check=False)
    assert done.returncode == 2
    assert "round-00000002.npz is corrupt" in done.stderr
    assert processes_mentioning(str(tmp_path)) == []


def test_earlier_logs_are_kept_unless_overwrite_is_given(tmp_path, fashion_data_dir):
    common = ["-m", "sync", "--workers", 2, "-b", 8, "--max-rounds", 2, "--max-seconds", 0,
              "--no-evaluator"]
    run_cluster(tmp_path, fashion_data_dir, *common)
    refused = run_cluster(tmp_path, fashion_data_dir, *common, check=False)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    run_cluster(tmp_path, fashion_data_dir, *common, "--overwrite")


@pytest.mark.parametrize("args, env, message", [
    (["--workers", 3, "--slowdown", "1,4"], {}, "--slowdown: 2 factors for 3 workers"),
    (["--devices", "gpu0"], {}, "gpu0 asked for, but this machine has 0 GPU(s)"),
    (["--devices", "tpu"], {}, "'tpu' is not 'cpu' or 'gpuN'"),
    (["--workers", 2], {"DMLC_NUM_WORKER": "3"}, "DMLC_NUM_WORKER=3 in the environment"),
    (["-m", "local"], {}, "-m local is one device"),
    (["-b", "-4"], {}, "argument -b/--batch-size: must be a positive integer"),
], ids=["slowdown-count", "no-gpu", "bad-device", "num-worker-env", "local", "batch"])
def test_bad_cluster_input_is_one_clear_line(tmp_path, fashion_data_dir, args, env, message):
    command = [sys.executable, "-m", "esync.launch", "-ld", str(tmp_path), "-dd",
               str(fashion_data_dir), "--quiet", *map(str, args)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*/*/processes"))


def test_port_in_use_is_refused(tmp_path, fashion_data_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cluster(tmp_path, fashion_data_dir, "-m", "sync", "--port", port,
                           check=False)
    assert done.returncode == 2
    assert f"port {port} is in use" in done.stderr


def test_missing_data_says_how_to_prepare(tmp_path):
    done = run_cluster(tmp_path, tmp_path / "nowhere", "-m", "sync", check=False)
    assert done.returncode == 2
    assert "scripts/prepare_data.py" in done.stderr


def test_relative_folders_work_from_any_directory(tmp_path, fashion_data_dir):
    """Workers run from the repository and the state server from state_server/: every path the
    user gives relative to their own directory must still land where they meant."""
    assert fashion_data_dir == tmp_path / "data"
    command = [sys.executable, "-m", "esync.launch", "-ld", "runs", "-dd", "data", "--quiet",
               "-m", "esync", "--workers", 2, "-b", 8, "--max-rounds", 3, "--max-seconds", 0,
               "--no-evaluator"]
    done = subprocess.run(list(map(str, command)), cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    assert len(device_logs(tmp_path / "runs" / "lenet" / "esync")) == 2


def _cmdline(pid):
    return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")


def test_state_server_killed_mid_job_is_restarted_and_the_job_finishes(tmp_path,
                                                                     fashion_data_dir):
    launcher = start_launcher(tmp_path, fashion_data_dir, "-m", "esync", "--workers", 2,
                              "--slowdown", "1,2", "-b", 8, "--max-rounds", 40,
                              "--max-seconds", 0, "--no-evaluator")
    mode_dir = tmp_path / "lenet" / "esync"
    wait_for_rounds(launcher, mode_dir, "cpu0", 5)
    worker = next(p for p in processes_mentioning(str(tmp_path)) if "main.py" in _cmdline(p))
    argv = _cmdline(worker).split()
    port = argv[argv.index("--state-server-port") + 1]
    server = [p for p in processes_mentioning(f"127.0.0.1:{port}") if "gunicorn" in _cmdline(p)]
    assert server
    os.killpg(os.getpgid(server[0]), signal.SIGKILL)
    _, err = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, err
    assert "restarting it (1/3)" in err
    logs = device_logs(mode_dir)
    assert [len(rounds) for rounds in logs.values()] == [40, 40]
    assert processes_mentioning(str(tmp_path)) == []
