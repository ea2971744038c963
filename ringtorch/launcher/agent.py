"""The agent: one per node, it rendezvouses, starts the local workers, watches and restarts them.

The loop, after torch elastic's ``SimpleElasticAgent._invoke_run``:

    round = rendezvous.next_round()          # node rank, global ranks, master address
    start one worker per local rank
    every monitor_interval (or at once when a worker exits):
        action = decide(observation)          # decisions.py: a pure function
        act: watch on / finish / restart in a new round / give up / stop

Guarantees (docs/design/launcher.md): a failed worker stops the others (SIGTERM, SIGKILL
after --shutdown-timeout) and the summary names the first failure; a signal to the launcher
stops every worker before the launcher exits; the launcher adopts orphaned descendants
(subreaper) and kills them too; nothing of the job outlives the agent.

Under --on-worker-failure=continue the agent of node 0 serves the workers' store itself, at
MASTER_ADDR:MASTER_PORT, for the round (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's agent
store): every worker, rank 0 included, is a client, so any of them may die and the others
still agree on a shrink through it. It closes only after the round's workers are done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

from ringtorch import _config
from ringtorch._wire.shm import sweep_stale_segments
from ringtorch._workers import (
    Guardian,
    WorkerStartError,
    become_subreaper,
    console_write,
    reap_adopted,
)
from ringtorch.launcher import hang, trace_merge
from ringtorch.launcher.config import LaunchConfig
from ringtorch.launcher.decisions import (
    Action,
    Observation,
    decide,
    group_state,
    workers_to_replace,
)
from ringtorch.launcher.handlers import RendezvousGracefulExitError
from ringtorch.launcher.job_summary import print_job_summary
from ringtorch.launcher.messages import say
from ringtorch.launcher.node_rendezvous import NodeRendezvous, RendezvousError, StaticRendezvous
from ringtorch.launcher.summary import format_summary, one_line, root_cause
from ringtorch.launcher.workers import Assignment, LocalWorkerGroup, WorkerFailure
from ringtorch.store import TCPStore

EXIT_FAILED = 1


class Agent:
    """Runs one job on this node; :meth:`run` returns the launcher's exit code."""

    def __init__(self, config: LaunchConfig, rendezvous: NodeRendezvous | None = None,
                 title: str = "job", embedded: bool = False) -> None:
        """``embedded``: the agent runs inside a user's program (``elastic_launch``), which
        keeps its other children: the agent neither becomes a subreaper nor kills the
        processes it did not start, and leaves the failure summary to the caller
        (``failures``)."""
        self.config = config
        self.rendezvous = rendezvous or make_rendezvous(config)
        self.title = title
        self.embedded = embedded
        self.failures: list[WorkerFailure] = []
        self.last_assignment: Assignment | None = None
        self.left_gracefully = False
        self.remaining_restarts = config.max_restarts
        self._signal: int | None = None
        self._force = False
        self._group: LocalWorkerGroup | None = None
        self._saved_handlers: dict[int, Any] = {}
        self._keep_files = False
        self._guardian: Guardian | None = None
        self._in_rendezvous = False
        self._announced: set[int] = set()  # failed workers said to be gone (keep_going)
        self._report_asked = False  # SIGUSR1: make a hang report (launcher/hang.py)

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is None:
            self._signal = signum
        else:
            self._force = True  # a second signal: do not wait out the grace period
        if self._in_rendezvous:
            # No worker runs: interrupt whatever blocking call the rendezvous is in (a connect
            # that retries for join_timeout) rather than wait for it to notice the flag.
            raise RendezvousError(f"interrupted by {signal.Signals(signum).name}")

    def _install_signal_handlers(self) -> None:
        for sig in self.config.signals_to_handle:
            try:
                self._saved_handlers[sig] = signal.signal(sig, self._on_signal)
            except (OSError, ValueError):  # not the main thread, or an uncatchable signal
                pass
        with contextlib.suppress(ValueError):  # SIGUSR1 asks for a hang report (main thread only)
            self._saved_handlers[signal.SIGUSR1] = signal.signal(
                signal.SIGUSR1, lambda signum, frame: setattr(self, "_report_asked", True))

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()

    def _stopping(self) -> bool:
        return self._signal is not None

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job to the end; 0 on success, 1 on failure, 128+N after signal N."""
        if not self.embedded:
            become_subreaper()
        guardian = self._guardian = Guardian()  # first: it must hold none of the fds below
        self._install_signal_handlers()
        run_dir, keep = self._make_run_dir()
        hang.mark_run_dir(run_dir)
        self._keep_files = keep
        try:
            with _config.override(SECRET=self.config.secret):
                return self._run(run_dir)
        except RendezvousGracefulExitError as exc:  # a custom backend left this node out
            say(f"this node is not part of the job: {exc}")
            self.left_gracefully = True
            return 0
        except (RendezvousError, WorkerStartError) as exc:
            if self._signal is not None:
                say(f"received {signal.Signals(self._signal).name} during the rendezvous")
                return 128 + self._signal
            if self.embedded:
                raise  # the calling program handles it (elastic_launch raises it, as torch)
            say(f"error: {exc}")
            return EXIT_FAILED
        finally:
            if self._group is not None:
                self._stop_group(signal.SIGKILL if self._force else signal.SIGTERM)
            if not self.embedded:
                reap_adopted(spare={guardian.pid})
            guardian.close()
            sweep_stale_segments()  # shared memory left by workers that were killed
            self.rendezvous.shutdown()
            self._restore_signal_handlers()
            if not keep:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _make_run_dir(self) -> tuple[str, bool]:
        config = self.config
        redirects = bool(config.redirects)
        if config.log_dir is None and not redirects:
            return tempfile.mkdtemp(prefix="ringtorch_"), False
        base = config.log_dir or tempfile.mkdtemp(prefix="ringtorch_logs_")
        os.makedirs(base, exist_ok=True)
        run_dir = tempfile.mkdtemp(prefix=f"{config.run_id}_{uuid.uuid4().hex[:4]}_", dir=base)
        say(f"logs of this run go to {run_dir}")
        return run_dir, True

    def _run(self, run_dir: str) -> int:
        attempt = 0
        while True:
            self._in_rendezvous = True
            try:
                assignment = self.rendezvous.next_round(self._stopping)
            finally:
                self._in_rendezvous = False
            if self._signal is not None:
                return self._stopped_by_signal()
            restart_count = self.config.max_restarts - self.remaining_restarts
            self.last_assignment = assignment
            self._group = group = LocalWorkerGroup(
                self.config, assignment, restart_count,
                attempt_dir=os.path.join(run_dir, f"attempt_{attempt}"),
                log_files=self.config.log_dir is not None or bool(self.config.redirects),
                guardian=self._guardian)
            if not self.config.is_single_node or attempt > 0:
                say(self._describe_round(assignment, restart_count))
            store = self._serve_workers_store(assignment)
            try:
                group.start()
                attempt += 1
                exit_code = self._act(self._watch(group), group)
            finally:
                if store is not None:  # the workers are stopped or done: nobody needs it
                    self._stop_group(signal.SIGKILL if self._force else signal.SIGTERM)
                    store.close()
            trace_merge.merge_attempt(self.config, group.observe_dir, assignment.group_rank)
            if exit_code is not None:
                print_job_summary(self.config, group, self.embedded)
                return exit_code

    def _serve_workers_store(self, assignment: Assignment) -> TCPStore | None:
        """The workers' store, served here for the round when this node's agent holds it (see
        the module docstring); None when the workers' rank 0 serves it."""
        if not self.config.keep_going or assignment.group_rank != 0:
            return None
        # The job secret is in force (run's override): every worker must prove it.
        try:
            return TCPStore(assignment.master_addr, assignment.master_port, is_master=True,
                            wait_for_workers=False)
        except OSError as exc:
            raise RendezvousError(
                f"cannot serve the workers' store on {assignment.master_addr}:"
                f"{assignment.master_port}: {exc}") from None

    def _act(self, action: Action, group: LocalWorkerGroup) -> int | None:
        """Carry out ``action`` on the finished watch of ``group``; the launcher's exit code,
        or None to go on with a new round."""
        if action is Action.FINISH:
            self._stop_group(signal.SIGTERM)  # leftovers in the workers' process groups
            self.rendezvous.finish(self._stopping)
            if group.replaced:
                say("the job finished; worker(s) restarted alone on the way: " + ", ".join(
                    f"rank {failure.global_rank} (restart {restart} of "
                    f"{self.config.max_restarts})" for failure, restart in group.replaced))
            if group.failures:  # --on-worker-failure=continue: the others finished the job
                say(f"the job finished without the worker(s) of rank(s) "
                    f"{sorted(group.failures)}, which failed on the way; the others exited 0")
            return 0
        if action is Action.STOP_FOR_SIGNAL:
            return self._stopped_by_signal()
        group.drain(1.0)
        failures = [failure for failure, _ in group.replaced] + list(group.failures.values())
        running = sum(1 for code in group.exit_codes() if code is None)
        if failures:
            say(one_line(root_cause(failures))
                + (f"; stopping {running} other running worker(s)" if running else ""))
        elif action in (Action.RESTART, Action.GIVE_UP):
            say(f"another node restarts round {group.assignment.round}; stopping {running} "
                f"running worker(s)")
        self._stop_group(signal.SIGTERM)
        node = group.assignment.group_rank
        if action is Action.RESTART:
            self.remaining_restarts -= 1
        elif action is Action.REJOIN and self.rendezvous.peer_left():
            say("a node left the job: restarting the worker group in a new round without it")
        elif action is Action.REJOIN:
            say("node(s) waiting to join: restarting the worker group in a new round to admit "
                "them")
        elif action is Action.STOP_FOR_PEER:
            say(f"stopped: {self.rendezvous.closed_reason()}")
            return EXIT_FAILED
        elif not failures:  # GIVE_UP: a peer restarts the round, no restart is left here
            self.rendezvous.close(f"node {node} has no restart left")
            say("no restart left (--max-restarts): the job fails")
            return EXIT_FAILED
        else:  # GIVE_UP
            self.rendezvous.close(f"node {node}: {one_line(root_cause(failures))}")
            self.failures = failures
            if not self.embedded:
                console_write(sys.stderr, format_summary(
                    self.title, failures, keep_files=self._keep_files) + "\n")
            return EXIT_FAILED
        return None

    def _describe_round(self, assignment: Assignment, restart_count: int) -> str:
        text = f"round {assignment.round}"
        if restart_count:
            text += f" (restart {restart_count} of {self.config.max_restarts})"
        if not self.config.is_single_node:
            last_rank = assignment.base_global_rank + self.config.nproc_per_node - 1
            text += (f": node {assignment.group_rank} of {assignment.group_world_size}, ranks "
                     f"{assignment.base_global_rank}-{last_rank} of {assignment.world_size}, "
                     f"master {assignment.master_addr}:{assignment.master_port}")
        return text + ": starting the worker group"

    def _watch(self, group: LocalWorkerGroup) -> Action:
        while True:
            group.wait(self.config.monitor_interval)
            if self._report_asked:
                self._report_asked = False
                hang.report_group("ringrun received SIGUSR1", group, self._keep_files)
            codes = group.exit_codes()
            if self.config.keep_going:
                codes = self._replace_failed(group, codes)
                self._announce_lost(group, codes)
            action = decide(Observation(
                group=group_state(codes, self.config.keep_going),
                remaining_restarts=self.remaining_restarts,
                nodes_waiting=self.rendezvous.num_nodes_waiting(),
                job_closed=self.rendezvous.closed_reason() is not None,
                peer_restart=self.rendezvous.restart_requested(),
                peer_left=self.rendezvous.peer_left(), signal=self._signal))
            if action is not Action.WATCH:
                return action

    def _replace_failed(self, group: LocalWorkerGroup,
                        codes: list[int | None]) -> list[int | None]:
        """Restart each failed worker alone while others run and restarts remain; the exit
        codes after that."""
        chosen = workers_to_replace(codes, True, self.remaining_restarts)
        if not chosen:
            return codes
        group.drain(1.0)  # the failed worker's traceback comes before what is said of it
        for local_rank in chosen:
            rank = group.assignment.base_global_rank + local_rank
            failure = group.failures[rank]
            self.remaining_restarts -= 1
            restart = self.config.max_restarts - self.remaining_restarts
            group.restart_one(local_rank, restart)
            say(f"{one_line(root_cause([failure]))}; restarting it alone (restart {restart} of "
                f"{self.config.max_restarts}): it joins the running job, the others go on "
                f"(--on-worker-failure=continue)")
        return group.exit_codes()

    def _announce_lost(self, group: LocalWorkerGroup, codes: list[int | None]) -> None:
        """Say once per failed worker that the others go on without it."""
        running = sum(1 for code in codes if code is None)
        for rank, failure in group.failures.items():
            if rank in self._announced or not running:
                continue
            self._announced.add(rank)
            say(f"{one_line(root_cause([failure]))}; the other {running} running worker(s) go "
                f"on (--on-worker-failure=continue)")

    def _stop_group(self, sig: int) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.stop(sig, self.config.shutdown_timeout, force=lambda: self._force)

    def _stopped_by_signal(self) -> int:
        assert self._signal is not None
        sig = self._signal
        name = signal.Signals(sig).name
        running = 0 if self._group is None else sum(
            1 for code in self._group.exit_codes() if code is None)
        # Leave first, stop the workers after: the other nodes must know of the leave before
        # their workers lose their peers here.
        if self._group is not None and self.rendezvous.leave():
            self._stop_group(sig)
            say(f"received {name}: stopped {running} running worker(s); this node left the "
                f"job, the other nodes go on without it")
            return 128 + sig
        if self._group is not None and sig in (signal.SIGINT, signal.SIGTERM):
            hang.report_group(f"ringrun received {name}", self._group, self._keep_files)
        self._stop_group(sig)
        self.rendezvous.close(f"the launcher of another node received {name}")
        say(f"received {name}: stopped {running} running worker(s)")
        return 128 + sig


def make_rendezvous(config: LaunchConfig) -> NodeRendezvous:
    """The rendezvous the config asks for."""
    if config.rdzv_backend == "c10d":
        from ringtorch.launcher.c10d_rendezvous import C10dRendezvous

        return C10dRendezvous(config)
    if config.rdzv_backend == "static":
        return StaticRendezvous(config)
    from ringtorch.launcher.handler_rendezvous import HandlerRendezvous

    return HandlerRendezvous(config)


def launch(config: LaunchConfig, title: str = "job",
           rendezvous_factory: Callable[[LaunchConfig], NodeRendezvous] | None = None) -> int:
    """Run ``config`` on this node; the exit code for the launcher process."""
    try:
        rendezvous = (rendezvous_factory or make_rendezvous)(config)
    except RendezvousError as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    return Agent(config, rendezvous, title).run()


__all__ = ["Agent", "launch", "make_rendezvous", "say"]
