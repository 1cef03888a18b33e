"""What a run uses, resolved once (esync.common.presets): defaults, the presets the situation
selects, the user's flags; --explain shows each value's source without starting anything."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from esync.common import presets
from esync.common.presets import Preset, Situation, resolve
from support import REPO, processes_mentioning, run_cluster


def explained(*argv, env=None, tool="esync.launch"):
    """{flag: (value, source)} of `esync-cluster --explain` (or main.py), and its stderr."""
    command = ([sys.executable, "-m", tool] if tool == "esync.launch"
               else [sys.executable, str(REPO / "main.py")])
    done = subprocess.run([*command, "--explain", *map(str, argv)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if line.startswith("  --") and len(parts) >= 3:
            rows[parts[0]] = (parts[1], " ".join(parts[2:]))
    return rows, done


def hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return path


# -- the pure function

def test_a_preset_applies_where_its_situation_holds_and_the_user_wins_over_it():
    table = (Preset("p", lambda s, v: s.split == 1, {"a": 2, "b": 3}, "when -s 1", "docs"),)
    got = resolve({"a": 1, "b": 1, "c": 1}, Situation(split=1, user={"b": 9}), presets=table)
    assert dict(got.values) == {"a": 2, "b": 9, "c": 1}
    assert dict(got.sources) == {"a": "preset p", "b": "user flag", "c": "default"}
    assert got.presets == ("p",)
    assert resolve({"a": 1}, Situation(split=0), presets=table).sources["a"] == "default"


def test_a_preset_value_that_cannot_be_combined_yields_and_says_why():
    table = (Preset("p", lambda s, v: True, {"low_rank": 32}, "always", "docs"),)
    got = resolve({"low_rank": 0, "overlap": False}, Situation(user={"overlap": True}),
                  excluded=lambda o, v: "--overlap" if v["overlap"] and v[o] else None,
                  presets=table)
    assert (got.values["low_rank"], got.sources["low_rank"]) == (0, "default")
    assert got.yielded["low_rank"] == "preset p yielded: --overlap"


def test_later_presets_see_what_earlier_ones_chose():
    table = (Preset("first", lambda s, v: True, {"low_rank": 32}, "always", "docs"),
             Preset("factors", lambda s, v: bool(v["low_rank"]), {"share": 0.2}, "if", "docs"),
             Preset("full", lambda s, v: not v["low_rank"], {"share": 0.1}, "else", "docs"))
    got = resolve({"low_rank": 0, "share": 1.0}, Situation(), presets=table)
    assert (got.values["share"], got.presets) == (0.2, ("first", "factors"))


def test_every_preset_names_its_condition_and_its_evidence():
    for preset in presets.PRESETS:
        assert preset.condition and preset.evidence.startswith("docs/"), preset.name
    assert len({p.name for p in presets.PRESETS}) == len(presets.PRESETS)


# -- each situation, as esync-cluster --explain prints it

def test_the_demo_cluster_on_free_links(tmp_path):
    rows, _ = explained("-ld", tmp_path)
    assert rows["--network"] == ("lenet", "preset demo")
    assert rows["--max-seconds"] == ("90", "preset demo")
    assert rows["--slowdown"] == ("1,1,4,8", "preset demo-slowdown")
    assert rows["--aggregation"] == ("weighted", "preset iid")
    assert rows["--comm-share"] == ("1", "preset cheap-exchange")
    assert rows["--carry"] == ("on", "preset iid-carry")
    assert rows["--low-rank"] == ("0", "default")


def test_a_costly_exchange_gets_rank_32_factors_in_stretched_rounds(tmp_path):
    """1 Mbit on each worker's link: pushing lenet takes 14 s, many slowest iterations."""
    rows, done = explained("-ld", tmp_path, "--net", "netns", "--bandwidth", "1mbit")
    assert rows["--low-rank"] == ("32", "preset costly-exchange")
    assert rows["--comm-share"] == ("0.2", "preset costly-exchange-factors")
    assert rows["--comm-dtype"] == ("float32", "default")
    ratio = re.search(r"exchange / slowest iteration: ([0-9.]+) \(costly", done.stdout)
    assert ratio and float(ratio.group(1)) >= presets.COSTLY_EXCHANGE, done.stdout


def test_a_cheap_exchange_over_shaped_links_gets_the_free_links_rule(tmp_path):
    """10 Gbit: an exchange takes 6 ms, a sliver of the x8 device's iteration."""
    rows, done = explained("-ld", tmp_path, "--net", "netns", "--bandwidth", "10gbit",
                           "--server-bandwidth", "10gbit")
    assert rows["--low-rank"] == ("0", "default")
    assert rows["--comm-share"] == ("1", "preset cheap-exchange")
    assert rows["--overlap"] == ("off", "preset cheap-exchange")
    assert rows["--comm-dtype"] == ("float32", "default")
    assert rows["--carry"] == ("on", "preset iid-carry")
    ratio = re.search(r"exchange / slowest iteration: ([0-9.]+) \(cheap", done.stdout)
    assert ratio and float(ratio.group(1)) < presets.COSTLY_EXCHANGE, done.stdout
    assert "measured on a free core" in done.stdout


def test_free_links_need_no_probe_and_say_why_the_exchange_is_cheap(tmp_path):
    _, done = explained("-ld", tmp_path)
    assert "exchange / slowest iteration: 0.00 (cheap" in done.stdout
    assert "no link rate" in done.stdout and "measured" not in done.stdout


def test_flags_that_settle_the_exchange_rule_leave_nothing_to_measure(tmp_path):
    _, done = explained("-ld", tmp_path, "--net", "netns", "--bandwidth", "1mbit",
                        "--low-rank", "32", "--comm-share", "1", "--no-overlap")
    assert "exchange / slowest iteration" not in done.stdout


def test_a_user_flag_overrides_the_preset_and_what_depends_on_it_follows(tmp_path):
    rows, done = explained("-ld", tmp_path, "--net", "netns", "--bandwidth", "1mbit",
                           "--low-rank", "0")
    assert rows["--low-rank"] == ("0", "user flag")
    assert rows["--comm-share"] == ("0.1", "preset costly-exchange-full")
    assert rows["--overlap"] == ("on", "preset costly-exchange-full")
    assert rows["--comm-dtype"] == ("float16", "preset shaped-full")
    assert rows["--carry"] == ("off", "default")
    assert "carry: preset iid-carry yielded: --overlap" in done.stdout


def test_remote_hosts_get_the_originals_training_defaults_and_no_slowdown(tmp_path):
    hosts = hostfile(tmp_path, "10.0.0.1 gpu0,gpu1,cpu\n10.0.0.2 gpu0,gpu1,cpu\n")
    rows, done = explained("-ld", tmp_path, "--backend", "ssh", "--hostfile", hosts)
    assert rows["--network"] == ("resnet18-v1", "default")
    assert rows["--max-seconds"] == ("0", "default")
    assert rows["--slowdown"] == ("1", "default")
    assert rows["--workers"] == ("6", "placed by --backend ssh")
    assert rows["--low-rank"] == ("32", "preset costly-exchange")
    assert "exchange / slowest iteration: unknown (costly" in done.stdout
    assert "note:" not in done.stderr


def test_the_demo_network_asked_for_on_remote_hosts_gets_a_one_line_notice(tmp_path):
    hosts = hostfile(tmp_path, "10.0.0.1 cpu\n10.0.0.2 cpu\n")
    rows, done = explained("-ld", tmp_path, "--backend", "ssh", "--hostfile", hosts,
                           "-n", "lenet")
    assert rows["--network"] == ("lenet", "user flag")
    notes = [line for line in done.stderr.splitlines() if "note:" in line]
    assert len(notes) == 1 and "demo" in notes[0]


def test_gpu_devices_on_this_machine_are_not_the_demo(tmp_path):
    rows, _ = explained("-ld", tmp_path, "--workers", "4", "--devices", "gpu0,gpu1,cpu,cpu")
    assert rows["--network"] == ("resnet18-v1", "default")
    assert rows["--slowdown"] == ("1", "default")


@pytest.mark.parametrize("split, aggregation, source, outer", [
    ("1", "sum", "preset class-ordered", ("--accumulate", "on", "preset class-ordered")),
    ("2", "sum", "preset class-shuffled", ("--outer-adam", "on", "preset class-shuffled-adam")),
])
def test_by_class_data_gets_its_own_rule(tmp_path, split, aggregation, source, outer):
    rows, _ = explained("-ld", tmp_path, "-s", split)
    assert rows["--aggregation"] == (aggregation, source)
    assert rows[outer[0]] == outer[1:]
    assert rows["--comm-share"] == ("1", "default")


def test_a_momentum_given_on_class_shuffled_data_keeps_a_momentum_step(tmp_path):
    rows, _ = explained("-ld", tmp_path, "-s", "2", "--outer-momentum", "0.5")
    assert rows["--outer-adam"] == ("off", "default")
    assert rows["--global-lr"] == ("1", "default")


def test_explain_starts_and_contacts_nothing(tmp_path):
    """An unreachable host and a missing data folder: --explain still prints and exits at once,
    and leaves no folder and no process behind."""
    hosts = hostfile(tmp_path, "203.0.113.9 cpu\n")
    logs = tmp_path / "logs"
    rows, _ = explained("-ld", logs, "-dd", tmp_path / "no-data", "--backend", "ssh",
                        "--hostfile", hosts)
    assert rows["--backend"] == ("ssh", "user flag")
    assert not logs.exists()
    assert processes_mentioning(str(logs)) == []


def test_main_py_explains_config_defaults_without_a_cluster(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DMLC_ROLE": "worker"}    # no DMLC_PS_* variables at all
    rows, done = explained("-m", "esync", "-ll", "0.01", tool="main.py", env=env)
    assert rows["--local-lr"] == ("0.01", "user flag")
    assert rows["--network"] == ("resnet18-v1", "default")
    assert rows["--aggregation"] == ("mean", "default")
    assert "DMLC_ROLE=worker" in done.stdout


def test_help_shows_what_the_presets_set_from_the_same_table():
    done = subprocess.run([sys.executable, "-m", "esync.launch", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    text = " ".join(done.stdout.split())
    assert "32 by preset costly-exchange" in text
    assert "lenet by preset demo" in text


def test_no_help_string_is_patched_after_the_parser_is_built():
    hits = [p for p in (REPO / "esync").rglob("*.py") if "_option_string_actions" in p.read_text()]
    assert hits == []


def test_a_cluster_run_records_the_resolution_in_run_json(tmp_path, fashion_data_dir):
    run_cluster(tmp_path, fashion_data_dir, "--workers", "2", "--slowdown", "1", "-b", "8",
                "--max-rounds", "2", "--no-evaluator", "-e", "1")
    run = json.loads((tmp_path / "lenet" / "esync" / "run.json").read_text())
    resolved = run["resolved"]
    assert resolved["sources"]["network"] == "preset demo"
    assert resolved["sources"]["slowdown_list"] == "user flag"
    assert "iid" in resolved["presets"] and resolved["values"]["aggregation"] == "weighted"
    assert resolved["situation"]["exchange_ratio"] == 0.0      # loopback: no link rate
    assert "cheap-exchange" in resolved["presets"]
    assert run["network"] == "lenet"        # rank 0's own record of its flags stays beside it


def test_explain_shows_what_each_worker_gets_of_the_machine(tmp_path):
    _, demo = explained("-ld", tmp_path)
    assert "devices emulated (CPU caps, pinning, one compute thread each)" in demo.stdout
    _, real = explained("-ld", tmp_path, "--workers", "3", "--devices", "gpu0,gpu1,cpu")
    assert "devices real (nothing capped)" in real.stdout
    assert "gpu1: CUDA_VISIBLE_DEVICES=1" in real.stdout


def test_the_record_never_holds_the_state_token():
    got = resolve({"state_token": "s3cret", "network": "lenet"},
                  Situation(user={"state_token": "s3cret"}))
    assert "s3cret" not in json.dumps(got.record())
