"""torch's own TCPStore client drives every operation against our server, and
the results equal those of torch's own server for the same sequence."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from relaunch import Store


def _outcome(fn):
    try:
        result = fn()
    except Exception as e:  # the exception type and message are the result
        return ("raised", type(e).__name__, str(e).split("\n")[0])
    if isinstance(result, list) and all(isinstance(x, str) for x in result):
        result = sorted(result)  # list_keys has no order
    return ("ok", result)


def _sequence(s: dist.TCPStore) -> list[tuple[str, object]]:
    big = bytes(range(256)) * 4096  # 1 MiB
    steps = [
        ("set", lambda: s.set("k", "v")),
        ("get", lambda: s.get("k")),
        ("set empty", lambda: s.set("empty", b"")),
        ("get empty", lambda: s.get("empty")),
        ("set binary 1MiB", lambda: s.set("big", big)),
        ("get binary 1MiB", lambda: s.get("big") == big),
        ("overwrite", lambda: s.set("k", "v2")),
        ("get overwritten", lambda: s.get("k")),
        ("add new", lambda: s.add("n", 5)),
        ("add existing", lambda: s.add("n", -12)),
        ("add zero", lambda: s.add("n", 0)),
        ("get counter", lambda: s.get("n")),
        ("add large", lambda: s.add("big_n", 2**62)),
        ("add onto set digits", lambda: (s.set("digits", "41"), s.add("digits", 1))[1]),
        ("cas missing, empty expected", lambda: s.compare_set("c1", "", "created")),
        ("cas missing, other expected", lambda: s.compare_set("c2", "exp", "des")),
        ("check after failed cas", lambda: s.check(["c2"])),
        ("cas match", lambda: s.compare_set("c1", "created", "swapped")),
        ("cas mismatch", lambda: s.compare_set("c1", "nope", "x")),
        ("cas empty expected on existing", lambda: s.compare_set("c1", "", "x")),
        ("get after cas", lambda: s.get("c1")),
        ("check present", lambda: s.check(["k", "n"])),
        ("check one missing", lambda: s.check(["k", "missing"])),
        ("wait present", lambda: s.wait(["k", "c1"])),
        ("wait timeout", lambda: s.wait(["missing"], timedelta(milliseconds=100))),
        ("works after timeout", lambda: s.get("k")),
        ("num_keys", lambda: s.num_keys()),
        ("delete existing", lambda: s.delete_key("k")),
        ("delete missing", lambda: s.delete_key("k")),
        ("num_keys after delete", lambda: s.num_keys()),
        ("append new", lambda: s.append("a", "x")),
        ("append existing", lambda: s.append("a", "yz")),
        ("get appended", lambda: s.get("a")),
        ("multi_set", lambda: s.multi_set(["m1", "m2", "m3"], ["1", "", "3"])),
        ("multi_get", lambda: s.multi_get(["m3", "m1", "m2"])),
        ("queue_len empty", lambda: s.queue_len("q")),
        ("queue_pop empty", lambda: s.queue_pop("q", block=False)),
        ("queue_push", lambda: s.queue_push("q", "one")),
        ("queue_push 2", lambda: s.queue_push("q", b"\x00two")),
        ("queue_len", lambda: s.queue_len("q")),
        ("check queue", lambda: s.check(["q"])),
        ("queue_pop block", lambda: s.queue_pop("q")),
        ("queue_pop nonblock", lambda: s.queue_pop("q", block=False)),
        ("queue_len drained", lambda: s.queue_len("q")),
        ("queues are not keys", lambda: s.num_keys()),
        ("barrier of one", lambda: s.barrier("bar", 1)),
        ("barrier counter", lambda: s.get("bar")),
        ("barrier timeout", lambda: s.barrier("bar2", 2, timedelta(milliseconds=100))),
        ("list_keys", lambda: s.list_keys()),
        ("final num_keys", lambda: s.num_keys()),
    ]
    return [(name, _outcome(fn)) for name, fn in steps]


def _client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))


def test_every_op_matches_torchs_own_server(store_server, torch_server):
    ours = _sequence(_client(store_server.port))
    theirs = _sequence(_client(torch_server.port))
    assert len(ours) == len(theirs)
    for (name, mine), (_, reference) in zip(ours, theirs, strict=True):
        assert mine == reference, f"{name}: ours {mine!r}, torch's {reference!r}"
    # The sequence exercised real results, not a string of errors.
    assert sum(1 for _, r in theirs if r[0] == "ok") > 40


def test_add_on_text_fails_the_same_way(store_server, torch_server):
    def run(port):
        s = _client(port)
        s.set("t", "text")
        with pytest.raises(Exception) as info:
            s.add("t", 1)
        # The value survives on the server, for every other client.
        return type(info.value).__name__, _client(port).get("t")

    assert run(store_server.port) == run(torch_server.port)


@pytest.mark.parametrize("server", ["store_server", "torch_server"])
def test_torch_and_relaunch_clients_share_keys(server, request):
    srv = request.getfixturevalue(server)
    torch_client = _client(srv.port)
    ours = Store("127.0.0.1", srv.port, timeout=10)

    torch_client.set("from_torch", "t")
    assert ours.get("from_torch") == b"t"
    ours.set("from_relaunch", b"r")
    assert torch_client.get("from_relaunch") == b"r"
    assert ours.add("shared", 2) == 2
    assert torch_client.add("shared", 3) == 5
    assert sorted(ours.list_keys()) == sorted(torch_client.list_keys())
    ours.queue_push("jobs", "j1")
    assert torch_client.queue_pop("jobs") == b"j1"
    assert ours.compare_set("from_torch", "t", "u") == b"u"
    assert torch_client.get("from_torch") == b"u"


def test_a_torch_waiter_is_released_by_a_relaunch_writer(store_server):
    import threading

    torch_client = _client(store_server.port)
    ours = Store("127.0.0.1", store_server.port, timeout=10)
    # torch's wait holds the GIL-free C++ call; release it from another thread.
    timer = threading.Timer(0.2, lambda: ours.set("go", "1"))
    timer.start()
    try:
        torch_client.wait(["go"], timedelta(seconds=10))
    finally:
        timer.cancel()
    assert torch_client.get("go") == b"1"
