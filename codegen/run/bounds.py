"""Out-of-bounds loads and stores in Pallas interpret mode.

Pallas interpret mode pads a ref for each load and store and crops it after: the part of a store that falls
outside its ref is dropped, and a load reads NaN (or the smallest integer) there. Compiled, the same store
writes past the block or the array: into the next row of a whole-width block, which another program owns (a
race that the GPU's timing may hide in every case), or past the allocation; the load reads whatever lies there,
or faults. A value check sees neither when the kernel leaves those elements out of its results (a masked store
after an unmasked load). So in the worker processes of `kspec verify`, which run the `interpret` bodies and
(off a GPU) the Triton bodies in interpret mode, the rules by which interpret mode turns a Pallas load or store
into array operations (`pl.load`, `pltriton.load`, `pl.store`, `pltriton.store`: the `masked_load` and
`masked_swap` primitives; indexing, `x_ref[pl.ds(s, n)]` and `o_ref[...] = y`: the `get` and `swap` primitives
of jax's state) are wrapped: each first counts the elements it reads or writes outside its ref, its mask left
aside, and calls back to the worker when there are any, naming the line. The worker fails the task.

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
class Access:
    """One out-of-bounds load or store: where (the generated file and line) and what, and how many elements."""

    kind: str  # "load" or "store"
    file: str
    line: int
    what: str  # e.g. "[0:1, 512:768] of a (1, 700) ref", the slice's start as the program computed it
    outside: int

    def describe(self) -> str:
        if self.kind == "load":
            return f"a load from {self.what} reads {self.outside} element(s) outside it"
        return f"a store to {self.what} writes {self.outside} element(s) outside it"


def install() -> bool:
    """Wrap the discharge rules of Pallas's loads and stores once per process; whether the check is on."""
    global _installed
    if _installed is not None:
        return _installed
    try:
        from jax._src.pallas import primitives as pallas_primitives
        from jax._src.state import discharge

        original = discharge._discharge_rules[pallas_primitives.swap_p]
        original_load = discharge._discharge_rules[pallas_primitives.load_p]
    except (ImportError, AttributeError, KeyError):
        _installed = False
        return False

    def checked_store(in_avals, out_avals, *args_flat, args_tree, **params):
        ref, transforms, val, mask = args_tree.unflatten(args_flat)
        _checked("store", transforms, mask)
        return original(in_avals, out_avals, *args_flat, args_tree=args_tree, **params)

    def checked_load(in_avals, out_avals, *args_flat, args_tree, **params):
        ref, transforms, mask, other = args_tree.unflatten(args_flat)
        _checked("load", transforms, mask)
        return original_load(in_avals, out_avals, *args_flat, args_tree=args_tree, **params)

    discharge._discharge_rules[pallas_primitives.swap_p] = checked_store
    discharge._discharge_rules[pallas_primitives.load_p] = checked_load
    _install_indexing(discharge)
    _installed = True
    return True


def _install_indexing(discharge) -> None:
    """The same for loads and stores by indexing (`x_ref[pl.ds(s, n)]`, `o_ref[...] = y`: the `get` and `swap`
    primitives of jax's state), where jax has them as expected."""
    try:
        from jax._src import tree_util
        from jax._src.state import primitives as state_primitives

        get, swap = discharge._discharge_rules[state_primitives.get_p], discharge._discharge_rules[state_primitives.swap_p]
    except (ImportError, AttributeError, KeyError):
        return

    def checked_get(in_avals, out_avals, x, *idx, tree):
        _checked("load", tree_util.tree_unflatten(tree, idx), None)
        return get(in_avals, out_avals, x, *idx, tree=tree)

    def checked_swap(in_avals, out_avals, x, val, *idx, tree):
        _checked("store", tree_util.tree_unflatten(tree, idx), None)
        return swap(in_avals, out_avals, x, val, *idx, tree=tree)

    discharge._discharge_rules[state_primitives.get_p] = checked_get
    discharge._discharge_rules[state_primitives.swap_p] = checked_swap


def take() -> list:
    """The out-of-bounds accesses recorded since the last call, the first of each line, and forget them."""
    with _lock:
        first: dict = {}
        for access in _found:
            first.setdefault((access.kind, access.file, access.line), access)
        _found.clear()
    return list(first.values())


def _checked(kind: str, transforms, mask) -> None:
    """_check, but an access this jax spells otherwise than expected is not judged rather than broken."""
    try:
        _check(kind, transforms, mask)
    except Exception:  # noqa: BLE001 - the check is an addition: the kernel runs without it
        pass


def _check(kind: str, transforms, mask) -> None:
    """Stage the count of the elements this load or store touches outside its ref (mask True, index out of
    range), and a host callback when it is not zero."""
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
            # A static index past the dim is not caught by jax either (interpret mode clamps it back);
            # a negative static one may count from the end, and is left to jax.
            bad = (s >= n) if isinstance(s, int) else (s < 0) | (s >= n)
            bad = jnp.asarray(bad)
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
    if mask is not None:
        outside = outside & mask
    count = jnp.sum(outside.astype(jnp.int32))
    frame = source_info_util.user_frame(source_info_util.current().traceback)
    file, line = (frame.file_name, frame.start_line) if frame is not None else ("", 0)
    record = functools.partial(_record, kind, file, line, shape, tuple(sizes))
    starts = [jnp.asarray(x, jnp.int32) for x in starts]
    lax.cond(count > 0, lambda c, *a: jax.debug.callback(record, c, *a), lambda c, *a: None, count, *starts)


def _record(kind: str, file: str, line: int, shape: tuple, sizes: tuple, count, *starts) -> None:
    spans = [str(int(a)) if n is None else f"{int(a)}:{int(a) + n}" for a, n in zip(starts, sizes)]
    with _lock:
        _found.append(Access(kind, file, line, f"[{', '.join(spans)}] of a {shape} ref", int(count)))
