"""Out-of-bounds stores in Pallas interpret mode.

Pallas interpret mode drops the part of a store that falls outside its ref: the ref is padded for the store
and cropped after it. On a GPU the same store writes past the block or the array: into the next row of a
whole-width block, which another program owns (a race that the GPU's timing may hide in every case), or past
the allocation. No value check sees it. So in the worker processes of `kspec verify`, which run the
`interpret` bodies and (off a GPU) the Triton bodies in interpret mode, the rule that interpret mode turns a
Pallas store into array operations (`pl.store`, `pltriton.store`: the `masked_swap` primitive) is wrapped:
it first counts the elements the store writes outside its ref, its mask left aside, and calls back to the
worker when there are any, naming the line of the store. The worker fails the task with that.

This reads jax internals (the state discharge rules of jax._src, the same in jax 0.10 and 0.11); where they
are not found, `install` returns False and verify runs without the check. Generated code never imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

_lock = threading.Lock()
_found: list = []
_installed: bool | None = None


@dataclasses.dataclass(frozen=True)
class Store:
    """One out-of-bounds store: where (the generated file and line) and what, and how many elements."""

    file: str
    line: int
    what: str  # e.g. "[0:1, 512:768] of a (1, 700) ref", the slice's start as the program computed it
    outside: int

    def describe(self) -> str:
        return f"a store to {self.what} writes {self.outside} element(s) outside it"


def install() -> bool:
    """Wrap the discharge rule of Pallas's masked store once per process; whether the check is on."""
    global _installed
    if _installed is not None:
        return _installed
    try:
        from jax._src.pallas import primitives as pallas_primitives
        from jax._src.state import discharge

        original = discharge._discharge_rules[pallas_primitives.swap_p]
    except (ImportError, AttributeError, KeyError):
        _installed = False
        return False

    def checked(in_avals, out_avals, *args_flat, args_tree, **params):
        ref, transforms, val, mask = args_tree.unflatten(args_flat)
        _check(transforms, val, mask)
        return original(in_avals, out_avals, *args_flat, args_tree=args_tree, **params)

    discharge._discharge_rules[pallas_primitives.swap_p] = checked
    _installed = True
    return True


def take() -> list:
    """The out-of-bounds stores recorded since the last call, the first of each line, and forget them."""
    with _lock:
        first: dict = {}
        for store in _found:
            first.setdefault((store.file, store.line), store)
        _found.clear()
    return list(first.values())


def _check(transforms, val, mask) -> None:
    """Stage the count of the elements this store writes outside its ref (mask True, index out of range), and
    a host callback when it is not zero."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax._src import source_info_util
    from jax._src.state import indexing

    if not transforms or not isinstance(transforms[-1], indexing.NDIndexer):
        return  # the whole ref: in bounds
    idx = transforms[-1]
    shape = tuple(idx.shape)
    outside, starts, sizes, axes = None, [], [], []
    for s, n in zip(idx.indices, shape):
        if isinstance(s, indexing.Slice):
            if not isinstance(s.stride, int) or s.stride != 1 or not isinstance(s.size, int):
                return  # strided or dynamic-size slices: not judged
            at = s.start + jnp.arange(s.size)
            axes.append((at < 0) | (at >= n))
            starts.append(s.start)
            sizes.append(s.size)
        elif not getattr(s, "shape", ()):  # a scalar index: the dim is squeezed away
            bad = (s < 0) | (s >= n)
            outside = bad if outside is None else outside | bad
            starts.append(s)
            sizes.append(None)
        else:
            return  # an array index (gather-like): not judged
    rank = len(axes)
    for k, bad in enumerate(axes):
        b = jnp.reshape(bad, (1,) * k + (bad.shape[0],) + (1,) * (rank - k - 1))
        outside = b if outside is None else outside | b
    if outside is None:
        return
    outside = jnp.broadcast_to(outside, jnp.shape(val))
    if mask is not None:
        outside = outside & mask
    count = jnp.sum(outside.astype(jnp.int32))
    frame = source_info_util.user_frame(source_info_util.current().traceback)
    file, line = (frame.file_name, frame.start_line) if frame is not None else ("", 0)
    record = functools.partial(_record, file, line, shape, tuple(sizes))
    starts = [jnp.asarray(x, jnp.int32) for x in starts]
    lax.cond(count > 0, lambda c, *a: jax.debug.callback(record, c, *a), lambda c, *a: None, count, *starts)


def _record(file: str, line: int, shape: tuple, sizes: tuple, count, *starts) -> None:
    spans = [str(int(a)) if n is None else f"{int(a)}:{int(a) + n}" for a, n in zip(starts, sizes)]
    with _lock:
        _found.append(Store(file, line, f"[{', '.join(spans)}] of a {shape} ref", int(count)))
