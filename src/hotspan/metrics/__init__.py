"""Prometheus metrics: recording rules (profile data as time series) and the server's own
operational metrics, both exported on ``GET /metrics``."""
