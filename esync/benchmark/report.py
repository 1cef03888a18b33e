"""The report folder: ``report.md`` (for people), ``benchmark.json`` (for programs), figures,
and ``tables/`` (CSV). Every compared figure is a median over repeats with its min–max range
(``stats``); benchmark.json keeps every repeat's numbers beside the aggregates."""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
import shlex
import socket
from datetime import datetime
from pathlib import Path

from esync.common import modes
from esync.benchmark import own_machines, pace, stats
from esync.emulation.standalone_cap import describe as describe_emulation
from esync.benchmark.metrics import TUNING_TOLERANCE
from esync.benchmark.options import (SYNC_CAP_BUDGETS, canonical_command, describe_byclass_grid,
                                     describe_fast_devices, repeat_seeds, sync_cap)
from esync.benchmark.plan import (CLUSTER_EVAL, CONFIRMED_RATES, FAST_MODES, FAST_SUFFIX,
                                  LENGTHENED_RATES, SHIFTING, STANDALONE_CONFIRMING_SEEDS,
                                  UNDECIDED_SCORE, Job, Setting, display_argv, sync_target)
from esync.benchmark.runs import resume_note, tail
from esync.emulation.shaping import rate_bit_s
from esync.benchmark.stats import speedup_cell, time_cell, value_cell
from esync.common.files import atomic_write_text

FIGURES_DIR = "figures"
TABLES_DIR = "tables"
OVERLAP_NOTE = ("Speedups are ratios of medians; \"ranges overlap\" marks a comparison whose two "
                "min–max ranges over the repeats overlap: the difference is within what the "
                "repeats vary by, not a clear win (or loss).")


# ----------------------------------------------------------------------------- cells

def _num(value, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def row_label(name: str, labels: dict) -> str:
    return f"{labels.get(name, name)} (`{name}`)"


def _static(settings: list[Setting]) -> list[Setting]:
    return [s for s in settings if s.scenario == "static"]


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
        m_mb, free_ms = measured["model_bytes"] / 1e6, measured["compute_s"] * 1e3
        share = shaping.get("x1_share")
        t_ms = shaping.get("device_s", measured["compute_s"]) * 1e3
        bit_s = shaping["derived_bit_s"]
        gbit_ms = 8 * measured["model_bytes"] / 1e9 * 1e3
        L += ["", f"Here, `{args.network}` has {m_mb:.3g} MB of trainable parameters (float32) "
              f"and one free core computes an iteration of batch {args.batch_size} in "
              f"{free_ms:.1f} ms (median over timed iterations, one thread, measured when this "
              "benchmark started, on this machine with whatever else ran then)"
              + (f"; a ×1 device, capped at {share:.3g} of a core, takes {t_ms:.1f} ms"
                 if share else "") + ". The matching "
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
    grid = sorted({v for entry in tuning.values()
                   for v in [*entry["scores"], *(entry.get("short_scores") or {})]})
    byclass = (f"tuned on by-class data over "
               + ("the grid " if args.byclass_lr_grid != "auto" else "")
               + f"{describe_byclass_grid(args)}"
               f" (`--byclass-tune-lr`), for {args.byclass_tune_budget:g} s")
    momenta = getattr(args, "momentum_grid", [0.0])
    L += ["**Rule: every row is the best of the same grid, on the same budget.** The grid is "
          f"learning rate × momentum: momentum {', '.join(f'{m:g}' for m in momenta)} (`main.py "
          f"--momentum`{', Nesterov' if getattr(args, 'tune_nesterov', False) else ''}), each "
          "with the rates below times (1 − momentum) (momentum m multiplies the long-run step "
          "by 1/(1 − m): 0.9 shifts the rates down by 10). ESync's outer step (its "
          "aggregation's momentum and -gl) is its point of the momentum axis; its local rate "
          "is tuned like every other row's. Each tuning group below is one row at one "
          "momentum; the row runs with the pair of its best group.", ""]
    L += [f"Each row's learning rate (`-l`, or `-ll` for ESync: lr × the gradient summed over "
          f"the batch) is the best of the grid {', '.join(f'{v:g}' for v in args.lr_grid)}: one short "
          f"run ({args.tune_budget:g} s of training) per value, once per row (not per repeat), "
          f"on {'the machines' if getattr(args, 'machines', None) else 'loopback'} with seed "
          f"{args.seed}, on the row's own data split (a by-class row is "
          f"{byclass}); the best score wins, "
          f"or the smallest rate within {TUNING_TOLERANCE:g} of it (one short run cannot tell "
          "them apart). A run's score is its mean test accuracy over the checkpoints of its "
          "second half (one checkpoint is one sample of a curve that moves). Each i.i.d. row's "
          f"{CONFIRMED_RATES} best rates (of any momentum) then ran again with seed "
          f"{args.seed + 1}"
          + (", one device alone's also with seed "
             + ", ".join(str(args.seed + i) for i in range(2, STANDALONE_CONFIRMING_SEEDS + 1))
             if any(modes.family(g) == modes.STANDALONE for g in tuning) else "")
          + " (one seed cannot tell a good rate from one "
          "that diverges in another); their cells, marked ², are the mean of their seeds' "
          "scores (a by-class row's longer tuning runs run "
          "once: a rate too large for class-ordered shards sits at chance in the first seed). "
          "Shaped-link rows use the value of their loopback row, the shifting scenario's rows "
          "that of their static row. Cells: the short run's score; **bold**: "
          "chosen. A row whose best value was at an edge of the values it tried got the next "
          "value beyond it (a grid step away, up to 3 per side), until its best was inside; "
          "'-': not tried for that row.", "",
          "| Row | " + " | ".join(f"lr {v:g}" for v in grid) + " | Chosen |",
          "| --- |" + " ---: |" * (len(grid) + 1)]
    lengthened = {}
    for group, entry in tuning.items():
        cells = []
        short = entry.get("short_scores") or {}
        if short:
            lengthened[group] = entry.get("budget")
        for v in grid:
            score = entry["scores"].get(v)
            text = "-" if v not in entry["scores"] else "failed" if score is None \
                else f"{score:.3f}" + ("²" if entry.get("seeds", {}).get(v, 1) > 1 else "")
            if short and v in entry["scores"]:
                text += "⁺" + (f" ({short[v]:.3f})" if short.get(v) is not None else "")
            elif short and v in short:
                text = "failed" if short[v] is None else f"{short[v]:.3f}"
            cells.append(f"**{text}**" if v == entry["lr"] else text)
        chosen = "none (every run failed; default used)" if entry["lr"] is None \
            else f"{entry['lr']:g}"
        L.append(f"| {group_label(group, labels)} | " + " | ".join(cells) + f" | {chosen} |")
    L.append("")
    for group, budget in lengthened.items():
        L += [f"⁺ {group_label(group, labels)}: no rate's short run left chance (best score "
              f"under {UNDECIDED_SCORE:g}; chance is 0.1), so its {LENGTHENED_RATES} best rates ran "
              f"again for {budget:g} s, and those runs decided (their short runs' scores in "
              "parentheses).", ""]
    return L


_MOMENTUM_PART = re.compile(r"-momentum([0-9.]+)")


def group_label(group: str, labels: dict) -> str:
    """A tuning group's label: its row's, with the momentum of a momentum group."""
    match = _MOMENTUM_PART.search(group)
    if match is None:
        return row_label(group, labels)
    row = group[:match.start()] + group[match.end():]
    return f"{labels.get(row, row)}, momentum {match.group(1)} (`{group}`)"


def pairs_section(jobs: list[Job], labels: dict) -> list[str]:
    """Each row's chosen (learning rate, momentum), read from its full runs."""
    first = {}
    for job in jobs:
        first.setdefault(job.row.name, job)
    if not first:
        return []
    L = ["Each row's chosen pair (what its full runs ran):", "",
         "| Row | Learning rate | Momentum |", "| --- | ---: | --- |"]
    for name, job in first.items():
        momentum = ("its outer step (the row's aggregation)" if job.row.mode == "esync"
                    else f"{job.row.momentum:g}" if job.row.momentum else "0 (plain SGD)")
        L.append(f"| {row_label(name, labels)} | {job.row.lr_flag} {job.lr:g} | {momentum} |")
    return L + [""]


def table1_section(args, results: dict, settings: list[Setting], labels: dict) -> list[str]:
    """The paper's Table 1: time to the target and speedup over SSGD, SSGD given longer."""
    static = [s for s in _static(settings) if results.get(s.name, {}).get("table1")]
    if not static:
        return []
    cap = sync_cap(args)
    L = [f"## Table 1: time to {args.table1_target:.2f} test accuracy and speedup over SSGD", "",
         f"As in the ESync paper's Table 1, on i.i.d. data. SSGD ran until it reached "
         f"{args.table1_target:.2f} or for at most **{cap:g} s** (`--sync-cap-seconds`, "
         f"default {SYNC_CAP_BUDGETS:g} × "
         f"the budget); every other row had the common {args.budget:g} s budget. Time: median "
         f"over {args.repeats} repeat(s) (min–max); speedup: SSGD's median / the row's.", ""]
    head, rule = "| Row |", "| --- |"
    for s in static:
        head += (f" {s.name}: time to {args.table1_target:.2f} (s) | {s.name}: speedup vs "
                 "SSGD |")
        rule += " ---: | ---: |"
    L += [head, rule]
    tables = {s.name: {r["name"]: r for r in results[s.name]["table1"]} for s in static}
    names = list(dict.fromkeys(n for t in tables.values() for n in t))
    for name in names:
        cells = []
        for s in static:
            row = tables[s.name].get(name)
            if row is None:
                cells += ["—", "—"]
                continue
            speed = "—" if modes.family(name) == modes.BASELINE else speedup_cell(row["vs_sync"])
            cells += [time_cell(row["time"], row["horizon"]), speed]
        L.append(f"| {row_label(name, labels)} | " + " | ".join(cells) + " |")
    L.append("")
    for s in static:
        sync = next((r for r in results[s.name]["table1"]
                     if modes.family(r["name"]) == modes.BASELINE), None)
        if sync is None:
            L.append(f"- {s.name}: no SSGD run succeeded: no speedup.")
        elif sync["time"].median == stats.INF:
            L.append(f"- {s.name}: SSGD did not reach {args.table1_target:.2f} within {cap:g} s "
                     "in "
                     f"{sync['time'].n - sync['time'].reached} of {sync['time'].n} run(s) (its "
                     f"median did not reach it): each speedup is a lower bound, shown as \"> x\" "
                     f"({cap:g} s / the row's median).")
        elif sync["time"].reached < sync["time"].n:
            L.append(f"- {s.name}: SSGD reached {args.table1_target:.2f} within {cap:g} s in "
                     f"{sync['time'].reached} of {sync['time'].n} runs; the median did.")
        else:
            L.append(f"- {s.name}: SSGD reached {args.table1_target:.2f} in every run.")
    L += ["- A row whose median did not reach the target within its budget gets an upper "
          "bound, \"< x\" (SSGD's median / the budget).", "", OVERLAP_NOTE, ""]
    return L


def side_by_side(args, results: dict, settings: list[Setting], names: list[str],
                 labels: dict) -> list[str]:
    static = _static(settings)
    if not static:
        return []
    L = ["## Results side by side", "",
         f"Time to test accuracy {args.target:.2f} (s) within the {args.budget:g} s budget "
         + (f"(by-class rows {args.byclass_budget:g} s) " if any(args.splits) else "") +
         f"(SSGD's longer runs cut at their first checkpoint at or after it), speedup over SSGD "
         "of the same data split, "
         "speedup over the fastest other mode (same split, or one device alone), final test "
         "accuracy, per network setting. Cells: median over the repeats (min–max).", ""]
    head, rule = "| Row |", "| --- |"
    for s in static:
        head += (f" {s.name}: time to {args.target:.2f} | {s.name}: vs SSGD "
                 f"| {s.name}: vs best other | {s.name}: final accuracy |")
        rule += " ---: | ---: | ---: | ---: |"
    L += [head, rule]
    for name in names:
        cells = []
        for s in static:
            agg = results[s.name]["rows"].get(name)
            if agg is None or not agg["ok"]:
                cells += ["—"] * 4
                continue
            cells += [time_cell(agg["time"]), speedup_cell(agg["vs_sync"]),
                      speedup_cell(agg["vs_best_other"], labels, name_other=True),
                      value_cell(agg["accuracy"], ".3f")]
        L.append(f"| {row_label(name, labels)} | " + " | ".join(cells) + " |")
    L += ["", OVERLAP_NOTE, ""]
    return L


def by_class_section(args, results: dict, settings: list[Setting], names: list[str],
                     labels: dict) -> list[str]:
    """By-class rows' accuracy as a whole run shows it: on class-ordered data one checkpoint
    can differ from the next by 0.1, so beside the final one the mean over the run's second
    half, and which row is ahead by each."""
    static = _static(settings)
    split_rows = [n for n in names if stats.row_split(n).value != 0]
    if not static or not split_rows:
        return []
    rows = results[static[0].name]["rows"]
    keys = ("accuracy", "late_accuracy")

    def median(name, key):
        agg = rows.get(name)
        spread = agg.get(key) if agg and agg.get("ok") else None
        return spread.median if spread is not None and spread.values else None

    best = {}                                  # (key, split) -> the row with the top median
    for key in keys:
        for split in {stats.row_split(n).value for n in split_rows}:
            medians = {n: median(n, key) for n in split_rows if stats.row_split(n).value == split}
            medians = {n: m for n, m in medians.items() if m is not None}
            if medians:
                best[(key, split)] = max(medians, key=medians.get)
    L = ["## By-class data", "",
         f"{static[0].name}, {args.byclass_budget:g} s of training per run. Final: the last "
         "scored checkpoint; second half: the mean test accuracy of the checkpoints from half "
         "the run on (a checkpoint on by-class data moves by up to ±0.1 with where each device "
         "stands in its class order). Median over the repeats (min–max); **bold**: the highest "
         "median of the data split.", "",
         "| Row | final accuracy | mean accuracy, second half |", "| --- | ---: | ---: |"]
    for n in split_rows:
        agg = rows.get(n)
        if agg is None or not agg.get("ok"):
            L.append(f"| {row_label(n, labels)} | — | — |")
            continue
        cells = [value_cell(agg.get(key), ".3f") for key in keys]
        cells = [f"**{c}**" if best.get((key, stats.row_split(n).value)) == n else c
                 for key, c in zip(keys, cells)]
        L.append(f"| {row_label(n, labels)} | " + " | ".join(cells) + " |")
    return L + [""]


ALLREDUCE_SUFFIX = "-allreduce"


def collective_section(args, results: dict, settings: list[Setting],
                       labels: dict) -> list[str]:
    """Rows run over both collectives, side by side: time to target, and what the busiest link
    carries per round (the server's over ps, any worker's over the ring)."""
    static = _static(settings)
    pairs = []
    for s in static:
        names = results[s.name]["names"]
        pairs += [(s, n.replace(ALLREDUCE_SUFFIX, ""), n) for n in names
                  if ALLREDUCE_SUFFIX in n and n.replace(ALLREDUCE_SUFFIX, "") in names]
    if not pairs:
        return []
    fast = len(getattr(args, "fast_list", ()) or ())

    def workers(name: str) -> int:
        """A row's workers: the fast devices' for a fast-devices row, else the cluster's."""
        return fast if name.endswith(FAST_SUFFIX) and fast else args.workers

    def ring(name: str) -> float:
        n = workers(name)
        return 2 * (n - 1) / n
    L = ["## Collectives: parameter server and ring allreduce", "",
         "The same rows over MXNet's parameter server (ps) and Horovod's ring allreduce "
         f"({args.workers} workers; a fast-devices row {fast or 'has none'}). Per exchange a "
         "worker pushes the model (plus a small control vector) and pulls the sum: over ps "
         "through its own link, and the server's one link sends all N pulls (N × the model per "
         "round); over the ring each link carries 2(N−1)/N × the model each way, in parallel "
         "(the last column gives it per row). Medians over the repeats.",
         "",
         f"| Setting | Row | ps: time to {args.target:.2f} | allreduce: time to "
         f"{args.target:.2f} | ps: final accuracy | allreduce: final accuracy "
         "| ps: busiest link MB/round (the server's) | allreduce: busiest link MB/round "
         "(a worker's) | allreduce: link bytes per round / model (the ring's 2(N−1)/N) |",
         "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s, ps_name, ar_name in pairs:
        ps, ar = results[s.name]["rows"][ps_name], results[s.name]["rows"][ar_name]
        if not (ps["ok"] and ar["ok"]):
            L.append(f"| {s.name} | {row_label(ps_name, labels)} | failed | | | | | | |")
            continue
        model = ps.get("exchange_bytes")        # what a ps worker pushes: the model (+ control)
        measured = ar.get("worker_link_bytes_per_round")
        share = (measured or ar.get("exchange_bytes") or 0) / model if model else None
        L.append(" | ".join([
            f"| {s.name}", row_label(ps_name, labels), time_cell(ps["time"]),
            time_cell(ar["time"]), value_cell(ps["accuracy"], ".3f"),
            value_cell(ar["accuracy"], ".3f"),
            _counted_measured(ps.get("server_bytes_per_round"),
                              ps.get("server_link_bytes_per_round")),
            _counted_measured(ar.get("exchange_bytes"), measured),
            _num(share, ".2f") + ("" if measured else " (counted)")
            + f" ({ring(ps_name):.2f})"]) + " |")
    L += ["", "Link bytes: as the workers count them (what they hand the collective: over the "
          "ring 2(N−1)/N × the arrays reduced), and in parentheses as the kernel measured "
          "them on the emulated hosts' links (`links.json` of a `--net netns` run: the more "
          "of sent and received, TCP/IP headers and Horovod's control messages included). "
          "Model: what a ps worker pushes per exchange.", ""]
    return L


def _counted_measured(counted, measured) -> str:
    text = _num(counted, ".2f", 1e-6)
    return text + (f" ({measured / 1e6:.2f})" if measured else "")


def _limit_line(limits: list[dict], standalone: dict) -> list[str]:
    if not any(lim["cluster_limit"] is not None for lim in limits):
        return ["Physical limit: n/a (no successful standalone run to measure one device's "
                "throughput; add `local` to `--modes`).", ""]
    cores = limits[0]["cores"]

    def med(key):
        return _num(stats.median([lim[key] for lim in limits]), ".1f")
    if all(lim["cores_bound"] is None for lim in limits if lim["cluster_limit"] is not None):
        return [f"Physical limit of the cluster: Σ over devices of one device's standalone "
                f"throughput / its measured slow-down = **{med('cluster_limit')} samples/s** "
                f"(one device alone: {med('standalone_throughput')} samples/s; every device "
                "on its own hardware, so no machine's cores bound the sum). Medians over the "
                "repeats.", ""]
    if standalone.get("capped"):
        share = standalone["share"]
        return [f"Physical limit of the cluster: Σ over devices of one device's standalone "
                f"throughput / its slow-down = **{med('cluster_limit')} samples/s** (one ×1 "
                f"device, capped at {share:g} core like the cluster's: {med('standalone_throughput')} "
                f"samples/s, from the standalone run; the caps of all devices fit in the "
                f"{cores} cores: min({med('devices_sum')}, {cores} cores × "
                f"{med('standalone_throughput')} / {share:g} = {med('cores_bound')})). Medians "
                "over the repeats.", ""]
    return [f"Physical limit of the cluster: min(Σ over devices of one device's standalone "
            f"throughput / its slow-down, {cores} cores × one device's) = min("
            f"{med('devices_sum')}, {med('cores_bound')}) = **{med('cluster_limit')} "
            f"samples/s** (one device alone: {med('standalone_throughput')} samples/s, from "
            "the standalone run; the emulated slow-down sleeps without using a core). Medians "
            "over the repeats.", ""]


def setting_section(args, setting: Setting, res: dict, labels: dict,
                    standalone: dict) -> list[str]:
    names, per_rep, rows = res["names"], res["per_rep"], res["rows"]
    L = [f"## Results: {setting.name}", "", f"{setting.label}.", ""]
    L += _limit_line(res["limits"], standalone)
    local = next((rows[n] for n in names if modes.family(n) == modes.STANDALONE
                  and rows[n]["ok"]), None)
    L += [f"| Mode | Time to {args.target:.2f} (s) | Speedup vs SSGD | Speedup vs best other "
          "| Final accuracy | Standalone SGD accuracy | Throughput (samples/s) "
          "| Fraction of physical limit | Traffic (MB/s pushed+pulled) "
          "| State-server requests per worker-round |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        agg = rows[name]
        if not agg["ok"]:
            L.append(f"| {row_label(name, labels)} | failed | | | | | | | | |")
            continue
        frac = _num(agg["throughput_fraction"], ".2f")
        if not modes.get(modes.family(name)).cluster:
            frac += " (one device: the reference)"
        L.append(" | ".join([
            f"| {row_label(name, labels)}", time_cell(agg["time"]),
            speedup_cell(agg["vs_sync"]),
            speedup_cell(agg["vs_best_other"], labels, name_other=True),
            value_cell(agg["accuracy"], ".3f"),
            "n/a" if local is None else value_cell(local["accuracy"], ".3f"),
            _num(agg["throughput"], ".1f"), frac,
            _num(agg["traffic_bytes_per_s"], ".2f", 1e-6),
            _num(agg["state_requests_per_round"], ".2f")]) + " |")
    L += ["", "Time to target and final accuracy: median (min–max) over the repeats that ran; "
          "the other columns: medians. Final accuracy: the last scored checkpoint (the "
          "evaluator scores every one; a run stops at the first round after its budget; SSGD's "
          "longer runs: their first checkpoint at or after the budget). Throughput: samples "
          "processed by all "
          "workers / wall time (SSGD's longer runs: over the whole run). Traffic: bytes the "
          "workers pushed and pulled through the KVStore, as counted in the logs. "
          "State-server requests: HTTP calls per worker and round (ESync only).", ""]
    devices = sorted({d for n in names for m in per_rep[n] if m for d in m["devices"]})
    if devices:
        L += _device_tables(names, per_rep, devices, labels)
    return L


def shifting_section(args, setting: Setting, res: dict, labels: dict) -> list[str]:
    names, rows, per_rep = res["names"], res["rows"], res["per_rep"]
    switch = setting.switch_s
    L = [f"## Scenario: a fast device slows down ({SHIFTING})", "",
         f"{setting.label} (`{' '.join(setting.argv)}`): the situation ESync's dynamic policy "
         "is for. The planned policy gives each device its k at the start of every round, "
         "from the iteration times reported in the rounds before (so it follows a change "
         "a round or two late); the dynamic policy asks the state server during every "
         "round. Same budget, seeds and learning rates as the static rows.", "",
         f"| Row | Time to {args.target:.2f} (s) | Speedup vs SSGD | Final accuracy "
         f"| Throughput before {switch:g} s | Throughput after | After / before |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        agg = rows[name]
        if not agg["ok"]:
            L.append(f"| {row_label(name, labels)} | failed | | | | | |")
            continue
        ms = [m for m in per_rep[name] if m]
        before = stats.median([m.get("throughput_before") for m in ms])
        after = stats.median([m.get("throughput_after") for m in ms])
        ratio = stats.median([m["throughput_after"] / m["throughput_before"] for m in ms
                              if m.get("throughput_before") and m.get("throughput_after")
                              is not None])
        L.append(" | ".join([
            f"| {row_label(name, labels)}", time_cell(agg["time"]),
            speedup_cell(agg["vs_sync"]), value_cell(agg["accuracy"], ".3f"),
            _num(before, ".1f"), _num(after, ".1f"), _num(ratio, ".2f")]) + " |")
    L += ["", f"Throughput: samples/s of all workers in rounds that ended before / after "
          f"{switch:g} s (medians over the repeats). Time and accuracy: median (min–max).", "",
          OVERLAP_NOTE, ""]
    return L


def _device_tables(names, per_rep, devices, labels) -> list[str]:
    headers = " | ".join(_device_headers(devices, per_rep))
    L = ["### Computing-time ratio per device", "",
         "Time computing (emulated slow-down included) / wall time; medians over the repeats.",
         "", "| Mode | " + headers + " | Mean |",
         "| --- |" + " ---: |" * (len(devices) + 1)]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            continue
        cells = [_num(stats.median([m["devices"].get(d, {}).get("computing_time_ratio")
                                    for m in metrics]), ".2f") for d in devices]
        L.append(f"| {row_label(name, labels)} | "
                 + " | ".join("—" if c == "n/a" else c for c in cells) + " | "
                 + _num(stats.median([m["mean_computing_time_ratio"] for m in metrics]), ".2f")
                 + " |")
    L += ["", "### Throughput per device (samples/s)", "",
          "| Mode | " + headers + " |",
          "| --- |" + " ---: |" * len(devices)]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            continue
        cells = [_num(stats.median([m["devices"].get(d, {}).get("throughput")
                                    for m in metrics]), ".1f") for d in devices]
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

def _by_row(runs: list[dict], names) -> dict[str, list[dict]]:
    return {n: [run[n] for run in runs if n in run] for n in names}


def figure_end(per_rep: dict, names) -> float | None:
    """Where accuracy figures end: the last record of the runs that kept the budget (runs stop
    a little after it), so that SSGD's longer runs do not stretch the axis."""
    ends = [m["last_record_s"] for n in names for m in per_rep.get(n, [])
            if m and m.get("horizon") is None and m.get("last_record_s") is not None]
    return max(ends) if ends else None


def draw(args, results: dict, settings: list[Setting], labels: dict, out: Path) -> list[Path]:
    """Accuracy over time (median and min–max band over repeats) per setting and data split,
    the shifting scenario's with its change marked; throughput and traffic side by side."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from esync.analysis import compare
    folder = out / FIGURES_DIR
    written = draw_lead(args, results, settings, labels, folder)
    for s in settings:
        res = results[s.name]
        if not any(res["runs"]):
            continue
        if s.scenario == SHIFTING:
            fig = Figure(figsize=(8, 5))
            title = f"Test accuracy, {s.label} — {args.network}"
            if compare.draw_accuracy_bands(fig, _by_row(res["runs"], res["names"]), labels,
                                           title=title, target=args.target,
                                           xmax=figure_end(res["per_rep"], res["names"]),
                                           marks={"device slows down": s.switch_s},
                                           zoom=True):
                written += compare.save(fig, folder, f"{args.network}-{s.name}-accuracy")
            continue
        for split in modes.SPLITS:
            chosen = [n for n in res["names"] if modes.parse_folder(n)[1] == split
                      or modes.family(n) == modes.STANDALONE]
            if not any(modes.parse_folder(n)[1] == split for n in chosen):
                continue
            fig = Figure(figsize=(8, 5))
            title = (f"Test accuracy ({split.label or 'i.i.d.'}) — {args.network}, "
                     f"{s.name}")
            if compare.draw_accuracy_bands(fig, _by_row(res["runs"], chosen), labels,
                                           title=title, target=args.target,
                                           xmax=figure_end(res["per_rep"], chosen),
                                           zoom=True):
                written += compare.save(fig, folder, f"{args.network}-{s.name}-accuracy"
                                                     f"{split.suffix or '-iid'}")
    static = _static(settings)
    names = list(dict.fromkeys(n for s in static for n in results[s.name]["names"]))
    for key, scale, ylabel, stem in (
            ("throughput", 1.0, "Samples/s, all workers", "throughput"),
            ("traffic_bytes_per_s", 1e-6, "MB/s pushed + pulled", "traffic")):
        values = {}
        for n in names:
            values[n] = {}
            for s in static:
                agg = results[s.name]["rows"].get(n)
                value = agg.get(key) if agg and agg["ok"] else None
                values[n][s.name] = None if value is None else value * scale
        fig = Figure(figsize=(10, 5))
        if compare.draw_setting_bars(fig, values, labels, ylabel=ylabel,
                                     title=f"{ylabel.split(',')[0]} (median) — {args.network}, "
                                           "per network setting"):
            written += compare.save(fig, folder, f"{args.network}-{stem}-by-setting")
    return written


def alternatives_lines(args) -> list[str]:
    """The Cluster section's lines on the alternatives' rows and on what the default trims."""
    fast = getattr(args, "fast_list", [])
    L = []
    on_fast = [modes.get(m).label for m in FAST_MODES if m in args.mode_list]
    on_fast += ["Horovod's SSGD"] * bool(getattr(args, "horovod_rows", False))
    if fast and on_fast:
        L.append(f"- the fast devices alone: {describe_fast_devices(args)}, the rest idle "
                 "(`--fast-devices`), each under its cap in the cluster: rows "
                 + " and ".join(on_fast) + " on them")
    if getattr(args, "horovod_rows", False):
        L.append("- Horovod's SSGD (`--collective allreduce`) on the whole cluster"
                 + (" and on the fast devices" if fast else "") + ", with SSGD's pair")
    elif getattr(args, "horovod_notice", None):
        L.append(f"- {args.horovod_notice}")
    if args.splits == [0]:
        L.append("- no by-class rows (`--data both` adds them): the default leaves them out "
                 "to fit 100 minutes on 2 cores with the momentum axis of the grid and the "
                 "alternatives' rows (docs/BENCHMARK.md, \"Budget\")")
    return L


LEAD_STEM = "time-to-target"


def lead_order(names: list[str]) -> list[str]:
    """The lead picture's rows: ESync's first, then the alternatives in report order."""
    return sorted(names, key=lambda n: modes.family(n) != "esync")


def lead_times(args, results: dict, settings: list[Setting]) -> dict[str, dict]:
    """``{row: {setting: (median, low, high) or None}}`` of the i.i.d. rows in the static
    settings (one device alone in every one: it needs no network), a range's unreached end
    drawn at the budget."""
    static = _static(settings)
    names = [n for s in static for n in results[s.name]["names"]
             if modes.parse_folder(n)[1].value == 0]
    found: dict[str, dict] = {}
    for name in lead_order(list(dict.fromkeys(names))):
        for s in static:
            agg = results[s.name]["rows"].get(name)
            t = agg.get("time") if agg and agg.get("ok") else None
            if t is None or t.finite_median is None:
                found.setdefault(name, {})[s.name] = None
                continue
            found.setdefault(name, {})[s.name] = (
                t.finite_median, t.low, min(t.high, args.budget))
    return found


def draw_lead(args, results: dict, settings: list[Setting], labels: dict,
              folder: Path) -> list[Path]:
    """The picture the report leads with: every i.i.d. row's time to the target, ESync's and
    the alternatives' side by side, one panel per network setting."""
    from matplotlib.figure import Figure

    from esync.analysis import compare
    times = lead_times(args, results, settings)
    fig = Figure(figsize=(5 + 3 * len(_static(settings)), 1.5 + 0.35 * max(1, len(times))))
    if not compare.draw_time_to_target(fig, times, labels, target=args.target,
                                       budget=args.budget,
                                       title=f"Time to test accuracy {args.target:g} — "
                                             f"{args.network}, every row at its best pair"):
        return []
    return compare.save(fig, folder, f"{args.network}-{LEAD_STEM}")


def lead_section(args, written: list[Path], out: Path) -> list[str]:
    """The report's first picture, with what it shows."""
    png = next((p for p in written if p.suffix == ".png" and p.stem.endswith(LEAD_STEM)), None)
    if png is None:
        return []
    rel = png.relative_to(out).as_posix()
    return [f"![time to {args.target:g} per row]({rel})", "",
            f"Time to test accuracy {args.target:.2f} per row: the bar is the median over the "
            f"repeats, the whisker their min–max; no bar: the median run did not reach it in "
            f"{args.budget:g} s. Every row ran with its best (learning rate, momentum) pair of "
            "the same grid on the same budget (\"Learning rates\"); ESync's rows first, then "
            "the alternatives a user would pick (the baselines on the whole cluster and, where "
            "they ran, on the fast devices alone and over Horovod; one device alone).", ""]


# ----------------------------------------------------------------------------- the report

def render(args, *, jobs: list[Job], tune_jobs: list[Job], results: dict,
           settings: list[Setting], names: list[str], labels: dict, tuning: dict | None,
           shaping: dict | None, written: list[Path], problems: list[str], command: str,
           started: datetime, seconds: float, emulation: dict | None = None,
           standalone: dict | None = None) -> str:
    out = Path(args.out)
    standalone = standalone or {"capped": False, "share": None, "reason": "not recorded"}
    emulation = emulation or {"counts": {}, "shares": [], "placement": None, "runs": 0}
    slow = ", ".join(f"×{f:g}" for f in args.slowdowns)
    split_names = {0: "i.i.d. (`-s 0`)", 1: "by class (`-s 1`, the original's class order)",
                   2: "by class, shuffled inside each shard (`-s 2`)"}
    split = " and ".join(split_names[v] for v in args.splits) + (
        " (by class: first network setting only)" if args.niid else "")
    seeds = ", ".join(map(str, repeat_seeds(args)))
    capped = emulation["counts"].get("cpu-cap", 0) > 0
    L = [f"# esync benchmark — {args.network}, {args.workers} workers ({slow})", ""]
    L += lead_section(args, written, out)
    L += ["**Machine noise.** Every figure below comes from "
          + ("one run" if args.repeats == 1 else f"{args.repeats} runs (seeds {seeds}"
             + ("; the same data order and initial weights each time, so the ranges are the "
                "timing's alone" if args.same_seed else "") + ")")
          + (f" per row and setting on the machines below (launched from "
             f"{socket.gethostname()}), shared with whatever else ran on them at the time). "
             if getattr(args, "machines", None) else
             f" per row and setting on this machine ({socket.gethostname()}, {os.cpu_count()} "
             "CPU cores, shared with whatever else ran at the time). ")
          + ("Cells give the median over the repeats and their min–max range; speedups are "
             "ratios of medians, and where two rows' ranges overlap the report says the "
             "difference is not clear. " if args.repeats > 1 else
             "With one repeat there is no range: treat close numbers as equal. ")
          + "Absolute seconds and samples/s move from run to run; the meaningful quantities "
          "are the ratios between modes (speedups, throughput as a fraction of the physical "
          "limit, computing-time ratio).", ""]
    emulated = ("each device's worker runs in a cgroup capped at S/F of a core (S: the ×1 "
                "device's share), with one compute thread" if capped else
                "a worker ×F sleeps (F−1)·t after each iteration of t seconds; the wait counts "
                "as computing time")
    L += ["## Cluster", ""]
    if getattr(args, "machines", None):
        L += own_machines.cluster_lines(args)
    else:
        L += [f"- {args.workers} emulated devices on this machine's CPU, one worker process "
              f"each, slow-down factors {slow} ({emulated})"]
        L += describe_emulation(emulation, standalone)
    L += [f"- network `{args.network}`, batch {args.batch_size} per device, data {split}",
          f"- {args.repeats} repeat(s), seeds {seeds} (data partition, shuffling, initial "
          "weights); the learning-rate tuning ran once",
          f"- the same training-time budget for every run: {args.budget:g} s "
          f"(`--max-seconds`; by-class rows {args.byclass_budget:g} s, as class-ordered "
          "shards learn slower), except SSGD's i.i.d. runs of the static scenario: until "
          f"{sync_target(args):.2f} or {sync_cap(args):g} s (Table 1; the other tables use "
          "their records up to the first checkpoint at or after the budget, where a run with the "
          "budget would have stopped); the evaluator scores every checkpoint off the workers' path "
          f"(a checkpoint every {CLUSTER_EVAL} of training in every cluster mode: one grid "
          "in time, whatever a round lasts)",
          f"- ESync rows: one per aggregation rule ({', '.join(a.label for a in args.aggregation_list)}"
          + (f"; on by-class data {', '.join(a.label for a in args.byclass_aggregation_list)}"
             if any(args.splits) else "") + "); "
          f"state-server policy {args.policy}",
          *alternatives_lines(args),
          "- standalone SGD (`local`): `main.py -m local` on one ×1 device, evaluated every "
          f"{args.local_eval_every} iterations; its budget is training time "
          "(`--max-train-seconds`: the inline scoring of the test set is left out, as the "
          "evaluator's work is in a cluster); it needs no network, so it serves every network "
          "setting",
          f"- scenarios: {', '.join(args.scenario_list)}"
          + (f" ({args.scenario_notice})" if getattr(args, "scenario_notice", None) else ""),
          f"- target test accuracy {args.target:.2f} (Table 1: {args.table1_target:.2f}, the "
          "ESync paper's); a run's time to it is when its curve crossed it, linearly between "
          "the two checkpoints around the crossing (the checkpoint after it is late by up to "
          "a checkpoint interval; benchmark.json keeps it as `time_to_target_checkpoint`)",
          f"- started {started:%Y-%m-%d %H:%M:%S}, took {seconds / 60:.1f} min; "
          f"Python {platform.python_version()}, {platform.platform()}",
          *([f"- {note}"] if (note := resume_note([*tune_jobs, *jobs])) else []), ""]
    L += network_section(args, _static(settings), shaping)
    L += ["## Command", "", "```", command, "```", "",
          "Every option spelled out (runs the same benchmark again; change `--out`):", "",
          "```", canonical_command(args), "```", ""]
    L += tuning_section(args, tuning, names, labels)
    L += pairs_section(jobs, labels)
    L += table1_section(args, results, settings, labels)
    L += side_by_side(args, results, settings, names, labels)
    per_setting = {s.name: results[s.name]["per_rep"] for s in settings}
    L += pace.section(per_setting, target=args.target, batch=args.batch_size,
                      labels={n: row_label(n, labels) for rows in per_setting.values()
                              for n in rows})
    L += by_class_section(args, results, settings, names, labels)
    L += collective_section(args, results, settings, labels)
    for s in settings:
        if s.scenario == SHIFTING:
            L += shifting_section(args, s, results[s.name], labels)
        else:
            L += setting_section(args, s, results[s.name], labels, standalone)
    L += ["## Figures", ""]
    pngs = [p for p in written if p.suffix == ".png"]
    if pngs:
        L += [("Accuracy: the median over the repeats, the band their min–max; "
               if args.repeats > 1 else "Accuracy: the one repeat; ")
              + "bars: medians. SVG versions beside the PNGs.", ""]
        for path in pngs:
            rel = path.relative_to(out).as_posix()
            L += [f"### {path.stem}", "", f"![{path.stem}]({rel})", ""]
    else:
        L += ["No figures (no run produced a summary).", ""]
    tables = [p for p in written if p.suffix == ".csv"]
    if tables:
        L += ["Tables as CSV: "
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
    L += ["## Runs", "",
          "| Run | Result | Learning rate | Seed | Budget (s) | Seconds | Mode folder | Output |",
          "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for job in tune_jobs + jobs:
        status = "ok" if job.ok else f"failed: {job.error}"
        momentum = f", --momentum {job.row.momentum:g}" if job.row.momentum else ""
        L.append(f"| {job.tag} | {status} | {job.row.lr_flag} {job.lr:g}{momentum} | {job.seed} | "
                 f"{job.budget:g} | {job.seconds:.0f} | "
                 f"`{job.folder.relative_to(out).as_posix()}` | "
                 f"[log]({job.log.relative_to(out).as_posix()}) |")
    L += ["", "Commands of the first repeat (from the repository root"
          + ("; the standalone run is started inside its CPU cap's cgroup with "
             "`OMP_NUM_THREADS=1` and the other one-thread variables" if standalone.get("capped")
             else "") + "):", "", "```"]
    L += [shlex.join(display_argv(job.argv)) for job in jobs if job.rep == 1]
    L += ["```", ""]
    return "\n".join(L)


# ----------------------------------------------------------------------------- files

TABLE_COLUMNS = ("setting", "row", "label", "runs", "ok", "reached", "time_median_s",
                 "time_min_s", "time_max_s", "speedup_vs_sync", "speedup_vs_sync_bound",
                 "speedup_vs_sync_overlap", "best_other", "speedup_vs_best_other",
                 "speedup_vs_best_other_bound", "speedup_vs_best_other_overlap",
                 "final_accuracy_median", "final_accuracy_min", "final_accuracy_max",
                 "late_accuracy_median", "late_accuracy_min", "late_accuracy_max",
                 "throughput_median", "computing_time_ratio_median",
                 "traffic_bytes_per_s_median")


def table_rows(results: dict, labels: dict) -> list[dict]:
    """One CSV row per setting and row: the aggregates (empty cells for missing figures)."""
    found = []
    for setting, res in results.items():
        for name, agg in res["rows"].items():
            row = {"setting": setting, "row": name, "label": labels.get(name, name),
                   "runs": agg["runs"], "ok": agg["ok"]}
            if agg["ok"]:
                t, acc = agg["time"].to_json(), agg["accuracy"].to_json()
                row.update(reached=t["reached"], time_median_s=t["median"], time_min_s=t["min"],
                           time_max_s=t["max"], final_accuracy_median=acc["median"],
                           final_accuracy_min=acc["min"], final_accuracy_max=acc["max"],
                           throughput_median=agg["throughput"],
                           computing_time_ratio_median=agg["computing_time_ratio"],
                           traffic_bytes_per_s_median=agg["traffic_bytes_per_s"])
                late = agg.get("late_accuracy")
                if late is not None:
                    late = late.to_json()
                    row.update(late_accuracy_median=late["median"], late_accuracy_min=late["min"],
                               late_accuracy_max=late["max"])
                for key, col in (("vs_sync", "speedup_vs_sync"),
                                 ("vs_best_other", "speedup_vs_best_other")):
                    s = agg[key]
                    if s is not None:
                        row.update({col: s.value, f"{col}_bound": s.bound,
                                    f"{col}_overlap": s.overlap})
                        if key == "vs_best_other":
                            row["best_other"] = s.other
            found.append(row)
    return found


def write_tables(args, results: dict, out: Path, labels: dict | None = None) -> list[Path]:
    """``tables/results.csv`` (every setting's aggregates) and ``tables/table1.csv``."""
    labels = labels or {}
    folder = out / TABLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "results.csv"]
    _write_csv(written[0], TABLE_COLUMNS, table_rows(results, labels))
    t1 = [dict(setting=setting, row=r["name"], label=labels.get(r["name"], r["name"]),
               horizon_s=r["horizon"], **{f"time_{k}": v for k, v in r["time"].to_json().items()
                                          if k != "values"},
               **({} if r["vs_sync"] is None else {
                   "speedup_vs_sync": r["vs_sync"].value, "bound": r["vs_sync"].bound,
                   "overlap": r["vs_sync"].overlap}))
          for setting, res in results.items() for r in res.get("table1", [])]
    if t1:
        written.append(folder / "table1.csv")
        _write_csv(written[1], ("setting", "row", "label", "horizon_s", "time_median",
                                "time_min", "time_max", "time_n", "time_reached",
                                "speedup_vs_sync", "bound", "overlap"), t1)
    return written


def _write_csv(path: Path, columns, rows) -> None:
    with path.open("w", newline="", encoding="utf-8") as fp:
        writer = csv.DictWriter(fp, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


def _aggregates_json(rows: dict) -> dict:
    found = {}
    for name, agg in rows.items():
        entry = {}
        for key, value in agg.items():
            entry[key] = value.to_json() if hasattr(value, "to_json") else value
        found[name] = entry
    return found


def write_outputs(args, text: str, *, jobs, tune_jobs, results, tuning, shaping, problems,
                  command: str, started: datetime, seconds: float, emulation: dict | None = None,
                  standalone: dict | None = None, estimate: dict | None = None) -> Path:
    out = Path(args.out)
    report = out / "report.md"
    atomic_write_text(report, text)
    data = {
        "command": command, "canonical_command": canonical_command(args),
        "started": started.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
        "kept_runs": sum(1 for j in [*tune_jobs, *jobs] if j.kept),
        "estimate_s": None if estimate is None else round(estimate["total_s"], 1),
        "config": {"workers": args.workers, "slowdowns": args.slowdowns,
                   "network": args.network, "batch_size": args.batch_size,
                   "budget_s": args.budget, "sync_cap_s": sync_cap(args),
                   "modes": args.mode_list, "niid": args.niid, "splits": args.splits,
                   "aggregations": [a.slug for a in args.aggregation_list],
                   "byclass_aggregations": [a.slug for a in args.byclass_aggregation_list],
                   "repeats": args.repeats,
                   "seeds": repeat_seeds(args),
                   "scenarios": args.scenario_list, "policy": args.policy,
                   "target": args.target, "table1_target": args.table1_target,
                   "lr_grid": args.lr_grid, "byclass_lr_grid": args.byclass_lr_grid,
                   "tune_budget_s": args.tune_budget,
                   "byclass_budget_s": args.byclass_budget,
                   "byclass_tune_budget_s": args.byclass_tune_budget,
                   "learning_rate": args.learning_rate, "local_lr": args.local_lr,
                   "seed": args.seed, "local_eval_every": args.local_eval_every,
                   "net": args.net_list, "emulation": args.emulation,
                   "cpu_share": args.cpu_share},
        "emulation": {"cluster": emulation, "standalone": standalone},
        "shaping": shaping,
        "tuning": {g: {"lr": e["lr"],
                       "scores": {f"{k:g}": v for k, v in e["scores"].items()},
                       "seeds": {f"{k:g}": v for k, v in e.get("seeds", {}).items()},
                       "budget_s": e.get("budget"),
                       "short_scores": {f"{k:g}": v
                                        for k, v in (e.get("short_scores") or {}).items()}}
                   for g, e in (tuning or {}).items()},
        "chosen_pairs": {j.row.name: {"lr": j.lr, "momentum": j.row.momentum}
                         for j in jobs if j.rep == 1},
        "settings": {name: {"scenario": res["scenario"], "physical_limit": res["limits"],
                            "rows": {n: res["per_rep"][n] for n in res["names"]},
                            "aggregates": _aggregates_json(res["rows"]),
                            "table1": [{"name": r["name"], "horizon_s": r["horizon"],
                                        "time": r["time"].to_json(),
                                        "vs_sync": None if r["vs_sync"] is None
                                        else r["vs_sync"].to_json()}
                                       for r in res.get("table1", [])]}
                     for name, res in results.items()},
        "machines": args.machines.as_json() if getattr(args, "machines", None) else None,
        "problems": problems,
        "runs": [{"tag": j.tag, "setting": j.setting.name, "rep": j.rep, "seed": j.seed,
                  "name": j.row.name, "lr": j.lr, "budget_s": j.budget, "ok": j.ok,
                  "error": j.error, "returncode": j.returncode,
                  "seconds": round(j.seconds, 1), "folder": str(j.folder), "log": str(j.log),
                  "argv": j.argv, "prefix": j.prefix or None} for j in tune_jobs + jobs],
    }
    atomic_write_text(out / "benchmark.json", json.dumps(_clean(data), indent=1,
                                                         allow_nan=False))
    return report


def _clean(value):
    """JSON has no NaN nor infinity: they become null (a diverged run, a target not reached)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "to_json"):
        return _clean(value.to_json())
    return value


__all__ = ["render", "write_outputs", "write_tables", "draw"]
