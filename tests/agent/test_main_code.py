"""``agent.main_code``: the main module's code held from wherever the agent starts, in a real
interpreter (a subprocess: the main module and the profile function are process-wide)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHECK = textwrap.dedent(
    """
    import sys, threading
    from hotspan.agent import main_code

    def start():
        main_code.keep_main_module_code()

    if {thread}:
        t = threading.Thread(target=start)
        t.start()
        t.join()
    else:
        start()
    assert main_code._kept == [sys._getframe().f_code], main_code._kept
    assert sys.getprofile() is None
    main_code.keep_main_module_code()  # once is enough
    assert len(main_code._kept) == 1
    """
)


@pytest.mark.parametrize("thread", [False, True], ids=["main thread", "another thread"])
def test_the_running_main_module_is_kept(thread: bool) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(thread=thread)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_a_watch_that_never_meets_the_main_module_gives_up() -> None:
    # As in a host that embeds Python and never runs a main module: the watch goes after
    # WATCH_LIMIT events instead of profiling the program for ever.
    program = textwrap.dedent(
        """
        import sys
        from hotspan.agent import main_code
        main_code._watch({})
        def f():
            pass
        for _ in range(main_code.WATCH_LIMIT // 2 + 10):
            f()
        assert sys.getprofile() is None
        assert main_code._kept == []
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
