"""The README's "On your own machines" command runs as shown, against the ssh test host: its
hostfile and shared folders replaced by the test's, the budget made small (flags given later win
in argparse), everything else the README's own words."""
import re
import shlex

from support import REPO, device_logs, run_cluster, write_fashion_dir

SMALL_BUDGET = ["-n", "lenet", "-b", "8", "-e", "1", "--max-rounds", "3",
                "--target-accuracy", "0"]


def readme_ssh_command() -> list[str]:
    """The arguments of the README's `esync-cluster --backend ssh` command."""
    text = (REPO / "README.md").read_text()
    match = re.search(r"^\.venv/bin/esync-cluster (--backend ssh (?:.*\\\n)*.*)$", text,
                      re.MULTILINE)
    assert match, "README.md shows no `.venv/bin/esync-cluster --backend ssh ...` command"
    return shlex.split(match.group(1).replace("\\\n", " "))


def replaced(argv: list[str], values: dict) -> list[str]:
    """``argv`` with the value of each flag in ``values`` replaced (None: flag dropped)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in values:
            out += [arg, values[arg]] if values[arg] is not None else []
            skip = True
        else:
            out.append(arg)
    return out


def test_the_readme_ssh_command_is_complete():
    argv = readme_ssh_command()
    for flag in ("--hostfile", "-ld", "-dd", "-n", "-ll", "--max-seconds"):
        assert flag in argv, f"the README's ssh command lacks {flag}"


def test_the_readme_ssh_command_runs_on_the_ssh_test_host(sshd, tmp_path):
    argv = readme_ssh_command()
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1 cpu,cpu\n")
    data = write_fashion_dir(tmp_path / "data")
    # run_cluster gives -ld and -dd itself
    argv = replaced(argv, {"--hostfile": str(hosts), "-ld": None, "-dd": None})
    run_cluster(tmp_path / "logs", data, *argv, "--ssh-config", sshd.ssh_config, *SMALL_BUDGET,
                timeout=400)
    logs = device_logs(tmp_path / "logs" / "lenet" / "esync")
    assert {name: len(rounds) for name, rounds in logs.items()} == {"cpu0": 3, "cpu1": 3}
