"""Stage 5: the checked model -> the generated package's files (text, no banner yet).

Each file's template gets its context from the module of emit/ that builds it: signature.py
(what every module shares), kernel.py with blocks.py and mesh.py (a backend's module),
package.py (__init__, reference, _tuning, _dispatch), vjp.py and sharded.py; source.py spells
the Python they are made of.

Templates in templates/ receive plain strings built here; spec text reaches them only
as data (never as template source), so `{{ }}` in a spec is inert. Every accepted
spec renders Python that parses: render() checks that before returning.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from importlib import resources
from pathlib import Path

import jinja2

from kspec.codegen.backends import BACKENDS
from kspec.codegen.emit import kernel, package as pkg, sharded, vjp
from kspec.codegen.emit.signature import Signature
from kspec.codegen.spec.model import KernelSpec, SpecKind

TEMPLATES = Path(str(resources.files("kspec") / "templates"))


def _docstring(text: str, indent: int) -> str:
    """Text safe inside a triple-quoted docstring, continuation lines indented.

    Backslashes and every double quote are escaped, so no spec text can end the
    string early, whatever it holds."""
    text = (text or "").strip().replace("\\", "\\\\").replace('"', '\\"')
    pad = " " * indent
    return "\n".join((pad + line if line.strip() and i else line.rstrip()) for i, line in enumerate(text.splitlines()))


def _indent_code(source: str, indent: int) -> str:
    return textwrap.indent(source.rstrip("\n") + "\n", " " * indent).rstrip("\n")


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["docstring"] = _docstring
    env.filters["indent_code"] = _indent_code
    env.filters["indent_lines"] = lambda text, n: textwrap.indent(text, " " * n)  # blank lines stay empty
    return env


def render(spec: KernelSpec, spec_path: str, tuned: dict | None = None, linked: tuple = (),
           package: str = "generated") -> dict:
    """{relative file name: content} for generated/<name>/. Content has no banner.

    `tuned`: {device_kind: [tuning entries]} from tuning/<name>/ (see codegen.tuning).
    `linked`: the backward KernelSpecs of the spec's `vjp:`, in order.
    `package`: the output folder's import path, as the docstrings show it.
    """
    sig = Signature(spec, package)
    env = _env()
    files = {
        "_tuning.py": env.get_template("tuning.py.j2").render(pkg.tuning(sig, tuned or {}, linked)),
        "__init__.py": env.get_template("package.py.j2").render(pkg.init(sig, spec_path)),
        "_signature.py": env.get_template("signature.py.j2").render(sig.signature()),
        "reference.py": env.get_template("reference.py.j2").render(pkg.reference(sig)),
        "_dispatch.py": env.get_template("dispatch.py.j2").render(pkg.dispatch(sig)),
    }
    for name, variant in spec.variants.items():
        template = "mesh.py.j2" if spec.kind == SpecKind.MESH else BACKENDS[name].template
        files[f"{name}.py"] = env.get_template(template).render(kernel.kernel(sig, variant))
    if spec.sharding is not None:
        files["sharded.py"] = env.get_template("sharded.py.j2").render(sharded.sharded(sig))
    if spec.vjp is not None:
        files["_vjp.py"] = env.get_template("vjp.py.j2").render(vjp.vjp(sig, linked))
    for fname, text in files.items():
        ast.parse(text, filename=f"generated/{spec.name}/{fname}")  # a bug in kspec if this fails
    return files
