"""Backends start role specs somewhere and hand back handles (see ``base.py``)."""
