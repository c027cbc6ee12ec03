"""The set of the units of a task that are done, a byte per unit.

A run of 10^6 units must not hold 10^6 Python ints to know which units it has seen: the flags
of the indices below the task's unit count live in one bytearray (1 MB for 10^6 units; a byte,
not a bit, since testing a byte is a third of the work of testing a bit in the fold's loop); an
index the count does not cover (a log whose plan has no count, a corrupt index) goes to a set,
so the answer stays exact whatever the log holds.
"""

from __future__ import annotations


class UnitFlags:
    """Which indices of a task are done: a byte for `0 <= index < units`, a set for the rest."""

    __slots__ = ("_other", "flags", "units")

    def __init__(self, units: int | None) -> None:
        self.units = max(0, units or 0)
        """The indices below this have their byte in `flags`."""
        self.flags = bytearray(self.units)
        """Byte `index` is 1 once the unit is done (what `add` sets; the fold tests and sets it
        in its own loop, which saves a call a unit)."""
        self._other: set[int] = set()

    def __contains__(self, index: object) -> bool:
        if type(index) is int and 0 <= index < self.units:
            return self.flags[index] == 1
        return index in self._other

    def add(self, index: int) -> bool:
        """Mark `index` done; whether it was not done before."""
        if 0 <= index < self.units:
            if self.flags[index]:
                return False
            self.flags[index] = 1
            return True
        if index in self._other:
            return False
        self._other.add(index)
        return True
