"""gunicorn's threaded worker, with JSON error pages for requests gunicorn itself rejects.

gunicorn answers a request it cannot parse (bad request line, header or chunk size, an
unsupported transfer coding, ...) before Django sees it, with an HTML page and, for an
unsupported transfer coding, status 501. This worker answers those with the API's JSON error
``{"error": "...", "field": null}``, and with 400, since the fault is the client's.

    gunicorn --worker-class esync_state.gunicorn_worker.JsonErrorThreadWorker ...
"""
import json

from gunicorn import util
from gunicorn.workers import base
from gunicorn.workers.gthread import ThreadWorker

CLIENT_FAULT_AS_5XX = {501}     # gunicorn's answer to an unsupported transfer coding


def write_json_error(sock, status_int: int, reason: str, mesg: str) -> None:
    if status_int in CLIENT_FAULT_AS_5XX:
        status_int, reason = 400, "Bad Request"
    body = json.dumps({"error": f"{reason.lower()}: {mesg}" if mesg else reason.lower(),
                       "field": None}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin1") + body)


class _UtilWithJsonErrors:
    """gunicorn.util as the worker base module sees it, with ``write_error`` answering JSON."""

    write_error = staticmethod(write_json_error)

    def __getattr__(self, name):
        return getattr(util, name)


class JsonErrorThreadWorker(ThreadWorker):
    def init_process(self):
        base.util = _UtilWithJsonErrors()
        super().init_process()
