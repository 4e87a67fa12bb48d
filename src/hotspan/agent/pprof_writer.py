"""Encoding a profile as gzipped pprof (profile.proto), in the agent's own process.

This writes the dozen fields the agent needs directly instead of importing the protobuf
runtime: loading ``profile_pb2`` costs about 6 MiB of RSS and 7,000 objects the garbage
collector then tracks in every profiled program, against an RSS budget of 10 MiB.  The test
suite decodes the output with ``protobuf`` and with ``go tool pprof``.

:class:`ProfileWriter` is the C encoder (``_speedups/pprof_writer.c``) when it is built, else
:class:`PyProfileWriter`; both give the same bytes for the same calls.  The Python one lives in
:mod:`hotspan.agent.pprof_writer_py`, imported only where it runs (it is still
``hotspan.agent.pprof_writer.PyProfileWriter``).
"""

from __future__ import annotations

from hotspan._speedups import load_module
from hotspan.agent.pprof_encoding import finish

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any

    from hotspan.agent.pprof_writer_py import PyProfileWriter


_native = load_module("_pprof_writer")

if TYPE_CHECKING:
    # The C encoder has no stubs; it has PyProfileWriter's interface.
    ProfileWriter = PyProfileWriter
elif _native is not None:

    class ProfileWriter(_native.ProfileEncoder):
        """The C encoder (same interface as :class:`PyProfileWriter`)."""

        __slots__ = ()  # no __dict__: instances stay out of the cyclic GC, as the base is

        def encode(self, time_ns: int, duration_ns: int, default_sample_type: str = "") -> bytes:
            """The profile, gzipped, as pprof is sent."""
            return finish(self.encode_raw(time_ns, duration_ns), default_sample_type)


def __getattr__(name: str) -> Any:
    # The pure-Python encoder lives in its own module, imported only where it is used (the C
    # one is not built, or a test asks for it), but keeps its name here; without the C one it
    # is ProfileWriter too.
    if name == "PyProfileWriter" or (name == "ProfileWriter" and _native is None):
        from hotspan.agent.pprof_writer_py import PyProfileWriter

        return PyProfileWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
