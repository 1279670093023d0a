"""Calls from inside the cluster to the run's own Serve application, without the HTTP proxy."""
