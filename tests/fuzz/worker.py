"""One fuzz target under atheris (libFuzzer): ``worker.py TARGET [libFuzzer options] CORPUS...``.

tests/fuzz/run.py starts one of these per target.  Python code of hotspan (and of the
multipart and Connect readers in front of it) is instrumented as it is imported, so the
fuzzer sees which branches an input reaches; the C pprof decoder adds its own coverage when it
was built with ``-fsanitize=fuzzer-no-link`` (``run.py --instrumented-c``: the module of that
build is found through HOTSPAN_FUZZ_SPEEDUPS, a directory searched before the package's own).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NAME = sys.argv[1] if len(sys.argv) > 1 else ""
BUILD = os.environ.get("HOTSPAN_FUZZ_SPEEDUPS")

# Modules imported in this block are instrumented: the decoders and the models they fill, and
# for the body target the pure-Python multipart reader.  The rest (the server's modules that
# the harness goes through) is imported after it, plainly: instrumenting all of it would cost
# each worker seconds of start for branches no input reaches.
with atheris.instrument_imports(include=["hotspan", "python_multipart", "starlette"]):
    import hotspan._speedups

    if BUILD:
        hotspan._speedups.__path__.insert(0, BUILD)
    import hotspan.formats.compression
    import hotspan.formats.folded
    import hotspan.formats.jfr
    import hotspan.formats.jfr_profiles
    import hotspan.formats.otlp
    import hotspan.formats.otlp_profiles
    import hotspan.formats.otlp_traces
    import hotspan.formats.pprof
    import hotspan.formats.pprof_decode
    import hotspan.formats.protowire
    import hotspan.formats.pyroscope_nodes
    import hotspan.formats.pyroscope_tree
    import hotspan.formats.pyroscope_trie
    import hotspan.formats.speedscope
    import hotspan.model.profile
    import hotspan.model.trace

    if NAME == "body":
        import python_multipart.multipart  # noqa: F401
        import starlette.formparsers  # noqa: F401

from tests.fuzz import targets  # noqa: E402


def main() -> None:
    if BUILD:
        import hotspan._speedups._pprof as loaded

        if not loaded.__file__.startswith(BUILD):
            sys.exit(f"the instrumented _pprof was not loaded (got {loaded.__file__})")
    atheris.Setup([sys.argv[0], *sys.argv[2:]], targets.TARGETS[NAME])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
