import math

import pytest

from gfxasm.gridexpr import GridExpr, GridExprError, cdiv


@pytest.mark.parametrize("text, env, value", [
    ("cdiv(n, 256)", {"n": 1000}, 4),
    ("cdiv(n, 256)", {"n": 1024}, 4),
    ("cdiv(n, 256)", {"n": 1025}, 5),
    ("cdiv(n, 256)", {"n": 0}, 0),
    ("batch * heads", {"batch": 3, "heads": 7}, 21),
    ("min(m, 8) + max(k // 32, 1)", {"m": 5, "k": 31}, 6),
    ("max(a, b, c) - min(a, b, c)", {"a": 4, "b": 9, "c": 2}, 7),
    ("-x + 10", {"x": 3}, 7),
    ("cdiv(cdiv(s, 64) * h, 2)", {"s": 257, "h": 3}, 8),
    ("42", {}, 42),
])
def test_evaluates_whitelisted_expressions(text, env, value):
    assert GridExpr(text).evaluate(env) == value


def test_cdiv_is_ceiling_division():
    for a in range(0, 50):
        for b in range(1, 9):
            assert cdiv(a, b) == math.ceil(a / b)


def test_names_are_the_free_variables():
    assert GridExpr("cdiv(n, block) * max(h, 1)").names == {"n", "block", "h"}
    assert GridExpr(1).names == set()


@pytest.mark.parametrize("text, complaint", [
    ("__import__('os').system('true')", "unknown function"),
    ("n.bit_length()", "unknown function"),
    ("n.real", "not allowed"),
    ("2 ** n", "not allowed"),
    ("n / 2", "not allowed"),
    ("n % 2", "not allowed"),
    ("n < 2", "not allowed"),
    ("x[0]", "not allowed"),
    ("(lambda: 1)()", "unknown function"),
    ("1.5 * n", "only integer literals"),
    ("'a'", "only integer literals"),
    ("True", "only integer literals"),
    ("cdiv(n, b=2)", "keyword"),
    ("cdiv(n)", "takes 2 arguments"),
    ("min(n)", "at least 2"),
    ("pow(n, 2)", "unknown function"),
    ("cdiv", "is a function"),
    ("cdiv(n, ", "not a valid expression"),
])
def test_refuses_everything_else(text, complaint):
    with pytest.raises(GridExprError, match=complaint) as error:
        GridExpr(text)
    assert text.strip() in str(error.value)


def test_missing_name_and_division_by_zero_are_reported():
    with pytest.raises(GridExprError, match="no value for h, n"):
        GridExpr("n * h").evaluate({})
    with pytest.raises(GridExprError, match=r"divides by zero with b=0, n=5"):
        GridExpr("n // b").evaluate({"n": 5, "b": 0})
    with pytest.raises(GridExprError, match="divides by zero"):
        GridExpr("cdiv(n, b)").evaluate({"n": 5, "b": 0})
