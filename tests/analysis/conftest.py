"""Fixtures for the analysis tests: hand-made log trees written by ``logmaker``."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import logmaker  # noqa: E402



@pytest.fixture(scope="module")
def network_dir(tmp_path_factory):
    """esync, sync, async and local with every extra key and the evaluator's records."""
    return logmaker.write_layout(tmp_path_factory.mktemp("logs"))


@pytest.fixture
def fresh_network_dir(tmp_path):
    """A private copy of the four modes, for tests that damage or add files."""
    return logmaker.write_layout(tmp_path / "logs")
