"""The `treb import sbatch` sandbox against an attacker (issue 33): each escape is the
attacker's batch script, imported as root and as an unprivileged user (`nobody`), and each
asserts that nothing outside the sandbox changed (a sentinel file on the host, no new file
where the script wrote, a socket server that received nothing), that the import ended with
exit 0 or 2 and no traceback, and that the scratch folder is gone.

The host folder the attacker aims at is world-writable and its files world-readable: only
the sandbox stands between the script and them, also for `nobody`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent.parent
NOBODY = 65534
SECRET = "SENTINEL-SECRET-7f3a"
WHO = ["root", "nobody"]


def _userns_for_nobody() -> bool:
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "unshare",
         "--user", "--map-root-user", "--mount", "true"],
        capture_output=True, timeout=30,
    )  # fmt: skip
    return done.returncode == 0


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not _userns_for_nobody(),
    reason="needs root, setpriv and unprivileged user namespaces (to import as nobody too)",
)


@dataclass
class Box:
    """A world-readable playground: `src` holds the attacker's script (and what it ships),
    `host` is a world-writable folder outside it with a sentinel file, `home` a HOME with a
    private key, `tmp` the TMPDIR treb's scratch folders are made in."""

    root: Path
    src: Path
    host: Path
    home: Path
    tmp: Path
    who: str

    @property
    def sentinel(self) -> Path:
        return self.host / "sentinel"

    def untouched(self) -> None:
        """Nothing of the host changed: the sentinel as written, no new file beside it, and
        no scratch folder left behind."""
        assert self.sentinel.read_text() == "original\n"
        assert sorted(p.name for p in self.host.iterdir() if p.name != "sock") == ["sentinel"]
        assert list(self.tmp.iterdir()) == []

    def run(self, body: str, timeout: int = 90) -> subprocess.CompletedProcess[str]:
        """`treb import sbatch` of a script with `body` after its #SBATCH lines, as
        `self.who`; exit 0 or 2, no traceback."""
        script = self.src / "attack.sbatch"
        script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n" + body)
        script.chmod(0o644)
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "TREB_HOME": str(self.root / "treb-home"),
            "LANG": "C.UTF-8",
            "HOSTDIR": str(self.host),
            "API_TOKEN": SECRET,
        }
        prefix = []
        if self.who == "nobody":
            prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        cmd = [*prefix, sys.executable, "-m", "trebuchet", "import", "sbatch", str(script)]
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode in (0, 2), done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def spec(self, done: subprocess.CompletedProcess[str]) -> dict:
        assert done.returncode == 0, done.stderr
        return yaml.safe_load(done.stdout)


@pytest.fixture(params=WHO)
def box(request) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="treb-sandbox-test-", dir="/tmp"))
    try:
        b = Box(root, root / "src", root / "host", root / "home", root / "tmp", request.param)
        for d in (b.src, b.host, b.home, b.tmp, root / "treb-home"):
            d.mkdir()
        for d in (root, b.src):
            d.chmod(0o755)
        for d in (b.host, b.tmp, b.home):
            d.chmod(0o777)
        (root / "treb-home").chmod(0o700)
        if b.who == "nobody":
            os.chown(root / "treb-home", NOBODY, NOBODY)
        b.sentinel.write_text("original\n")
        b.sentinel.chmod(0o666)
        (b.home / ".ssh").mkdir()
        (b.home / ".ssh" / "id_ed25519").write_text(SECRET + "\n")
        for p in (b.home / ".ssh", b.home / ".ssh" / "id_ed25519"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        yield b
    finally:
        shutil.rmtree(root, ignore_errors=True)


def command_of(box: Box, done: subprocess.CompletedProcess[str]) -> str:
    return str(box.spec(done)["command"])


# ---- mounts: remount, bind, nested user namespaces, pivot_root, /proc/*/root -------------


def test_remount_rw_does_not_reach_the_host(box: Box) -> None:
    done = box.run(
        'command mount -o remount,bind,rw / ; command mount -o remount,rw "$HOSTDIR"\n'
        'command mount -o remount,bind,rw "$HOSTDIR"; command mount -o remount,rw /usr\n'
        'echo pwned > "$HOSTDIR/sentinel"; echo pwned > "$HOSTDIR/new"\n'
        "srun python probe.py\n"
    )
    assert command_of(box, done) == "python probe.py"
    box.untouched()


def test_bind_mounts_do_not_reach_the_host(box: Box) -> None:
    box.run(
        'm=${TMPDIR:-/tmp}/m; mkdir -p "$m"; command mount --bind / "$m"\n'
        'command mount -o remount,bind,rw "$m"; echo pwned > "$m$HOSTDIR/new"\n'
        'command mount --rbind /proc/1/root "$m"; echo pwned > "$m$HOSTDIR/new"\n'
        'command mount -t tmpfs x "$HOSTDIR"; command mount --bind /tmp "$HOSTDIR"\n'
        'echo pwned > "$HOSTDIR/new2"\n'
        "srun python probe.py\n"
    )
    box.untouched()


def test_a_nested_user_namespace_gets_no_way_out(box: Box) -> None:
    escape = (
        "mount -o remount,bind,rw /; mount -o remount,rw /usr; mount --bind / /mnt; "
        'mount -t proc proc /proc; echo pwned > \\"$HOSTDIR/new\\"; '
        "echo pwned > /proc/1/root$HOSTDIR/new"
    )
    box.run(
        f'unshare -Urm bash -c "{escape}"\n'
        f'unshare -Um bash -c "{escape}"\n'
        f'unshare -Ur unshare -Urm bash -c "{escape}"\n'
        f'unshare --user --map-current-user --mount --pid --fork bash -c "{escape}"\n'
        "srun python probe.py\n"
    )
    box.untouched()


def test_pivot_root_does_not_reach_the_host(box: Box) -> None:
    box.run(
        "mkdir -p /tmp/new/old; cd /tmp/new || exit 1\n"
        "command pivot_root . old; command pivot_root / /tmp\n"
        "unshare -Urm bash -c 'mount --bind /tmp/new /tmp/new; cd /tmp/new; pivot_root . old;"
        ' ls old; echo pwned > "old$HOSTDIR/new"\'\n'
        'cd /; echo pwned > "/old$HOSTDIR/new"\n'
        "srun python probe.py\n"
    )
    box.untouched()


def test_proc_root_links_do_not_reach_the_host(box: Box) -> None:
    done = box.run(
        'echo pwned > "/proc/self/root$HOSTDIR/new"; echo pwned > "/proc/1/root$HOSTDIR/new"\n'
        'for p in /proc/[0-9]*; do echo pwned > "$p/root$HOSTDIR/new"; done\n'
        'seen=$(cat "/proc/1/root$HOSTDIR/sentinel" /proc/1/environ 2>/dev/null | head -c 64)\n'
        'srun python probe.py "[$seen]"\n'
    )
    assert command_of(box, done) == "python probe.py '[]'"
    box.untouched()


# ---- the round trip: recorded values are data ------------------------------------------


def test_ld_preload_in_the_recorded_env_runs_nowhere(box: Box) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the attacker's evil.so")
    src = box.src / "evil.c"
    src.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void pwn(void) {\n"
        f'  FILE *f = fopen("{box.host}/preloaded", "a"); if (f) {{ fputs("x\\n", f); '
        "fclose(f); }\n}\n"
    )
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(box.src / "evil.so"), str(src)],
                   check=True, timeout=60)  # fmt: skip
    (box.src / "evil.so").chmod(0o755)
    done = box.run('export LD_PRELOAD=$SLURM_SUBMIT_DIR/evil.so\nsrun python probe.py "$HOME"\n')
    assert "LD_PRELOAD" in box.spec(done).get("env", {})  # carried as data, run by nothing here
    box.untouched()


def test_a_fake_bash_on_the_recorded_path_runs_nowhere(box: Box) -> None:
    fakebin = box.src / "fakebin"
    fakebin.mkdir()
    for name in ("bash", "unshare", "setpriv"):
        fake = fakebin / name
        fake.write_text(f'#!/bin/sh\necho pwned > "{box.host}/fake-{name}"\n')
        fake.chmod(0o755)
    fakebin.chmod(0o755)
    done = box.run(
        "export PATH=$SLURM_SUBMIT_DIR/fakebin:/usr/bin:/bin\n"
        'hash -p "$TREB_ORACLE_BIN/srun" srun\nsrun python probe.py\n'  # still recorded
    )
    assert box.spec(done)["env"]["PATH"] == f"{fakebin}:/usr/bin:/bin"  # data, run by nothing
    box.untouched()


# ---- what the script can see and reach -------------------------------------------------


def test_a_host_unix_socket_is_unreachable(box: Box) -> None:
    """One in a host folder, one in the script's own folder (seen through the copy-on-write
    view: a socket there is not the host's)."""
    got: list[bytes] = []
    stop = threading.Event()
    servers = []
    for path in (box.host / "sock", box.src / "sock"):
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(4)
        server.settimeout(0.2)
        servers.append(server)

    def serve(server: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            got.append(conn.recv(100) or b"(connected)")
            conn.close()

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        box.run(
            'P=/usr/bin/python3\nfor s in "$HOSTDIR/sock" sock; do "$P" -c "import socket,sys;'
            " s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.send(b'pwned')\""
            ' "$s" 2>/dev/null; done\nsrun python probe.py\n'
        )
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for server in servers:
            server.close()
    assert got == []
    box.untouched()


def test_no_terminal_and_a_minimal_dev(box: Box) -> None:
    done = box.run(
        "seen=$(ls /dev | tr '\\n' ' ')\n"
        'read -r -t 1 answer </dev/tty 2>/dev/null && seen+=" tty:$answer"\n'
        'srun python probe.py "$seen"\n'
    )
    words = command_of(box, done).split("'")[1].split()
    assert "tty" not in words and not any(w.startswith(("tty", "sd", "vd", "nvme", "pts"))
                                          for w in words), words  # fmt: skip
    assert set(words) <= {"fd", "null", "shm", "stderr", "stdin", "stdout", "urandom", "zero"}


def test_the_users_files_and_host_secrets_are_not_there(box: Box) -> None:
    done = box.run(
        'seen=$(cat ~/.ssh/* "$HOME"/.ssh/id_ed25519 /etc/shadow /etc/gshadow '
        "/etc/munge/munge.key /etc/ssh/ssh_host_* /root/.ssh/* /root/.bash_history "
        f"{box.home}/.ssh/id_ed25519 2>/dev/null | head -c 200)\n"
        "ls /home /root /work /opt >/dev/null 2>&1 && seen+=listed\n"
        'srun python probe.py "[$seen]" "$(printenv | grep -c TOKEN)"\n'
    )
    assert command_of(box, done) == "python probe.py '[]' 0"
    assert SECRET not in done.stdout + done.stderr
    box.untouched()


def test_a_script_next_to_the_dotfiles_of_home_does_not_see_them(box: Box) -> None:
    box.src = box.home  # the script lives in HOME itself
    done = box.run('seen=$(cat .ssh/id_ed25519 ~/.ssh/id_ed25519 2>/dev/null)\n'
                   'srun python probe.py "[$seen]"\n')  # fmt: skip
    assert command_of(box, done) == "python probe.py '[]'"


def test_credential_files_in_the_scripts_folder_are_not_there(box: Box) -> None:
    """A token in a .env beside the script, read and encoded (xxd) so that no credential
    pattern knows it: the file is absent from the sandbox, `source .env` kept as a setup
    line, and each hidden file is named (the adversary's case, issue 33)."""
    (box.src / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (box.src / "conf").mkdir()
    (box.src / "conf" / "id_rsa").write_text(SECRET + "\n")
    (box.src / "tokenizer.json").write_text("kept\n")
    for p in (box.src / ".env", box.src / "conf" / "id_rsa", box.src / "tokenizer.json"):
        p.chmod(0o644)
    (box.src / "conf").chmod(0o755)
    done = box.run(
        "source .env\n"
        "T=$(cat .env conf/id_rsa 2>/dev/null | xxd -p | tr -d '\\n')\n"
        'srun python probe.py "[$T]" "$(cat tokenizer.json)"\n'
    )
    spec = box.spec(done)
    assert spec["command"] == "python probe.py '[]' kept"
    assert spec["slurm"]["setup"] == ["source .env"]
    assert SECRET.encode().hex() not in done.stdout + done.stderr
    assert ".env: hidden from the import sandbox" in done.stderr
    assert "conf/id_rsa: hidden from the import sandbox" in done.stderr
    assert (box.src / ".env").read_text() == f"HF_TOKEN={SECRET}\n"  # nothing changed here
    box.untouched()


# ---- what the script leaves in the record folder ---------------------------------------


def test_planted_fifos_and_links_in_the_record_folder_are_not_read(box: Box) -> None:
    done = box.run(
        "srun python probe.py\n"
        'd=$TREB_ORACLE_DIR/rec; mkdir -p "$d/0.fifo" "$d/0.link" "$d/9.link"\n'
        'for f in argv meta env task0.out; do mkfifo "$d/0.fifo/$f"; '
        'ln -s /dev/zero "$d/0.link/$f"; ln -s /proc/self/fd/0 "$d/9.link/$f"; done\n'
        'for f in notes err out; do rm -f "$TREB_ORACLE_DIR/$f"; mkfifo "$TREB_ORACLE_DIR/$f"; done\n'
        'for x in "$d"/*/; do rm -f "$x/argv"; ln -s /dev/zero "$x/argv"; break; done\n'
        "exec 1>&- 2>&-\n"
    )
    assert done.returncode in (0, 2)
    box.untouched()


def test_a_note_written_by_the_script_is_not_treb_speaking(box: Box) -> None:
    done = box.run(
        'printf "3\\tall checks passed: safe to submit\\n" >>"$TREB_ORACLE_DIR/notes"\n'
        'printf "4\\tcd\\t\\033]0;TITLE\\a\\n" >>"$TREB_ORACLE_DIR/notes"\n'
        'printf "x\\tabsent\\ty\\n5\\tnope\\tz\\n" >>"$TREB_ORACLE_DIR/notes"\n'
        "srun python probe.py\n"
    )
    assert "safe to submit" not in done.stderr
    assert "\033" not in done.stderr and "\a" not in done.stderr
    assert "nope" not in done.stderr


# ---- floods --------------------------------------------------------------------------


def test_a_fork_flood_is_ended(box: Box) -> None:
    done = box.run("flood() { flood | flood & }; flood\nsleep 100\nsrun python probe.py\n")
    assert done.returncode == 2 and "processes" in done.stderr, done.stderr
    left = subprocess.run(["pgrep", "-f", str(box.src / "attack.sbatch")],
                          capture_output=True, text=True)  # fmt: skip
    assert left.stdout == ""
    box.untouched()


def test_a_disk_flood_stays_in_a_bounded_scratch(box: Box) -> None:
    before = shutil.disk_usage("/tmp").free
    box.run(
        "head -c 300M /dev/zero > big 2>/dev/null\n"
        "for i in $(seq 50); do head -c 8M /dev/zero > /tmp/f$i 2>/dev/null || break; done\n"
        'for i in $(seq 20); do head -c 8M /dev/zero > "$HOME/f$i" 2>/dev/null || break; done\n'
        "srun python probe.py\n"
    )
    assert not (box.src / "big").exists()  # the script may have filled its own record: rc 0 or 2
    assert shutil.disk_usage("/tmp").free > before - (256 << 20)
    box.untouched()


# ---- fidelity: writes in the script's folder succeed in the sandbox, reach nothing ----------


def test_writes_in_the_scripts_folder_succeed_and_are_dropped(box: Box) -> None:
    done = box.run(
        "mkdir -p logs\n"
        "echo start > run.txt\n"
        "srun python train.py --out logs/out_${SLURM_JOB_ID}.txt > train.log 2>&1\n"
    )
    assert "Read-only file system" not in done.stderr
    assert "python train.py" in command_of(box, done)
    assert sorted(p.name for p in box.src.iterdir()) == ["attack.sbatch"]
    box.untouched()


def test_env_wrappers_record_the_program_they_start(box: Box) -> None:
    done = box.run(
        "env FOO=1 /usr/bin/python3 -c 'print(1)'\n"
        "nice -n 5 nohup /usr/bin/python3 prep.py\n"
        "srun python train.py\n"
    )
    assert box.spec(done)["slurm"]["setup"] == [
        "/usr/bin/python3 -c 'print(1)'",
        "/usr/bin/python3 prep.py",
    ]


def test_deeply_nested_substitutions_are_refused_by_name(box: Box) -> None:
    done = box.run("x=" + "$(" * 20_000 + "echo" + ")" * 20_000 + "\nsrun python probe.py\n")
    assert done.returncode == 2
    assert "attack.sbatch:3: more than 256 nested" in done.stderr


def test_bash_ended_by_a_signal_is_a_named_error(box: Box) -> None:
    done = box.run("srun python probe.py\nkill -SEGV $$\n")
    assert done.returncode == 2
    assert "attack.sbatch: the script (bash, or the last command it ran) ended by SIGSEGV" in (
        done.stderr
    )


# ---- any script body: exit 0 or 2, never a traceback or a hang ------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.text(max_size=300))
@example(body="\u00a0")  # once exit 1: spec validation took bash's word U+00A0 for blank
@example(body="\r")  # once exit 1: the importer split lines where bash does not
@example(body="\x85")  # once exit 1: YAML folded the command's raw U+0085 into ' '
def test_any_script_body_imports_or_is_refused_by_name(body: str) -> None:
    with tempfile.TemporaryDirectory(prefix="treb-sandbox-prop-") as tmp:
        script = Path(tmp) / "any.sbatch"
        script.write_bytes(
            ("#!/bin/bash\n#SBATCH --nodes=1\n" + body).encode("utf-8", "surrogatepass")
        )
        done = subprocess.run(
            [sys.executable, "-m", "trebuchet", "import", "sbatch", str(script)],
            cwd=REPO, capture_output=True, text=True, timeout=90,
            env={**os.environ, "TMPDIR": tmp},
        )  # fmt: skip
        assert done.returncode in (0, 2), done.stderr
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["any.sbatch"]


# ---- held: signals to everything, runaway scripts -------------------------------------------


def test_kill_all_reaches_only_the_sandbox(box: Box) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        done = box.run("kill -9 -1; kill -9 1; kill -STOP -1\nsrun python probe.py\n")
        assert sleeper.poll() is None  # a process of the importing user, outside: alive
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode in (0, 2)
    box.untouched()


def test_a_runaway_script_is_ended_with_nothing_left(monkeypatch, tmp_path) -> None:
    from trebuchet.errors import UserError
    from trebuchet.importers import oracle

    monkeypatch.setattr(oracle, "TIMEOUT_S", 3)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # TMPDIR read again
    marker = f"runaway-{os.getpid()}"
    script = tmp_path / f"{marker}.sbatch"
    script.write_text(f"#!/bin/bash\n(exec -a {marker} sleep 300) &\nwhile :; do :; done\n")
    env = oracle.allocation_env(1, 1, 0, str(tmp_path), "x")
    try:
        with pytest.raises(UserError, match="did not finish within 3 s"):
            oracle.record(script, str(tmp_path), env, {}, ["0:0:0"])
    finally:
        tempfile.tempdir = None
    # Killed with the sandbox's PID namespace (its init's death SIGKILLs the rest); the
    # kernel ends them asynchronously, which on a loaded machine takes a moment.
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
        if left.stdout == "" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [script.name]


@pytest.mark.parametrize("folder", ["/tmp", "/etc/ssh", "/dev/shm"])
def test_a_script_in_a_shared_or_system_folder_is_refused(folder, capsys) -> None:
    from trebuchet.cli.main import main

    fd, name = tempfile.mkstemp(suffix=".sbatch", dir=folder)
    try:
        os.write(fd, b"#!/bin/bash\nsrun python probe.py\n")
        os.close(fd)
        assert main(["import", "sbatch", name]) == 2
        err = capsys.readouterr().err
        assert f"{name}: the import sandbox shows the script's folder ({folder})" in err
    finally:
        os.unlink(name)
