"""Screenshot of the live dashboard during a real job, for the README (docs/dashboard.png).

    .venv/bin/python scripts/screenshot_dashboard.py [--out docs/dashboard.png] [-- launcher flags]

Starts ``esync-cluster`` (by default the 4-worker cluster slowed 1x, 1x, 4x, 8x, lenet, in a
temporary log folder), waits until the evaluator has scored a few checkpoints, opens the
dashboard in Debian's headless Chromium (playwright with ``executable_path``; no browser is
downloaded), saves a full-page PNG, then stops the job with Ctrl-C and removes its folder.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def wait_for(predicate, what: str, timeout: float, launcher: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            sys.exit(f"screenshot: the job ended before {what}")
        try:
            value = predicate()
        except (requests.RequestException, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    sys.exit(f"screenshot: no {what} after {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "dashboard.png"))
    parser.add_argument("--scores", type=int, default=4, help="wait for this many scores")
    parser.add_argument("launcher_args", nargs="*", help="extra esync-cluster flags (after --)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"screenshot: {CHROMIUM} is missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="esync-screenshot-"))
    output = folder / "launcher.log"
    command = [sys.executable, "-m", "esync.launch", "-ld", str(folder), "--quiet", "-e", "5",
               "--max-seconds", "600", *args.launcher_args]
    with open(output, "w") as out:
        launcher = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        url = wait_for(lambda: re.search(r"dashboard at (http://\S+)", output.read_text()),
                       "dashboard URL", 120, launcher).group(1)
        data_url = url.split("/dashboard/")[0] + "/dashboard/api/jobs/default/"
        wait_for(lambda: len(requests.get(data_url, timeout=5).json()["scores"]) >= args.scores,
                 f"{args.scores} scores", 300, launcher)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 700})
            page.goto(url)
            wait_for(lambda: int(page.evaluate("() => Number(document.body.dataset.updates || 0)"))
                     >= 2, "two refreshes of the page", 30, launcher)
            page.screenshot(path=args.out, full_page=True)
            browser.close()
        print(f"screenshot: {args.out}")
        return 0
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
