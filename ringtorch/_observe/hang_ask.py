"""Asking every rank of a job for its flight record and stacks, through the job's store.

At initialisation each rank publishes where it runs (``ringtorch/hang/info/<rank>``: host,
pid, main thread, stacks file) and starts one daemon thread, the responder, blocked on the
store for the next request addressed to it (``ringtorch/hang/ask/<epoch>/<rank>/<k>``). An
asker (the rank whose collective timed out, ringrun, ``python -m ringtorch.distributed.debug``)
takes a request number, hands the request to every rank and waits a bounded time for the answers
(``ringtorch/hang/answer/<n>/<rank>``: the flight record and the stacks of every thread). A rank
on the asker's host that does not answer in time (its main thread holds the GIL in C code,
say) is sent SIGUSR1 (hang_signal.py): faulthandler, registered at initialisation, writes its
stacks into its stacks file from the C signal handler, without the GIL. A rank that gives
nothing is reported as such; nobody waits longer than ``RINGTORCH_HANG_REPORT_WAIT_S`` plus a
second for signalled stacks. A collective about to time out has its report begun ahead of its
deadline (``report_ahead``), so that the timeout is raised on time with the report complete.

The rule this module keeps: asking never hangs and never breaks the job. Every wait is
bounded, every failure to ask or answer is swallowed (and named in the report), and the
responder costs nothing while no one asks. ``HANG`` is this subsystem's one state object.
The store is any object with ringtorch's Store methods (this layer imports no store).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import IO, Any

from ringtorch import _config
from ringtorch._observe.files import write_json
from ringtorch._observe.hang_report import Answer, analyse, format_report
from ringtorch._observe.hang_signal import SIGNAL, SIGNAL_WAIT_S, signal_all, stacks_header
from ringtorch._observe.recorder import RECORDER

log = logging.getLogger("ringtorch.hang")

PREFIX = "ringtorch/hang/"
ANSWER_ENTRIES = 400  # the last records a rank puts in the store (its file has them all)
# A report begun ahead of a collective's deadline ends its asking this long before it, is
# kept this long after it for a rank to say the collective failed (else it is dropped), and
# the rank that says so waits this long at most for it to be written.
AHEAD_MARGIN_S = 0.05
AHEAD_KEEP_S = 5.0
AHEAD_FINISH_S = 0.4
# A store that has not answered the asker's first request within this long (while the
# collective waited) is taken as stuck (its host, rank 0, frozen): the failing ranks then make
# no report rather than wait out the store's timeout.
STORE_SILENT_S = 0.5
_POLL_S = 60.0  # the responder's wait per round (it re-checks whether it should stop)


def key(*parts: object) -> str:
    """A store key of the protocol (``ringtorch/hang/<part>/<part>...``)."""
    return PREFIX + "/".join(str(p) for p in parts)


def thread_id(ident: int | None) -> str:
    """A thread's id as faulthandler writes it."""
    return f"0x{ident or 0:016x}"


class HangState:
    """This process's part in hang reports: its stacks file, its responder, its store."""

    def __init__(self) -> None:
        self.store: Any = None  # the job's store; None: not installed
        self.rank = -1
        self.world_size = 0
        self.epoch = 0  # counts this rank's initialisations on the store (keys stay unique)
        # the epoch of the keys by which a group's ranks make one report: this one's epoch,
        # but a replacement's (one more) becomes the world's it joins (see renumber)
        self.report_epoch = 0
        self.stacks_path = ""
        self.dump: Callable[[], dict[str, Any]] = RECORDER.dump
        self.name = ""  # the RPC worker name, when init_rpc gave one
        # after a shrink or a grow back: the ranks (as started) of the current world, in
        # its rank order, and this rank's number in it; None: the world is the one started
        self.world: list[int] | None = None
        self._info: dict[str, Any] = {}
        self._stacks: IO[str] | None = None
        self._stop = threading.Event()
        self._listener: Any = None
        self._responder: threading.Thread | None = None
        # per group: the collective whose report was begun ahead, when, and whether the
        # store answered the asker's thread
        self._ahead: dict[str, tuple[int, float, threading.Event]] = {}

    # -- the rank's side --------------------------------------------------------------------

    def install(self, store: Any, rank: int, world_size: int,
                dump: Callable[[], dict[str, Any]] | None = None, name: str = "") -> None:
        """Take part in hang reports: publish where this rank runs, register the stacks
        signal and start the responder. Called once the job's store is known (by
        init_process_group, and by init_rpc with the worker's ``name``; a second call only
        adds what it knows better). Never raises: a rank that cannot take part is reported
        as silent."""
        if dump is not None:
            self.dump = dump
        if name:
            self.name = name
            if self.store is not None:
                self._publish()
        if self.store is not None or not _config.HANG_REPORT.get() or world_size < 1:
            return
        try:
            self._install(store, rank, world_size)
        except Exception as exc:  # observing must not stop the job from starting
            log.debug("hang reports are off in this process: %s", exc)
            self.uninstall()

    def _install(self, store: Any, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.epoch = self.report_epoch = store.add(key("installs", rank), 1)
        folder = _config.OBSERVE_DIR.get()
        if folder:
            self.stacks_path = os.path.join(folder, f"stacks-{rank}.txt")
            open(self.stacks_path, "w").close()
            # appending: faulthandler writes to the descriptor behind the file object's back
            self._stacks = open(self.stacks_path, "a")
        else:  # a file without a name (nothing to clean up), read through /proc by askers
            self._stacks = tempfile.TemporaryFile("a+")
            self.stacks_path = f"/proc/{os.getpid()}/fd/{self._stacks.fileno()}"
        self._info = {"rank": rank, "epoch": self.epoch, "report_epoch": self.epoch,
                      "world_size": world_size,
                      "host": socket.gethostname(),
                      "pid": os.getpid(), "main_thread": thread_id(threading.main_thread().ident),
                      "stacks_file": self.stacks_path, "observe_dir": folder}
        self._stacks.write(stacks_header(rank, self._info))
        self._stacks.flush()
        previous = signal.getsignal(SIGNAL)
        faulthandler.register(SIGNAL, file=self._stacks, all_threads=True,
                              chain=callable(previous))
        self._listener = store.clone()
        self._publish()
        self._stop = threading.Event()  # this installation's own (an old responder keeps its)
        self._responder = threading.Thread(
            target=self._respond, args=(self._listener, self.rank, self.epoch, self._stop),
            daemon=True, name="ringtorch-hang-responder")
        self._responder.start()

    def renumber(self, now: int, world: list[int]) -> None:
        """The job's world changed (a shrink, a grow back): it is now the ranks ``world``
        (as each was started, in the new rank order) and this one is ``now`` in it. This
        rank keeps its keys (askers from outside the job, ringrun, know only those); its
        reports ask only ``world`` and name ranks by both numbers, and the world is published
        (``ringtorch/hang/world``) for askers from outside. Every rank of ``world`` takes the
        lowest report epoch its members published: the survivors' (a replacement installed
        once more than the rank it replaces), so they all coordinate on the same keys. Never
        raises."""
        self.world = list(world)
        self._info["now"] = now
        if self.store is None:
            return
        try:
            infos = [json.loads(self.store.get(key("info", r))) for r in world
                     if r != self.rank and self.store.check([key("info", r)])]
            self.report_epoch = min([self.report_epoch, *(
                i.get("report_epoch", i["epoch"]) for i in infos)])
            self._info["report_epoch"] = self.report_epoch
            self.store.set(key("world"), json.dumps({"ranks": self.world,
                                                     "report_epoch": self.report_epoch}))
        except Exception as exc:
            log.debug("could not publish the new world for hang reports: %s", exc)
        self._publish()

    def ranks(self) -> list[int]:
        """The ranks a report of this process asks: the current world's."""
        return list(range(self.world_size)) if self.world is None else list(self.world)

    def _publish(self) -> None:
        """Tell askers where this rank runs (and its RPC name, once known)."""
        try:
            self.store.set(key("info", self.rank), json.dumps({**self._info, "name": self.name}))
        except Exception as exc:
            log.debug("could not publish this rank for hang reports: %s", exc)

    def uninstall(self) -> None:
        """Stop taking part (destroy_process_group): the responder ends, the signal is
        given back."""
        self._stop.set()
        # a responder that a stop request already ended (the store's host hands one to every
        # rank at teardown, see c10d/observe.py) needs no round trip to a store maybe gone
        if self.store is not None and self._responder is not None and self._responder.is_alive():
            try:  # wake the responder with a request of its own, then let it go
                poke(self.store, self.epoch, self.rank, {"stop": True})
                self._responder.join(1.0)
            except Exception:
                pass
        self._responder = None
        if self._stacks is not None:
            try:
                faulthandler.unregister(SIGNAL)
            except (RuntimeError, ValueError):
                pass
            self._stacks.close()
        listener, self._listener, self._stacks, self.store = self._listener, None, None, None
        self.world = None
        if listener is not None:
            try:
                listener.close()
            except Exception:
                pass

    def _respond(self, store: Any, rank: int, epoch: int, stop: threading.Event) -> None:
        """The responder: answer each request addressed to this rank (``ask/<epoch>/<rank>/
        <k>``, k = 1, 2, ...) until uninstalled or the store is gone."""
        seen = 0
        while not stop.is_set():
            wanted = key("ask", epoch, rank, seen + 1)
            try:
                store.wait([wanted], timedelta(seconds=_POLL_S))
                request = json.loads(store.get(wanted))
            except Exception:
                if stop.is_set() or not _alive(store):
                    return
                continue
            seen += 1
            if stop.is_set() or request.get("stop"):
                return
            try:
                store.set(key("answer", request["n"], rank), json.dumps(self.answer()))
            except Exception as exc:  # e.g. the store went away meanwhile
                log.debug("could not answer hang-report request %s: %s", request, exc)

    def answer(self) -> dict[str, Any]:
        """This rank's answer: its flight record and the stacks of all its threads (also
        written to the observe folder when ringrun gave one)."""
        flight = self.dump()
        stacks = self.own_stacks()
        folder = _config.OBSERVE_DIR.get()
        if folder:
            write_json(flight, os.path.join(folder, f"flight-{self.rank}.json"))
        flight["entries"] = flight["entries"][-ANSWER_ENTRIES:]
        return {"flight": flight, "stacks": stacks}

    def own_stacks(self) -> str:
        """The stacks of every thread, appended to the stacks file and returned."""
        out = self._stacks
        if out is None:
            with tempfile.TemporaryFile("w+") as tmp:
                faulthandler.dump_traceback(tmp, all_threads=True)
                tmp.seek(0)
                return tmp.read()
        start = os.path.getsize(self.stacks_path)
        out.flush()
        faulthandler.dump_traceback(out, all_threads=True)
        out.flush()
        with open(self.stacks_path) as f:
            f.seek(start)
            return f.read()

    # -- a collective failed, or is about to ---------------------------------------------------

    def lead_s(self) -> float | None:
        """How long before a waiting collective's deadline its report must begin to be
        complete at the deadline (the answers' wait, then the signalled stacks'); None when
        this process makes no reports."""
        if self.store is None:
            return None
        return _config.HANG_REPORT_WAIT_S.get() + SIGNAL_WAIT_S

    def report_ahead(self, group: str, seq: int, deadline: float) -> None:
        """Collective ``seq`` of ``group`` still waits close to its ``deadline``: begin its
        hang report now, on a thread, so that it is complete when the collective times out.
        One rank of the group asks (the first to get here); the answers are kept until a
        rank says the collective failed (``on_collective_failure``), then written. A
        collective that finishes drops them: a long but legitimate wait costs every rank
        one answer. Never raises."""
        if self.store is None:
            return
        answered = threading.Event()
        self._ahead[group] = (seq, time.monotonic(), answered)
        threading.Thread(target=self._ask_ahead,
                         args=(self.store, (self.report_epoch, group, seq), deadline, answered),
                         daemon=True, name="ringtorch-hang-ahead").start()

    def _ask_ahead(self, store: Any, tag: tuple[int, str, int], deadline: float,
                   answered: threading.Event) -> None:
        asker = None
        try:
            asker = store.clone()  # this thread's own connection
            first = asker.add(key("ahead", *tag), 1) == 1
            answered.set()
            if not first:
                return  # another rank of the group asks
            left = deadline - AHEAD_MARGIN_S - time.monotonic()
            signal_s = max(0.01, min(SIGNAL_WAIT_S, left / 4))
            wait_s = max(0.01, min(_config.HANG_REPORT_WAIT_S.get(), left - signal_s))
            answers = ask(asker, self.world_size, f"group '{tag[1]}' #{tag[2]} is late",
                          wait_s, signal_s, ranks=self.ranks())
            keep = max(0.0, deadline - time.monotonic()) + AHEAD_KEEP_S
            asker.wait([key("why", *tag)], timedelta(seconds=keep))
            reason = asker.get(key("why", *tag)).decode()
            text, path = write_report(answers, self.world_size, reason, f"rank{self.rank}",
                                      _config.OBSERVE_DIR.get() or None, ranks=self.ranks())
            log.error("%s(saved in %s)", text, path)
            asker.set(key("ahead-report", *tag), path)
        except Exception as exc:  # the collective finished in time, or the store is gone
            log.debug("hang report begun for %s dropped: %s", tag, exc)
        finally:
            if asker is not None:
                try:
                    asker.close()
                except Exception:
                    pass

    def on_collective_failure(self, group: str, exc: BaseException, seq: int | None = None) -> None:
        """A collective of ``group`` (number ``seq``) failed with ``exc``: when it timed out
        or mismatched, make sure one hang report is made for the group (the first rank to get
        here takes the one begun ahead of the deadline, or makes it; the others wait for it,
        answering meanwhile) and name the report in ``exc``'s message. Costs nothing unless
        a collective failed; never raises."""
        store = self.store
        if store is None or not is_hang(str(exc)):
            return
        try:
            path = self._group_report(store, group, str(exc), seq)
        except Exception as err:
            log.debug("no hang report for group %s: %s", group, err)
            return
        if path and exc.args and isinstance(exc.args[0], str) and path not in exc.args[0]:
            exc.args = (f"{exc.args[0]} (hang report: {path})", *exc.args[1:])

    def _group_report(self, store: Any, group: str, message: str, seq: int | None) -> str:
        begun = self._ahead.get(group)
        if begun is not None and begun[0] == seq:
            _, since, answered = begun
            if not answered.wait(max(0.0, since + STORE_SILENT_S - time.monotonic())):
                return "(none: the job's store does not answer)"
        done = key("report", self.report_epoch, group)
        wait_s = _config.HANG_REPORT_WAIT_S.get()
        if store.add(key("failed", self.report_epoch, group), 1) != 1:  # another rank makes it
            store.wait([done], timedelta(seconds=wait_s + SIGNAL_WAIT_S + 10.0))
            return store.get(done).decode()
        reason = f"rank {self.rank}: {message.strip().splitlines()[0]}"
        tag = (self.report_epoch, group, seq)
        if seq is not None and store.check([key("ahead", *tag)]):
            store.set(key("why", *tag), reason)  # the asker writes the report now
            try:
                store.wait([key("ahead-report", *tag)], timedelta(seconds=AHEAD_FINISH_S))
                path = store.get(key("ahead-report", *tag)).decode()
            except Exception:
                path = "(none: it was not complete at the deadline)"
        else:
            try:
                answers = ask(store, self.world_size, reason, wait_s, ranks=self.ranks())
                # a copy beside the other ranks' files when there is one
                text, path = write_report(answers, self.world_size, reason,
                                          f"rank{self.rank}", _config.OBSERVE_DIR.get() or None,
                                          ranks=self.ranks())
                log.error("%s(saved in %s)", text, path)
            except Exception as exc:
                path = f"(none: {exc})"
        store.set(done, path)
        return path


def _alive(store: Any) -> bool:
    try:
        store.check([key("requests")])
        return True
    except Exception:
        return False


def is_hang(message: str) -> bool:
    """Whether a collective's error is one a hang report explains: a timeout or a mismatch
    (the words of collectives/reports.py), possibly as the cause of an abort."""
    text = message.lower()
    return "timed out after" in text or "mismatch" in text


def write_report(answers: list[Answer], world_size: int, reason: str, who: str,
                 copy_to: str | None = None, ranks: list[int] | None = None) -> tuple[str, str]:
    """The report made of ``answers`` (to a request to ``ranks``, default every rank of
    ``world_size``), saved as a new file in the temporary folder (which outlives ringrun's
    run directory, removed at the end unless --log-dir) and copied into the folder
    ``copy_to`` when given: (its text, its path)."""
    asked = list(range(world_size)) if ranks is None else ranks
    text = format_report(analyse(sorted(answers, key=lambda a: a.rank), len(asked), reason,
                                 asked))
    path = save_report(text, tempfile.gettempdir(), who)
    if copy_to:
        shutil.copy(path, os.path.join(copy_to, os.path.basename(path)))
    return text, path


def save_report(text: str, folder: str, who: str) -> str:
    """Write ``text`` as a new ``hang-report-<who>-<time>[.<n>]-<pid>.txt`` in ``folder``
    (never over an earlier report of the same second); its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        suffix = f".{n}" if n else ""
        path = os.path.join(folder, f"hang-report-{who}-{stamp}{suffix}-{os.getpid()}.txt")
        try:
            with open(path, "x") as f:
                f.write(text)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"too many hang reports in {folder} this second")


# -- the asker's side ---------------------------------------------------------------------------


def ask(store: Any, world_size: int, reason: str, wait_s: float,
        signal_s: float = SIGNAL_WAIT_S, ranks: list[int] | None = None) -> list[Answer]:
    """Ask every rank (of ``ranks``, default ``range(world_size)``: a shrunk world asks only
    its own) for its flight record and stacks; returns one Answer per rank that published
    where it runs, within about ``wait_s`` seconds, plus at most ``signal_s`` for the stacks
    of the silent ranks on this host (signalled together)."""
    infos: dict[int, dict[str, Any]] = {}
    for rank in range(world_size) if ranks is None else ranks:
        if store.check([key("info", rank)]):
            infos[rank] = json.loads(store.get(key("info", rank)))
    n = store.add(key("requests"), 1)
    for rank, info in infos.items():
        poke(store, info["epoch"], rank, {"n": n, "reason": reason, "pid": os.getpid()})
    deadline = time.monotonic() + wait_s
    answers: dict[int, dict[str, Any]] = {}
    for rank in infos:
        left = max(0.01, deadline - time.monotonic())
        try:
            store.wait([key("answer", n, rank)], timedelta(seconds=left))
            answers[rank] = json.loads(store.get(key("answer", n, rank)))
        except Exception:
            continue
    silent = {rank: info for rank, info in infos.items() if rank not in answers}
    here = socket.gethostname()
    stacks = signal_all({rank: (info["pid"], info["stacks_file"])
                         for rank, info in silent.items() if info["host"] == here}, signal_s)
    out = []
    for rank, info in sorted(infos.items()):
        got = answers.get(rank)
        if got is not None:
            out.append(Answer(rank, got["flight"], got["stacks"], info["main_thread"],
                              info["host"], info["pid"], "", info.get("name", ""),
                              info.get("now", -1)))
            continue
        note = f"did not answer within {wait_s:.3g} s"
        if info["host"] != here:
            note += f" (on {info['host']}: no stacks)"
        elif stacks.get(rank) is None:
            note += "; the process is stopped (SIGSTOP or a debugger): no stacks"
        else:
            note += ("; stacks by SIGUSR1" if stacks[rank]
                     else "; no stacks (the process is gone?)")
        out.append(Answer(rank, None, stacks.get(rank) or "", info["main_thread"], info["host"],
                          info["pid"], note, info.get("name", ""), info.get("now", -1)))
    return out


def current_world(store: Any, world_size: int) -> list[int]:
    """The ranks (as started) of the job's current world, in its rank order, for an asker from
    outside (ringrun): the world its ranks last published on a shrink or a grow back, while
    one of them still is in it (a world whose ranks all initialised again since is over);
    else every rank of ``world_size``."""
    if store.check([key("world")]):
        world = json.loads(store.get(key("world")))
        for rank in world["ranks"]:
            if store.check([key("info", rank)]) and json.loads(store.get(key("info", rank))).get(
                    "report_epoch") == world["report_epoch"]:
                return list(world["ranks"])
    return list(range(world_size))


def poke(store: Any, epoch: int, rank: int, request: dict[str, Any]) -> None:
    """Hand ``request`` to the responder of ``rank`` (installation ``epoch``): its next
    numbered request key (one counter per rank, so no responder ever waits on a number that
    was handed to the others only)."""
    k = store.add(key("asked", epoch, rank), 1)
    store.set(key("ask", epoch, rank, k), json.dumps(request))


HANG = HangState()

__all__ = ["HANG", "HangState", "ask", "current_world", "is_hang", "key", "poke", "save_report", "thread_id",
           "write_report"]
