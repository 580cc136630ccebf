"""The code a Kubernetes pod runs: the run's snapshot, shipped as a gzipped tar in the
run's ConfigMap and unpacked by the pod into an emptyDir (or the image's, `code_dir`).

Why a ConfigMap: it already carries the node agent, so the run needs no registry, bucket or
volume of its own. The price is its size limit (1 MiB): larger code belongs in the image.
"""

from __future__ import annotations

import base64
import gzip
import io
import stat
import tarfile
from pathlib import Path

from trebuchet.errors import UserError

CODE_DIR = "/treb-code"  # the emptyDir the archive is unpacked into
ARCHIVE = "code.tar.gz"  # its key in the ConfigMap
CONFIGMAP_MAX = 1 << 20  # what Kubernetes stores in one ConfigMap (data and binaryData)
RAW_MAX = 16 << 20  # above this the files are not even packed: they cannot fit


def pack(root: Path, files: list[str]) -> bytes:
    """A deterministic .tar.gz of `files`: sorted, no owners, mtime 0, modes kept (scripts
    stay executable)."""
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel in sorted(files):
            path = root / rel
            st = path.lstat()
            info = tarfile.TarInfo(rel)
            info.mode, info.mtime = stat.S_IMODE(st.st_mode), 0
            if stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, str(path.readlink())
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def code_files(workdir: Path, snapshot: Path | None) -> tuple[Path, list[str]]:
    """(root, files) of the code: the run's snapshot when it was taken, else the
    workdir's files as the snapshot would list them."""
    from trebuchet.launcher.snapshot import list_files

    if snapshot is not None and snapshot.is_dir():
        files = [str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if not p.is_dir()]
        return snapshot, files
    files, _ = list_files(workdir)
    return workdir, [f for f in files if (workdir / f).is_file() or (workdir / f).is_symlink()]


def code_archive(workdir: Path, snapshot: Path | None, room: int) -> tuple[bytes, int]:
    """(archive, file count) of the code, refused when its base64 exceeds `room` bytes."""
    root, files = code_files(workdir, snapshot)
    raw = sum((root / f).lstat().st_size for f in files)
    fix = (
        "bake the code into the image and set kubernetes.code_dir to where it is, or "
        "exclude files in .trebignore"
    )
    if raw > RAW_MAX:
        raise UserError(
            f"kubernetes: the code in {workdir} is {raw >> 20} MiB: more than a ConfigMap "
            f"holds (1 MiB); {fix}"
        )
    data = pack(root, files)
    size = len(base64.b64encode(data))
    if size > room:
        raise UserError(
            f"kubernetes: the code in {workdir} packs to {size >> 10} KiB in base64, more "
            f"than the {room >> 10} KiB left in the ConfigMap beside the node agent; {fix}"
        )
    return data, len(files)
