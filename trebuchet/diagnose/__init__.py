"""Why a run failed: the first failing rank, told apart from the cascade, and its cause.

catalog.py  the causes (category, log patterns, remedy) and the exit-code table
lines.py    one log line: rank prefix ([rank3]:, [default0]:, `3: `), timestamp
scan.py     reads a log from its end, keeps only the lines that can explain a failure
classify.py what one rank's lines say: exception, user frame, category, evidence
sources.py  what was read: a trebuchet run, a torchrun console log, an srun log, a log dir
engine.py   picks the root cause among the ranks
report.py   the two-line summary, the full text and the JSON
"""
