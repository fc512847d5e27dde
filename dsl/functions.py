"""The functions the spec language knows, by name, with their arity (what the checker needs; the compiler
maps each name to its sympy form in compiler/exprs.py)."""

FUNCTION_ARITY: dict[str, int] = {
    "exp": 1, "log": 1, "log1p": 1, "sqrt": 1, "abs": 1, "tanh": 1,
    "sigmoid": 1, "logsigmoid": 1, "softplus": 1, "softsign": 1, "silu": 1,
}

# Channel reductions: name -> (fewest, most) arguments. Unlike the elementwise functions they couple the
# channels of a key- or value-channel vector: sum(x) is a token-level scalar, l2norm(x [, eps]) the vector
# x / sqrt(Σx² + eps). The compiler turns each into a derived per-token value (compiler/lower.py).
REDUCTION_ARITY: dict[str, tuple[int, int]] = {"sum": (1, 1), "l2norm": (1, 2)}
L2NORM_DEFAULT_EPS = 1e-6
