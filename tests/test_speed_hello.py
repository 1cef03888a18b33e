"""A worker tells the dashboard its new slow-down factor when ``--speed-schedule`` changes it:
once per change, from the algorithm's background announcer, never when nothing is told."""
from types import SimpleNamespace

import esync.worker.algorithms.esync as esync_algo
from esync.worker.algorithms.base import AlgorithmConfig
from esync.worker.algorithms.esync import sizing
from esync.worker.trainer import DeviceSpeed, TrainingLoop


class Recorder:
    def __init__(self):
        self.changes = []

    def speed_changed(self, slowdown):
        self.changes.append(slowdown)


def loop_with(algo, announced):
    loop = TrainingLoop.__new__(TrainingLoop)        # only what _announce_speed reads
    loop.algo, loop.announced = algo, announced
    return loop


def test_one_speed_change_per_change_of_the_factor():
    algo = Recorder()
    loop = loop_with(algo, 1.0)
    for factor in (1.0, 1.0, 6.0, 6.0, 6.0, 1.0, 1.0):
        loop._announce_speed(factor)
    assert algo.changes == [6.0, 1.0]


def test_the_factor_in_force_follows_the_schedule():
    args = SimpleNamespace(slowdown=1.0, emulation="cpu-cap", speed_schedule="cpu1:1@0,6@30")
    speed = DeviceSpeed(args, "cpu1")
    assert (speed.factor(29.9), speed.factor(30.0)) == (1.0, 6.0)


class FakeAnnouncer:
    made = []

    def __init__(self, client, rank, *, host, device):
        self.args, self.sent, self.closed = (rank, host, device), [], False
        FakeAnnouncer.made.append(self)

    def changed(self, slowdown):
        self.sent.append(slowdown)

    def close(self):
        self.closed = True


def esync_with_client(monkeypatch):
    """ESync whose round sizing talks to a state server (a recording stand-in for its client)."""
    monkeypatch.setattr(sizing, "SpeedAnnouncer", FakeAnnouncer)
    FakeAnnouncer.made = []
    hellos = []
    client = SimpleNamespace(hello=lambda rank, **fields: hellos.append((rank, fields)),
                             close=lambda: None)
    algo = esync_algo.ESync.__new__(esync_algo.ESync)
    config = AlgorithmConfig(state_url="http://127.0.0.1:1", job="j")
    algo.rounds = sizing.ServerRounds(config, SimpleNamespace(rank=1), client=client)
    return algo, hellos


def test_esync_announces_the_factor_then_hands_changes_to_one_announcer(monkeypatch):
    algo, hellos = esync_with_client(monkeypatch)
    algo.announce(host="h", device="cpu1", slowdown=1.0)
    assert hellos == [(1, {"host": "h", "device": "cpu1", "slowdown": 1.0})]
    algo.speed_changed(6.0)
    algo.speed_changed(1.0)
    [announcer] = FakeAnnouncer.made
    assert announcer.args == (1, "h", "cpu1") and announcer.sent == [6.0, 1.0]
    assert len(hellos) == 1                            # nothing from the training thread
    algo.close()
    assert announcer.closed


def test_esync_without_a_state_server_tells_nobody(monkeypatch):
    algo, _ = esync_with_client(monkeypatch)
    algo.rounds = sizing.FixedRounds(AlgorithmConfig(local_iters=3), SimpleNamespace(rank=1))
    algo.announce(host="h", device="cpu1", slowdown=1.0)
    algo.speed_changed(6.0)
    assert FakeAnnouncer.made == []
