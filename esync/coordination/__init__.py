"""ESync's coordination: the state server's rules (plain Python that the Django views call), the
job's bookkeeping, the workers' HTTP client, and the helper that starts a state server."""
