"""The allreduce job's rendezvous: Horovod's own Gloo rendezvous server, with stable ranks.

``horovodrun`` starts this server inside its own process and numbers the workers host by host.
``esync-cluster --collective allreduce`` runs the same server (``horovod.runner.http``) as a role
of its plan, so the supervisor watches it like the parameter server, and gives it a slot plan in
which worker i of the plan is Horovod rank i: device -> shard -> rank stays fixed whatever the
hosts' order. The workers get the same slots in their ``HOROVOD_*`` variables
(``esync.launch.roles.slot_plan`` and ``slot_env``).

    python -m esync.launch.rendezvous --host 10.0.0.1 --port 9091 --workers host0,host0,host1
"""
from __future__ import annotations

import argparse
import signal
import sys

from esync.common.argtypes import port
from esync.launch.roles import slot_plan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m esync.launch.rendezvous",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True, help="address to listen on")
    parser.add_argument("--port", type=port, required=True)
    parser.add_argument("--workers", required=True,
                        help="the host name of each worker, comma-separated, in rank order")
    args = parser.parse_args(argv)
    try:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except ImportError as exc:
        from esync.common.collectives import INSTALL_HINT
        print(f"rendezvous: error: Horovod is missing ({exc}); {INSTALL_HINT}", file=sys.stderr)
        return 2
    hosts = [h.strip() for h in args.workers.split(",")]
    if not all(hosts):
        parser.error(f"argument --workers: empty host name in {args.workers!r}")
    try:
        server = RendezvousHTTPServer((args.host, args.port), RendezvousHandler, 0)
    except OSError as exc:
        print(f"rendezvous: error: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
    server.init([SlotInfo(**slot) for slot in slot_plan(hosts)])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"rendezvous: {len(hosts)} workers on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
