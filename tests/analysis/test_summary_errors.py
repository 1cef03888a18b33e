"""summary: bad input gets one clear line naming the file, exit code 2, and no summary file."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from esync.analysis import summary

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_main(network_dir, mode, capsys):
    code = summary.main(["-b", str(network_dir.parent), "-n", network_dir.name, "-m", mode])
    return code, capsys.readouterr().err


def damage(path, edit):
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def test_missing_mode_folder(fresh_network_dir, capsys):
    code, err = run_main(fresh_network_dir, "dcasgd", capsys)
    assert code == 2
    assert str(fresh_network_dir / "dcasgd") in err and "not found" in err


def test_empty_mode_folder(fresh_network_dir, capsys):
    (fresh_network_dir / "dcasgd" / "alpha" / "gpu0").mkdir(parents=True)
    code, err = run_main(fresh_network_dir, "dcasgd", capsys)
    assert code == 2
    assert str(fresh_network_dir / "dcasgd") in err and "no device logs" in err


def test_gap_in_numbering_names_the_missing_file(fresh_network_dir, capsys):
    missing = fresh_network_dir / "sync" / "beta" / "cpu1" / "iter-3.txt"
    missing.unlink()
    code, err = run_main(fresh_network_dir, "sync", capsys)
    assert code == 2
    assert str(missing) in err and "missing" in err


def test_numbering_must_start_at_one(fresh_network_dir, capsys):
    first = fresh_network_dir / "sync" / "alpha" / "gpu0" / "iter-1.txt"
    first.unlink()
    code, err = run_main(fresh_network_dir, "sync", capsys)
    assert code == 2 and str(first) in err


def test_corrupt_file_is_named(fresh_network_dir, capsys):
    bad = fresh_network_dir / "esync" / "alpha" / "cpu0" / "iter-2.txt"
    bad.write_text('{"num_iters": 2, "time": {')
    code, err = run_main(fresh_network_dir, "esync", capsys)
    assert code == 2
    assert str(bad) in err and "corrupt JSON" in err


def test_missing_key_names_file_and_key(fresh_network_dir, capsys):
    bad = fresh_network_dir / "esync" / "beta" / "gpu0" / "iter-3.txt"
    damage(bad, lambda r: r.pop("total_time"))
    code, err = run_main(fresh_network_dir, "esync", capsys)
    assert code == 2
    assert str(bad) in err and "'total_time'" in err


def test_ill_typed_value_names_file_and_key(fresh_network_dir, capsys):
    bad = fresh_network_dir / "esync" / "beta" / "gpu0" / "iter-1.txt"
    damage(bad, lambda r: r.update(num_samples="many"))
    code, err = run_main(fresh_network_dir, "esync", capsys)
    assert code == 2
    assert str(bad) in err and "'num_samples'" in err


def test_corrupt_evaluations_line_is_named(fresh_network_dir, capsys):
    path = fresh_network_dir / "esync" / "evaluations.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = '{"round": 2, "total_time": 2.0'
    path.write_text("\n".join(lines) + "\n")
    code, err = run_main(fresh_network_dir, "esync", capsys)
    assert code == 2
    assert f"{path} line 2" in err


def test_no_summary_is_written_on_error(fresh_network_dir, capsys):
    (fresh_network_dir / "esync" / "alpha" / "gpu0" / "iter-2.txt").write_text("garbage")
    run_main(fresh_network_dir, "esync", capsys)
    assert not (fresh_network_dir / "esync" / "ESync.json").exists()
    assert not list((fresh_network_dir / "esync").glob(".*tmp"))


def test_summarize_raises_log_error(fresh_network_dir):
    (fresh_network_dir / "esync" / "alpha" / "gpu0" / "iter-2.txt").write_text("[1, 2]")
    with pytest.raises(summary.LogError, match="expected a JSON object"):
        summary.summarize(fresh_network_dir / "esync")


def test_command_line_error_is_one_line_without_traceback(fresh_network_dir):
    bad = fresh_network_dir / "sync" / "alpha" / "cpu0" / "iter-4.txt"
    bad.write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "analysis/summary.py", "-b", str(fresh_network_dir.parent), "-n",
         "lenet", "-m", "sync"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert str(bad) in proc.stderr


def test_a_nan_loss_written_by_an_earlier_version_is_summarised(fresh_network_dir, capsys):
    log = fresh_network_dir / "esync" / "alpha" / "cpu0" / "iter-2.txt"
    log.write_text(log.read_text().rstrip()[:-1] + ', "train_loss": NaN}')
    code, err = run_main(fresh_network_dir, "esync", capsys)
    assert code == 0, err


def test_a_nan_where_a_number_is_needed_names_file_and_key(fresh_network_dir, capsys):
    bad = fresh_network_dir / "esync" / "alpha" / "cpu0" / "iter-2.txt"
    record = json.loads(bad.read_text())
    record["total_time"] = float("nan")
    bad.write_text(json.dumps(record))
    code, err = run_main(fresh_network_dir, "esync", capsys)
    assert code == 2
    assert str(bad) in err and "'total_time'" in err
