"""Property-based tests of the importers' readers (issue 33): whatever text or bytes they are
given, they return a spec that loads or raise a UserError that names the file; never
another exception. Secret detection and masking, and run names, hold for any text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trebuchet.cli.import_cmd import check_loads, refuse_unholdable
from trebuchet.errors import UserError
from trebuchet.importers import common, importer, sbatch
from trebuchet.importers.common import ImportResult, as_text, credential_spans

SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# A bash sandbox per example: few of them.
SANDBOX = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

PIECES = ["\x1b[2J", "\x1b]0;t\x07", "\u2028", "\x00", "\r", "\n", "'", '"', "$(", "${", "`",
          "\\", "=", "--", "-N", ":", "#", " "]  # fmt: skip
hostile_text = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(PIECES)), max_size=12).map(
    "".join
)  # any code point (lone surrogates too), and what shells and terminals act on
option_words = st.lists(
    st.one_of(
        hostile_text,
        st.sampled_from(["--nodes", "--nodes=2", "-N", "-N2", "--exclusive", "--gres=gpu:8",
                         "-t", "01:00:00", "--", "-", "--=", "-=", "--time="]),
    ),
    max_size=12,
)  # fmt: skip


@SETTINGS
@given(option_words, st.booleans())
def test_parse_options_reads_any_words(tokens: list[str], stop: bool) -> None:
    opts, rest = sbatch.parse_options(tokens, stop_at_program=stop)
    assert 0 <= rest <= len(tokens)
    for name, value, index in opts:
        assert 0 <= index < len(tokens) and isinstance(name, str)
        assert value is None or isinstance(value, str)


@SETTINGS
@given(st.lists(hostile_text, max_size=6))
def test_sbatch_headers_read_any_text(headers: list[str]) -> None:
    text = "#!/bin/bash\n" + "".join(f"#SBATCH {h}\n" for h in headers) + "srun python t.py\n"
    res = ImportResult("sbatch", "job.sh")
    st_ = sbatch._Script(Path("job.sh"), res)
    sbatch._headers(text, len(headers) + 2, st_)
    sbatch._allocation(st_)  # what the sandbox would be given: always numbers
    for line in res.messages():
        assert as_text(line) == line  # nothing a terminal would act on


@SANDBOX
@given(st.lists(hostile_text, max_size=4))
def test_any_sbatch_header_imports_to_a_spec_or_a_named_error(tmp_path, headers) -> None:
    lines = [h.replace("\n", " ").replace("\r", " ").replace("\u2028", " ") for h in headers]
    script = tmp_path / "job.sh"
    body = "#!/bin/bash\n" + "".join(f"#SBATCH {h}\n" for h in lines) + "srun python t.py\n"
    script.write_bytes(body.encode("utf-8", "surrogatepass"))
    _import_or_named_error("sbatch", script)


def _import_or_named_error(kind: str, path: Path, **options: object) -> None:
    try:
        res = importer(kind).import_file(path, **options)
    except UserError as exc:
        assert str(path) in str(exc) or "line" in str(exc), str(exc)
        return
    try:
        refuse_unholdable(res)  # what `treb import` checks before printing: exit 2, named
    except UserError as exc:
        assert str(path) in str(exc)
        return
    check_loads(res.to_yaml())  # a spec that loads (a TrebError here is an importer's bug)
    for line in res.messages():
        assert as_text(line) == line


KEYS = {
    "air": ["command", "compute", "environment", "env_variables", "secrets", "code_source",
            "experiment_name", "name", "timeout_minutes", "max_retries", "num_accelerators",
            "accelerator_type", "dependencies", "requirements", "root_path", "launcher"],
    "madengine": ["name", "tags", "scripts", "args", "n_gpus", "timeout", "distributed",
                  "nnodes", "launcher", "conda_env", "python_version", "requirements_file",
                  "setup_script", "multiple_results", "environment", "models"],
    "nemo": ["slurm", "skypilot", "recipe", "nodes", "gpus_per_node", "job_name", "time",
             "account", "partition", "container_image", "env_vars", "extra_mounts", "hf_home",
             "num_nodes", "accelerators", "cloud", "use_spot", "setup", "nsys_enabled",
             "master_port", "ntasks_per_node", "_target_"],
    "determined": ["entrypoint", "resources", "slots_per_trial", "environment",
                   "environment_variables", "image", "max_restarts", "optimizations", "name",
                   "launcher", "native_parallel", "auto_tune_tensor_fusion"],
}  # fmt: skip
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), hostile_text
)


def documents(kind: str) -> st.SearchStrategy:
    keys = st.one_of(st.sampled_from(KEYS[kind]), hostile_text)
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=6)
        ),
        max_leaves=20,
    )


def _dump(doc: object) -> bytes:
    try:
        return yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, ValueError):
        return json.dumps(doc, default=str).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("kind", sorted(KEYS))
@settings(SETTINGS, max_examples=80)
@given(data=st.data())
def test_structured_importers_read_any_document(kind: str, data, tmp_path) -> None:
    raw = data.draw(
        st.one_of(
            documents(kind).map(_dump),
            st.binary(max_size=200),
            hostile_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        )
    )
    path = tmp_path / ("card.json" if kind == "madengine" else "job.yaml")
    path.write_bytes(raw)
    options: dict[str, object] = {"tags": data.draw(st.lists(hostile_text, max_size=2))}
    if kind == "nemo":
        options = {"recipe": data.draw(st.one_of(st.none(), hostile_text))}
    _import_or_named_error(kind, path, **options)


@SETTINGS
@given(hostile_text, st.one_of(st.none(), hostile_text))
def test_is_secret_answers_for_any_name_and_value(name: str, value: str | None) -> None:
    assert isinstance(common.is_secret(name, value), bool)


@SETTINGS
@given(st.lists(st.one_of(hostile_text, st.sampled_from([
    "hf_" + "aB3" * 8, "ghp_" + "Zz9" * 8, "sk-" + "Qw7" * 8, "AKIA" + "ABCDEFGH12345678",
    "-----BEGIN RSA PRIVATE KEY-----", "LS0tLS1CRUdJTiBPUEVOU1NI", "eyJhbGciOi.eyJzdWIiOi.x",
    "0123456789abcdef" * 3, "tR7xQ2pL9vZ4kW8mN3bF6yH1"]))), hostile_text)  # fmt: skip
def test_redact_leaves_no_credential_and_no_secret_value(parts: list[str], value: str) -> None:
    text = " ".join(parts) + " " + value
    res = ImportResult("x", "x")
    if len(value) >= 4 and "$" not in value:
        res.add_secret("SOME_TOKEN", value)
    out = res.redact(text)
    assert credential_spans(out) == []
    if len(value) >= 4 and "$" not in value and "***" not in value:
        assert value not in out


@SETTINGS
@given(hostile_text)
def test_to_name_is_always_a_valid_run_name(text: str) -> None:
    name = common.to_name(text)
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) and len(name) <= 63


@SETTINGS
@given(hostile_text)
def test_as_text_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    shown = as_text(text)
    assert not re.search(r"[\x00-\x08\x0a-\x1f\x7f\x80-\x9f]", shown)
    shown.encode("utf-8")  # printable on a UTF-8 terminal: no lone surrogate


@SETTINGS
@given(st.lists(st.one_of(hostile_text, st.sampled_from(
    ["srun", "timeout", "3600", ">", "2>&1", "<<EOF", "EOF", "|", ";", "&&", "&", "$(", ")",
     "(", "${", "}", '"', "'", "`", "\\\n", "\n", "#", " "])), max_size=30).map(" ".join))  # fmt: skip
def test_the_statement_reader_reads_any_text(text: str) -> None:
    from trebuchet.importers.statement import command_word, split

    for s in split(text):
        assert 0 <= s.at <= len(text) and (s.words or s.redirects)
        at, wrappers = command_word(s)
        assert 0 <= at <= len(s.words) and len(wrappers) <= at


@pytest.mark.parametrize(
    "kind,text",
    [("determined", 'entrypoint: "python t.py\\0"\n'), ("air", 'command: "a\\ud800"\n')],
)
def test_text_no_command_line_can_hold_is_a_named_error(kind, text, capsys, tmp_path) -> None:
    from trebuchet.cli.main import main

    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["import", kind, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: command: " in err and "a bug in treb import" not in err


@SETTINGS
@given(st.binary(min_size=5, max_size=5), st.integers(0, 4095), st.integers(10**8, 10**9 - 1))
def test_the_simulated_allocation_never_looks_like_a_credential(token, node, job) -> None:
    """The notes name what was computed from the simulated nodes (MASTER_ADDR=node...-0):
    masking one as a credential, for some draws of the random names, hid what they say."""
    host = f"node{token.hex()}-{node}"
    for name in ("MASTER_ADDR", "SLURMD_NODENAME", "NCCL_SOCKET_IFNAME_LONGER_NAME"):
        for text in (f"{name}={host}", f"{name}={job}", f"--{name.lower()}={host}:{job}"):
            assert credential_spans(text) == [], text
