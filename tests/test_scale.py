"""A million requests in bounded memory (issue 18 part 4): a run keeps its records in typed columns,
builds and writes its tables a chunk of rows at a time, and the chunked outputs are the whole tables
byte for byte. The time and peak-memory goal itself lives in benchmarks/results/scale_1m.json."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contract import invoke
from simulator import columns
from simulator.files import CsvAppender, strict_json, write_csv
from simulator.load import load_scenario
from simulator.run import MethodRun, drive_queue, make_requests, resolve, run_scenario

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "scenarios" / "faults_decode_loss.yaml"  # failed rows (empty latencies) and text columns


@pytest.fixture(scope="module")
def whole():
    """The fault scenario at 240 requests, every table held whole, the runs kept."""
    s = load_scenario(FAULTS, ["workload.requests=240"])
    return s, run_scenario(s, keep_runs=True)


def test_chunks_are_the_whole_tables(whole):
    _, result = whole
    assert result.summary["methods"]["hack"]["failed"] + result.summary["methods"]["hack"]["completed"] == 240
    for run in result.runs.values():
        pd.testing.assert_frame_equal(pd.concat(list(run.request_chunks(7)), ignore_index=True), run.requests_frame())
        pd.testing.assert_frame_equal(pd.concat(list(run.memory_chunks(5)), ignore_index=True), run.memory_frame())
        pd.testing.assert_frame_equal(pd.concat(list(run.link_chunks(3)), ignore_index=True), run.links_frame())
        assert [len(c) for c in run.request_chunks(100)] == [100, 100, 40]


def test_csv_written_in_chunks_is_the_csv_written_at_once(whole, tmp_path):
    _, result = whole
    write_csv(result.requests, tmp_path / "once.csv")
    out = CsvAppender(tmp_path / "chunks.csv", chunk_rows=11)
    for run in result.runs.values():
        for chunk in run.request_chunks(17):
            out.write(chunk)
    out.close()
    assert (tmp_path / "chunks.csv").read_bytes() == (tmp_path / "once.csv").read_bytes()


def test_simulate_out_streams_the_same_tables_and_summary(whole, tmp_path):
    """`simulate --out` (one method's tables at a time, through the sink) writes what the in-memory run
    holds, and its summary is the one computed from the columns."""
    s, result = whole
    r = invoke("simulate", FAULTS, "--requests", "240", "--out", tmp_path / "out", "--no-report", "--quiet")
    assert r.exit_code == 0, r.stderr
    for name, table in (("requests.csv", result.requests), ("memory.csv", result.memory), ("links.csv", result.links)):
        write_csv(table, tmp_path / name)
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / name).read_bytes(), name
    assert (tmp_path / "out" / "summary.json").read_text() == strict_json(result.summary) + "\n"


def test_summary_from_columns_is_the_table_summary(whole):
    """Means and quantiles computed from the columns equal those of the written table's rows."""
    _, result = whole
    for name, m in result.summary["methods"].items():
        df = result.requests[result.requests["method"] == name]
        ok = df[df["failure"] == ""]
        assert m["completed"] == len(ok)
        for metric in ("jct_s", "ttft_s", "tpot_s"):
            x = ok[metric].dropna().to_numpy()
            assert m[metric]["mean"] == pytest.approx(x.mean(), rel=1e-12)
            assert m[metric]["p99"] == pytest.approx(np.percentile(x, 99), rel=1e-12)
        assert m["breakdown_s"]["transfer"] == pytest.approx(ok["transfer_s"].mean(), rel=1e-12)


def _retained_bytes(s, n: int) -> int:
    """Bytes a method run still holds after simulating n requests of the scenario (tracemalloc)."""
    s = s.model_copy(update={"workload": s.workload.model_copy(update={"requests": n})})
    res, reqs = resolve(s), make_requests(s)
    tracemalloc.start()
    try:
        run = MethodRun(res, s.methods[0], reqs, "test")
        run.simulate()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del run
    return held


def test_a_run_holds_a_few_hundred_bytes_per_request():
    """The records grow by typed values only: ~30 eight-byte columns and five log rows per request (~470 B), not
    the ~1.5 KB per request that lists of Python floats and tuples took."""
    s = load_scenario(ROOT / "scenarios" / "a10g_10gbps.yaml", ["methods=[hack]"])
    small, large = _retained_bytes(s, 3000), _retained_bytes(s, 9000)
    per_request = (large - small) / 6000
    assert 0 < per_request < 600, per_request


def test_columns_read_and_log_without_copies():
    col = columns.nans(4)
    col[2] = 1.5
    v = columns.view(col)
    assert np.isnan(v[[0, 1, 3]]).all() and v[2] == 1.5 and np.shares_memory(v, columns.view(col))
    ints = columns.filled(3, -1)
    ints[0] = 7
    assert columns.view(ints, np.int64).tolist() == [7, -1, -1]
    log = columns.RowLog(3)
    log.append((0.0, 1, 2.5))
    log.append((1.0, 0, 3.5))
    assert len(log) == 2 and log.table().tolist() == [[0.0, 1.0, 2.5], [1.0, 0.0, 3.5]]
    assert list(log) == [(0.0, 1.0, 2.5), (1.0, 0.0, 3.5)] and log.column(2).tolist() == [2.5, 3.5]
    assert columns.view(columns.nans(0)).shape == (0,)


def test_row_log_keeps_every_row_in_order_across_its_batches():
    """RowLog packs its rows into the array a batch at a time: rows on either side of a batch boundary, and the
    rows of a batch not yet packed, all read back in order, each number as the float it was given."""
    log = columns.RowLog(3)
    n = 2 * columns._FLUSH_ROWS + 5  # two packed batches and five rows still in the list
    for i in range(n):
        log.append((i / 8, i, -i - 0.25))
    assert len(log) == n
    t = log.table()
    assert t.shape == (n, 3)
    assert t[:, 0].tolist() == [i / 8 for i in range(n)]
    assert t[:, 1].tolist() == [float(i) for i in range(n)]
    assert t[:, 2].tolist() == [-i - 0.25 for i in range(n)]
    del t  # a view of the array: it must not grow while one is alive
    log.append((1.0, 2, 3.0))  # after a read: appended behind the rows read
    assert len(log) == n + 1 and list(log)[-2:] == [((n - 1) / 8, n - 1.0, -(n - 1) - 0.25), (1.0, 2.0, 3.0)]


def test_the_event_loop_runs_without_the_cyclic_collector_and_makes_no_cycles():
    """MethodRun.simulate turns the cyclic garbage collector off while the loop runs and back on after, even when
    the loop fails; the loop makes no reference cycles (nothing for the collector to free after the fault
    scenario's loop), so nothing waits for it."""
    import gc

    s = load_scenario(FAULTS, ["workload.requests=120", "methods=[hack]"])
    res = resolve(s, str(FAULTS))
    seen: list = []

    def drive(env, fail=False):
        seen.append(gc.isenabled())
        gc.collect()  # what was garbage before the loop
        drive_queue(env)
        seen.append(gc.collect())  # what the loop made and left unreachable: nothing
        if fail:
            raise RuntimeError("drive failed")

    run = MethodRun(res, s.methods[0], make_requests(s), str(FAULTS))
    run.simulate(drive)
    assert seen == [False, 0] and gc.isenabled()
    run = MethodRun(res, s.methods[0], make_requests(s), str(FAULTS))
    with pytest.raises(RuntimeError, match="drive failed"):
        run.simulate(lambda env: drive(env, fail=True))
    assert gc.isenabled()


@pytest.mark.parametrize("threads", [1, 3])
def test_csv_slices_formatted_on_threads_are_written_in_order(tmp_path, monkeypatch, threads):
    """CsvAppender formats slices of rows on worker threads and writes their text in order: a hand-worked table
    cut into 2-row slices (3-row chunks, then a second write) comes out as one file, row after row, whatever the
    number of threads; numbers in their shortest exact form, NaN empty; with quote_text every text field quoted."""
    import simulator.files as files

    monkeypatch.setattr(files, "CSV_SLICE_ROWS", 2)
    monkeypatch.setattr(files, "CSV_THREADS", threads)
    monkeypatch.setattr(files, "_pool", None)
    t = [0.0, 1e-5, 402951405568.0, np.nan, 0.1 + 0.2]
    plain = pd.DataFrame({"method": ["hack", "fp8", "hack", "hack", "hack"], "n": np.arange(5), "t": t})
    out = CsvAppender(tmp_path / "plain.csv", chunk_rows=3)
    out.write(plain)
    out.write(plain.iloc[:1])
    out.close()
    assert (tmp_path / "plain.csv").read_text() == (
        "method,n,t\nhack,0,0\nfp8,1,0.00001\nhack,2,4.02951405568e+11\nhack,3,\nhack,4,0.30000000000000004\nhack,0,0\n"
    )
    text = plain.assign(method=["hack", "a,b", "hack", 'x"y', "hack"])
    out = CsvAppender(tmp_path / "quoted.csv", quote_text=True, chunk_rows=3)
    out.write(text)
    out.close()
    assert (tmp_path / "quoted.csv").read_text() == (
        'method,n,t\n"hack",0,0\n"a,b",1,0.00001\n"hack",2,4.02951405568e+11\n"x""y",3,\n"hack",4,0.30000000000000004\n'
    )


def test_a_slice_that_cannot_be_formatted_fails_the_file_and_closes_it(tmp_path):
    """A slice's error on a worker thread (text with a comma, not quoted) is raised where its text would have been
    written, and the file is closed all the same."""
    import pyarrow as pa

    out = CsvAppender(tmp_path / "t.csv")
    out.write(pd.DataFrame({"method": ["a,b"]}))
    with pytest.raises(pa.ArrowInvalid, match="structural characters"):
        out.close()
    assert out._file is None and not out._pending
    out.abandon()  # a run that failed: closing again is harmless


@pytest.mark.parametrize(
    "scenario, overrides",
    [
        (FAULTS, ["workload.requests=240"]),  # failed rows, links, three methods
        (ROOT / "scenarios" / "colocated_vs_disaggregated.yaml", ["workload.requests=60", "placement=colocated"]),
    ],
    ids=["faults", "colocated-no-links"],
)
def test_report_from_the_held_tables_is_the_report_from_the_files(tmp_path, monkeypatch, scenario, overrides):
    """simulate --out hands the report the tables it still holds (figure_tables) rather than letting it read
    back the CSV files; the page is byte for byte the one `report` builds from the files afterwards, and the
    tables are the files' rows (a run without links writes no links.csv and hands over none)."""
    import reports.data
    from reports.data import load_run
    from simulator.run import figure_tables

    out = tmp_path / "out"
    sets = [a for o in overrides for a in ("--set", o)]
    read_csv = reports.data._read_csv

    def no_read_back(path, *a, **k):  # a missing file (links.csv without links) is only noted
        assert not path.exists(), f"simulate read back {path}"
        return read_csv(path, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(reports.data, "_read_csv", no_read_back)
        r = invoke("simulate", scenario, *sets, "--out", out, "--quiet")
    assert r.exit_code == 0, r.stderr
    held_page = (out / "report.html").read_bytes()
    r = invoke("report", out)
    assert r.exit_code == 0, r.stderr
    assert (out / "report.html").read_bytes() == held_page
    result = run_scenario(load_scenario(scenario, overrides), keep_runs=True)
    tables = figure_tables([run.figure_columns() for run in result.runs.values()])
    assert sorted(tables) == sorted(n for n in ("requests.csv", "memory.csv", "links.csv") if (out / n).exists())
    held, read = load_run(out, tables), load_run(out)
    assert held.notes == read.notes
    for name in ("requests", "memory", "links"):
        a, b = getattr(held, name), getattr(read, name)
        if b is None:
            assert a is None
            continue
        assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
        pd.testing.assert_frame_equal(a, b, check_dtype=False, check_exact=True)
        for label in ("method", "link"):
            if label in a:
                assert a[label].dtype == "category" and list(a[label]) == list(b[label])
    # frames whose names are plain text are read as the files are: names as categories
    plain = {n: t.astype({c: str for c in ("method", "link") if c in t}) for n, t in tables.items()}
    again = load_run(out, plain)
    for df in (again.requests, again.memory, again.links):
        if df is not None:
            assert all(df[c].dtype == "category" for c in ("method", "link") if c in df)


def test_a_forked_child_writes_csv_with_its_own_threads(tmp_path):
    """The CSV threads of a process do not exist in a child it forks (a process pool's worker): the child makes
    its own pool rather than queueing slices for threads that are not there (it would wait for ever)."""
    import multiprocessing

    import simulator.files as files

    parent = CsvAppender(tmp_path / "parent.csv")
    parent.write(pd.DataFrame({"x": [1, 2]}))
    parent.close()
    assert files._pool is not None
    child = multiprocessing.get_context("fork").Process(target=_write_one, args=(tmp_path / "child.csv",))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and (tmp_path / "child.csv").read_text() == "x\n1\n2\n"


def _write_one(path):
    out = CsvAppender(path)
    out.write(pd.DataFrame({"x": [1, 2]}))
    out.close()


def test_a_finished_run_is_freed_before_the_next_method_is_built(monkeypatch):
    """A run's entities and its SimPy environment refer to each other, so a finished method's are freed by the cyclic
    collector, not when the run's last name goes; run_scenario collects them before building the next method's
    run, so a long multi-method run holds one method's at a time, not two."""
    import weakref

    import simulator.run as run_module

    made: list = []
    init = run_module.MethodRun.__init__

    def tracking(self, *a, **k):
        init(self, *a, **k)
        made.append(weakref.ref(self.env))  # the entities and their SimPy environment: the cycles

    monkeypatch.setattr(run_module.MethodRun, "__init__", tracking)
    alive: list = []

    def sink(_name, *tables):
        alive.append([r() is not None for r in made])

    s = load_scenario(FAULTS, ["workload.requests=60"])
    import gc

    thresholds = gc.get_threshold()
    gc.set_threshold(10**9)  # no automatic collection: at a million requests none may come for seconds
    try:
        run_scenario(s, sink=sink)
    finally:
        gc.set_threshold(*thresholds)
    assert len(alive) == len(s.methods) > 1
    assert alive == [[False] * k + [True] for k in range(len(s.methods))]
