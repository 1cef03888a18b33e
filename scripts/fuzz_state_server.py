"""Hostile requests against a real state server: no answer may be a 5xx or anything but JSON,
and no job's state may change.

Starts a state server (gunicorn, as in production) on a free loopback port with a temporary
database, creates a dynamic and a planned job with some state, records every job's live state
and history, then sends ``--requests`` malformed or hostile requests drawn from a seeded
generator: odd paths and methods, bodies of random bytes, huge and non-finite numbers, deep
nesting, wrong types, oversized bodies, broken multipart and charsets, too many fields, missing,
wrong, huge and non-ASCII tokens, and, with the right token, valid calls with one field made
invalid; a few are raw bytes that are not HTTP at all. Afterwards it compares state and history.

    python scripts/fuzz_state_server.py --requests 10000 --seed 1 --out reports/fuzz.json

Exit status 0 when every answer was a JSON 4xx/2xx and nothing changed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esync.coordination.service import free_port, start_state_server, stop, wait_until_up  # noqa: E402

TOKEN = "fuzz-token-5e1d"
JOBS = {"fz-dyn": "dynamic", "fz-plan": "planned"}
NUM_WORKERS = 4
ENDPOINTS = ["init", "apply", "plan", "reset", "rounds", "history", "", "unknown"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]

# Values that every integer / number / list field refuses (None would mean "absent").
BAD_INTS = [-1, 10 ** 400, 10 ** 30, "abc", True, [], {}, 1.5, "1e3", "NaN", "", " ", "\ud800",
            "9" * 60, -(10 ** 20), 10 ** 8]
BAD_NUMBERS = [-1.0, 10 ** 400, -(10 ** 400), "inf", "nan", "abc", True, [], {}, "1" * 80,
               "\ud800", 9e99]
BAD_ROUNDS = [0, -5, "x", 1.5, 10 ** 30, [1], {}, True, 10 ** 400]
BAD_LISTS = [[1] * (NUM_WORKERS + 1), [], [-1] * NUM_WORKERS, ["a"] * NUM_WORKERS,
             [10 ** 400] * NUM_WORKERS, [[1]] * NUM_WORKERS, "1,2,3,4", 7, {"0": 1}]
BAD_TOKENS = [None, "", "wrong", "x" * 5000, "\ud800", "tok\u00e9n", TOKEN + "x", TOKEN[:-1],
              TOKEN.upper()]


def valid_fields(endpoint: str, policy: str) -> dict:
    return {"init": {"num_workers": NUM_WORKERS, "policy": policy},
            "apply": {"r": 1, "k": 2, "c": 0.05, "t": 3},
            "plan": {"r": 1, "c": 0.05, "t": 3},
            "reset": {"r": 1, "t": 9},
            "rounds": {"t": 50, "k": [1] * NUM_WORKERS, "c": [0.1] * NUM_WORKERS}}[endpoint]


def corrupt(rng: random.Random, endpoint: str, fields: dict) -> dict:
    """``fields`` with one field made invalid (or removed when it is required)."""
    fields = dict(fields)
    name = rng.choice(sorted(fields))
    if name == "t" and endpoint in ("apply", "plan"):
        fields[name] = rng.choice(BAD_ROUNDS)
    elif name == "t":
        fields[name] = rng.choice(BAD_ROUNDS + [None])
    elif name in ("k", "c") and endpoint == "rounds":
        fields[name] = rng.choice(BAD_LISTS)
    elif name in ("r", "k", "num_workers"):
        fields[name] = rng.choice(BAD_INTS + [None])
    elif name == "c":
        fields[name] = rng.choice(BAD_NUMBERS + [None])
    elif name == "policy":
        fields[name] = rng.choice(["both", "\ud800", 3, [], "planned " * 30])
    if fields.get(name, 0) is None:
        del fields[name]
    return fields


def encode_json(data) -> bytes:
    return json.dumps(data).encode("utf-8", "surrogatepass")


def random_body(rng: random.Random) -> tuple[bytes, str]:
    """A hostile body and its content type."""
    kind = rng.randrange(12)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 3000)), rng.choice(
            ["application/json", "application/x-www-form-urlencoded", "text/plain", ""])
    if kind == 1:
        depth = rng.choice([20, 500, 1500, 2040])
        return ("{\"r\":" + "[" * depth + "]" * depth + "}").encode(), "application/json"
    if kind == 2:
        depth = rng.choice([20, 600, 1300])
        return ("{\"a\":" * depth + "1" + "}" * depth).encode(), "application/json"
    if kind == 3:
        return (b'{"r":0,"k":1,"c":1' + b"0" * rng.choice([310, 400, 4000]) + b"}"), \
            "application/json"
    if kind == 4:
        return rng.choice([b'{"c": NaN}', b'{"c": Infinity}', b'{"c": -Infinity}', b"[1,2]",
                           b'"text"', b"null", b"{", b'{"r":}', b"{}" * 100]), "application/json"
    if kind == 5:
        return b"x" * rng.choice([4097, 70_000, 300_000]), "application/json"
    if kind == 6:
        return b"r=1&k=1&c=0.1", rng.choice(["multipart/form-data",
                                            "multipart/form-data; boundary=",
                                            "multipart/form-data; boundary=zz"])
    if kind == 7:
        charset = rng.choice(["utf-16", "latin-1", "nope", "utf-32", "cp1252", "ebcdic"])
        return "r=1&k=1&c=0.1&x=\u00e9".encode("utf-16" if charset == "utf-16" else "latin-1"), \
            f"application/x-www-form-urlencoded; charset={charset}"
    if kind == 8:
        return "&".join(f"f{i}=1" for i in range(rng.choice([33, 200]))).encode(), \
            "application/x-www-form-urlencoded"
    if kind == 9:
        return encode_json({"r": "\ud800", "k": "\udfff", "c": "\ud83d",
                            "token": "\ud800"}), "application/json"
    if kind == 10:
        return encode_json({"t": 1, "k": [1] * 3000, "c": [0.1] * 3000}), "application/json"
    return bytes(rng.choice([0x00, 0xff, 0xfe, 0x80])) * rng.randrange(1, 200), \
        rng.choice(["application/json", "application/x-www-form-urlencoded; charset=utf-8"])


def random_path(rng: random.Random) -> str:
    job = rng.choice(list(JOBS) + ["nope", "a" * 65, "%ff%fe", "..", "%2e%2e", "j%00b",
                                    "\u00e9t\u00e9", "a/b", "<script>", "x" * 3000])
    endpoint = rng.choice(ENDPOINTS)
    tail = f"{endpoint}/" if endpoint else ""
    return rng.choice([f"/jobs/{job}/{tail}", f"/{tail}", f"/jobs/{job}/{tail}?" + "&".join(
        f"q{i}={rng.randrange(10)}" for i in range(rng.choice([1, 33, 100]))),
        "/" + "/".join(rng.choice(["..", "%2F", "jobs", "%ff", "//", "admin", "static"])
                        for _ in range(rng.randrange(1, 6))),
        f"/jobs/{job}/history/?run={rng.choice(['-1', '0', '1e99', 'x', '9' * 40])}"
        f"&since={rng.choice(['-5', 'x', '9' * 40])}&limit={rng.choice(['0', '-1', 'x'])}"])


def hostile_request(rng: random.Random) -> dict:
    """One request that must be refused (or be a harmless read)."""
    choice = rng.randrange(10)
    headers: dict = {}
    if choice < 4:                       # the right token, a valid call with one bad field
        job = rng.choice(list(JOBS))
        endpoint = rng.choice(["init", "apply", "plan", "reset", "rounds"])
        fields = corrupt(rng, endpoint, valid_fields(endpoint, JOBS[job]))
        headers["Authorization"] = f"Bearer {TOKEN}"
        return {"method": "POST", "path": f"/jobs/{job}/{endpoint}/", "headers": headers,
                "body": encode_json(fields), "content_type": "application/json"}
    if choice < 6:                       # a valid call without the right token
        job = rng.choice(list(JOBS) + ["default"])
        endpoint = rng.choice(["init", "apply", "plan", "reset", "rounds"])
        fields = valid_fields(endpoint, JOBS.get(job, "dynamic"))
        token = rng.choice(BAD_TOKENS)
        if token is not None and rng.random() < 0.5:
            fields = dict(fields, token=token)
        elif token is not None:
            headers["Authorization"] = rng.choice(["Bearer ", "Basic ", "bearer", ""]) + (
                token.encode("utf-8", "surrogatepass").decode("latin-1"))
        path = f"/jobs/{job}/{endpoint}/" if job != "default" else f"/{endpoint}/"
        if rng.random() < 0.5:
            body, content_type = encode_json(fields), "application/json"
        else:
            body = "&".join(f"{k}={v}" for k, v in fields.items()).encode("utf-8", "surrogatepass")
            content_type = "application/x-www-form-urlencoded"
        return {"method": "POST", "path": path, "headers": headers, "body": body,
                "content_type": content_type}
    body, content_type = random_body(rng)
    if rng.random() < 0.3:
        headers["Authorization"] = f"Bearer {TOKEN}"
    return {"method": rng.choice(METHODS), "path": random_path(rng), "headers": headers,
            "body": body, "content_type": content_type}


RAW_REQUESTS = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x00\x01\x02\r\n\r\n",
                b"POST /jobs/fz-dyn/apply/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
                b"POST /apply/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
                b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"]


def send_raw(url: str, payload: bytes) -> tuple[int, bytes]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as sock:
        sock.sendall(payload)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not data:
                break
            chunks.append(data)
    answer = b"".join(chunks)
    if not answer:
        return 0, b""                    # closed without an answer: not a 5xx
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return int(head.split()[1]), body


def _dechunk(data: bytes) -> bytes:
    out = []
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2:]
    return b"".join(out)


def comparable(url: str) -> dict:
    """Every job's live state (without clock-dependent ages) and persisted history."""
    seen = {}
    for job in JOBS:
        state = requests.get(f"{url}/jobs/{job}/", timeout=30).json()
        for worker in state["workers"]:
            worker.pop("seen_ago")
        seen[job] = {"state": state,
                     "history": requests.get(f"{url}/jobs/{job}/history/", timeout=30).json()}
    seen["jobs"] = requests.get(f"{url}/jobs/", timeout=30).json()
    return seen


def prepare_jobs(url: str) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"

    def post(path, data):
        response = session.post(url + path, json=data, timeout=30)
        response.raise_for_status()

    for job, policy in JOBS.items():
        post(f"/jobs/{job}/init/", {"num_workers": NUM_WORKERS, "policy": policy})
    for rank in range(NUM_WORKERS):
        post("/jobs/fz-dyn/apply/", {"r": rank, "k": 1, "c": 0.01 * (rank + 1), "t": 1})
        post("/jobs/fz-dyn/reset/", {"r": rank, "t": 2})
        post("/jobs/fz-dyn/apply/", {"r": rank, "k": 0, "c": 0.01 * (rank + 1), "t": 2})
    for t in (1, 2):
        post("/jobs/fz-plan/rounds/", {"t": t, "k": [4, 3, 2, 1],
                                       "c": [0.01, 0.02, 0.03, 0.04]})


def fuzz(url: str, *, requests_total: int, seed: int) -> dict:
    """Send the hostile requests; returns counts and every violation (5xx, not JSON, change)."""
    rng = random.Random(seed)
    prepare_jobs(url)
    before = comparable(url)
    statuses: Counter = Counter()
    violations: list[str] = []
    session = requests.Session()
    session.trust_env = False
    started = time.monotonic()
    for index in range(requests_total):
        if rng.random() < 0.01:
            payload = rng.choice(RAW_REQUESTS)
            status, body = send_raw(url, payload)
            statuses[status] += 1
            if status >= 500 or (status and not _is_json(body)):
                violations.append(f"raw {payload[:40]!r}: HTTP {status} {body[:80]!r}")
            continue
        req = hostile_request(rng)
        headers = dict(req["headers"])
        if req["content_type"]:
            headers["Content-Type"] = req["content_type"]
        try:
            response = _send(session, req, headers, url)
        except requests.RequestException:
            # A server may close an idle keep-alive connection at any time: try once more on a
            # fresh one; no answer there is a violation.
            session = requests.Session()
            session.trust_env = False
            try:
                response = _send(session, req, headers, url)
            except requests.RequestException as exc:
                violations.append(f"{req['method']} {req['path'][:60]}: no answer ({exc})")
                continue
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            violations.append(f"{req['method']} {req['path'][:60]} body {req['body'][:60]!r}: "
                              f"HTTP {response.status_code} {response.text[:120]!r}")
        elif response.status_code < 300 and req["method"] == "POST":
            violations.append(f"POST {req['path'][:60]} body {req['body'][:100]!r} headers "
                              f"{headers!r}: accepted (HTTP {response.status_code})")
        elif req["method"] != "HEAD" and not _is_json(response.content):
            violations.append(f"{req['method']} {req['path'][:60]}: not JSON "
                              f"(HTTP {response.status_code}) {response.text[:80]!r}")
        if index % 500 == 499:
            session.close()
            session = requests.Session()
            session.trust_env = False
    elapsed = time.monotonic() - started
    after = comparable(url)
    for job in before:
        if before[job] != after[job]:
            violations.append(f"job {job!r} changed: {before[job]!r} -> {after[job]!r}"[:2000])
    return {"requests": requests_total, "seed": seed, "seconds": round(elapsed, 2),
            "requests_per_s": round(requests_total / elapsed, 1),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "server_errors": sum(v for k, v in statuses.items() if k >= 500),
            "violations": violations[:50], "violation_count": len(violations)}


def _send(session, req: dict, headers: dict, url: str) -> requests.Response:
    return session.request(req["method"], url + req["path"], data=req["body"], headers=headers,
                           timeout=30)


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
        return True
    except ValueError:
        return False


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000, help="hostile requests to send")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request generator")
    parser.add_argument("--out", help="JSON file for the result (default: print only)")
    parser.add_argument("--server-log", help="keep the state server's log in this file")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 1_000_000:
        parser.error(f"--requests must be in [1, 1000000], got {args.requests}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="esync-state-fuzz-") as folder:
        proc = start_state_server(host="127.0.0.1", port=free_port(), token=TOKEN,
                                  db_path=Path(folder, "db.sqlite3"),
                                  log_path=args.server_log or Path(folder, "server.log"))
        try:
            wait_until_up(proc.url, timeout=60, proc=proc)
            result = fuzz(proc.url, requests_total=args.requests, seed=args.seed)
        finally:
            stop(proc)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0 if result["violation_count"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
