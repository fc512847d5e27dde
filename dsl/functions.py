"""The functions the spec language knows, by name, with their arity (what the checker needs; the compiler
maps each name to its sympy form in compiler/exprs.py)."""

FUNCTION_ARITY: dict[str, int] = {
    "exp": 1, "log": 1, "log1p": 1, "sqrt": 1, "abs": 1, "tanh": 1,
    "sigmoid": 1, "logsigmoid": 1, "softplus": 1, "softsign": 1, "silu": 1,
}
