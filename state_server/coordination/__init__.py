"""The coordination API of the ESync state server: jobs, per-round decisions, round history."""
