"""The runtime every run carries to where it executes: the node agent and the job controller.

Why a package of its own: the lifecycle of a node's ranks (start them with the contract's
variables, own logs, outcome records, first failure stops the others, signals) and of a job
(attempts, retries, log policies, time limit, requeue) is written once, here, and run by
every engine. It is stdlib only and runs on Python >= 3.8, because it runs where trebuchet
is not installed (a Slurm node, a container image): `treb` ships it into the run directory
as one file, `treb-runtime-<version>-<hash>.pyz` (trebuchet/launcher/runtime_file.py).

Modules: contract (rank variables), records (atomic JSON, outcome records), procs (process
groups, signals, subreaper), contain (a local run's cgroup v2, or the fallback), policies
(log policies), agent (a node's or a task's processes), task (a Slurm task, a
torchrun/mpirun worker, a pre/post command), node (one node of an engine that starts one
process per node: SkyPilot, Kubernetes), logcopy (the ranks' logs on a node's stdout),
controller (a Slurm job's attempts), main (the command line of the .pyz).
Imports inside the package are relative: in the .pyz it is not called `trebuchet.runtime`.
"""

VERSION = "1"  # bumped when a record or the command line changes meaning
