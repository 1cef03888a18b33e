"""The report folder: ``report.md`` (for people), ``benchmark.json`` (for programs), figures."""
from __future__ import annotations

import json
import os
import platform
import shlex
import socket
from datetime import datetime
from pathlib import Path

from esync.common import modes
from esync.analysis.table import mean_std, time_cell, write_table
from esync.benchmark.options import canonical_command
from esync.benchmark.plan import Job, Setting, display_argv
from esync.benchmark.runs import tail
from esync.benchmark.shaping import rate_bit_s
from esync.common.files import atomic_write_text

FIGURES_DIR = "figures"


# ----------------------------------------------------------------------------- cells

def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _cell(values, spec: str, scale: float = 1.0) -> str:
    """Mean (± sample std over repeats when there are several) of the values that exist."""
    values = [v * scale for v in values if v is not None]
    mean, std, n = mean_std(values)
    if mean is None:
        return "n/a"
    return format(mean, spec) + (f" ± {format(std, spec)}" if n > 1 else "")


def _speedup(value) -> str:
    return "n/a" if value is None else f"{value:.2f}×"


def _best_other(row: dict, labels: dict) -> str:
    if row.get("speedup_vs_best_other") is None:
        return "n/a"
    return f"{row['speedup_vs_best_other']:.2f}× (over {labels.get(row['best_other'], row['best_other'])})"


def row_label(name: str, labels: dict) -> str:
    return f"{labels.get(name, name)} (`{name}`)"


# ----------------------------------------------------------------------------- sections

def network_section(args, settings: list[Setting], shaping: dict | None) -> list[str]:
    L = ["## Network settings", ""]
    for s in settings:
        L.append(f"- **{s.name}**: {s.label}")
    if args.net_notice:
        L.append(f"- {args.net_notice}")
    L.append("")
    if not shaping:
        return L
    ref, ratio = shaping["reference"], shaping["ratio"]
    measured = shaping.get("measured")
    L += ["**Why this rate.** The shaped setting should cost what networking costs on a real "
          f"cluster of the kind ESync is for. Reference: {ref['name']}: moving the model "
          f"({ref['model_mb']:g} MB) once takes about {ref['transfer_ms']:g} ms, against about "
          f"{ref['compute_ms']:g} ms of compute per iteration, and every worker's pulls leave "
          "the parameter server through its one link. One transfer of the model thus costs "
          f"{ratio:.2f} × one iteration's compute. (The same GPUs on 10 GbE would map to a rate "
          "about ten times higher, which barely throttles a small network here: the loopback "
          "setting stands for that kind of cluster.)"]
    if measured:
        m_mb, t_ms = measured["model_bytes"] / 1e6, measured["compute_s"] * 1e3
        bit_s = shaping["derived_bit_s"]
        gbit_ms = 8 * measured["model_bytes"] / 1e9 * 1e3
        L += ["", f"Here, `{args.network}` has {m_mb:.3g} MB of trainable parameters (float32) "
              f"and one device computes an iteration of batch {args.batch_size} in "
              f"{t_ms:.1f} ms (median over timed iterations, one thread, measured when this "
              "benchmark started, on this machine with whatever else ran then). The matching "
              f"rate makes one transfer cost {ratio:.2f} × {t_ms:.1f} ms: "
              f"8 × {m_mb:.3g} MB / ({ratio:.2f} × {t_ms:.1f} ms) = {bit_s / 1e6:.0f} Mbit/s, "
              f"used as `{shaping['derived']}` for each worker host's link and for the "
              "server's link. With "
              f"{args.workers} workers, one synchronous round's pulls alone keep the server's "
              f"link busy {args.workers} × {ratio * t_ms:.1f} ms. For comparison, at 1 Gbit "
              f"one transfer would take {gbit_ms:.1f} ms = {gbit_ms / t_ms:.2f} of an "
              "iteration."]
        if shaping["worker"] != [shaping["derived"]] or shaping["server"] != shaping["derived"]:
            L += ["", "The rates given on the command line override the derived one."]
    else:
        L += ["", "The rates were given on the command line (`--bandwidth`, "
              "`--server-bandwidth`); nothing was derived."]
    worker_bits = [rate_bit_s(r) for r in shaping["worker"]]
    L += ["", f"Link rates used: workers {', '.join(shaping['worker'])} "
          f"({', '.join(f'{b / 8e6:.1f}' for b in worker_bits)} MB/s), server "
          f"{shaping['server']} ({rate_bit_s(shaping['server']) / 8e6:.1f} MB/s).", ""]
    return L


def tuning_section(args, tuning: dict | None, rows, labels: dict) -> list[str]:
    L = ["## Learning rates", ""]
    if args.lr_grid is None or tuning is None:
        L += [f"Not tuned (`--tune-lr none`): `-l {args.learning_rate:g}` for SGD modes, "
              f"`-ll {args.local_lr:g}` for ESync's local steps.", ""]
        return L
    grid = args.lr_grid
    L += [f"Each row's learning rate (`-l`, or `-ll` for ESync: lr × the gradient summed over "
          f"the batch) is the best of the grid {', '.join(f'{v:g}' for v in grid)}: one short "
          f"run ({args.tune_budget:g} s of training) per value on the first network setting, "
          "on the row's own data split (a by-class row is tuned on by-class data); the best "
          "final test accuracy wins (ties: the smaller rate). Shaped-link rows use the value "
          "of their loopback row. Cells: the short run's final test accuracy; **bold**: "
          "chosen.", "",
          "| Row | " + " | ".join(f"lr {v:g}" for v in grid) + " | Chosen |",
          "| --- |" + " ---: |" * (len(grid) + 1)]
    for group, entry in tuning.items():
        cells = []
        for v in grid:
            score = entry["scores"].get(v)
            text = "failed" if score is None else f"{score:.3f}"
            cells.append(f"**{text}**" if v == entry["lr"] else text)
        chosen = "none (every run failed; default used)" if entry["lr"] is None \
            else f"{entry['lr']:g}"
        L.append(f"| {row_label(group, labels)} | " + " | ".join(cells) + f" | {chosen} |")
    L.append("")
    return L


def side_by_side(args, results: dict, settings: list[Setting], names: list[str],
                 labels: dict) -> list[str]:
    L = ["## Results side by side", "",
         f"Time to test accuracy {args.target:.2f} (s), speedup over SSGD of the same data "
         "split, speedup over the fastest other mode (same split, or one device alone), final "
         "test accuracy, per network setting.", ""]
    head, rule = "| Row |", "| --- |"
    for s in settings:
        head += (f" {s.name}: time to {args.target:.2f} | {s.name}: vs SSGD "
                 f"| {s.name}: vs best other | {s.name}: final accuracy |")
        rule += " ---: | ---: | ---: | ---: |"
    L += [head, rule]
    for name in names:
        cells = []
        for s in settings:
            res = results[s.name]
            row = {r["mode"]: r for r in res["table"]}.get(name)
            metrics = [m for m in res["per_rep"].get(name, []) if m]
            if row is None or not metrics:
                cells += ["—"] * 4
                continue
            cells += [time_cell(row), _speedup(row["speedup"]), _best_other(row, labels),
                      _cell([m["final_accuracy"] for m in metrics], ".3f")]
        L.append(f"| {row_label(name, labels)} | " + " | ".join(cells) + " |")
    L.append("")
    return L


def setting_section(args, setting: Setting, res: dict, labels: dict) -> list[str]:
    names, per_rep = res["names"], res["per_rep"]
    table = {row["mode"]: row for row in res["table"]}
    L = [f"## Results: {setting.name}", "", f"{setting.label}.", ""]
    limits = res["limits"]
    if any(lim["cluster_limit"] is not None for lim in limits):
        cores = limits[0]["cores"]
        L += ["Physical limit of the cluster: min(Σ over devices of one device's standalone "
              f"throughput / its slow-down, {cores} cores × one device's) = min("
              f"{_cell([lim['devices_sum'] for lim in limits], '.1f')}, "
              f"{_cell([lim['cores_bound'] for lim in limits], '.1f')}) = "
              f"**{_cell([lim['cluster_limit'] for lim in limits], '.1f')} samples/s** "
              f"(one device alone: {_cell([lim['standalone_throughput'] for lim in limits], '.1f')}"
              " samples/s, from the standalone run; the emulated slow-down waits without using "
              "a core).", ""]
    else:
        L += ["Physical limit: n/a (no successful standalone run to measure one device's "
              "throughput; add `local` to `--modes`).", ""]
    L += [f"| Mode | Time to {args.target:.2f} (s) | Speedup vs SSGD | Speedup vs best other "
          "| Final accuracy | Standalone SGD accuracy | Throughput (samples/s) "
          "| Fraction of physical limit | Traffic (MB/s pushed+pulled) "
          "| State-server requests per worker-round |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            L.append(f"| {row_label(name, labels)} | failed | | | | | | | | |")
            continue
        row = table.get(name) or {"time_to_target_s": None, "runs_reached": 0, "runs": 0,
                                  "speedup": None, "standalone_accuracy_mean": None}
        frac = _cell([m["throughput_fraction"] for m in metrics], ".2f")
        if not modes.get(modes.family(name)).cluster:
            frac += " (one device: the reference)"
        L.append(" | ".join([
            f"| {row_label(name, labels)}", time_cell(row) if row["runs"] else "n/a",
            _speedup(row["speedup"]), _best_other(row, labels),
            _cell([m["final_accuracy"] for m in metrics], ".3f"),
            _num(row["standalone_accuracy_mean"], ".3f"),
            _cell([m["throughput"] for m in metrics], ".1f"), frac,
            _cell([m["traffic_bytes_per_s"] for m in metrics], ".2f", 1e-6),
            _cell([m["state_requests_per_round"] for m in metrics], ".2f")]) + " |")
    L += ["", "Final accuracy: the last scored checkpoint (the evaluator scores every one). "
          "Throughput: samples processed by all workers / wall time. Traffic: bytes the "
          "workers pushed and pulled through the KVStore, as counted in the logs. "
          "State-server requests: HTTP calls per worker and round (ESync only).", ""]
    devices = sorted({d for n in names for m in per_rep[n] if m for d in m["devices"]})
    if devices:
        L += _device_tables(names, per_rep, devices, labels)
    return L


def _device_tables(names, per_rep, devices, labels) -> list[str]:
    headers = " | ".join(_device_headers(devices, per_rep))
    L = ["### Computing-time ratio per device", "",
         "Time computing (emulated slow-down included) / wall time.", "",
         "| Mode | " + headers + " | Mean |",
         "| --- |" + " ---: |" * (len(devices) + 1)]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            continue
        cells = [_cell([m["devices"].get(d, {}).get("computing_time_ratio") for m in metrics],
                       ".2f") for d in devices]
        L.append(f"| {row_label(name, labels)} | "
                 + " | ".join("—" if c == "n/a" else c for c in cells) + " | "
                 + _cell([m["mean_computing_time_ratio"] for m in metrics], ".2f") + " |")
    L += ["", "### Throughput per device (samples/s)", "",
          "| Mode | " + headers + " |",
          "| --- |" + " ---: |" * len(devices)]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            continue
        cells = [_cell([m["devices"].get(d, {}).get("throughput") for m in metrics], ".1f")
                 for d in devices]
        L.append(f"| {row_label(name, labels)} | "
                 + " | ".join("—" if c == "n/a" else c for c in cells) + " |")
    L.append("")
    return L


def _device_headers(devices: list[str], per_rep: dict) -> list[str]:
    """A column title per ``host/device`` key: the device and its slow-down, with the host
    only where two hosts have a device of the same name (the cluster's emulated hosts and the
    machine the standalone run used)."""
    short = [device.split("/")[-1] for device in devices]
    names = [device if short.count(name) > 1 else name for device, name in zip(devices, short)]
    return [_with_slowdown(name, device, per_rep) for name, device in zip(names, devices)]


def _with_slowdown(name: str, device: str, per_rep: dict) -> str:
    for metrics in per_rep.values():
        for m in metrics:
            if m and device in m["devices"] and m["devices"][device]["slowdown"] is not None:
                return f"{name} (×{m['devices'][device]['slowdown']:g})"
    return name


# ----------------------------------------------------------------------------- figures

def draw(args, results: dict, settings: list[Setting], labels: dict, out: Path) -> list[Path]:
    """Accuracy over time per setting and data split; throughput and traffic side by side."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from esync.analysis import compare
    folder = out / FIGURES_DIR
    written = []
    for s in settings:
        first = next((run for run in results[s.name]["runs"] if run), None)
        if not first:
            continue
        for split in modes.SPLITS:
            chosen = {n: v for n, v in first.items() if modes.parse_folder(n)[1] == split
                      or modes.family(n) == modes.STANDALONE}
            if not any(modes.parse_folder(n)[1] == split for n in chosen):
                continue
            fig = Figure(figsize=(8, 5))
            title = (f"Test accuracy ({split.label or 'i.i.d.'}) — {args.network}, "
                     f"{s.name}")
            if compare.draw_accuracy_rows(fig, chosen, labels, title=title, target=args.target):
                written += compare.save(fig, folder, f"{args.network}-{s.name}-accuracy"
                                                     f"{split.suffix or '-iid'}")
    names = list(dict.fromkeys(n for s in settings for n in results[s.name]["names"]))
    for key, scale, ylabel, stem in (
            ("throughput", 1.0, "Samples/s, all workers", "throughput"),
            ("traffic_bytes_per_s", 1e-6, "MB/s pushed + pulled", "traffic")):
        values = {}
        for n in names:
            values[n] = {}
            for s in settings:
                metrics = [m for m in results[s.name]["per_rep"].get(n, []) if m]
                mean = mean_std([m[key] for m in metrics])[0]
                values[n][s.name] = None if mean is None else mean * scale
        fig = Figure(figsize=(10, 5))
        if compare.draw_setting_bars(fig, values, labels, ylabel=ylabel,
                                     title=f"{ylabel.split(',')[0]} — {args.network}, "
                                           "per network setting"):
            written += compare.save(fig, folder, f"{args.network}-{stem}-by-setting")
    return written


# ----------------------------------------------------------------------------- the report

def render(args, *, jobs: list[Job], tune_jobs: list[Job], results: dict,
           settings: list[Setting], names: list[str], labels: dict, tuning: dict | None,
           shaping: dict | None, written: list[Path], problems: list[str], command: str,
           started: datetime, seconds: float) -> str:
    out = Path(args.out)
    slow = ", ".join(f"×{f:g}" for f in args.slowdowns)
    split_names = {0: "i.i.d. (`-s 0`)", 1: "by class (`-s 1`, the original's class order)",
                   2: "by class, shuffled inside each shard (`-s 2`)"}
    split = " and ".join(split_names[v] for v in args.splits) + (
        " (by class: first network setting only)" if args.niid else "")
    L = [f"# esync benchmark — {args.network}, {args.workers} workers ({slow})", ""]
    L += ["**Machine noise.** Every figure below comes from "
          + ("one run" if args.repeats == 1 else f"{args.repeats} runs")
          + f" on this machine ({socket.gethostname()}, {os.cpu_count()} CPU cores, shared with "
          "whatever else ran at the time). Absolute seconds and samples/s move from run to run; "
          "the meaningful quantities are the ratios between modes measured in the same run "
          "(speedups, throughput as a fraction of the physical limit, computing-time ratio).",
          ""]
    L += ["## Cluster", "",
          f"- {args.workers} emulated devices on this machine's CPU, one worker process each "
          f"(`OMP_NUM_THREADS=1`), slow-down factors {slow} (a worker ×F waits (F−1)·t after "
          "each iteration of t seconds; the wait counts as computing time)",
          f"- network `{args.network}`, batch {args.batch_size} per device, data {split}, "
          f"seed {args.seed}",
          f"- the same training-time budget for every run: {args.budget:g} s "
          "(`--max-seconds`); the evaluator scores every checkpoint off the workers' path "
          "(a checkpoint every 10 rounds of esync and sync, every 40 iterations of rank 0 in "
          "async and dcasgd: about as often in time)",
          f"- ESync rows: one per aggregation rule ({', '.join(a.label for a in args.aggregation_list)}); "
          f"state-server policy {args.policy}",
          "- standalone SGD (`local`): `main.py -m local` on one device at full speed "
          f"(slow-down 1, `OMP_NUM_THREADS=1`), evaluated every {args.local_eval_every} "
          "iterations; its budget is training time (`--max-train-seconds`: the inline scoring "
          "of the test set is left out, as the evaluator's work is in a cluster); it needs no "
          "network, so it runs once and serves every network setting",
          f"- target test accuracy {args.target:.2f}; {args.repeats} repeat(s)"
          + ("" if args.repeats == 1 else " (cells: mean ± sample std over repeats)"),
          f"- started {started:%Y-%m-%d %H:%M:%S}, took {seconds / 60:.1f} min; "
          f"Python {platform.python_version()}, {platform.platform()}", ""]
    L += network_section(args, settings, shaping)
    L += ["## Command", "", "```", command, "```", "",
          "Every option spelled out (runs the same benchmark again; change `--out`):", "",
          "```", canonical_command(args), "```", ""]
    L += tuning_section(args, tuning, names, labels)
    L += side_by_side(args, results, settings, names, labels)
    for s in settings:
        L += setting_section(args, s, results[s.name], labels)
    L += ["## Figures", ""]
    pngs = [p for p in written if p.suffix == ".png"]
    if pngs:
        every = " (the tables use every repeat)" if args.repeats > 1 else ""
        L += [f"Drawn from the first repeat{every}; SVG versions beside the PNGs.", ""]
        for path in pngs:
            rel = path.relative_to(out).as_posix()
            L += [f"### {path.stem}", "", f"![{path.stem}]({rel})", ""]
    else:
        L += ["No figures (no run produced a summary).", ""]
    tables = [p for p in written if p.suffix in (".md", ".csv")]
    if tables:
        L += ["Speedup tables as written by `esync.analysis.table`: "
              + ", ".join(f"[{p.relative_to(out).as_posix()}]({p.relative_to(out).as_posix()})"
                          for p in tables), ""]
    failed = [j for j in tune_jobs + jobs if not j.ok]
    if failed or problems:
        L += ["## Failures", ""]
        L += [f"- {problem}" for problem in problems]
        L += [""] if problems else []
        for job in failed:
            rel = job.log.relative_to(out).as_posix()
            L += [f"### {job.tag}: {job.error}", "", f"Output: [{rel}]({rel})", "", "```",
                  tail(job.log), "```", ""]
    L += ["## Runs", "", "| Run | Result | Learning rate | Seconds | Mode folder | Output |",
          "| --- | --- | ---: | ---: | --- | --- |"]
    for job in tune_jobs + jobs:
        status = "ok" if job.ok else f"failed: {job.error}"
        L.append(f"| {job.tag} | {status} | {job.row.lr_flag} {job.lr:g} | {job.seconds:.0f} | "
                 f"`{job.folder.relative_to(out).as_posix()}` | "
                 f"[log]({job.log.relative_to(out).as_posix()}) |")
    L += ["", "Commands of the first repeat (from the repository root):", "", "```"]
    L += [shlex.join(display_argv(job.argv)) for job in jobs if job.rep == 1]
    L += ["```", ""]
    return "\n".join(L)


def write_tables(args, results: dict, out: Path) -> list[Path]:
    written = []
    for name, res in results.items():
        if res["table"]:
            written += write_table(res["table"], out / "tables" / name, network=args.network,
                                   target=args.target)
    return written


def write_outputs(args, text: str, *, jobs, tune_jobs, results, tuning, shaping, problems,
                  command: str, started: datetime, seconds: float) -> Path:
    out = Path(args.out)
    report = out / "report.md"
    atomic_write_text(report, text)
    data = {
        "command": command, "canonical_command": canonical_command(args),
        "started": started.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
        "config": {"workers": args.workers, "slowdowns": args.slowdowns,
                   "network": args.network, "batch_size": args.batch_size,
                   "budget_s": args.budget, "modes": args.mode_list, "niid": args.niid, "splits": args.splits,
                   "aggregations": [a.slug for a in args.aggregation_list],
                   "repeats": args.repeats, "policy": args.policy, "target": args.target,
                   "lr_grid": args.lr_grid, "tune_budget_s": args.tune_budget,
                   "learning_rate": args.learning_rate, "local_lr": args.local_lr,
                   "seed": args.seed, "local_eval_every": args.local_eval_every,
                   "net": args.net_list},
        "shaping": shaping, "tuning": {g: {"lr": e["lr"], "scores": {f"{k:g}": v for k, v in
                                                                    e["scores"].items()}}
                                       for g, e in (tuning or {}).items()},
        "settings": {name: {"physical_limit": res["limits"], "table": res["table"],
                            "rows": {n: res["per_rep"][n] for n in res["names"]}}
                     for name, res in results.items()},
        "problems": problems,
        "runs": [{"tag": j.tag, "setting": j.setting.name, "rep": j.rep, "name": j.row.name,
                  "lr": j.lr, "ok": j.ok, "error": j.error, "returncode": j.returncode,
                  "seconds": round(j.seconds, 1), "folder": str(j.folder), "log": str(j.log),
                  "argv": j.argv} for j in tune_jobs + jobs],
    }
    atomic_write_text(out / "benchmark.json", json.dumps(data, indent=1))
    return report


__all__ = ["render", "write_outputs", "write_tables", "draw"]
