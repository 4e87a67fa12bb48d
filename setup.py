"""Builds the optional C fast path; without a compiler hotspan installs pure Python."""

import os
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def finalize_options(self) -> None:
        super().finalize_options()
        # The extensions compile one per core (`pip install` builds them on every fresh
        # checkout, the test command's included).
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001
            print(f"hotspan: C speedups not built ({exc}); using the pure-Python path")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"hotspan: C speedups not built ({exc}); using the pure-Python path")


# Free-threaded CPython (3.13t, 3.14t): an extension module that does not declare itself
# free-threading safe turns the GIL back on for the whole program as it is imported, so only
# the modules made safe without it are built there: the native sampler, the allocator hook and
# the lock wrapper.  The decoders and encoders were never checked without it: there hotspan
# uses their pure-Python twins.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
FREE_THREADING_SAFE = {
    "hotspan._speedups._sampler",
    "hotspan._speedups._locks",
    "hotspan._speedups._alloc",
}

EXTENSIONS = [
    Extension(
        "hotspan._speedups._pprof",
        [
            "src/hotspan/_speedups/pprof.c",
            "src/hotspan/_speedups/inflate.c",
            "src/hotspan/_speedups/frame_cache.c",
        ],
        depends=[
            "src/hotspan/_speedups/hashing.h",
            "src/hotspan/_speedups/inflate.h",
            "src/hotspan/_speedups/frame_cache.h",
        ],
        extra_compile_args=["-O3", "-std=c11"],
        # zlib: gzipped uploads are inflated without the GIL (inflate.c).  Its header comes
        # with Python's own (libpython3-dev depends on zlib1g-dev).
        libraries=["z"],
        optional=True,
    ),
    Extension(
        "hotspan._speedups._sampler",
        [
            f"src/hotspan/_speedups/sampler/{name}.c"
            for name in (
                "labels",
                "frames",
                "state",
                "threads",
                "handler",
                "windows",
                "collector",
                "codes",
                "control",
                "span_stats",
                "linker",
                "turns",
                "module",
            )
        ],
        depends=[
            "src/hotspan/_speedups/sampler_api.h",
            "src/hotspan/_speedups/sampler/internal.h",
        ],
        extra_compile_args=["-O2", "-std=gnu11"],
        libraries=["rt"],
        optional=True,
    ),
    # Allocations and live heap: an allocator hook (uses _sampler's stack and labels).
    Extension(
        "hotspan._speedups._alloc",
        [
            f"src/hotspan/_speedups/alloc/{name}.c"
            for name in ("hooks", "sampling", "probe", "live", "stacks", "window", "module")
        ],
        depends=[
            "src/hotspan/_speedups/sampler_api.h",
            "src/hotspan/_speedups/alloc/internal.h",
        ],
        extra_compile_args=["-O2", "-std=gnu11"],
        optional=True,
    ),
    # JFR recordings to profile samples (the twin of formats/jfr.py and jfr_profiles.py).
    Extension(
        "hotspan._speedups._jfr",
        ["src/hotspan/_speedups/jfr.c"],
        depends=["src/hotspan/_speedups/hashing.h"],
        extra_compile_args=["-O2", "-std=c11"],
        optional=True,
    ),
    # The agent's pprof encoder (the twin of agent/pprof_writer.py's PyProfileWriter).
    Extension(
        "hotspan._speedups._pprof_writer",
        ["src/hotspan/_speedups/pprof_writer.c"],
        extra_compile_args=["-O2", "-std=c11"],
        optional=True,
    ),
    # Naming sampled stacks (the twin of agent/symbols.py's Symbolizer.name_stack).
    Extension(
        "hotspan._speedups._symbols",
        ["src/hotspan/_speedups/symbols.c"],
        extra_compile_args=["-O2", "-std=c11"],
        optional=True,
    ),
    # Span conditions: the span processor that judges every ended span (agent/spans.py's twin).
    Extension(
        "hotspan._speedups._spans",
        ["src/hotspan/_speedups/spans.c"],
        extra_compile_args=["-O2", "-std=gnu11"],
        optional=True,
    ),
    # OTLP spans from protobuf bytes (the twin of formats/otlp_traces.py's to_span_batch).
    Extension(
        "hotspan._speedups._otlp",
        ["src/hotspan/_speedups/otlp.c"],
        depends=["src/hotspan/_speedups/hashing.h"],
        extra_compile_args=["-O2", "-std=c11"],
        optional=True,
    ),
    # Span attributes split for the embedded store's attribute index (store/attr_index.py's).
    Extension(
        "hotspan._speedups._attrs",
        ["src/hotspan/_speedups/attrs.c"],
        extra_compile_args=["-O2", "-std=c11"],
        optional=True,
    ),
    # Lock contention: a lock wrapper whose uncontended acquire costs next to nothing.
    Extension(
        "hotspan._speedups._locks",
        ["src/hotspan/_speedups/locks.c"],
        depends=["src/hotspan/_speedups/hashing.h", "src/hotspan/_speedups/sampler_api.h"],
        extra_compile_args=["-O2", "-std=gnu11"],
        optional=True,
    ),
]

setup(
    ext_modules=[e for e in EXTENSIONS if e.name in FREE_THREADING_SAFE]
    if FREE_THREADED
    else EXTENSIONS,
    cmdclass={"build_ext": OptionalBuildExt},
)
