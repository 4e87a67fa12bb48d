"""Steering the agent of this process over HTTP: ``hotspan.control.asgi_app()`` and
``hotspan.control.wsgi_app()`` mount in the program; see :mod:`hotspan.agent.control`."""

from hotspan.agent.control import asgi_app, handle, wsgi_app

__all__ = ["asgi_app", "handle", "wsgi_app"]
