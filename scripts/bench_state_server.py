"""Latency and throughput of the ESync state server's /apply/ on loopback.

Starts a real state server (gunicorn, one process, threads) on a free loopback port with a
temporary database, then for each client count runs that many threads, each with its own
keep-alive ``StateClient``, calling ``apply`` (or ``plan``) as fast as it can for a bounded time
and number of requests. Prints a table and writes the figures as JSON:

    python scripts/bench_state_server.py --out reports/state_server_bench.json
    python scripts/bench_state_server.py --out /tmp/b.json --clients 1,16,64 --seconds 3

Clients and server share this machine's cores, so the figures are a lower bound of what a
dedicated state server does; the client threads' own GIL contention is included in latency.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esync.state_client import StateClient  # noqa: E402
from esync.state_service import free_port, start_state_server, stop, wait_until_up  # noqa: E402

JOB = "bench"
TOKEN = "bench-token"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write the figures to")
    parser.add_argument("--clients", default="1,16,64", help="comma-separated client thread counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each level")
    parser.add_argument("--max-requests", type=int, default=20000,
                        help="upper bound of requests per client thread and level")
    parser.add_argument("--server-threads", type=int, default=8, help="gunicorn threads")
    parser.add_argument("--endpoint", choices=["apply", "plan"], default="apply")
    args = parser.parse_args(argv)
    try:
        args.client_counts = [int(n) for n in args.clients.split(",")]
    except ValueError:
        parser.error(f"--clients must be comma-separated integers, got {args.clients!r}")
    if not args.client_counts or min(args.client_counts) < 1 or max(args.client_counts) > 512:
        parser.error("--clients must be between 1 and 512")
    if not 0 < args.seconds <= 60 or not 0 < args.max_requests <= 1_000_000:
        parser.error("--seconds must be in (0, 60] and --max-requests in (0, 1000000]")
    return args


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def run_level(url: str, clients: int, *, seconds: float, max_requests: int, endpoint: str) -> dict:
    """``clients`` threads calling the endpoint until ``seconds`` pass or ``max_requests`` each."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client_thread(rank: int) -> None:
        with StateClient(url, job=JOB, token=TOKEN, timeout=30, retry_for=0) as client:
            call = ((lambda k: client.apply(rank, k, 0.01)) if endpoint == "apply"
                    else (lambda k: client.plan(rank, 0.01 * (1 + rank % 4))))
            call(0)                                   # open the keep-alive connection
            barrier.wait()
            mine = latencies[rank]
            try:
                for k in range(1, max_requests + 1):
                    started = time.perf_counter()
                    call(k)
                    mine.append(time.perf_counter() - started)
                    if started >= deadline[0]:
                        break
            except Exception as exc:                   # reported in the figures
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client_thread, args=(rank,)) for rank in range(clients)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    wall = time.perf_counter() - started
    flat = sorted(value for values in latencies for value in values)
    return {"clients": clients, "requests": len(flat), "seconds": round(wall, 3),
            "requests_per_s": round(len(flat) / wall, 1),
            "p50_ms": round(percentile(flat, 0.50) * 1e3, 3),
            "p99_ms": round(percentile(flat, 0.99) * 1e3, 3),
            "mean_ms": round(statistics.fmean(flat) * 1e3, 3),
            "max_ms": round(flat[-1] * 1e3, 3), "errors": len(errors),
            "first_error": errors[0] if errors else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="esync-state-bench-") as folder:
        proc = start_state_server(port=free_port(), token=TOKEN, db_path=Path(folder, "db.sqlite3"),
                                  log_path=Path(folder, "server.log"), threads=args.server_threads)
        try:
            wait_until_up(proc.url, timeout=60, proc=proc)
            StateClient(proc.url, job=JOB, token=TOKEN).init(
                max(args.client_counts), policy="dynamic" if args.endpoint == "apply" else "planned")
            levels = [run_level(proc.url, n, seconds=args.seconds, max_requests=args.max_requests,
                                endpoint=args.endpoint) for n in args.client_counts]
        finally:
            stop(proc)
    report = {"endpoint": f"/jobs/{JOB}/{args.endpoint}/", "server": "gunicorn gthread, 1 process",
              "server_threads": args.server_threads, "seconds_per_level": args.seconds,
              "max_requests_per_client": args.max_requests, "cpus": os.cpu_count(),
              "python": platform.python_version(), "levels": levels}
    print(f"{'clients':>7} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for level in levels:
        print(f"{level['clients']:>7} {level['requests']:>9} {level['requests_per_s']:>8.0f} "
              f"{level['p50_ms']:>8.2f} {level['p99_ms']:>8.2f} {level['errors']:>6}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(level["errors"] == 0 for level in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
