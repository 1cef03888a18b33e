"""The benchmark on the user's own machines: ``--backend ssh --hostfile H`` or ``--backend slurm``.

    esync-benchmark --backend ssh --hostfile hosts.txt --out /shared/bench -dd /shared/data
    esync-benchmark --backend slurm --nodes 2 --node-devices gpu0,gpu1 --out /shared/bench

The same rows, tuning, repeats and report as on the emulated box, with nothing emulated: no CPU
caps, no slow-down, no network namespaces, so every device runs as it is. Every cluster run goes
through the launcher with the backend's own flags (``esync-cluster --backend ssh --hostfile H``),
which places the workers, one per device of the host file or of each node. One device alone
(``main.py -m local``) runs on the host of the fastest device, over ssh (``ssh -tt``: the remote
run ends when the connection does) or as a Slurm step (``srun``).

Before the first run, every device's speed is measured alone: one short standalone run per
device (``--probe-seconds`` of training), whose median iteration time the report lists. The
ratios of these times to the fastest device's are the cluster's measured slow-downs, in the
report's heading and in the physical limit (what the devices could process together).

Checks before anything starts, each refused with its fix: the launcher's own (its parser and
its backend's launch: the host file's syntax, every host reached over ssh, the shared log folder,
the data, the repository and the Python there; Slurm's options), Slurm answering at all, every
``gpuN`` of the host file present on its host, and no option that only the emulation has.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from esync.common.argtypes import positive_float
from esync.common.errors import UsageError

BACKENDS = ("local", "ssh", "slurm")
EMULATED = "local"
DEFAULT_PROBE_SECONDS = 5.0
PROBES_DIR = "probes"
SETTING_NAME = "machines"
ANY_NODE = "a Slurm node"
SINFO_TIMEOUT_S = 30.0    # a controller that does not answer sinfo in this time is taken as down

# Options that only the emulation has (dest -> what it emulates), refused with a real backend;
# --net and --emulation only when given a value other than what a real backend does anyway.
EMULATION_ONLY = {
    "testbed": "a named emulated cluster", "gap_sweep": "a sweep of emulated slow-downs",
    "workers": "the number of emulated devices (the host file, or --nodes and --node-devices, "
               "place the workers)",
    "slowdown": "emulated slow-downs (real devices run at their own speed)",
    "bandwidth": "a shaped link rate", "server_bandwidth": "a shaped link rate",
    "hosts": "emulated hosts", "cpu_share": "a CPU cap", "no_cpu_pinning": "CPU caps' pinning",
    "shift_at": "the shifting scenario (an emulated device slowing down)",
}
REAL_VALUES = {"net": "loopback", "emulation": "auto", "scenarios": "static"}
NOT_EMULATED = {"net": "emulated links (network namespaces)",
                "emulation": "emulated slow devices",
                "scenarios": "the shifting scenario (an emulated device slowing down)"}
ONLY_EMULATED = "only on the emulated cluster (--backend local)"


def add_arguments(parser) -> None:
    """``--backend`` and the launcher's own flags of the ssh and Slurm backends (one owner:
    ``esync.launch.backends.ssh``/``slurm``), passed on to every cluster run."""
    from esync.launch.backends import slurm, ssh
    g = parser.add_argument_group("your own machines (esync-cluster --backend ssh or slurm)")
    g.add_argument("--backend", choices=BACKENDS, default=EMULATED,
                   help="local: the emulated cluster on this machine; ssh: the hosts of "
                        "--hostfile; slurm: Slurm jobs of --nodes nodes with --node-devices "
                        "each. ssh and slurm run every device as it is (no CPU caps, "
                        "slow-downs or shaped links) and measure each device alone first")
    g.add_argument("--probe-seconds", type=positive_float, default=DEFAULT_PROBE_SECONDS,
                   help="training seconds of the standalone run that measures each device's "
                        "iteration time before the benchmark (ssh and slurm)")
    ssh.add_arguments(parser)
    slurm.add_arguments(parser)


def _backend_parser(name: str) -> argparse.ArgumentParser:
    """A parser holding only backend `name`'s launcher flags (to spell them out again)."""
    from esync.launch.remote import BACKENDS as LAUNCHER_BACKENDS
    parser = argparse.ArgumentParser(add_help=False)
    LAUNCHER_BACKENDS[name].add_arguments(parser)
    return parser


def backend_argv(args) -> list[str]:
    """``--backend B`` and every flag of B's that differs from its default, as given."""
    argv = ["--backend", args.backend]
    for action in _backend_parser(args.backend)._actions:
        value = getattr(args, action.dest)
        if value == action.default or value is None:
            continue
        flag = next(f for f in action.option_strings if f.startswith("--"))
        for item in value if isinstance(value, list) else [value]:
            argv += [flag, str(item)]
    return argv


# The emulation's options canonical_command spells out (flag -> takes a value): on real machines
# they are left out of it, as they would be refused.
EMULATION_FLAGS = {"--workers": True, "--slowdown": True, "--net": True, "--bandwidth": True,
                   "--server-bandwidth": True, "--hosts": True, "--scenarios": True,
                   "--shift-at": True, "--emulation": True, "--cpu-share": True,
                   "--no-cpu-pinning": False}


def canonical_argv(args, argv: list[str]) -> list[str]:
    """The benchmark's command spelled out (``options.canonical_command``): on real machines
    without the emulation's options, with the backend's flags and --probe-seconds."""
    machines = getattr(args, "machines", None)
    if machines is None:
        return argv
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in EMULATION_FLAGS:
            skip = EMULATION_FLAGS[item]
        else:
            kept.append(item)
    return [*kept, *machines.launcher, "--probe-seconds", f"{args.probe_seconds:g}"]


@dataclass(frozen=True)
class PlacedDevice:
    """One worker's device: where it is and what the launcher names it."""
    host: str          # the host file's address; under Slurm the node (node0, node1, ...)
    target: str        # what ssh gets (user@address); under Slurm ANY_NODE
    device: str        # cpu or gpuN, as given
    worker: str        # the launcher's worker name (cpu0, cpu1, gpu0): the summary's device
    threads: int       # OMP_NUM_THREADS the launcher gives this worker

    @property
    def key(self) -> tuple[str, str]:
        """Workers on one device of one host share its probe (under Slurm, of any node: the
        nodes are Slurm's choice, and taken to be alike)."""
        return self.target, self.device

    @property
    def label(self) -> str:
        return f"{self.device} on {self.target if self.target == ANY_NODE else self.host}"


@dataclass
class Machines:
    """The resolved real cluster: its devices in worker order and how to reach them."""
    backend: str
    devices: list[PlacedDevice]
    launcher: list[str]                 # the backend's flags for every cluster run
    ssh_base: list[str] = field(default_factory=list)
    python: str = sys.executable
    repo: str = ""
    slurm_options: list[str] = field(default_factory=list)
    gpu_request: str = "gpus-per-node"      # Slurm: how a step asks for its GPU
    probes: dict = field(default_factory=dict)     # device key -> probe result
    fastest: PlacedDevice | None = None

    @property
    def distinct(self) -> list[PlacedDevice]:
        """One device per (host, device): the probes' list."""
        return list({d.key: d for d in reversed(self.devices)}.values())[::-1]

    def iteration_s(self, device: PlacedDevice) -> float | None:
        return (self.probes.get(device.key) or {}).get("iteration_s")

    def slowdowns(self) -> list[float]:
        """Each worker's iteration time over the fastest device's (1 where not measured)."""
        times = [self.iteration_s(d) for d in self.devices]
        known = [t for t in times if t]
        if not known:
            return [1.0] * len(self.devices)
        return [round(t / min(known), 3) if t else 1.0 for t in times]

    @property
    def setting_label(self) -> str:
        """The label of the one setting on real machines (``SETTING_NAME``)."""
        return f"the machines' own network (--backend {self.backend}, nothing emulated)"

    def standalone_device(self) -> PlacedDevice:
        return self.fastest or self.devices[0]

    # -- running main.py on a device -----------------------------------------------------------
    def on_device(self, device: PlacedDevice, argv: list[str]) -> tuple[list[str], list[str]]:
        """(prefix, argv) that run this machine's ``main.py`` command `argv` on `device`, with
        the launcher's thread count and GPU visibility for it."""
        from esync.common.procs import python_env
        from esync.launch.resources import visible_devices
        gpu = device.device != "cpu"
        argv = list(argv)
        argv[0] = self.python
        argv[1] = str(Path(self.repo) / "main.py")
        if "-c" in argv:
            at = argv.index("-c")
            argv[at:at + 2] = ["-c", "0", "-g", "0"] if gpu else ["-c", "1"]
        env = {**python_env(), "OMP_NUM_THREADS": str(device.threads),
               "MXNET_CPU_WORKER_NTHREADS": str(device.threads),
               "CUDA_VISIBLE_DEVICES": visible_devices(device.device)}
        if self.backend == "ssh":
            # -tt: the remote run gets a terminal, which hangs up (SIGHUP) when the connection
            # closes, so stopping the benchmark's run stops the remote one.
            ssh = ["-tt" if a == "-T" else a for a in self.ssh_base]
            remote = (f"cd {shlex.quote(self.repo)} && exec env "
                      + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
            return [*ssh, device.target, remote], [shlex.quote(a) for a in argv]
        # Slurm sets a GPU step's CUDA_VISIBLE_DEVICES to the GPU it allocates.
        exports = ",".join(["ALL", *(f"{k}={v}" for k, v in env.items()
                                     if not (gpu and k == "CUDA_VISIBLE_DEVICES"))])
        one_gpu = "--gres=gpu:1" if self.gpu_request == "gres" else "--gpus-per-node=1"
        srun = ["srun", "--nodes", "1", "--ntasks", "1", "--cpus-per-task", str(device.threads),
                "--job-name", "esync-benchmark", f"--export={exports}", *self.slurm_options,
                *([one_gpu] if gpu else [])]
        return srun, argv

    def as_json(self) -> dict:
        return {"backend": self.backend, "launcher_argv": self.launcher,
                "devices": [{"worker": d.worker, "host": d.host, "device": d.device,
                             "threads": d.threads, "probe": self.probes.get(d.key)}
                            for d in self.devices],
                "standalone_device": None if self.fastest is None else
                {"host": self.fastest.host, "device": self.fastest.device}}


# ----------------------------------------------------------------------------- the checks

def refuse_emulation_options(args, given: dict) -> None:
    """Options of the emulation alone make no sense on real devices: refused, naming the fix."""
    where = f"with --backend {args.backend} every device runs as it is"
    for dest, what in EMULATION_ONLY.items():
        if dest in given:
            flag = "--" + dest.replace("_", "-")
            raise UsageError(f"argument {flag}: {what}, {ONLY_EMULATED}; {where}: leave "
                             f"{flag} out")
    for dest, real in REAL_VALUES.items():
        if dest in given and given[dest] != real:
            flag = "--" + dest
            raise UsageError(f"argument {flag} {given[dest]}: {NOT_EMULATED[dest]}, "
                             f"{ONLY_EMULATED}; {where}: leave {flag} out (or give {flag} "
                             f"{real})")


def check_backend(args, parser, argv) -> None:
    """First of all: the backend's flags belong to the backend given (the launcher's rule),
    and no option of the emulation comes with a real backend."""
    from esync.common.presets import given_options
    from esync.launch.remote import placed_devices
    args.machines = None
    given = given_options(parser, argv)
    if args.backend != EMULATED:
        refuse_emulation_options(args, given)
    placed_devices(args, list(map(str, argv)))
    # The runs start from the repository: the files the user named, wherever they were
    for dest in ("hostfile", "ssh_config"):
        if getattr(args, dest):
            setattr(args, dest, str(Path(getattr(args, dest)).resolve()))


def resolve(args) -> None:
    """``args.machines`` (None on the emulated box): the real cluster, checked before anything
    starts (``check_backend`` ran first). The emulation's settings become those of real
    devices: one setting (the machines' own network), the static scenario, no emulation
    flags."""
    if args.backend == EMULATED:
        return
    if args.backend == "slurm":
        check_slurm_answers()
    args.machines = machines_of(args)
    args.workers = len(args.machines.devices)
    args.slowdowns = [1.0] * args.workers
    args.net, args.net_list, args.net_notice = "loopback", ["loopback"], None
    args.scenario_list, args.scenarios, args.scenario_notice = ["static"], "static", None
    args.emulation_argv = []


def check_slurm_answers() -> None:
    """Slurm's controller answers (``sinfo``): else nothing could ever be submitted."""
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                              timeout=SINFO_TIMEOUT_S)
    except FileNotFoundError:
        raise UsageError("--backend slurm: no sinfo here: run the benchmark on a machine that "
                         "submits Slurm jobs (a login node)") from None
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", f"no answer in {SINFO_TIMEOUT_S:g} s")
    if done.returncode != 0:
        why = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
        raise UsageError(f"--backend slurm: Slurm does not answer ({why}): "
                         "check SLURM_CONF and that slurmctld runs (sinfo must work here)")


def _checked_folder(out: Path) -> Path:
    """The report folder, or the nearest folder above it that exists (nothing is created
    before the benchmark starts): the hosts must see it as this machine does."""
    folder = out.resolve()
    while not folder.exists():
        folder = folder.parent
    return folder


def machines_of(args) -> Machines:
    """Parse one of the benchmark's cluster commands with the launcher's parser and make its
    launch (nothing starts): the launcher's checks of the flags and the hosts, its placement,
    its names and its thread counts. Then every gpuN exists on its host (ssh)."""
    from esync.launch import build_parser as launcher_parser
    from esync.launch.flags import parse
    from esync.launch.remote import make_launch
    from esync.launch.roles import device_names
    flags = backend_argv(args)
    argv = ["-m", "sync", *flags, "-n", args.network, "-b", str(args.batch_size),
            "-ld", str(_checked_folder(Path(args.out or "."))), "-dd", str(args.data_dir),
            "--max-seconds", "1", "--quiet"]
    parser = launcher_parser()
    with contextlib.redirect_stderr(io.StringIO()):   # its notes belong in each run's log
        job = make_launch(parse(parser, argv), parser)
    threads = job.worker_threads()
    names = device_names(job.devices)
    if args.backend == "ssh":
        targets = {line.address: line.target for line in job.lines}
        devices = [PlacedDevice(host.name, targets[host.name], device, name, count)
                   for host, device, name, count in zip(job.hosts.workers, job.devices, names,
                                                        threads)]
        found = Machines("ssh", devices, flags, ssh_base=list(job.ssh.base),
                         python=job.python, repo=job.repo)
        check_gpus(found, job.ssh)
        return found
    from esync.launch.roles import REPO
    devices = [PlacedDevice(host.name, ANY_NODE, device, name, count)
               for host, device, name, count in zip(job.hosts.workers, job.devices, names,
                                                    threads)]
    return Machines("slurm", devices, flags, repo=str(REPO), slurm_options=srun_options(job),
                    gpu_request=job.options["gpu_request"])


def srun_options(job) -> list[str]:
    """The Slurm launch's own options (partition, time limit, --slurm-option KEY=VALUE as it
    parsed them) for the steps of one device alone; a GPU step asks for one GPU as the launch
    asks for its GPUs (``--gpu-request``)."""
    given = job.options
    options = [f"--partition={given['partition']}"] if given["partition"] else []
    options += [f"--time={given['minutes']}"]
    options += [f"--{key}={value}" for key, value in given["extra"].items()]
    return options


GPU_COUNT = ("from esync.launch.gpus import gpu_capabilities; "
             "print(len(gpu_capabilities()))")


def check_gpus(machines: Machines, ssh) -> None:
    """Every gpuN of the host file exists on its host (the CUDA driver's count there)."""
    wanted: dict[str, list[PlacedDevice]] = {}
    for d in machines.devices:
        if d.device != "cpu":
            wanted.setdefault(d.target, []).append(d)
    for target, devices in wanted.items():
        done = ssh.run(target, f"cd {shlex.quote(machines.repo)} && "
                               f"{shlex.quote(machines.python)} -c {shlex.quote(GPU_COUNT)}")
        text = done.stdout.strip().splitlines()
        count = int(text[-1]) if done.returncode == 0 and text and text[-1].isdigit() else None
        if count is None:
            why = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
            raise UsageError(f"host {target}: cannot count its GPUs ({why})")
        missing = sorted({d.device for d in devices if int(d.device[3:]) >= count})
        if missing:
            have = f"gpu0 to gpu{count - 1}" if count > 1 else "gpu0" if count else "no GPU"
            raise UsageError(f"--hostfile: host {devices[0].host} has {count} GPU(s) ({have}), "
                             f"not {', '.join(missing)}: fix its line of the host file (use "
                             "the GPUs it has, or cpu)")


# ----------------------------------------------------------------------------- the report

def plan_lines(machines: Machines) -> list[str]:
    """The devices, for the plan printed at the start."""
    hosts = list(dict.fromkeys(d.host for d in machines.devices))
    return [f"machines: {len(machines.devices)} device(s) on {len(hosts)} host(s) "
            f"({', '.join(d.worker + ': ' + d.label for d in machines.devices)}), nothing "
            f"emulated; each device alone first ({len(machines.distinct)} probe(s))"]


def cluster_lines(args) -> list[str]:
    """The report's cluster: the backend, each worker's host and device, its threads and its
    iteration time alone (the probe), and where one device alone ran."""
    m = args.machines
    hosts = list(dict.fromkeys(d.host for d in m.devices))
    L = [f"- {len(m.devices)} real devices on {len(hosts)} host(s) ({', '.join(hosts)}), "
         f"one worker each, through `esync-cluster {shlex.join(m.launcher)}`; nothing "
         "emulated: no CPU caps, slow-downs or shaped links, every device as it is",
         "- each device alone first: a standalone run of "
         f"{args.probe_seconds:g} s of training (`main.py -m local`) per device; its median "
         "iteration time (the first left out) below, and relative to the fastest device "
         "(the cluster's measured slow-downs, also used for the physical limit)", "",
         "| Worker | Host | Device | Threads | Iteration alone (ms) | Relative |",
         "| --- | --- | --- | ---: | ---: | ---: |"]
    for d, factor in zip(m.devices, m.slowdowns()):
        seconds = m.iteration_s(d)
        L.append(f"| {d.worker} | {d.host} | {d.device} | {d.threads} | "
                 + (f"{seconds * 1e3:.1f} | ×{factor:g} |" if seconds else "not measured | – |"))
    device = m.standalone_device()
    L += ["", f"- one device alone (`local`) ran on {device.label}"
          + (", the fastest measured," if m.fastest else "")
          + (" over ssh" if m.backend == "ssh" else " as a Slurm step (srun)")]
    return L
