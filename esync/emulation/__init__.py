"""The emulation world: how one machine stands in for a heterogeneous cluster.

- ``cgroups.py``: CPU caps (a xF device computes with S/F of a core), their speed changes and
  their cleanup (``python -m esync.emulation.cgroups check|list|clean``);
- ``namespaces.py``: emulated hosts, a network namespace each on one bridge, tc-shaped links
  (``python -m esync.emulation.namespaces list|clean``); ``hosts.py``: which worker runs on
  which host, each host's rate (the ``--net netns`` flags);
- ``schedules.py``: speed schedules (``--speed-schedule``), read by the launcher and by a
  worker that emulates by sleeping;
- ``standalone_cap.py``: which emulation the benchmark's runs used, and one device alone
  under the x1 device's cap; ``shaping.py``: the shaped-link rate matched to this machine.

Plain Python over the kernel's interfaces: nothing here imports MXNet or a world above
``common``; the launcher and the benchmark use it, and the worker reads its schedules.
"""
