"""The dashboard and TensorBoard on a real 2-worker ESync job (esync-cluster, lenet, short).

One job serves every test of this module (a module fixture): the dashboard is opened in Debian's
headless Chromium, driven by playwright through ``executable_path`` (playwright never downloads
a browser here); the TensorBoard event files are read back once the job has ended. Every process
the module starts is stopped at its end, whether the tests passed or not.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from support import REPO, processes_mentioning

# The job, the browser and the event files are set up inside the first test: give it room.
pytestmark = pytest.mark.timeout(900)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
WORKERS = 2
TRAINING_SECONDS = 30


def chromium_or_skip() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (scripts/test.sh does it "
                    "when it runs as root)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed: "
                        "`pip install -e '.[test]'`")


class Job:
    """A running esync-cluster whose whole process tree this test owns."""

    def __init__(self, log_dir: Path, data_dir: Path):
        self.log_dir = log_dir
        self.mode_dir = log_dir / "lenet" / "esync"
        command = [sys.executable, "-m", "esync.launch", "-ld", str(log_dir), "-dd", str(data_dir),
                   "--quiet", "-m", "esync", "--workers", str(WORKERS), "--slowdown", "1,4",
                   "-b", "8", "-e", "5", "--max-seconds", str(TRAINING_SECONDS)]
        self.output = log_dir / "launcher.log"
        with open(self.output, "w") as out:
            self.proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.url = self.port = None
        try:
            self.url = self._dashboard_url()
            self.port = self.url.split(":")[2].split("/")[0]
        except BaseException:
            self.stop()
            raise

    def _dashboard_url(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"dashboard at (http://\S+)", self.output.read_text())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"the launcher printed no dashboard URL:\n{self.log()}")

    def data(self) -> dict:
        base = self.url.split("/dashboard/")[0]
        return requests.get(f"{base}/dashboard/api/jobs/default/", timeout=10).json()

    def wait_for_round(self, number: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended before round {number}:\n{self.log()}")
            try:
                if self.data()["round"] >= number:
                    return
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"round {number} not reached in {timeout} s:\n{self.log()}")

    def wait(self, timeout: float = 240) -> int:
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        text = self.output.read_text(errors="replace")[-3000:]
        for path in sorted(self.mode_dir.glob("processes/*.log")):
            text += f"\n--- {path.name} ---\n" + path.read_text(errors="replace")[-1500:]
        return text

    def stop(self) -> None:
        """Ctrl-C to the launcher (it stops its children), then SIGKILL whatever is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        leftovers = processes_mentioning(str(self.log_dir))
        if self.port is not None:         # the state server's command lines name its port only
            leftovers += processes_mentioning(f"127.0.0.1:{self.port} ")
            leftovers += processes_mentioning(f"--port {self.port} ")
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def worker_rows(page) -> list[dict]:
    return page.eval_on_selector_all("#workers tbody tr.worker", """rows => rows.map(row => ({
        rank: row.dataset.rank,
        cells: Object.fromEntries(Array.from(row.cells, cell => [cell.className.split(' ')[0],
                                                                 cell.textContent.trim()]))}))""")


def refreshes(page) -> int:
    """How often the page has redrawn itself from the JSON (the page counts it)."""
    return int(page.evaluate("() => Number(document.body.dataset.updates || 0)"))


def wait_for_refreshes(page, more: int, timeout: float = 30) -> None:
    """Polled from here: the page's Content-Security-Policy forbids playwright's in-page eval."""
    target = refreshes(page) + more
    deadline = time.monotonic() + timeout
    while refreshes(page) < target:
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not refresh {more} times in {timeout} s")
        time.sleep(0.2)


def wait_for_element(page, selector: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while page.query_selector(selector) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{selector} did not appear in {timeout} s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def live(tmp_path_factory, real_fashion_subset):
    """Observations of the page during the job, and the job's folder once it has ended."""
    chromium_or_skip()
    from playwright.sync_api import sync_playwright

    log_dir = tmp_path_factory.mktemp("dashboard-live")
    job = Job(log_dir, real_fashion_subset)
    seen = {"requests": []}
    try:
        job.wait_for_round(3)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on("request", lambda request: seen["requests"].append(request.url))
                page.goto(job.url)
                wait_for_refreshes(page, 1)
                seen["first"] = worker_rows(page)
                wait_for_refreshes(page, 2)
                seen["second"] = worker_rows(page)
                wait_for_element(page, "#accuracy-chart circle.accuracy-dot", timeout=120)
                seen["k_lines"] = page.eval_on_selector_all("#k-chart polyline.series",
                                                            "lines => lines.length")
                seen["accuracy_dots"] = page.eval_on_selector_all(
                    "#accuracy-chart circle.accuracy-dot", "dots => dots.length")
                screenshot = os.environ.get("ESYNC_DASHBOARD_SCREENSHOT")
                if screenshot:
                    page.screenshot(path=screenshot, full_page=True)
            finally:
                browser.close()
        seen["exit_code"] = job.wait()
        seen["log"] = job.log()
        seen["mode_dir"] = job.mode_dir
        yield seen
    finally:
        job.stop()


def test_dashboard_shows_a_row_per_worker(live):
    assert [row["rank"] for row in live["first"]] == [str(rank) for rank in range(WORKERS)]


def test_worker_rows_name_device_and_host(live):
    cells = [row["cells"] for row in live["first"]]
    assert sorted(c["device"] for c in cells) == ["cpu0", "cpu1"] and all(
        c["host"] not in ("", "–") for c in cells)


def test_worker_rows_show_each_devices_slowdown_factor(live):
    """``--slowdown 1,4``: each worker's hello carries its factor, the "speed" column shows it."""
    speeds = {row["cells"]["device"]: row["cells"]["speed"] for row in live["first"]}
    assert speeds == {"cpu0": "x1", "cpu1": "x4"}


def test_worker_numbers_change_between_two_reads(live):
    def numbers(rows):
        return [[row["cells"][key] for key in ("requests", "c", "k-live", "split")]
                for row in rows]
    assert numbers(live["first"]) != numbers(live["second"])


def test_request_counts_grow_between_two_reads(live):
    first = [int(row["cells"]["requests"]) for row in live["first"]]
    second = [int(row["cells"]["requests"]) for row in live["second"]]
    assert all(b > a for a, b in zip(first, second))


def test_the_slowest_worker_is_marked(live):
    """The mark follows the state server's rule: of the workers that take part, the one whose
    last iteration took longest (the c column, in the same refresh); a worker judged too slow
    to set the rounds (``--sit-out-ratio``) says "sits out" instead, whatever its c. Which one is
    slowest in a given refresh is the emulation's business: with batches of 8 an iteration is
    mostly the Python outside the device's cap, and one slow iteration of the x1 device can
    outlast the x4's (seen once in a full suite), or one stalled x4 iteration can make it read
    77 times slower than the x1 and sit out (seen once)."""
    for rows in (live["first"], live["second"]):
        marked = [row["cells"]["device"] for row in rows
                  if row["cells"]["slowest"] == "slowest"]
        taking_part = {row["cells"]["device"]: float(row["cells"]["c"]) for row in rows
                       if row["cells"]["slowest"] != "sits out"}
        assert len(marked) == 1, rows
        assert taking_part[marked[0]] == max(taking_part.values()), rows
        assert {row["cells"]["slowest"] for row in rows} <= {"slowest", "sits out", ""}


def test_k_chart_has_a_line_per_worker(live):
    assert live["k_lines"] == WORKERS


def test_accuracy_curve_appears_when_the_evaluator_scores(live):
    assert live["accuracy_dots"] >= 1


def test_page_requests_nothing_outside_the_state_server(live):
    origin = live["requests"][0].split("/dashboard/")[0]
    assert all(url.startswith(origin + "/") for url in live["requests"])


def test_job_still_finishes_normally(live):
    assert live["exit_code"] == 0, live["log"]


def test_tensorboard_events_hold_rank_zeros_scalars(live):
    from esync.worker.tboard import read_scalars
    scalars = read_scalars(live["mode_dir"])
    assert {"train/loss", "train/throughput", "train/computing_time_ratio"} <= set(scalars)


def test_tensorboard_has_every_workers_k_from_the_exchange(live):
    from esync.worker.tboard import read_scalars
    scalars = read_scalars(live["mode_dir"])
    assert {f"k/worker{rank}" for rank in range(WORKERS)} <= set(scalars)


def test_tensorboard_training_scalars_have_one_point_per_round(live):
    from esync.worker.tboard import read_scalars
    rounds = len(list((live["mode_dir"]).glob("*/cpu0/iter-*.txt")))
    assert [step for step, _ in read_scalars(live["mode_dir"])["train/loss"]] == list(
        range(1, rounds + 1))


def test_tensorboard_events_hold_test_accuracy_by_round_and_by_time(live):
    from esync.worker.tboard import read_scalars
    scalars = read_scalars(live["mode_dir"])
    by_round, by_time = scalars["test/accuracy_by_round"], scalars["test/accuracy_by_time"]
    assert len(by_round) == len(by_time) >= 1 and [v for _, v in by_round] == [
        v for _, v in by_time]
