"""The runtime every run carries to where it executes: the node agent and the job controller.

Why a package of its own: the lifecycle of a node's ranks (start them with the contract's
variables, own logs, outcome records, first failure stops the others, signals) and of a job
(attempts, retries, log policies, time limit, requeue) is written once, here, and run by
every engine. It is stdlib only and runs on Python >= 3.8, because it runs where trebuchet
is not installed (a Slurm node, a container image): `treb` ships it into the run directory
as one file, `treb-runtime-<version>-<hash>.pyz` (trebuchet/launcher/runtime_file.py).

Sub-packages by role (docs/architecture.md), each importing only those before it here:
contracts (what processes hand each other), rundir (the run directory's files), process
(process groups, signals, containment), watch (what watches a run: metrics, progress,
hangs, stacks, GPUs), publish (webhooks, trackers), job (the job's life, once for every
engine), node (what runs on a node: the agent, its ranks, health checks), slurm (Slurm's
batch step); command_line is the .pyz's command line.
Imports inside the package are relative: in the .pyz it is not called `trebuchet.runtime`.
"""

VERSION = "1"  # bumped when a record or the command line changes meaning
