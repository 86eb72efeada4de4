"""A mixed step's price (`ReplicaCostModel.mixed_step`) from typed tables per cost model: the colocated hot path.

An engine replica that runs prompt chunks beside its decode rows (simulator/scheduler.py) prices every step
that carries chunks, and about a third of those steps are new ones (their decode rows, chunks and samples seen
for the first time). `mixed_step` builds a new step's price from a dozen small Python calls; here the parts it
sums are kept in typed tables of this compiled module, each filled from the cost model's own function the first
time it is asked (the pipeline hop and the LM head per row count, the decode rows' iteration per batch size, the
attention per chunk set; the dense layers and the chunks' KV encoding a block of 1,024 counts at a time, from the
cost model's numpy twins of the same arithmetic: `dense_layer_block`, `chunks_encode_block`), and a
new step is a few table reads and the same sums as `mixed_step`, in the same order, so the doubles are the same
(tests/test_colocated.py compares the two on random steps, bit for bit). The cost model stays the definition;
this module only remembers what it answered.

A decode iteration's price is handed to the decode replica as an `Iteration`: the numbers of the cost model's
`IterationCost` in a compiled class, so the replica's closed-form segment arithmetic reads them as C doubles
instead of a Python object's attributes by name; made once per cost object (a replica's table by batch size, a
step's from its decode rows' with the chunks added, the same sum as `IterationCost.with_decode_fixed_added`).
A chunk's attention is tabled by the chunk's earlier tokens: once a number of earlier tokens has come back a few
times, the cost model prices every chunk length of a block after it at once (`one_chunk_attention_block`, numpy,
the same doubles as `prefill_attention_s`).
"""

from __future__ import annotations

from array import array
from typing import Final

from costmodel.methods import PREFILL_KERNELS
from costmodel.phases import _NO_ITERATION, _ONE_PROMPT_FIELDS, IterationCost, PrefillCost, ReplicaCostModel

STEP_MEMO_ENTRIES: Final = 4096  # whole steps remembered per cost model (costmodel.phases.PREFILL_MEMO_ENTRIES)
CHUNKS_MEMO_ENTRIES: Final = 1 << 15  # chunk sets' attention remembered (costmodel.phases.CHUNKS_MEMO_ENTRIES)
CHUNK_BLOCK: Final = 1024  # chunk lengths (token counts) priced at once: the attention after the same earlier tokens
# (one_chunk_attention_block), the chunks' KV encoding and the dense layers
CHUNK_BLOCK_AFTER: Final = 4  # ... once that many lengths after them were priced one by one (a block costs a few)
CHUNK_TABLES: Final = 256  # numbers of earlier tokens with a table (each 24 kB a block), cleared when more
_NAN: Final = float("nan")
_ONE_FORM: Final = tuple((form,) for form in PREFILL_KERNELS)  # a chunk's form, by code
_FIELDS: Final = _ONE_PROMPT_FIELDS  # compiled: a C global (an imported name is a dictionary lookup)


class Iteration:
    """One decode iteration's price: costmodel.phases.IterationCost's numbers, as a compiled class (module doc)."""

    def __init__(
        self,
        decode_fixed_s: float,
        decode_per_ctx_s: float,
        dequant_fixed_s: float,
        dequant_per_ctx_s: float,
        approx_fixed_s: float,
        approx_per_ctx_s: float,
        fetch_fixed_s: float,
        fetch_per_ctx_s: float,
        host_s: float,
        fixed_s: float,
        per_ctx_s: float,
    ) -> None:
        self.decode_fixed_s = decode_fixed_s
        self.decode_per_ctx_s = decode_per_ctx_s
        self.dequant_fixed_s = dequant_fixed_s
        self.dequant_per_ctx_s = dequant_per_ctx_s
        self.approx_fixed_s = approx_fixed_s
        self.approx_per_ctx_s = approx_per_ctx_s
        self.fetch_fixed_s = fetch_fixed_s
        self.fetch_per_ctx_s = fetch_per_ctx_s
        self.host_s = host_s
        self.fixed_s = fixed_s  # decode + dequantize + approximation, as IterationCost summed them
        self.per_ctx_s = per_ctx_s

    def with_decode_fixed_added(self, added_s: float) -> Iteration:
        """IterationCost.with_decode_fixed_added: `added_s` more fixed decode time, the same sums in its order."""
        decode_fixed_s = self.decode_fixed_s + added_s
        return Iteration(
            decode_fixed_s,
            self.decode_per_ctx_s,
            self.dequant_fixed_s,
            self.dequant_per_ctx_s,
            self.approx_fixed_s,
            self.approx_per_ctx_s,
            self.fetch_fixed_s,
            self.fetch_per_ctx_s,
            self.host_s,
            decode_fixed_s + self.dequant_fixed_s + self.approx_fixed_s,
            self.per_ctx_s,
        )


def iteration_of(cost: IterationCost) -> Iteration:
    """The cost model's iteration as an `Iteration` (each number read once)."""
    return Iteration(
        cost.decode_fixed_s,
        cost.decode_per_ctx_s,
        cost.dequant_fixed_s,
        cost.dequant_per_ctx_s,
        cost.approx_fixed_s,
        cost.approx_per_ctx_s,
        cost.fetch_fixed_s,
        cost.fetch_per_ctx_s,
        cost.host_s,
        cost.fixed_s,
        cost.per_ctx_s,
    )


_NO_DECODE = iteration_of(_NO_ITERATION)  # a mixed step without decode rows


class Prefill:
    """A prefill batch's price (or a mixed step's chunk share): costmodel.phases.PrefillCost's numbers as a compiled
    class, so the entities read C doubles, where the `NamedTuple` was built through its interpreted `__new__` and
    read by name."""

    def __init__(
        self, stage_s: float, latency_s: float, approximation_s: float, encode_s: float, forms: tuple[str, ...]
    ) -> None:
        self.stage_s = stage_s  # the replica is busy this long before it can take the next batch
        self.latency_s = latency_s  # the batch's first tokens are ready this long after it starts
        self.approximation_s = approximation_s  # part of latency_s spent on the homomorphic correction
        self.encode_s = encode_s  # quantize / entropy-encode after the forward pass (the replica busy too)
        self.forms = forms  # the prefill attention form each prompt of the batch ran (PREFILL_KERNELS)


def prefill_of(cost: PrefillCost) -> Prefill:
    """The cost model's prefill price as a `Prefill`."""
    return Prefill(cost.stage_s, cost.latency_s, cost.approximation_s, cost.encode_s, cost.forms)


class StepPrices:
    """One cost model's mixed steps: `price(batch_size, chunks, samples)` is `cost.mixed_step(...)`, its iteration
    an `Iteration` and its chunk share a `Prefill`; and its plain iterations, `iteration(batch_size)` (`cost.iteration`)."""

    def __init__(self, cost: ReplicaCostModel):
        self.cost = cost
        self.layers = cost.model.layers
        self.stages = cost.parallel.pipeline
        self.serial_s = cost.host_serial_s_per_iteration
        # by row or token count; NaN: not asked yet
        self.dense: list[float] = []  # _dense_layer_s
        self.hop: list[float] = []  # _stage_hop_s
        self.lm_head: list[float] = []  # _lm_head_rows_s
        self.encode: list[float] = []  # _chunks_encode_s
        self.iterations: list[Iteration | None] = []  # iteration(batch_size)
        # one chunk's attention by (new tokens, earlier tokens); several chunks' by the chunk tuple
        self.one_chunk: dict[tuple[int, int], tuple[float, float, tuple[str, ...]]] = {}
        self.chunk_sets: dict[tuple[tuple[int, int], ...], tuple[float, float, tuple[str, ...]]] = {}
        # one chunk's attention by earlier tokens: seconds, correction, form code per chunk length (NaN: not
        # priced); how many lengths after them were priced one by one before the table. Kept in the cost model's
        # memo: every engine priced by it (and the scheduler's and the replica's tables) shares them
        memo = cost._memo
        self.chunk_tables: dict[int, array] = memo.setdefault("one_chunk_tables", {})
        self.chunk_misses: dict[int, int] = memo.setdefault("one_chunk_misses", {})
        self.bulk_chunks = cost.method.has_bulk_prefill_form()
        self.steps: dict[tuple, tuple[Iteration, Prefill]] = {}

    def price(self, batch_size: int, chunks: tuple[tuple[int, int], ...], samples: int) -> tuple[Iteration, Prefill]:
        key = (batch_size, chunks, samples)
        hit = self.steps.get(key)
        if hit is not None:
            return hit
        L, stages = self.layers, self.stages
        new = 0
        for n, _ in chunks:
            new += n
        attn_s, approx_s, forms = self._attention(chunks)
        if batch_size:
            base = self.iteration(batch_size)
            added = (
                L * (self._dense(batch_size + new) - self._dense(batch_size))
                + self._lm_head(batch_size + samples)
                - self._lm_head(batch_size)
                + (stages - 1) * (self._hop(batch_size + new) - self._hop(batch_size))
            )
        else:
            base = _NO_DECODE
            added = (
                L * self._dense(new)
                + (self._lm_head(samples) if samples else 0.0)
                + (stages - 1) * self._hop(new)
                + self.serial_s
            )
        added += L * attn_s + self._encode(new)
        out = (base.with_decode_fixed_added(added), Prefill(added, added, L * approx_s, self._encode(new), forms))
        if len(self.steps) >= STEP_MEMO_ENTRIES:
            self.steps.clear()
        self.steps[key] = out
        return out

    def _attention(self, chunks: tuple[tuple[int, int], ...]) -> tuple[float, float, tuple[str, ...]]:
        cost = self.cost
        if len(chunks) == 1:
            one = chunks[0]
            if self.bulk_chunks:
                table = self.chunk_tables.get(one[1])
                if table is not None:
                    return self._tabled_chunk(table, one[0], one[1])
            c = self.one_chunk.get(one)
            if c is None:
                if len(self.one_chunk) >= CHUNKS_MEMO_ENTRIES:
                    self.one_chunk.clear()
                n, past = one
                c = self.one_chunk[one] = cost.prefill_attention_s((past + n,), (past,))
                if self.bulk_chunks:
                    misses = self.chunk_misses.get(past, 0) + 1
                    self.chunk_misses[past] = misses
                    if misses >= CHUNK_BLOCK_AFTER:  # this many earlier tokens come back: a table for them
                        if len(self.chunk_tables) >= CHUNK_TABLES:
                            self.chunk_tables.clear()
                        self.chunk_tables[past] = array("d")
            return c
        c = self.chunk_sets.get(chunks)
        if c is None:
            if len(self.chunk_sets) >= CHUNKS_MEMO_ENTRIES:
                self.chunk_sets.clear()
            c = self.chunk_sets[chunks] = cost.prefill_attention_s(
                tuple([past + n for n, past in chunks]), tuple([past for _, past in chunks])
            )
        return c

    def _tabled_chunk(self, table: array, n: int, past: int) -> tuple[float, float, tuple[str, ...]]:
        """One chunk of n new tokens after `past` from the table of its earlier tokens, its block priced at once
        (ReplicaCostModel.one_chunk_attention_block) the first time one of its lengths is asked."""
        i = 3 * n
        if i >= len(table):
            table.extend(array("d", [_NAN]) * (3 * (n - n % CHUNK_BLOCK + CHUNK_BLOCK) - len(table)))
        t = table[i]
        if t != t:
            lo = n - n % CHUNK_BLOCK
            block = self.cost.one_chunk_attention_block(past, lo, lo + CHUNK_BLOCK)
            assert block is not None  # the method has a bulk form (bulk_chunks)
            rows = array("d")
            rows.frombytes(block.tobytes())
            table[3 * lo : 3 * (lo + CHUNK_BLOCK)] = rows
            t = table[i]
        return t, table[i + 1], _ONE_FORM[int(table[i + 2])]

    def iteration(self, batch_size: int) -> Iteration:
        """`cost.iteration(batch_size)` as an `Iteration`, made once per batch size."""
        table = self.iterations
        if batch_size >= len(table):
            table.extend([None] * (batch_size + 1 - len(table)))
        it = table[batch_size]
        if it is None:
            it = table[batch_size] = iteration_of(self.cost.iteration(batch_size))
        return it

    def _dense(self, rows: int) -> float:
        table = self.dense
        if rows >= len(table):
            _grow(table, rows)
        v = table[rows]
        if v != v:  # its block from the cost model's table at once
            lo = rows - rows % CHUNK_BLOCK
            if lo + CHUNK_BLOCK > len(table):
                _grow(table, lo + CHUNK_BLOCK - 1)
            table[lo : lo + CHUNK_BLOCK] = self.cost.dense_layer_block(lo, lo + CHUNK_BLOCK).tolist()
            v = table[rows]
        return v

    def _hop(self, rows: int) -> float:
        if self.stages == 1:
            return 0.0  # _stage_hop_s without pipeline stages
        table = self.hop
        if rows >= len(table):
            _grow(table, rows)
        v = table[rows]
        if v != v:
            v = table[rows] = self.cost._stage_hop_s(rows)
        return v

    def _lm_head(self, rows: int) -> float:
        table = self.lm_head
        if rows >= len(table):
            _grow(table, rows)
        v = table[rows]
        if v != v:
            v = table[rows] = self.cost._lm_head_rows_s(rows)
        return v

    def _encode(self, tokens: int) -> float:
        table = self.encode
        if tokens >= len(table):
            _grow(table, tokens)
        v = table[tokens]
        if v != v:  # its block priced at once (numpy: the same doubles as _chunks_encode_s)
            lo = tokens - tokens % CHUNK_BLOCK
            if lo + CHUNK_BLOCK > len(table):
                _grow(table, lo + CHUNK_BLOCK - 1)
            table[lo : lo + CHUNK_BLOCK] = self.cost.chunks_encode_block(lo, lo + CHUNK_BLOCK).tolist()
            v = table[tokens]
        return v


class PrefillPrices:
    """One cost model's one-prompt prefill batches (a prompt without a cached prefix: most batches at moderate load)
    read from the cost model's own table by length (`ReplicaCostModel._one_prompt_prefill`: four times and the
    form's code per length, NaN until priced) in compiled code: a length priced before is a few reads and its
    `Prefill`, not the interpreted `prefill` call (~9.6 k instructions); a new one is the cost model's. Nothing
    is kept per length here (a price kept per length held ~190 bytes per request while new lengths came)."""

    def __init__(self, cost: ReplicaCostModel):
        self.cost = cost
        self.table: array = array("d")  # the cost model's table, fetched again after it prices (it may grow)

    def one_prompt(self, tokens: int) -> Prefill:
        table = self.table
        i = tokens * _FIELDS
        if i < len(table):
            stage_s: float = table[i]  # typed: compiled, unboxed once and compared in C
            if stage_s == stage_s:  # priced
                form: float = table[i + 4]
                return Prefill(stage_s, table[i + 1], table[i + 2], table[i + 3], _ONE_FORM[int(form)])
        c = self.cost.prefill((tokens,))
        grown = self.cost._memo.get("one_prompt")
        if grown is not None:
            self.table = grown
        return prefill_of(c)


def _grow(table: list[float], index: int) -> None:
    """Room for `index` in a table of prices by count, NaN where not asked yet (doubling)."""
    table.extend([_NAN] * (max(index + 1, 2 * len(table)) - len(table)))
