"""Protobuf wire definitions (pprof, Pyroscope types/push/querier) and their generated modules."""
