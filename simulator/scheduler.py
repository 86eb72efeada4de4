"""vLLM v1's step scheduler on an engine replica: decode rows, then chunks of partly computed requests, then
waiting requests first come first served, within a step's token budget and the running-request limit.

Followed: vllm-project/vllm `vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule()` and `_preempt_request()`
(read at commit 00024d31; the same rules since v0.8, through the v0.10 and v0.11 releases), with the KV
blocks of `vllm/v1/core/kv_cache_manager.py` and `vllm/v1/core/block_pool.py`. vLLM has no prefill or decode
phase: each step gives each request tokens until its computed tokens catch up with its tokens.

1. Running requests first, in the order they started running: a decode row takes 1 token; a request whose
   prompt (or recompute) is partly computed takes its next chunk, min(tokens left, `chunk_tokens` (vLLM's
   long_prefill_token_threshold), budget left). Each allocates the KV blocks its new tokens need; when a
   block is not free the newest running request is preempted (`self.running.pop()`), again until it fits or
   the request itself is the one popped. The budget is `max_batch_tokens` (max_num_batched_tokens).
2. Then, only if no request was preempted in this step, waiting requests in order while budget is left and
   fewer than `max_batch_requests` (max_num_seqs) run: a prompt looks up the prefix cache (at most its
   tokens − 1 hit, `max_cache_hit_length`), takes min(tokens left, chunk_tokens, budget left) and allocates
   their blocks; the first that cannot allocate stops the loop (it keeps its place).
3. A preempted request frees its blocks (into the prefix cache where it is on, tail blocks first:
   `KVCacheManager.free` frees in reverse order, and a freed block keeps its hash until an allocation evicts
   it, least recently freed first) and goes back to the head of `waiting` (`prepend_request`) with none of
   its tokens computed. When it is scheduled again it is a waiting request like any other: it hits what of
   its blocks is still cached and recomputes the rest, as chunks inside ordinary steps. The chunk that
   completes its tokens yields its next output token (as a decode row would have), and a prompt's last
   chunk its first token.
Without `chunk_tokens` (vLLM with chunked prefill off) a prompt or a recompute is never split: the waiting
loop stops at one that does not fit the budget left, except that one alone in a step runs whole (vLLM then
raises the budget to the model length).

Where this simplifies vLLM, and why it is exact without `chunk_tokens`: the decode rows are taken before the
partly computed requests. A request enters `running` at the tail, and while its prompt is unfinished it
takes the whole budget left, so nothing enters behind it; at most one request is ever partly computed, at
the tail, and the decode rows are all ahead of it. With `chunk_tokens` several can be partly computed and a
short prompt that finished first can stand behind a long one still in chunks: vLLM would then skip such a
decode row in a step whose budget the chunks spent, where here decode rows always run (a step's chunks take
what they leave). Requests whose KV has been transferred (a disaggregated decode instance) join as waiting
requests of one token, in arrival order, after the preempted ones; their blocks were allocated when their
transfer was admitted (vLLM's connector pulls KV into blocks allocated for it), so they join even while a
preempted request at the head waits for room.

Events: a step that carries chunks is one event (its price: `ReplicaCostModel.mixed_step`, every row in one
forward pass); between such steps the decode rows advance in closed form (simulator/decode.py), one event
per change of the batch, so a replica without prompts or preempted requests runs as before. The time
recompute chunks add to a step counts as preemption for the decode rows in it, prompt chunks' as decode (in
proportion to their tokens where a step has both); a preempted request's own time until it decodes again
is preemption. Swapped requests (`decode.preemption: swap`, which vLLM v1 does not have) come back the
same way from `waiting`, their KV copied back over PCIe while the batch waits, as before.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from costmodel.phases import ReplicaCostModel

from .columns import PREEMPTION
from .decode import Steps
from .step_price import Iteration, Prefill, StepPrices
from .timers import call_in

if TYPE_CHECKING:
    from .columns import Records
    from .decode import DecodeReplica
    from .prefix_cache import EngineCache


class Job:
    """A request whose tokens this replica computes in chunks: a colocated prompt (`first`), or a preempted
    request coming back (by recompute, or by swap when `swapped` bytes wait in host memory)."""

    __slots__ = ("rid", "target", "done", "held", "left", "first", "started", "lost", "t0", "cum0", "swapped")

    def __init__(self, rid: int, target: int, left: int, first: bool, t0: float = 0.0, cum0: tuple = ()):
        self.rid = rid
        self.target = target  # tokens to compute: the prompt, or a preempted request's prompt + outputs so far
        self.done = 0  # tokens whose KV is there (cache hits included)
        self.held = 0.0  # bytes of the replica's KV pool it holds
        self.left = left  # decode iterations after the token its last chunk yields
        self.first = first  # a prompt not yet prefilled (its last chunk yields the first token)
        self.started = False  # a prompt that has run a chunk here (preempted since)
        self.lost = 0  # tokens whose KV was computed before it was preempted
        self.t0 = t0  # when it was preempted
        self.cum0 = cum0  # the replica's running sums then
        self.swapped = 0.0  # bytes of its KV in host memory (swap)


class StepScheduler(Steps):
    """The waiting queue and the partly computed requests of one engine replica, and each step's chunks.

    `waiting` holds Jobs (prompts; preempted requests, at the head) and request ids (KV transferred here,
    waiting to join as decode rows). `partial` holds the running Jobs, in the order they started."""

    def __init__(
        self,
        replica: DecodeReplica,
        records: Records,
        budget_tokens: int,
        max_running: int,
        chunk_tokens: int | None,
        swap: bool,
        cache: EngineCache | None,
    ):
        self.rep = replica
        self.rec = records
        self.budget_tokens = budget_tokens  # max_batch_tokens
        self.max_running = max_running  # max_batch_requests
        self.chunk_tokens = chunk_tokens  # None: chunked prefill off
        self.swap = swap
        self.cache = cache
        self.waiting: deque = deque()
        self.resumes = 0  # preempted requests among `waiting` (the router admits nothing new meanwhile)
        self.partial: list[Job] = []
        self.step: list[tuple[Job, int]] = []  # this step's chunks: (job, new tokens)
        self.share: Prefill | None = None  # the running step's chunk share
        self.ready: list[Job] = []  # finished their tokens in the last step: decode rows from the next
        self.retry = False  # a request was preempted this step and others wait: the next step looks again
        self.outstanding_tokens = 0  # prompt tokens queued or being prefilled here (the colocated router's load)
        self.busy_s = 0.0  # Σ prompt chunks' share of the replica's time (prefill utilisation)
        self._kv_memo: dict[int, float] = {}  # tokens -> the replica's KV bytes for them (_kv_bytes)
        self._prices: dict[ReplicaCostModel, StepPrices] = {}  # a step's price per cost model (cost)

    def _kv_bytes(self, tokens: int) -> float:
        """`ReplicaCostModel.kv_memory_bytes(tokens)` of the replica, priced once per token count (a step asks for
        every chunk's)."""
        b = self._kv_memo.get(tokens)
        if b is None:
            b = self._kv_memo[tokens] = self.rep.cost.kv_memory_bytes(tokens)
        return b

    # ---- what enters ----------------------------------------------------------------------------
    def enqueue_prompt(self, rid: int) -> None:
        """A colocated prompt arrives (the router wakes the replica once every arrival of the instant is queued)."""
        rec = self.rec
        self.waiting.append(Job(rid, rec.prompt[rid], rec.decode_iterations[rid], True))
        self.outstanding_tokens += rec.prompt[rid]

    def arrived(self, rid: int) -> None:
        """A request's transferred KV is here: it joins as a waiting request of one token. With nothing waiting
        or partly computed before it, it joins the next step's decode rows directly (compose puts it back in
        line if that step preempts)."""
        if self.waiting or self.partial:
            self.waiting.append(rid)
        else:
            self.rep.joining.append(rid)
        self.rep.wake()

    @property
    def pending(self) -> bool:
        """Requests wait here for a step (the replica may be idle)."""
        return bool(self.waiting or self.partial or self.ready)

    # ---- a step ---------------------------------------------------------------------------------
    def compose(self, k: int) -> float:
        """At the start of replica iteration k: the step's decode rows, their blocks (preempting while they do
        not fit), the partly computed requests' chunks, then waiting requests. Sets `step` (the chunks) and
        moves scheduled joiners to the replica's `joining`; returns the stall the step carries (swap copies)."""
        rep = self.rep
        if self.ready:
            rep.join_ready(self.ready)
            self.ready = []
        stall = 0.0
        preempted = False
        blocks = rep.blocks
        if blocks is not None:
            need = blocks.counts[k % blocks.bt]
            if need:
                free = blocks.free_blocks()
                while need > free:
                    preempted = True
                    if self.partial:
                        job = self.partial[-1]
                        free += int(job.held // blocks.block_bytes)
                        self._preempt_job(job)
                        continue
                    rid = blocks.newest()
                    if blocks.phase(rid) == k % blocks.bt:
                        need -= 1
                    held = blocks.held_bytes(rid, k - 1)
                    free += int(held // blocks.block_bytes)
                    stall += self._preempt_row(rid, k, held)
                rep.reserved_bytes += need * blocks.block_bytes
        if preempted and rep.joining:  # joiners wait behind the preempted: none is scheduled in this step
            self.waiting.extend(rep.joining)
            rep.joining = []
        budget = self.budget_tokens - rep.batch - len(rep.joining)
        self.step = []
        i = 0
        while i < len(self.partial) and budget > 0:
            job = self.partial[i]
            n = self._chunk(job.target - job.done, budget, alone=not self.step)
            if not n:
                break
            grown = self._grow(job, job.done + n)
            if grown < 0:  # it was the newest left: preempted itself
                preempted = True
                break
            preempted = preempted or grown > 0
            self.step.append((job, n))
            budget -= n
            i += 1
        had = self.resumes
        if self.waiting and budget > 0 and (not preempted or (not rep.batch and not self.step)):
            stall += self._take_waiting(k, budget)
        if had and not self.resumes and rep.listener is not None:  # the router may admit again
            listener = rep.listener
            call_in(rep.env, 0, lambda _e: listener.on_memory_freed())
        self.retry = preempted and bool(self.waiting)
        rep.trim_cache()
        return stall

    def _chunk(self, left: int, budget: int, alone: bool) -> int:
        """Tokens of a request with `left` to compute that this step gives it (0: none)."""
        if self.chunk_tokens is None:  # never split: whole if it fits, or alone in the step
            return left if left <= budget or alone else 0
        return min(left, self.chunk_tokens, budget)

    def _grow(self, job: Job, tokens: int) -> int:
        """Allocate the job's blocks for `tokens` computed tokens, preempting newer jobs while they do not
        fit: the number of jobs preempted, or -1 if the job itself had to go."""
        rep = self.rep
        if rep.blocks is None:  # reserve admission: its final KV was reserved when it started
            return 0
        need = self._kv_bytes(tokens) - job.held
        gone = 0
        while rep.reserved_bytes + need > rep.capacity_bytes:
            victim = self.partial[-1]
            self._preempt_job(victim)
            if victim is job:
                return -1
            gone += 1
        rep.reserved_bytes += need
        job.held += need
        return gone

    def _take_waiting(self, k: int, budget: int) -> float:
        """Waiting requests, in order, while budget is left and fewer than max_batch_requests run."""
        rep, rec, waiting, cache = self.rep, self.rec, self.waiting, self.cache
        stall = 0.0
        blocked = False  # a preempted request or a prompt at the head found no room: only joiners go on
        skipped: list[Job] = []
        while waiting and budget > 0:
            e = waiting[0]
            if type(e) is int:  # KV transferred: a decode row from this step (its blocks are allocated)
                waiting.popleft()
                rep.joining.append(e)
                budget -= 1
                continue
            job: Job = e
            if blocked:
                skipped.append(waiting.popleft())
                continue
            if job.swapped:  # swap: its KV comes back over PCIe and it decodes in this step
                need = self._kv_bytes(job.target)
                if rep.reserved_bytes + need > rep.capacity_bytes:
                    blocked = True
                    continue
                waiting.popleft()
                self.resumes -= 1
                rep.reserved_bytes += need
                rep.host_reserved_bytes -= job.swapped
                stall += rep.cost.swap_s(job.swapped)
                rep.rejoin(job, k, need)
                budget -= 1
                continue
            if job.first and rep.slots_used >= self.max_running:
                blocked = True
                continue
            host = rec.host_kv_bytes[job.rid] if job.first else 0.0
            if host and rep.host_reserved_bytes + host > rep.host_capacity_bytes:
                blocked = True
                continue
            hit = cache.peek(job.rid, job.target) if cache is not None else 0
            n = self._chunk(job.target - hit, budget, alone=not self.step)
            if rep.blocks is None:  # reserve admission: the final KV, when a prompt starts
                need = rec.admit_bytes[job.rid] if job.first else 0.0
            else:
                need = self._kv_bytes(hit + n)
            if not n or rep.reserved_bytes + need > rep.capacity_bytes:
                blocked = True
                continue
            waiting.popleft()
            if cache is not None:
                cache.take(job.rid, hit, job.first and not job.started)
            if job.first:
                rep.reserve(need, host)
                if not job.started:
                    job.started = True
                    rec.prefill_start[job.rid] = rep.env._now
                    rec.prefill_replica[job.rid] = rec.decode_replica[job.rid] = rep.index
                    rec.approx_prefill[job.rid] = 0.0
            else:
                self.resumes -= 1
                rep.reserved_bytes += need
            rec.recomputed[job.rid] += max(0, job.lost - hit)
            job.done, job.held = hit, need
            self.partial.append(job)
            self.step.append((job, n))
            budget -= n
        if skipped:
            waiting.extendleft(reversed(skipped))
        return stall

    def cost(self) -> Iteration:
        """This step's price: the replica's decode rows with the chunks (ReplicaCostModel.mixed_step, from the
        replica's cost model's typed tables: simulator/step_price.py)."""
        cost = self.rep.cost
        prices = self._prices.get(cost)
        if prices is None:  # the replica's cost model changes with its host's level (network.link_busy_host_factor)
            prices = self._prices[cost] = StepPrices(cost)
        samples = 0
        chunks: list[tuple[int, int]] = []
        for job, n in self.step:
            if job.done + n == job.target:
                samples += 1
            chunks.append((n, job.done))
        it, self.share = prices.price(self.rep.batch, tuple(chunks), samples)
        return it

    def after_step(self) -> None:
        """The step ran: its chunks advance; a request whose tokens are all computed yields its token, then
        decodes from the next step (or finishes, with that token its last)."""
        self.retry = False
        step, pc = self.step, self.share
        if not step:
            return
        self.step = []
        rep, rec = self.rep, self.rec
        assert pc is not None
        tokens = sum(n for _, n in step)
        recompute = sum(n for job, n in step if not job.first)
        if recompute:  # the decode rows waited for the recompute chunks: preemption, not decode
            moved = pc.latency_s * recompute / tokens
            rep.cum[0] -= moved
            rep.cum[PREEMPTION] += moved
        if recompute < tokens:
            self.busy_s += pc.latency_s * (tokens - recompute) / tokens
        now = rep.env._now
        for job, n in step:
            rid = job.rid
            if job.first:
                rec.approx_prefill[rid] += pc.approximation_s
            job.done += n
            if job.done < job.target:
                continue
            self.partial.remove(job)
            if self.cache is not None:
                self.cache.computed(rid, job.target)
            if job.first:
                self.outstanding_tokens -= rec.prompt[rid]
                rec.prefill_end[rid] = rec.encode_end[rid] = now
                rec.prefill_form[rid] = pc.forms[0] if pc.forms else ""
                rec.transfer_start[rid] = rec.transfer_end[rid] = now
                if job.left == 0:
                    rec.finish_without_decode(rid)
                    rep.leave_without_decode(rid, job.held)
                    continue
            elif job.left == 0:  # the recompute's token was its last
                rep.finish_job(job)
                continue
            self.ready.append(job)

    # ---- preemption -------------------------------------------------------------------------------
    def _preempt_row(self, rid: int, k: int, held: float) -> float:
        """Preempt a decode row at iteration k: its blocks go (into the prefix cache), it waits at the head.
        Returns the stall it puts on the step (swap: the copy to host memory)."""
        rep = self.rep
        ctx, left = rep.remove_row(rid, k, held)
        # it had fed ctx - 1 tokens; its step k would have fed token ctx and yielded an output token, which
        # the chunk completing its recompute yields instead
        job = Job(rid, ctx, left - 1, False, rep.env._now, tuple(rep.cum))
        job.lost = ctx - 1
        self.rec.preemptions[rid] += 1
        stall = 0.0
        if self.swap and rep.host_reserved_bytes + held <= rep.host_capacity_bytes:
            job.swapped = held
            job.left = left  # back as a decode row at context ctx, its next step as planned
            rep.host_reserved_bytes += held
            stall = rep.cost.swap_s(held)
        elif self.cache is not None:
            self.cache.release(rid, ctx - 1, preempted=True)
        self.waiting.appendleft(job)
        self.resumes += 1
        return stall

    def _preempt_job(self, job: Job) -> None:
        """Preempt the newest partly computed request: its blocks go (into the prefix cache), it waits at the
        head with none of its tokens computed."""
        rep = self.rep
        self.partial.remove(job)
        self.step = [(j, n) for j, n in self.step if j is not job]
        rep.reserved_bytes -= job.held
        self.rec.preemptions[job.rid] += 1
        if self.cache is not None:
            self.cache.release(job.rid, job.done, preempted=True)
        if job.first:
            rep.slots_used -= 1  # a prompt not yet prefilled takes its slot again when it starts again
            rep.host_reserved_bytes -= self.rec.host_kv_bytes[job.rid]
        else:
            self.resumes += 1
        job.lost, job.done, job.held = job.done, 0, 0.0
        self.waiting.appendleft(job)

    # ---- faults -------------------------------------------------------------------------------------
    def take_prompts(self) -> list[int]:
        """The prompts waiting to be prefilled here (preempted ones included), taken out of the queue: the
        replica is going down and they can go elsewhere."""
        prompts = [e.rid for e in self.waiting if type(e) is not int and e.first]
        if prompts:
            self.waiting = deque(e for e in self.waiting if type(e) is int or not e.first)
        return prompts

    def fail(self) -> tuple[list[int], list[int]]:
        """The replica went down: returns the requests it held, as (those whose KV had arrived and waited to
        join; the partly computed, ready to decode and preempted ones); every queue is cleared."""
        arrived = [e for e in self.waiting if type(e) is int]
        held = [j.rid for j in self.partial] + [j.rid for j in self.ready]
        held += [e.rid for e in self.waiting if type(e) is not int]
        self.waiting.clear()
        self.partial, self.step, self.ready = [], [], []
        self.resumes, self.outstanding_tokens, self.retry = 0, 0, False
        return arrived, held
