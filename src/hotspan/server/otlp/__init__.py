"""The OpenTelemetry receivers: OTLP/HTTP and OTLP/gRPC, traces and profiles."""
