"""Load benchmark of the ESync state server: simulated workers speaking the trainer's protocol.

Starts a real state server (gunicorn, one process, threads, as in production) on a free
loopback port with a temporary database, simulates ``--workers`` workers for ``--rounds``
rounds, and writes what coordination costs them as JSON:

    python scripts/bench_state_server.py --workers 256 --rounds 1000 --policy planned \\
        --protocol rounds --out reports/state-planned-rounds.json
    python scripts/bench_state_server.py --workers 256 --rounds 1000 --policy planned \\
        --protocol legacy --out reports/state-planned-legacy.json
    python scripts/bench_state_server.py --workers 64 --rounds 100 --policy dynamic \\
        --iteration-ms 10,20,50,100,150 --out reports/state-dynamic.json

Protocols (each the trainer's real sequence of calls; compute is simulated by sleeping):

``rounds`` (planned policy, the default): no worker calls HTTP in a round. After each round's
    exchange rank 0 hands every worker's (k, c) to a background thread, which posts them to
    ``/jobs/<job>/rounds/`` (every round still pending in one call when it fell behind) and
    keeps the newest plan; rank 0 puts that plan into its next push. The critical path is rank
    0's hand-off and read of the newest plan; the other workers wait on nothing. At most one
    request per round for the whole job; ``plan_age_rounds`` tells how many rounds old the plan
    in use was.
``legacy`` (planned policy, the original client's two calls): every worker calls ``/plan/`` at
    the start of a round and ``/reset/`` after the exchange. 2 N requests per round.
``apply`` (dynamic policy, as the trainer does it, through its ``ReadinessAsker``): a worker
    calls ``/apply/`` before a local iteration unless the lease of the last "not ready" answer
    (its ``budget``) covers that iteration; a fast worker skips the round's first question, and
    its first call enters the round (no ``/reset/``). ``--no-lease``: the
    original client, ``/apply/`` before every iteration and ``/reset/`` after the exchange.
    ``k`` per worker and round shows how much of the slowest worker's iteration the faster ones
    filled, against what fits without any request latency.

Figures: ``critical_path_ms_p50``/``_p99`` (per worker and round, the time spent waiting on
coordination), ``requests_per_round``, ``errors``, ``requests_per_s``, per-endpoint latency
(p50, p99, mean, count), and the server's CPU time per request and per round (the capacity of
one server core). Clients and server share this machine's cores, so under contention the
latencies are an upper bound.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esync.coordination.rules import Decision  # noqa: E402
from esync.coordination.client import ReadinessAsker, StateClient  # noqa: E402
from esync.coordination.service import free_port, start_state_server, stop, wait_until_up  # noqa: E402

JOB = "bench"
TOKEN = "bench-token"
PROTOCOLS = {"planned": ("rounds", "legacy"), "dynamic": ("apply",)}
JITTER = 0.05                       # relative noise on every simulated duration


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=256, help="simulated workers (1..4096)")
    parser.add_argument("--rounds", type=int, default=1000, help="rounds to simulate")
    parser.add_argument("--policy", choices=sorted(PROTOCOLS), default="planned")
    parser.add_argument("--protocol", choices=["rounds", "legacy", "apply"],
                        help="calls the workers make (default: rounds for planned, apply for "
                             "dynamic)")
    parser.add_argument("--iteration-ms", default=None,
                        help="comma-separated local-iteration times, assigned to ranks in turn "
                             "(default: 2,4,8 for planned, 10,20,50,100,150 for dynamic)")
    parser.add_argument("--lease", action=argparse.BooleanOptionalAction, default=True,
                        help="dynamic policy: skip the /apply/ calls a \"not ready\" answer's "
                             "lease covers, as the trainer does (--no-lease: the original "
                             "client, /apply/ before every iteration and /reset/ per round)")
    parser.add_argument("--server-threads", type=int, default=8, help="gunicorn threads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="JSON file to write the figures to")
    args = parser.parse_args(argv)
    args.protocol = args.protocol or PROTOCOLS[args.policy][0]
    if args.protocol not in PROTOCOLS[args.policy]:
        parser.error(f"--protocol {args.protocol} is not a protocol of the {args.policy} policy "
                     f"(choose {' or '.join(PROTOCOLS[args.policy])})")
    if not 1 <= args.workers <= 4096:
        parser.error(f"--workers must be in [1, 4096], got {args.workers}")
    if not 1 <= args.rounds <= 1_000_000:
        parser.error(f"--rounds must be in [1, 1000000], got {args.rounds}")
    default = "2,4,8" if args.policy == "planned" else "10,20,50,100,150"
    try:
        args.iterations = [float(v) / 1000 for v in (args.iteration_ms or default).split(",")]
    except ValueError:
        parser.error(f"--iteration-ms must be comma-separated milliseconds, got "
                     f"{args.iteration_ms!r}")
    if not args.iterations or min(args.iterations) <= 0 or max(args.iterations) > 60:
        parser.error("--iteration-ms values must be in (0, 60000]")
    return args


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary_ms(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "p50_ms": round(percentile(values, 0.5) * 1e3, 3),
            "p99_ms": round(percentile(values, 0.99) * 1e3, 3),
            "mean_ms": round(statistics.fmean(values) * 1e3, 3),
            "max_ms": round(max(values) * 1e3, 3)}


class Recorder:
    """Latency per endpoint, critical-path time per worker and round, errors; thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.critical: list[float] = []
        self.critical_rank0: list[float] = []
        self.errors: list[str] = []

    def call(self, endpoint: str, function, *args):
        started = time.perf_counter()
        try:
            return function(*args)
        except Exception as exc:            # counted and reported, never fatal to the bench
            with self.lock:
                self.errors.append(f"{endpoint}: {type(exc).__name__}: {exc}")
            return None
        finally:
            with self.lock:
                self.latency[endpoint].append(time.perf_counter() - started)

    def add_critical(self, seconds: float) -> None:
        with self.lock:
            self.critical.append(seconds)


def jittered(rng: random.Random, seconds: float) -> float:
    return seconds * (1 + rng.uniform(-JITTER, JITTER))


# -- the protocols ---------------------------------------------------------------------------------

class RoundReporter:
    """Rank 0's background thread of the ``rounds`` protocol: posts each round's (k, c) in order
    and keeps the newest plan; the training loop never waits for HTTP."""

    def __init__(self, client: StateClient, recorder: Recorder, num_workers: int):
        self.client, self.recorder = client, recorder
        self.queue: queue.Queue = queue.Queue()
        self.plan, self.plan_round = [1] * num_workers, 0
        # Rounds per call when catching up: at most 64, and well under the 2 MiB body limit.
        self.batch_limit = max(1, min(64, 1_500_000 // (30 * num_workers + 64)))
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, t: int, ks: list[int], cs: list[float]) -> None:
        self.queue.put((t, ks, cs))

    def newest_plan(self) -> tuple[int, list[int]]:
        with self.lock:
            return self.plan_round, self.plan

    def close(self, timeout: float) -> None:
        self.queue.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        done = False
        while not done:
            batch = [self.queue.get()]
            while len(batch) < self.batch_limit and not self.queue.empty():
                batch.append(self.queue.get())           # fell behind: catch up in one call
            if batch[-1] is None:
                batch.pop()
                done = True
            if not batch:
                continue
            answer = self.recorder.call("rounds", self.client.report_rounds, batch)
            if answer is not None:
                with self.lock:
                    self.plan_round, self.plan = answer


def run_rounds_protocol(url: str, args, recorder: Recorder) -> dict:
    """One job-wide report per round from rank 0, off the critical path."""
    rng = random.Random(args.seed)
    n = args.workers
    c = [args.iterations[rank % len(args.iterations)] for rank in range(n)]
    client = StateClient(url, job=JOB, token=TOKEN, timeout=30, retry_for=0)
    reporter = RoundReporter(client, recorder, n)
    staleness = []
    ks = [1] * n
    for t in range(1, args.rounds + 1):
        cs = [jittered(rng, value) for value in c]
        time.sleep(max(k * value for k, value in zip(ks, cs)))   # the round: every worker computes
        started = time.perf_counter()                              # rank 0, after the exchange:
        reporter.submit(t, ks, cs)
        plan_round, plan = reporter.newest_plan()
        recorder.add_critical(time.perf_counter() - started)
        recorder.critical_rank0.append(recorder.critical[-1])
        for _ in range(n - 1):
            recorder.add_critical(0.0)                             # the others wait on nothing
        staleness.append(t - plan_round)
        ks = plan
    reporter.close(timeout=120)
    history = client.history(since=args.rounds, limit=1)       # the last round, persisted
    recorded = history["current_round"] - 1
    last = history["rounds"][0]["workers"] if history["rounds"] else []
    if recorded != args.rounds or len(last) != n:
        recorder.errors.append(f"the server recorded {recorded} of {args.rounds} rounds and "
                               f"{len(last)} of {n} workers in the last one")
    return {"plan_age_rounds_p50": percentile(staleness, 0.5),
            "plan_age_rounds_p99": percentile(staleness, 0.99),
            "rounds_recorded": recorded, "final_plan_head": ks[:8]}


def run_worker_threads(url: str, args, recorder: Recorder, body) -> list:
    """``args.workers`` threads, each ``body(rank, client, barrier)``; returns their results."""
    barrier = threading.Barrier(args.workers)
    results: list = [None] * args.workers

    def thread(rank: int) -> None:
        with StateClient(url, job=JOB, token=TOKEN, timeout=60, retry_for=0) as client:
            try:
                results[rank] = body(rank, client, barrier)
            except threading.BrokenBarrierError:
                pass
            except Exception as exc:                                 # reported in the figures
                with recorder.lock:
                    recorder.errors.append(f"worker {rank}: {type(exc).__name__}: {exc}")
                barrier.abort()

    threads = [threading.Thread(target=thread, args=(rank,), daemon=True)
               for rank in range(args.workers)]
    for item in threads:
        item.start()
    for item in threads:
        item.join(timeout=3600)
    return results


def run_legacy_protocol(url: str, args, recorder: Recorder) -> dict:
    """Every worker: /plan/ at the start of a round, compute, exchange, /reset/."""

    def worker(rank: int, client: StateClient, barrier: threading.Barrier):
        rng = random.Random(args.seed * 100_003 + rank)
        c_i, last_c = args.iterations[rank % len(args.iterations)], 0.0
        for t in range(1, args.rounds + 1):
            started = time.perf_counter()
            k = recorder.call("plan", client.plan, rank, last_c, t) or 1
            spent = time.perf_counter() - started
            last_c = jittered(rng, c_i)
            time.sleep(k * last_c)
            barrier.wait()                                           # the parameter exchange
            started = time.perf_counter()
            recorder.call("reset", client.reset, rank, t + 1)
            recorder.add_critical(spent + time.perf_counter() - started)
        return None

    run_worker_threads(url, args, recorder, worker)
    return {}


class RecordedDecisions:
    """A StateClient whose ``decide`` calls are timed and counted by the recorder (a failed
    call counts as an error and ends the worker's round)."""

    def __init__(self, client: StateClient, recorder: Recorder):
        self.client, self.recorder = client, recorder

    def decide(self, *args):
        return self.recorder.call("apply", self.client.decide, *args) or Decision(True)


class Stopwatch:
    """A context-manager factory that adds up the time spent inside it."""

    def __init__(self):
        self.spent = 0.0

    @contextlib.contextmanager
    def __call__(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.spent += time.perf_counter() - started


def run_apply_protocol(url: str, args, recorder: Recorder) -> dict:
    """Dynamic policy. With the lease (the default), each worker asks through the trainer's own
    ``esync.coordination.client.ReadinessAsker``; ``--no-lease`` is the original client: ``/apply/``
    before every local iteration and ``/reset/`` after the exchange."""

    def worker(rank: int, client: StateClient, barrier: threading.Barrier):
        rng = random.Random(args.seed * 100_003 + rank)
        c_i, last_c, ks = args.iterations[rank % len(args.iterations)], 0.0, []
        asker = ReadinessAsker(RecordedDecisions(client, recorder), rank)
        for t in range(1, args.rounds + 1):
            watch, k = Stopwatch(), 0
            while True:
                if args.lease:
                    go_on = asker.continue_local(k, last_c, t, timing=watch)
                else:
                    with watch():
                        decision = recorder.call("apply", client.decide, rank, k, last_c, t)
                    go_on = decision is not None and (k == 0 or not decision.ready)
                if not go_on:
                    break
                last_c = jittered(rng, c_i)
                time.sleep(last_c)
                k += 1
            ks.append(k)
            barrier.wait()
            if not args.lease:
                with watch():
                    recorder.call("reset", client.reset, rank, t + 1)
            recorder.add_critical(watch.spent)
        return ks

    results = run_worker_threads(url, args, recorder, worker)
    slowest = max(args.iterations)
    by_time: dict[float, list[int]] = defaultdict(list)
    for rank, ks in enumerate(results):
        if ks:
            by_time[args.iterations[rank % len(args.iterations)]].extend(ks[1:])  # round 1: cold
    return {"k_by_iteration_ms": {
        f"{c * 1e3:g}": {"median_k": statistics.median(ks) if ks else None,
                         "fits_without_latency": max(1, math.floor(slowest / c + 1e-9)),
                         "workers": sum(1 for r in range(args.workers)
                                        if args.iterations[r % len(args.iterations)] == c)}
        for c, ks in sorted(by_time.items())}}


RUNNERS = {"rounds": run_rounds_protocol, "legacy": run_legacy_protocol,
           "apply": run_apply_protocol}


def bench(url: str, args) -> dict:
    """Run the protocol against the server at ``url``; the figures as a dict."""
    StateClient(url, job=JOB, token=TOKEN).init(args.workers, policy=args.policy)
    recorder = Recorder()
    started = time.perf_counter()
    extra = RUNNERS[args.protocol](url, args, recorder)
    wall = time.perf_counter() - started
    requests_total = sum(len(v) for v in recorder.latency.values())
    critical = summary_ms(recorder.critical)
    return {"policy": args.policy, "protocol": args.protocol, "workers": args.workers,
            **({"lease": args.lease} if args.protocol == "apply" else {}),
            "rounds": args.rounds, "iteration_ms": [c * 1e3 for c in args.iterations],
            "errors": len(recorder.errors), "first_errors": recorder.errors[:5],
            "requests": requests_total,
            "requests_per_round": round(requests_total / args.rounds, 3),
            "requests_per_s": round(requests_total / wall, 1), "seconds": round(wall, 3),
            "critical_path_ms_p50": critical.get("p50_ms"),
            "critical_path_ms_p99": critical.get("p99_ms"),
            "critical_path_ms_mean": critical.get("mean_ms"),
            **({"critical_path_rank0_ms": summary_ms(recorder.critical_rank0)}
               if recorder.critical_rank0 else {}),
            "endpoints": {name: summary_ms(values)
                          for name, values in sorted(recorder.latency.items())},
            **extra}


def process_tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) of ``root`` and its children so far (gunicorn and its worker)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == root or int(fields[1]) == root:      # fields[1]: the parent pid
            total += (int(fields[11]) + int(fields[12])) / tick     # utime, stime
    return total


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="esync-state-bench-") as folder:
        proc = start_state_server(port=free_port(), token=TOKEN, db_path=Path(folder, "db.sqlite3"),
                                  log_path=Path(folder, "server.log"), threads=args.server_threads)
        try:
            wait_until_up(proc.url, timeout=60, proc=proc)
            cpu_before = process_tree_cpu_seconds(proc.pid)
            report = bench(proc.url, args)
            server_cpu = process_tree_cpu_seconds(proc.pid) - cpu_before
        finally:
            stop(proc)
    # CPU time is far less sensitive to a busy machine than latency: it tells what one request
    # and one round cost the server, hence how many workers one server core sustains.
    report["server_cpu_s"] = round(server_cpu, 3)
    report["server_cpu_ms_per_request"] = round(server_cpu * 1e3 / max(1, report["requests"]), 3)
    report["server_cpu_ms_per_round"] = round(server_cpu * 1e3 / args.rounds, 3)
    report.update({"server": "gunicorn gthread, 1 process", "server_threads": args.server_threads,
                   "cpus": os.cpu_count(), "python": platform.python_version(),
                   "command": "python scripts/bench_state_server.py " + " ".join(
                       sys.argv[1:] if argv is None else argv)})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: report[key] for key in (
        "policy", "protocol", "workers", "rounds", "errors", "requests_per_round",
        "requests_per_s", "critical_path_ms_p50", "critical_path_ms_p99",
        "server_cpu_ms_per_request", "server_cpu_ms_per_round")}))
    print(f"wrote {out}")
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
