"""A deterministic stand-in for the GPU worker that checks the step protocol and simulates the KV cache.

It keeps the same per-request mirrors as `pagedserve.services.gpu_worker.worker.Worker` (drop finished ids first, mirror
NewRequests, apply CachedRequest deltas after checking `num_computed_tokens`, sample for requests whose
computed + scheduled tokens reach the end of their known tokens), but raises `FakeWorkerError` on anything the
real worker would silently accept or crash on later.

The KV store is simulated slot by slot: computing position p of a request writes
`slot -> (token id, p, prefix hash of tokens[0..p])` into `block_ids[p // block_size] * block_size + p % block_size`;
before a request computes anything, every earlier position it attends to must hold exactly the content it expects.
So a prefix hit on the wrong block, a block handed to two live requests, or a block reused while still being read
all surface here as errors, whatever the scheduler's own bookkeeping says.

The next token is a function of the token history only (not of the req_id, the batch or the step), so a request's
outputs do not depend on how it was scheduled; a script can force a request's outputs for exact tests, and
`fixed_token` makes every unscripted output that one token.

Draft tokens (`StepInput.draft_token_ids`) are verified as a greedy target would: the drafts are computed (and
written to the KV slots) after the last known token, each position's next token is drawn from the history up to
it, drafts are accepted while they equal those tokens, and the mirror keeps only the accepted ones plus the token
drawn after them; its block table drops the blocks past its computed tokens (the scheduler frees the same tail);
rejected positions stay in their slots as stale KV that nothing may read.

This is the one fake worker of the suite: the scheduler's tests drive it step by step (`execute_step`), the engine
loop's tests through `tests.support.fake_worker_client`, which adds the gRPC client's faults around it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import ModelDescription, NewRequest, StepInput, StepOutput

ROOT_HASH = b"fake-worker-root"


class FakeWorkerError(RuntimeError):
    """The scheduler broke the step protocol or the KV-cache discipline."""


def extend_hash(prefix_hash: bytes, token_id: int) -> bytes:
    return hashlib.blake2b(prefix_hash + token_id.to_bytes(8, "little", signed=True), digest_size=12).digest()


def describe(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 256, vocab_size: int = 97,
             eos_token_id: int = 0) -> ModelDescription:
    return ModelDescription(model_name="fake", architecture="FakeForCausalLM", max_model_len=max_model_len,
                             vocab_size=vocab_size, num_kv_blocks=num_blocks, block_size=block_size,
                             eos_token_ids=(eos_token_id,), dtype="float32", device="cpu",
                             attention_backend="fake", kv_cache_bytes=num_blocks * block_size,
                             incarnation_id="fake-incarnation")


@dataclass
class Mirror:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    prefix_hashes: list[bytes] = field(default_factory=list)  # prefix_hashes[p] covers token_ids[0..p]

    def __post_init__(self) -> None:
        self._extend_hashes()

    def append(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self._extend_hashes()

    def truncate(self, num_tokens: int) -> None:
        del self.token_ids[num_tokens:], self.prefix_hashes[num_tokens:]

    def _extend_hashes(self) -> None:
        for token_id in self.token_ids[len(self.prefix_hashes):]:
            self.prefix_hashes.append(extend_hash(self.prefix_hashes[-1] if self.prefix_hashes else ROOT_HASH,
                                                  token_id))

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class FakeWorker:
    def __init__(self, description: ModelDescription, eos_prob: float = 0.0,
                 scripts: dict[str, list[int]] | None = None, fixed_token: int | None = None) -> None:
        self.description = description
        self.block_size = description.block_size
        self.eos_prob = eos_prob
        self.fixed_token = fixed_token
        self.scripts = scripts or {}  # req_id -> forced output tokens, by output index (survives preemption)
        self.mirrors: dict[str, Mirror] = {}
        self.kv: dict[int, tuple[int, int, bytes]] = {}  # slot -> (token id, position, prefix hash)
        self.num_steps = 0
        self.steps: list[StepInput] = []  # every step seen, for tests that inspect the protocol

    def describe(self) -> ModelDescription:
        return self.description

    def restart(self, description: ModelDescription) -> None:
        """A new incarnation: every mirror and every slot of the old pool is gone."""
        self.description = description
        self.block_size = description.block_size
        self.mirrors.clear()
        self.kv.clear()

    # --- the sampler -------------------------------------------------------------------------------------

    def next_token(self, mirror: Mirror) -> int:
        script = self.scripts.get(mirror.req_id)
        if script is not None and mirror.num_output_tokens < len(script):
            return script[mirror.num_output_tokens]
        if self.fixed_token is not None:
            return self.fixed_token
        return sample_from_history(mirror.prefix_hashes[-1], mirror.sampling, mirror.num_output_tokens,
                                   self.description, self.eos_prob)

    # --- one step ----------------------------------------------------------------------------------------

    def execute_step(self, step: StepInput) -> StepOutput:
        self.num_steps += 1
        self.steps.append(step)
        for req_id in step.finished_req_ids:
            self.mirrors.pop(req_id, None)
        self._check_membership(step)
        for new in step.new_requests:
            self._mirror(new)
        for cached in step.cached_requests:
            mirror = self.mirrors.get(cached.req_id)
            if mirror is None:
                raise FakeWorkerError(f"request {cached.req_id} sent as cached but unknown to the worker")
            if mirror.num_computed_tokens != cached.num_computed_tokens:
                raise FakeWorkerError(f"request {cached.req_id}: worker computed {mirror.num_computed_tokens} "
                                      f"tokens, scheduler says {cached.num_computed_tokens}")
            mirror.block_ids.extend(cached.new_block_ids)
        for mirror in self.mirrors.values():
            self._check_block_table(mirror)
        if step.is_empty:
            return StepOutput()
        scheduled = [(self.mirrors[req_id], n) for req_id, n in step.num_scheduled_tokens.items()]
        drafted = self._append_drafts(step)
        for mirror, n in scheduled:
            self._check_chunk(mirror, n)
            self._check_reads(mirror)
        owners = self._owners_of_blocks()
        for mirror, n in scheduled:
            self._write(mirror, n, owners)
        output = StepOutput()
        # like the real batch builder: decodes (one token) first, the rest in scheduling order
        for mirror, n in sorted(scheduled, key=lambda item: item[1] != 1):
            mirror.num_computed_tokens += n
            if mirror.req_id in drafted:
                self._verify(mirror, drafted[mirror.req_id], output)
            elif mirror.num_computed_tokens == len(mirror.token_ids):
                self._sample(mirror, output)
        return output

    def _sample(self, mirror: Mirror, output: StepOutput) -> int:
        """Draw the mirror's next token, append it and report it in the step's output."""
        token_id = self.next_token(mirror)
        mirror.append(token_id)
        output.req_ids.append(mirror.req_id)
        output.sampled_token_ids.append(token_id)
        output.logprobs.append(None)
        return token_id

    def _append_drafts(self, step: StepInput) -> dict[str, list[int]]:
        """Put each request's drafts after its last known token, which the step must compute with them."""
        for req_id, drafts in step.draft_token_ids.items():
            mirror = self.mirrors.get(req_id)
            if mirror is None or req_id not in step.num_scheduled_tokens:
                raise FakeWorkerError(f"drafts for {req_id}, which the step does not schedule")
            if (step.num_scheduled_tokens[req_id] != 1 + len(drafts)
                    or mirror.num_computed_tokens != len(mirror.token_ids) - 1 or not drafts):
                raise FakeWorkerError(f"request {req_id}: {len(drafts)} drafts but {step.num_scheduled_tokens[req_id]} "
                                      f"tokens scheduled after {mirror.num_computed_tokens} of "
                                      f"{len(mirror.token_ids)} known")
            for token_id in drafts:
                mirror.append(token_id)
        return {req_id: list(drafts) for req_id, drafts in step.draft_token_ids.items()}

    def _verify(self, mirror: Mirror, drafts: list[int], output: StepOutput) -> None:
        """Greedy acceptance: keep drafts while each equals the token drawn before it, then the drawn token."""
        first_draft = len(mirror.token_ids) - len(drafts)
        mirror.truncate(first_draft)
        num_accepted = 0
        while True:
            token_id = self._sample(mirror, output)
            if num_accepted == len(drafts) or token_id != drafts[num_accepted]:
                break
            num_accepted += 1
        mirror.num_computed_tokens = len(mirror.token_ids) - 1
        del mirror.block_ids[-(-mirror.num_computed_tokens // self.block_size):]  # the scheduler frees the same tail
        output.num_accepted_drafts[mirror.req_id] = num_accepted

    # --- protocol checks ---------------------------------------------------------------------------------

    def _check_membership(self, step: StepInput) -> None:
        sent = [r.req_id for r in step.new_requests] + [r.req_id for r in step.cached_requests]
        if len(set(sent)) != len(sent):
            raise FakeWorkerError(f"a request appears twice in one step: {sorted(sent)}")
        if set(sent) != set(step.num_scheduled_tokens):
            raise FakeWorkerError(f"sent {sorted(sent)} but scheduled {sorted(step.num_scheduled_tokens)}")
        for new in step.new_requests:
            if new.req_id in self.mirrors:
                raise FakeWorkerError(f"request {new.req_id} sent as new while the worker still mirrors it")

    def _mirror(self, new: NewRequest) -> None:
        if not 0 < new.num_prompt_tokens <= len(new.token_ids):
            raise FakeWorkerError(f"request {new.req_id}: {new.num_prompt_tokens} prompt tokens of "
                                  f"{len(new.token_ids)}")
        if not 0 <= new.num_computed_tokens < len(new.token_ids):
            raise FakeWorkerError(f"request {new.req_id}: {new.num_computed_tokens} computed of "
                                  f"{len(new.token_ids)} tokens")
        self.mirrors[new.req_id] = Mirror(new.req_id, list(new.token_ids), new.num_prompt_tokens, new.sampling,
                                          list(new.block_ids), new.num_computed_tokens)

    def _check_block_table(self, mirror: Mirror) -> None:
        if len(set(mirror.block_ids)) != len(mirror.block_ids):
            raise FakeWorkerError(f"request {mirror.req_id} holds a block twice: {mirror.block_ids}")
        bad = [b for b in mirror.block_ids if not 0 <= b < self.description.num_kv_blocks]
        if bad:
            raise FakeWorkerError(f"request {mirror.req_id}: block ids {bad} outside the pool")

    def _check_chunk(self, mirror: Mirror, n: int) -> None:
        end = mirror.num_computed_tokens + n
        if n < 1 or end > len(mirror.token_ids):
            raise FakeWorkerError(f"request {mirror.req_id}: {n} tokens scheduled after "
                                  f"{mirror.num_computed_tokens} computed of {len(mirror.token_ids)} known")
        if end > self.description.max_model_len:
            raise FakeWorkerError(f"request {mirror.req_id}: position {end - 1} beyond the context limit")
        if len(mirror.block_ids) * self.block_size < end:
            raise FakeWorkerError(f"request {mirror.req_id}: {len(mirror.block_ids)} blocks cannot hold {end} "
                                  f"tokens")

    def _slot(self, mirror: Mirror, position: int) -> int:
        return mirror.block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def _content(self, mirror: Mirror, position: int) -> tuple[int, int, bytes]:
        return mirror.token_ids[position], position, mirror.prefix_hashes[position]

    def _check_reads(self, mirror: Mirror) -> None:
        """Attention reads every earlier position: cached or previously computed KV must be exactly ours."""
        for position in range(mirror.num_computed_tokens):
            slot = self._slot(mirror, position)
            if self.kv.get(slot) != self._content(mirror, position):
                raise FakeWorkerError(f"request {mirror.req_id} reads stale KV at position {position} "
                                      f"(slot {slot}, block {slot // self.block_size})")

    def _owners_of_blocks(self) -> dict[int, list[str]]:
        owners: dict[int, list[str]] = {}
        for mirror in self.mirrors.values():
            for block_id in mirror.block_ids:
                owners.setdefault(block_id, []).append(mirror.req_id)
        return owners

    def _write(self, mirror: Mirror, n: int, owners: dict[int, list[str]]) -> None:
        """Write the computed positions; a block another live request holds may only be 'written' unchanged."""
        start = mirror.num_computed_tokens
        for position in range(start, start + n):
            slot = self._slot(mirror, position)
            content = self._content(mirror, position)
            others = [r for r in owners[slot // self.block_size] if r != mirror.req_id]
            if others and self.kv.get(slot) != content:
                raise FakeWorkerError(f"request {mirror.req_id} overwrites slot {slot} (block "
                                      f"{slot // self.block_size}) that live request(s) {others} also hold")
            self.kv[slot] = content


def sample_from_history(prefix_hash: bytes, sampling: SamplingParams, num_output_tokens: int,
                        description: ModelDescription, eos_prob: float) -> int:
    """Greedy and deterministic: a pure function of the token history (and the stop rules, like the sampler)."""
    value = int.from_bytes(hashlib.blake2b(prefix_hash, digest_size=8).digest(), "little")
    eos = description.eos_token_ids[0]
    vocab = description.vocab_size
    token_id = eos if (value % 1_000_000) < eos_prob * 1_000_000 else (value >> 20) % vocab
    # the real sampler bans stop tokens (EOS unless ignore_eos, and stop_token_ids) until min_tokens outputs
    banned = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else {eos})
    if num_output_tokens < sampling.min_tokens:
        while token_id in banned:
            token_id = (token_id + 1) % vocab
    elif token_id == eos and eos_prob == 0.0:
        token_id = (token_id + 1) % vocab  # no EOS unless asked for
    return token_id
