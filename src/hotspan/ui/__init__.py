"""The web UI: static pages and scripts the server serves at ``/``.

Nothing here queries the store.  The pages call the same public APIs as any other client (the
Pyroscope querier over Connect, the Tempo trace API and ``/api/traces/{id}/spans|profile``),
so the UI is also a working proof of those APIs.
"""
