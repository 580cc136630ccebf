"""An engine that takes the job itself (SkyPilot, Kubernetes) says when with its RUNNING
`state` event: the index's started_at, live and in a rebuild from events.jsonl."""

from __future__ import annotations

from trebuchet.store.lifecycle import columns


def test_a_state_event_that_carries_started_at_sets_it() -> None:
    ev = {"time": 20.0, "event": "state", "state": "RUNNING", "started_at": 12.5}
    assert columns(ev) == {"state": "RUNNING", "started_at": 12.5}


def test_other_state_events_leave_it_alone() -> None:
    assert columns({"time": 20.0, "event": "state", "state": "RUNNING"}) == {"state": "RUNNING"}
    ended = columns({"time": 30.0, "event": "state", "state": "FAILED"})
    assert ended == {"state": "FAILED", "ended_at": 30.0}
