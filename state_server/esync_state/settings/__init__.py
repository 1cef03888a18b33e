"""Settings: everything lives in ``base`` and comes from the environment (see base's docstring)."""
from .base import *  # noqa: F401,F403
