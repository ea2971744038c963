"""Algorithm selection: a table of (op, size, world) -> algorithm, and the override string."""

from __future__ import annotations

import pytest

from ringtorch.collectives.algorithms.select import (
    ALGORITHMS,
    TABLE,
    Choice,
    choose,
    parse_overrides,
)

KB = 1024


@pytest.mark.parametrize(("op", "nbytes", "world", "algorithm"), [
    ("all_reduce", 4, 2, "recursive_doubling"),
    ("all_reduce", 1 * KB, 4, "recursive_doubling"),
    ("all_reduce", 1 * KB, 3, "direct"),
    ("all_reduce", 1 * KB, 6, "direct"),
    ("all_reduce", 1 * KB, 12, "recursive_doubling"),
    ("all_reduce", 256 * KB, 3, "direct"),
    ("all_reduce", 256 * KB + 1, 2, "ring"),
    ("all_reduce", 64 * KB * KB, 3, "ring"),
    ("all_reduce", 64 * KB * KB, 1, "recursive_doubling"),
    ("broadcast", 1 * KB, 4, "tree"),
    ("broadcast", 64 * KB * KB, 2, "tree"),
    ("broadcast", 64 * KB * KB, 3, "chain"),
    ("reduce", 1 * KB, 4, "direct"),
    ("reduce", 64 * KB * KB, 4, "ring"),
    ("reduce", 64 * KB * KB, 2, "ring"),
    ("reduce", 64 * KB * KB, 1, "direct"),
    ("all_gather", 1 * KB, 4, "direct"),
    ("all_gather", 64 * KB * KB, 4, "ring"),
    ("reduce_scatter", 1 * KB, 3, "direct"),
    ("reduce_scatter", 64 * KB * KB, 3, "ring"),
    ("reduce_scatter", 64 * KB * KB, 2, "ring"),
    ("gather", 64 * KB * KB, 4, "direct"),
    ("scatter", 1, 4, "direct"),
    ("all_to_all", 1, 4, "direct"),
    ("barrier", 0, 4, "dissemination"),
])
def test_default_choice(op, nbytes, world, algorithm):
    assert choose(op, nbytes, world, same_host=True).algorithm == algorithm


def test_segment_is_larger_on_one_host_than_across_hosts():
    assert choose("all_reduce", 1, 2, True) == Choice("recursive_doubling", TABLE.segment_same_host)
    assert choose("all_reduce", 1, 2, False).segment_nbytes == TABLE.segment_remote


def test_every_default_is_an_algorithm_of_its_op():
    for op, algorithms in ALGORITHMS.items():
        for nbytes in (0, KB, 10**9):
            for world in range(1, 10):
                assert choose(op, nbytes, world, True).algorithm in algorithms


def test_overrides_force_algorithm_and_segment():
    overrides = parse_overrides(" all_reduce=ring, broadcast=chain ,segment=4096")
    assert overrides == {"all_reduce": "ring", "broadcast": "chain", "segment": "4096"}
    assert choose("all_reduce", 4, 2, True, overrides) == Choice("ring", 4096)
    assert choose("all_gather", 4, 2, True, overrides) == Choice("direct", 4096)
    assert parse_overrides("") == {}


@pytest.mark.parametrize(("text", "message"), [
    ("allreduce=ring", r"^bad algorithm override 'allreduce=ring': expected op=algorithm with op "
                       r"one of \['all_gather', "),
    ("all_reduce=tree", r"^bad algorithm override 'all_reduce=tree': all_reduce has algorithms "
                        r"\['direct', 'recursive_doubling', 'ring', 'scatter_gather'\]$"),
    ("segment=0", r"^bad algorithm override 'segment=0': segment takes a positive number of "
                  r"bytes$"),
    ("ring", r"^bad algorithm override 'ring'"),
])
def test_bad_overrides_are_rejected_with_the_valid_names(text, message):
    with pytest.raises(ValueError, match=message):
        parse_overrides(text)


def test_unknown_op_is_rejected():
    with pytest.raises(ValueError, match=r"^unknown collective 'allreduce'; known: \["):
        choose("allreduce", 1, 2, True)
