"""Draw the original's five comparison figures and the speedup table from the mode summaries.

Run from the repository root::

    python analysis/drawer.py -b logs -n lenet                       # -> logs/lenet/figures/
    python analysis/drawer.py -b logs/rep1 logs/rep2 -n lenet -o out  # table over two runs

It reads ``<base>/<network>/<mode>/<Name>.json`` for every mode folder (``esync``, ``sync``,
``async``, ``dcasgd``, ``local`` and their ``-niid`` variants). A mode folder that has device logs
but no summary, or a summary older than its newest log, is summarised first (as
``summary.py`` would). Folders with neither are skipped with a notice.

Figures (PNG and SVG, named like the original's images, ``<network>-<figure>.png``):

1. ``accuracy-iid``: test accuracy over time of ESync, SSGD, ASGD, DC-ASGD (i.i.d. data), with
   standalone SGD's final accuracy (from the ``local`` run) as a dashed line;
2. ``accuracy-niid``: the same for the ``*-niid`` folders;
3. ``data-throughput``: samples/s per mode, cluster total and per device;
4. ``traffic-load``: bytes pushed + pulled per second per mode, as counted in the logs;
5. ``computing-time-ratio``: computing time / wall time per device and mode.

Accuracy comes from the evaluator's records when present, else from the device that logged it
(rank 0's, as in the original). With several log roots the figures come from the first; the
speedup table (``speedup.md``, ``speedup.csv``, see ``table.py``) uses them all. Figures are
drawn with matplotlib's Agg backend (no display needed); ``--show`` also opens them in windows.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from esync.analysis.summary import (LogError, device_entries, find_device_dirs, load_summary, split_mode,
                                    summary_name, write_summary)
from esync.analysis.table import (MODE_ORDER, accuracy_series, cluster_totals, final_accuracy,
                                  mode_label, mode_sort_key, speedup_table, time_to_accuracy,
                                  write_table)

from esync.analysis.compare import zoomed_range
from esync.common import modes, runlayout
from esync.common.argtypes import HelpFormatter, bounded_number

__all__ = ["load_summaries", "draw_all", "time_to_accuracy", "speedup_table", "main"]

ACCURACY_MODES = tuple(m.name for m in modes.MODES if m.cluster)
FIGURES_DIR = "figures"
MINUTES_ABOVE_S = 600  # time axes switch from seconds to minutes beyond this
NAN = float("nan")

Notify = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"drawer: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------- loading

def _newest_input(mode_dir: Path) -> float:
    """The newest modification time among the files a summary is made from."""
    newest = 0.0
    for by_device in find_device_dirs(mode_dir).values():
        for device_dir in by_device.values():
            for path in runlayout.round_logs(device_dir).values():
                newest = max(newest, path.stat().st_mtime)
    for path in (runlayout.evaluations_file(mode_dir), runlayout.run_file(mode_dir)):
        if path.exists():
            newest = max(newest, path.stat().st_mtime)
    return newest


def load_summaries(network_dir, *, summarize: bool = True,
                   notify: Notify = _stderr) -> dict[str, dict]:
    """``{mode_dir_name: summary}`` for the mode folders under ``network_dir``.

    With ``summarize`` (the default), a folder with device logs and no summary, or a summary
    older than its logs, is summarised first. Corrupt summaries or logs raise ``LogError``.
    """
    network_dir = Path(network_dir)
    if not network_dir.is_dir():
        raise LogError(f"{network_dir}: network folder not found")
    summaries = {}
    for mode_dir in sorted((p for p in network_dir.iterdir() if p.is_dir()),
                           key=lambda p: mode_sort_key(p.name)):
        if mode_dir.name.startswith((".", "_")) or mode_dir.name == FIGURES_DIR:
            continue
        path = mode_dir / summary_name(mode_dir.name)
        has_logs = bool(find_device_dirs(mode_dir))
        if summarize and has_logs:
            if not path.exists():
                notify(f"summarising {mode_dir} (no {path.name} yet)")
                write_summary(mode_dir)
            elif path.stat().st_mtime < _newest_input(mode_dir):
                notify(f"summarising {mode_dir} again ({path.name} is older than its logs)")
                write_summary(mode_dir)
        if path.exists():
            summaries[mode_dir.name] = load_summary(path)
        elif split_mode(mode_dir.name)[0] in MODE_ORDER:
            notify(f"skipping {mode_dir}: no {path.name}"
                   + (" (run summary.py first)" if has_logs else " and no device logs"))
    return summaries


# ----------------------------------------------------------------------------- drawing

def _new_figure(show: bool, figsize) -> Figure:
    if show:
        import matplotlib.pyplot as plt
        return plt.figure(figsize=figsize)
    return Figure(figsize=figsize)


def _time_axis(max_seconds: float) -> tuple[float, str]:
    return (60.0, "Time (minutes)") if max_seconds > MINUTES_ABOVE_S else (1.0, "Time (s)")


def _standalone(summaries: dict) -> float | None:
    for mode in [modes.STANDALONE + sp.suffix for sp in modes.SPLITS]:
        if mode in summaries:
            accuracy = final_accuracy(summaries[mode])
            if accuracy is not None:
                return accuracy
    return None


def draw_accuracy(fig: Figure, summaries: dict, *, niid: bool | modes.Split, network: str,
                  notify: Notify = _stderr, zoom: bool = False) -> bool:
    """Test accuracy over time of one data split (``niid``: True for by-class, or a registry
    split); False (nothing drawn) when no mode has accuracy records. ``zoom``: the accuracy
    axis spans where the modes differ (``compare.zoomed_range``), not the original's 0-1."""
    split = niid if isinstance(niid, modes.Split) else modes.split(int(niid))
    suffix = split.suffix
    series = {}
    for base in ACCURACY_MODES:
        mode = base + suffix
        if mode not in summaries:
            continue
        found = accuracy_series(summaries[mode])
        if found is None:
            notify(f"accuracy: {mode} holds no accuracy records; left out")
        else:
            series[base] = found
    if not series:
        return False
    scale, xlabel = _time_axis(max(max(t, default=0) for t, _, _ in series.values()))
    ax = fig.add_subplot()
    for base, (times, accs, _) in series.items():
        pairs = sorted(zip(times, accs))
        ax.plot([t / scale for t, _ in pairs], [a for _, a in pairs], color=modes.colour(base),
                marker="." if len(pairs) <= 50 else None, label=mode_label(base), gid=base)
    standalone = _standalone(summaries)
    if standalone is not None:
        ax.axhline(standalone, color="k", linestyle="--", linewidth=1,
                   label=f"Standalone SGD ({standalone:.3f})")
    else:
        notify("accuracy: no standalone (local) run with accuracy; no dashed line")
    ax.set_title(f"Test accuracy ({split.label or 'i.i.d.'}) — {network}")
    ax.set_xlabel(xlabel)
    curves = [np.asarray(accs, dtype=float) for _, accs, _ in series.values()]
    span = zoomed_range(curves, curves) if zoom else None
    ax.set_ylabel("Test accuracy" + (" (axis zoomed)" if span else ""))
    ax.set_ylim(*(span or (0, 1)))
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend()
    return True


def _devices(summaries: dict) -> list[tuple[str, str]]:
    return sorted({(h, d) for s in summaries.values() for h, d, _ in device_entries(s)})


def _height(value) -> float:
    """A bar height; a missing value draws no bar (NaN) rather than a misleading zero."""
    return NAN if value is None else value


def _grouped_bars(ax, summaries: dict, devices, value) -> None:
    """One group per device, one bar per mode (absent values leave a gap)."""
    width = 0.8 / max(len(summaries), 1)
    for i, (mode, summary) in enumerate(summaries.items()):
        values = {(h, d): value(e) for h, d, e in device_entries(summary)}
        xs = [j + (i - (len(summaries) - 1) / 2) * width for j in range(len(devices))]
        ax.bar(xs, [_height(values.get(dev)) for dev in devices], width=width,
               color=modes.colour(mode),
               hatch="//" if split_mode(mode)[1] else None, label=mode_label(mode))
    ax.set_xticks(range(len(devices)), [f"{h}\n{d}" for h, d in devices])


def draw_throughput(fig: Figure, summaries: dict, *, network: str) -> bool:
    """Cluster samples/s per mode (left) and per device (right)."""
    if not summaries:
        return False
    names = list(summaries)
    total_ax, device_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    totals = [_height(cluster_totals(summaries[m]).get("throughput")) for m in names]
    total_ax.bar(range(len(names)), totals,
                 color=[modes.colour(m, "0.5") for m in names])
    total_ax.set_xticks(range(len(names)), [mode_label(m) for m in names], rotation=30,
                        ha="right")
    total_ax.set_ylabel("Data throughput (samples/s)")
    total_ax.set_title("Cluster total")
    _grouped_bars(device_ax, summaries, _devices(summaries), lambda e: e.get("throughput"))
    device_ax.set_title("Per device")
    device_ax.legend(fontsize="small")
    fig.suptitle(f"Data throughput — {network}")
    return True


@dataclass(frozen=True)
class ModelSize:
    """The bytes one copy of the trainable parameters takes, and where that figure came from."""
    bytes: int
    source: str          # "lenet from the model zoo" / "given with --model-mb"


def model_size_from_zoo(network: str) -> ModelSize | None:
    """Trainable parameters of ``network`` as built by ``esync.worker.models`` (float32), or None."""
    from esync.worker import models             # MXNet: only when a figure needs it
    if network not in models.NETWORKS:
        return None
    import mxnet as mx
    net = models.build(network, mx.cpu(), hybridize=False)
    trainable, _ = models.trainable_and_aux(net)
    return ModelSize(sum(int(p.data().size) * 4 for p in trainable),
                     f"{network} from the model zoo")


def estimated_traffic(summary: dict, mode: str, model: ModelSize) -> float | None:
    """Bytes/s if every worker pushed and pulled the model once per logged round.

    What each mode moves per round (the original's code): sync and async push a gradient and
    pull the weights every iteration, ESync pushes its delta and pulls the model once per round;
    standalone SGD moves nothing.
    """
    if modes.family(mode) == modes.STANDALONE:
        return 0.0
    wall = cluster_totals(summary).get("wall_time")
    rounds = sum(len(e.get("num_samples_list") or []) for _, _, e in device_entries(summary))
    return 2 * model.bytes * rounds / wall if wall else None


def draw_traffic(fig: Figure, summaries: dict, *, network: str, notify: Notify = _stderr,
                 model: ModelSize | None = None) -> bool:
    """Bytes pushed + pulled per second per mode, as counted in the logs.

    Logs without byte counts (the original's) get an estimate from ``model`` (hatched bars and
    a note on the figure); without ``model`` they are left out.
    """
    values, estimated = {}, set()
    for mode, summary in summaries.items():
        traffic = cluster_totals(summary).get("traffic_bytes_per_s")
        if traffic is None and model is not None:
            traffic = estimated_traffic(summary, mode, model)
            estimated.add(mode)
        if traffic is None:
            notify(f"traffic: {mode} logs no byte counts; left out (give the model size "
                   "with --model-mb to estimate it)")
        else:
            values[mode] = traffic / 1e6
    if not values:
        return False
    ax = fig.add_subplot()
    bars = ax.bar(range(len(values)), list(values.values()),
                  color=[modes.colour(m, "0.5") for m in values],
                  hatch=["//" if m in estimated else None for m in values])
    ax.bar_label(bars, fmt="%.2f")
    ax.margins(y=0.1)
    ax.set_xticks(range(len(values)), [mode_label(m) for m in values], rotation=20, ha="right")
    ax.set_ylabel("Traffic load (MB/s, pushed + pulled)")
    ax.set_title(f"Traffic load — {network}")
    if estimated & set(values):
        note = (f"Hatched: estimated, the logs count no bytes. One push and one pull of the "
                f"model ({model.bytes / 1e6:.3g} MB, {model.source}) per worker and round.")
        fig.text(0.01, 0.005, note, fontsize="x-small", wrap=True, gid="traffic-estimate-note")
        notify(f"traffic: estimated for {', '.join(sorted(estimated & set(values)))} "
               f"from the model size ({model.source})")
    return True


def draw_computing_ratio(fig: Figure, summaries: dict, *, network: str,
                         notify: Notify = _stderr) -> bool:
    """Computing time / wall time per device (groups) and mode (bars)."""
    kept = {}
    for mode, summary in summaries.items():
        if any(e.get("computing_time_ratio") is not None for _, _, e in device_entries(summary)):
            kept[mode] = summary
        else:
            notify(f"computing-time ratio: {mode} has none (summary from the original's "
                   "summary.py? summarise the logs again); left out")
    summaries = kept
    devices = _devices(summaries)
    if not devices:
        return False
    ax = fig.add_subplot()
    _grouped_bars(ax, summaries, devices, lambda e: e.get("computing_time_ratio"))
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("Computing-time ratio")
    ax.set_title(f"Computing-time ratio — {network}")
    ax.legend(fontsize="small")
    return True


def _save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.svg"]
    fig.tight_layout()
    # Text as text in the SVG (not glyph paths): searchable and checkable by the tests.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        for path in paths:
            fig.savefig(path, dpi=120)
    return paths


def draw_all(summaries: dict, out_dir, *, network: str, show: bool = False,
             notify: Notify = _stderr, model: ModelSize | None = None,
             zoom: bool = False) -> list[Path]:
    """Draw the five figures that have data into ``out_dir``; return the files written.

    ``model`` sizes the traffic estimate of logs without byte counts (see ``draw_traffic``);
    ``zoom`` zooms the accuracy axes (``draw_accuracy``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = dict(sorted(summaries.items(), key=lambda kv: mode_sort_key(kv[0])))
    jobs = []
    for split in modes.SPLITS:
        of_split = {m: s for m, s in summaries.items()
                    if modes.parse_folder(m)[1] == split or split_mode(m)[0] == modes.STANDALONE}
        if split.value > 1 and len(of_split) == len(
                [m for m in summaries if split_mode(m)[0] == modes.STANDALONE]):
            continue              # a newer split nobody ran: no notice about a missing figure
        jobs.append((f"accuracy{split.suffix or '-iid'}", (6.4, 4.8),
                     lambda fig, of_split=of_split, split=split: draw_accuracy(
                         fig, of_split, niid=split, network=network, notify=notify,
                         zoom=zoom)))
    jobs += [
        ("data-throughput", (11, 4.8),
         lambda fig: draw_throughput(fig, summaries, network=network)),
        ("traffic-load", (6.4, 4.8),
         lambda fig: draw_traffic(fig, summaries, network=network, notify=notify,
                                 model=model)),
        ("computing-time-ratio", (8, 4.8),
         lambda fig: draw_computing_ratio(fig, summaries, network=network, notify=notify)),
    ]
    written = []
    for name, figsize, draw in jobs:
        fig = _new_figure(show, figsize)
        if draw(fig):
            written += _save(fig, out_dir, f"{network}-{name}")
        else:
            notify(f"{name}: no data; figure skipped")
            if show:
                import matplotlib.pyplot as plt
                plt.close(fig)
    if show:
        import matplotlib.pyplot as plt
        plt.show()
    return written


# ----------------------------------------------------------------------------- command line

_target = bounded_number(float, low=0, strict=True, high=1, must="in (0, 1]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drawer.py",
        description="Draw the comparison figures and the speedup table from "
                    "<base>/<network>/<mode>/<Name>.json (summarising logs that have no summary).",
        formatter_class=HelpFormatter)
    parser.add_argument("-b", "--base-dir", nargs="+", default=["logs"],
                        help="log folder(s); several = repeated runs of the same layout "
                             "(figures from the first, table over all)")
    parser.add_argument("-n", "--network", required=True, help="network folder, e.g. resnet18-v1")
    parser.add_argument("-o", "--out", default=None,
                        help="output folder (default: <first base>/<network>/figures)")
    parser.add_argument("--show", action="store_true", help="also open the figures in windows")
    parser.add_argument("--target", type=_target, default=0.8,
                        help="test accuracy whose time to reach gives the speedup")
    parser.add_argument("--zoom-accuracy", action="store_true",
                        help="accuracy axes zoomed to where the modes differ (default: 0-1, "
                             "as the original's figures)")
    parser.add_argument("--model-mb", type=_model_mb, default=None,
                        help="size of the model in MB (10^6 bytes), for the traffic estimate of "
                             "logs that count no bytes (the original's); default: the size of "
                             "-n's network as esync builds it")
    return parser


_model_mb = bounded_number(float, low=0, strict=True, must="a positive number of megabytes")


def model_size_for(summaries: dict, network: str, model_mb: float | None,
                   notify: Notify = _stderr) -> ModelSize | None:
    """The model size the traffic figure needs: only when some log counts no bytes."""
    if all(cluster_totals(s).get("traffic_bytes_per_s") is not None for s in summaries.values()):
        return None
    if model_mb is not None:
        return ModelSize(round(model_mb * 1e6), "given with --model-mb")
    size = model_size_from_zoo(network)
    if size is None:
        notify(f"traffic: {network!r} is not a network esync knows; give its size with "
               "--model-mb to estimate the traffic of logs without byte counts")
    return size


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.show:
        matplotlib.use("Agg")
    roots = [Path(b) for b in args.base_dir]
    out_dir = Path(args.out) if args.out else roots[0] / args.network / FIGURES_DIR
    try:
        runs = [load_summaries(root / args.network) for root in roots]
        if not runs[0]:
            raise LogError(f"{roots[0] / args.network}: no summaries or device logs of any mode")
        if len(roots) > 1:
            _stderr(f"figures from {roots[0]}; table over {len(roots)} log roots")
        model = model_size_for(runs[0], args.network, args.model_mb)
        written = draw_all(runs[0], out_dir, network=args.network, show=args.show, model=model,
                           zoom=args.zoom_accuracy)
        written += write_table(speedup_table(runs, target=args.target), out_dir,
                               network=args.network, target=args.target)
    except (LogError, OSError) as exc:
        print(f"drawer: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"drawer: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
