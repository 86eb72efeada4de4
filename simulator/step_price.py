"""A mixed step's price (`ReplicaCostModel.mixed_step`) from typed tables per cost model: the colocated hot path.

An engine replica that runs prompt chunks beside its decode rows (simulator/scheduler.py) prices every step
that carries chunks, and about a third of those steps are new ones (their decode rows, chunks and samples seen
for the first time). `mixed_step` builds a new step's price from a dozen small Python calls; here the parts it
sums are kept in typed tables of this compiled module, each filled from the cost model's own function the first
time it is asked (the dense layers and the pipeline hop per row count, the LM head per row count, the chunks'
KV encoding per token count, the decode rows' iteration per batch size, the attention per chunk set), and a
new step is a few table reads and the same sums as `mixed_step`, in the same order, so the doubles are the same
(tests/test_colocated.py compares the two on random steps, bit for bit). The cost model stays the definition;
this module only remembers what it answered.
"""

from __future__ import annotations

from costmodel.phases import _NO_ITERATION, IterationCost, PrefillCost, ReplicaCostModel

STEP_MEMO_ENTRIES = 4096  # whole steps remembered per cost model (costmodel.phases.PREFILL_MEMO_ENTRIES)
CHUNKS_MEMO_ENTRIES = 1 << 15  # chunk sets' attention remembered (costmodel.phases.CHUNKS_MEMO_ENTRIES)
_NAN = float("nan")


class StepPrices:
    """One cost model's mixed steps: `price(batch_size, chunks, samples)` is `cost.mixed_step(...)`."""

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
        self.iterations: list[IterationCost | None] = []  # iteration(batch_size)
        # one chunk's attention by (new tokens, earlier tokens); several chunks' by the chunk tuple
        self.one_chunk: dict[tuple[int, int], tuple[float, float, tuple[str, ...]]] = {}
        self.chunk_sets: dict[tuple[tuple[int, int], ...], tuple[float, float, tuple[str, ...]]] = {}
        self.steps: dict[tuple, tuple[IterationCost, PrefillCost]] = {}

    def price(
        self, batch_size: int, chunks: tuple[tuple[int, int], ...], samples: int
    ) -> tuple[IterationCost, PrefillCost]:
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
            base = self._iteration(batch_size)
            added = (
                L * (self._dense(batch_size + new) - self._dense(batch_size))
                + self._lm_head(batch_size + samples)
                - self._lm_head(batch_size)
                + (stages - 1) * (self._hop(batch_size + new) - self._hop(batch_size))
            )
        else:
            base = _NO_ITERATION
            added = (
                L * self._dense(new)
                + (self._lm_head(samples) if samples else 0.0)
                + (stages - 1) * self._hop(new)
                + self.serial_s
            )
        added += L * attn_s + self._encode(new)
        out = (base.with_decode_fixed_added(added), PrefillCost(added, added, L * approx_s, self._encode(new), forms))
        if len(self.steps) >= STEP_MEMO_ENTRIES:
            self.steps.clear()
        self.steps[key] = out
        return out

    def _attention(self, chunks: tuple[tuple[int, int], ...]) -> tuple[float, float, tuple[str, ...]]:
        cost = self.cost
        if len(chunks) == 1:
            one = chunks[0]
            c = self.one_chunk.get(one)
            if c is None:
                if len(self.one_chunk) >= CHUNKS_MEMO_ENTRIES:
                    self.one_chunk.clear()
                n, past = one
                c = self.one_chunk[one] = cost.prefill_attention_s((past + n,), (past,))
            return c
        c = self.chunk_sets.get(chunks)
        if c is None:
            if len(self.chunk_sets) >= CHUNKS_MEMO_ENTRIES:
                self.chunk_sets.clear()
            c = self.chunk_sets[chunks] = cost.prefill_attention_s(
                tuple([past + n for n, past in chunks]), tuple([past for _, past in chunks])
            )
        return c

    def _iteration(self, batch_size: int) -> IterationCost:
        table = self.iterations
        if batch_size >= len(table):
            table.extend([None] * (batch_size + 1 - len(table)))
        it = table[batch_size]
        if it is None:
            it = table[batch_size] = self.cost.iteration(batch_size)
        return it

    def _dense(self, rows: int) -> float:
        table = self.dense
        if rows >= len(table):
            _grow(table, rows)
        v = table[rows]
        if v != v:
            v = table[rows] = self.cost._dense_layer_s(rows)
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
        if v != v:
            v = table[tokens] = self.cost._chunks_encode_s(tokens)
        return v


def _grow(table: list[float], index: int) -> None:
    """Room for `index` in a table of prices by count, NaN where not asked yet (doubling)."""
    table.extend([_NAN] * (max(index + 1, 2 * len(table)) - len(table)))
