"""Pyroscope's APIs: /ingest and push, the Connect querier, the legacy render API and span
profiles."""
