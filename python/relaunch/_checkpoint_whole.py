"""Over several nodes, what ``Checkpointer.latest()`` resumes from in memory.

Every rank publishes in the store which parts its node holds
(``committed_parts``) and the newest disk step it found; every rank then
picks, from the same records, the newest save whose parts (all of one save
id) live nodes hold, as their own or as a replica (``newest_whole``). Each
node leader puts that save together as ``<hash DIR>/step_S`` in its tier:
the parts it holds are copied, the others fetched from the nodes that hold
them (their tier servers' addresses and secrets are under
:func:`tier_key`), after checking that the whole snapshot fits. Any problem
on any node means every rank resumes from disk, said once in a warning.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from relaunch._checkpoint_agree import Coordinator
from relaunch._checkpoint_files import read_manifest, remove, verify_checkpoint
from relaunch._checkpoint_peer import Parts, assemble_into, committed_parts, newest_whole
from relaunch._checkpoint_tier import Checkpoint
from relaunch.errors import CheckpointError

# How many times this process agreed on a memory snapshot over several
# nodes, per key prefix (a directory in an attempt) and rank: each time has
# keys of its own.
_ROUNDS: dict[tuple[str, int], int] = {}


def tier_key(prefix: str, node: int) -> str:
    """The store key where node ``node``'s tier server publishes its address
    and secret (JSON), under a Checkpointer's key ``prefix``."""
    return f"{prefix}tier/{node}"


def whole_snapshot(
    parts: Parts,
    coordinator: Coordinator,
    session: str,
    disk_step: int | None,
    in_progress: set[str],
    stacklevel: int,
) -> Checkpoint | None:
    """Every rank calls it, in latest(): the newest memory snapshot newer
    than ``disk_step`` whose parts, all of one save, live nodes hold, put
    together on every node; None (said in a warning) when there is none or
    a node could not put it together. ``in_progress`` holds the temporary
    directories this process is writing (no Checkpointer cleans them up)."""
    store, rank = coordinator.store, coordinator.rank
    # Numbered per process, not per Checkpointer: a second Checkpointer
    # of the same directory in this attempt never reads the first's keys.
    number = _ROUNDS.get((coordinator.prefix, rank), 0)
    _ROUNDS[(coordinator.prefix, rank)] = number + 1
    prefix = f"{coordinator.prefix}latest/{number}/"
    held = committed_parts(parts.node_tier)
    mine = {"node": parts.node, "held": held, "disk": disk_step}
    store.set(f"{prefix}have/{rank}", json.dumps(mine))
    keys = [f"{prefix}have/{r}" for r in range(coordinator.world)]
    wait_all(
        coordinator,
        keys,
        "every rank to call latest() (over several nodes it "
        "agrees on the memory snapshot: call it on every rank)",
    )
    haves = [json.loads(raw) for raw in store.multi_get(keys)]
    choice = newest_whole([h for have in haves for h in have["held"]])
    # Every rank decides on the same records, the disk's newest included.
    disk = max((h["disk"] for h in haves if h["disk"] is not None), default=None)
    if choice is None or (disk is not None and disk >= choice["step"]):
        return None
    nodes = sorted({have["node"] for have in haves})
    step = choice["step"]
    final = parts.whole.final(step)
    if parts.leader:
        outcome = "ok"
        try:
            _put_together(parts, coordinator, session, choice, haves, in_progress)
            manifest, problem = verify_checkpoint(final, step, full=False)
            if manifest is None or manifest.get("id") != choice["id"]:
                raise CheckpointError(f"{final} does not verify: {problem or 'another save'}")
        except Exception as e:
            outcome = f"node {parts.node}: {type(e).__name__}: {e}"
        store.set(f"{prefix}whole/{parts.node}", outcome)
    keys = [f"{prefix}whole/{node}" for node in nodes]
    wait_all(coordinator, keys, "every node to put the memory snapshot together")
    problems = [raw.decode() for raw in store.multi_get(keys) if raw != b"ok"]
    if not problems:
        manifest, problem = verify_checkpoint(final, step, full=False)
        if manifest is None:
            # The leader verified it a moment ago: not a state to resume from.
            raise CheckpointError(f"the memory snapshot {final} changed: {problem}")
        return Checkpoint(final, step, manifest, "memory")
    if rank == 0:
        warnings.warn(
            f"relaunch.Checkpointer: the memory snapshot of step {step} could not be put "
            f"together ({'; '.join(problems)}): resuming from disk",
            stacklevel=stacklevel + 1,
        )
    return None


def _put_together(
    parts: Parts,
    coordinator: Coordinator,
    session: str,
    choice: dict[str, Any],
    haves: list[dict[str, Any]],
    in_progress: set[str],
) -> None:
    """Node leader: snapshot ``choice`` as a whole in this node's tier."""
    step = choice["step"]
    existing = parts.whole.final(step)
    manifest, _ = read_manifest(existing, step)
    if manifest is not None and manifest.get("id") == choice["id"]:
        return  # put together by an earlier attempt of this launcher
    holders: dict[int, tuple[str, str]] = {}
    store = coordinator.store
    for have in sorted(haves, key=lambda h: h["node"]):
        for held in have["held"]:
            if (held["step"], held["id"]) == (step, choice["id"]):
                if held["part"] not in holders and have["node"] != parts.node:
                    peer = json.loads(store.get(tier_key(coordinator.prefix, have["node"])))
                    holders[held["part"]] = (peer["address"], peer["secret"])
    tmp = parts.whole.temporary(step, f"{session}-{os.urandom(4).hex()}")
    in_progress.add(str(tmp))
    try:
        tmp.mkdir()
        assemble_into(tmp, choice, parts.node_tier, holders, parts.room_for_whole)
        parts.whole.commit(tmp, step, session, replace=True)
    except BaseException:
        remove(tmp)
        raise
    finally:
        in_progress.discard(str(tmp))


def wait_all(coordinator: Coordinator, keys: list[str], what: str) -> None:
    """Waits for every key, giving up as the coordinator's waits do; a
    timeout names the keys that did not come."""
    try:
        coordinator.wait_keys(-1, keys, what)
    except TimeoutError:
        absent = [k.rsplit("/", 1)[1] for k in keys if not coordinator.store.check([k])]
        raise CheckpointError(
            f"timed out after {coordinator.timeout:g} s waiting for {what}: "
            f"{', '.join(absent)} did not answer"
        ) from None
