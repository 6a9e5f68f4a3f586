"""The `vjp:` section as a frozen `Vjp`: the kernel's gradient, computed by backward kernels that are specs.

`build(doc)` turns the schema-valid section into the model; its checks (E420 to E429)
are in codegen/checks/vjp.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from kspec.codegen.diagnostics import Location

_COTANGENT = re.compile(r"^grad\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Binding:
    """A backward kernel input's value: a residual (`x`) or an output's cotangent (`grad(y)`)."""

    target: str  # the backward kernel's input
    text: str  # as written
    source: str | None  # the forward operand it names; None when `text` is neither form
    cotangent: bool
    loc: Location


@dataclasses.dataclass(frozen=True)
class Grad:
    """A backward kernel output that is the gradient of a forward input."""

    output: str
    input: str
    reduce: bool  # the output has extra leading axes of partial gradients, summed
    loc: Location


@dataclasses.dataclass(frozen=True)
class Backward:
    spec: str  # the file name, in the forward spec's folder
    inputs: tuple  # of Binding, as written
    params: Mapping[str, str]  # backward param -> forward param
    param_locs: Mapping[str, Location]
    grads: tuple  # of Grad
    loc: Location  # the `spec:` value
    inputs_loc: Location
    grads_loc: Location

    def binding(self, name: str) -> Binding | None:
        return next((b for b in self.inputs if b.target == name), None)


@dataclasses.dataclass(frozen=True)
class Vjp:
    residuals: tuple  # forward operand names, in order
    residual_locs: Mapping[str, Location]
    backward: tuple  # of Backward
    no_grad: tuple  # forward inputs with zero gradients
    no_grad_locs: Mapping[str, Location]
    loc: Location


def build(doc) -> Vjp | None:
    """The `vjp:` section of a schema-valid document as a Vjp; None without one."""
    raw = doc.data.get("vjp")
    if raw is None:
        return None
    at = ("vjp",)
    backward = tuple(_backward(doc, entry, at + ("backward", i)) for i, entry in enumerate(raw["backward"]))
    residuals = raw.get("residuals") or ()
    return Vjp(
        residuals=tuple(residuals),
        residual_locs={r: doc.loc(at + ("residuals", i)) for i, r in enumerate(residuals)},
        backward=backward,
        no_grad=tuple(raw.get("no_grad") or ()),
        no_grad_locs={n: doc.loc(at + ("no_grad", i)) for i, n in enumerate(raw.get("no_grad") or ())},
        loc=doc.key_loc(at),
    )


def _backward(doc, raw: dict, at: tuple) -> Backward:
    inputs = []
    for target, text in raw["inputs"].items():
        m = _COTANGENT.match(text.strip())
        source = m.group(1) if m else text.strip() if _NAME.match(text.strip()) else None
        inputs.append(Binding(target, text, source, m is not None, doc.loc(at + ("inputs", target))))
    grads = []
    for output, value in raw["grads"].items():
        name, reduce = (value, False) if isinstance(value, str) else (value["input"], value["reduce"] == "sum")
        grads.append(Grad(output, name, reduce, doc.loc(at + ("grads", output))))
    params = dict(raw.get("params") or {})
    return Backward(
        spec=raw["spec"],
        inputs=tuple(inputs),
        params=params,
        param_locs={p: doc.loc(at + ("params", p)) for p in params},
        grads=tuple(grads),
        loc=doc.loc(at + ("spec",)),
        inputs_loc=doc.key_loc(at + ("inputs",)),
        grads_loc=doc.key_loc(at + ("grads",)),
    )
