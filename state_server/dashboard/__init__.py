"""The live dashboard of the state server: ``/dashboard/`` and the JSON it refreshes from."""
