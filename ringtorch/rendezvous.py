"""init_method URLs -> (store, rank, world_size): torch's rendezvous, scheme by scheme.

``rendezvous(url, rank=-1, world_size=-1, **kwargs)`` returns a generator, as torch's does:
its first ``next()`` gives ``(store, rank, world_size)``, a second raises ("Unable to perform
re-rendezvous using tcp:// method"). Handlers are registered by scheme
(``register_rendezvous_handler``); ``tcp``, ``file`` and ``env`` come built in.

Where rank and world size come from (first found wins, as in torch, plus launchers torch
does not read):

1. the ``rank``/``world_size`` arguments (merged into the URL's query; giving them both in the
   query and as arguments is an error);
2. the URL query ``?rank=R&world_size=N``;
3. for ``env://`` only, the environment: ``RANK``/``WORLD_SIZE``, then SLURM (``SLURM_PROCID``/
   ``SLURM_NTASKS``), then Open MPI's mpirun (``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``),
   then MPICH/Hydra's (``PMI_RANK``/``PMI_SIZE``). ``env://`` needs ``MASTER_ADDR`` and
   ``MASTER_PORT`` in every case.

``tcp://`` and ``env://`` make a TCPStore whose rank 0 is the master (``multi_tenant=True``;
with ``TORCHELASTIC_USE_AGENT_STORE=True`` every rank is a client of the launcher's store).
``file://`` makes a FileStore. The URL parsing is pure (``parse_*``) and unit-tested apart.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse, urlunparse

from ringtorch.store import FileStore, Store, TCPStore

DEFAULT_PG_TIMEOUT = timedelta(minutes=30)

RendezvousResult = tuple[Store, int, int]
Handler = Callable[..., Iterator[RendezvousResult]]

_handlers: dict[str, Handler] = {}

# Environment variables giving (rank, world size, local rank), in the order they are tried.
RANK_SOURCES: tuple[tuple[str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)


class UnknownRendezvousSchemeError(ValueError, RuntimeError):
    """No handler is registered for the URL's scheme. A ValueError, and a RuntimeError as
    torch raises, so either ``except`` clause catches it."""


def register_rendezvous_handler(scheme: str, handler: Handler) -> None:
    """Register ``handler`` for URLs ``scheme://...``: a generator function called as
    ``handler(url, **kwargs)`` that yields ``(store, rank, world_size)``.

    Raises:
        RuntimeError: a handler for ``scheme`` is already registered.
    """
    if scheme in _handlers:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _handlers[scheme] = handler


def rendezvous(url: str, rank: int = -1, world_size: int = -1,
               **kwargs: Any) -> Iterator[RendezvousResult]:
    """A generator of ``(store, rank, world_size)`` for ``url`` (see the module docstring).

    Raises:
        RuntimeError: url is not a string, or rank/world_size are not integers.
        UnknownRendezvousSchemeError: no handler for the URL's scheme.
        ValueError: (on ``next()``) a parameter or variable is missing; the message names it.
    """
    if not isinstance(url, (str, bytes)):
        raise RuntimeError(f"`url` must be a string. {type(url)}: {url}")
    if not isinstance(rank, numbers.Integral):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if not isinstance(world_size, numbers.Integral):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    if isinstance(url, bytes):
        url = url.decode()
    return _rendezvous_helper(url, int(rank), int(world_size), **kwargs)


def _rendezvous_helper(url: str, rank: int, world_size_opt: int | None,
                       **kwargs: Any) -> Iterator[RendezvousResult]:
    url = merge_rank_into_url(url, rank, world_size_opt, os.environ)
    scheme = urlparse(url).scheme
    if scheme not in _handlers:
        supported = ", ".join(f"{s}://" for s in sorted(_handlers))
        raise UnknownRendezvousSchemeError(
            f"No rendezvous handler for {scheme}:// (init_method {url!r}); supported: "
            f"{supported}; add one with register_rendezvous_handler")
    return _handlers[scheme](url, **kwargs)


# ----- pure parsing ------------------------------------------------------------------------


def query_to_dict(query: str) -> dict[str, str]:
    """``"rank=0&world_size=2"`` -> ``{"rank": "0", "world_size": "2"}``.

    Raises:
        ValueError: a part is not ``name=value``.
    """
    result = {}
    for pair in filter(None, query.split("&")):
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"init_method query part {pair!r} is not of the form name=value")
        result[name] = value
    return result


def merge_rank_into_url(url: str, rank: int, world_size_opt: int | None,
                        environ: Mapping[str, str]) -> str:
    """torch's merging of the rank/world_size arguments into the URL's query.

    ``world_size_opt=None`` is torch's internal "take them from the environment" mode.

    Raises:
        AssertionError: the URL's query already has rank or world_size (torch's check).
    """
    result = urlparse(url)
    if world_size_opt is None:
        world_size = -1
        if result.scheme == "env":
            rank = int(environ.get("RANK", rank))
            world_size = int(environ.get("WORLD_SIZE", world_size))
    else:
        world_size = world_size_opt
    if rank == -1 and world_size == -1 and world_size_opt is not None:
        return url
    query = query_to_dict(result.query)
    if "rank" in query or "world_size" in query:
        raise AssertionError(
            f"The url: {url} has node-specific arguments(rank, world_size) already.")
    if rank != -1:
        query["rank"] = str(rank)
    if world_size != -1 or world_size_opt is None:
        query["world_size"] = str(world_size)
    merged = urlunparse(result._replace(query="&".join(f"{k}={v}" for k, v in query.items())))
    if url.startswith(f"{result.scheme}://") and not merged.startswith(f"{result.scheme}://"):
        merged = merged.replace(":", "://", 1)  # keep env:// (urlunparse writes env:?rank=0)
    return merged


def _error(scheme: str, message: str) -> ValueError:
    return ValueError(f"Error initializing torch.distributed using {scheme}:// rendezvous: "
                      f"{message}")


def _int_param(scheme: str, query: Mapping[str, str], name: str, label: str) -> int:
    if name not in query:
        raise _error(scheme, f"{label} parameter missing")
    try:
        return int(query[name])
    except ValueError:
        raise _error(scheme, f"{label} parameter {query[name]!r} is not an integer") from None


@dataclass(frozen=True)
class TcpParams:
    host: str
    port: int
    rank: int
    world_size: int


def parse_tcp(url: str) -> TcpParams:
    """``tcp://host:port?rank=R&world_size=N`` -> its parts (raises torch's ValueErrors)."""
    result = urlparse(url)
    try:
        port = result.port
    except ValueError as exc:
        raise _error("tcp", f"port number invalid ({exc})") from None
    if port is None:
        raise _error("tcp", "port number missing")
    if not result.hostname:
        raise _error("tcp", "host name missing")
    query = query_to_dict(result.query)
    rank = _int_param("tcp", query, "rank", "rank")
    world_size = _int_param("tcp", query, "world_size", "world size")
    return TcpParams(result.hostname, port, rank, world_size)


@dataclass(frozen=True)
class FileParams:
    path: str
    rank: int
    world_size: int


def parse_file(url: str) -> FileParams:
    """``file:///path?rank=R&world_size=N`` -> its parts (raises torch's ValueErrors)."""
    result = urlparse(url)
    if not result.path:
        raise _error("file", "path missing")
    query = query_to_dict(result.query)
    rank = _int_param("file", query, "rank", "rank")
    world_size = _int_param("file", query, "world_size", "world size")
    return FileParams(result.path, rank, world_size)


def _env_value(environ: Mapping[str, str], name: str, hint: str) -> str:
    value = environ.get(name)
    if not value:
        raise _error("env", f"environment variable {name} expected, but not set ({hint})")
    return value


def _env_int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise _error("env", f"environment variable {name}={environ[name]!r} is not an "
                            f"integer") from None


def rank_from_env(environ: Mapping[str, str], which: int) -> tuple[int, str] | None:
    """(value, variable) of the rank (which=0), world size (1) or local rank (2) found in the
    environment following RANK_SOURCES, or None."""
    for names in RANK_SOURCES:
        if environ.get(names[which]):
            return _env_int(environ, names[which]), names[which]
    return None


def parse_env(url: str, environ: Mapping[str, str]) -> TcpParams:
    """``env://[?rank=R&world_size=N]`` + the environment -> the TCPStore to meet at."""
    query = query_to_dict(urlparse(url).query)
    found = []
    for which, name, label in ((0, "rank", "rank"), (1, "world_size", "world size")):
        if name in query:
            found.append(_int_param("env", query, name, label))
            continue
        value = rank_from_env(environ, which)
        if value is None:
            tried = " or ".join(names[which] for names in RANK_SOURCES)
            raise _error("env", f"environment variable {RANK_SOURCES[0][which]} expected, but "
                                f"not set (looked for {tried}; or pass {name}= to "
                                f"init_process_group)")
        found.append(value[0])
    addr = _env_value(environ, "MASTER_ADDR", "the address of rank 0's host; MASTER_PORT is "
                                              "needed too")
    port_text = _env_value(environ, "MASTER_PORT", "a free port on MASTER_ADDR's host")
    try:
        port = int(port_text)
    except ValueError:
        raise _error("env", f"environment variable MASTER_PORT={port_text!r} is not an "
                            f"integer") from None
    return TcpParams(addr, port, found[0], found[1])


# ----- the built-in handlers -----------------------------------------------------------------


def _create_c10d_store(host: str, port: int, rank: int, world_size: int,
                       timeout: timedelta) -> Store:
    if not 0 <= port < 2**16:
        raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
        return TCPStore(host, port, world_size, False, timeout)
    return TCPStore(host, port, world_size, rank == 0, timeout, multi_tenant=True)


def _tcp_rendezvous_handler(url: str, timeout: timedelta = DEFAULT_PG_TIMEOUT,
                            **kwargs: Any) -> Iterator[RendezvousResult]:
    params = parse_tcp(url)
    store = _create_c10d_store(params.host, params.port, params.rank, params.world_size,
                               timeout)
    yield store, params.rank, params.world_size
    raise RuntimeError("Unable to perform re-rendezvous using tcp:// method")


def _env_rendezvous_handler(url: str, timeout: timedelta = DEFAULT_PG_TIMEOUT,
                            **kwargs: Any) -> Iterator[RendezvousResult]:
    params = parse_env(url, os.environ)
    store = _create_c10d_store(params.host, params.port, params.rank, params.world_size,
                               timeout)
    yield store, params.rank, params.world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def _file_rendezvous_handler(url: str, **kwargs: Any) -> Iterator[RendezvousResult]:
    params = parse_file(url)
    store = FileStore(params.path, params.world_size)
    yield store, params.rank, params.world_size
    raise RuntimeError("Unable to perform rerendezvous using file:// method")


register_rendezvous_handler("tcp", _tcp_rendezvous_handler)
register_rendezvous_handler("env", _env_rendezvous_handler)
register_rendezvous_handler("file", _file_rendezvous_handler)

__all__ = ["UnknownRendezvousSchemeError", "register_rendezvous_handler", "rendezvous"]
