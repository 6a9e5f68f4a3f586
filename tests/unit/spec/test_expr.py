"""The expression language: a whitelist over `ast`, evaluated without eval()."""

from __future__ import annotations

import pytest

from kspec.codegen.spec.expr import ExprError, NotEvaluable, parse_expr, parse_index_map

ENV = {"M": 40, "N": 384, "bm": 16, "bn": 128}


@pytest.mark.parametrize(
    "source, value",
    [
        ("M", 40),
        ("7", 7),
        ("M + N", 424),
        ("N - M", 344),
        ("M * 2", 80),
        ("N // bn", 3),
        ("M % bm", 8),
        ("-M", -40),
        ("min(M, N)", 40),
        ("max(M, N, 1000)", 1000),
        ("cdiv(M, bm)", 3),
        ("cdiv(N, bn) * bn", 384),
        ("(M + bm - 1) // bm", 3),
        ("M < N", True),
        ("M <= 40 < N", True),
        ("M == 41", False),
        ("M != 41", True),
        ("N >= 384 and M > 0", True),
        ("not M > 0 or N % bn == 0", True),
        (" M ", 40),
    ],
)
def test_accepted(source, value):
    e = parse_expr(source)
    assert e.eval(ENV) == value
    assert e.source == source.strip()


def test_yaml_numbers_are_constants():
    assert parse_expr(8).eval({}) == 8
    assert parse_expr(8).constant == 8
    assert parse_expr(0.5).eval({}) == 0.5
    assert parse_expr(True).eval({}) is True


def test_names():
    assert parse_expr("cdiv(M, bm) * bn + 1").names == {"M", "bm", "bn"}


@pytest.mark.parametrize(
    "source, message, col",
    [
        ("x.shape", "`Attribute` is not allowed in an expression", 0),
        ("M.__class__", "`Attribute` is not allowed in an expression", 0),
        ("open('f')", "calling anything but min, max, cdiv or next_pow2 is not allowed in an expression", 0),
        ("__import__('os')", "calling anything but min, max, cdiv or next_pow2 is not allowed in an expression", 0),
        ("M + len(x)", "calling anything but min, max, cdiv or next_pow2 is not allowed in an expression", 4),
        ("(lambda: 1)()", "calling anything but min, max, cdiv or next_pow2 is not allowed in an expression", 0),
        ("lambda: 1", "`Lambda` is not allowed in an expression", 0),
        ("'abc'", "the constant 'abc' is not allowed in an expression", 0),
        ("M + 'a'", "the constant 'a' is not allowed in an expression", 4),
        ("b'x'", "the constant b'x' is not allowed in an expression", 0),
        ("None", "the constant None is not allowed in an expression", 0),
        ("1j", "the constant 1j is not allowed in an expression", 0),
        ("x[0]", "`Subscript` is not allowed in an expression", 0),
        ("M ** 2", "operator `Pow` is not allowed in an expression", 0),
        ("M / 2", "operator `Div` is not allowed in an expression", 0),
        ("M << 2", "operator `LShift` is not allowed in an expression", 0),
        ("M & 1", "operator `BitAnd` is not allowed in an expression", 0),
        ("~M", "operator `Invert` is not allowed in an expression", 0),
        ("M in N", "this comparison is not allowed in an expression", 0),
        ("M is N", "this comparison is not allowed in an expression", 0),
        ("[M]", "`List` is not allowed in an expression", 0),
        ("{M: 1}", "`Dict` is not allowed in an expression", 0),
        ("(q := M)", "`NamedExpr` is not allowed in an expression", 1),
        ("M if N else 1", "a conditional (`a if c else b`) outside an index map is not allowed in an expression", 0),
        ("f'{M}'", "`JoinedStr` is not allowed in an expression", 0),
        ("[i for i in M]", "`ListComp` is not allowed in an expression", 0),
        ("min(*M)", "keyword or starred arguments is not allowed in an expression", 0),
        ("max(M, key=N)", "keyword or starred arguments is not allowed in an expression", 0),
        ("min(M)", "`min` with 1 arguments is not allowed in an expression", 0),
        ("cdiv(M)", "`cdiv` with 1 arguments is not allowed in an expression", 0),
        ("cdiv(M, N, 1)", "`cdiv` with 3 arguments is not allowed in an expression", 0),
        ("(M, N)", None, 0),  # a tuple is fine at the top level (index maps use it) ...
        ("min((M, N), 1)", "`Tuple` is not allowed in an expression", 4),  # ... but nowhere else
    ],
)
def test_rejected(source, message, col):
    if message is None:
        assert parse_expr(source).eval(ENV) == (40, 384)
        return
    with pytest.raises(ExprError) as info:
        parse_expr(source)
    assert (info.value.code, info.value.message, info.value.col) == ("E300", message, col)


@pytest.mark.parametrize(
    "source, message",
    [
        ("M +", "invalid expression: invalid syntax"),
        ("(M", "invalid expression: '(' was never closed"),
        ("M; import os", "invalid expression: invalid syntax"),
        ("", "invalid expression: invalid syntax"),
        ("(" * 300 + "M" + ")" * 300, "invalid expression: too many nested parentheses"),
        ("M" * 1001, "expression longer than 1000 characters"),
    ],
)
def test_syntax_errors(source, message):
    with pytest.raises(ExprError) as info:
        parse_expr(source)
    assert (info.value.code, info.value.message) == ("E300", message)


def test_not_a_string():
    with pytest.raises(ExprError, match="expected an expression, got list"):
        parse_expr([1])


@pytest.mark.parametrize(
    "source, code, message",
    [
        ("Q + 1", "E301", "unknown name `Q`"),
        ("M // (bm - 16)", "E303", "division by zero in `M // (bm - 16)`"),
        ("M % 0", "E303", "division by zero in `M % 0`"),
        ("cdiv(M, 0)", "E303", "division by zero in `cdiv(M, 0)`"),
        ("N * N * N * N * N * N * N * N", "E303", "`N * N * N * N * N * N * N * N` is too large"),
    ],
)
def test_evaluation_errors(source, code, message):
    with pytest.raises(ExprError) as info:
        parse_expr(source).eval(ENV)
    assert (info.value.code, info.value.message) == (code, message)


def test_a_huge_yaml_int_is_a_located_error_not_a_crash():
    """`grid: {b: 1180591620717411303424}` (found by tests/test_fuzz.py): a literal from YAML is
    bounded like any expression, at column 0 of its value."""
    with pytest.raises(ExprError) as info:
        parse_expr(1180591620717411303424).eval(ENV)
    assert (info.value.code, info.value.message, info.value.col) == ("E303", "`1180591620717411303424` is too large", 0)
    assert parse_expr(1 << 40).eval(ENV) == 1 << 40


def test_render_spells_cdiv_for_generated_code():
    assert parse_expr("cdiv(M, bm)").render() == "pl.cdiv(M, bm)"
    assert parse_expr("max(cdiv(M, bm), 1) * bn").render() == "max(pl.cdiv(M, bm), 1) * bn"
    assert parse_expr("(M + 1) * 2").render() == "(M + 1) * 2"
    assert parse_expr(8).render() == "8"


# -- index maps ---------------------------------------------------------------------------


def test_index_map_parse_and_eval():
    m = parse_index_map("i, j -> (i, 0)")
    assert m.args == ("i", "j")
    assert [r.source for r in m.results] == ["i", "0"]
    assert m.eval({"i": 3, "j": 5}) == (3, 0)
    assert m.names == frozenset()


def test_index_map_forms():
    assert parse_index_map("i -> i").eval({"i": 2}) == (2,)
    assert parse_index_map("i -> (i,)").eval({"i": 2}) == (2,)
    assert parse_index_map(" -> (0, 0)").args == ()
    assert parse_index_map("i,j,k->(k,j)").eval({"i": 0, "j": 1, "k": 2}) == (2, 1)
    m = parse_index_map("i, j -> (i * bm // 8, cdiv(j, 2))")
    assert m.names == {"bm"}
    assert m.eval({"i": 1, "j": 3, "bm": 16}) == (2, 2)


def test_index_map_render():
    assert parse_index_map("i, j -> (i, j)").render() == "lambda i, j: (i, j)"
    assert parse_index_map("i -> i").render() == "lambda i: (i,)"
    assert parse_index_map("i, j -> (cdiv(i, 2), 0)").render() == "lambda i, j: (pl.cdiv(i, 2), 0)"
    assert parse_index_map(" -> (0,)").render() == "lambda : (0,)"


def test_index_map_reads_a_prefetch_array_of_any_rank_one_index_per_dim():
    import numpy as np

    m = parse_index_map("b, i, pt -> (pt[b, i], 0)", subscripts=True)
    table = np.arange(6).reshape(2, 3)
    assert m.eval({"b": 1, "i": 2, "pt": table}) == (5, 0)
    assert m.render() == "lambda b, i, pt: (pt[b, i], 0)"
    with pytest.raises(ExprError, match=r"`pt\[b, i\]` reads index 3 of 3 along dim 1"):
        m.eval({"b": 1, "i": 3, "pt": table})
    with pytest.raises(ExprError, match=r"`pt\[i\]` gives 1 index to an array of rank 2"):
        parse_index_map("i, pt -> (pt[i],)", subscripts=True).eval({"i": 0, "pt": table})


def test_index_map_conditionals_evaluate_both_sides_and_render_as_jnp_where():
    m = parse_index_map("i, j -> (select(i > 0, i - 1, 0), j if 0 < j < 3 and not i else 2)", subscripts=True)
    assert [m.eval({"i": i, "j": j}) for i, j in ((0, 1), (2, 1), (0, 3))] == [(0, 1), (1, 2), (0, 2)]
    assert m.render() == ("lambda i, j: (jnp.where(i > 0, i - 1, 0), jnp.where(jnp.logical_and(jnp.logical_and(0 < j, "
                          "j < 3), jnp.logical_not(i)), j, 2))")
    reads = parse_index_map("i, idx -> (idx[i] if i < 2 else idx[i - 2],)", subscripts=True)
    with pytest.raises(ExprError, match=r"`idx\[i - 2\]` reads index -2 of 2"):
        reads.eval({"i": 0, "idx": [7, 9]})  # the side not chosen is computed too (jnp.where)
    with pytest.raises(ExprError, match="a conditional \\(`a if c else b`\\) outside an index map is not allowed"):
        parse_expr("M if N else 1")
    with pytest.raises(ExprError, match="calling anything but min, max, cdiv or next_pow2"):
        parse_expr("select(M, N, 1)")


def test_index_map_subscripts_only_when_allowed():
    m = parse_index_map("i, idx -> (idx[i], 0)", subscripts=True)
    assert m.names == frozenset()
    with pytest.raises(NotEvaluable):
        m.eval({"i": 0, "idx": None})
    assert m.eval({"i": 1, "idx": [7, 9]}) == (9, 0)
    with pytest.raises(ExprError, match=r"`idx\[i\]` reads index 2 of 2"):
        m.eval({"i": 2, "idx": [7, 9]})
    with pytest.raises(ExprError, match="`Subscript` is not allowed"):
        parse_index_map("i, idx -> (idx[i], 0)")
    for bad in ("i, idx -> (idx[0:2],)", "i, idx -> (idx[i, 0:2],)", "i, idx -> (idx[()],)", "i -> (f(i)[0],)"):
        with pytest.raises(ExprError):
            parse_index_map(bad, subscripts=True)


@pytest.mark.parametrize(
    "source, code, message, col",
    [
        ("i (i,)", "E302", "an index_map needs exactly one `->`, as in `i, j -> (i, j)`", 0),
        ("i -> j -> (i,)", "E302", "an index_map needs exactly one `->`, as in `i, j -> (i, j)`", 0),
        ("i.x -> (i,)", "E302", "index_map argument `i.x` is not a plain name", 0),
        ("min -> (0,)", "E302", "index_map argument `min` is not a plain name", 0),
        ("i, i -> (i,)", "E302", "index_map arguments must be distinct", 0),
        ("i -> (i.real,)", "E300", "`Attribute` is not allowed in an expression", 6),
        ("i -> (__import__('os'),)", "E300", "calling anything but min, max, cdiv, next_pow2, ds or select is not allowed in an expression", 6),
        ("i -> (select(i, 0),)", "E300", "`select` with 2 arguments is not allowed in an expression", 6),
        ("i -> (*i,)", "E300", "a starred element is not allowed in an expression", 6),
        ("i -> ", "E300", "invalid expression: invalid syntax", 5),
    ],
)
def test_index_map_rejected(source, code, message, col):
    with pytest.raises(ExprError) as info:
        parse_index_map(source, subscripts=True)
    assert (info.value.code, info.value.message, info.value.col) == (code, message, col)


def test_index_map_not_a_string():
    with pytest.raises(ExprError) as info:
        parse_index_map(3)
    assert info.value.code == "E302"
