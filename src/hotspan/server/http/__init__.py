"""HTTP connection protocols under uvicorn: HTTP/2 (gRPC) sniffing on the main port and the
request-head deadline."""
