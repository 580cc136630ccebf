"""trebuchet: one YAML file, any engine, for distributed ML training.

`launch()` and `Run` are the Python API; they are imported lazily so that `import
trebuchet` (and the `treb` CLI) stays fast.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: the helpers that import this package start lighter

__version__ = "0.1.0"
__all__ = ["launch", "Run", "RunFailed"]

if TYPE_CHECKING:
    from typing import Any

    from trebuchet.api import Run, launch
    from trebuchet.errors import RunFailed


def __getattr__(name: str) -> Any:
    if name in ("launch", "Run"):
        from trebuchet import api

        return getattr(api, name)
    if name == "RunFailed":
        from trebuchet.errors import RunFailed

        return RunFailed
    raise AttributeError(name)
