"""The original ESync's four steps, run by hand, record and draw test accuracy (no evaluator).

Exactly as the original's README shows them, on loopback: 1. the state server with
``python manage.py runserver``, 2. the ps-lite scheduler and 3. the server (``DMLC_ROLE=...
python main.py``), 4. two workers ``python main.py -m esync -c 1 -n lenet ...``; then
``summary.py`` and ``drawer.py``. No evaluator runs, so rank 0 scores the test set itself
(main.py's default, ``--inline-eval``): it prints the original's ``[Iteration N] Test Acc`` line,
logs the accuracy in its round logs, and the drawer draws the accuracy figure from them. The
last tests check the other side: ``esync-cluster``, which starts an evaluator, gives its workers
``--no-inline-eval``, and none of them scores.

Every process started here is killed when the module's tests end, whatever happened.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from esync.common.procs import free_port, kill_group, python_env
from support import REPO, device_logs, kill_processes_of, run_cluster, write_fashion_dir

ROUNDS = 3
TOKEN = "original-steps-token"
STARTUP_S = 90        # the state server's migrations and first answer
TRAINING_S = 300      # three rounds of lenet on tiny data; generous for two loaded cores
TEST_ACC_LINE = re.compile(r"^\[Iteration (\d+)\] Test Acc (\d\.\d{3})$", re.M)
INLINE_FIRST_LINE = "[rank 0 cpu0] test accuracy scored inline every 1 round(s) (no evaluator)"


class ByHand:
    """Starts the roles as a user would at a terminal, each in its own process group with its
    output in ``<folder>/<name>.out`` and ``.err``; ``kill_all`` leaves none of them alive."""

    def __init__(self, folder: Path):
        self.folder, self.started = folder, {}
        self.base_env = {k: v for k, v in os.environ.items()
                         if not k.startswith("DMLC_") and k != "DJANGO_SETTINGS_MODULE"}
        # inherited by every process, so that processes_of(folder) finds whatever they forked
        self.base_env.update(python_env(), OMP_NUM_THREADS="1", ESYNC_STATE_TOKEN=TOKEN,
                             ESYNC_TEST_FOLDER=str(folder))

    def start(self, name: str, argv: list, *, env=None, cwd=REPO) -> subprocess.Popen:
        with open(self.folder / f"{name}.out", "wb") as out, \
                open(self.folder / f"{name}.err", "wb") as err:
            proc = subprocess.Popen([sys.executable, *map(str, argv)], cwd=cwd,
                                    env=dict(self.base_env, **(env or {})), stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.started[name] = proc
        return proc

    def output(self, name: str) -> str:
        return (self.folder / f"{name}.out").read_text(errors="replace")

    def tails(self) -> str:
        return "".join(f"\n--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}"
                       for path in sorted(self.folder.glob("*.out")) + sorted(
                           self.folder.glob("*.err")))

    def wait(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            try:
                code = self.started[name].wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} still running after {timeout} s" + self.tails())
            assert code == 0, f"{name} exited with {code}" + self.tails()

    def kill_all(self) -> None:
        for proc in self.started.values():
            kill_group(proc, signal.SIGKILL)
            proc.wait()
        kill_processes_of(self.folder)


def _wait_for_state_server(roles: ByHand, port: int) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if roles.started["state-server"].poll() is not None:
            raise AssertionError("the state server exited" + roles.tails())
        try:
            if requests.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the state server did not answer within {STARTUP_S} s" + roles.tails())


def _run(argv: list) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, f"{argv} exited with {done.returncode}:\n{done.stderr}"
    return done


@dataclass
class FourSteps:
    roles: ByHand
    logs: Path
    mode_dir: Path
    drawer: subprocess.CompletedProcess | None     # None when not analysed
    data_dir: Path

    def rank_0_output(self) -> str:
        return next(out for out in map(self.roles.output, ("worker-a", "worker-b"))
                    if "[rank 0 " in out)

    def device_logs(self) -> dict:
        return device_logs(self.mode_dir)


def _run_four_steps(root: Path, *extra_flags, analyse: bool = True) -> FourSteps:
    """The original's four steps, then (``analyse``) summary.py and drawer.py; ``extra_flags``
    go to both workers. The caller kills every process started (``roles.kill_all``)."""
    data_dir, logs = write_fashion_dir(root / "data"), root / "logs"
    roles = ByHand(root)
    state_port, ps_port = free_port(), free_port()
    try:
        # Step 1: the state server (its database in the test's folder, not the checkout's)
        roles.start("state-server", ["manage.py", "runserver", f"127.0.0.1:{state_port}"],
                    env={"ESYNC_STATE_DB": str(root / "state.sqlite3")},
                    cwd=REPO / "state_server")
        _wait_for_state_server(roles, state_port)
        dmlc = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(ps_port),
                "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "PS_VERBOSE": "1",
                "DMLC_INTERFACE": "lo"}
        # Steps 2 and 3: the scheduler and the parameter server
        for role in ("scheduler", "server"):
            roles.start(role, ["main.py"], env=dict(dmlc, DMLC_ROLE=role))
        # Step 4: the workers, both on this machine's CPU (device folders cpu0 and cpu1)
        train = ["main.py", "-m", "esync", "-c", 1, "-n", "lenet", "-ll", 0.001, "-b", 64,
                 "-dcasgd", 0, "-s", 0, "-ip", "127.0.0.1", "-port", state_port,
                 "-ld", logs, "-dd", data_dir, "--max-rounds", ROUNDS, *extra_flags]
        for name in ("worker-a", "worker-b"):
            roles.start(name, train, env=dict(dmlc, DMLC_ROLE="worker"))
        roles.wait(["worker-a", "worker-b"], TRAINING_S)
        drawer = None
        if analyse:
            _run(["analysis/summary.py", "-b", logs, "-n", "lenet", "-m", "esync"])
            drawer = _run(["analysis/drawer.py", "-b", logs, "-n", "lenet"])
        return FourSteps(roles, logs, logs / "lenet" / "esync", drawer, data_dir)
    except BaseException:
        roles.kill_all()
        raise


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    steps = _run_four_steps(tmp_path_factory.mktemp("original-steps"))
    yield steps
    steps.roles.kill_all()


@pytest.fixture(scope="module")
def overlapped_steps(tmp_path_factory):
    """The same with ESync's --overlap: rank 0 trains beyond the shared model, so it must
    score a copy of the shared model (the one its checkpoints hold), not its own weights. Its
    one test reads the round logs and checkpoints only: no summary, no figures."""
    steps = _run_four_steps(tmp_path_factory.mktemp("original-steps-overlap"), "--overlap",
                            analyse=False)
    yield steps
    steps.roles.kill_all()


def _checkpoint_scores(steps: FourSteps) -> list[tuple[int, float]]:
    """(round, test accuracy) of every checkpoint rank 0 wrote, scored as the evaluator does."""
    import mxnet as mx
    from esync.common import dataset, runlayout
    from esync.common.checkpoint import CheckpointStore
    from esync.worker import models
    from esync.worker.evaluator import accuracy, load_into
    images, labels = dataset.load_fashion_mnist(steps.data_dir, "test")
    net = models.build("lenet", mx.cpu(), seed=0)
    store = CheckpointStore(runlayout.checkpoints_dir(steps.mode_dir))
    scores = []
    for path in store.list():
        meta, arrays = store.load(path, network="lenet")
        load_into(net, arrays)
        scores.append((meta["round"], accuracy(net, images, labels, mx.cpu(),
                                               models.input_size("lenet"))))
    return scores


def _rank_0_logs(steps: FourSteps) -> list[dict]:
    return next(logs for logs in steps.device_logs().values() if logs[0]["rank"] == 0)


def test_rank_0s_round_logs_hold_the_test_accuracy_of_every_round(four_steps):
    logs = _rank_0_logs(four_steps)
    assert [(log["num_iters"], 0 <= log.get("accuracy", -1) <= 1) for log in logs] == \
        [(n, True) for n in range(1, ROUNDS + 1)]


def test_rank_0_times_its_scoring_as_the_evaluation_phase(four_steps):
    logs = _rank_0_logs(four_steps)
    assert all(any("evaluation" in phases for phases in log["time"].values()) for log in logs)


def test_the_other_worker_scores_nothing(four_steps):
    others = [logs for logs in four_steps.device_logs().values() if logs[0]["rank"] != 0]
    assert len(others) == 1 and not any("accuracy" in log for log in others[0])


def test_rank_0_prints_the_originals_test_acc_line_with_the_logged_accuracy(four_steps):
    printed = [(int(n), acc) for n, acc in TEST_ACC_LINE.findall(four_steps.rank_0_output())]
    logged = [(log["num_iters"], f"{log['accuracy']:.3f}") for log in _rank_0_logs(four_steps)]
    assert printed == logged


def test_rank_0s_first_line_says_where_the_accuracy_comes_from(four_steps):
    assert four_steps.rank_0_output().splitlines()[0] == INLINE_FIRST_LINE


def test_no_evaluations_file_is_written_so_the_figures_rest_on_the_round_logs(four_steps):
    assert not (four_steps.mode_dir / "evaluations.jsonl").exists()


def test_summary_holds_rank_0s_accuracies(four_steps):
    summary = json.loads((four_steps.mode_dir / "ESync.json").read_text())
    accuracies = [entry["accuracy_list"] for host, devices in summary.items()
                  if not host.startswith("_") for entry in devices.values()
                  if entry.get("accuracy_list")]
    assert accuracies == [[log["accuracy"] for log in _rank_0_logs(four_steps)]]


def test_drawer_draws_the_accuracy_figure(four_steps):
    figure = four_steps.logs / "lenet" / "figures" / "lenet-accuracy-iid.png"
    assert figure.stat().st_size > 0, four_steps.drawer.stderr


def test_rank_0_scores_the_model_its_checkpoint_of_the_round_holds(four_steps):
    logged = [(log["num_iters"], log["accuracy"]) for log in _rank_0_logs(four_steps)]
    assert logged == _checkpoint_scores(four_steps)


def test_under_overlap_rank_0_scores_the_shared_model_not_its_own(overlapped_steps):
    logged = [(log["num_iters"], log["accuracy"]) for log in _rank_0_logs(overlapped_steps)]
    assert logged == _checkpoint_scores(overlapped_steps)


# esync-cluster: its evaluator scores, its workers do not -------------------------------------

def _cluster_worker_argv(tmp_path, data_dir, *flags) -> list[str]:
    from esync.launch.flags import build_parser, parse, worker_argv
    parser = build_parser()
    return worker_argv(parser, parse(parser, ["-ld", tmp_path, "-dd", data_dir, *flags]))


def test_esync_cluster_tells_its_workers_no_inline_eval(tmp_path, fashion_data_dir):
    assert "--no-inline-eval" in _cluster_worker_argv(tmp_path, fashion_data_dir)


def test_esync_cluster_with_inline_eval_asked_for_passes_it_on(tmp_path, fashion_data_dir):
    argv = _cluster_worker_argv(tmp_path, fashion_data_dir, "--inline-eval", "--no-evaluator")
    assert "--inline-eval" in argv and "--no-inline-eval" not in argv


def test_no_inline_eval_in_local_mode_is_refused(main_py):
    done = main_py("-m", "local", "-c", 1, "-n", "lenet", "--no-inline-eval")
    assert done.returncode == 2 and "--no-inline-eval: -m local" in done.stderr


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-evaluator")
    data_dir, logs = write_fashion_dir(root / "data"), root / "logs"
    run_cluster(logs, data_dir, "--workers", 2, "-m", "sync", "--max-rounds", ROUNDS,
                "--max-seconds", 0, "-e", 1)
    return logs / "lenet" / "sync"


def test_esync_cluster_workers_log_no_accuracy(cluster_run):
    logs = device_logs(cluster_run)
    assert len(logs) == 2 and not any("accuracy" in log for dev in logs.values() for log in dev)


def test_esync_cluster_evaluator_scores_rank_0s_checkpoints(cluster_run):
    lines = (cluster_run / "evaluations.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["round"] for line in lines) == list(range(1, ROUNDS + 1))


def test_esync_cluster_rank_0s_first_line_names_the_evaluator(cluster_run):
    from esync.common import runlayout
    firsts = []
    for log in runlayout.processes_dir(cluster_run).glob("worker-*.log"):
        # the launcher heads each process's log with a line of its own: "--- esync-cluster ..."
        own = [line for line in log.read_text().splitlines() if not line.startswith("--- ")]
        firsts += own[:1]
    assert [line.split("] ", 1)[1] for line in firsts if line.startswith("[rank 0 ")] == [
        "test accuracy scored by the evaluator role (DMLC_ROLE=evaluator) from rank 0's "
        "checkpoints, written every 1 round(s) (--no-inline-eval)"], firsts
