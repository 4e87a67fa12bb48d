"""Profile files as the command line reads and writes them: the file formats of
``hotspan.formats`` and the UI's standalone HTML flame graph, behind one pair of calls for
``hotspan convert``, ``view``, ``export``, ``query`` and ``record``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from hotspan.cli.client import PROFILE_TYPE_ALIASES
from hotspan.formats import files, folded, pprof, speedscope
from hotspan.formats.errors import FormatError
from hotspan.formats.files import FORMATS, PathLike
from hotspan.model.stack_profile import ProfileSelectError, StackProfile


def read_profile(path: PathLike, fmt: Optional[str] = None) -> StackProfile:
    """A profile file, whatever its format (``fmt`` to insist on one)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not data.strip():
        raise FormatError(f"{path}: the file is empty")
    fmt = fmt or files.detect_format(path, data)
    if fmt not in FORMATS:
        raise FormatError(f"{fmt!r} is not a profile format (one of {', '.join(FORMATS)})")
    if fmt != "html":
        return files.read_stacks(path, data, fmt)
    # The page's code (numpy, the flame graph builder) loads only for an HTML file.
    from hotspan.ui.standalone import page_profile

    try:
        profile = page_profile(data)
    except FormatError as exc:
        raise FormatError(f"{path}: not a valid {fmt} file: {exc}") from None
    if not profile.stacks:
        raise FormatError(f"{path}: the {fmt} file has no samples")
    return profile


def write_profile(
    profile: StackProfile, fmt: str, profile_type: Optional[str] = None, title: str = ""
) -> bytes:
    """``profile`` in ``fmt``: pprof and speedscope keep every sample type; folded and html
    hold one, ``profile_type`` (by default, CPU time or else the last type)."""
    if fmt not in FORMATS:
        raise FormatError(f"{fmt!r} is not a profile format (one of {', '.join(FORMATS)})")
    # Checked for every format: a type the file does not have is a mistake to say, not to
    # pass over because pprof keeps them all.
    position = select_type(profile, profile_type)
    try:
        if fmt == "pprof":
            return pprof.write_stack_profile(profile)
        if fmt == "speedscope":
            return speedscope.write_speedscope(profile, name=title)
        if fmt == "folded":
            return folded.write_folded(profile, position)
        from hotspan.ui.standalone import flamegraph_data, standalone_html

        st = profile.sample_types[position]
        page = standalone_html(
            flamegraph_data(profile, position),
            title=title or f"hotspan flame graph · {st.type}",
            unit=st.unit,
        )
        return page.encode("utf-8")
    except (ValueError, OverflowError) as exc:
        # Values summed past what the format holds (pprof's int64) or negative (a diff).
        raise FormatError(f"the profile's values do not fit {fmt}: {exc}") from None


def select_type(profile: StackProfile, profile_type: Optional[str]) -> int:
    """The position of ``profile_type`` (what ``--profile-type`` took: a type, a full id, or
    one of the server commands' aliases such as ``lock_time``), FormatError if it has none."""
    try:
        return profile.select(profile_type)
    except ProfileSelectError as exc:
        alias = PROFILE_TYPE_ALIASES.get(profile_type or "")
        if alias is not None:
            try:
                return profile.select(alias)
            except ProfileSelectError:
                pass
        raise FormatError(str(exc)) from None
