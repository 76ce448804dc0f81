"""hf_tinytx/commands/signals.py: each shape with real signals, sent to this process (its handlers run in
the main thread, as pytest's tests do) or to a child that must end."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hf_tinytx.commands import signals
from hf_tinytx.commands.signals import Forwarder, Recorder, StopSignal, raising, record


def handlers() -> tuple:
    return tuple(signal.getsignal(signum) for signum in signals.STOP_SIGNALS)


def test_raising_raises_where_the_block_was_ignores_a_second_signal_and_restores_the_handlers():
    before = handlers()
    with pytest.raises(StopSignal) as stop, raising():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs before this ends
    assert stop.value.signum == signal.SIGTERM and str(stop.value) == "SIGTERM"
    assert not isinstance(stop.value, Exception)  # `except Exception` in a command lets it pass
    assert handlers() == before


def test_after_the_first_signal_a_second_one_does_nothing_until_the_block_ends():
    before = handlers()
    with pytest.raises(StopSignal), raising():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        finally:  # the cleanup a stop starts: a second Ctrl-C must not cut it short
            assert handlers() == (signal.SIG_IGN, signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGINT)
    assert handlers() == before


def test_off_the_main_thread_the_shapes_set_nothing_and_raise_nothing():
    before, seen = handlers(), []

    def in_a_thread():
        with raising(), Recorder() as recorder:
            seen.append((handlers(), recorder.earlier))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [(before, {})] and handlers() == before


def test_a_recorder_records_in_order_for_the_caller_to_poll_and_restores_the_handlers():
    before = handlers()
    stops = record()
    try:
        assert stops.first is None
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert stops.first == signal.SIGTERM and stops.received == [signal.SIGTERM, signal.SIGINT]
    finally:
        stops.restore()
    assert handlers() == before


def test_a_recorder_subclass_acts_at_each_signal():
    class Counting(Recorder):
        def stopping(self, signum):
            self.seen = [*getattr(self, "seen", []), signal.Signals(signum).name]

    with Counting() as counting:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    assert counting.seen == ["SIGINT", "SIGINT"]


CHILD = """
import sys, time
from hf_tinytx.commands.signals import record
stops = record(exit_on_second=True)
print("ready", flush=True)
while stops.first is None:
    time.sleep(0.01)
print("first", stops.first, flush=True)
time.sleep(60)  # a slow shutdown, which the second signal cuts short
"""


def test_with_exit_on_second_a_second_signal_ends_the_process_at_once_with_its_status():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        assert child.stdout.readline() == f"first {int(signal.SIGTERM)}\n"
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) == 128 + signal.SIGINT
    finally:
        child.kill()
        child.wait()


def test_a_forwarder_passes_the_first_signal_to_each_child_once_also_to_one_started_later():
    children = [subprocess.Popen(["sleep", "60"])]
    try:
        with Forwarder(lambda: [child.pid for child in children if child.poll() is None]) as forwarder:
            forwarder.forward()  # no signal yet: nothing to pass on
            assert children[0].poll() is None
            os.kill(os.getpid(), signal.SIGTERM)
            assert children[0].wait(timeout=30) == -signal.SIGTERM
            children.append(subprocess.Popen(["sleep", "60"]))
            os.kill(os.getpid(), signal.SIGINT)  # a second signal: the first one is what the children get
            assert children[1].wait(timeout=30) == -signal.SIGTERM
            assert forwarder.told == {child.pid for child in children}
            assert forwarder.received == [signal.SIGTERM, signal.SIGINT]
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_forwarder_reaches_a_child_started_after_the_signal_at_the_next_forward():
    children = []
    with Forwarder(lambda: [child.pid for child in children if child.poll() is None]) as forwarder:
        os.kill(os.getpid(), signal.SIGINT)
        children.append(subprocess.Popen(["sleep", "60"]))
        try:
            forwarder.forward()
            assert children[0].wait(timeout=30) == -signal.SIGINT
        finally:
            children[0].kill()
            children[0].wait()
