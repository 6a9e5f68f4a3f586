"""kspec: declare JAX Pallas kernels in YAML; check, generate, verify, bench and tune them.

The repository root is the `kspec` import package (pyproject.toml maps it): `cli.py`
is `kspec.cli`, the toolchain is `kspec.codegen`, and `schema/` and `templates/` are
package data read through importlib.resources.
"""

__version__ = "0.1.0"
