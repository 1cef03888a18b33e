"""The launcher's pure parts: the role plan and the stall watchdog's bookkeeping (no processes)."""
import pytest

from esync.launch.backends.local import LocalLaunch as LocalCluster
from esync.launch.flags import build_parser
from esync.launch.roles import ClusterConfig, Host, Hosts, plan_roles, slot_plan
from esync.launch.supervisor import StallWatch

PS = Host("ps", "10.9.0.1", interface="veth-ps")
FAST, SLOW = Host("cloud1", "10.9.0.2", interface="veth-c1"), Host("cloud3", "10.9.0.3")


def config(**changes):
    values = dict(mode="esync", devices=("cpu", "cpu"), slowdowns=(1.0, 4.0), port=9100,
                  train_argv=("-m", "esync", "-b", "8"), state_port=9200, state_token="secret",
                  state_db="/logs/state.sqlite3", python="/usr/bin/python3",
                  main_py="/repo/main.py")
    values.update(changes)
    return ClusterConfig(**values)


def by_name(specs):
    return {spec.name: spec for spec in specs}


def test_plan_starts_every_role_in_dependency_order():
    specs = plan_roles(config(), Hosts(PS, (FAST, SLOW)))
    assert [(s.name, s.kind) for s in specs] == [
        ("state-server", "state"), ("scheduler", "scheduler"), ("server0", "server"),
        ("evaluator", "evaluator"), ("worker-cpu0", "worker"), ("worker-cpu1", "worker")]


def test_allreduce_plan_has_horovods_rendezvous_in_place_of_the_parameter_server():
    specs = plan_roles(config(collective="allreduce"), Hosts(PS, (FAST, SLOW)))
    assert [(s.name, s.kind) for s in specs] == [
        ("state-server", "state"), ("rendezvous", "rendezvous"), ("evaluator", "evaluator"),
        ("worker-cpu0", "worker"), ("worker-cpu1", "worker")]
    named = by_name(specs)
    assert named["rendezvous"].argv[-6:] == ["--host", "10.9.0.1", "--port", "9100",
                                             "--workers", "cloud1,cloud3"]
    for rank, name in enumerate(("worker-cpu0", "worker-cpu1")):
        env = named[name].env
        assert not any(k.startswith("DMLC_") for k in env)
        assert env["HOROVOD_RANK"] == str(rank) and env["HOROVOD_SIZE"] == "2"
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.9.0.1"
        assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "9100"
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert named["worker-cpu0"].env["HOROVOD_CYCLE_TIME"] == "20"   # not Horovod's busy 1 ms
    assert named["worker-cpu0"].env["HOROVOD_GLOO_IFACE"] == "veth-c1"
    assert "HOROVOD_GLOO_IFACE" not in named["worker-cpu1"].env   # chosen by its route


def test_allreduce_ranks_follow_the_plan_whatever_the_hosts_order():
    """Worker i is rank i (its shard, its device), however its host's workers interleave."""
    slots = slot_plan(["b", "a", "b", "c"])
    assert [s["rank"] for s in slots] == [0, 1, 2, 3]
    assert [(s["hostname"], s["local_rank"], s["local_size"]) for s in slots] == [
        ("b", 0, 2), ("a", 0, 1), ("b", 1, 2), ("c", 0, 1)]
    assert [(s["cross_rank"], s["cross_size"]) for s in slots] == [(0, 3), (1, 3), (0, 1),
                                                                    (2, 3)]


def test_fixed_local_iterations_reach_each_worker():
    specs = by_name(plan_roles(config(local_iters=(2, 8), state_port=None),
                               Hosts(PS, (FAST, SLOW))))
    assert specs["worker-cpu0"].argv[-2:] == ["--local-iters", "2"]
    assert specs["worker-cpu1"].argv[-2:] == ["--local-iters", "8"]
    assert "--local-iters" not in specs["evaluator"].argv


def test_in_async_mode_the_fastest_device_writes_the_checkpoints():
    # ps-lite's rank 0 may be the slow device, whose rounds (one slow iteration each) would
    # leave the evaluator few checkpoints
    specs = by_name(plan_roles(config(mode="async", train_argv=("-m", "async"),
                                      slowdowns=(4.0, 1.0), state_port=None),
                               Hosts(PS, (SLOW, FAST))))
    assert "--writes-checkpoints" in specs["worker-cpu1"].argv
    assert "--no-writes-checkpoints" in specs["worker-cpu0"].argv
    assert "--writes-checkpoints" not in specs["worker-cpu0"].argv


@pytest.mark.parametrize("mode", ["esync", "sync"])
def test_in_round_modes_rank_0_writes_the_checkpoints(mode):
    specs = plan_roles(config(mode=mode, train_argv=("-m", mode)), Hosts(PS, (FAST, SLOW)))
    assert not any("checkpoints" in " ".join(spec.argv) for spec in specs)


def test_ps_lite_addresses_come_from_the_placement():
    specs = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))
    assert {s.env["DMLC_PS_ROOT_URI"] for s in specs.values() if "DMLC_PS_ROOT_URI" in s.env} \
        == {"10.9.0.1"}
    assert specs["scheduler"].env["DMLC_NODE_HOST"] == "10.9.0.1"
    assert specs["worker-cpu0"].env["DMLC_NODE_HOST"] == "10.9.0.2"
    assert specs["worker-cpu1"].env["DMLC_NODE_HOST"] == "10.9.0.3"
    assert not any("127.0.0.1" in " ".join(s.argv) + " ".join(s.env.values())
                   for s in specs.values())


def test_interface_is_set_only_for_hosts_that_name_one():
    specs = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))
    assert specs["server0"].env["DMLC_INTERFACE"] == "veth-ps"
    assert specs["worker-cpu0"].env["DMLC_INTERFACE"] == "veth-c1"
    assert "DMLC_INTERFACE" not in specs["worker-cpu1"].env


def test_cluster_sizes_reach_every_ps_lite_role():
    specs = plan_roles(config(servers=2), Hosts(PS, (FAST, SLOW)))
    dmlc = [s.env for s in specs if s.kind in ("scheduler", "server", "worker")]
    assert len(dmlc) == 5
    assert all(e["DMLC_NUM_WORKER"] == "2" and e["DMLC_NUM_SERVER"] == "2"
               and e["DMLC_PS_ROOT_PORT"] == "9100" for e in dmlc)


def test_worker_gets_its_device_slowdown_host_and_the_state_server_address():
    worker = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))["worker-cpu1"]
    argv = worker.argv
    assert argv[:2] == ["/usr/bin/python3", "/repo/main.py"]
    assert argv[argv.index("--slowdown") + 1] == "4"
    assert argv[argv.index("--host-name") + 1] == "cloud3"
    assert argv[argv.index("--state-server-ip") + 1] == "10.9.0.1"
    assert argv[argv.index("--state-server-port") + 1] == "9200"
    assert (worker.host, worker.device, worker.rank) == ("cloud3", "cpu1", 1)


def test_state_token_travels_in_the_environment_never_on_a_command_line():
    specs = plan_roles(config(), Hosts(PS, (FAST, SLOW)))
    assert not any("secret" in s.argv for s in specs)
    assert by_name(specs)["worker-cpu0"].env["ESYNC_STATE_TOKEN"] == "secret"
    assert by_name(specs)["state-server"].env["ESYNC_STATE_TOKEN"] == "secret"


def test_state_server_listens_on_the_ps_host_with_the_job_database():
    state = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))["state-server"]
    assert state.argv[1:] == ["-m", "esync.coordination.service", "--host", "10.9.0.1", "--port", "9200"]
    assert state.env["ESYNC_STATE_DB"] == "/logs/state.sqlite3"
    assert state.host == "ps"


def test_modes_without_a_state_server_plan_none():
    specs = plan_roles(config(mode="sync", state_port=None), Hosts(PS, (FAST, SLOW)))
    assert "state" not in {s.kind for s in specs}
    assert not any("--state-server-ip" in s.argv for s in specs)


def test_gpu_workers_get_their_gpu_and_distinct_log_folders():
    specs = plan_roles(config(devices=("gpu0", "gpu0", "cpu"), slowdowns=(1, 1, 1)),
                       Hosts.single("box", "10.0.0.5", 3))
    workers = [s for s in specs if s.kind == "worker"]
    assert [w.device for w in workers] == ["gpu0", "gpu0-2", "cpu0"]
    assert [w.gpu for w in workers] == [0, 0, None]
    gpu = workers[1].argv
    assert gpu[gpu.index("-c") + 1] == "0" and gpu[gpu.index("-g") + 1] == "0"


def test_evaluator_gets_the_state_servers_address_and_token_for_the_dashboard():
    evaluator = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))["evaluator"]
    argv = " ".join(evaluator.argv)
    assert ("--state-server-ip 10.9.0.1 --state-server-port 9200" in argv
            and evaluator.env["ESYNC_STATE_TOKEN"] == "secret")


def test_no_evaluator_when_asked():
    specs = plan_roles(config(evaluator=False), Hosts(PS, (FAST, SLOW)))
    assert "evaluator" not in {s.kind for s in specs}


def test_placement_must_match_the_worker_count():
    with pytest.raises(ValueError, match="1 worker hosts for 2 workers"):
        plan_roles(config(), Hosts(PS, (FAST,)))


def test_cluster_flags_reach_workers_and_launcher_flags_do_not(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["-ld", str(tmp_path), "--workers", "2", "-b", "8",
                              "--restarts", "2", "--stall-timeout", "30", "--threads", "1"])
    args.slowdowns = [1.0, 1.0]
    worker = next(s for s in LocalCluster(args, parser).plan() if s.kind == "worker")
    assert worker.argv[worker.argv.index("--batch-size") + 1] == "8"
    for flag in ("--restarts", "--stall-timeout", "--workers", "--threads", "--state-token"):
        assert flag not in worker.argv


# The watchdog's bookkeeping: feed it scans {worker: (rounds logged, newest log time)} and times.

def test_stall_is_declared_after_the_timeout_without_any_round():
    watch = StallWatch(timeout=10, startup=0, now=0)
    watch.observe({"w0": (0, 0.0)}, now=0)
    watch.observe({"w0": (1, 5.0)}, now=5)
    assert not watch.stalled(now=14)
    assert watch.stalled(now=16)


def test_default_stall_timeout_is_twenty_median_rounds_but_at_least_a_minute():
    watch = StallWatch(timeout=None, startup=0, now=0)
    watch.observe({"w0": (0, 0.0)}, now=0)
    for t in range(1, 6):                              # rounds of 5 s
        watch.observe({"w0": (t, t * 5.0)}, now=t * 5.0)
    assert watch.limit() == 100
    quick = StallWatch(timeout=None, startup=0, now=0)
    quick.observe({"w0": (0, 0.0)}, now=0)
    for t in range(1, 6):                              # rounds of 0.5 s
        quick.observe({"w0": (t, t * 0.5)}, now=t * 0.5)
    assert quick.limit() == 60


def test_startup_gets_its_own_allowance_before_the_first_round():
    watch = StallWatch(timeout=10, startup=100, now=0)
    watch.observe({"w0": (0, 0.0)}, now=0)
    assert not watch.stalled(now=90)
    assert watch.stalled(now=101)


def test_a_worker_before_its_first_round_keeps_the_startup_allowance_after_others_ended():
    """ASGD at 300:1: the fast workers trained for their budget and stopped; a slow one is
    still in its first iteration, which the start-up allowance covers; after it, a stall."""
    watch = StallWatch(timeout=10, startup=100, now=0)
    watch.observe({"fast": (0, 0.0), "slow": (0, 0.0)}, now=0)
    watch.observe({"fast": (5, 20.0), "slow": (0, 0.0)}, now=20)
    assert not watch.stalled(now=60)
    assert watch.stalled(now=101)
    done = StallWatch(timeout=10, startup=100, now=0)      # every worker has had a round
    done.observe({"fast": (0, 0.0), "slow": (0, 0.0)}, now=0)
    done.observe({"fast": (5, 20.0), "slow": (1, 20.0)}, now=20)
    assert done.stalled(now=31)


def test_logs_left_by_an_earlier_run_are_not_progress_but_rewritten_rounds_are():
    watch = StallWatch(timeout=10, startup=0, now=0)
    watch.observe({"w0": (7, 100.0)}, now=0)           # a resumed job: 7 rounds on disk
    watch.observe({"w0": (7, 100.0)}, now=8)
    assert watch.stalled(now=11)
    watch.observe({"w0": (7, 111.0)}, now=11)          # round 7 run again and rewritten
    assert not watch.stalled(now=12)


def test_idle_time_names_the_worker_that_stopped_logging():
    watch = StallWatch(timeout=10, startup=0, now=0)
    watch.observe({"a": (0, 0.0), "b": (0, 0.0)}, now=0)
    watch.observe({"a": (1, 1.0), "b": (1, 1.0)}, now=1)
    watch.observe({"a": (2, 6.0), "b": (1, 1.0)}, now=6)
    assert watch.idle("b", now=10) > watch.idle("a", now=10)


def _flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_worker_i_of_the_plan_trains_on_shard_i():
    specs = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))
    assert _flag(specs["worker-cpu0"].argv, "--shard") == "0"
    assert _flag(specs["worker-cpu1"].argv, "--shard") == "1"


def test_capped_workers_say_so_and_get_one_compute_thread():
    specs = by_name(plan_roles(config(cpu_cores=(0.6, 0.15), emulation="cpu-cap"),
                               Hosts(PS, (FAST, SLOW))))
    slow = specs["worker-cpu1"]
    assert slow.cpu_cores == 0.15
    assert _flag(slow.argv, "--emulation") == "cpu-cap"
    assert _flag(slow.argv, "--slowdown") == "4"          # recorded, not slept
    assert slow.env["OMP_NUM_THREADS"] == "1" and slow.env["MXNET_CPU_WORKER_NTHREADS"] == "1"


def test_capped_workers_compute_on_the_cpu_the_plan_gives_them():
    from esync.common.speeds import CPU_PIN_ENV
    specs = by_name(plan_roles(config(cpu_cores=(0.6, 0.15), cpu_pins=(0, 1),
                                      emulation="cpu-cap"), Hosts(PS, (FAST, SLOW))))
    assert [specs[f"worker-cpu{i}"].env[CPU_PIN_ENV] for i in (0, 1)] == ["0", "1"]
    unpinned = by_name(plan_roles(config(cpu_cores=(0.6, 0.15), cpu_pins=(None, None),
                                         emulation="cpu-cap"), Hosts(PS, (FAST, SLOW))))
    assert CPU_PIN_ENV not in unpinned["worker-cpu0"].env       # --no-cpu-pinning


def test_uncapped_workers_sleep_as_before():
    specs = by_name(plan_roles(config(), Hosts(PS, (FAST, SLOW))))
    assert specs["worker-cpu1"].cpu_cores is None
    assert "--emulation" not in specs["worker-cpu1"].argv


def test_a_speed_schedule_reaches_every_worker():
    specs = plan_roles(config(speed_schedule="cpu1:1@0,6@30"), Hosts(PS, (FAST, SLOW)))
    workers = [s for s in specs if s.kind == "worker"]
    assert {_flag(s.argv, "--speed-schedule") for s in workers} == {"cpu1:1@0,6@30"}


@pytest.mark.parametrize("argv, message", [
    (["--speed-schedule", "cpu7:2@3"], "no device 'cpu7'"),
    (["--speed-schedule", "cpu1:fast@3"], "'fast'"),
    (["--speed-schedule", "cpu1:0.5@3"], "must be >= 1"),
    (["--emulation", "cpu-cap", "--backend", "kubernetes", "--emit", "k8s"], "needs --backend local"),
    (["--cpu-share", "0"], "--cpu-share"),
])
def test_bad_emulation_flags_are_refused_with_the_reason(tmp_path, argv, message):
    from esync.common.errors import UsageError
    from esync.launch.flags import parse
    (tmp_path / "data" / "fashion-mnist").mkdir(parents=True)
    with pytest.raises(UsageError, match=message):
        parse(build_parser(), ["-ld", str(tmp_path), "-dd", str(tmp_path / "data"),
                               "--workers", "2", *argv])


@pytest.mark.parametrize("split, classes", [
    ("1", [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]), ("0", [None, None])])
def test_cluster_json_names_each_devices_shard_and_its_classes(tmp_path, fashion_data_dir,
                                                                 split, classes):
    from esync.launch.flags import parse
    parser = build_parser()
    args = parse(parser, ["-ld", str(tmp_path), "-dd", str(fashion_data_dir), "--workers", "2",
                          "--slowdown", "1,4", "-s", split, "--emulation", "sleep"])
    placement = LocalCluster(args, parser).placement()
    assert [(p["device"], p["shard"], p["classes"], p["slowdown"], p["cpu_cores"])
            for p in placement] == [("cpu0", 0, classes[0], 1.0, None),
                                    ("cpu1", 1, classes[1], 4.0, None)]


def _no_cgroups(*args, **kwargs):
    from esync.emulation.cgroups import CgroupsUnavailable
    raise CgroupsUnavailable("CPU caps need root to create cgroups")


def test_without_cgroups_auto_falls_back_to_sleeping_with_one_warning(tmp_path, monkeypatch,
                                                                     capsys):
    from esync.emulation import cgroups
    from esync.launch.backends import local
    monkeypatch.setattr(cgroups, "CpuCaps", _no_cgroups)
    args = build_parser().parse_args(["-ld", str(tmp_path), "--workers", "2"])
    args.slowdowns = [1.0, 4.0]
    assert local.cpu_caps(args) == (None, None)
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "need root" in warning[0] and "sleeping" in warning[0]


def test_without_cgroups_an_explicit_cpu_cap_is_an_error(tmp_path, monkeypatch):
    from esync.common.errors import UsageError
    from esync.emulation import cgroups
    from esync.launch.backends import local
    monkeypatch.setattr(cgroups, "CpuCaps", _no_cgroups)
    args = build_parser().parse_args(["-ld", str(tmp_path), "--workers", "2",
                                      "--emulation", "cpu-cap"])
    args.slowdowns = [1.0, 4.0]
    with pytest.raises(UsageError, match="--emulation cpu-cap: CPU caps need root"):
        local.cpu_caps(args)


@pytest.mark.parametrize("split, want", [
    ("0", ["weighted", "0.9", "--nesterov", "0.7"]),
    ("1", ["sum", "0.0", "--no-nesterov", "1.0"]),
    ("2", ["sum", "0.9", "--no-nesterov", "0.01", "--outer-adam"]),
])
def test_aggregation_defaults_follow_the_data_split_and_yield_to_the_user(
        tmp_path, fashion_data_dir, split, want):
    from esync.launch.flags import parse

    def aggregation_of(*extra):
        parser = build_parser()
        args = parse(parser, ["-ld", str(tmp_path), "-dd", str(fashion_data_dir), "--workers",
                              "2", "-s", split, *extra])
        worker = next(s for s in LocalCluster(args, parser).plan() if s.kind == "worker")
        argv = worker.argv
        return [argv[argv.index("--aggregation") + 1],
                argv[argv.index("--outer-momentum") + 1],
                "--nesterov" if "--nesterov" in argv else "--no-nesterov",
                argv[argv.index("--global-lr") + 1]] + [f for f in argv if f == "--outer-adam"]
    assert aggregation_of() == want
    # a momentum given by hand is a momentum, with the momentum's outer rate (1 on -s 2)
    assert aggregation_of("--aggregation", "mean", "--outer-momentum", "0.5") == [
        "mean", "0.5", "--nesterov" if split == "0" else "--no-nesterov", want[3]
        if split != "2" else "1.0"]
    assert aggregation_of("--outer-momentum", "0")[1:3] == ["0.0", "--no-nesterov"]
    # Adam asked for on any split: no Nesterov form, and Adam's step size unless -gl is given
    assert aggregation_of("--outer-adam")[2:] == ["--no-nesterov", "0.01", "--outer-adam"]
    assert aggregation_of("--outer-adam", "-gl", "0.003")[3] == "0.003"


@pytest.mark.parametrize("extra, want", [
    ([], ("--no-accumulate", 0.00078125)),
    (["-s", "1"], ("--accumulate", 9.5e-05)),
    (["-s", "2"], ("--no-accumulate", 3e-04)),
    (["-s", "1", "-ll", "0.001"], ("--accumulate", 0.001)),
    (["-s", "1", "--no-accumulate"], ("--no-accumulate", 9.5e-05)),
    (["-s", "1", "--prox-mu", "0.1"], ("--no-accumulate", 9.5e-05)),
    (["-s", "1", "-m", "sync"], ("--no-accumulate", 9.5e-05)),
    (["--accumulate"], ("--accumulate", 0.00078125)),
], ids=["iid", "by-class", "shuffled", "user-rate", "user-off", "prox", "sync", "user-on"])
def test_by_class_order_accumulates_gradients_at_its_own_rate_by_default(
        tmp_path, fashion_data_dir, extra, want):
    """-s 1: ESync sums its local iterations' gradients at the round's model, at -ll 9.5e-05;
    a flag that needs local steps (--prox-mu, --scaffold, --overlap), another mode or the
    user's own choice turns it off; a -ll given wins."""
    from esync.launch.flags import parse
    parser = build_parser()
    args = parse(parser, ["-ld", str(tmp_path), "-dd", str(fashion_data_dir), "--workers", "2",
                          *extra])
    argv = next(s for s in LocalCluster(args, parser).plan() if s.kind == "worker").argv
    got = ("--accumulate" if "--accumulate" in argv else "--no-accumulate",
           float(argv[argv.index("--local-lr") + 1]))
    assert got == want
    assert ("--accumulate" in argv) != ("--no-accumulate" in argv)


@pytest.mark.parametrize("extra, want", [
    ([], (1.0, False, 0)),
    (["--net", "netns"], (1.0, False, 0)),
    (["--net", "netns", "--bandwidth", "1mbit"], (0.2, False, 32)),
    (["--net", "netns", "--server-bandwidth", "1mbit"], (0.2, False, 32)),
    (["--backend", "ssh"], (0.2, False, 32)),
    (["--net", "netns", "--bandwidth", "1mbit", "--low-rank", "0"], (0.1, True, 0)),
    (["--backend", "ssh", "--overlap"], (0.1, True, 0)),
    (["--net", "netns", "--bandwidth", "1mbit", "--comm-dtype", "float16"], (0.1, True, 0)),
    (["-s", "1", "--net", "netns", "--bandwidth", "1mbit"], (1.0, False, 0)),
    (["-s", "2"], (1.0, False, 0)),
    (["--comm-share", "0.3", "--overlap"], (0.3, True, 0)),
    (["--net", "netns", "--bandwidth", "1mbit", "--comm-share", "1", "--no-overlap"],
     (1.0, False, 32)),
], ids=["loopback", "netns-unshaped", "shaped-hosts", "shaped-server", "ssh",
        "shaped-full-deltas", "ssh-overlap", "shaped-float16", "by-class-shaped",
        "shuffled-loopback", "user-loopback", "user-shaped"])
def test_rounds_stretch_and_overlap_by_default_only_where_links_cost(
        tmp_path, fashion_data_dir, extra, want):
    """i.i.d. data over free links: rounds of one slowest iteration, no overlap (measured best
    there); over shaped or other machines' links: rank-32 deltas (PowerSGD) in rounds stretched
    to a communication share of 0.2, not overlapped, or, with the deltas in full (--low-rank 0,
    or what excludes factors: --overlap, float16), rounds stretched to 0.1, overlapped; by
    class: rounds of one slowest iteration, never overlapped."""
    from esync.launch.flags import parse
    if "--backend" in extra:                   # ssh places the workers by its host file
        hostfile = tmp_path / "hosts"
        hostfile.write_text("10.0.0.1 cpu\n10.0.0.2 cpu\n")
        placement = ["--hostfile", str(hostfile)]
    else:
        placement = ["--workers", "2"]
    args = parse(build_parser(), ["-ld", str(tmp_path), "-dd", str(fashion_data_dir),
                                  *placement, *extra])
    assert (args.comm_share, args.overlap, args.low_rank) == want
    if "--net" not in extra and "--backend" not in extra:   # what the workers are told
        worker = next(s for s in LocalCluster(args, build_parser()).plan() if s.kind == "worker")
        argv = worker.argv
        assert float(argv[argv.index("--comm-share") + 1]) == want[0]
        assert int(argv[argv.index("--low-rank") + 1]) == want[2]
        assert ("--overlap" if want[1] else "--no-overlap") in argv


@pytest.mark.parametrize("extra, want", [
    ([], True),
    (["--net", "netns"], True),
    (["--net", "netns", "--bandwidth", "1mbit"], True),
    (["--net", "netns", "--bandwidth", "1mbit", "--low-rank", "0"], False),
    (["--net", "netns", "--bandwidth", "1mbit", "--no-carry"], False),
    (["--net", "netns", "--bandwidth", "1mbit", "-s", "1"], False),
    (["--net", "netns", "--bandwidth", "1mbit", "-m", "sync"], False),
    (["--net", "netns", "--bandwidth", "1mbit", "--local-iters", "2"], False),
    (["--carry"], True),
    (["--no-carry"], False),
    (["-s", "2"], False),
], ids=["loopback", "netns-unshaped", "shaped-low-rank", "shaped-full-deltas-overlapped",
        "user-no-carry", "shaped-by-class", "shaped-sync", "shaped-fixed-k", "user-loopback",
        "user-no-carry-loopback", "loopback-by-class"])
def test_fast_devices_carry_iterations_by_default_where_the_exchange_is_not_overlapped(
        tmp_path, fashion_data_dir, extra, want):
    """--carry on i.i.d. data wherever the exchange is not overlapped (free links; the rank-32
    default on links that cost), never where something given excludes it or on by-class data;
    the workers are told."""
    from esync.launch.flags import parse
    args = parse(build_parser(), ["-ld", str(tmp_path), "-dd", str(fashion_data_dir),
                                  "--workers", "2", *extra])
    assert args.carry is want
    if "--net" not in extra:         # what the workers are told (loopback plan: no root needed)
        worker = next(s for s in LocalCluster(args, build_parser()).plan() if s.kind == "worker")
        assert ("--carry" if want else "--no-carry") in worker.argv


@pytest.mark.parametrize("extra, want", [
    ([], "float32"),
    (["--net", "netns"], "float32"),
    (["--net", "netns", "--bandwidth", "1mbit"], "float32"),
    (["--net", "netns", "--bandwidth", "1mbit", "--low-rank", "0"], "float16"),
    (["--net", "netns", "--server-bandwidth", "1mbit", "--overlap"], "float16"),
    (["--net", "netns", "--bandwidth", "1mbit", "--low-rank", "0", "--comm-dtype", "float32"],
     "float32"),
    (["--comm-dtype", "float16"], "float16"),
    (["--net", "netns", "--bandwidth", "1mbit", "-m", "sync"], "float32"),
], ids=["loopback", "netns-unshaped", "shaped-low-rank", "shaped-full-deltas",
        "shaped-server-overlap", "user-float32", "user-float16", "shaped-sync"])
def test_full_deltas_travel_as_float16_by_default_only_on_shaped_links(
        tmp_path, fashion_data_dir, extra, want):
    """Float16 halves a full exchange; low-rank factors (the shaped-link default) stay float32."""
    from esync.launch.flags import parse
    args = parse(build_parser(), ["-ld", str(tmp_path), "-dd", str(fashion_data_dir),
                                  "--workers", "2", *extra])
    assert args.comm_dtype == want
    if "--net" not in extra:         # what the workers are told (loopback plan: no root needed)
        worker = next(s for s in LocalCluster(args, build_parser()).plan() if s.kind == "worker")
        assert worker.argv[worker.argv.index("--comm-dtype") + 1] == want


@pytest.mark.parametrize("extra", [[], ["--net", "netns", "--bandwidth", "1mbit"]],
                         ids=["loopback", "shaped"])
def test_low_rank_deltas_are_not_overlapped_and_stretch_less(tmp_path, fashion_data_dir, extra):
    """With --low-rank an exchange costs a few percent of the model: no overlap, float32
    factors, rounds of one slowest iteration on free links and stretched to a communication
    share of 0.2 (not full deltas' 0.1) on links that cost, unless the user says otherwise;
    asked with --overlap it is refused, not dropped."""
    from esync.common.errors import UsageError
    from esync.launch.flags import parse
    args = parse(build_parser(), ["-ld", str(tmp_path), "-dd", str(fashion_data_dir),
                                  "--workers", "2", "--low-rank", "4", *extra])
    assert (args.comm_share, args.overlap, args.comm_dtype, args.low_rank) == (
        0.2 if extra else 1.0, False, "float32", 4)
    if not extra:
        worker = next(s for s in LocalCluster(args, build_parser()).plan() if s.kind == "worker")
        assert worker.argv[worker.argv.index("--low-rank") + 1] == "4"
    with pytest.raises(UsageError, match="--low-rank: --overlap"):
        parse(build_parser(), ["-ld", str(tmp_path), "-dd", str(fashion_data_dir),
                               "--workers", "2", "--low-rank", "4", "--overlap", *extra])
