"""Continuous batching under a per-step token budget, chunked prefill, preemption by recompute.

When a running sequence needs a page and none is left, the newest running sequence of the
tenant (cache salt) with the most running is preempted: its pages are released (full ones
stay in the prefix cache, so it usually gets them back) and it re-prefills prompt +
generated tokens when readmitted at the head of its tenant's queue.

Priority (`Sequence.priority`, lower first: 0 interactive, 1 batch work): a step runs only
the most urgent priority present, running or waiting, so batch work fills the steps
interactive work leaves idle and pauses (keeping its pages) while any interactive request is
in; running batch sequences are the first preempted when pages run out, and an interactive
request that finds no free slot or pages preempts batch work to get in. An interactive
request so waits at most the step under way, never behind a batch.

Admission keeps pages in reserve (as vLLM's watermark): a waiting request gets in only if,
after its pages, enough stay free for every running request to grow `kv_reserve_tokens`
more tokens (capped by its max_tokens) plus `kv_watermark` of the pool. Admitting into the
last free pages only lends them: the running requests need them a few steps later and one
of them is preempted and recomputed (213 preemptions for 192 ShareGPT requests in
bench/kv_utilization.py without the reserve, mostly in the first steps, when every request
is growing and none has finished yet). With nothing running there is no reserve, so a
request that fits always gets in.
"""

import math
from collections import Counter, deque

from engine.batch import SeqChunk
from engine.config import EngineConfig
from engine.errors import QueueFullError
from engine.kv.kv_manager import KVManager
from engine.logits_process import History
from engine.metrics import EngineMetrics
from engine.sequence import SeqStatus, Sequence

Scheduled = list[tuple[Sequence, SeqChunk]]


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVManager, metrics: EngineMetrics) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_batched_tokens = config.max_num_batched_tokens
        self.max_waiting = config.max_waiting
        self.kv = kv
        self.metrics = metrics
        if not 0 <= config.kv_watermark < 1 or config.kv_reserve_tokens < 0:
            raise ValueError("kv_watermark must be in [0, 1) and kv_reserve_tokens >= 0")
        self.watermark_pages = math.ceil(config.kv_watermark * kv.pool.num_pages)
        self.reserve_tokens = config.kv_reserve_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # per-step state of schedule()
        self._out: dict[int, tuple[Sequence, SeqChunk]] = {}  # seq_id -> its chunk
        self._budget = 0  # tokens left this step
        self._preempted = False

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise QueueFullError(f"waiting queue is full ({self.max_waiting} requests)")
        self.waiting.append(seq)

    def schedule(self) -> Scheduled:
        """Pick this step's chunks; the caller runs them, then calls on_executed().

        Decodes go first (one token each, so a long prefill never stalls streaming requests),
        then the next prefill chunks of running requests, then waiting requests while the token
        budget, max_num_seqs and free pages allow: in arrival order within a tenant, the
        tenant with the fewest running first (`_next_waiting`). Only the most urgent priority
        present takes part: batch work waits for steps without interactive requests.
        """
        self._out = {}
        self._budget = self.max_batched_tokens
        self._preempted = False
        remaining = {s.seq_id: s.num_tokens - s.num_computed_tokens for s in self.running}
        decodes = [s for s in self.running if remaining[s.seq_id] == 1]
        prefills = [s for s in self.running if remaining[s.seq_id] > 1]
        urgent = min((s.priority for s in (*self.running, *self.waiting)), default=0)
        for seq in decodes + prefills:
            if self._budget <= 0:
                break
            if seq.status is not SeqStatus.RUNNING or seq.priority > urgent:
                continue  # preempted to make room for an older request, or batch work paused
            n = min(remaining[seq.seq_id], self._budget)
            if self._reserve(seq, n):
                self._schedule(seq, n)
        if not self._preempted:  # pages are short: admitting more would only thrash
            self._admit(urgent)
        return list(self._out.values())

    def _schedule(self, seq: Sequence, n: int) -> None:
        self._out[seq.seq_id] = (seq, self._chunk(seq, n))
        self._budget -= n

    def _reserve(self, seq: Sequence, n: int) -> bool:
        """Make room for n more tokens of seq, preempting the newest requests if needed."""
        while not self.kv.allocate(seq, n):
            victim = self._victim()
            self.running.remove(victim)
            dropped = self._out.pop(victim.seq_id, None)  # its pages are about to go
            if dropped is not None:
                self._budget += len(dropped[1].token_ids)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _victim(self) -> Sequence:
        """Among the least urgent running requests (batch work first), the newest of the
        tenant (cache salt) with the most running: the one that just got in behind another
        tenant's many is not the first to go."""
        lowest = max(s.priority for s in self.running)
        pool = [s for s in self.running if s.priority == lowest]
        running = Counter(s.cache_salt for s in pool)
        most = max(running.values())
        return next(s for s in reversed(pool) if running[s.cache_salt] == most)

    def _make_room(self, seq: Sequence) -> bool:
        """Preempt the newest running request less urgent than `seq` (batch work for an
        interactive one); False when there is none."""
        victim = next((s for s in reversed(self.running) if s.priority > seq.priority), None)
        if victim is None:
            return False
        self.running.remove(victim)
        dropped = self._out.pop(victim.seq_id, None)
        if dropped is not None:
            self._budget += len(dropped[1].token_ids)
        self._preempt(victim)
        return True

    def _admit(self, urgent: int) -> None:
        deferred: set[int] = set()  # seq_ids whose prefix pages are still being computed
        running = Counter(s.cache_salt for s in self.running)
        while self._budget > 0:
            seq = self._next_waiting(running, deferred)
            if seq is None or seq.priority > urgent:
                break
            if len(self.running) >= self.max_num_seqs and not self._make_room(seq):
                break
            hit = self.kv.lookup(seq)
            if hit.next_in_flight:  # wait a step or two, then reuse those pages
                deferred.add(seq.seq_id)
                continue
            n = min(seq.num_tokens - hit.num_tokens, self._budget)
            if not self.kv.allocate(seq, n, hit, self._reserve_pages()):
                if self._make_room(seq):  # batch work gave its pages back: try again
                    running = Counter(s.cache_salt for s in self.running)
                    continue
                break  # pages are short: whoever comes next waits too
            self.waiting.remove(seq)
            self._on_admitted(seq, hit.num_tokens)
            self.running.append(seq)
            running[seq.cache_salt] += 1
            self._schedule(seq, n)

    def _reserve_pages(self) -> int:
        """Pages an admission must leave free: the watermark plus the pages each running
        request needs for its next kv_reserve_tokens tokens (the rest of its prompt, then
        output, never beyond its max_tokens); none when nothing runs."""
        if not self.running:
            return 0
        ahead = self.reserve_tokens
        growth = sum(
            self.kv.pages_to_grow(s, min(s.num_tokens + ahead, s.num_prompt_tokens + s.max_tokens))
            for s in self.running
        )
        return self.watermark_pages + growth

    def _next_waiting(self, running: Counter, deferred: set[int]) -> Sequence | None:
        """The most urgent priority waiting, and within it the oldest waiting request of the
        tenant (cache salt) with the fewest running.

        Across tenants the queue is fair, within one it is first come, first served: one
        tenant's hundred waiting requests never sit ahead of another tenant's one.
        """
        ready = [s for s in self.waiting if s.seq_id not in deferred]
        if not ready:
            return None
        urgent = min(s.priority for s in ready)
        ready = [s for s in ready if s.priority == urgent]
        salts = len({s.cache_salt for s in ready})  # the scan stops once it saw each
        best: Sequence | None = None
        seen: set[str | None] = set()
        for seq in ready:
            if seq.cache_salt in seen:
                continue
            seen.add(seq.cache_salt)
            if best is None or running[seq.cache_salt] < running[best.cache_salt]:
                best = seq
                if running[seq.cache_salt] == 0:  # nobody comes before a tenant with none
                    break
            if len(seen) == salts:  # every tenant's oldest is in view: the rest are younger
                break
        return best

    def _on_admitted(self, seq: Sequence, num_cached: int) -> None:
        seq.status = SeqStatus.RUNNING
        if self.kv.enable_prefix_caching:
            self.metrics.on_prefix_lookup(seq.num_tokens, num_cached)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
            self.metrics.on_prompt(seq.num_prompt_tokens)

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self._preempted = True
        self.metrics.on_preemption()

    def _chunk(self, seq: Sequence, n: int) -> SeqChunk:
        start = seq.num_computed_tokens
        sample = start + n == seq.num_tokens
        # the live token list: read at sampling time, before this step's token is appended
        history = History(seq.token_ids, seq.num_prompt_tokens)
        return SeqChunk(
            seq_id=seq.seq_id,
            token_ids=seq.token_ids[start : start + n],
            start_pos=start,
            page_table=self.kv.page_table(seq),
            sample=sample,
            params=seq.params,
            generator=seq.generator,
            history=history if sample and seq.params.needs_history else None,
            grammar=seq.grammar if sample else None,
        )

    def on_executed(self, scheduled: Scheduled) -> None:
        """The runner computed the chunks: advance each sequence and publish full pages."""
        for seq, chunk in scheduled:
            seq.num_computed_tokens += len(chunk.token_ids)
            self.kv.on_computed(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a sequence from the queues and free its pages at once."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
