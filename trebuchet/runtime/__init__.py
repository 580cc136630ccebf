"""The runtime every run carries to where it executes: the node agent and the job controller.

The life of a node's ranks and of a job is written once, here, for every engine. Stdlib
only, Python >= 3.8: it runs where trebuchet is not installed, shipped as one file,
`treb-runtime-<version>-<hash>.pyz` (trebuchet/launcher/runtime_file.py).

Sub-packages by role (docs/architecture.md), each importing only those before it here:
contracts (what processes hand each other), rundir (the run directory's files), process
(process groups, signals, containment), watch (what watches a run: metrics, progress,
hangs, stacks, GPUs), publish (webhooks, trackers), job (the job's life, once for every
engine), node (what runs on a node: the agent, its ranks, health checks), slurm (Slurm's
batch step); command_line is the .pyz's command line.
Imports inside the package are relative: in the .pyz it is not called `trebuchet.runtime`.
"""

VERSION = "1"  # bumped when a record or the command line changes meaning
