"""What an exchange costs against the slowest device's iteration (esync.launch.exchange_cost):
the arithmetic on known figures, and the record that run.json keeps."""
import pytest

from esync.common import presets
from esync.common.presets import Situation, resolve
from esync.launch import exchange_cost

MB = 1_000_000


def values(**given):
    found = dict(backend="local", net="netns", hosts=None, bandwidth="80mbit",
                 server_bandwidth="80mbit", workers=4, network="lenet", batch_size=64,
                 slowdown_list="1,1,4,8", emulation="sleep", cpu_share=None, devices="cpu")
    found.update(given)
    return found


def probe_of(model_bytes, seconds):
    return lambda network, batch: (model_bytes, seconds)


def test_the_servers_link_carries_every_workers_pull():
    """1 MB to 4 workers over 80 Mbit: 4 x 8 Mbit / 80 Mbit/s = 0.4 s; each worker's own
    link carries one push (0.1 s); the server's link decides."""
    cost = exchange_cost.estimate(values(), ["cpu"] * 4, probe=probe_of(MB, 0.05))
    assert cost.exchange_s == pytest.approx(0.4)
    # sleeping emulation: the x8 device takes 8 x 50 ms
    assert cost.slowest_iteration_s == pytest.approx(0.4)
    assert cost.ratio == pytest.approx(1.0)


def test_a_host_of_several_workers_shares_its_link():
    """--hosts 3,1 at 10 Mbit per host, the server unshaped: host0 carries three pushes of
    1 MB: 2.4 s."""
    cost = exchange_cost.estimate(values(hosts="3,1", bandwidth="10mbit", server_bandwidth=None),
                                  ["cpu"] * 4, probe=probe_of(MB, 0.05))
    assert cost.exchange_s == pytest.approx(2.4)
    assert cost.ratio == pytest.approx(2.4 / 0.4)


def test_caps_divide_the_x1_iteration_by_its_share_of_a_core():
    cost = exchange_cost.estimate(values(emulation="cpu-cap", cpu_share=0.5), ["cpu"] * 4,
                                  probe=probe_of(MB, 0.05))
    assert cost.slowest_iteration_s == pytest.approx(0.05 / 0.5 * 8)
    assert "0.50 of a core" in cost.basis


def test_gpu_devices_leave_the_cpus_factors_to_decide():
    cost = exchange_cost.estimate(values(slowdown_list="1,1,1,3", devices="gpu0,gpu1,cpu,cpu"),
                                  ["gpu0", "gpu1", "cpu", "cpu"], probe=probe_of(MB, 0.05))
    assert cost.slowest_iteration_s == pytest.approx(0.15)


def test_loopback_and_other_machines_need_no_probe():
    def refuse(*_):
        raise AssertionError("nothing to measure")
    loopback = exchange_cost.estimate(values(net="loopback", bandwidth=None,
                                             server_bandwidth=None), ["cpu"] * 4, probe=refuse)
    assert loopback.ratio == 0.0 and "no link rate" in loopback.basis
    remote = exchange_cost.estimate(values(backend="ssh", net="loopback"), ["cpu"] * 4,
                                    probe=refuse)
    assert remote.ratio is None and "--backend ssh" in remote.basis


@pytest.mark.parametrize("ratio, low_rank, share", [
    (presets.COSTLY_EXCHANGE * 1.5, 32, 0.2),      # costly: factors in stretched rounds
    (presets.COSTLY_EXCHANGE / 1.5, 0, 1.0),       # cheap: full deltas, one slowest iteration
    (None, 32, 0.2),                               # unmeasured shaped links count as costly
])
def test_the_measured_ratio_selects_the_exchange_rule(ratio, low_rank, share):
    defaults = {"low_rank": 0, "comm_share": 1.0, "overlap": False, "comm_dtype": "float32",
                "carry": False, "outer_adam": False}
    got = resolve(defaults, Situation(shaped=True, exchange_ratio=ratio, exchange_basis="x"))
    assert (got.values["low_rank"], got.values["comm_share"]) == (low_rank, share)
    record = got.record()["situation"]
    assert record["exchange_ratio"] == ratio and record["exchange_basis"] == "x"
