"""The GPUs of a machine and the MXNet wheel that must run on them (no MXNet import here).

    bash scripts/setup.sh --gpu cu112      # the CUDA 11.2 wheel instead of the CPU one
    python scripts/gpu_check.py            # on a machine with GPUs: every check below

MXNet 1.9.1 publishes one wheel per CUDA version (``WHEELS``). Each holds kernels for a list
of GPU architectures and no PTX (its build's ``MXNET_CUDA_ARCH``,
``config/distribution/linux_cu*.cmake``), so it runs on a GPU only when the list holds an
architecture of the GPU's major version at or below its minor one (a kernel for sm_80 runs on
sm_86, none runs on sm_90). ``check_gpus`` says, for each GPU, whether the wheel can run there
and what to do if not.

The GPUs are read from the CUDA driver (``libcuda``), or from ``ESYNC_GPU_CAPABILITIES`` when
that is set: ``"8.6,9.0"`` stands for two GPUs of those compute capabilities, ``""`` for none
(the seam the tests use, and a way to check a wheel for a machine one is not on).
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
from dataclasses import dataclass

CAPABILITIES_ENV = "ESYNC_GPU_CAPABILITIES"
MXNET_VERSION = "1.9.1"


@dataclass(frozen=True)
class Wheel:
    """One MXNet wheel: its package, CUDA version, architectures (major, minor) and the image
    a container loads it in (its CUDA runtime and cuDNN 8 on an Ubuntu that has Python 3.11
    from the deadsnakes archive; "": none known, build an image of your own)."""
    package: str
    cuda: str
    architectures: tuple[tuple[int, int], ...]
    image: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={MXNET_VERSION}"


def _archs(text: str) -> tuple[tuple[int, int], ...]:
    return tuple(tuple(int(p) for p in a.split(".")) for a in text.split(";"))


# The flavours of MXNet 1.9.1 on PyPI that its release built (tools/pip/setup.py), with the
# architectures of each build's config/distribution/linux_<flavour>.cmake.
WHEELS = {
    "cpu": Wheel("mxnet", "", (), "python:3.11-slim"),
    "cu112": Wheel("mxnet-cu112", "11.2", _archs("5.0;6.0;7.0;8.0;8.6"),
                   "nvidia/cuda:11.2.2-cudnn8-runtime-ubuntu20.04"),
    "cu110": Wheel("mxnet-cu110", "11.0", _archs("5.0;6.0;7.0;8.0"),
                   "nvidia/cuda:11.0.3-cudnn8-runtime-ubuntu20.04"),
    "cu102": Wheel("mxnet-cu102", "10.2", _archs("3.0;5.0;6.0;7.0;7.5"), ""),
    "cu101": Wheel("mxnet-cu101", "10.1", _archs("3.0;5.0;6.0;7.0;7.5"), ""),
}
GPU_FLAVOUR = "cu112"       # the default CUDA wheel (--gpu without a flavour, Kubernetes GPUs)


def wheel(flavour: str) -> Wheel:
    """The wheel of `flavour`, or a ValueError listing the flavours."""
    if flavour not in WHEELS:
        raise ValueError(f"no MXNet {MXNET_VERSION} wheel {flavour!r}; choose one of "
                         f"{', '.join(WHEELS)}")
    return WHEELS[flavour]


def runs_on(capability: tuple[int, int], architectures) -> bool:
    """Whether kernels built for `architectures` (no PTX) run on a GPU of `capability`."""
    major, minor = capability
    return any(a == major and b <= minor for a, b in architectures)


def check_gpus(flavour: str, capabilities, mxnet_gpus: int | None = None) -> list[str]:
    """What stands in the way of training on these GPUs with `flavour`'s wheel (empty: none).

    ``capabilities`` are the driver's GPUs (major, minor); ``mxnet_gpus`` is what
    ``mx.context.num_gpus()`` said (None: not asked)."""
    chosen = wheel(flavour)
    problems = []
    if not chosen.cuda:
        return problems
    if not capabilities:
        problems.append(f"no GPU found (driver, or {CAPABILITIES_ENV}): the {chosen.package} "
                        "wheel needs one; on a machine without GPUs use the CPU wheel "
                        "(bash scripts/setup.sh --cpu)")
    for index, capability in enumerate(capabilities):
        if runs_on(capability, chosen.architectures):
            continue
        archs = ", ".join(f"{a}.{b}" for a, b in chosen.architectures)
        others = [f for f, w in WHEELS.items() if w.cuda and runs_on(capability, w.architectures)]
        problems.append(
            f"GPU {index} has compute capability {capability[0]}.{capability[1]}, which "
            f"{chosen.package} {MXNET_VERSION} has no kernels for (it is built for {archs}, "
            "without PTX): "
            + (f"use --gpu {others[0]} instead" if others else
               "no MXNet 1.9.1 wheel runs on it; build MXNet 1.9.1 from source with "
               f"MXNET_CUDA_ARCH={capability[0]}.{capability[1]} and a CUDA that knows it (11.8 "
               "knows sm_90), or "
               "train on the GPUs the wheel supports and use cpu for the others"))
    if mxnet_gpus is not None and capabilities and mxnet_gpus != len(capabilities):
        problems.append(f"MXNet sees {mxnet_gpus} GPU(s) where the driver shows "
                        f"{len(capabilities)}: is CUDA_VISIBLE_DEVICES set, or another mxnet "
                        "package installed beside this one (pip list | grep mxnet)?")
    return problems


def parse_capabilities(text: str) -> list[tuple[int, int]]:
    """``"8.6,9.0"`` -> ``[(8, 6), (9, 0)]``; ``""`` -> ``[]``."""
    try:
        return [tuple(int(p) for p in item.strip().split(".", 1)) for item in text.split(",")
                if item.strip()]
    except ValueError:
        raise ValueError(f"{CAPABILITIES_ENV}={text!r}: give compute capabilities like "
                         "8.6,9.0 (empty: no GPU)") from None


def gpu_capabilities(env=os.environ) -> list[tuple[int, int]]:
    """This machine's GPUs as the CUDA driver shows them (``CAPABILITIES_ENV`` first)."""
    if CAPABILITIES_ENV in env:
        return parse_capabilities(env[CAPABILITIES_ENV])
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []                                   # no driver: no GPU
    count, major, minor, device = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    found = []
    for index in range(count.value):
        cuda.cuDeviceGet(ctypes.byref(device), index)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)   # ..._CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)   # ..._CAPABILITY_MINOR
        found.append((major.value, minor.value))
    return found


def installed_flavour() -> str | None:
    """The flavour of the MXNet wheel installed here (None: none, or one built elsewhere)."""
    for flavour, candidate in WHEELS.items():
        try:
            importlib.metadata.version(candidate.package)
        except importlib.metadata.PackageNotFoundError:
            continue
        return flavour
    return None


def installed_requirement() -> str | None:
    """The installed MXNet wheel as ``package==version`` (None: none of ``WHEELS``)."""
    flavour = installed_flavour()
    if flavour is None:
        return None
    package = WHEELS[flavour].package
    return f"{package}=={importlib.metadata.version(package)}"


def free_gpu(used, count: int) -> int | None:
    """The lowest GPU index below `count` that no index in `used` takes, or None."""
    return next((i for i in range(count) if i not in set(used)), None)
