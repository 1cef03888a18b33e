"""Check that this machine's GPUs can train with the installed (or a chosen) MXNet wheel.

Usage, from the repository root:

    python scripts/gpu_check.py                  # the installed wheel against this machine's GPUs
    python scripts/gpu_check.py --wheel cu112    # a wheel not installed (what setup.sh --gpu runs)
    python scripts/gpu_check.py --smoke          # also: a computation on each GPU, each seen
                                                 # alone as gpu(0), and a CPU process seeing none
    python scripts/gpu_check.py --smoke --cluster  # also: a 30 s esync-cluster on gpu0(,gpu1),cpu
    python scripts/gpu_check.py --installed      # print the installed MXNet (setup.sh's stamp)

``ESYNC_GPU_CAPABILITIES=8.6,9.0`` describes the GPUs instead of asking the driver and MXNet (two
GPUs of those compute capabilities; empty: none). Exits 1 with what to do when a check fails.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from esync.launch import gpus  # noqa: E402

# One GPU alone, as gpu(0): a product MXNet must compute there (64 x 64 ones: each entry 64).
ON_ONE_GPU = ("import mxnet as mx; a = mx.nd.ones((64, 64), ctx=mx.gpu(0)); "
              "print(mx.context.num_gpus(), mx.nd.dot(a, a).sum().asscalar())")
WITHOUT_GPU = "import mxnet as mx; print(mx.context.num_gpus())"


def mxnet_gpu_count() -> int | None:
    """What ``mx.context.num_gpus()`` says here (None: MXNet does not load)."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_GPU], capture_output=True, text=True,
                          timeout=300)
    return int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout.split() else None


def wheel_problems(flavour: str) -> list[str]:
    """The install's checks: the GPUs against the wheel, and MXNet's count against the driver's."""
    capabilities = gpus.gpu_capabilities()
    if not gpus.wheel(flavour).cuda:
        return []
    described = gpus.CAPABILITIES_ENV in os.environ
    counted = len(capabilities) if described else mxnet_gpu_count()
    problems = gpus.check_gpus(flavour, capabilities, counted)
    if counted is None:
        problems.append(f"MXNet does not load ({gpus.wheel(flavour).package} needs the NVIDIA "
                        "driver's libcuda.so.1 and libquadmath0); see `python -c 'import mxnet'`")
    for index, (major, minor) in enumerate(capabilities):
        print(f"gpu_check: GPU {index}: compute capability {major}.{minor}")
    return problems


def smoke_problems(count: int) -> list[str]:
    """Each GPU computes when it is the only one visible; a process with none visible sees 0."""
    problems = []
    for index in range(count):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
        done = subprocess.run([sys.executable, "-c", ON_ONE_GPU], env=env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0 or done.stdout.split() != ["1", str(64.0 ** 3)]:
            problems.append(f"GPU {index} alone (CUDA_VISIBLE_DEVICES={index}) did not compute "
                            f"as gpu(0): {(done.stdout + done.stderr).strip()[-400:]}")
    done = subprocess.run([sys.executable, "-c", WITHOUT_GPU], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    if done.stdout.split()[-1:] != ["0"]:
        problems.append(f"a process with CUDA_VISIBLE_DEVICES='' sees GPUs: {done.stdout!r}")
    return problems


def cluster_problems(count: int) -> list[str]:
    """A short real-device job: each GPU worker on its GPU, the CPU worker uncapped."""
    devices = ",".join([f"gpu{i}" for i in range(min(count, 2))] + ["cpu"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, str(REPO / "scripts" / "prepare_data.py"),
                        "--data-dir", str(data), "--quiet"], check=True, timeout=600)
        done = subprocess.run([sys.executable, "-m", "esync.launch", "--workers",
                               str(devices.count(",") + 1), "--devices", devices,
                               "--slowdown", "1", "--max-seconds", "30", "-ld", tmp, "-dd",
                               str(data), "--quiet"], cwd=REPO, capture_output=True, text=True,
                              timeout=900)
        if done.returncode != 0:
            return [f"esync-cluster --devices {devices} failed: {done.stderr.strip()[-800:]}"]
        placement = json.loads(next(Path(tmp).rglob("cluster.json")).read_text())["placement"]
        print("gpu_check: cluster placement: " + "; ".join(
            f"{p['device']} CUDA_VISIBLE_DEVICES={p['cuda_visible_devices']!r} "
            f"threads={p['threads']} cap={p['cpu_cores']}" for p in placement))
    return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", choices=tuple(gpus.WHEELS), default=None,
                        help="the MXNet wheel to check for (default: the installed one)")
    parser.add_argument("--installed", action="store_true",
                        help="print the installed MXNet package and version, and stop")
    parser.add_argument("--smoke", action="store_true", help="also compute on every GPU")
    parser.add_argument("--cluster", action="store_true",
                        help="with --smoke: also run a 30 s esync-cluster on the GPUs and a CPU")
    args = parser.parse_args(argv)
    if args.installed:
        print(gpus.installed_requirement() or "none")
        return 0
    flavour = args.wheel or gpus.installed_flavour() or "cpu"
    problems = wheel_problems(flavour)
    count = len(gpus.gpu_capabilities())
    if args.smoke and not problems:
        problems += smoke_problems(count)
        if args.cluster and not problems:
            problems += cluster_problems(count)
    for problem in problems:
        print(f"gpu_check: {problem}", file=sys.stderr)
    if not problems:
        print(f"gpu_check: {gpus.wheel(flavour).package} {gpus.MXNET_VERSION} runs on this "
              f"machine's {count} GPU(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
