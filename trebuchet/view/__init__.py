"""What a terminal shows of a run, apart from supervision: `follow` tails rank logs as
prefixed lines (`treb logs`), `live` does it in a thread beside what supervises or follows
a run (attached `treb run`), skipping under pressure; `dedup` and `fold` shorten it.
"""
