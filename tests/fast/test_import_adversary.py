"""`treb import sbatch` against a second adversary (issue 33): each case is the attacker's
batch script (or the name of its file), imported as root and as an unprivileged user
(`nobody`) where that matters, and asserts what the user observes: exit 0 or 2 with no
traceback, within a bound, no key injected into the spec, no host file touched."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fast.test_import_sandbox import _userns_for_nobody
from trebuchet.spec.load import load_spec

REPO = Path(__file__).resolve().parent.parent.parent
NOBODY = 65534
WHO = ["root", "nobody"]
LIMIT = 150  # seconds: the import's own 60 s bound, with room for a loaded machine


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not _userns_for_nobody(),
    reason="needs root, setpriv and unprivileged user namespaces",
)


@pytest.fixture(params=WHO)
def who(request) -> str:
    return request.param


@pytest.fixture
def box() -> Iterator[Path]:
    """A world-readable folder: src/ for the script, tmp/ for treb's scratch folders."""
    root = Path(tempfile.mkdtemp(prefix="treb-adversary-test-", dir="/tmp"))
    try:
        for d, mode in (("", 0o755), ("src", 0o755), ("tmp", 0o777), ("home", 0o777)):
            (root / d).mkdir(exist_ok=True)
            (root / d).chmod(mode)
        (root / "treb-home").mkdir(mode=0o700)
        os.chown(root / "treb-home", NOBODY, NOBODY)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _import(box: Path, script: Path, who: str, stdin=subprocess.DEVNULL, memory: int = 0):
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(box / "home"),
        "TMPDIR": str(box / "tmp"),
        "TREB_HOME": str(box / "treb-home"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
    }
    prefix = []
    if who == "nobody":
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

    def bound() -> None:
        if memory:  # treb's own process (the sandbox's unshare starts from it as well)
            resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))

    cmd = [*prefix, sys.executable, "-m", "trebuchet", "import", "sbatch", str(script)]
    done = subprocess.run(cmd, cwd=REPO, env=env, stdin=stdin, capture_output=True, text=True,
                          timeout=LIMIT, preexec_fn=bound)  # fmt: skip
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert list((box / "tmp").iterdir()) == []
    return done


def _script(box: Path, body: str, name: str = "attack.sbatch") -> Path:
    script = box / "src" / name
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n" + body)
    script.chmod(0o644)
    return script


def test_a_recorded_launcher_path_is_never_opened_unless_a_regular_file(box, who) -> None:
    """The host reads the first line of a recorded torchrun (its venv's python): a path the
    script chose (treb's own stdin, a terminal, a FIFO) must not block the import."""
    script = _script(
        box,
        "srun bash -c 'TREB_ORACLE_ARGV0=/proc/self/fd/0 torchrun --nproc_per_node 2 t.py'\n",
    )
    r, w = os.pipe()  # a stdin that never says anything and never ends
    try:
        done = _import(box, script, who, stdin=r)
    finally:
        os.close(r)
        os.close(w)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["launcher"] == "torchrun"


def test_sparse_files_in_the_record_folder_do_not_grow_treb(box) -> None:
    """A sparse file costs the sandbox's disk nothing but reads back as its whole length:
    40 of 60 MB each are 2.4 GB for treb to hold. What comes back out of the sandbox is
    bounded (treb here runs with 1.5 GB of data segment and must not run out of it)."""
    script = _script(
        box,
        "for i in $(seq 40); do mkdir -p /.treb/rec/x$i; truncate -s 60M /.treb/rec/x$i/argv\n"
        "truncate -s 60M /.treb/x$i; done\nsrun python t.py\n",
    )
    done = _import(box, script, "root", memory=1536 << 20)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["command"] == "python t.py"


@pytest.mark.parametrize("sep", ["\n", "\r", "\u2028", "\u0085"])
def test_the_scripts_file_name_injects_no_key_into_the_spec(box, sep: str) -> None:
    """The spec's first line names the file it came from: a name holding a line break must
    not become a line of YAML (`retries: 7` taking effect)."""
    script = _script(box, "srun python t.py\n", name=f"a{sep}retries: 7{sep}#.sbatch")
    done = _import(box, script, "root")
    assert done.returncode == 0, done.stderr
    saved = box / "job.yaml"
    saved.write_text(done.stdout)
    spec = load_spec(saved, environ={}).spec
    assert spec.retries == 0
    assert spec.command == "python t.py"


def test_a_long_block_around_the_main_srun_is_read_in_bounded_time(box) -> None:
    """The statement holding the main srun is found with bash -n on prefixes of the script:
    one per line of a 420-line if block after 900 KB made 420 runs of bash over 900 KB
    (over 2 minutes). The import stays within its bound and names what follows."""
    script = _script(
        box,
        ("# " + "x" * 1000 + "\n") * 900 + "if true; then\nsrun python t.py\n" + ":\n" * 420
        + "fi\n",
    )  # fmt: skip
    done = _import(box, script, "root")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["command"] == "python t.py"
    assert "after the main srun" in done.stderr


def test_many_calls_and_many_lines_after_the_main_srun_are_read_in_linear_time(box) -> None:
    """Each line after the main srun is named, and each note was looked up in the list of
    those already said (and in a set of recorded lines rebuilt for every line): 2,000
    recorded calls and 450,000 lines after `exit` held the import for over 10 minutes."""
    script = _script(
        box, "for i in $(seq 50); do mkdir -p d; done\nsrun python t.py\nexit 0\n"
        + "x\n" * 200_000,
    )  # fmt: skip
    done = _import(box, script, "root")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["command"] == "python t.py"


def test_a_password_in_a_url_from_the_importing_shell_is_withheld(box) -> None:
    """`$DATABASE_URL` is not a credential by its name, but `postgres://u:PASSWORD@host` is
    one by its look: the script reading it must not print the password in the spec or in
    the notes (it was printed in both)."""
    script = _script(box, 'srun python t.py --db "$DATABASE_URL"\n')
    env = dict(os.environ, DATABASE_URL="postgres://admin:Hunter2pass@db.internal/prod")
    done = subprocess.run(
        [sys.executable, "-m", "trebuchet", "import", "sbatch", str(script)], cwd=REPO,
        env={**env, "TMPDIR": str(box / "tmp"), "TREB_HOME": str(box / "treb-home"),
             "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Hunter2pass" not in done.stdout + done.stderr
    spec = yaml.safe_load(done.stdout)
    assert "DATABASE_URL" in spec["secrets"]
    assert spec["command"] == 'python t.py --db "${DATABASE_URL}"'
