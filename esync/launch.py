"""One command for a whole heterogeneous cluster on this machine.

    esync-cluster                                   # ESync, 4 CPU workers slowed 1x,1x,4x,8x, lenet
    esync-cluster -m sync --max-seconds 60          # the same cluster under SSGD
    esync-cluster --workers 2 --slowdown 1,4 --devices cpu,gpu0 -n resnet18-v1

Starts the ESync state server (for ``-m esync``), the ps-lite scheduler and server(s), the
evaluator and one worker per device, each with the ``DMLC_*`` environment of its role, on
loopback. It shows progress, stops everything on Ctrl-C, and when any process dies it stops the
rest, names the process, shows the tail of its log and exits non-zero. Logs land in the analysis
layout (``LOG_DIR/NETWORK/MODE/HOST/DEVICE``), process output in ``.../MODE/processes/``, and a
summary JSON is written at the end. Every training flag of ``main.py`` is accepted.
"""
import argparse
import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from esync import cli

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "main.py"

# The main job's defaults differ from main.py's (which keep the original's): a small network that
# trains in minutes on a CPU, learning rates that suit it, and a time budget.
CLUSTER_DEFAULTS = dict(network="lenet", cpu=1, learning_rate=0.05, local_lr=0.05,
                        eval_duration=10, max_seconds=90.0, mode="esync")
STATE_SERVER_RESTARTS = 3        # a state server that keeps dying is a failure, not a blip
DEFAULT_SLOWDOWN = "1,1,4,8"      # the emulated cluster: two fast, one 4x, one 8x slower
LAUNCHER_ONLY = {"workers", "slowdown_list", "devices", "servers", "threads", "port", "state_port",
                 "no_evaluator", "no_summary", "quiet"}


@dataclass
class Role:
    name: str
    kind: str                                   # scheduler, server, worker, evaluator, state
    proc: subprocess.Popen
    log: Path
    ended_at: float | None = field(default=None)


def _device_list(text: str, workers: int) -> list[str]:
    items = [t.strip() for t in text.split(",")] if text else ["cpu"]
    if len(items) == 1:
        items *= workers
    if len(items) != workers:
        raise cli.UsageError(f"argument --devices: {len(items)} devices for {workers} workers")
    for item in items:
        if item != "cpu" and not (item.startswith("gpu") and item[3:].isdigit()):
            raise cli.UsageError(f"argument --devices: {item!r} is not 'cpu' or 'gpuN'")
    return items


def _slowdown_list(text: str, workers: int) -> list[float]:
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise cli.UsageError(f"argument --slowdown: {text!r} is not a comma-separated list of "
                             "numbers") from None
    if len(values) == 1:
        values *= workers
    if len(values) != workers:
        raise cli.UsageError(f"argument --slowdown: {len(values)} factors for {workers} workers "
                             "(give one per worker, or one for all)")
    if any(v < 1 for v in values):
        raise cli.UsageError("argument --slowdown: factors must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = cli._Parser(prog="esync-cluster", description=__doc__.split("\n\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cli.add_training_args(parser)
    cli.add_run_args(parser, one_worker=False)
    parser.set_defaults(**CLUSTER_DEFAULTS)
    g = parser.add_argument_group("cluster")
    g.add_argument("--workers", type=cli._positive_int, default=4, help="number of workers")
    g.add_argument("--slowdown", dest="slowdown_list", default=None,
                   help="slow-down factor per worker, comma-separated, or one for all "
                        "(default: 1,1,4,8 with 4 workers, else 1)")
    g.add_argument("--devices", default="cpu",
                   help="device per worker: cpu or gpuN, comma-separated (or one for all)")
    g.add_argument("--servers", type=cli._positive_int, default=1, help="parameter servers")
    g.add_argument("--threads", type=cli._positive_int, default=1,
                   help="OMP_NUM_THREADS of each worker (1 keeps emulated speeds repeatable)")
    g.add_argument("--port", type=cli._port, default=None,
                   help="scheduler port (default: a free one)")
    g.add_argument("--state-port", type=cli._port, default=None,
                   help="state server port (default: a free one)")
    g.add_argument("--no-evaluator", action="store_true", help="do not score checkpoints")
    g.add_argument("--no-summary", action="store_true", help="do not write the summary JSON")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def worker_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Re-create main.py flags from the resolved namespace (launcher-only options left out)."""
    argv = []
    for action in parser._actions:
        if not action.option_strings or action.dest in LAUNCHER_ONLY | {"help"}:
            continue
        value = getattr(args, action.dest)
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Child-side: get SIGKILL if the launcher itself dies, so no process is ever orphaned."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


class Cluster:
    def __init__(self, args, parser):
        self.args, self.parser = args, parser
        self.roles: list[Role] = []
        self.mode_dir = _mode_dir(args)
        self.proc_dir = self.mode_dir / "processes"
        self.state_token, self.state_restarts = None, 0

    # -- starting ----------------------------------------------------------------------------
    def env(self, role: str, port: int) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1", DMLC_ROLE=role,
                   DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
                   DMLC_NUM_SERVER=str(self.args.servers), DMLC_NUM_WORKER=str(self.args.workers),
                   DMLC_NODE_HOST="127.0.0.1", OMP_NUM_THREADS=str(self.args.threads),
                   MXNET_CPU_WORKER_NTHREADS="1")
        env.pop("DMLC_INTERFACE", None)
        return env

    def spawn(self, name: str, kind: str, argv: list[str], env: dict) -> Role:
        self.proc_dir.mkdir(parents=True, exist_ok=True)
        log = self.proc_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(MAIN), *argv], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=str(REPO), start_new_session=True,
                                    preexec_fn=_die_with_parent)
        role = Role(name, kind, proc, log)
        self.roles.append(role)
        return role

    def start(self) -> None:
        a = self.args
        port = a.port or _free_port()
        if not _port_free(port):
            raise cli.UsageError(f"argument --port: port {port} is in use; pick another or "
                                 "leave --port out to get a free one")
        token = os.environ.get("ESYNC_STATE_TOKEN") or secrets.token_urlsafe(24)
        if a.mode == "esync" and not a.local_iters:
            self.start_state_server(token)       # sets the state server's address in `a`
        base = worker_argv(self.parser, a)
        self.spawn("scheduler", "scheduler", [], self.env("scheduler", port))
        for i in range(a.servers):
            self.spawn(f"server{i}", "server", [], self.env("server", port))
        if not a.no_evaluator:
            env = dict(os.environ, PYTHONUNBUFFERED="1", DMLC_ROLE="evaluator",
                       OMP_NUM_THREADS=str(a.threads))
            self.spawn("evaluator", "evaluator", base, env)
        devices = _device_list(a.devices, a.workers)
        names = _device_names(devices)
        for i, (device, name, factor) in enumerate(zip(devices, names, a.slowdowns)):
            env = self.env("worker", port)
            env["ESYNC_STATE_TOKEN"] = token
            dev = ["-c", "1"] if device == "cpu" else ["-c", "0", "-g", device[3:]]
            self.spawn(f"worker-{name}", "worker",
                       base + dev + ["--device-name", name, "--slowdown", f"{factor:g}"], env)

    def start_state_server(self, token: str) -> None:
        port = self.args.state_port or _free_port()
        if not _port_free(port):
            raise cli.UsageError(f"argument --state-port: port {port} is in use")
        self.args.state_server_ip, self.args.state_server_port = "127.0.0.1", port
        self.proc_dir.mkdir(parents=True, exist_ok=True)
        self.state_token, self.state_restarts = token, 0
        proc = self._run_state_server()
        self.roles.append(Role("state server", "state", proc, proc.log_path))

    def _run_state_server(self) -> subprocess.Popen:
        from esync import state_service
        proc = state_service.start_state_server(
            port=self.args.state_server_port, token=self.state_token,
            db_path=self.mode_dir / "state_server.sqlite3",
            log_path=self.proc_dir / "state_server.log")
        state_service.wait_until_up(proc.url, timeout=60, proc=proc)
        return proc

    def supervise_state_server(self) -> None:
        """Restart a state server that died mid-job, in place (same port, token and database).

        Workers retry their calls for two minutes and the server rebuilds the job from SQLite,
        so a restart costs the job a pause, not its life. After STATE_SERVER_RESTARTS restarts
        the death counts as a failure like any other.
        """
        from esync import state_service
        for role in self.roles:
            if role.kind != "state" or role.proc.poll() is None:
                continue
            if self.state_restarts >= STATE_SERVER_RESTARTS or not any(
                    r.proc.poll() is None for r in self.roles if r.kind == "worker"):
                return
            self.state_restarts += 1
            print(f"esync-cluster: the state server died (exit code {role.proc.returncode}); "
                  f"restarting it ({self.state_restarts}/{STATE_SERVER_RESTARTS})",
                  file=sys.stderr, flush=True)
            state_service.stop(role.proc, hard=True)      # its gunicorn worker, if still there
            try:
                role.proc = self._run_state_server()
            except (RuntimeError, TimeoutError) as exc:
                print(f"esync-cluster: restarting the state server failed: {exc}",
                      file=sys.stderr, flush=True)

    # -- watching ----------------------------------------------------------------------------
    def watch(self) -> int:
        """Wait for the workers; on any failure stop everything. Returns the exit code."""
        progress = Progress(self.mode_dir, self.args, quiet=self.args.quiet)
        try:
            while True:
                self.supervise_state_server()
                failed = self.first_failure()
                if failed is not None:
                    # A worker's death often makes the server abort a moment later (or the other
                    # way round): look again shortly and name the root cause, a worker if any.
                    time.sleep(1.0)
                    progress.close()
                    return self.fail(self.first_failure() or failed)
                if all(r.proc.poll() == 0 for r in self.roles if r.kind == "worker"):
                    progress.update(final=True)
                    progress.close()
                    return self.finish()
                progress.update()
                time.sleep(0.25)
        except KeyboardInterrupt:
            progress.close()
            print("\nesync-cluster: interrupted; stopping every process", file=sys.stderr)
            self.stop_all()
            return 130

    def first_failure(self, grace: float = 15.0):
        """A process that failed, or a service that ended while workers still need it.

        Scheduler and servers end by themselves once every worker has said goodbye, which can be
        a moment before the last worker process is gone: only `grace` seconds later with
        workers still running is that a failure (the workers would otherwise wait forever).
        """
        workers_running = any(r.proc.poll() is None for r in self.roles if r.kind == "worker")
        now = time.monotonic()
        # Workers first: a server that aborts is usually the consequence of a worker's death.
        for role in sorted(self.roles, key=lambda r: r.kind not in ("worker", "evaluator")):
            code = role.proc.poll()
            if code is None:
                continue
            if role.ended_at is None:
                role.ended_at = now
            if code != 0:
                return role
            if (role.kind in ("scheduler", "server", "state") and workers_running
                    and now - role.ended_at > grace):
                return role
        return None

    def fail(self, role: Role) -> int:
        code = role.proc.returncode
        why = f"exit code {code}" if code >= 0 else f"killed by signal {signal.Signals(-code).name}"
        self.stop_all()
        print(f"esync-cluster: {role.name} died ({why}); stopped the other processes.\n"
              f"--- last lines of {role.log} ---\n{_tail(role.log)}", file=sys.stderr)
        return 1

    def finish(self) -> int:
        """Workers are done: let scheduler, servers and evaluator end by themselves."""
        deadline = time.monotonic() + 120
        for role in self.roles:
            if role.kind in ("scheduler", "server", "evaluator"):
                remaining = max(1.0, deadline - time.monotonic())
                try:
                    role.proc.wait(timeout=remaining if role.kind == "evaluator" else 15)
                except subprocess.TimeoutExpired:
                    print(f"esync-cluster: {role.name} did not exit; stopping it",
                          file=sys.stderr)
        self.stop_all()
        bad = [r for r in self.roles if r.kind == "evaluator" and r.proc.returncode not in (0, None)
               and r.proc.returncode > 0]
        if bad:
            return self.fail(bad[0])
        if not self.args.no_summary:
            _write_summary(self.mode_dir)
        _report(self.mode_dir)
        return 0

    def stop_all(self) -> None:
        for role in self.roles:
            _signal(role.proc, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for role in self.roles:
            try:
                role.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(role.proc, signal.SIGKILL)
                role.proc.wait()
            _signal(role.proc, signal.SIGKILL)    # any leftover child of the group


class Progress:
    """Rounds done (the most advanced worker), latest test accuracy and elapsed time."""

    def __init__(self, mode_dir: Path, args, quiet: bool):
        self.mode_dir, self.quiet = mode_dir, quiet
        self.start = time.monotonic()
        self.last = 0.0
        self.bar = None
        self.tty = sys.stderr.isatty()
        if not quiet:
            from tqdm import tqdm
            self.bar = tqdm(total=args.max_rounds or None, unit="round",
                            desc=f"{args.mode} {args.network}", dynamic_ncols=True,
                            file=sys.stderr, disable=not self.tty)
        from esync.evaluator import EvaluationLog
        self.evaluations = EvaluationLog(mode_dir / "evaluations.jsonl")

    def update(self, final: bool = False) -> None:
        """A live bar on a terminal; a plain line every 10 s in a log file or CI."""
        now = time.monotonic()
        if self.quiet or (now - self.last < (1.0 if self.tty else 10.0) and not final):
            return
        self.last = now
        rounds = max((len(list(d.glob("iter-*.txt"))) for d in self.mode_dir.glob("*/*")
                      if d.is_dir() and d.parent.name not in ("processes", "checkpoints")),
                     default=0)
        acc = self.evaluations.poll()
        shown = f"acc={acc:.4f}" if acc is not None else "acc=n/a"
        if not self.tty:
            print(f"esync-cluster: {now - self.start:6.0f}s  round {rounds}  {shown}",
                  file=sys.stderr, flush=True)
            return
        self.bar.n = rounds
        self.bar.set_postfix_str(shown)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _device_names(devices: list[str]) -> list[str]:
    """cpu0, cpu1, ... for CPU workers; gpuN, or gpuN-2 when two workers share a GPU."""
    names, seen, cpus = [], {}, 0
    for d in devices:
        if d == "cpu":
            names.append(f"cpu{cpus}")
            cpus += 1
        else:
            seen[d] = seen.get(d, 0) + 1
            names.append(d if seen[d] == 1 else f"{d}-{seen[d]}")
    return names


def _mode_dir(args) -> Path:
    from esync.algorithms import mode_dir_name
    return (Path(args.log_dir) / args.network
            / mode_dir_name(args.mode, args.use_dcasgd, args.split_by_class))


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _check_before_start(args) -> None:
    from esync.data import FASHION_FILES, FASHION_SUBDIR
    folder = Path(args.data_dir) / FASHION_SUBDIR
    missing = [f for pair in FASHION_FILES.values() for f in pair if not (folder / f).exists()]
    if missing:
        raise cli.UsageError(f"data folder {folder} lacks {', '.join(missing)}: run "
                             f"`python scripts/prepare_data.py --data-dir {args.data_dir}`")
    env_workers = os.environ.get("DMLC_NUM_WORKER")
    if env_workers and env_workers != str(args.workers):
        raise cli.UsageError(f"DMLC_NUM_WORKER={env_workers} in the environment does not match "
                             f"--workers {args.workers}; unset it or make them agree")
    if any(d != "cpu" for d in _device_list(args.devices, args.workers)):
        import mxnet as mx
        gpus = mx.context.num_gpus()
        for d in _device_list(args.devices, args.workers):
            if d != "cpu" and int(d[3:]) >= gpus:
                raise cli.UsageError(f"argument --devices: {d} asked for, but this machine has "
                                     f"{gpus} GPU(s); use cpu")
    folder = _mode_dir(args)
    earlier = list(folder.glob("*/*/iter-*.txt"))
    if earlier and not (args.overwrite or args.resume):
        raise cli.UsageError(f"{folder} already holds logs of an earlier run; choose another "
                             "--log-dir, or pass --overwrite (replace) or --resume (continue)")
    if args.resume:
        from esync.checkpoint import CheckpointError, CheckpointStore
        try:
            found = CheckpointStore(folder / "checkpoints").latest(network=args.network)
        except CheckpointError as exc:
            raise cli.UsageError(f"--resume: {exc}") from None
        if found is None:
            raise cli.UsageError(f"--resume: no checkpoint in {folder / 'checkpoints'}")
        # The evaluator starts before rank 0: it must not see the last run's end marker.
        CheckpointStore(folder / "checkpoints").clear_done()
    if args.overwrite:
        import shutil
        for sub in ("checkpoints", "processes"):
            shutil.rmtree(folder / sub, ignore_errors=True)
        for name in ("evaluations.jsonl", "state_server.sqlite3"):
            (folder / name).unlink(missing_ok=True)


def _write_summary(mode_dir: Path) -> None:
    from esync.analysis.summary import LogError, write_summary
    try:
        path = write_summary(mode_dir)
        print(f"esync-cluster: summary written to {path}")
    except LogError as exc:
        print(f"esync-cluster: no summary: {exc}", file=sys.stderr)


def _report(mode_dir: Path) -> None:
    from esync.evaluator import EvaluationLog
    log = EvaluationLog(mode_dir / "evaluations.jsonl")
    acc = log.poll()
    print(f"esync-cluster: done; logs in {mode_dir}"
          + (f"; final test accuracy {acc:.4f}" if acc is not None else ""))


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        # Every process gets absolute paths: workers run from the repository, the state server
        # from state_server/, the user from anywhere.
        args.log_dir = str(Path(args.log_dir).resolve())
        args.data_dir = str(Path(args.data_dir).resolve())
        if args.slowdown_list is None:
            args.slowdown_list = DEFAULT_SLOWDOWN if args.workers == 4 else "1"
        args.slowdowns = _slowdown_list(args.slowdown_list, args.workers)
        if args.use_dcasgd and args.mode != "async":
            raise cli.UsageError("argument -dcasgd/--use-dcasgd: needs -m async")
        if args.mode == "local":
            raise cli.UsageError("-m local is one device: run `python main.py -m local ...`")
        _check_before_start(args)
        cluster = Cluster(args, parser)
        _write_cluster_json(cluster.mode_dir, args)
        try:
            cluster.start()
        except BaseException:
            cluster.stop_all()
            raise
    except cli.UsageError as exc:
        print(f"esync-cluster: error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"esync-cluster: error: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return cluster.watch()


def _write_cluster_json(mode_dir: Path, args) -> None:
    mode_dir.mkdir(parents=True, exist_ok=True)
    spec = {k: v for k, v in vars(args).items()
            if isinstance(v, (str, int, float, bool, list, type(None))) and k != "state_token"}
    (mode_dir / "cluster.json").write_text(json.dumps(spec, indent=1))


if __name__ == "__main__":
    sys.exit(main())
