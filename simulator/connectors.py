"""Where a prefilled request's KV waits until its decode replica takes it, as vLLM's KV connectors hold it
(`network.kv_connector`).

Sources: vLLM (github.com/vllm-project/vllm), `vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`,
`p2p/p2p_nccl_connector.py`, `p2p/p2p_nccl_engine.py`, `p2p/tensor_memory_pool.py`, `lmcache_connector.py`,
`docs/design/p2p_nccl_connector.md` (v0.9.2 docs, the design is unchanged since), `docs/features/
nixl_connector_usage.md`, `docs/features/disagg_prefill.md`, and the xPyD proxy `examples/online_serving/
disaggregated_serving_p2p_nccl_xpyd/disagg_proxy_p2p_nccl_xpyd.py` (main of 2025-2026, read for this module).

* `host_parked` (the default; what realrun does, realrun/harness.py, and roughly LMCache's offload, where
  `request_finished` frees the prefill GPU's blocks once the KV is saved to a CPU or remote store and the decode
  side retrieves it from there): the KV waits in the prefill host's memory (`prefill.host_memory_gib`, the
  request's wire bytes from its first prefill step until its transfer has ended); a new prompt starts only
  while its KV fits beside what is parked there (back-pressure). The decode replica admits the request (its
  memory) before the transfer starts (simulator/router.py).
* `nixl_pull` (NixlConnector, vLLM's default P/D connector): the prefill instance finishes the request with
  its blocks still allocated (`request_finished` returns `delay_free_blocks = True` and files the request in
  `_reqs_need_send` with a deadline `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`); the decode instance's scheduler
  allocates the request's blocks when it schedules it (`get_num_new_matched_tokens` returns the prompt's
  tokens as loaded asynchronously, `update_state_after_alloc` files them to read) and its worker reads them
  from the prefill GPU (NIXL READ); the prefill frees them when notified that the read is done. So the KV
  waits in the prefill GPU's KV pool: the request's prompt blocks (`kv_memory_bytes(prompt)` of the prefill
  cost model) are held from its first step until its transfer has ended, and a new prompt starts only while
  its blocks fit in the pool (`kv_capacity_bytes`) beside them: the waiting KV blocks the prefill instance's
  new prefills when its pool is full. A prefix cache in that pool keeps only what they leave free. Not
  modelled: the abort timeout (480 s by default), after which vLLM frees blocks never read.
* `p2p_push` (P2pNcclConnector, `send_type` PUT_ASYNC, its default): the proxy picks the decode instance
  round robin (`decode_list[count % len(decode_list)]`), sends the request to the prefill instance with
  `max_tokens` 1, and only after that response forwards it to the decode instance. The prefill worker
  extracts each layer's KV (`save_kv_layer`) into a send queue that a thread pushes over NCCL at once, and
  `wait_for_save` (`wait_for_sent`) holds the step until the queue is empty; the prefill's blocks are freed
  at `request_finished`. So nothing waits on the prefill side, but a prefill step waits for the push of the
  KV it produced (here: a replica starts no new step while KV of its earlier steps is being pushed). The
  decode instance's listener receives each tensor into a GPU buffer of `kv_buffer_size` bytes
  (`network.kv_buffer_gib`, vLLM's default 1e9 bytes), taken out of the KV pool ("if it is too large, it will
  reduce the KVCache space available for normal inference"); when the buffer is full the tensor goes to a
  pinned host memory pool (`TensorMemoryPool`, `mem_pool_size_gb`, default 32: `network.p2p_pool_gib`),
  and is copied back to the GPU when loaded (priced as the replica's PCIe copy, `ReplicaCostModel.swap_s`).
  The request then waits in that decode replica's queue for decode memory, FIFO; when admitted, its KV
  leaves the buffer or pool. The pool allocator raises "Insufficient memory" when full (the engine's
  listener does not catch it): a run where pushed KV overflows the pool stops with an error naming the field.
  Not modelled: the pool's power-of-two block rounding; the first token waiting for `wait_for_save` (the
  simulator's first token is the forward's end); data-parallel decode engines, faults, prefix caching and a
  pipeline-parallel prefill (each stage's worker waits for its own layers' pushes) with this connector (refused).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .config import ScenarioError
from .timers import call_in

if TYPE_CHECKING:
    from .decode import DecodeReplica
    from .router import Router

CONNECTORS = ("host_parked", "nixl_pull", "p2p_push")
P2P_BUFFER_BYTES = 1e9  # vLLM KVTransferConfig.kv_buffer_size default
P2P_POOL_GIB = 32.0  # p2p_nccl_engine.DEFAULT_MEM_POOL_SIZE_GB


class P2PPush:
    """The decode side of `p2p_push`: KV pushed into each decode replica's GPU buffer (then its host pool),
    waiting there, FIFO per replica, for decode memory."""

    def __init__(self, router: Router, buffer_bytes: float, pool_bytes: float, source: str):
        self.router = router
        self.buffer_bytes = buffer_bytes
        self.pool_bytes = pool_bytes
        self.source = source
        n = len(router.decode)
        self.count = 0  # the proxy's round-robin counter
        self.waiting: list[deque[int]] = [deque() for _ in range(n)]  # KV landed, waiting for decode memory
        self.buffer_used = [0.0] * n
        self.pool_used = [0.0] * n
        self.in_pool: set[int] = set()

    def push(self, rid: int) -> None:
        """The request's KV is ready (or, with streamed layers, being produced): push it to the next decode
        replica in round-robin order that the prefill replica reaches."""
        r = self.router
        p = r.rec.prefill_replica[rid]
        routes = r.routes[p]
        rep, _link = routes[self.count % len(routes)]
        self.count += 1
        r.prefill[p].hold_pushed(rid)
        r._transfer(rid, p, rep, arrive=self.landed)

    def landed(self, rid: int, rep: DecodeReplica) -> None:
        """The push has ended: the KV sits in the replica's GPU buffer, or its host pool when the buffer is full."""
        d, bytes_ = rep.index, self.router.rec.wire_bytes[rid]
        if self.buffer_used[d] + bytes_ <= self.buffer_bytes:
            self.buffer_used[d] += bytes_
        elif self.pool_used[d] + bytes_ <= self.pool_bytes:
            self.pool_used[d] += bytes_
            self.in_pool.add(rid)
        else:
            raise ScenarioError(
                f"{self.source}: network.p2p_pool_gib: KV pushed to decode replica {d} overflows its host pool "
                f"({self.pool_bytes / 2**30:.2f} GiB) at t={rep.env.now:.3f} s (vLLM's pool raises 'Insufficient "
                f"memory' there); give a larger pool or buffer"
            )
        self.waiting[d].append(rid)
        self.try_admit()

    def try_admit(self) -> None:
        rec = self.router.rec
        for rep, queue in zip(self.router.decode, self.waiting):
            while queue:
                rid = queue[0]
                need, host = rec.admit_bytes[rid], rec.host_kv_bytes[rid]
                if not rep.has_room(need, host):
                    break
                queue.popleft()
                rep.reserve(need, host)
                bytes_ = rec.wire_bytes[rid]
                if rid in self.in_pool:  # copied back to the GPU over PCIe before it can join
                    self.in_pool.discard(rid)
                    self.pool_used[rep.index] -= bytes_
                    call_in(rep.env, rep.cost.swap_s(bytes_), lambda _e, r=rid, rep=rep: rep.arrive(r))
                else:
                    self.buffer_used[rep.index] -= bytes_
                    rep.arrive(rid)
