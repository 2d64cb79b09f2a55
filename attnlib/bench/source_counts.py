"""Counted in a function's source: the matrix products it does, and its lines of code.

The benchmark counts FLOPs by a convention (:mod:`attnlib.bench.flops`): a forward pass
is *counted as* two products of size (T, T, d), a backward pass as five. What a given
implementation computes can differ, so chapter 13 counts the products in the code that
runs: every ``a @ b`` (NumPy, torch) and every ``tl.dot(...)`` (Triton) in a function's
source, read with :mod:`ast`, so that comments, docstrings and strings are never counted.

    >>> def two_products(p, v, k):
    ...     '''p @ v in a docstring is not counted'''
    ...     return (p @ v) @ k.T  # nor is this one: p @ k
    >>> count_products(two_products)
    2
    >>> code_lines(two_products)  # the def line and the return line
    2
"""

import ast
import inspect
import textwrap


def _source_tree(fn):
    fn = getattr(fn, "fn", fn)  # a @triton.jit function keeps the Python one in .fn
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))


def _is_product(node):
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "dot" and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "tl")


def count_products(*functions):
    """The number of matrix products (``@``, ``@=`` and ``tl.dot``) written in ``functions``' code, summed.

    A product inside a loop is counted once: this is the number of products per
    visited (query block, key block) pair, which is what makes a block-by-block
    pass cost that many products of size (T, T, d) over the whole matrix.
    """
    return sum(sum(_is_product(node) for node in ast.walk(_source_tree(fn))) for fn in functions)


def code_lines(fn):
    """Lines of ``fn``'s source that hold code: its decorators and signature and every
    line of its body, less blank lines, comment lines and the docstring."""
    fn = getattr(fn, "fn", fn)
    source = textwrap.dedent(inspect.getsource(fn))
    definition = ast.parse(source).body[0]
    docstring = set()
    if ast.get_docstring(definition, clean=False) is not None:
        first = definition.body[0]
        docstring = set(range(first.lineno, first.end_lineno + 1))
    return sum(1 for number, line in enumerate(source.splitlines(), start=1)
               if number not in docstring and line.strip() and not line.strip().startswith("#"))
