"""The exit code of a local process as the decider reads it: a shell's."""

from __future__ import annotations

from simrun_api.backends.local import exit_code


def test_a_signal_is_an_exit_code_above_128():
    assert exit_code(-9) == 137
    assert exit_code(-15) == 143
    assert exit_code(3) == 3
