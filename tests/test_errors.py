"""esync.common.errors: user errors are one line, and the command line and trainer import no circle."""
import subprocess
import sys

import pytest

from support import REPO
from esync.common.errors import UsageError, UserError, guarded


def test_cli_reexports_the_one_usage_error():
    from esync.cli import UsageError as from_cli
    assert from_cli is UsageError


def test_trainer_imports_without_the_command_line_module():
    probe = "import sys, esync.worker.trainer; print('esync.cli' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("error", ["esync.common.dataset.DataError",
                                   "esync.worker.measure.LogDirError",
                                   "esync.common.checkpoint.CheckpointError",
                                   "esync.worker.models.UnknownNetworkError",
                                   "esync.coordination.client.StateServerError"])
def test_every_module_error_a_user_can_fix_is_a_user_error(error):
    import importlib
    module, name = error.rsplit(".", 1)
    assert issubclass(getattr(importlib.import_module(module), name), UserError)


def test_guarded_prints_a_user_error_as_one_line_and_returns_2(capsys):
    def fail():
        raise UsageError("argument -b: must be a positive integer, got 0")
    assert guarded(fail) == 2
    assert capsys.readouterr().err == ("main.py: error: argument -b: must be a positive "
                                       "integer, got 0\n")


def test_guarded_lets_a_programming_error_keep_its_traceback():
    def bug():
        raise KeyError("bug")
    with pytest.raises(KeyError):
        guarded(bug)
