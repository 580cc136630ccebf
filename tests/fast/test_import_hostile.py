"""`treb import sbatch` given scripts written to leak or to confuse (issue 33): credentials
never reach the spec or the terminal, the script's stderr is shown as text, literal
arguments are never mistaken for the simulated allocation, and what surrounds the main
srun on its line (a timeout, a redirection, what runs after it) is carried or named."""

from __future__ import annotations

import base64
import re
import secrets
from pathlib import Path

import pytest
import yaml

from trebuchet.cli.main import main
from trebuchet.spec.load import load_spec

KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACDx0fakefakefakefakefakefakefakefakefakefakefakeAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)


def run(capsys, tmp_path: Path, body: str, header: str = "#SBATCH --nodes=1\n"):
    """(exit code, stdout, stderr) of importing a script with `body`."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + header + body)
    code = main(["import", "sbatch", str(script)])
    out = capsys.readouterr()
    return code, out.out, out.err


def loads(tmp_path: Path, out: str, environ: dict[str, str] | None = None):
    path = tmp_path / "job.yaml"
    path.write_text(out)
    return load_spec(path, environ=environ or {}).spec


# --- secrets ---------------------------------------------------------------------------


def test_a_key_read_by_the_script_is_withheld_and_named_with_its_line(capsys, tmp_path) -> None:
    # A name that does not say "key" (an id_ed25519 there is hidden from the sandbox): the
    # value itself is recognised.
    (tmp_path / "material.txt").write_text(KEY)
    code, out, err = run(
        capsys,
        tmp_path,
        'export RUN_TAG=$(base64 -w0 material.txt)\nsrun python train.py --tag "$RUN_TAG"\n',
    )
    assert code == 0, err
    encoded = base64.b64encode(KEY.encode()).decode()
    for piece in (encoded[:40], encoded[-40:], "BEGIN OPENSSH", "LS0tLS1CRUdJTi"):
        assert piece not in out and piece not in err
    spec = yaml.safe_load(out)
    assert "RUN_TAG" not in spec.get("env", {}) and spec["secrets"] == ["RUN_TAG"]
    assert spec["command"] == 'python train.py --tag "${RUN_TAG}"'
    assert re.search(
        r"job\.sh:3: .*RUN_TAG: withheld: its value looks like a credential \(.+\); "
        r"export it in the shell you submit from",
        err,
    ), err


def test_a_high_entropy_value_is_withheld_from_env_command_setup_and_stderr(
    capsys, tmp_path
) -> None:
    token = secrets.token_urlsafe(30)  # no known prefix: only its look gives it away
    code, out, err = run(
        capsys,
        tmp_path,
        f'export SESSION_BLOB={token}\necho "$SESSION_BLOB" >&2\n'
        f"srun --ntasks=1 python prep.py {token}\nsrun python train.py --s {token}\n",
    )
    assert code == 0, err
    assert token not in out and token not in err
    spec = yaml.safe_load(out)
    assert spec["secrets"] == ["SESSION_BLOB"] and "SESSION_BLOB" not in spec.get("env", {})
    assert spec["command"] == 'python train.py --s "${SESSION_BLOB}"'
    assert ":3: note: SESSION_BLOB: withheld: its value looks like a credential" in err


def test_a_credential_only_in_an_argument_is_withheld_under_a_name(capsys, tmp_path) -> None:
    token = "ghp_" + "Ab1" * 12
    code, out, err = run(capsys, tmp_path, f"srun python train.py --t {token}\n")
    assert code == 0, err
    assert token not in out and token not in err
    spec = yaml.safe_load(out)
    (name,) = spec["secrets"]
    assert spec["command"] == f'python train.py --t "${{{name}}}"'
    assert f"withheld: its value looks like a credential (a GitHub token); export {name}" in err


def test_a_password_in_the_importing_shell_is_never_read(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DB_PASS", "hunter2-correct-horse")
    monkeypatch.setenv("API_TOKEN_V2", "tok-v2-very-private")
    code, out, err = run(
        capsys,
        tmp_path,
        'echo "pass is $DB_PASS" >&2\nT2="${API_TOKEN_V2:0:6}-${API_TOKEN_V2:6}"\n'
        'U="${API_TOKEN_V2^^}"\nexport T2 U\nsrun python t.py --db "$DB_PASS" --t "$T2"\n',
    )
    assert code == 0, err
    for value in ("hunter2", "tok-v2", "TOK-V2"):
        assert value not in out and value not in err
    spec = yaml.safe_load(out)
    assert set(spec["secrets"]) >= {"DB_PASS", "T2", "U"}
    assert not set(spec.get("env", {})) & {"T2", "U", "DB_PASS"}
    assert spec["command"] == 'python t.py --db "${DB_PASS}" --t "${T2}"'
    assert "job.sh:4: note: T2: withheld: its value is made from a secret" in err


def test_a_slice_of_a_secret_in_an_argument_leaves_no_piece_of_the_marker(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        'srun python t.py --a "${HF_TOKEN:3:12}" --b "x${HF_TOKEN^^}y"\n',
    )
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert spec["command"].startswith('python t.py --a "${HF_TOKEN_PART_')
    assert "job.sh:3: note: ${HF_TOKEN:...: computed from a secret the import does not" in err
    words = re.findall(r"\$\{(\w+)\}", spec["command"])
    assert len(words) == 2 and all(w.startswith("HF_TOKEN") and w in spec["secrets"] for w in words)


def test_a_value_passed_from_the_shell_that_looks_like_a_credential_is_not_printed(
    capsys, tmp_path, monkeypatch
) -> None:
    token = "hf_" + "Zq9" * 10
    monkeypatch.setenv("RUN_NOTE", token)
    code, out, err = run(capsys, tmp_path, 'srun python t.py --note "$RUN_NOTE"\n')
    assert code == 0, err
    assert token not in out and token not in err
    spec = yaml.safe_load(out)
    assert spec["secrets"] == ["RUN_NOTE"] and spec["command"] == (
        'python t.py --note "${RUN_NOTE}"'
    )


# --- what the terminal is shown ---------------------------------------------------------


def test_the_scripts_stderr_is_shown_as_text(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        "printf '\\e]0;PWNED\\a\\e[2J\\rtreb import: fake\\n' >&2\nsrun python t.py\n",
    )
    assert code == 0, err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err
    assert "^[]0;PWNED^G^[[2J" in err
    assert all(line.startswith("treb import: ") for line in err.splitlines())


# --- markers never taken for the script's own text ---------------------------------------


def test_literal_arguments_are_not_rewritten_by_the_markers(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        "srun python t.py --seed 42424242 --host oracle-node-0 --ip 10.254.0.1 "
        "--job ${SLURM_JOB_ID} --me $(hostname)\n",
        "#SBATCH --nodes=2\n",
    )
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert spec["command"] == (
        "python t.py --seed 42424242 --host oracle-node-0 --ip 10.254.0.1 "
        '--job "${SLURM_JOB_ID}" --me "${MASTER_ADDR}"'
    )


# --- what surrounds the main srun ----------------------------------------------------------


def test_timeout_before_srun_is_carried_and_what_follows_is_named(capsys, tmp_path) -> None:
    code, out, err = run(capsys, tmp_path, "timeout 3600 srun python train.py; echo rc=$?\n")
    assert code == 0, err
    spec = loads(tmp_path, out)
    assert spec.command == "python train.py" and spec.launcher == "native"
    assert spec.timeout == 3600
    assert "job.sh:3: note: timeout 3600 before srun: the spec's timeout" in err
    assert "job.sh:3: not carried over: echo rc=$? (after the main srun)" in err


def test_a_redirection_of_srun_is_named(capsys, tmp_path) -> None:
    code, out, err = run(capsys, tmp_path, "srun python train.py >/dev/null 2>&1\n")
    assert code == 0, err
    spec = loads(tmp_path, out)
    assert spec.command == "python train.py" and spec.launcher == "native"
    assert re.search(r"job\.sh:3: not carried over: >/dev/null 2>&1 \(srun's output", err), err


@pytest.mark.parametrize("folder", ["", "$TMPDIR/"], ids=["script-folder", "scratch"])
def test_two_sruns_writing_logs_the_last_is_the_workload(folder, capsys, tmp_path) -> None:
    """In the script's folder this needs the sandbox that lets the script write there (the
    sandbox part of issue 33; until it lands, bash refuses the redirection and the srun
    never runs); in the sandbox's own scratch folder ($TMPDIR) it runs today."""
    code, out, err = run(
        capsys,
        tmp_path,
        f'srun python train.py > "{folder}train.log" 2>&1\nmkdir -p "{folder}logs"\n'
        f'srun python eval.py > "{folder}logs/out_${{SLURM_JOB_ID}}.txt"\n',
    )
    assert code == 0, err
    spec = loads(tmp_path, out)
    assert spec.command == "python eval.py" and spec.launcher == "native"
    assert spec.slurm.setup[0] == "srun python train.py"
    assert f'job.sh:3: not carried over: > "{folder}train.log" 2>&1 (the redirection of' in err
    assert f'job.sh:5: not carried over: > "{folder}logs/out_${{SLURM_JOB_ID}}.txt" (srun' in err


def test_a_script_that_stops_before_srun_shows_its_last_words_as_text(
    capsys, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("DB_PASS", "hunter2-correct-horse")
    code, out, err = run(
        capsys,
        tmp_path,
        "printf '\\e]0;PWNED\\a %s\\n' \"$DB_PASS\" >&2\nexit 3\nsrun python t.py\n",
    )
    assert code == 2
    assert "\x1b" not in err and "\x07" not in err and "hunter2" not in err
    assert "stopped (exit 3) before any srun: ^[]0;PWNED^G $DB_PASS" in err


def test_an_srun_that_did_not_run_is_named_when_the_script_becomes_the_command(
    capsys, tmp_path
) -> None:
    code, out, err = run(capsys, tmp_path, "echo start\nif false; then srun python a.py; fi\n")
    assert code == 0, err
    assert yaml.safe_load(out)["launcher"] == "none"
    assert "job.sh:4: note: srun did not run in the import sandbox" in err
    assert "no srun line" not in err


def test_an_srun_command_too_long_for_a_spec_is_refused_at_its_line(capsys, tmp_path) -> None:
    """A command past what one argument can hold (the spec's 100,000 characters) is named
    at the script's srun line, not at a temporary file of treb's own."""
    words = " ".join(f"w{i}" for i in range(20_000))
    code, out, err = run(capsys, tmp_path, f"srun python train.py {words}\n")
    assert code == 2 and not out
    assert "job.sh:3: what the script runs cannot be a spec: command:" in err
    assert "longer than 100000 characters" in err and "treb-import-render" not in err


def test_a_dollar_brace_in_sbatch_headers_stays_literal(capsys, tmp_path) -> None:
    """sbatch expands no variable in #SBATCH lines: `${` there is text, written `$${` in the
    spec so that treb's `${VAR}` expansion gives it back as it was (found by hypothesis:
    `--foo=${` made the imported spec unloadable)."""
    header = "#SBATCH --nodes=1\n#SBATCH --comment=${HOME}x\n#SBATCH --partition=a${b\n"
    code, out, err = run(capsys, tmp_path, "srun python train.py\n", header=header)
    assert code == 0, err
    spec = loads(tmp_path, out, environ={"HOME": "/nowhere"})
    assert spec.slurm.partition == "a${b"
    assert "--comment=${HOME}x" in spec.slurm.sbatch_args
