"""Tests wait on state with ``ringtorch.testing.wait_for``, never with a hand-written loop.

A ``while`` loop that calls ``time.sleep`` in a test (or in a program a test runs, written as
a string) repeats ``wait_for`` without its bound or its message: a hang instead of "waited
60 s for rank 1 to start". This test finds such loops by reading the code (AST, no imports),
outside ``ringtorch/testing/`` where ``wait_for`` itself lives. The few loops that are not a
wait (a hang the test is about, a state checked to hold throughout) are listed with why.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, innermost function) -> why the loop there is not a wait.
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/integration/_hang_ranks.py", "stuck_in_sleep"):
        "the hang under test: the hang report must name this loop's time.sleep line",
    ("tests/integration/_hang_ranks.py", "slow_callee"):
        "the hang under test: an RPC callee asleep at a line the hang report names",
    ("tests/unit/test_nccl_lib.py",
     "test_a_nonblocking_init_waiting_for_a_missing_peer_stays_in_progress_until_aborted"):
        "checks that a state holds for the whole 2 s, the opposite of waiting for one",
}


def _calls_sleep(loop: ast.While) -> bool:
    for node in ast.walk(loop):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "sleep" and \
                    isinstance(func.value, ast.Name) and func.value.id == "time":
                return True
            if isinstance(func, ast.Name) and func.id == "sleep":  # from time import sleep
                return True
    return False


def _loops(tree: ast.AST, function: str = "<module>") -> Iterator[tuple[int, str]]:
    """(line, innermost enclosing function) of each sleeping ``while`` loop under ``tree``."""
    for node in ast.iter_child_nodes(tree):
        inner = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
            else function
        if isinstance(node, ast.While) and _calls_sleep(node):
            yield node.lineno, function
        yield from _loops(node, inner)


def _programs(tree: ast.AST) -> Iterator[tuple[int, ast.AST]]:
    """(first line, parsed code) of each string constant that is a Python program with a
    loop in it: the scripts tests hand to ringrun, spawn or ``python -c``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                "while" in node.value and "\n" in node.value:
            try:
                yield node.lineno, ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue  # prose, not a program


def polling_loops(source: str, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of each hand-written polling loop in ``source``, the text of
    the file ``rel``."""
    tree = ast.parse(source, rel)
    found = [(rel, line, function) for line, function in _loops(tree)]
    for first, program in _programs(tree):
        # The program's line n is the file's line first + n - 1 (a string starting with a
        # newline, as these do, puts its line 2 on the line after the quotes).
        found += [(rel, first + line - 1, function) for line, function in _loops(program)]
    return found


@functools.cache  # read once for both tests
def _all_loops() -> tuple[tuple[str, int, str], ...]:
    return tuple(loop for path in sorted((ROOT / "tests").rglob("*.py"))
            if path != Path(__file__).resolve()  # its examples of what the rule finds
            for loop in polling_loops(path.read_text(), str(path.relative_to(ROOT))))


def test_no_test_waits_with_a_hand_written_polling_loop() -> None:
    bad = [f"{rel}:{line} (in {function})" for rel, line, function in _all_loops()
           if (rel, function) not in ALLOWED]
    assert not bad, (
        "hand-written polling loops (a while loop that calls time.sleep) in tests: use "
        "ringtorch.testing.wait_for(predicate, timeout, what=...) so that the wait is bounded "
        "and its failure says what never came, or, where the loop is not a wait, list its "
        "(file, function) in ALLOWED with the reason:\n  " + "\n  ".join(bad))


def test_every_allowed_loop_still_exists() -> None:
    present = {(rel, function) for rel, _, function in _all_loops()}
    assert set(ALLOWED) <= present, f"stale ALLOWED entries: {sorted(set(ALLOWED) - present)}"


def test_the_finder_sees_loops_in_functions_and_in_program_strings() -> None:
    source = textwrap.dedent('''
        import time
        PROGRAM = """
        import os, time
        while not os.path.exists("x"):
            time.sleep(0.01)
        """

        def waits() -> None:
            while True:
                if done():
                    break
                time.sleep(0.1)

        def spins() -> None:
            while not done():  # no sleep: not what this rule is about
                pass
        ''')
    assert polling_loops(source, "probe.py") == [("probe.py", 10, "waits"),
                                                 ("probe.py", 5, "<module>")]
