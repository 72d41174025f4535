"""The checkpointer's agreement between ranks, through relaunch's store
(never torch.distributed): one round of votes, decision, leaving the block,
reports and commit per call to ``Checkpointer.save``."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, NamedTuple

from relaunch.errors import CheckpointError

# Environment the launchers set (crates/relaunch-launch/src/env.rs).
ENV_STORE = "RELAUNCH_STORE"
ENV_RUN_ID = "RELAUNCH_RUN_ID"
ENV_ATTEMPT = "RELAUNCH_ATTEMPT"

# Set by `relaunch run` as soon as a worker of attempt ATTEMPT
# (RELAUNCH_ATTEMPT) fails, before it stops the others: text naming the rank and
# how it ended (raw key; the launcher deletes worker keys between attempts).
# Named by the attempt, so that a launcher's late notice (from a node cut off
# from the store, say) never marks a later attempt failed
# (crates/relaunch-launch/src/keys.rs).
FAILED_KEY = "relaunch/{run_id}/workers/failed/{attempt}"

# How often a wait for other ranks wakes to look at FAILED_KEY: a rank waiting
# for one that died gives up within this, not after `timeout`.
PEER_CHECK_INTERVAL = 0.5


def failed_key() -> str | None:
    """The key `relaunch run` sets when a worker fails, or None outside it."""
    run_id = os.environ.get(ENV_RUN_ID, "").strip()
    attempt = os.environ.get(ENV_ATTEMPT, "").strip()
    return FAILED_KEY.format(run_id=run_id, attempt=attempt) if run_id and attempt else None


def _stop_requested() -> bool:
    """Whether this process was asked to stop, without importing relaunch.preemption
    (importing it installs signal handlers)."""
    preemption = sys.modules.get("relaunch.preemption")
    return preemption is not None and bool(preemption.requested())


# --- agreement through the store -----------------------------------------------


class Decision(NamedTuple):
    save: bool
    step: int
    forced: bool
    token: str


class Coordinator:
    """One Checkpointer's rounds of agreement through the store.

    Round ``n`` (the n-th call to ``save`` on every rank) uses keys
    ``PREFIX/n/...``: ``ballots`` (each rank appends ``rank:step:ask:force;``),
    ``votes`` (a counter; the rank whose vote makes it ``world`` decides and
    sets ``decision``); for a save also ``written``/``writers``/``outcome``
    (leaving the block: ``ok`` from the last rank, or the first ``abort``),
    ``report/RANK`` (files hashed by each rank) and ``commit`` (rank 0: ``ok``
    or why not). The rank that decides round n deletes round n-1's keys:
    every rank has finished with them once it votes in round n.

    Every wait for other ranks wakes each ``PEER_CHECK_INTERVAL`` seconds to
    check ``failed_key`` (set by the launcher when a worker of the attempt
    fails) and raises :class:`CheckpointError` with its text once it is set,
    rather than wait ``timeout`` for a rank that will never come. A stop
    request (``relaunch.preemption``) changes nothing: the ranks still save
    together, unless one is dead.
    """

    def __init__(
        self,
        store: Any,
        prefix: str,
        rank: int,
        world: int,
        timeout: float,
        failed_key: str | None = None,
    ):
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.world = world
        self.timeout = timeout
        self.failed_key = failed_key
        self.lock = threading.Lock()
        self.round = 0
        self._previous: list[str] = []

    def key(self, n: int, name: str) -> str:
        return f"{self.prefix}{n}/{name}"

    def save_keys(self, n: int) -> list[str]:
        """The keys a save of round ``n`` writes after the decision."""
        keys = [self.key(n, k) for k in ("written", "writers", "outcome", "commit")]
        return keys + [self.key(n, f"report/{r}") for r in range(self.world)]

    def delete_with_next_round(self, keys: list[str]) -> None:
        """Deletes ``keys`` of this round's store when the next round is
        decided, with the round's own keys (a caller's extra keys of a round:
        cycling_utils' AtomicDirectory)."""
        self._previous += [k for k in keys if k not in self._previous]

    def wait_keys(self, n: int, keys: list[str], what: str) -> None:
        """``store.wait(keys, timeout)``, giving up early if a rank of the attempt failed.

        Raises TimeoutError after ``timeout`` as ``store.wait`` does, and
        CheckpointError as soon as ``failed_key`` is set."""
        if self.failed_key is None:
            self.store.wait(keys, self.timeout)
            return
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self.store.wait(keys, max(min(PEER_CHECK_INTERVAL, left), 0.001))
                return
            except TimeoutError:
                if self.store.check([self.failed_key]):
                    self._raise_peer_failed(n, what)
                if time.monotonic() >= deadline:
                    raise

    def _raise_peer_failed(self, n: int, what: str) -> None:
        failure = self.store.get(self.failed_key).decode(errors="replace").strip()
        stopping = " (this rank was asked to stop)" if _stop_requested() else ""
        raise CheckpointError(
            f"checkpoint round {n}: stopped waiting for {what}{stopping}: "
            f"{failure or 'a rank failed'}"
        )

    def wait_key(self, n: int, key: str, what: str, arrived_key: str | None = None) -> bytes:
        try:
            self.wait_keys(n, [key], what)
        except TimeoutError:
            missing = ""
            if arrived_key is not None:
                arrived = self._ranks(
                    self.store.get(arrived_key) if self.store.check([arrived_key]) else b""
                )
                absent = sorted(set(range(self.world)) - arrived)
                missing = f"; rank(s) {', '.join(map(str, absent))} did not get there"
            raise CheckpointError(
                f"checkpoint round {n}: timed out after {self.timeout:g} s waiting for "
                f"{what}{missing} (a rank crashed or is stuck; raise timeout= if saving is slow)"
            ) from None
        return self.store.get(key)

    @staticmethod
    def _ranks(raw: bytes) -> set[int]:
        return {int(part.split(":")[0]) for part in raw.decode().split(";") if part}

    def vote(self, step: int, ask: bool, force: bool, strategy: str, session: str) -> Decision:
        with self.lock:
            n = self.round
            self.round += 1
            store = self.store
            store.append(self.key(n, "ballots"), f"{self.rank}:{step}:{int(ask)}:{int(force)};")
            votes = store.add(self.key(n, "votes"), 1)
            if votes > self.world:
                raise CheckpointError(
                    f"checkpoint round {n} got {votes} votes for {self.world} ranks: another job "
                    "shares this store and directory, or ranks disagree on WORLD_SIZE"
                )
            if votes == self.world:
                decision = self._decide(n, strategy, session)
                for key in self._previous:
                    store.delete_key(key)
                store.set(self.key(n, "decision"), json.dumps(decision))
            raw = self.wait_key(
                n, self.key(n, "decision"), "every rank to call save()", self.key(n, "ballots")
            )
            decision = json.loads(raw)
            self._previous = [self.key(n, k) for k in ("ballots", "votes", "decision")]
            if decision.get("error"):
                raise ValueError(decision["error"])
            if decision["save"]:
                self.delete_with_next_round(self.save_keys(n))
            return Decision(
                decision["save"], decision["step"], decision["forced"], decision["token"]
            )

    def _decide(self, n: int, strategy: str, session: str) -> dict[str, Any]:
        ballots = {}
        for part in self.store.get(self.key(n, "ballots")).decode().split(";"):
            if part:
                rank, step, ask, force = part.split(":")
                ballots[int(rank)] = (int(step), ask == "1", force == "1")
        steps = {s for s, _, _ in ballots.values()}
        if len(steps) > 1:
            by_rank = ", ".join(f"rank {r}: {ballots[r][0]}" for r in sorted(ballots))
            return {
                "error": f"ranks called save() with different steps ({by_rank}); "
                "every rank must call save() at the same step"
            }
        asks = [a for _, a, _ in ballots.values()]
        save = any(asks) if strategy == "sync_any" else all(asks)
        return {
            "save": save,
            "step": steps.pop(),
            "forced": save and any(f for _, _, f in ballots.values()),
            "token": f"{session}-{os.urandom(4).hex()}",
        }

    def leave_block(self, n: int, error: str | None) -> None:
        """Says this rank left the ``with`` block (or why it aborts); waits for the others."""
        store = self.store
        outcome = self.key(n, "outcome")
        if error is not None:
            store.compare_set(outcome, "", f"abort: rank {self.rank}: {error}")
            return
        store.append(self.key(n, "writers"), f"{self.rank};")
        if store.add(self.key(n, "written"), 1) == self.world:
            store.compare_set(outcome, "", "ok")
        raw = self.wait_key(n, outcome, "every rank to finish writing", self.key(n, "writers"))
        if raw != b"ok":
            raise CheckpointError(f"checkpoint aborted: {raw.decode()[len('abort: ') :]}")

    def report(self, n: int, report: dict[str, Any]) -> None:
        self.store.set(self.key(n, f"report/{self.rank}"), json.dumps(report))

    def reports(self, n: int, everyone: bool = False) -> list[dict[str, Any]]:
        """The other ranks' reports of round ``n`` (every rank's with ``everyone``)."""
        keys = [self.key(n, f"report/{r}") for r in range(0 if everyone else 1, self.world)]
        try:
            self.wait_keys(n, keys, "the file reports of the other ranks")
        except TimeoutError:
            first = 0 if everyone else 1
            absent = [r for r, k in enumerate(keys, first) if not self.store.check([k])]
            raise CheckpointError(
                f"checkpoint round {n}: timed out after {self.timeout:g} s waiting for the "
                f"file reports of rank(s) {', '.join(map(str, absent))}"
            ) from None
        return [json.loads(raw) for raw in self.store.multi_get(keys)]

    def announce(self, n: int, outcome: str) -> None:
        self.store.set(self.key(n, "commit"), outcome)

    def committed(self, n: int) -> None:
        raw = self.wait_key(n, self.key(n, "commit"), "rank 0 to commit").decode()
        if raw != "ok":
            raise CheckpointError(f"rank 0 could not commit the checkpoint: {raw}")


def connect_store(timeout: float) -> tuple[Any, str] | None:
    """A store for the job from the environment and the key prefix for it."""
    from relaunch.store import Store

    addr = os.environ.get(ENV_STORE)
    if addr:
        host, _, port = addr.rpartition(":")
    elif os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    else:
        return None
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"cannot parse the store address {addr!r} (want HOST:PORT)") from None
    # Raw keys, like the launcher's: relaunch's own live under `relaunch/`.
    return Store(host.strip("[]"), port_number, timeout=min(timeout, 300.0), prefix=""), ""
