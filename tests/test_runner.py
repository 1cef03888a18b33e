"""The role runner the ssh, Slurm and Kubernetes backends start on each host."""
import json
import os
import signal
import subprocess
import sys
import time

from support import REPO

RUNNER = [sys.executable, "-m", "esync.launch.runner"]


def test_a_role_killed_by_a_signal_is_reported_with_that_signal(tmp_path):
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = subprocess.run([*RUNNER, "--log", tmp_path / "role.log", "--exit-file",
                           tmp_path / "role.exit", "--", sys.executable, "-c", kill_self],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.stdout.splitlines()[-1], (tmp_path / "role.exit").read_text().strip()) == \
        ("esync-runner exit -9", "-9")


def test_closing_standard_input_stops_the_role_and_everything_it_started(tmp_path):
    # The role forks a grandchild: both must be gone once the runner's input closes (what
    # happens on a remote host when the launcher's ssh connection ends).
    forks = ("import subprocess, sys, time; "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
             "print('grandchild', p.pid, flush=True); time.sleep(300)")
    runner = subprocess.Popen([*RUNNER, "--log", str(tmp_path / "role.log"), "--watch-stdin",
                               "--", sys.executable, "-c", forks], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        log = tmp_path / "role.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and "grandchild" in log.read_text()):
            assert time.monotonic() < deadline, "the role did not start"
            time.sleep(0.1)
        grandchild = int(log.read_text().split("grandchild")[1].split()[0])
        runner.stdin.close()
        out = runner.stdout.read()
        runner.wait(timeout=30)
        time.sleep(0.5)
        assert ("esync-runner exit -15" in out, _alive(grandchild)) == (True, False)
    finally:
        if runner.poll() is None:
            runner.send_signal(signal.SIGTERM)      # the runner passes it on to the role
            runner.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_completion_index_picks_that_worker_of_the_device_kind(tmp_path):
    def worker(name, device):
        say = f"import os; print('{name}', os.environ['DMLC_NODE_HOST'])"
        return {"name": name, "kind": "worker", "argv": [sys.executable, "-c", say],
                "env": {"DMLC_ROLE": "worker", "DMLC_NODE_HOST": "planned"}, "host": "h",
                "device": device, "rank": 0}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([worker("worker-cpu0", "cpu0"), worker("worker-gpu0", "gpu0"),
                                worker("worker-cpu1", "cpu1")]))
    env = dict(os.environ, JOB_COMPLETION_INDEX="1", POD_IP="10.9.8.7")
    subprocess.run([*RUNNER, "--plan", plan, "--role", "worker", "--group", "cpu", "--index-env",
                    "JOB_COMPLETION_INDEX", "--node-host-env", "POD_IP", "--log-dir", tmp_path],
                   cwd=REPO, env=env, capture_output=True, timeout=60, check=True)
    assert "worker-cpu1 10.9.8.7" in (tmp_path / "worker-cpu1.log").read_text()
