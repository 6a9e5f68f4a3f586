"""Mutation testing: how many one-change bugs in a spec's kernel side `kspec check` and `kspec verify` catch.

    python scripts/mutation_test.py [SPECS...] [-b BACKEND]... [--operator NAME]... [--spec NAME]...
                                    [--mutant ID]... [--limit N] [--sample N] [--seed S] [--jobs N]
                                    [--timeout SECONDS] [--task-timeout SECONDS] [--schedules N] [--list]
                                    [--json FILE] [--equivalents FILE] [--check-only] [--resume FILE]

For each spec (default: those of specs/ with an `interpret` or `mosaic_tpu` backend) it makes mutants of the
kernel side, the parts of the spec that the backends run: the bodies, the grids, the index maps and the
dimension semantics of the chosen backends (default: `interpret` and `mosaic_tpu`, which run on any machine;
`-b triton -b mosaic_gpu` on a GPU machine). The reference, the cases and the tolerances are left alone.
Each mutant is the spec's YAML text with exactly one change, made on the parsed Python tree of one body or
expression (OPERATORS below) and spliced back at that node's place in the file; re-loading the mutant must give
exactly the changed source, or the mutant is dropped.

Each mutant is written into a project of its own in a temporary folder (with the backward specs its `vjp:`
names), then `kspec check`, `kspec generate` and `kspec verify --seed S --timeout T` run on it in subprocesses,
verify for the backends the change reaches (T: --task-timeout, so that a mutant that hangs fails a task). A
mutant is

- `check`: killed by `kspec check` (or `kspec generate`) exiting non-zero;
- `verify`: killed by `kspec verify` exiting non-zero (a task failed or errored);
- `survived`: verify passed;
- `equivalent`: every module of its generated package parses to the same tree as the original's (they differ
  at most in comments and the header's hashes; found before verify runs), or it is listed with a reviewed reason
  in scripts/mutation_equivalents.yaml (`--equivalents`);
- `timeout`: a command ran past --timeout;
- `unjudged`: with `--check-only`, check and generate passed and verify did not run; or verify ran none of
  the mutant's tasks, because this machine runs none of its backends (Mosaic GPU bodies off a GPU).

Prints a table per operator and per spec and the surviving mutants; `--json FILE` (`-` for standard output)
writes every mutant's result. Exits 0 when every mutant that is not equivalent was killed, 1 otherwise, 2 for
bad usage.

A run can be split and resumed. `--resume FILE` reads the results FILE holds (a `--json` file of the same
backends), runs only the mutants it has no verdict for (an `unjudged` one is run), and writes FILE again
after each mutant, so a run that is stopped keeps what it judged and the next one goes on from there. With
`--check-only`, verify does not run: `-b triton -b mosaic_gpu --check-only --resume FILE` judges what check
and the generated code's tree decide. Without it, on a machine without a GPU, verify runs the Triton bodies in
Pallas interpret mode (`kspec verify --backend triton` does so off a GPU) and leaves the Mosaic GPU ones
`unjudged`; the same command on a GPU machine judges only what is left. A part of the mutants (`--spec`,
`--operator`, `--sample`) can be resumed on its own: the file keeps the others' entries as they were.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import dataclasses
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))  # the repository root is the `kspec` package

import yaml  # noqa: E402

from kspec.codegen import project as pipeline  # noqa: E402
from kspec.codegen.spec import loader  # noqa: E402

RUNNABLE_HERE = ("interpret", "mosaic_tpu")
EVERY_BACKEND = ("interpret", "mosaic_tpu", "triton", "mosaic_gpu")
EQUIVALENTS = REPO / "scripts" / "mutation_equivalents.yaml"
OUTCOMES = ("check", "verify", "survived", "equivalent", "timeout")  # verdicts (`unjudged` is none)
HEADS = {"check": "killed by check", "verify": "killed by verify"}


# --- the mutation operators: each takes a parsed tree and yields (node, replacement) -------------------------

@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace the source of `node` with `text` (`stmts`: the node's body statements instead)."""

    node: ast.AST
    text: str
    stmts: bool = False


def _paren(node: ast.AST) -> str:
    text = ast.unparse(node)
    atomic = isinstance(node, (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.Tuple))
    return text if atomic else f"({text})"


def _swap_op(tree: ast.AST, pairs: dict, skip: Callable[[ast.BinOp], bool] = lambda n: False) -> Iterator[Edit]:
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in pairs and not skip(node):
            yield Edit(node, _paren(ast.BinOp(node.left, pairs[type(node.op)](), node.right)))
        elif (isinstance(node, ast.AugAssign) and type(node.op) in pairs
              and not skip(ast.BinOp(node.target, node.op, node.value))):
            yield Edit(node, ast.unparse(ast.AugAssign(node.target, pairs[type(node.op)](), node.value)))


def _mentions_eps(node: ast.BinOp) -> bool:
    return any(isinstance(side, ast.Name) and side.id == "eps" for side in (node.left, node.right))


def arith_swap(tree: ast.AST) -> Iterator[Edit]:
    """`+` <-> `-`, `*` <-> `/` (`+ eps`/`- eps` are eps_sign's)."""
    yield from _swap_op(tree, {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult},
                        skip=_mentions_eps)


def eps_sign(tree: ast.AST) -> Iterator[Edit]:
    """`x + eps` <-> `x - eps`."""
    yield from _swap_op(tree, {ast.Add: ast.Sub, ast.Sub: ast.Add}, skip=lambda n: not _mentions_eps(n))


def compare_swap(tree: ast.AST) -> Iterator[Edit]:
    """`<` <-> `<=`, `>` <-> `>=` (one comparison of a chain)."""
    pairs = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in pairs:
                    ops = list(node.ops)
                    ops[k] = pairs[type(op)]()
                    yield Edit(node, _paren(ast.Compare(node.left, ops, node.comparators)))


def constant(tree: ast.AST) -> Iterator[Edit]:
    """A number c -> c + 1 (0 -> 1)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            yield Edit(node, repr(node.value + 1))


_MAX_MIN = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum"}


def max_min(tree: ast.AST) -> Iterator[Edit]:
    """`max` <-> `min`, `maximum` <-> `minimum` (builtins, `jnp.`, `lax.`, methods)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in _MAX_MIN:
            yield Edit(node, ast.unparse(ast.Call(ast.Name(_MAX_MIN[f.id]), node.args, node.keywords)))
        elif isinstance(f, ast.Attribute) and f.attr in _MAX_MIN:
            yield Edit(node, ast.unparse(ast.Call(ast.Attribute(f.value, _MAX_MIN[f.attr]), node.args,
                                                  node.keywords)))


def _is_first_step(decorator: ast.expr) -> bool:
    """`pl.when(<index> == 0)`."""
    return (isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pl.when" and decorator.args
            and isinstance(c := decorator.args[0], ast.Compare) and len(c.ops) == 1
            and isinstance(c.ops[0], ast.Eq) and isinstance(c.comparators[0], ast.Constant)
            and c.comparators[0].value == 0)


def drop_init(tree: ast.AST) -> Iterator[Edit]:
    """The body of an `@pl.when(k == 0)` function (an accumulator's initialisation) -> `pass`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(_is_first_step(d) for d in node.decorator_list):
            yield Edit(node, "pass", stmts=True)


def _without_keywords(node: ast.Call, names: set) -> Edit:
    keywords = [k for k in node.keywords if k.arg not in names]
    return Edit(node, ast.unparse(ast.Call(node.func, node.args, keywords)))


def drop_preferred_element_type(tree: ast.AST) -> Iterator[Edit]:
    """`preferred_element_type=...` dropped from a call (a dot accumulates in its inputs' dtype)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(k.arg == "preferred_element_type" for k in node.keywords):
            yield _without_keywords(node, {"preferred_element_type"})


def drop_mask(tree: ast.AST) -> Iterator[Edit]:
    """A `mask=` (with its `other=`) dropped from a load or store; `jnp.where(c, a, b)` -> `a`."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if any(k.arg == "mask" for k in node.keywords):
            yield _without_keywords(node, {"mask", "other"})
        if ast.unparse(node.func) in ("jnp.where", "np.where", "lax.select") and len(node.args) == 3:
            yield Edit(node, _paren(node.args[1]))


def _is_inf(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr == "inf")
            or (isinstance(node, ast.Call) and ast.unparse(node.func) == "float" and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).strip("+-") == "inf"))


def neg_inf_zero(tree: ast.AST) -> Iterator[Edit]:
    """`-jnp.inf` (`float("-inf")`) -> `0.0`, e.g. the initial value of a running max."""
    for node in ast.walk(tree):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_inf(node.operand):
            yield Edit(node, "0.0")
        elif _is_inf(node) and isinstance(node, ast.Call) and str(node.args[0].value).startswith("-"):
            yield Edit(node, "0.0")


def _array_valued(node: ast.AST) -> bool:
    """Reads a ref (`x_ref[...]`) or calls `jnp.`: an array, not a Python number or an index."""
    return any((isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id.endswith("_ref"))
               or (isinstance(n, ast.Call) and ast.unparse(n.func).startswith("jnp."))
               for n in ast.walk(node))


def cast_bf16(tree: ast.AST) -> Iterator[Edit]:
    """An intermediate array `name = value` -> `name = (value).astype(jnp.bfloat16)`."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and not isinstance(node.value, ast.Tuple) and _array_valued(node.value)
                and "iota" not in ast.unparse(node.value)):
            yield Edit(node.value, f"{_paren(node.value)}.astype(jnp.bfloat16)")


def index_off_by_one(tree: ast.AST, grid: tuple = ()) -> Iterator[Edit]:
    """In an index map's result, a grid index `i` (one of `grid`, the names before `->`) -> `i + 1`."""
    parts = tree.elts if isinstance(tree, ast.Tuple) else [tree]
    for part in parts:
        for node in ast.walk(part):
            if isinstance(node, ast.Name) and node.id in grid:
                yield Edit(node, f"({node.id} + 1)")


def grid_floordiv(tree: ast.AST) -> Iterator[Edit]:
    """`cdiv(a, b)` -> `a // b` in a grid (the ragged last block is lost)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("cdiv", "pl.cdiv") and len(node.args) == 2:
            yield Edit(node, _paren(ast.BinOp(node.args[0], ast.FloorDiv(), node.args[1])))


# operator -> (what it does, the kinds of site it applies to, the function)
OPERATORS: dict = {
    "index_off_by_one": ("grid index i -> i + 1 in an index map", ("index_map",), index_off_by_one),
    "grid_floordiv": ("cdiv(a, b) -> a // b in a grid", ("grid",), grid_floordiv),
    "arith_swap": ("+ <-> -, * <-> /", ("body", "grid", "index_map"), arith_swap),
    "compare_swap": ("< <-> <=, > <-> >=", ("body",), compare_swap),
    "constant": ("a number c -> c + 1", ("body", "grid", "index_map"), constant),
    "max_min": ("max <-> min, maximum <-> minimum", ("body",), max_min),
    "drop_init": ("the body of @pl.when(k == 0) -> pass", ("body",), drop_init),
    "drop_preferred_element_type": ("preferred_element_type= dropped", ("body",), drop_preferred_element_type),
    "drop_mask": ("mask= dropped; jnp.where(c, a, b) -> a", ("body",), drop_mask),
    "neg_inf_zero": ("-inf -> 0.0", ("body",), neg_inf_zero),
    "eps_sign": ("+ eps <-> - eps", ("body",), eps_sign),
    "cast_bf16": ("an intermediate cast to bfloat16", ("body",), cast_bf16),
    "semantics_parallel": ("dimension_semantics arbitrary -> parallel", ("semantics",), None),
}


# --- where the kernel side lives in a spec -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Site:
    path: tuple  # into the YAML data
    kind: str  # body, grid, index_map or semantics
    backends: tuple  # the chosen backends that run it


def _backends(data: dict) -> dict:
    return {name: (over or {}) for name, over in (data.get("backends") or {"interpret": None}).items()}


def sites(data: dict, chosen: tuple) -> list:
    """The kernel-side values each chosen backend of the spec runs, in file order of discovery."""
    found: dict = {}

    def add(path: tuple, kind: str, backend: str) -> None:
        found.setdefault((path, kind), []).append(backend)

    for backend, over in _backends(data).items():
        if backend not in chosen:
            continue
        body = ("backends", backend, "body") if "body" in over else ("body",)
        add(body, "body", backend)
        grid_at = ("backends", backend, "grid") if "grid" in over else ("grid",)
        grid = _get(data, grid_at)
        for key in (grid if isinstance(grid, dict) else range(len(grid or []))):
            if isinstance(grid[key], str):
                add(grid_at + (key,), "grid", backend)
        for op in (data.get("blocks") or {}) | (over.get("blocks") or {}):
            at = ("backends", backend, "blocks", op) if op in (over.get("blocks") or {}) else ("blocks", op)
            if isinstance(_get(data, at + ("index_map",)), str):
                add(at + ("index_map",), "index_map", backend)
        for name, pipe in (data.get("pipelines") or {}).items():
            for axis, size in (pipe.get("grid") or {}).items():
                if isinstance(size, str):
                    add(("pipelines", name, "grid", axis), "grid", backend)
            for side in ("in", "out"):
                for op, block in (pipe.get(side) or {}).items():
                    if isinstance(block, dict) and isinstance(block.get("index_map"), str):
                        add(("pipelines", name, side, op, "index_map"), "index_map", backend)
        semantics = (over.get("compiler_params") or {}).get("dimension_semantics") or []
        for k, value in enumerate(semantics):
            if value == "arbitrary":
                add(("backends", backend, "compiler_params", "dimension_semantics", k), "semantics", backend)
    return [Site(path, kind, tuple(b)) for (path, kind), b in found.items()]


def _get(data, path: tuple):
    for key in path:
        if data is None:
            return None
        data = data[key] if isinstance(data, list) else data.get(key)
    return data


# --- mutants ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Mutant:
    id: str  # <spec>:<operator>:<line>:<col>[#n], the key of the equivalents file
    spec: Path
    name: str  # the spec's file stem
    kernel: str  # the spec's `name`, which no mutant changes
    operator: str
    site: str  # the dotted YAML path
    line: int  # where the change starts in the spec file
    col: int
    change: str  # `old` -> `new`
    backends: tuple
    text: str  # the whole mutated spec
    outcome: str = ""
    detail: str = ""
    seconds: float = 0.0


def _parse(kind: str, value: str) -> tuple:
    """(tree, the source it was parsed from, that source's column in `value`): a body is a module, a grid
    size an expression, an index map an expression after its `->`."""
    if kind == "body":
        return ast.parse(value), value, 0
    start = value.index("->") + 2 if kind == "index_map" else 0
    rhs = value[start:]
    lead = start + len(rhs) - len(rhs.lstrip())
    return ast.parse(rhs.strip(), mode="eval").body, rhs.strip(), lead


def _char_col(lines: list, lineno: int, byte_col: int) -> int:
    return len(lines[lineno - 1].encode()[:byte_col].decode())


def _span(edit: Edit, source: str, lead: int) -> tuple:
    """The (line, col) start and end that the edit replaces, 0-based in the value whose column `lead` holds
    `source`."""
    lines = source.split("\n")
    first, last = (edit.node.body[0], edit.node.body[-1]) if edit.stmts else (edit.node, edit.node)
    start = (first.lineno - 1, _char_col(lines, first.lineno, first.col_offset))
    end = (last.end_lineno - 1, _char_col(lines, last.end_lineno, last.end_col_offset))
    if start[0] == 0:
        start = (0, start[1] + lead)
    if end[0] == 0:
        end = (0, end[1] + lead)
    return start, end


def _splice(text: str, start: tuple, end: tuple, new: str) -> str:
    """`text` with the span from start to end ((line, col), 0-based) replaced."""
    lines = text.split("\n")
    a = sum(len(s) + 1 for s in lines[: start[0]]) + start[1]
    b = sum(len(s) + 1 for s in lines[: end[0]]) + end[1]
    return text[:a] + new + text[b:]


def _file_offset(doc: loader.Document, path: tuple, at: tuple) -> tuple:
    loc = doc.text_loc(path, at[0], at[1])
    return loc.line - 1, loc.col - 1


def mutants_of(spec: Path, chosen: tuple, operators: list) -> list:
    text = spec.read_text()
    doc = loader.load_text(text, str(spec))
    out: list = []
    seen: dict = {}
    for site in sites(doc.data, chosen):
        value = _get(doc.data, site.path)
        for op in operators:
            _, kinds, fn = OPERATORS[op]
            if site.kind not in kinds:
                continue
            if site.kind == "semantics":
                edits = [((0, 0), (0, len(value)), "parallel", value)]
            else:
                try:
                    tree, source, lead = _parse(site.kind, value)
                except SyntaxError:
                    continue  # kspec check reports it
                edits = []
                grid = tuple(a.strip() for a in value.split("->")[0].split(",")) if site.kind == "index_map" else ()
                for edit in (fn(tree, grid) if fn is index_off_by_one else fn(tree)):
                    start, end = _span(edit, source, lead)
                    old = ast.get_source_segment(source, edit.node.body[0] if edit.stmts else edit.node) or ""
                    edits.append((start, end, edit.text, old))
            for start, end, new, old in edits:
                mutated_value = _splice(value, start, end, new)
                fstart, fend = _file_offset(doc, site.path, start), _file_offset(doc, site.path, end)
                mutated = _splice(text, fstart, fend, new)
                if not _same_value(mutated, spec, doc.data, site.path, mutated_value):
                    print(f"note: {spec.name}: {op} at {fstart[0] + 1}:{fstart[1] + 1} does not splice cleanly; "
                          "dropped", file=sys.stderr)
                    continue
                key = f"{spec.stem}:{op}:{fstart[0] + 1}:{fstart[1] + 1}"
                seen[key] = seen.get(key, 0) + 1
                mid = key if seen[key] == 1 else f"{key}#{seen[key]}"
                old_line = " ".join(old.split())
                change = f"`{_clip(old_line)}` -> `{_clip(new)}`"
                out.append(Mutant(mid, spec, spec.stem, doc.data["name"], op, ".".join(map(str, site.path)), fstart[0] + 1,
                                  fstart[1] + 1, change, site.backends, mutated))
    return out


def _clip(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _same_value(text: str, spec: Path, before: dict, path: tuple, expected: str) -> bool:
    """Re-loading the mutated file gives the mutated value at `path`, and nothing else changed."""
    try:
        doc = loader.load_text(text, str(spec))
    except Exception:  # noqa: BLE001 - a failed splice, whatever the loader says about it
        return False
    return _get(doc.data, path) == expected and _with(before, path, expected) == doc.data


def _with(data, path: tuple, value):
    """A copy of `data` with `value` at `path`."""
    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


# --- running them ----------------------------------------------------------------------------------------------

@functools.cache
def _linked(spec: Path) -> frozenset:
    """The backward specs the spec's vjp names, and theirs."""
    found: set = set()
    todo = [pipeline.compile_spec(spec)]
    while todo:
        for backward in todo.pop().backward:
            if backward.path not in found:
                found.add(backward.path)
                todo.append(backward)
    return frozenset(found)


def _project(root: Path, spec: Path, text: str) -> Path:
    (root / "specs").mkdir(parents=True)
    (root / "kspec.toml").write_text('out = "generated"\n')
    for path in _linked(spec):
        shutil.copyfile(path, root / "specs" / path.name)
    target = root / "specs" / spec.name
    target.write_text(text)
    return target


def _env(**extra) -> dict:
    """This process's environment, with the repository's parent first on PYTHONPATH (the repository is the
    `kspec` package; where it is not installed, a folder that links it as `kspec` may be on PYTHONPATH)."""
    path = os.pathsep.join(p for p in (str(REPO.parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def _kspec(args: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run `kspec ARGS`. Exit 2 with a located diagnostic is a refusal (the mutant is killed); any other
    failure means kspec itself did not run here, and ends the run."""
    r = subprocess.run([sys.executable, "-m", "kspec", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=_env())
    if r.returncode != 0 and not (r.returncode == 2 and "error[" in r.stdout + r.stderr):
        raise SystemExit(f"kspec {args[0]} exited {r.returncode} without a diagnostic:\n{(r.stdout + r.stderr)[-2000:]}")
    return r


def _verify(args: list, cwd: Path, timeout: float) -> str | None:
    """Run `kspec verify`; the first failed or errored task's progress line, "" when it passed, or None when
    it ran no task (this machine runs none of the mutant's backends).

    verify prints `[k/n] <status> <task>` on standard error as each task ends (standard error not being a
    terminal); a mutant is killed by its first failed task, so verify is stopped there."""
    env = _env(PYTHONUNBUFFERED="1")
    with open(cwd / "verify.out", "w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kspec", *args], cwd=cwd, env=env, text=True,
                                stdout=out, stderr=subprocess.PIPE, start_new_session=True)
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), _stop(proc)))
        timer.start()
        try:
            for line in proc.stderr:
                words = line.split()
                if len(words) >= 3 and words[0].startswith("[") and words[1] in ("fail", "error"):
                    return f"{words[1]}: {' '.join(words[2:])}"
            rc = proc.wait()
        finally:
            timer.cancel()
            _stop(proc)
        if expired.is_set():
            raise subprocess.TimeoutExpired(["python", "-m", "kspec", "verify"], timeout)
        out.seek(0)
        report = out.read()
        if rc == 0 and re.search(r"^0 passed, 0 failed, 0 errors", report, re.M):
            return None  # every task skipped: nothing here runs the mutant's backends
        return "" if rc == 0 else f"exit {rc}: " + _first_error(report)


def _stop(proc: subprocess.Popen) -> None:
    """End verify and its worker processes: the process group it leads (it was started in a session of its own)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _first_error(out: str) -> str:
    lines = [s for s in out.splitlines() if "error[" in s or "error:" in s] or out.strip().splitlines() or [""]
    return lines[0].strip()


def _package(root: Path, kernel: str) -> dict:
    folder = root / "generated" / kernel
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.py"))}


def _same_package(a: dict, b: dict) -> bool:
    """The same modules, each parsing to the same tree: they differ at most in comments (each module's header
    holds the spec's sha256, so a mutant's package is never byte-identical to the original's)."""
    return a.keys() == b.keys() and all(ast.dump(ast.parse(a[k])) == ast.dump(ast.parse(b[k])) for k in a)


class Runner:
    def __init__(self, tmp: Path, seed: int, timeout: float, task_timeout: float, schedules: int | None,
                 equivalents: dict, check_only: bool = False):
        self.tmp, self.seed, self.timeout, self.task_timeout = tmp, seed, timeout, task_timeout
        self.check_only = check_only
        self.schedules = schedules
        self.equivalents = equivalents
        self._originals: dict = {}
        self._lock = threading.Lock()

    def original(self, spec: Path, kernel: str) -> dict:
        """The original spec's generated package, rendered the same way as a mutant's."""
        with self._lock:
            return self._original(spec, kernel)

    def _original(self, spec: Path, kernel: str) -> dict:
        if spec not in self._originals:
            root = self.tmp / f"original-{spec.stem}"
            _project(root, spec, spec.read_text())
            r = _kspec(["generate"], root, self.timeout)
            if r.returncode != 0:
                raise SystemExit(f"{spec}: kspec generate failed on the original:\n{r.stdout}{r.stderr}")
            self._originals[spec] = _package(root, kernel)
        return self._originals[spec]

    def run(self, m: Mutant) -> Mutant:
        started = time.monotonic()
        try:
            m.outcome, m.detail = self._classify(m)
        except subprocess.TimeoutExpired as e:
            m.outcome, m.detail = "timeout", f"`kspec {e.cmd[3]}` ran past {self.timeout:g} s"
        m.seconds = time.monotonic() - started
        return m

    def _classify(self, m: Mutant) -> tuple:
        if m.id in self.equivalents:
            return "equivalent", f"reviewed: {self.equivalents[m.id]}"
        root = Path(tempfile.mkdtemp(prefix=f"{m.name}-{m.operator}-", dir=self.tmp))
        try:
            path = _project(root, m.spec, m.text)
            rel = str(path.relative_to(root))
            r = _kspec(["check", rel], root, self.timeout)
            if r.returncode != 0:
                return "check", _first_error(r.stdout + r.stderr)
            r = _kspec(["generate"], root, self.timeout)
            if r.returncode != 0:
                return "check", "kspec generate: " + _first_error(r.stdout + r.stderr)
            if _same_package(_package(root, m.kernel), self.original(m.spec, m.kernel)):
                return "equivalent", "generated package AST-identical"
            if self.check_only:
                return "unjudged", "check and generate passed; verify not run (--check-only)"
            args = ["verify", rel, "--seed", str(self.seed), "--timeout", f"{self.task_timeout:g}"]
            for b in m.backends:
                args += ["-b", b]
            if self.schedules is not None:
                args += ["--schedules", str(self.schedules)]
            failed = _verify(args, root, self.timeout)
            if failed is None:
                return "unjudged", f"verify ran no task: this machine runs none of {', '.join(m.backends)}"
            return ("verify", failed) if failed else ("survived", "verify passed")
        finally:
            shutil.rmtree(root, ignore_errors=True)


# --- reports ---------------------------------------------------------------------------------------------------

def load_equivalents(path: Path) -> dict:
    """{mutant id: reason} from a list of `{mutant: ID, reason: TEXT}`."""
    entries = yaml.safe_load(path.read_text()) if path.exists() else []
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and set(e) == {"mutant", "reason"} and all(isinstance(v, str) for v in e.values())
            for e in entries):
        raise ValueError(f"{path}: expected a list of {{mutant: ID, reason: TEXT}}")
    return {e["mutant"]: e["reason"] for e in entries}


def _stale(equivalents: dict, found: list, specs: list, operators: list) -> list:
    """Entries for the specs and operators at hand that name no mutant: the spec changed under them."""
    ids = {m.id for m in found}
    stems = {s.stem for s in specs}
    return [key for key in equivalents
            if key.split(":")[0] in stems and key.split(":")[1] in operators and key not in ids]


def _table(rows: list, by: str, label: str) -> str:
    keys = sorted({getattr(m, by) for m in rows})
    outcomes = OUTCOMES + (("unjudged",) if any(m.outcome == "unjudged" for m in rows) else ())
    head = [label, "mutants", *(HEADS.get(o, o) for o in outcomes), "score"]
    table = [head]
    for key in keys + ["all"]:
        ms = [m for m in rows if key == "all" or getattr(m, by) == key]
        n = {o: sum(m.outcome == o for m in ms) for o in outcomes}
        judged = len(ms) - n["equivalent"] - n.get("unjudged", 0)
        score = f"{(n['check'] + n['verify']) / judged:.0%}" if judged else "-"
        table.append([key, str(len(ms)), *(str(n[o]) for o in outcomes), score])
    widths = [max(len(r[k]) for r in table) for k in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)


def main(argv: list | None = None) -> int:
    width = max(map(len, OPERATORS))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="operators:\n" + "\n".join(f"  {name:{width}}  {what}"
                                                                   for name, (what, _, _) in OPERATORS.items()),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="*", type=Path, help="spec files (default: specs/ with interpret or mosaic_tpu)")
    p.add_argument("-b", "--backend", action="append", help="backends to judge (default: interpret, mosaic_tpu)")
    p.add_argument("--spec", action="append", help="only specs with this name (file stem); repeatable")
    p.add_argument("--operator", action="append", choices=sorted(OPERATORS), help="only this operator; repeatable")
    p.add_argument("--mutant", action="append", help="only the mutant with this id (as --list prints); repeatable")
    p.add_argument("--limit", type=int, help="at most N mutants (the first N, after --sample)")
    p.add_argument("--sample", type=int, help="a random sample of N mutants, drawn with --seed")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and of verify's inputs (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per command per mutant")
    p.add_argument("--task-timeout", type=float, default=60.0,
                   help="verify's --timeout, seconds per task: a mutant that hangs fails a task (default 60)")
    p.add_argument("--schedules", type=int, help="verify's --schedules (default: verify's own)")
    p.add_argument("--list", action="store_true", help="only list the mutants")
    p.add_argument("--json", help="write every mutant's result as JSON to this file (- for standard output)")
    p.add_argument("--equivalents", type=Path, default=EQUIVALENTS, help="the reviewed equivalent mutants")
    p.add_argument("--check-only", action="store_true",
                   help="run check and generate only: what they do not kill is `unjudged`")
    p.add_argument("--resume", type=Path, metavar="FILE",
                   help="skip the mutants FILE has a verdict for, and write FILE after each mutant")
    a = p.parse_args(argv)

    chosen = tuple(a.backend or RUNNABLE_HERE)
    specs = a.specs or sorted((REPO / "specs").glob("*.yaml"))
    specs = [s for s in specs if not a.spec or s.stem in a.spec]
    for s in specs:
        if not s.is_file():
            p.error(f"{s}: no such spec file")
        compiled = pipeline.compile_spec(s)
        if not compiled.ok:  # a mutant of a spec that check refuses already would say nothing
            print("\n".join(d.format() for d in compiled.diagnostics if d.severity == "error"), file=sys.stderr)
            print(f"{s}: fix the spec first (kspec check {s})", file=sys.stderr)
            return 2
    operators = a.operator or list(OPERATORS)
    found = [m for s in specs for m in mutants_of(s, chosen, operators)]
    try:
        equivalents = load_equivalents(a.equivalents)
    except (ValueError, yaml.YAMLError) as e:
        p.error(str(e))
    missing = _stale(equivalents, found, specs, operators)
    if missing and not set(chosen) >= set(EVERY_BACKEND):  # stale only if no backend's body has the mutant
        touched = [s for s in specs if any(key.split(":")[0] == s.stem for key in missing)]
        elsewhere = {m.id for s in touched for m in mutants_of(s, EVERY_BACKEND, operators)}
        missing = [key for key in missing if key not in elsewhere]
    for stale in missing:
        print(f"note: {a.equivalents.name}: {stale} is no mutant of the spec as it is now (edited since?)",
              file=sys.stderr)
    if a.mutant:
        unknown = sorted(set(a.mutant) - {m.id for m in found})
        if unknown:
            p.error(f"no such mutant: {', '.join(unknown)} (see --list)")
        found = [m for m in found if m.id in a.mutant]
    if a.sample is not None:
        found = sorted(random.Random(a.seed).sample(found, min(a.sample, len(found))), key=found.index)
    if a.limit is not None:
        found = found[: a.limit]
    if a.list:
        for m in found:
            print(f"{m.id}  {m.site}  [{','.join(m.backends)}]  {m.change}")
        print(f"{len(found)} mutant(s)")
        return 0
    if not found:
        print("no mutants")
        return 0

    todo, others = found, []
    if a.resume:
        try:
            recorded, entries = _recorded(a.resume, chosen)
            others = _others(entries, found)
        except ValueError as e:
            p.error(str(e))
        for m in found:
            m.outcome, m.detail, m.seconds = recorded.get((m.id, m.change), ("", "", 0.0))
        todo = [m for m in found if not m.outcome]
        print(f"{len(found) - len(todo)} of {len(found)} mutant(s) judged in {a.resume}; running the rest",
              file=sys.stderr)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kspec-mutation-") as tmp:
        runner = Runner(Path(tmp), a.seed, a.timeout, a.task_timeout, a.schedules, equivalents, a.check_only)
        signal.signal(signal.SIGTERM, _stopped)  # `timeout`'s signal stops a run as Ctrl-C does
        pool = concurrent.futures.ThreadPoolExecutor(max(1, a.jobs))
        futures = [pool.submit(runner.run, m) for m in todo]
        try:
            for k, done in enumerate(concurrent.futures.as_completed(futures), 1):
                m = done.result()
                print(f"[{k}/{len(todo)}] {m.id}: {m.outcome} ({m.seconds:.1f} s) {m.detail}", file=sys.stderr)
                if a.resume:
                    _write(a.resume, _doc(a, chosen, found, time.monotonic() - started, others))
        except KeyboardInterrupt:  # stopped: keep what was judged, leave the mutants in flight
            pool.shutdown(wait=False, cancel_futures=True)
            if a.resume:
                judged = sum(bool(m.outcome) for m in found)
                print(f"stopped; {a.resume} holds the results of {judged} of {len(found)} mutant(s): rerun with --resume to go on",
                      file=sys.stderr)
            sys.stderr.flush()
            os._exit(130)
        pool.shutdown()
    total = time.monotonic() - started

    print(_table(found, "operator", "operator"))
    print()
    print(_table(found, "name", "spec"))
    print()
    survivors = [m for m in found if m.outcome in ("survived", "timeout")]
    for m in survivors:
        print(f"{m.outcome}: {m.id}  {m.site}  {m.change}")
    ran = len(todo)
    print(f"{ran} mutant(s) run in {total:.0f} s ({total / max(ran, 1):.1f} s per mutant, --jobs {a.jobs})"
          + (f"; {len(found) - ran} judged before" if len(found) > ran else ""))
    doc = _doc(a, chosen, found, total)
    if a.resume:
        _write(a.resume, _doc(a, chosen, found, total, others))
    if a.json == "-":
        print(json.dumps(doc, indent=2, default=list))
    elif a.json:
        _write(Path(a.json), doc)
    return 1 if survivors else 0


def _stopped(signum, frame):
    raise KeyboardInterrupt


FIELDS = ("id", "name", "operator", "site", "line", "col", "change", "backends", "outcome", "detail", "seconds")


def _doc(a: argparse.Namespace, chosen: tuple, found: list, seconds: float, others: list = ()) -> dict:
    """The results so far: every mutant with an outcome (those still running or waiting have none),
    and `others`, the entries of a resumed file that this run's selection left out, as they were."""
    return {"seed": a.seed, "backends": list(chosen), "seconds": round(seconds, 1),
            "mutants": [{f: getattr(m, f) for f in FIELDS} for m in found if m.outcome] + list(others)}


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=list) + "\n")
    os.replace(tmp, path)  # a run stopped mid-write leaves the last whole file


def _others(entries: list, found: list) -> list:
    """The entries of a results file for mutants this run did not select (another --spec, --operator or
    --sample): a resumed run that judges a part keeps the rest of the file."""
    selected = {(m.id, m.change) for m in found}
    return [e for e in entries if (e["id"], e["change"]) not in selected]


def _recorded(path: Path, chosen: tuple) -> tuple:
    """({(id, change): (outcome, detail, seconds)} of the verdicts, every entry) of a results file of the same
    backends."""
    if not path.exists():
        return {}, []
    try:
        doc = json.loads(path.read_text())
        entries = doc["mutants"]
        backends = doc["backends"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a results file of this script ({e})") from None
    if sorted(backends) != sorted(chosen):
        raise ValueError(f"{path}: its mutants were judged on {', '.join(backends)}, not {', '.join(chosen)}")
    return {(e["id"], e["change"]): (e["outcome"], e["detail"], e["seconds"])
            for e in entries if e.get("outcome") in OUTCOMES}, entries


if __name__ == "__main__":
    sys.exit(main())
