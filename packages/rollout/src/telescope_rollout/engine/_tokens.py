"""Per-token values of a finished sample as compact arrays, out of the garbage collector's way.

A step of 8,192 samples of 512 tokens held its token ids, mask and logprobs as Python lists: 12
million list slots that every full pass of the cyclic garbage collector walked, one by one, on the
event loop (0.6 to 1.6 s a pass, about 40% of the driver's CPU; tools/bench_scale.py). A
:class:`TokenArray` is a ``array.array`` (machine values in one buffer): the collector sees one
object, not its items, and NumPy reads it without a copy (``np.frombuffer``).

It compares equal to a list or tuple of the same values (``==``, ``!=``) and adds to one (``+``
gives a list), as the lists it replaces did; a slice, a copy, ``x * n`` and ``x + y`` of two are
:class:`TokenArray` s too; ``list(x)`` or ``x.tolist()`` gives a list.
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

__all__ = ["TokenArray"]

ID_CODE, MASK_CODE, FLOAT_CODE = "i", "b", "d"
"""Token ids: C int (32 bits; vocabularies are far smaller); mask: signed char; logprobs: double
(the server's float as sent, no rounding)."""


if TYPE_CHECKING:
    _Array = array.array[Any]  # generic in typeshed, not at run time before Python 3.12
else:
    _Array = array.array


class TokenArray(_Array):
    """Token ids (:meth:`ids`), a loss mask (:meth:`mask`) or logprobs (:meth:`logprobs`) of one
    sequence (module docstring)."""

    __slots__ = ()

    @classmethod
    def ids(cls, values: Iterable[int]) -> TokenArray:
        """Token ids."""
        return cls(ID_CODE, values)

    @classmethod
    def mask(cls, values: Iterable[int]) -> TokenArray:
        """A loss mask (1: a model token)."""
        return cls(MASK_CODE, values)

    @classmethod
    def ones(cls, n: int) -> TokenArray:
        """A mask of ``n`` ones (every token the model's)."""
        return cls(MASK_CODE, b"\x01" * n)

    @classmethod
    def logprobs(cls, values: Iterable[float]) -> TokenArray:
        """Logprobs."""
        return cls(FLOAT_CODE, values)

    def _same(self, values: Any) -> TokenArray:
        """``values`` (an ``array.array`` of this one's type code) as a :class:`TokenArray`."""
        return TokenArray(self.typecode, values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list | tuple):
            values = cast(Sequence[Any], other)
            return len(self) == len(values) and self.tolist() == list(values)
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        same = self.__eq__(other)
        return same if same is NotImplemented else not same

    def __getitem__(self, index: Any) -> Any:
        got = super().__getitem__(index)
        return self._same(got) if isinstance(index, slice) else got

    def __add__(self, other: Any) -> Any:
        if isinstance(other, list | tuple):
            return self.tolist() + list(cast(Sequence[Any], other))
        return self._same(super().__add__(other))

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, list | tuple):
            return list(cast(Sequence[Any], other)) + self.tolist()
        return NotImplemented

    def __mul__(self, n: Any) -> TokenArray:
        return self._same(super().__mul__(n))

    def __copy__(self) -> TokenArray:
        return self._same(self)

    def __deepcopy__(self, memo: Any) -> TokenArray:
        return self._same(self)

    __hash__ = None  # mutable, as a list

    def __repr__(self) -> str:
        return f"TokenArray({self.tolist()!r})"
