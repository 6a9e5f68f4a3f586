"""spec/model.py: the closed sets of names a spec chooses from are defined once, as enums whose
members are the YAML strings, and hold exactly the values the JSON Schema allows."""

from __future__ import annotations

import typing

import pytest

from kspec.codegen.backends import BACKENDS, BackendName
from kspec.codegen.spec import model, schema

DEFS = schema.schema()["$defs"]


@pytest.mark.parametrize("names, allowed", [
    (model.SpecKind, schema.schema()["properties"]["kind"]["enum"]),
    (model.MemorySpace, DEFS["block"]["properties"]["memory_space"]["enum"]),
    (model.ScratchKind, DEFS["scratch_entry"]["properties"]["kind"]["enum"]),
    (model.InitKind, DEFS["init"]["properties"]["kind"]["enum"]),
    (model.MeshRole, list(DEFS["mesh"]["properties"])),
    (model.PipeRole, [k for k in DEFS["pipeline"]["properties"] if k in ("in", "out")]),
])
def test_each_set_of_names_is_the_schemas(names, allowed):
    assert [m.value for m in names] == allowed


def test_a_member_is_its_yaml_string():
    assert model.MemorySpace.VMEM == "vmem" and f"{model.MemorySpace.VMEM}" == "vmem"
    assert {model.Role.INPUT: 1}["input"] == 1  # hashes as its string: tables keyed by either agree
    assert model.MemorySpace("smem") is model.MemorySpace.SMEM


def test_the_backends_table_speaks_the_same_names():
    assert tuple(BACKENDS) == typing.get_args(BackendName)
    for backend in BACKENDS.values():
        assert all(isinstance(m, model.MemorySpace) for m in backend.memory_spaces), backend.name
        assert all(isinstance(k, model.ScratchKind) for k in backend.scratch_kinds), backend.name
        assert all(isinstance(k, model.DimKind) for k in backend.block_kinds), backend.name
