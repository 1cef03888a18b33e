"""Cost of one push+pull of a resnet18-v1 parameter set through a real ps-lite cluster on loopback.

Starts a scheduler and a server (``python -c "import mxnet"`` with their ``DMLC_ROLE``) and one
worker (this script again, with ``DMLC_ROLE=worker``), all on 127.0.0.1. The worker pushes and
pulls the trainable parameters of ``esync.worker.models.build('resnet18-v1')`` three ways, interleaved
and rotated (A B C, B C A, C A B, ...) so that drift of this shared machine hits all alike:

    channel     esync.worker.kvstore.KVChannel.push_pull: every key pushed, every key pulled, one wait
    per-param   kv.push(k, v); kv.pull(k, out=o); o.wait_to_read() for each parameter in turn
                (what the original ESync did)
    batched     kv.push(keys, vals); kv.pull(keys, out=outs); nd.waitall() (raw MXNet)

and prints median and p90 per method, the bytes moved and the ratios to ``channel``:

    python scripts/bench_kvstore.py --out reports/kvstore_bench.json
    python scripts/bench_kvstore.py --out /tmp/kv.json --reps 30 --warmup 3

Scheduler, server and worker share this machine's cores; the figures are loopback latencies, a
lower bound of what a real network costs, and their ratios are what to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("channel", "per-param", "batched")
NETWORK = "resnet18-v1"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write the figures to")
    parser.add_argument("--reps", type=int, default=30, help="measured repetitions per method")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured repetitions first")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before giving up")
    args = parser.parse_args(argv)
    if args.reps < 2 or args.warmup < 0:
        parser.error("--reps must be >= 2 and --warmup >= 0")
    return args


# -- the launcher (no DMLC_ROLE) ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _role_env(role: str, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(DMLC_ROLE=role, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
               DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1", DMLC_NODE_HOST="127.0.0.1",
               PYTHONUNBUFFERED="1")
    return env


def _still_running(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        return True


def launch(args) -> int:
    port = _free_port()
    procs = {role: subprocess.Popen([sys.executable, "-c", "import mxnet"],
                                    env=_role_env(role, port), cwd=ROOT)
             for role in ("scheduler", "server")}
    procs["worker"] = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                        *sys.argv[1:]], env=_role_env("worker", port), cwd=ROOT)
    deadline = time.monotonic() + args.timeout
    try:
        while procs["worker"].poll() is None:
            dead = [r for r in ("scheduler", "server") if procs[r].poll() is not None]
            if dead and _still_running(procs["worker"], seconds=10):   # not just finishing
                print(f"bench_kvstore: the {dead[0]} exited early "
                      f"(code {procs[dead[0]].returncode})", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"bench_kvstore: no result after {args.timeout:g} s", file=sys.stderr)
                return 1
            time.sleep(0.2)
        for role in ("scheduler", "server"):   # they leave once the worker has finalized
            procs[role].wait(timeout=30)
        return procs["worker"].returncode
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- the worker ---------------------------------------------------------------------------------


def _percentile(values, q) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _methods(kv, channel, keys, vals, outs):
    from mxnet import nd

    def through_channel():
        channel.push_pull(keys, vals, outs)

    def per_param():
        for key, val, out in zip(keys, vals, outs):
            kv.push(key, val)
            kv.pull(key, out=out)
            out.wait_to_read()

    def batched():
        kv.push(keys, vals)
        kv.pull(keys, out=outs)
        nd.waitall()

    return dict(zip(METHODS, (through_channel, per_param, batched)))


def _check_round_trip(method, vals, outs) -> None:
    """After a push+pull with one worker, every pulled array equals the pushed one."""
    from mxnet import nd

    for out in outs:
        out[:] = 0
    method()
    for val, out in zip(vals, outs):
        if not (nd.abs(val - out).max().asscalar() == 0):
            raise SystemExit("bench_kvstore: pulled values differ from pushed ones")


def worker(args) -> int:
    import mxnet as mx
    from mxnet import nd

    from esync.worker import models
    from esync.worker.kvstore import KVChannel, _nbytes

    kv = mx.kv.create("dist_sync")
    net = models.build(NETWORK, mx.cpu())
    trainable, _ = models.trainable_and_aux(net)
    # Copies: the build's inference-mode forward leaves some conv weights of resnet18-v1 in
    # MKLDNN's layout, which the dist KVStore cannot send (same shapes and bytes).
    vals = [p.data().copy() for p in trainable]
    outs = [nd.zeros(v.shape, dtype=v.dtype) for v in vals]
    keys = list(range(len(vals)))
    kv.init(keys, vals)
    channel = KVChannel(kv)
    methods = _methods(kv, channel, keys, vals, outs)
    for method in methods.values():
        _check_round_trip(method, vals, outs)
        for _ in range(args.warmup):
            method()
    seconds = {name: [] for name in METHODS}
    for rep in range(args.reps):
        # interleaved, and rotated each repetition (A B C, B C A, C A B, ...) so that no method
        # always runs right after the same other one
        for name in METHODS[rep % 3:] + METHODS[:rep % 3]:
            start = time.perf_counter()
            methods[name]()
            seconds[name].append(time.perf_counter() - start)
    pushed = sum(_nbytes(v) for v in vals)
    report = _report(args, seconds, pushed, len(vals))
    _print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


def _report(args, seconds, pushed, num_arrays) -> dict:
    summary = {}
    for name, values in seconds.items():
        median = statistics.median(values)
        summary[name] = {"median_ms": round(median * 1e3, 3),
                         "p90_ms": round(_percentile(values, 0.9) * 1e3, 3),
                         "min_ms": round(min(values) * 1e3, 3),
                         "MB_per_s": round(2 * pushed / median / 1e6, 1),
                         "samples_ms": [round(v * 1e3, 3) for v in values]}
    base = summary["channel"]["median_ms"]
    for entry in summary.values():
        entry["median_vs_channel"] = round(entry["median_ms"] / base, 3)
    return {"network": NETWORK, "arrays": num_arrays, "bytes_pushed": pushed,
            "bytes_pulled": pushed, "reps": args.reps, "warmup": args.warmup,
            "order": "interleaved, rotated each repetition",
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "default"),
            "host": platform.node(), "cpus": os.cpu_count(), "methods": summary}


def _print_table(report) -> None:
    print(f"{report['network']}: {report['arrays']} arrays, {report['bytes_pushed']:,} bytes "
          f"pushed and as many pulled per push+pull; {report['reps']} reps each, interleaved")
    print(f"{'method':<10} {'median ms':>10} {'p90 ms':>10} {'MB/s':>8} {'x channel':>10}")
    for name, m in report["methods"].items():
        print(f"{name:<10} {m['median_ms']:>10.1f} {m['p90_ms']:>10.1f} {m['MB_per_s']:>8.0f} "
              f"{m['median_vs_channel']:>10.2f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    role = os.environ.get("DMLC_ROLE")
    if role == "worker":
        return worker(args)
    if role:
        print(f"bench_kvstore: run it without DMLC_ROLE (got {role!r})", file=sys.stderr)
        return 2
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
