"""Pull mode: Go's ``/debug/pprof`` endpoints served by this process's agent, read by
``go tool pprof`` and by scrapers (``hotspan server --scrape``, Grafana Alloy, Pyroscope).

Mount ``hotspan.debug_pprof.asgi_app()`` or ``hotspan.debug_pprof.wsgi_app()`` at
``/debug/pprof`` in the program; with ``HOTSPAN_CONTROL_PORT`` the control port answers the
same paths.  See :mod:`hotspan.agent.pull`."""

from hotspan.agent.pull import answer, asgi_app, enable, wsgi_app

__all__ = ["answer", "asgi_app", "enable", "wsgi_app"]
