"""Metric logging behind a small protocol (training code never imports mlflow): ``NullLogger`` for
tests and non-zero ranks, ``MlflowLogger`` for a run, with a journal of what a store that does not
answer missed. The pipeline's runs themselves (experiments, parents, children) are ``mlflow_runs.py``'s.

``MlflowLogger`` writes to one run by id through ``MlflowClient`` (MLflow's active run is per thread;
explicit ids work from any thread or subprocess). ``NullLogger`` is for tests and non-zero ranks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol


def metric_name(key: str) -> str:
    """MLflow allows only [A-Za-z0-9_ ./:-] in names: ``maj@8`` is logged as ``maj_at_8``, any other
    character as ``_`` (``rule+prm`` as ``rule_prm``)."""
    return re.sub(r"[^A-Za-z0-9_ ./:-]", "_", key.replace("@", "_at_"))


class MetricLogger(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None: ...
    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None: ...
    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None: ...


class NullLogger:
    """Records nothing (but keeps the last metrics, which tests can inspect)."""

    def __init__(self) -> None:
        self.history: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.history.append((step, dict(metrics)))

    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None: ...
    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None: ...
    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None: ...


def stage_prefix(stage: str | None) -> str:
    """What a stage's MLflow metric names start with, so that the experiment's charts never mix
    stages (``orm/heldout/auc``, ``sft/train/loss``): the stage, except for GRPO, whose metrics keep
    the names the field expects (``train/reward_mean``, ``train/kl``, ...: the only unprefixed ones)."""
    return "" if stage in (None, "grpo") else f"{stage}/"


# Tracking-store errors that mean "not now" (a server that stopped answering, a busy database), as
# opposed to a request the store refuses (a changed param value), which still raises.
OUTAGE_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "ENDPOINT_NOT_FOUND"}
UNSENT = "mlflow-unsent"  # under a run folder: what the tracking store did not take, per MLflow run
UNSENT_ENV = "GRPO_MLFLOW_UNSENT"  # that folder, for a launched stage process
STORE = "tracking_uri"  # in that folder: the store its records are for (``grpo-pipeline sync``)
RETRY_S = 30.0  # how often a logger looks at a store that stopped answering
DOWN: dict[str, float] = {}  # tracking URI -> when to look at it again (a store that stopped answering)
log = logging.getLogger("grpo_pipeline.tracking")


def unsent_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / UNSENT


def is_outage(error: BaseException) -> bool:
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        return error.error_code in OUTAGE_CODES
    return isinstance(error, OSError) or type(error).__module__.startswith(("requests", "urllib3", "sqlalchemy"))


class Journal:
    """Records (JSON objects) the tracking store did not take, one per line, in order, in ``path``.
    Appended and sent under an exclusive ``flock`` on ``<path>.lock``, so the flow and a stage process
    can share one; after a send, what is left replaces the file atomically. A record the store
    refuses (not an outage: its run deleted, say) moves to ``<run>.refused.jsonl``, named in a
    warning, so that it never blocks the ones after it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = path.with_name(path.name + ".lock")

    def __len__(self) -> int:
        return len(self._lines()) if self.path.exists() else 0

    def pending(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    @contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _lines(self) -> list[str]:
        return [line for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def append(self, record: dict) -> None:
        line = (json.dumps(record, default=str) + "\n").encode()
        with self._locked(), open(self.path, "a+b") as f:
            if f.tell():  # a crash mid-append left a torn line: never glue a whole record to it
                f.seek(-1, os.SEEK_END)
                line = line if f.read(1) == b"\n" else b"\n" + line
            f.write(line)  # one write
            f.flush()
            os.fsync(f.fileno())

    def send(self, send_one: Callable[[dict], None]) -> int:
        """``send_one`` the records in order (consecutive metric records as one, ``batches``); returns
        how many the store took. An outage stops it (and propagates) keeping that record and the rest;
        a torn line (a crash mid-append) is skipped."""
        with self._locked():
            lines = self._lines() if self.path.exists() else []
            done = sent = 0
            try:
                for batch, record in batches(lines):
                    if record is None:
                        log.warning("%s: skipped a torn record: %.80s", self.path, batch[0])
                    else:
                        try:
                            send_one(record)
                            sent += len(batch)
                        except Exception as e:
                            if is_outage(e):
                                raise
                            self._refuse(batch, e)
                    done += len(batch)
            finally:
                if done:
                    tmp = self.path.with_name(self.path.name + ".tmp")
                    tmp.write_text("".join(line + "\n" for line in lines[done:]), encoding="utf-8")
                    os.replace(tmp, self.path)
        return sent

    def _refuse(self, lines: list[str], error: Exception) -> None:
        refused = self.path.with_name(self.path.stem + ".refused.jsonl")
        with open(refused, "a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
        log.warning(
            "%s: the tracking store refused %d kept record(s) (%s): moved to %s",
            self.path,
            len(lines),
            str(error)[:200],
            refused,
        )


BATCH_METRICS = 1000  # MLflow's log_batch takes at most 1000 metrics a call


def batches(lines: list[str]) -> list[tuple[list[str], dict | None]]:
    """Kept lines as the calls that send them: consecutive metric records merged up to
    ``BATCH_METRICS`` metrics (one call instead of one a step: ~20 ms each to a local server), any
    other record alone; a line that is not JSON (torn) alone with None."""
    out: list[tuple[list[str], dict | None]] = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            out.append(([line], None))
            continue
        last = out[-1][1] if out else None
        if (
            record["op"] == "metrics"
            and last is not None
            and last["op"] == "metrics"
            and len(last["metrics"]) + len(record["metrics"]) <= BATCH_METRICS
        ):
            out[-1][0].append(line)
            last["metrics"] += record["metrics"]
        else:
            out.append(([line], record))
    return out


@contextmanager
def _whole():
    """Ctrl-C (SIGINT) and SIGTERM wait for the block: a write to MLflow's SQLite store cut between
    its statements leaves the database locked by this process, and the next write (marking the runs
    ended) then waits out SQLite's timeout (docs/reliability.md). Only the main thread
    handles signals; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught and callable(previous[caught[0]]):
            previous[caught[0]](caught[0], None)  # Python's default for SIGINT: KeyboardInterrupt, now


def _send(client, run_id: str, record: dict) -> None:
    """One journal record to the store, whole (``_whole``): the one place that maps records to MLflow calls."""
    with _whole():
        _send_now(client, run_id, record)


def _send_now(client, run_id: str, record: dict) -> None:
    from mlflow.entities import Dataset, DatasetInput, Metric, Param

    op = record["op"]
    if op == "metrics":
        client.log_batch(run_id, metrics=[Metric(*m) for m in record["metrics"]], synchronous=True)
    elif op == "params":
        items = [Param(k, v) for k, v in record["params"].items()]
        for i in range(0, len(items), 100):  # log_batch accepts at most 100 params per call
            client.log_batch(run_id, params=items[i : i + 100], synchronous=True)
    elif op == "tags":
        for k, v in record["tags"].items():
            client.set_tag(run_id, k, v)
    elif op == "table":
        client.log_table(run_id, data=record["columns"], artifact_file=record["artifact_file"])
    elif op == "artifacts":
        if Path(record["local_dir"]).exists():
            client.log_artifacts(run_id, record["local_dir"], record["artifact_path"])
        else:
            log.warning("%s is gone: not logged to run %s", record["local_dir"], run_id)
    elif op == "input":
        client.log_inputs(run_id, datasets=[DatasetInput(Dataset(**record["dataset"]))])
    elif op == "terminate":
        client.set_terminated(run_id, record["status"], end_time=record["end_time"])
    else:
        raise ValueError(f"unknown tracking record {op!r}")


class MlflowLogger:
    """Logs to one MLflow run. With ``unsent`` (a run folder's ``mlflow-unsent``), a tracking store that
    stops answering does not stop the caller: what it did not take is kept, in order, in
    ``unsent/<run_id>.jsonl`` (metrics with their steps and times), the first failure is logged, the
    store is tried again every ``RETRY_S`` (one state per store for the process, ``DOWN``, so that
    the next logger does not pay MLflow's retries again), and when it answers the kept records go
    first (``send_unsent`` sends a folder's records later). Without ``unsent``, errors raise."""

    def __init__(
        self, tracking_uri: str, run_id: str, stage: str | None = None, unsent: str | Path | None = None
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.uri, self.run_id = tracking_uri, run_id
        self.stage, self.prefix = stage, stage_prefix(stage)
        self.journal = Journal(Path(unsent) / f"{run_id}.jsonl") if unsent else None

    def _record(self, record: dict) -> None:
        if self.journal is None:
            return _send(self.client, self.run_id, record)
        retry_at = DOWN.get(self.uri)
        if retry_at is not None and time.monotonic() < retry_at:
            return self._keep(record)
        try:
            if retry_at is not None:  # a quick look first: MLflow's client spends seconds on its retries
                check_tracking(self.uri, timeout_s=2.0)
            if self.journal.pending():
                self.journal.send(lambda r: _send(self.client, self.run_id, r))
            _send(self.client, self.run_id, record)
        except Exception as e:
            if not (is_outage(e) or isinstance(e, TrackingError)):
                raise
            if retry_at is None:
                log.warning(
                    "MLflow tracking at %s failed (%s): going on; what it misses is kept in %s and sent "
                    "when it answers again",
                    redact(self.uri),
                    str(e)[:200],
                    self.journal.path.parent,
                )
            DOWN[self.uri] = time.monotonic() + RETRY_S
            return self._keep(record)
        if DOWN.pop(self.uri, None) is not None:
            log.warning("MLflow tracking at %s answers again: the kept records were sent", redact(self.uri))

    def _keep(self, record: dict) -> None:
        self.journal.append(record)
        where = self.journal.path.parent / STORE
        if not where.exists() and redact(self.uri) == self.uri:  # for ``sync`` (never a URI with credentials)
            where.write_text(self.uri)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        named = {k if k.startswith(self.prefix) else self.prefix + k: v for k, v in metrics.items()}
        batch = [[metric_name(k), float(v), now, step or 0] for k, v in named.items() if math.isfinite(float(v))]
        if batch:
            self._record({"op": "metrics", "metrics": batch})

    def log_params(self, params: dict[str, Any]) -> None:
        self._record({"op": "params", "params": {k: str(v)[:6000] for k, v in params.items()}})

    def set_tags(self, tags: dict[str, str]) -> None:
        self._record({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))  # every row's, first seen first
            self._record(
                {"op": "table", "columns": {k: [r.get(k) for r in rows] for k in keys}, "artifact_file": artifact_file}
            )

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None:
        self._record({"op": "artifacts", "local_dir": str(Path(local_dir).resolve()), "artifact_path": artifact_path})

    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None:
        """Record a dataset the stage read or wrote as an MLflow run input (name, digest, rows)."""
        self._record(
            {
                "op": "input",
                "dataset": {
                    "name": name,
                    "digest": digest[:36],
                    "source_type": "local",
                    "source": json.dumps({"uri": source}),
                    "profile": json.dumps({"rows": rows}),
                },
            }
        )

    def terminate(self, status: str = "FINISHED") -> None:
        self._record({"op": "terminate", "status": status, "end_time": int(time.time() * 1000)})


def _journals(folder: Path) -> list[Journal]:
    return [Journal(p) for p in sorted(Path(folder).glob("*.jsonl")) if not p.name.endswith(".refused.jsonl")]


def send_unsent(uri: str, folder: Path) -> tuple[int, int]:
    """Send the records a run's loggers kept (``folder``: its ``mlflow-unsent``), run by run; returns
    (sent, still kept). A store that fails again keeps the rest for the next try."""
    from mlflow.tracking import MlflowClient

    client, sent = MlflowClient(uri), 0
    for journal in _journals(folder):
        try:
            sent += journal.send(lambda r: _send(client, journal.path.stem, r))
        except Exception as e:
            if not is_outage(e):
                raise
    return sent, unsent_count(folder)


def unsent_count(folder: Path) -> int:
    return sum(len(j) for j in _journals(folder))


def logger_from_env(stage: str | None = None) -> MetricLogger:
    """The MLflow run a launcher handed to this process (``MLFLOW_RUN_ID`` and
    ``MLFLOW_TRACKING_URI``, set by ``tasks.launch``, and where to keep what the store misses,
    ``UNSENT_ENV``) for ``stage``'s metrics, or no tracking. The stages log on rank 0 only."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    # Other ranks never open the store: N clients creating one sqlite database at once collide.
    if not run_id or int(os.environ.get("RANK", "0")) != 0:
        return NullLogger()
    return MlflowLogger(os.environ.get("MLFLOW_TRACKING_URI", ""), run_id, stage, os.environ.get(UNSENT_ENV) or None)


class TrackingError(RuntimeError):
    pass


def redact(uri: str) -> str:
    """The URI without credentials (``https://user:pw@host`` -> ``https://***@host``), for logs."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


def check_tracking(uri: str, timeout_s: float = 5.0) -> None:
    """Fail at start, within ``timeout_s``, when the tracking store cannot be used: a server that
    does not answer or refuses this client's login (MLflow's basic-auth app: ``user:password@`` in
    the URI, or ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, or a bearer
    ``MLFLOW_TRACKING_TOKEN``), or a sqlite database whose folder cannot be created. MLflow's own
    client retries an unreachable server for minutes, and would do so at the first stage's first metric."""
    import urllib.error
    import urllib.request

    if uri.startswith(("http://", "https://")):
        import base64
        import urllib.parse

        # urllib does not read user:password@ from a URL (MLflow's client does): send it as a header.
        parts = urllib.parse.urlsplit(uri)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
        base = urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else ""))).rstrip(
            "/"
        )
        login = (
            f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
            if os.environ.get("MLFLOW_TRACKING_USERNAME")
            else None
        )  # first, as MLflow's client
        if login is None and parts.username is not None:
            login = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        headers = (
            {"Authorization": "Basic " + base64.b64encode(login.encode()).decode()}
            if login is not None
            else {"Authorization": f"Bearer {token}"}
            if token
            else {}
        )
        for path in ("/health", "/api/2.0/mlflow/experiments/search?max_results=1"):
            try:
                urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=timeout_s).close()
            except urllib.error.HTTPError as e:
                if e.code in (401, 403) and path != "/health":  # (an auth proxy may refuse /health alone)
                    raise TrackingError(
                        f"MLflow tracking server {redact(uri)} refused this client's login (HTTP {e.code}): set "
                        f"MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) to an "
                        f"account of its basic-auth app"
                    ) from None
            except (OSError, ValueError) as e:
                raise TrackingError(
                    f"MLflow tracking server {redact(uri)} is unreachable ({getattr(e, 'reason', e)}): start it, or "
                    f"point tracking.tracking_uri / MLFLOW_TRACKING_URI at a running server or a sqlite:/// file"
                ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrackingError(f"MLflow tracking database {uri}: cannot create its folder {folder}: {e}") from None
