"""Tokens of gRPC calls checked before their request is read.

grpcio's synchronous server hands a call to a worker thread, which then waits for the request
message: a caller that sends its call's headers and never its message holds that worker for as
long as its connection lives.  The handlers check the token themselves, but only once the
message has come; so a few callers without any token could hold every worker and lock out
the agents and Grafana.  :class:`TokenCheck` looks at the call's metadata first, in the
server's own thread, and refuses a call without a valid token at once, its message never read.

The check reads the cached tokens (server.auth); reading them again from the store, when due,
is left to a thread of its own, so that no store read holds up the server's thread.  The
handlers still check each call in full: this one only keeps out calls that would be refused.
On a server that needs no token, every call passes, as every HTTP request does.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any, Callable, Dict, Optional

import grpc

from hotspan.server.auth import Access, Authenticator, grpc_tenant
from hotspan.server.errors import HTTPError

STATUS_OF_HTTP: Dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: HTTPError) -> grpc.StatusCode:
    """The gRPC status of a refusal the HTTP side would answer with ``exc.status``."""
    return STATUS_OF_HTTP.get(exc.status, grpc.StatusCode.INTERNAL)


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call with ``code``, its request never read (a streaming
    request: the worker does not wait for a message)."""

    def refuse(requests: Any, context: grpc.ServicerContext) -> None:
        context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse)


class TokenCheck(grpc.ServerInterceptor):
    """Refuses calls whose metadata holds no token valid for ``access``; ``refused`` is told
    of each (the method's full name, and the HTTP status the refusal stands for)."""

    def __init__(
        self,
        auth: Authenticator,
        access: Access,
        refused: Optional[Callable[[str, int], None]] = None,
    ) -> None:
        self.auth = auth
        self.access = access
        self.refused = refused
        self._refresher = futures.ThreadPoolExecutor(1, thread_name_prefix="hotspan-grpc-auth")
        self._refreshing: Optional[futures.Future[None]] = None
        self._lock = threading.Lock()

    def _refresh_later(self) -> None:
        with self._lock:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = self._refresher.submit(self.auth.refresh)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Optional[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Optional[grpc.RpcMethodHandler]:
        if self.auth.stale():
            self._refresh_later()
        try:
            grpc_tenant(
                self.auth,
                self.access,
                handler_call_details.invocation_metadata,
                refresh=False,
            )
        except HTTPError as exc:
            if exc.status == 503:
                # Tokens not read yet (the server just started): the handler waits for them.
                return continuation(handler_call_details)
            if self.refused is not None:
                self.refused(handler_call_details.method, exc.status)
            return _refusal(status_of(exc), exc.message)
        return continuation(handler_call_details)
