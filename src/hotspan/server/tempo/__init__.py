"""Tempo's APIs: the HTTP API, TraceQL metrics and the streaming gRPC service."""
