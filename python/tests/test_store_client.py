"""relaunch.Store against our server: every method, and every error it raises."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest

import relaunch
from relaunch import (
    QueueEmptyError,
    Store,
    StoreConnectionError,
    StoreError,
    StoreRequestError,
    StoreTimeoutError,
)


@pytest.fixture
def store(store_server) -> Store:
    return Store("127.0.0.1", store_server.port, timeout=10)


def test_every_method(store):
    store.set("k", "v")
    assert store.get("k") == b"v"
    store.set("b", b"\x00\xff")
    assert store.get("b") == b"\x00\xff"
    store.set("ba", bytearray(b"xy"))
    assert store.get("ba") == b"xy"
    assert store.add("n", 3) == 3
    assert store.add("n", -5) == -2
    assert store.compare_set("k", "v", "w") == b"w"
    assert store.compare_set("k", "v", "x") == b"w"
    assert store.compare_set("new", "", "d") == b"d"
    assert store.check(["k", "n"]) is True
    assert store.check("missing") is False
    store.wait(["k", "n"])
    store.wait("k", timeout=1)
    store.append("k", "!")
    assert store.get("k") == b"w!"
    store.multi_set(["m1", "m2"], ["1", b"2"])
    assert store.multi_get(["m2", "m1"]) == [b"2", b"1"]
    assert store.num_keys() == 7
    assert store.delete_key("m1") is True
    assert store.delete_key("m1") is False
    assert sorted(store.list_keys()) == ["b", "ba", "k", "m2", "n", "new"]
    store.queue_push("q", "a")
    store.queue_push("q", "b")
    assert store.queue_len("q") == 2
    assert store.queue_pop("q") == b"a"
    assert store.queue_pop("q", block=False) == b"b"
    store.barrier("bar", 1)
    store.ping()
    assert store.timeout == timedelta(seconds=10)
    assert repr(store) == f"Store('127.0.0.1', {store.port}, timeout=10.0s)"


def test_wait_and_barrier_are_released_by_other_threads(store_server):
    a = Store("127.0.0.1", store_server.port, timeout=10)
    b = Store("127.0.0.1", store_server.port, timeout=10)
    done = []
    t = threading.Thread(target=lambda: (a.barrier("two", 2), done.append("a")))
    t.start()
    b.barrier("two", 2)  # the GIL is released while a waits
    t.join(10)
    assert done == ["a"]

    t = threading.Thread(target=lambda: done.append(a.get("late")))
    t.start()
    time.sleep(0.05)
    b.set("late", "here")
    t.join(10)
    assert done[-1] == b"here"


def test_timeouts_raise_store_timeout_error(store):
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match="missing") as info:
        store.wait(["missing"], timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 5
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, StoreError)
    with pytest.raises(StoreTimeoutError, match="barrier"):
        store.barrier("alone", 2, timeout=timedelta(milliseconds=100))
    with pytest.raises(QueueEmptyError):
        store.queue_pop("nothing", block=False)
    # The connection is still good.
    assert store.add("after", 1) == 1


def test_get_of_a_missing_key_times_out_after_the_store_timeout(store_server):
    s = Store("127.0.0.1", store_server.port, timeout=0.3)
    with pytest.raises(StoreTimeoutError):
        s.get("never")


def test_unreachable_store_raises_connection_error(free_port):
    start = time.monotonic()
    with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{free_port}") as info:
        Store("127.0.0.1", free_port, timeout=0.5)
    assert isinstance(info.value, ConnectionError)
    assert "relaunch store serve" in str(info.value)
    assert time.monotonic() - start < 5


def test_server_going_away_raises_connection_error_then_reconnects(free_port):
    from relaunch._subprocess import StoreProcess

    first = StoreProcess(port=free_port)
    s = Store("127.0.0.1", free_port, timeout=2)
    s.set("k", "v")
    assert first.stop() == 0
    with pytest.raises(StoreConnectionError):
        s.add("k2", 1)
    # A new server on the same port: the client reconnects by itself.
    with StoreProcess(port=free_port):
        assert s.add("k2", 1) == 1


def test_oversized_requests_are_refused_before_sending(store):
    with pytest.raises(StoreRequestError, match="max_value_bytes") as info:
        store.set("big", b"x" * (8 * 1024 * 1024 + 1))
    assert isinstance(info.value, ValueError)
    with pytest.raises(StoreRequestError, match="max_key_bytes"):
        store.set("k" * 9000, "v")
    store.set("fine", b"x" * (8 * 1024 * 1024))
    assert len(store.get("fine")) == 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda s: s.set(1, "v"), TypeError, "key must be a str"),
        (lambda s: s.set("k", 1.5), TypeError, "value must be str or bytes"),
        (lambda s: s.add("k", "1"), TypeError, "amount must be an int"),
        (lambda s: s.add("k", True), TypeError, "amount must be an int"),
        (lambda s: s.wait(["k", 2]), TypeError, "each key must be a str"),
        (lambda s: s.wait(["k"], timeout=-1), ValueError, "timeout must be"),
        (lambda s: s.wait(["k"], timeout="1s"), TypeError, "timeout must be seconds"),
        (lambda s: s.multi_set(["a", "b"], ["1"]), ValueError, "2 keys but 1 values"),
        (lambda s: s.barrier("b", 0), ValueError, "world_size must be a positive int"),
    ],
)
def test_bad_arguments_get_clear_errors(store, call, error, message):
    with pytest.raises(error, match=message):
        call(store)
    store.ping()  # nothing was sent; the connection is fine


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("", 1), {}, TypeError),
        ((None, 1), {}, TypeError),
        (("127.0.0.1", 0), {}, ValueError),
        (("127.0.0.1", 70000), {}, ValueError),
        (("127.0.0.1", "29400"), {}, ValueError),
        (("127.0.0.1", 1), {"timeout": float("nan")}, ValueError),
    ],
)
def test_bad_constructor_arguments(args, kwargs, error):
    with pytest.raises(error):
        Store(*args, **kwargs)


def test_ctrl_c_interrupts_a_long_wait(store_server):
    code = textwrap.dedent(
        f"""
        import signal, sys, relaunch
        # Python leaves SIGINT ignored when it starts ignored (a test run in
        # the background of a shell, `scripts/test.sh &`): this test is
        # about what Ctrl-C does, so it asks for Python's usual handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        s = relaunch.Store("127.0.0.1", {store_server.port}, timeout=60)
        try:
            print("waiting", flush=True)
            s.wait(["never"])
        except KeyboardInterrupt:
            # The interrupted call's connection is replaced on the next call.
            print("interrupted", s.add("after", 1), flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "waiting"
    time.sleep(0.3)  # let it enter the native wait; caught either way
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    assert out.strip() == "interrupted 1"


def test_errors_are_exported_from_one_module():
    for name in [
        "StoreError",
        "StoreTimeoutError",
        "StoreConnectionError",
        "StoreRequestError",
        "QueueEmptyError",
    ]:
        cls = getattr(relaunch, name)
        assert cls.__module__ == "relaunch.errors"
        assert issubclass(cls, relaunch.RelaunchError)
