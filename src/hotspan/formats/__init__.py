"""Wire formats: pprof, folded/lines, speedscope, and the protobuf messages of the APIs."""
