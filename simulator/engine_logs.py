"""Measured runs from serving engines' own benchmarks: the per-request timings in the files users already have.

`read_engine_log(path)` reads one benchmark run into a `RequestLog`: per request its prompt and output tokens,
the client's time to first token, its end-to-end latency, the gaps between the chunks it streamed, and, where
the file has them, the times the client sent each request. The formats and the fields read:

| format | file | per request | send times |
|---|---|---|---|
| `vllm` | `vllm bench serve --save-result --save-detailed` JSON, or with `--append-result` one run per line (the last is read) (vllm/benchmarks/serve.py, vLLM 009e6d4) | `input_lens`, `output_lens`, `ttfts`, `itls`, `latencies`, `errors` (s) | `start_times` (time.perf_counter) |
| `sglang` | `python -m sglang.bench_serving` (now also `python -m sglang.benchmark.serving`) `--output-file F --output-details` JSONL, one run per line as the benchmark appends them; the last is read (python/sglang/bench_serving.py, SGLang 0033168; python/sglang/benchmark/serving.py, SGLang 00f9ec4) | `input_lens`, `output_lens`, `ttfts`, `itls`, `errors` (s); the latency is ttft + the gaps | none |
| `aiperf` | AIPerf / GenAI-Perf's successor `profile_export.jsonl`, one record per request (docs/tutorials/working-with-profile-exports.md, ai-dynamo/aiperf 13992db; src/aiperf/common/metric_records_wire.py, 017c63d) | `metrics.input_sequence_length`, `output_sequence_length`, `time_to_first_token`, `request_latency`, `inter_chunk_latency` (each `{value, unit}`; the last only with `--export-per-chunk-data` since src/aiperf/post_processors/record_export_jsonl_writer.py at 017c63d), `error` | `metadata.request_start_ns` |

A request that failed (a non-empty `errors` entry, an AIPerf `error` or a cancelled record) or produced no token
is not a request the engine served and is left out. Benchmarks derived from vLLM's that name the end-to-end
latencies `e2els`, or keep only the successful requests in the per-request lists and the failures' messages in a
shorter `errors`, are read so, and the output says which. The vLLM and SGLang benchmarks send every request at once
when `request_rate` is infinite and `max_concurrency` is not set (their `get_request` does not sleep), so their
send times are known to be 0 then; but not SGLang's trace replays (`request_rate` "trace", or the mooncake dataset,
which ignores the rate) nor its chat backends, whose multi-turn conversations send each round after the previous
reply. Otherwise a file without send times says nothing about when each request was sent. What a file lacks is
listed in `RequestLog.notes` and said in `validate`'s and `calibrate`'s output: there the send times come from the
scenario's arrival process and the file is left out of a fit (simulator/fit_items.py).

Each value is checked as every trace's rows are (simulator/trace_rows.py): a malformed file is one line naming
the file, the field and the request's position (for vLLM's and SGLang's lists) or line (JSON Lines).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import files
from .config import ScenarioError
from .trace_rows import RowChecker

FORMATS = ("vllm", "sglang", "aiperf")
TIME_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
# the keys a bench dict (vLLM, SGLang) must have to describe requests
BENCH_KEYS = ("input_lens", "output_lens", "ttfts")
MAX_LOG_BYTES = 2**30  # a run's file carries every generated text: tens of MB for thousands of requests
# SGLang's chat backends: the only ones that replay a multi-turn conversation, round after round
# (MULTI_TURN_BACKENDS in python/sglang/benchmark/serving.py, SGLang 00f9ec4)
SGLANG_MULTI_TURN_BACKENDS = ("sglang-oai-chat", "vllm-chat", "lmdeploy-chat")


@dataclass
class RequestLog:
    """One benchmark run, request by request, in send order where the send times are known."""

    path: str
    format: str
    prompt_tokens: np.ndarray  # (N,) int64
    output_tokens: np.ndarray  # (N,) int64, >= 1
    ttft_s: np.ndarray  # (N,) client time to first token
    latency_s: np.ndarray  # (N,) client end-to-end latency
    send_s: np.ndarray  # (N,) seconds from the first send; NaN where unknown
    sends_known: bool
    itl_s: list[np.ndarray]  # per request, the gaps between its streamed chunks (one per token when len = out - 1)
    request_rate: float | None = None  # the file's configured rate (inf: all at once); None: not recorded
    max_concurrency: int | None = None
    meta: dict = field(default_factory=dict)  # the run's own description (model, backend, date, ...)
    notes: list[str] = field(default_factory=list)  # what the file lacks and where it comes from instead

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def per_token(self) -> np.ndarray:
        """(N,) bool: the request streamed one chunk per output token, so its gaps are inter-token latencies."""
        return np.array([len(g) == n - 1 for g, n in zip(self.itl_s, self.output_tokens)], dtype=bool)

    def frame(self) -> pd.DataFrame:
        """The requests as a measured trace's columns (simulator/validate.py): arrival at the send time (0 where
        unknown: every time is then relative to its own send), first token and finish."""
        arrival = np.where(np.isnan(self.send_s), 0.0, self.send_s)
        return pd.DataFrame(
            {
                "arrival_s": arrival,
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "first_token_s": arrival + self.ttft_s,
                "finish_s": arrival + self.latency_s,
            }
        )


def is_engine_log(path: str | Path) -> bool:
    """A benchmark file (JSON or JSON Lines) rather than a realrun trace folder or its requests.csv."""
    p = Path(path)
    return p.suffix.lower() in (".json", ".jsonl") and not p.is_dir()


def read_engine_log(path: str | Path, fmt: str | None = None) -> RequestLog:
    """The run in a vLLM, SGLang or AIPerf benchmark file (`fmt`, else told by its content); ScenarioError in
    one line when the file is missing, malformed or leaves no served request."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise ScenarioError(f"{path}: unknown benchmark format {fmt!r} (formats: {', '.join(FORMATS)})")
    text = files.read_text(path, ScenarioError, "benchmark file", max_bytes=MAX_LOG_BYTES)
    records = _json_records(path, text)
    if fmt is None:
        fmt = _detect(path, records)
    if fmt == "aiperf":
        log = _aiperf(path, records)
    else:
        log = _bench(path, records, fmt)
    if not len(log):
        raise ScenarioError(f"{path}: no served request (every request failed or produced no token)")
    return log


def _json_records(path: Path, text: str) -> list[tuple[int, object]]:
    """The file as (line, value) pairs: one for a JSON document, one per non-empty line for JSON Lines."""
    stripped = text.strip()
    if not stripped:
        raise ScenarioError(f"{path}: empty file")
    try:
        return [(1, json.loads(stripped))]
    except json.JSONDecodeError:
        pass
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{path} line {n}: not valid JSON ({e.msg})") from None
    return out


def _detect(path: Path, records: list[tuple[int, object]]) -> str:
    first, last = records[0][1], records[-1][1]
    if isinstance(first, dict) and "metrics" in first and "metadata" in first:
        return "aiperf"
    if isinstance(last, dict) and any(k in last for k in BENCH_KEYS):
        # both append one line per run (vLLM with --append-result); the last is read, and only vLLM's has these
        vllm = ("latencies", "start_times", "tokenizer_id", "endpoint_type", "model_id")
        return "vllm" if any(k in last for k in vllm) else "sglang"
    raise ScenarioError(
        f"{path}: not a benchmark result this reads: expected a vLLM `bench serve --save-result --save-detailed` "
        f"JSON, an SGLang `bench_serving --output-details` JSONL or an AIPerf profile_export.jsonl"
    )


# ---- vLLM and SGLang: one dict of per-request lists ------------------------------------------------
def _bench(path: Path, records: list[tuple[int, object]], fmt: str) -> RequestLog:
    line, doc = records[-1]
    notes = []
    where = f"{path}" if len(records) == 1 else f"{path} line {line}"
    if len(records) > 1:
        notes.append(f"the file holds {len(records)} runs; read the last (line {line}), as the benchmark appends them")
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a JSON object (the benchmark's result)")
    missing = [k for k in BENCH_KEYS if k not in doc]
    if missing:
        raise ScenarioError(
            f"{where}: no {missing[0]}: save the benchmark's per-request results (vLLM: --save-result "
            f"--save-detailed; SGLang: --output-details)"
        )
    n = _list_len(where, doc, "input_lens")
    if doc.get("latencies") is None and doc.get("e2els") is not None:  # some derived benchmarks' name for them
        doc = {**doc, "latencies": doc["e2els"]}
        notes.append("latencies from e2els (the end-to-end latencies under another name)")
    for key in ("output_lens", "ttfts", "itls", "latencies", "start_times"):
        if (key in BENCH_KEYS or doc.get(key) is not None) and _list_len(where, doc, key) != n:
            raise ScenarioError(f"{where}: {key} has {len(doc[key])} entries for {n} requests (input_lens)")
    errors = [""] * n
    if doc.get("errors") is not None:
        k = _list_len(where, doc, "errors")
        if k == n:
            errors = doc["errors"]
        elif k:  # every other list has one entry per request: these are failed requests those lists leave out (some
            # derived benchmarks keep only the successful ones there), so the requests listed were all served
            notes.append(f"errors lists {k} failed requests apart from the {n} the per-request lists hold, all served")
    check = RowChecker(f"{where}:", ScenarioError, lines=np.arange(n) + 1, unit="request")
    served = np.array([not e for e in errors], dtype=bool)
    prompt = check.counts(np.asarray(doc["input_lens"], dtype=object), "input_lens", 1)
    output = check.counts(np.asarray(doc["output_lens"], dtype=object), "output_lens", 0)
    ttft = check.times(np.asarray(doc["ttfts"], dtype=object), "ttfts")
    itls = doc.get("itls")
    if itls is None:
        itl = [np.zeros(0)] * n
        notes.append("no itls: decode is fitted from each request's TPOT only")
    else:
        itl = [_gaps(check, i, g) for i, g in enumerate(itls)]
    if doc.get("latencies") is not None:
        latency = check.times(np.asarray(doc["latencies"], dtype=object), "latencies")
    else:
        latency = ttft + np.array([g.sum() for g in itl])
        notes.append("no latencies: each request's end is its first token plus its streamed gaps")
    keep = served & (output > 0)
    rate = _rate(where, doc)
    concurrency = doc.get("max_concurrency")
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise ScenarioError(f"{where}: max_concurrency: {concurrency!r} is not a whole number >= 1")
    paced = _paced(doc, fmt)
    if doc.get("start_times") is not None:
        send = check.times(np.asarray(doc["start_times"], dtype=object), "start_times")
        known, how = True, "start_times"
    elif rate is not None and math.isinf(rate) and concurrency is None and not paced:
        send, known, how = np.zeros(n), True, "0: request_rate inf and no max_concurrency (all sent at once)"
    else:
        send, known, how = np.full(n, np.nan), False, ""
        notes.append(
            "no per-request send times ("
            + ("request_rate " + _fmt_rate(rate) if rate is not None else _rate_text(doc))
            + (f", max_concurrency {concurrency}" if concurrency is not None else "")
            + (f"; {paced}" if paced else "")
            + "): they come from the scenario's arrival process, and the run is left out of a fit"
        )
    if known:
        notes.insert(0, f"send times: {how}")
    meta = {k: v for k, v in doc.items() if v is None or isinstance(v, (str, int, float, bool))}
    return _log(path, fmt, prompt, output, ttft, latency, send, known, itl, keep, rate, concurrency, meta, notes)


def _list_len(where: str, doc: dict, key: str) -> int:
    v = doc[key]
    if not isinstance(v, list):
        raise ScenarioError(f"{where}: {key}: expected a list (one entry per request), got {type(v).__name__}")
    return len(v)


def _gaps(check: RowChecker, i: int, g) -> np.ndarray:
    if g is None:
        return np.zeros(0)
    if not isinstance(g, list):
        check.fail(i, f"itls: expected a list of seconds, got {type(g).__name__}")
    x = RowChecker(check.at(i) + ": itls", ScenarioError, first_line=1, unit="entry").times(
        np.asarray(g, dtype=object), "gap"
    )
    return x


def _rate(where: str, doc: dict) -> float | None:
    r = doc.get("request_rate")
    if r is None:
        return None
    if isinstance(r, str) and r.strip().lower() in ("inf", "infinity"):
        return math.inf
    if _trace_rate(r):  # SGLang's replay at a trace's timestamps: no one rate
        return None
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        raise ScenarioError(f"{where}: request_rate: {str(r)[:40]!r} is not a number of requests per second or 'inf'")
    if not r > 0:
        raise ScenarioError(f"{where}: request_rate: {r} is not a rate > 0 requests per second (or 'inf')")
    return float(r)


def _fmt_rate(rate: float | None) -> str:
    return "inf" if rate is not None and math.isinf(rate) else f"{rate:g} req/s"


def _trace_rate(r: object) -> bool:
    """request_rate "trace": SGLang's benchmark replaying a trace at its own timestamps."""
    return isinstance(r, str) and r.strip().lower() == "trace"


def _rate_text(doc: dict) -> str:
    """The file's request_rate when it is not a rate (`_rate` gave None)."""
    return "no request_rate" if doc.get("request_rate") is None else f"request_rate {doc['request_rate']}"


def _paced(doc: dict, fmt: str) -> str:
    """Why a run's requests may not all have been sent at once whatever its request_rate ('' when none)."""
    if fmt != "sglang":
        return ""
    if _trace_rate(doc.get("request_rate")) or doc.get("dataset_name") == "mooncake":
        return "replayed at the trace's timestamps"
    if doc.get("backend") in SGLANG_MULTI_TURN_BACKENDS:
        return f"backend {doc['backend']} sends a multi-turn conversation's rounds one after another"
    return ""


# ---- AIPerf: one record per request ----------------------------------------------------------------
def _aiperf(path: Path, records: list[tuple[int, object]]) -> RequestLog:
    prompt, output, ttft, latency, send, itl, keep, lines = [], [], [], [], [], [], [], []
    for line, rec in records:
        where = f"{path} line {line}"
        if not isinstance(rec, dict) or not isinstance(rec.get("metadata"), dict):
            raise ScenarioError(f"{where}: expected a record with metadata and metrics (AIPerf profile_export)")
        meta = rec["metadata"]
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue  # warmup requests are not the benchmark's
        metrics = rec.get("metrics")
        failed = rec.get("error") is not None or bool(meta.get("was_cancelled"))
        if failed:
            continue
        if not isinstance(metrics, dict):
            raise ScenarioError(f"{where}: metrics: expected an object of {{value, unit}} per metric")
        lines.append(line)
        prompt.append(_metric(where, metrics, "input_sequence_length", None))
        out = _metric(where, metrics, "output_sequence_length", None, required=False)
        output.append(out if out is not None else _metric(where, metrics, "output_token_count", None))
        ttft.append(_metric(where, metrics, "time_to_first_token", "time"))
        latency.append(_metric(where, metrics, "request_latency", "time"))
        start = meta.get("request_start_ns")
        send.append(start if start is not None else math.nan)
        gaps = _metric(where, metrics, "inter_chunk_latency", "time", required=False, many=True)
        itl.append(np.zeros(0) if gaps is None else gaps)
        keep.append(True)
    line_no = np.asarray(lines, dtype=np.int64)
    check = RowChecker(f"{path}", ScenarioError, lines=line_no, unit="line")
    p = check.counts(np.asarray(prompt, dtype=object), "input_sequence_length", 1)
    o = check.counts(np.asarray(output, dtype=object), "output_sequence_length", 0)
    t = check.times(np.asarray(ttft, dtype=object), "time_to_first_token")
    lat = check.times(np.asarray(latency, dtype=object), "request_latency")
    raw_send = np.asarray(send, dtype=object)
    known = bool(len(raw_send)) and not any(isinstance(v, float) and math.isnan(v) for v in raw_send)
    notes = []
    if known:
        # epoch nanoseconds (~1.8e18) are exact as Python ints and 256 ns apart as float64: subtract the first first
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in raw_send)
        first = min(raw_send) if ints and len(raw_send) else 0
        rel = np.asarray([v - first for v in raw_send], dtype=object) if ints else raw_send
        s = check.times(rel, "request_start_ns") * 1e-9
        notes.append("send times: metadata.request_start_ns")
    else:
        s = np.full(len(p), np.nan)
        notes.append(
            "no metadata.request_start_ns on every record: send times come from the scenario's arrival process, "
            "and the run is left out of a fit"
        )
    if not any(len(g) for g in itl):
        notes.append(
            "no inter_chunk_latency (AIPerf writes it with --export-per-chunk-data): decode is fitted from each "
            "request's TPOT only"
        )
    return _log(path, "aiperf", p, o, t, lat, s, known, itl, np.asarray(keep, dtype=bool), None, None, {}, notes)


def _metric(where: str, metrics: dict, name: str, kind: str | None, required: bool = True, many: bool = False):
    """A metric's value in seconds (kind "time", by its unit) or as written (tokens); a list with `many`."""
    m = metrics.get(name)
    if m is None:
        if required:
            raise ScenarioError(f"{where}: metrics: no {name}")
        return None
    if not isinstance(m, dict) or "value" not in m:
        raise ScenarioError(f"{where}: metrics.{name}: expected {{value, unit}}")
    value = m["value"]
    scale = 1.0
    if kind == "time":
        unit = m.get("unit", "ms")
        if unit not in TIME_UNITS_S:
            raise ScenarioError(f"{where}: metrics.{name}.unit: {str(unit)[:20]!r} is not a time unit (ns, us, ms, s)")
        scale = TIME_UNITS_S[unit]
    if many:
        if not isinstance(value, list):
            raise ScenarioError(f"{where}: metrics.{name}.value: expected a list, got {type(value).__name__}")
        x = RowChecker(f"{where}: metrics.{name}", ScenarioError, first_line=1, unit="entry").times(
            np.asarray(value, dtype=object), "value"
        )
        return x * scale
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{where}: metrics.{name}.value: {str(value)[:40]!r} is not a number")
    return value * scale if kind == "time" else value


# ---- both --------------------------------------------------------------------------------------------
def _log(
    path: Path,
    fmt: str,
    prompt: np.ndarray,
    output: np.ndarray,
    ttft: np.ndarray,
    latency: np.ndarray,
    send: np.ndarray,
    known: bool,
    itl: list[np.ndarray],
    keep: np.ndarray,
    rate: float | None,
    concurrency: int | None,
    meta: dict,
    notes: list[str],
) -> RequestLog:
    keep = keep & (output > 0)
    idx = np.flatnonzero(keep)
    if known and len(idx):
        idx = idx[np.argsort(send[idx], kind="stable")]
        send = send - send[idx[0]]
    bad = np.flatnonzero(latency[idx] < ttft[idx])
    if len(bad):
        i = int(idx[bad[0]])
        raise ScenarioError(
            f"{path}: request {i + 1}: its latency ({latency[i]:.6g} s) is shorter than its time to first token "
            f"({ttft[i]:.6g} s)"
        )
    return RequestLog(
        path=str(path),
        format=fmt,
        prompt_tokens=prompt[idx].astype(np.int64),
        output_tokens=output[idx].astype(np.int64),
        ttft_s=ttft[idx].astype(np.float64),
        latency_s=latency[idx].astype(np.float64),
        send_s=send[idx].astype(np.float64),
        sends_known=known,
        itl_s=[itl[i] for i in idx],
        request_rate=rate,
        max_concurrency=concurrency,
        meta=meta,
        notes=notes,
    )
