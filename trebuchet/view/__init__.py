"""What a terminal shows of a run: rank logs as prefixed lines, apart from supervision.

`lines` splits bytes into display lines (linear, bounded, escape sequences made inert),
`follow` tails log files (`treb logs`), `live` runs that in a thread beside whatever
supervises or follows a run (attached `treb run`), skipping under pressure.
"""
