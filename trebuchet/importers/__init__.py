"""`treb import KIND FILE`: a spec from another launcher's config (sbatch, air, madengine, nemo).

Each importer returns an ImportResult: the spec as plain data plus a note, with its line
number, for every part of the input that could not be carried over. Nothing is dropped
without a note.
"""

from __future__ import annotations

import importlib

KINDS = {
    "sbatch": "a Slurm batch script (#SBATCH headers, srun lines)",
    "air": "a Databricks AI Runtime workload YAML",
    "madengine": "a madengine models.json (with --tags) or a single model card",
    "nemo": "a NeMo AutoModel config with a slurm: or skypilot: block",
    "determined": "a Determined experiment config's launch part (horovod, torch_distributed)",
}


def importer(kind: str):
    """The module that imports `kind` (each has `import_file(path, **options)`)."""
    return importlib.import_module(f"trebuchet.importers.{kind}")
