"""MLflow's REST API with urllib: mlflow itself is hundreds of MB, seconds of imports, and
absent on the nodes.

A client has a deadline for all its requests together (`budget`): a socket timeout bounds
neither a server that trickles its answer nor a name lookup, so each request runs in a
daemon thread waited for until the deadline and then abandoned. Callers turn MlflowError
into a warning and an event, never a failed run. Credentials come from the environment
only, as mlflow reads them, and are never written.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence, Tuple

TIMEOUT_S = 5.0  # a client's default budget: all its requests together
# runs/log-batch limits of the server (MLflow's REST API documentation)
MAX_PARAMS, MAX_TAGS, MAX_ITEMS = 100, 100, 1000
MAX_PARAM_VALUE, MAX_TAG_VALUE = 6000, 8000
# trebuchet's states as MLflow run statuses
STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "TIMEOUT": "FAILED", "LOST": "FAILED",
          "CANCELLED": "KILLED"}  # fmt: skip
Pairs = Sequence[Tuple[str, str]]


class MlflowError(Exception):
    def __init__(self, text: str, unreachable: bool = False, status: int | None = None) -> None:
        super().__init__(text)
        self.unreachable = unreachable
        self.status = status

    @property
    def lasting(self) -> bool:
        """4xx but 429: sending it again would get the same answer."""
        return self.status is not None and 400 <= self.status < 500 and self.status != 429


def usable_uri(uri: str) -> bool:
    """Only a tracking server speaks REST; a file store or sqlite URI needs mlflow itself."""
    import urllib.parse  # here: `treb run` without a tracker never pays for it

    return urllib.parse.urlparse(uri).scheme in ("http", "https")


def now_ms() -> int:
    return int(time.time() * 1000)


class Mlflow:
    def __init__(
        self, uri: str, environ: Mapping[str, str] = os.environ, timeout: float = TIMEOUT_S,
        budget: float | None = None,
    ) -> None:  # fmt: skip
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self.budget = timeout if budget is None else budget
        self.deadline = time.monotonic() + self.budget
        self.headers = {"Content-Type": "application/json"}
        token = environ.get("MLFLOW_TRACKING_TOKEN")
        user = environ.get("MLFLOW_TRACKING_USERNAME")
        password = environ.get("MLFLOW_TRACKING_PASSWORD")
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif user and password:
            import base64

            pair = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {pair}"
        self.insecure = environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None,
        data: bytes | None = None, headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        import threading  # here: `treb run` without a tracker never pays for it

        left = self.left()
        if left <= 0:
            raise MlflowError(
                f"{self.uri} did not answer within {self.budget:g} s (all requests together)",
                True,
            )
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["answer"] = self._request(method, path, body, data, headers, left)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc

        worker = threading.Thread(target=work, name="treb-mlflow", daemon=True)
        worker.start()
        worker.join(left)  # Ctrl+C interrupts this wait in the main thread
        if worker.is_alive():  # a server that trickles, a name lookup that hangs: left behind
            self.deadline = time.monotonic()  # and nothing more is asked by this client
            raise MlflowError(
                f"{self.uri} did not answer within {self.budget:g} s ({method} {path} "
                "was still going)",
                True,
            )
        if "error" in box:
            raise box["error"]
        answer: dict[str, Any] = box["answer"]
        return answer

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, data: bytes | None,
        headers: dict[str, str] | None, left: float,
    ) -> dict[str, Any]:  # fmt: skip
        import urllib.error  # here: `treb run` without a tracker never pays for them
        import urllib.request

        context = None
        if self.insecure:
            import ssl

            context = ssl._create_unverified_context()
        url = self.uri + path
        if body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        for k, v in {**self.headers, **(headers or {})}.items():
            req.add_header(k, v)
        try:
            timeout = max(0.05, min(self.timeout, left))
            with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
                text = r.read().decode() or "{}"
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("message", detail)
            text = f"{method} {path}: HTTP {exc.code}: {detail}"
            raise MlflowError(text, False, exc.code) from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
            reason = getattr(exc, "reason", exc)
            raise MlflowError(f"{self.uri} did not answer ({reason})", True) from None
        try:
            answer: dict[str, Any] = json.loads(text)  # MLflow answers a JSON object
            return answer
        except ValueError:
            raise MlflowError(f"{method} {path}: not JSON: {text[:100]!r}") from None

    def api(self, method: str, endpoint: str, body: dict[str, Any] | None = None,
            query: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
        import urllib.parse

        path = "/api/2.0/mlflow/" + endpoint
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self.request(method, path, body)

    def experiment_id(self, name: str) -> str:
        try:
            got = self.api("GET", "experiments/get-by-name", query={"experiment_name": name})
            return str(got["experiment"]["experiment_id"])
        except MlflowError as exc:
            if "HTTP 404" not in str(exc) and "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        try:
            return str(self.api("POST", "experiments/create", {"name": name})["experiment_id"])
        except MlflowError as exc:  # created meanwhile by another submission
            if "RESOURCE_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                raise
            got = self.api("GET", "experiments/get-by-name", query={"experiment_name": name})
            return str(got["experiment"]["experiment_id"])

    def create_run(self, experiment_id: str, name: str, tags: Pairs) -> dict[str, Any]:
        body = {
            "experiment_id": experiment_id,
            "run_name": name,
            "start_time": now_ms(),
            "tags": [{"key": k, "value": _cut(v, MAX_TAG_VALUE)} for k, v in tags],
        }
        info: dict[str, Any] = self.api("POST", "runs/create", body)["run"]["info"]
        return info

    def log_batch(
        self, run_id: str, params: Pairs = (), tags: Pairs = (),
        metrics: Sequence[dict[str, Any]] = (), sent: Callable[[int], None] | None = None,
    ) -> None:  # fmt: skip
        """`sent(n)` after each call that carried n metrics: the caller keeps how far it got."""
        ps = [{"key": k, "value": _cut(v, MAX_PARAM_VALUE)} for k, v in params]
        ts = [{"key": k, "value": _cut(v, MAX_TAG_VALUE)} for k, v in tags]
        ms = list(metrics)
        while ps or ts or ms:
            p, ps = ps[:MAX_PARAMS], ps[MAX_PARAMS:]
            t, ts = ts[:MAX_TAGS], ts[MAX_TAGS:]
            room = MAX_ITEMS - len(p) - len(t)
            m, ms = ms[:room], ms[room:]
            self.api("POST", "runs/log-batch", {"run_id": run_id, "params": p, "tags": t,
                                                "metrics": m})  # fmt: skip
            if sent is not None and m:
                sent(len(m))

    def terminate(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        self.api("POST", "runs/update", {"run_id": run_id, "status": status,
                                         "end_time": end_ms or now_ms()})  # fmt: skip

    def upload(self, artifact_uri: str, name: str, data: bytes) -> None:
        """Through the server when it proxies artifacts, or in place at a local path it uses."""
        import urllib.parse

        parsed = urllib.parse.urlparse(artifact_uri)
        if parsed.scheme == "mlflow-artifacts":
            path = urllib.parse.quote(f"{parsed.path.strip('/')}/{name}")
            self.request("PUT", f"/api/2.0/mlflow-artifacts/artifacts/{path}", data=data,
                         headers={"Content-Type": "application/octet-stream"})  # fmt: skip
            return
        if parsed.scheme in ("", "file"):
            folder = os.path.join(parsed.path, os.path.dirname(name))
            try:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(parsed.path, name), "wb") as fh:
                    fh.write(data)
            except OSError as exc:
                raise MlflowError(f"artifact {name}: {exc}") from None
            return
        raise MlflowError(
            f"artifact {name}: the artifact store {parsed.scheme}: needs the mlflow client "
            "(start the server with --serve-artifacts to upload through it)"
        )


def _cut(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def metric(key: str, value: float, step: int, ms: int) -> dict[str, Any]:
    return {"key": key, "value": value, "step": step, "timestamp": ms}
