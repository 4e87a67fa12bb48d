"""The query engine: series selection, flame graphs, diffs, timelines and pprof output."""
