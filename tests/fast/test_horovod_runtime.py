"""runtime/node/horovodrun.py without horovod: horovodrun's command line from the spec's HOROVOD_*
env, the refusals of bad values, the interface toward a peer (this machine's real
interfaces), a rank's cascade after another's failure, a node waiting for its ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.runtime.node import horovodrun as horovod


def test_horovodrun_argv_as_determined_starts_it() -> None:
    env = {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_START_TIMEOUT": "30"}
    argv = horovod.horovodrun_argv(
        16, ["10.0.0.1", "10.0.0.2"], 8, env, 2222, "/k/id", "10.0.0.0/24"
    )
    assert argv == [
        "horovodrun", "-np", "16", "-H", "10.0.0.1:8,10.0.0.2:8", "--start-timeout", "30",
        "--mpi", "-p", "2222", "--ssh-identity-file", "/k/id", "--network-interfaces", "10.0.0.0/24",
    ]  # fmt: skip
    gloo = horovod.horovodrun_argv(2, ["localhost"], 2, {"HOROVOD_GLOO_TIMEOUT_SECONDS": "7"})
    assert gloo[-3:] == ["--gloo", "--gloo-timeout-seconds", "7"]


@pytest.mark.parametrize(
    "env,field",
    [
        ({"HOROVOD_CONTROLLER": "nccl"}, "env.HOROVOD_CONTROLLER"),
        ({"HOROVOD_CONTROLLER": "gloo\0x"}, "env.HOROVOD_CONTROLLER"),
        ({"HOROVOD_START_TIMEOUT": "9" * 400}, "env.HOROVOD_START_TIMEOUT"),
        ({"HOROVOD_START_TIMEOUT": "nan"}, "env.HOROVOD_START_TIMEOUT"),
        ({"HOROVOD_GLOO_TIMEOUT_SECONDS": "0"}, "env.HOROVOD_GLOO_TIMEOUT_SECONDS"),
    ],
)
def test_bad_settings_are_named(env: dict[str, str], field: str) -> None:
    found = horovod.env_problem(env)
    assert found is not None and found[0] == field
    assert len(found[1]) < 200  # a huge value is cut in the message


def test_gloo_is_refused_on_slurm_only() -> None:
    assert horovod.env_problem({"HOROVOD_CONTROLLER": "gloo"}) is None
    bad = horovod.slurm_problem({"HOROVOD_CONTROLLER": "gloo"})
    assert bad is not None and "under mpirun" in bad[1]
    assert horovod.slurm_problem({}) is None


def test_route_to_loopback_and_pick_iface() -> None:
    assert horovod.route_to("127.0.0.1") == ("lo", "127.0.0.0/8")
    assert horovod.route_to("no-such-host.invalid") is None
    env = {"TREB_HOROVOD_PICK_IFACE": "1", "HOROVOD_CONTROLLER": "gloo",
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_IFACE": "eth9"}  # fmt: skip
    horovod.pick_iface(env)
    assert env["HOROVOD_GLOO_IFACE"] == "lo"
    untouched = {**env, "HOROVOD_GLOO_IFACE": "eth9", "TREB_HOROVOD_PICK_IFACE": ""}
    horovod.pick_iface(untouched)
    assert untouched["HOROVOD_GLOO_IFACE"] == "eth9"


def test_peer_shutdown_is_read_from_the_log_end(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"x" * 200_000 + b"\nHorovodInternalError: " + horovod.SHUTDOWN + b". ...\n")
    assert horovod.peer_shutdown(str(log))
    log.write_bytes(b"ValueError: mine\n")
    assert not horovod.peer_shutdown(str(log))
    assert not horovod.peer_shutdown(str(tmp_path / "missing.log"))


def test_wait_ends_with_the_nodes_ranks(tmp_path: Path) -> None:
    for rank in (2, 3):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps({"state": "ENDED"}))
    assert horovod.wait([str(tmp_path), "60", "2", "3"]) == 0
    # none started within the limit: horovodrun's own start timeout names that
    assert horovod.wait([str(tmp_path / "none"), "0", "4"]) == 0


@pytest.mark.parametrize(
    "line,category",
    [
        ("RuntimeError: Horovod detected that one or more processes exited with non-zero "
         "status, thus causing the job to be terminated.", "cascade"),
        ("horovod.common.exceptions.HorovodInternalError: " + horovod.SHUTDOWN.decode(), "cascade"),
        ("RuntimeError: Unable to find a set of common task-to-task communication interfaces: "
         "[('10.0.0.2', 'eth0')]", "network_unreachable"),
    ],
)  # fmt: skip
def test_horovods_own_failures_are_classified(line: str, category: str) -> None:
    from trebuchet.diagnose import catalog

    rule = catalog.match(line, True)
    assert rule is not None and rule.category == category


REAL_CASCADE = (  # a rank's log end under horovodrun (gloo), rank 1 having left first
    b"step 1/5 loss=2.2965\nTraceback (most recent call last):\n"
    b'  File "mpi_ops.py", line 1285, in synchronize\n'
    b"    mpi_lib.horovod_torch_wait_and_clear(handle)\n"
    b"RuntimeError: " + horovod.SHUTDOWN + b" or an attempt to allreduce.\n\n"
    b"During handling of the above exception, another exception occurred:\n\n"
    b"Traceback (most recent call last):\n"
    b'  File "train.py", line 47, in <module>\n    opt.step()\n'
    b"horovod.common.exceptions.HorovodInternalError: " + horovod.SHUTDOWN + b" or an.\n"
)


def test_a_log_that_quotes_horovods_shutdown_is_no_cascade(tmp_path: Path) -> None:
    """A rank that printed horovod's shutdown text itself (a hint it echoes, an earlier
    error it caught and logged) and then failed on its own (its traceback says another
    error) is no cascade: else it is no failure of its own, and its peer that horovodrun
    stopped is named as the rank that left first (records.left_first), the wrong rank."""
    from trebuchet.runtime.node.agent import Proc
    from trebuchet.runtime.node.task import _horovod_cascade
    from trebuchet.runtime.rundir import records

    (tmp_path / "rank-0.log").write_bytes(
        b"hint: if you see '" + horovod.SHUTDOWN + b"', look above\nstep 1/5\n"
        b'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
        b"ValueError: bad batch at step 2\n"
    )
    p = Proc("rank-0", "0:0", ["x"], {}, rank=0, node=0, local_rank=0)
    p.returncode, p.ended_at = 1, 1.0
    assert not _horovod_cascade(str(tmp_path), None)(p)
    left = {"label": "0:1", "rank": 1, "node": 0, "exit_code": 143, "signal": "SIGTERM",
            "ended_at": 1.1, "stopped_by_launcher": True}  # fmt: skip
    found = records.first_failure([{**p.outcome(), "stopped_by_launcher": p.stopped}, left])
    assert found is not None and found["rank"] == 0 and not found.get("left_first"), found
    (tmp_path / "rank-0.log").write_bytes(  # quoted, then its own sys.exit(3): no traceback
        b"hint: if you see '" + horovod.SHUTDOWN + b"', look above\nleaving on purpose\n"
    )
    assert not _horovod_cascade(str(tmp_path), None)(p)
    (tmp_path / "rank-0.log").write_bytes(horovod.SHUTDOWN + b" or an attempt.\n")
    assert _horovod_cascade(str(tmp_path), None)(p)  # caught, printed (print(e)), exited


def test_horovods_own_cascade_is_read_through_its_chain_and_what_follows(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    for tail in (b"", b"Exception ignored in: <function X.__del__>\nTraceback (most recent "
                 b"call last):\n  File \"x.py\", line 1\nOSError: closed\n",
                 b"[W gloo] connection closed by peer\n"):  # fmt: skip
        log.write_bytes(REAL_CASCADE + tail)
        assert horovod.peer_shutdown(str(log)), tail
    log.write_bytes(REAL_CASCADE + b"The above exception was the direct cause of the "
                    b"following exception:\n\nTraceback (most recent call last):\n"
                    b"MyTrainingError: training failed\n")  # fmt: skip
    assert horovod.peer_shutdown(str(log))  # raised from horovod's: still its cascade
    log.write_bytes(REAL_CASCADE + b"step 1/5 resumed\n" * 3 + b"Traceback (most recent "
                    b"call last):\nValueError: mine\n")  # fmt: skip
    assert not horovod.peer_shutdown(str(log))  # caught, went on, failed on its own
    for line in (b"Error" * 12000, b"x.Error" * 8500):  # a hostile line before the word
        log.write_bytes(line + b" " + horovod.SHUTDOWN + b"\n")
        assert not horovod.peer_shutdown(str(log))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([horovod.SHUTDOWN, horovod.TRACEBACK, *horovod.CHAINED,
                                 horovod.IGNORED + b": x", b"\n", b"\x00", b"\r", b"y" * 50,
                                 "\u2028".encode(), b"\xff\xfe"]), max_size=30))  # fmt: skip
def test_any_log_is_read_without_an_exception(tmp_path_factory: Any, parts: list[bytes]) -> None:
    log = tmp_path_factory.mktemp("h") / "rank-0.log"
    log.write_bytes(b"".join(parts))
    assert horovod.peer_shutdown(str(log)) in (True, False)
