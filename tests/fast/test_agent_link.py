"""The agents' line to the Slurm job controller (runtime/job/link.py), over real sockets:
the attempt ends early only when every agent of it said so, with the right token."""

from __future__ import annotations

import os
import select
import time

import pytest

from trebuchet.runtime.job import link as agent_link


@pytest.fixture()
def hub():
    r, w = os.pipe()
    h = agent_link.Hub(w)
    yield h, r
    h.close()
    os.close(r)
    os.close(w)


def woken(fd: int, wait: float = 5.0) -> bool:
    return bool(select.select([fd], [], [], wait)[0])


def test_every_agent_of_the_attempt_ends_it_with_the_highest_code(hub, monkeypatch):
    h, wake = hub
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=1, tasks=3)
    agent_link.report_ended(1, "0", 0)
    agent_link.report_ended(1, "2", 143)
    assert h.ended() is None
    agent_link.report_ended(0, "1", 9)  # an older attempt's agent: not this attempt's
    agent_link.report_ended(1, "1", 3)
    assert woken(wake)
    assert h.ended() == 143


def test_a_wrong_token_or_a_garbled_line_ends_nothing(hub, monkeypatch):
    h, wake = hub
    h.expect(attempt=0, tasks=1)
    host, port, _ = agent_link.parse(h.address("127.0.0.1"))
    monkeypatch.setenv(agent_link.ENV, f"{host}:{port}:not-the-token")
    agent_link.report_ended(0, "0", 0)
    import socket

    with socket.create_connection((host, port)) as sock:
        sock.sendall(b"ended\n" + b"x" * 5000)  # no token, then a line over the limit
    assert not woken(wake, 0.5)
    assert h.ended() is None


def test_an_agent_without_a_controller_goes_on(monkeypatch):
    monkeypatch.setenv(agent_link.ENV, "127.0.0.1:1:token")  # nothing listens
    agent_link.report_ended(0, "0", 0)
    monkeypatch.setenv(agent_link.ENV, "garbage")
    agent_link.report_ended(0, "0", 0)
    assert agent_link.parse("[::1]:80:t") == ("[::1]", 80, "t")
    assert agent_link.parse("host:port:t") is None


def test_a_silent_agent_is_lost_and_an_ended_one_is_not(hub, monkeypatch):
    h, wake = hub
    monkeypatch.setattr(agent_link, "BEAT_S", 3600.0)  # no heartbeat: silence from hello on
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=2)
    quiet = agent_link.open_link(0, "0", "tn1")
    done = agent_link.open_link(0, "1", "tn2")
    assert quiet is not None and done is not None
    done.ended(0)
    deadline = time.monotonic() + 10
    while not h.lost(0.2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [lost.host for lost in h.lost(0.2)] == ["tn1"]
    assert h.lost(3600.0) == []  # within its timeout nobody is lost
    quiet.ended(3)
    assert woken(wake)  # the last of the attempt's agents ended
    assert h.lost(0.2) == [] and h.ended() == 3


def test_beating_agents_stay_alive(hub, monkeypatch):
    h, _ = hub
    monkeypatch.setattr(agent_link, "BEAT_S", 0.05)
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=1)
    link = agent_link.open_link(0, "0", "tn1")
    assert link is not None
    time.sleep(0.5)
    assert h.lost(30.0) == []
    link.ended(0)


def test_an_agent_notices_a_controller_that_stopped_answering(hub, monkeypatch):
    """Slurm's batch host lost (runtime/job/batchloss.py): the controller answers every line that
    carries its token, also an older attempt's; silent for the timeout, it is lost, once."""
    h, _ = hub
    monkeypatch.setattr(agent_link, "BEAT_S", 0.05)
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=1, tasks=1)
    lost: list[float] = []
    old = agent_link.open_link(0, "0", "tn1", on_lost=lost.append, timeout=0.4)
    assert old is not None
    time.sleep(1.0)
    assert lost == []  # answered, though attempt 0 is no longer the controller's
    assert old.sock is not None and time.monotonic() - old.heard < 0.4, "answers not read"
    h.closed = True  # the controller's thread stops: no more answers, as from a dead node
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert len(lost) == 1 and lost[0] <= time.time(), lost
    old.ended(0)


def test_parked_agents_run_the_next_attempt_on_the_controllers_word(hub, monkeypatch):
    """Issue 36: a retry in the same allocation reuses the step's agents (no new srun step).
    Each agent parks after its attempt (`park`); once every one of the step's agents parked,
    `resume` tells them the next attempt, which then ends as any other."""
    h, wake = hub
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=2)
    links = [agent_link.open_link(0, str(t), f"tn{t + 1}") for t in range(2)]
    assert all(link is not None for link in links)
    assert not h.resume(1, 2)  # nobody parked yet: a new step, as before
    for code, link in enumerate(links):
        assert link is not None
        link.park(code)
    assert woken(wake) and h.ended() == 1
    os.read(wake, 64)
    deadline = time.monotonic() + 5
    while h.parked_count() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.resume(1, 2)
    for link in links:
        assert link is not None and link.wait_next(lambda: False) == 1
        link.next_attempt(1)
    assert h.ended() is None
    for link in links:
        assert link is not None
        link.ended(0)
    assert woken(wake) and h.ended() == 0


def test_a_released_or_vanished_agent_is_not_resumed(hub, monkeypatch):
    """`release`: the controller's word to exit (a new step follows, or the job ends); an
    agent whose connection closed cannot run the next attempt: no resume, a new step."""
    h, _ = hub
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=2)
    a, b = agent_link.open_link(0, "0", "tn1"), agent_link.open_link(0, "1", "tn2")
    assert a is not None and b is not None
    a.park(0)
    b.park(0)
    deadline = time.monotonic() + 5
    while h.parked_count() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    b.ended(0)  # its process exits: the connection closes
    deadline = time.monotonic() + 5
    while h.parked_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not h.resume(1, 2)
    h.release()
    assert a.wait_next(lambda: False) is None


def until(check, wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if check():  # asked once per step: stop_overdue answers True only once
            return True
        time.sleep(0.01)
    return False


def three_agents(h: agent_link.Hub, monkeypatch) -> tuple[list[agent_link.Link], list[str]]:
    """Three agents of attempt 0 on the hub, every hello read; the tasks each `stop` reached."""
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=3)
    links = [agent_link.open_link(0, str(t), f"tn{t + 1}") for t in range(3)]
    stopped: list[str] = []
    for t, link in enumerate(links):
        assert link is not None
        link.on_stop = lambda t=t: stopped.append(str(t))
    assert until(lambda: len(h.tasks) == 3)  # every hello read (the go needs them all)
    return [link for link in links if link is not None], stopped


def test_a_rank_failure_stops_the_other_agents_over_the_link(hub, monkeypatch):
    """Issue 36: an agent whose rank failed says `failed`; the controller tells every other
    agent of the attempt to stop (no scancel through slurmctld), not the failed one, and
    asks for no scancel while the others end within the grace period."""
    h, wake = hub
    links, stopped = three_agents(h, monkeypatch)
    failed, *others = links
    assert failed.failed()
    assert woken(wake)
    assert until(lambda: sorted(stopped) == ["1", "2"])
    assert not h.stop_overdue(60.0)
    for code, link in ((1, failed), (143, others[0]), (143, others[1])):
        assert link is not None
        link.ended(code)
    assert until(lambda: h.ended() == 143)
    assert not h.stop_overdue(0.0)  # every agent answered: no scancel
    assert stopped == ["1", "2"] or stopped == ["2", "1"]  # once each


def test_a_stop_no_agent_answers_falls_back_to_scancel(hub, monkeypatch):
    """An agent the stop cannot reach (never connected) means scancel at once; one that
    does not end within the grace period, scancel then; each only once. A stop of
    another attempt stops nothing."""
    h, _ = hub
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=3)
    a, b = agent_link.open_link(0, "0", "tn1"), agent_link.open_link(0, "1", "tn2")
    assert a is not None and b is not None
    assert until(lambda: len(h.tasks) == 2)
    a.failed()
    assert until(lambda: h.stop_at is not None)
    assert h.stop_overdue(60.0)  # task 2 never said hello: the stop cannot reach it
    assert not h.stop_overdue(60.0)
    h.expect(attempt=1, tasks=2)
    a.next_attempt(1)
    b.next_attempt(1)
    stopped: list[int] = []
    b.on_stop = lambda: stopped.append(1)
    assert until(lambda: len(h.tasks) == 2)
    b.attempt = 7  # an agent on another attempt (not 0: the first stop may be unread yet)
    a.failed()
    assert until(lambda: h.stop_at is not None)
    assert until(lambda: h.stop_overdue(0.05))  # b never ends
    assert stopped == []


def test_the_controllers_own_teardown_stops_every_agent_over_the_link(hub, monkeypatch):
    """Issue 36: a hang, the timeout, a cancel or a lost node: the controller's `stop` to
    every agent of the attempt that has not ended (scancel only as the fallback). An agent
    not yet connected: False at once (the caller scancels, and stop_overdue does not ask
    again); one that does not end within the grace period: stop_overdue, once."""
    h, _ = hub
    links, stopped = three_agents(h, monkeypatch)
    links[0].ended(0)  # ended before the stop: not told
    assert until(lambda: h.ended_count == 1)
    assert h.stop_all()
    assert until(lambda: sorted(stopped) == ["1", "2"])
    assert h.take_stop() is None  # no agent's failure made it
    assert h.stop_all()  # a second teardown (the grace's SIGKILL step): nothing new sent
    assert not h.stop_overdue(60.0)
    assert until(lambda: h.stop_overdue(0.05))  # 1 and 2 never end: scancel, once
    assert not h.stop_overdue(0.0)
    assert sorted(stopped) == ["1", "2"]
    h.expect(attempt=1, tasks=2)
    a = agent_link.open_link(1, "0", "tn1")
    assert a is not None
    assert until(lambda: len(h.tasks) == 1)
    assert not h.stop_all()  # task 1 never said hello: the caller scancels at once
    assert not h.stop_overdue(0.0)  # ... and is not asked again


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_lost_controller_without_scontrol_or_scancel_is_still_recorded(
    tmp_path, monkeypatch, attempts
):
    """The agent that finds its controller lost acts through scontrol/scancel; a node where
    they are missing (or hang past their timeout) must not end the agent's link thread with a
    traceback: the loss stays recorded and the failure to act is said in the events."""
    from trebuchet.runtime.job import batchloss

    (tmp_path / "attempt-0").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("SLURM_STEP_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    job = {"run_dir": str(tmp_path), "max_attempts": attempts}
    batchloss.on_lost(job, 0, 5.0, time.time())  # type: ignore[arg-type]
    events = (tmp_path / "events.jsonl").read_text()
    assert "could not" in events
    if attempts == 1:
        assert '"FAILED"' in (tmp_path / "result.json").read_text()


def test_a_stop_right_behind_the_next_word_reaches_the_parked_agents(hub, monkeypatch):
    """The controller's own teardown (a cancel, the timeout) just after it told the parked
    agents `next 1`: both words reach an agent in one read, before it took up attempt 1.
    The stop is for attempt 1 and is kept, not dropped as another attempt's (which left
    the ranks running until the grace period's scancel)."""
    h, _ = hub
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=2)
    links = [agent_link.open_link(0, str(t), f"tn{t + 1}") for t in range(2)]
    for link in links:
        assert link is not None
        link.park(0)
    assert until(lambda: h.parked_count() == 2)
    assert h.resume(1, 2)
    assert h.stop_all()  # sent right behind `next 1`
    for link in links:
        assert link is not None and link.wait_next(lambda: False) == 1
        link.next_attempt(1)
        # in one read with `next 1` (kept for it), or read once attempt 1 runs
        assert until(lambda lk=link: lk.wait_go(0.02) or lk.stop_said), "the stop was dropped"
        link.ended(143)


@pytest.mark.parametrize("nodelist", ["n[a-b]", "n[", "n[1-200000]"])
def test_a_lost_controller_with_a_nodelist_no_parser_reads_still_acts(
    tmp_path, monkeypatch, nodelist
):
    """The step's nodelist only places the lost node (its NODE_RANK in the record): one that
    neither python-hostlist nor the small parser reads (BadHostlist, ValueError) must not
    end the agent's link thread after it took the loss's mark, with no requeue, no end
    and no other agent to act: the loss is recorded at node 0 and the job requeued."""
    from trebuchet.runtime.job import batchloss

    (tmp_path / "attempt-0").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodelist)
    job = {"run_dir": str(tmp_path), "max_attempts": 2}
    batchloss.on_lost(job, 0, 5.0, time.time())  # type: ignore[arg-type]
    events = (tmp_path / "events.jsonl").read_text()
    assert "job_requeue" in events and "could not run scontrol requeue" in events


def test_a_lost_nodes_spare_joins_the_parked_agents_told_their_new_place(hub, monkeypatch):
    """Issue 36: after a lost node (tn1, node 0), the parked survivors run the next attempt
    in their step, each told its node rank, the node count and the master in the `next`
    word; the spare's agent, in a new step, joins by its hello (its step id tells it from
    the parked task 0), and the attempt ends once all of them did, the spare's included."""
    h, wake = hub
    monkeypatch.setenv(agent_link.ENV, h.address("127.0.0.1"))
    h.expect(attempt=0, tasks=3)
    links = [agent_link.open_link(0, f"0.{t}", f"tn{t + 1}") for t in range(3)]
    survivors = [link for link in links[1:] if link is not None]
    for link in survivors:
        link.park(0)
    assert until(lambda: h.parked_count() == 2)
    assert h.resume_on(1, ["tn1", "tn2"], "tn2", "29500") is None  # tn3 parked, not in use
    assert h.parked_count() == 2
    assert h.resume_on(1, ["tn2", "tn3", "tn4"], "tn2", "29500") == ["tn4"]
    for node, link in enumerate(survivors):
        assert link.wait_next(lambda: False) == 1
        assert link.placement == agent_link.Placement(node, 3, "tn2", "29500", "tn2,tn3,tn4",
                                                      "tn2,tn3,tn4")  # fmt: skip
        link.next_attempt(1)
        assert link.placement is None
    spare = agent_link.open_link(1, "1.0", "tn4")
    assert spare is not None
    for link in survivors:
        link.ended(0)
    assert not woken(wake, 0.3) and h.ended() is None  # the spare has not ended
    spare.ended(5)
    assert woken(wake) and h.ended() == 5


def test_a_garbled_next_word_is_no_word(monkeypatch):
    """The parked agent reads only a well-formed `next`: a node rank past the node count, a
    missing field or a non-number leaves it waiting, not running a wrong contract."""
    link = agent_link.Link(None, "t", 0, "0.0")
    for line in (b"next", b"next x", b"next 1 2 2 tn1 29500", b"next 1 0 2 tn1",
                 b"next 1 0 2 tn1 port", b"next 1 a 2 tn1 1"):  # fmt: skip
        link._answer(line)
        assert not link.word.is_set() and link.placement is None, line
    link._answer(b"next 1 1 2 tn1 1")
    assert link.word.is_set() and link.next == 1
    assert link.placement == agent_link.Placement(1, 2, "tn1", "1")
