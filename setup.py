"""Builds the optional C fast path; without a compiler hotspan installs pure Python."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
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


setup(
    ext_modules=[
        Extension(
            "hotspan._speedups._pprof",
            ["src/hotspan/_speedups/pprof.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        ),
        Extension(
            "hotspan._speedups._sampler",
            ["src/hotspan/_speedups/sampler.c"],
            depends=["src/hotspan/_speedups/sampler_api.h"],
            extra_compile_args=["-O2", "-std=gnu11"],
            libraries=["rt"],
            optional=True,
        ),
        # Allocations and live heap: an allocator hook (uses _sampler's stack and labels).
        Extension(
            "hotspan._speedups._alloc",
            ["src/hotspan/_speedups/alloc.c"],
            depends=["src/hotspan/_speedups/sampler_api.h"],
            extra_compile_args=["-O2", "-std=gnu11"],
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
        # Lock contention: a lock wrapper whose uncontended acquire costs next to nothing.
        Extension(
            "hotspan._speedups._locks",
            ["src/hotspan/_speedups/locks.c"],
            depends=["src/hotspan/_speedups/sampler_api.h"],
            extra_compile_args=["-O2", "-std=gnu11"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
