"""The worker's background writes: in order, off the training thread, nothing lost at the end,
and a failed write raised in the training thread."""
import threading
import time

import pytest

from esync.worker.background import BackgroundWrites


def test_writes_are_made_in_submission_order_on_another_thread():
    writes, made = BackgroundWrites(), []
    for i in range(50):
        writes.submit(lambda i=i: made.append((i, threading.current_thread().name)))
    writes.close()
    assert [i for i, _ in made] == list(range(50))
    assert {name for _, name in made} == {"esync-writes"}


def test_the_caller_goes_on_while_a_slow_write_is_made_and_close_waits_for_it():
    writes, made = BackgroundWrites(), []
    began = time.perf_counter()
    writes.submit(lambda: (time.sleep(0.5), made.append("checkpoint")))
    assert time.perf_counter() - began < 0.2 and made == []
    writes.close()
    assert made == ["checkpoint"] and time.perf_counter() - began >= 0.5


def test_flush_waits_for_the_writes_before_it_only():
    writes, made = BackgroundWrites(), []
    writes.submit(lambda: (time.sleep(0.2), made.append(1)))
    writes.flush(timeout=5)
    assert made == [1]
    writes.close()


def test_a_failed_write_is_raised_at_the_next_submit_and_later_writes_are_not_made():
    writes, made = BackgroundWrites(), []

    def full_disk():
        raise OSError(28, "No space left on device")

    writes.submit(full_disk)
    writes.submit(lambda: made.append("after"))
    with pytest.raises(OSError, match="No space left"):
        writes.flush(timeout=5)
    assert made == []
    # raised once is not forgotten: a caller that goes on loses no write silently
    with pytest.raises(OSError, match="No space left"):
        writes.submit(lambda: made.append("after the error was raised"))
    with pytest.raises(OSError, match="No space left"):
        writes.flush(timeout=5)
    writes.close(raise_failure=False)
    assert made == []


def test_close_after_a_failure_raises_it_unless_the_worker_is_already_failing():
    for raise_failure in (True, False):
        writes = BackgroundWrites()
        writes.submit(lambda: 1 / 0)
        if raise_failure:
            with pytest.raises(ZeroDivisionError):
                writes.close()
        else:
            writes.close(raise_failure=False)


def test_a_stalled_write_times_out_with_a_message():
    writes, release = BackgroundWrites(), threading.Event()
    writes.submit(release.wait)
    with pytest.raises(TimeoutError, match="did not finish within 0.2 s"):
        writes.flush(timeout=0.2)
    release.set()
    writes.close()


def test_unthreaded_writes_are_made_at_once_in_the_caller():
    writes, made = BackgroundWrites(threaded=False), []
    writes.submit(lambda: made.append(threading.current_thread().name))
    assert made == [threading.current_thread().name]
    with pytest.raises(ZeroDivisionError):
        writes.submit(lambda: 1 / 0)
    writes.close()
