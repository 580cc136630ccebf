"""Code snapshots: a queued or retried run executes the code as it was at submission.

In a git repository the snapshot holds the files git would show: tracked ones as they are
in the working tree (uncommitted edits included, recorded as dirty) and untracked ones
that .gitignore does not ignore (`git ls-files --others --exclude-standard`: a new script
runs without a `git add` first). Elsewhere it holds every file that .gitignore does not
exclude. `.trebignore` (gitignore syntax) excludes more in both cases. A folder holding `pyvenv.cfg`
is a virtualenv and is left out, said once (its hundreds of MB of site-packages made the
snapshot refuse the run, and a copied venv does not work: its scripts name their path).

Only regular files and symlinks are copied: a FIFO, socket or device is skipped with a
warning (opening a FIFO would hang). A file that vanishes during the copy is skipped
with a warning; unreadable files, or a disk without room for the copy, refuse the run
with their names, before anything is recorded (the caller removes the run directory).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

from trebuchet.errors import UserError
from trebuchet.launcher.outputs import MANIFEST
from trebuchet.plain import field, record
from trebuchet.runtime.rundir.records import read_json
from trebuchet.store.paths import treb_home


@record
class Snapshot:
    """What was copied, and what the run record says about the code."""

    path: str
    files: int = 0
    bytes: int = 0
    git_commit: str | None = None
    git_dirty: bool | None = None
    untracked: list[str] = field(default_factory=list)  # included, not in git yet
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why it was left out
    venvs: list[str] = field(default_factory=list)  # virtualenv folders left out


def in_git_tree(path: Path) -> bool:
    """Whether git could find a repository for `path` (a `.git` in it or above it, or
    GIT_DIR): elsewhere a git call only costs a process to say "not a git repository"."""
    if os.environ.get("GIT_DIR"):
        return True
    try:
        here = path.resolve()
    except OSError:
        return True  # let git say what is wrong
    return any(os.path.lexists(d / ".git") for d in (here, *here.parents))


def _git_all(workdir: Path, *calls: list[str]) -> list[str | None]:
    """Several git commands at once (they only read): each one's stdout, None on failure."""
    procs: list[subprocess.Popen[str] | None] = []
    for args in calls:
        try:
            procs.append(subprocess.Popen(["git", "-C", str(workdir), *args], text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          stdin=subprocess.DEVNULL))  # fmt: skip
        except OSError:
            procs.append(None)
    out: list[str | None] = []
    for proc in procs:
        if proc is None:
            out.append(None)
            continue
        try:
            stdout, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out.append(None)
            continue
        out.append(stdout if proc.returncode == 0 else None)
    return out


def _git(workdir: Path, *args: str) -> str | None:
    return _git_all(workdir, list(args))[0]


def _ignore_spec(path: Path):  # -> pathspec.PathSpec | None
    if not path.is_file():
        return None
    import pathspec

    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"{path}: cannot read it for the code snapshot: {exc.strerror}") from None
    return pathspec.PathSpec.from_lines("gitwildmatch", text.splitlines())


def list_files(workdir: Path) -> tuple[list[str], Snapshot]:
    """Relative paths to copy, and the git facts of the workdir."""
    info = Snapshot(path="")
    home = _inside(treb_home(), workdir)
    listed, status = (
        _git_all(workdir, ["ls-files", "-z", "-t", "--cached", "--others", "--exclude-standard"],
                 ["--no-optional-locks", "status", "--porcelain=v2", "--branch",
                  "--untracked-files=no", "--", "."])
        if in_git_tree(workdir)
        else (None, None)
    )  # fmt: skip
    tracked = None if listed is None else [e for e in listed.split("\0") if e]
    if tracked is not None:
        # `-t` tags each path: `? ` untracked (not ignored), any other tag tracked
        files = [e[2:] for e in tracked if e[:1] != "?" and os.path.lexists(workdir / e[2:])]
        info.untracked = [e[2:] for e in tracked if e[:1] == "?"]
        files += info.untracked
        lines = (status or "").splitlines()
        oid = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ")), "")
        info.git_commit = oid if re.fullmatch(r"[0-9a-f]{7,64}", oid) else None
        info.git_dirty = any(ln and not ln.startswith("#") for ln in lines)
    else:
        gitignore = _ignore_spec(workdir / ".gitignore")
        files = []
        for root, dirs, names in os.walk(workdir):
            rel_root = Path(root).relative_to(workdir)
            dirs[:] = [d for d in dirs if d != ".git" and str(rel_root / d) != home and not (
                gitignore and gitignore.match_file(f"{rel_root / d}/"))]  # fmt: skip
            venvs = [d for d in dirs if os.path.isfile(os.path.join(root, d, "pyvenv.cfg"))]
            info.venvs += [str(rel_root / d) for d in venvs]  # not walked: never listed
            dirs[:] = [d for d in dirs if d not in venvs]
            for n in names:
                rel = str(rel_root / n) if str(rel_root) != "." else n
                if not (gitignore and gitignore.match_file(rel)):
                    files.append(rel)
    if home:  # never snapshot trebuchet's own state (it holds this very run)
        files = [f for f in files if not (f == home or f.startswith(home + "/"))]
    info.venvs = sorted({*info.venvs, *venv_folders(workdir, files)})
    if info.venvs:
        files = [f for f in files if not _under(f, info.venvs)]
    trebignore = _ignore_spec(workdir / ".trebignore")
    if trebignore:
        files = [f for f in files if not trebignore.match_file(f)]
    info.untracked = sorted(f for f in info.untracked if f in set(files))
    info.git_dirty = info.git_dirty or (bool(info.untracked) if tracked is not None else None)
    return sorted(set(files)), info


def venv_folders(workdir: Path, files: list[str]) -> list[str]:
    """The outermost folders among `files`' parents that hold a pyvenv.cfg: virtualenvs."""
    parents = sorted({str(p) for f in files for p in Path(f).parents if str(p) != "."},
                     key=lambda d: (d.count("/"), d))  # fmt: skip
    found: list[str] = []
    for d in parents:
        if not _under(d, found) and os.path.isfile(workdir / d / "pyvenv.cfg"):
            found.append(d)
    return sorted(found)


def venv_note(venvs: list[str]) -> str:
    """The one line a run says about the virtualenvs its snapshot left out."""
    shown = ", ".join(f"{d}/" for d in venvs[:5]) + (f" and {len(venvs) - 5} more"
                                                     if len(venvs) > 5 else "")  # fmt: skip
    return (
        f"the code snapshot leaves out the virtualenv{'s' if len(venvs) > 1 else ''} {shown} "
        "(a folder with pyvenv.cfg): the ranks use the python they start with (PATH, an "
        "absolute path, or environment:); snapshot: false runs in the workdir itself"
    )


def _under(path: str, folders: list[str]) -> bool:
    return any(path == d or path.startswith(d + "/") for d in folders)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _inside(path: Path, root: Path) -> str | None:
    """`path` relative to `root` when it lies inside it."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return None


KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
         stat.S_IFBLK: "a device", stat.S_IFDIR: "a folder"}  # fmt: skip
ROOM = 16 << 20  # what a snapshot leaves free on the disk, for the run's logs and records


def sizes(workdir: Path, files: list[str], info: Snapshot) -> dict[str, int]:
    """Each file's size; special files and vanished ones go to info.skipped instead."""
    out: dict[str, int] = {}
    for f in files:
        try:
            st = (workdir / f).lstat()
        except FileNotFoundError:
            info.skipped[f] = "it vanished while the snapshot was taken"
            continue
        except OSError as exc:
            raise UserError(f"{workdir / f}: cannot read it for the code snapshot: "
                            f"{exc.strerror}") from None  # fmt: skip
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            out[f] = st.st_size if stat.S_ISREG(st.st_mode) else 0
        else:
            kind = KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            info.skipped[f] = f"it is {kind} (only regular files and symlinks are copied)"
    return out


def copy_files(workdir: Path, files: list[str], dest: Path, info: Snapshot) -> int:
    """Copy `files` into `dest`; the bytes copied. Unreadable files refuse the snapshot
    (all of them named), a full disk too; a file gone since it was listed is skipped."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    unreadable: list[str] = []
    total = 0
    for f in files:
        src, dst = workdir / f, dest / f
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:  # shutil refuses a FIFO (SpecialFileError) rather than hang on it
                shutil.copy2(src, dst)
                total += dst.stat().st_size
        except shutil.SpecialFileError:
            info.skipped[f] = "it is not a regular file (it changed during the copy)"
        except FileNotFoundError as exc:
            if str(exc.filename) != str(src):
                raise
            info.skipped[f] = "it vanished while the snapshot was taken"
        except PermissionError:
            unreadable.append(f)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise UserError(
                    f"no space left on device for the code snapshot in {dest} "
                    f"(copying {f}); free space, or set snapshot: false"
                ) from None
            why = exc.strerror
            raise UserError(f"{src}: cannot copy it into the code snapshot: {why}") from None
    if unreadable:
        more = f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else ""
        raise UserError(
            f"the code snapshot cannot read {len(unreadable)} file(s) in {workdir}: "
            f"{', '.join(unreadable[:5])}{more} (permission denied); make them readable, "
            "list them in .trebignore, or set snapshot: false"
        )
    return total


def take(workdir: Path, dest: Path, max_bytes: int) -> Snapshot:
    """Copy the workdir's files into `dest`; refuse above `max_bytes`, or when the disk
    has no room for them, before copying."""
    files, info = list_files(workdir)
    found = sizes(workdir, files, info)
    total = sum(found.values())
    if total > max_bytes:
        biggest = sorted(found, key=found.get, reverse=True)[:3]  # type: ignore[arg-type]
        raise UserError(
            f"snapshot of {workdir} would be {_size(total)}, over the "
            f"{_size(max_bytes)} limit (largest: {', '.join(biggest)}); exclude "
            "files in .trebignore, raise snapshot_max_size, or set snapshot: false"
        )
    free = shutil.disk_usage(dest.parent).free
    if total + ROOM > free:
        raise UserError(
            f"no room for the code snapshot of {workdir} ({_size(total)}): {_size(free)} free "
            f"on the disk of {dest.parent}; free space, or set snapshot: false"
        )
    info.bytes = copy_files(workdir, sorted(found), dest, info)
    info.path = str(dest)
    info.files = len(found) - sum(1 for f in found if f in info.skipped)
    return info


MISSING = re.compile(
    r"can't open file '([^']+)'|No such file or directory: '([^']+)'"
    r"|(?:^|: )([^\s:]+): No such file or directory"
)


def why_missing(run_dir: Path, lines: list[str]) -> str | None:
    """Why a file a failed run could not open is not in its code snapshot (for diagnose):
    left out as a special file, ignored by .gitignore or .trebignore, created after the
    submission, or absent from the workdir too. None when the run had no snapshot or the
    file is in it (then the snapshot is not the cause)."""
    snap = read_json(str(run_dir / "snapshot.json"))  # a rank's FIFO there: None
    try:
        code, source = Path(snap["path"]), Path(snap["source"])
    except (KeyError, TypeError):
        return None
    for line in lines:
        m = MISSING.search(line)
        if not m:
            continue
        name = Path(next(g for g in m.groups() if g))
        for root in (code, source):
            if name.is_absolute() and name.is_relative_to(root):
                name = name.relative_to(root)
        if name.is_absolute() or os.path.lexists(code / name):
            continue
        rel = str(name)
        why = (snap.get("skipped") or {}).get(rel)
        if why:
            return f"{rel} was left out of the code snapshot: {why}"
        venv = next((d for d in snap.get("venvs") or [] if _under(rel, [d])), None)
        if venv:
            return (f"{rel} is in the virtualenv {venv}/, which the code snapshot leaves out: "
                    f"name its python by absolute path ({source / venv}/bin/python), use "
                    "environment:, or set snapshot: false")  # fmt: skip
        if not os.path.lexists(source / name):
            return f"{rel} is not in the code snapshot, and not in the workdir {source} either"
        return f"{rel} is in the workdir but not in the code snapshot: {_left_out(source, rel)}"
    return None


def _left_out(source: Path, rel: str) -> str:
    """Which rule kept a workdir file out of the snapshot."""
    rule = _git(source, "check-ignore", "-v", "--no-index", "--", rel)
    if rule:  # "<file>:<line>:<pattern>\t<path>"
        where = rule.split("\t", 1)[0]
        return f"git ignores it ({where}); un-ignore it or set snapshot: false"
    trebignore = _ignore_spec(source / ".trebignore")
    if trebignore and trebignore.match_file(rel):
        return "it matches .trebignore; remove that pattern or set snapshot: false"
    gitignore = _ignore_spec(source / ".gitignore")
    if gitignore and gitignore.match_file(rel):
        return "it matches .gitignore; un-ignore it or set snapshot: false"
    return "it was created after the run was submitted (the snapshot is taken at submission)"


def earlier_run(workdir: Path) -> Path | None:
    """The run directory whose code snapshot `workdir` is (a rerun's spec points there)."""
    from trebuchet.store.paths import runs_dir

    rel = _inside(workdir, runs_dir())
    if rel is None or Path(rel).parts[1:] != ("code",):
        return None
    run = runs_dir() / Path(rel).parts[0]
    return run if (run / "snapshot.json").is_file() else None


def reuse(run: Path, dest: Path) -> tuple[Snapshot, str]:
    """An earlier run's snapshot copied as it is, with its facts (commit, dirty) and the
    workdir it came from: a rerun runs the same code, and its paths map to the same files;
    only the snapshot's own files (its manifest), not what the earlier run wrote there.
    (Taking it again would lose the git facts, and inside a repository that does not track
    TREB_HOME would leave every file out.)"""
    facts = read_json(str(run / "snapshot.json"))  # regular files only: a rank can reach it
    if not isinstance(facts, dict):
        raise UserError(f"{run / 'snapshot.json'}: unreadable, so its snapshot is not reused")
    known = read_json(str(run / MANIFEST))
    if isinstance(known, dict):  # the code only: not what the earlier run wrote there
        copy_files(run / "code", sorted(known), dest, Snapshot(path=""))
    else:  # a run from before the manifest
        shutil.copytree(run / "code", dest, symlinks=True)
    info = Snapshot(
        path=str(dest), files=facts.get("files", 0), bytes=facts.get("bytes", 0),
        git_commit=facts.get("git_commit"), git_dirty=facts.get("git_dirty"),
        untracked=facts.get("untracked") or [], skipped=facts.get("skipped") or {},
        venvs=facts.get("venvs") or [],
    )  # fmt: skip
    return info, str(facts.get("source") or run / "code")
