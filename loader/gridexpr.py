"""Grid expressions from the manifest, such as ``cdiv(n, 256)`` or ``batch * heads``.

The text is parsed with `ast` and only a small whitelist of node types is accepted:
integer literals, names, ``+ - * //``, unary minus, and calls of ``cdiv``, ``min`` and
``max``. It is evaluated by walking that tree with Python integers — never `eval` — so a
manifest cannot run code.
"""
from __future__ import annotations

import ast
import operator
from typing import Callable, Mapping


class GridExprError(ValueError):
    pass


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of b cover a."""
    return -(-a // b)


def magic_u32(divisor: int) -> int:
    """The kernels' divide-by-multiply constant: ceil(2^32 / divisor), with which
    (n * magic) >> 32 = n // divisor for the ids they divide; 0 for divisor 1 (the kernels
    then take n itself, as the constant would not fit 32 bits)."""
    return 0 if divisor == 1 else cdiv(2**32, divisor)


FUNCTIONS: dict[str, Callable[..., int]] = {"cdiv": cdiv, "min": min, "max": max}
_ARITY = {"cdiv": (2, 2), "min": (2, None), "max": (2, None)}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv}


class GridExpr:
    """One parsed expression; `names` are the free variables it needs."""

    def __init__(self, text: str | int):
        self.text = str(text)
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as exc:
            raise GridExprError(f"'{self.text}' is not a valid expression: {exc.msg}") from None
        self.names: set[str] = set()
        self._check(tree.body)
        self._tree = tree.body

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise GridExprError(f"'{self.text}': only integer literals are allowed, got {node.value!r}")
        elif isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                raise GridExprError(f"'{self.text}': {node.id} is a function; call it")
            self.names.add(node.id)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            self._check(node.left)
            self._check(node.right)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            self._check(node.operand)
        elif isinstance(node, ast.Call):
            self._check_call(node)
        else:
            raise GridExprError(f"'{self.text}': '{ast.unparse(node)}' is not allowed "
                                f"(only integers, names, + - * //, and {', '.join(FUNCTIONS)})")

    def _check_call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise GridExprError(f"'{self.text}': unknown function '{ast.unparse(node.func)}' "
                                f"(allowed: {', '.join(FUNCTIONS)})")
        if node.keywords:
            raise GridExprError(f"'{self.text}': {node.func.id}() takes no keyword arguments")
        low, high = _ARITY[node.func.id]
        if len(node.args) < low or (high is not None and len(node.args) > high):
            wanted = f"{low}" if low == high else f"at least {low}"
            raise GridExprError(f"'{self.text}': {node.func.id}() takes {wanted} arguments, "
                                f"got {len(node.args)}")
        for arg in node.args:
            self._check(arg)

    def evaluate(self, env: Mapping[str, int]) -> int:
        missing = sorted(self.names - env.keys())
        if missing:
            raise GridExprError(f"'{self.text}': no value for {', '.join(missing)}")
        try:
            return self._eval(self._tree, env)
        except ZeroDivisionError:
            shown = ", ".join(f"{n}={env[n]}" for n in sorted(self.names))
            raise GridExprError(f"'{self.text}' divides by zero with {shown}") from None

    def _eval(self, node: ast.AST, env: Mapping[str, int]) -> int:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return int(env[node.id])
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](self._eval(node.left, env), self._eval(node.right, env))
        if isinstance(node, ast.UnaryOp):
            return -self._eval(node.operand, env)
        assert isinstance(node, ast.Call)  # _check admitted nothing else
        return FUNCTIONS[node.func.id](*(self._eval(a, env) for a in node.args))

    def __repr__(self) -> str:
        return f"GridExpr({self.text!r})"
