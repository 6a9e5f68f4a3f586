"""Located diagnostics: every problem kspec reports points at a YAML line and column.

The codes are stable: tests pin them, and docs/diagnostics.md lists them (a test
keeps that page in step with CODES below).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Iterable

# code -> one-line title. Grouped by pipeline stage: E1xx loading, E2xx schema,
# E3xx expressions, E4xx structure (E416 to E418: residual outputs; E42x: vjp; E43x: mesh
# kernels; E44x: prologue, epilogue and optional inputs; E45x: initialisers that give test data structure),
# E5xx per-case checks, E6xx Python code, E7xx backend hardware rules, E8xx sharding;
# W9xx warnings.
CODES: dict[str, str] = {
    "E100": "cannot read the spec file",
    "E101": "malformed YAML",
    "E102": "duplicate key",
    "E103": "YAML anchors and aliases are not allowed",
    "E104": "YAML tag not allowed",
    "E105": "spec file too large",
    "E106": "spec is not a mapping",
    "E107": "spec is not valid UTF-8 text",
    "E108": "YAML nested too deeply",
    "E109": "scalar too long",
    "E110": "not a regular file",
    "E111": "cannot write the output",
    "E120": "tuning file cannot be read as JSON",
    "E121": "tuning file does not match its schema",
    "E122": "tuning entry names a param that is not tuned",
    "E140": "invalid project configuration",
    "E141": "path outside the project",
    "E142": "kspec init would overwrite a file",
    "E200": "schema violation",
    "E201": "unknown key",
    "E202": "missing required key",
    "E203": "wrong type",
    "E300": "invalid expression",
    "E301": "unknown name in expression",
    "E302": "invalid index map",
    "E303": "expression cannot be evaluated",
    "E400": "name clash",
    "E401": "unknown dtype",
    "E402": "block rank does not match the array rank",
    "E403": "index_map arity does not match the grid rank",
    "E404": "index_map result length does not match the block rank",
    "E405": "block spec for an unknown operand",
    "E407": "dtype refers to an unknown operand",
    "E408": "dim is not bound by any input shape",
    "E409": "unknown backend",
    "E410": "invalid scalar-prefetch input",
    "E411": "invalid input initialiser",
    "E412": "invalid input_output_aliases",
    "E413": "block spec feature not supported by the backend",
    "E414": "scratch kind not supported by the backend",
    "E415": "too many configs to tune",
    "E416": "residual output in a spec without vjp",
    "E417": "residual output not saved for the backward pass",
    "E418": "every output is residual",
    "E419": "invalid dtype map",
    "E420": "backward spec cannot be used",
    "E421": "unknown name in vjp",
    "E422": "backward kernel input or param bound wrongly",
    "E423": "invalid gradient assignment",
    "E424": "gradient shape or dtype does not match its input",
    "E425": "floating-point input without a gradient",
    "E426": "backward specs form a cycle",
    "E427": "backward input shape or dtype does not match its binding",
    "E428": "backward kernel cannot run a forward case",
    "E429": "backward spec has no backend for a platform of the forward",
    "E430": "mesh-kernel section in the wrong kind of spec",
    "E431": "mesh missing or not valid for the backend",
    "E432": "invalid pipeline, ref or cluster barrier of a mesh kernel",
    "E440": "prologue or epilogue without the kernel operands it makes or reads",
    "E441": "prologue or epilogue returns the wrong number of values",
    "E442": "invalid optional input or absent",
    "E443": "residual kernel operand that no call asks for",
    "E450": "input initialisers read each other in a cycle",
    "E451": "same_as input differs in shape or dtype",
    "E452": "init code returns nothing",
    "E453": "input kinds would break a structured initialiser",
    "E500": "case does not bind every dim",
    "E501": "constraint violated",
    "E502": "index_map result out of bounds",
    "E503": "output not fully covered by its blocks",
    "E504": "case dtype not allowed",
    "E505": "grid axis size is not positive",
    "E506": "shape is not positive",
    "E507": "too many dtype combinations",
    "E508": "grid axis size does not fit in int32",
    "E509": "min_speedup_over names no competitor",
    "E510": "a family of shapes cannot be expanded",
    "E511": "constant index past a ref's axis",
    "E600": "Python syntax error",
    "E601": "import not allowed in generated code",
    "E602": "unknown name in code",
    "E701": "TPU block tiling: last two block dims not divisible by (8 x packing, 128)",
    "E702": "TPU parallel grid axis revisits an output block",
    "E703": "TPU VMEM budget exceeded",
    "E704": "compiler_params list length does not match the kernel",
    "E705": "TPU block spec that Mosaic TPU does not lower",
    "E711": "Triton block dim is not a power of two",
    "E712": "Triton dot operand dim below 16",
    "E713": "Triton num_warps is not a power of two up to 32",
    "E714": "Triton shared-memory estimate exceeded",
    "E721": "Mosaic GPU shared-memory budget exceeded",
    "E722": "Mosaic GPU block dim above the TMA limit of 256",
    "E723": "Mosaic GPU warpgroups per CTA out of range",
    "E724": "Mosaic GPU cluster does not divide the grid",
    "E725": "Mosaic GPU body ends with TMA stores in flight",
    "E800": "unknown or non-manual mesh axis",
    "E801": "mesh axis used twice in one partition spec",
    "E802": "partition spec or reduction does not fit its operand",
    "E803": "dim split differently in two inputs",
    "E804": "split dim not divisible by its mesh axes",
    "E805": "output sharding does not match the inputs and reductions",
    "E806": "per-shard problem breaks a block, grid or backend rule",
    "E807": "more than one mesh axis sized by the device count",
    "W900": "stale tuning entries",
    "W901": "tunable param that a backend's kernel never reads",
    "W902": "cdiv grid axis that no case makes ragged",
    "W903": "shared-memory estimate below what Triton asked for",
    "W904": "mesh kernel writes a residual output in every call",
}

# Warnings about a spec's cases rather than its kernel: `kspec check` shows them; generate, verify,
# bench and tune, which check first, do not repeat them.
CHECK_ONLY = frozenset({"W902"})


def printable(text: str) -> str:
    """`text` with control and other unprintable characters escaped (`\\x1b`): a file name or a
    value from a spec cannot move the cursor, change colours or hide what follows on a terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


@dataclasses.dataclass(frozen=True, order=True)
class Location:
    """A place in a spec file; line and col are 1-based."""

    path: str
    line: int = 1
    col: int = 1

    def __str__(self) -> str:
        return f"{printable(self.path)}:{self.line}:{self.col}"


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    loc: Location
    hint: str | None = None
    severity: str = "error"

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unregistered diagnostic code {self.code}")

    def format(self, source_lines: list[str] | None = None) -> str:
        """ruff/rustc style: header, then the quoted line with a caret, then the hint."""
        out = [f"{self.loc}: {self.severity}[{self.code}]: {self.message}"]
        if source_lines is not None and 0 < self.loc.line <= len(source_lines):
            text = source_lines[self.loc.line - 1].rstrip("\n")
            gutter = f"{self.loc.line:>4} | "
            out.append(gutter + text)
            out.append(" " * (len(gutter) + max(self.loc.col - 1, 0)) + "^")
        if self.hint:
            out.append(f"  = help: {self.hint}")
        return "\n".join(out)


class SpecError(Exception):
    """Raised by a stage that cannot go on; carries every diagnostic found so far."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.loc, d.code))
        super().__init__("\n".join(d.format() for d in self.diagnostics))


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None
