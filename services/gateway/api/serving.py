"""What every endpoint needs: the replicas and their router, tokenizer, model facts, defaults and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pagedserve.services.gateway.api.generation import ChoiceJob
from pagedserve.services.gateway.api.protocol import SamplingFields
from pagedserve.services.gateway.api.response_store import ResponseStore, open_store
from pagedserve.services.gateway.api.sampling import ModelLimits, RequestShape, build_sampling_params, prompt_too_long
from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gateway.http.admission import Admission
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.http.metrics import GatewayMetrics
from pagedserve.services.gateway.routing.prefix_mirror import PrefixMirror
from pagedserve.services.gateway.routing.replica_gauges import ReplicaStateCollector
from pagedserve.services.gateway.routing.replicas import ReplicaSet
from pagedserve.services.gateway.routing.router import Router, RouterConfig
from pagedserve.services.gateway.routing.router_metrics import RouterMetrics
from pagedserve.services.gateway.structured.grammar_check import GrammarChecker
from pagedserve.services.gateway.structured.reasoning_parsers import (
    REASONING_FORMATS,
    ReasoningFormat,
    default_reasoning_parser,
)
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.services.gateway.structured.tool_parsers import (
    TOOL_CALL_FORMATS,
    ToolCallFormat,
    default_tool_call_parser,
)
from pagedserve.services.gateway.tenants.cache_salt import tenant_cache_salt
from pagedserve.services.gateway.tenants.current import current_tenant
from pagedserve.services.gateway.tenants.keys_file import Tenant
from pagedserve.services.gateway.tenants.metrics import TenantMetrics
from pagedserve.services.gateway.tenants.rate_limit import RateLimiter
from pagedserve.services.gateway.tenants.registry import TenantRegistry
from pagedserve.services.gateway.text.tokenizer import ChatTemplateArgs, PromptTokenizer, PromptTooLong
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.step_protocol import ModelDescription
from pagedserve.shared.structured_output import StructuredOutput

log = logging.getLogger(__name__)


@dataclass
class Serving:
    config: GatewayConfig
    tokenizer: PromptTokenizer
    replicas: ReplicaSet
    generation_defaults: dict
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    mirror: PrefixMirror | None = None  # the replicas' prefix indexes (None: no Redis, prefix routing hashes)
    admission: Admission = field(init=False)
    router: Router = field(init=False)
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models `created`: when this gateway started
    grammar_checker: GrammarChecker | None = None  # started with the first constrained request
    response_store: ResponseStore = field(init=False)  # the Responses API's stored responses
    tenants: TenantRegistry = field(init=False)  # keys -> tenants (raises KeysFileError on a bad keys file)
    limiter: RateLimiter = field(init=False)
    tenant_metrics: TenantMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.config.max_open_requests)
        config = RouterConfig(self.config.routing, self.config.routing_load_cost_tokens,
                              self.config.routing_pending_ttl_s, self.config.max_resumes)
        self.router = Router(config, self.replicas, self.mirror, RouterMetrics(self.metrics.registry))
        self.admission.refusing_for_s = self.router.refusing_for_s
        self.metrics.registry.register(ReplicaStateCollector(self.router))
        self.response_store = open_store(self.config.redis_url, self.config.responses_store_ttl_s,
                                         self.config.responses_store_max_bytes, self.metrics.registry)
        self.tenants = TenantRegistry(self.config.api_keys_file, self.config.api_key,
                                      self.config.api_keys_poll_interval_s)
        self.tenant_metrics = TenantMetrics(self.metrics.registry)
        self.tenant_metrics.declare(self.tenants.tenant_names)
        self.tenants.on_reload.append(lambda table: self.tenant_metrics.declare(self.tenants.tenant_names))
        self.limiter = RateLimiter(self.config.redis_url, self.tenant_metrics.limits_shared)

    @property
    def ready(self) -> bool:
        """At least one replica is routable."""
        return self.replicas.ready

    @property
    def description(self) -> ModelDescription | None:
        """The model facts: the first ready replica's (every replica serves this model)."""
        return self.replicas.model

    async def refresh(self) -> bool:
        """Check the replicas that are out now (no lag behind the periodic poll); returns `ready`."""
        await self.replicas.check_now()
        return self.ready

    async def run_background(self) -> None:
        """The replica set's resolution and health tasks, the keys file's watch and the prefix-index mirror; cancel
        to stop."""
        tasks = [asyncio.create_task(self.replicas.run(), name="replicas"),
                 asyncio.create_task(self.tenants.watch(), name="keys-file")]
        if self.mirror is not None:
            tasks.append(asyncio.create_task(self.mirror.run(), name="prefix-mirror"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def require_model(self, requested: str | None) -> ModelDescription:
        """The served model; 503 before the scheduler is ready, 404 for another model name or one the request's
        tenant may not use."""
        if not self.ready or self.description is None:
            raise OpenAIError(503, "the scheduler is not ready yet", code="service_unavailable")
        allowed = current_tenant().models
        if (requested not in (None, self.description.model_name, self.config.model_dir, self.model_root)
                or (allowed is not None and self.description.model_name not in allowed)):
            raise OpenAIError(404, f"The model `{requested or self.description.model_name}` does not exist or you "
                                   "do not have access to it.", param="model", code="model_not_found")
        return self.description

    @property
    def model_root(self) -> str:
        """The model folder as an absolute path (/v1/models `root`: a client on this machine can load its tokenizer)."""
        return str(Path(self.config.model_dir).resolve())

    @property
    def tool_call_parser(self) -> str:
        """--tool-call-parser, else the family the chat template's markup names (hermes when unclear)."""
        return self.config.tool_call_parser or default_tool_call_parser(self.tokenizer.chat_template)

    def reasoning_format(self, args: ChatTemplateArgs) -> type[ReasoningFormat] | None:
        """--reasoning-parser (else the template's family), unless the request turned thinking off."""
        if args.kwargs.get("enable_thinking") is False or args.kwargs.get("thinking") is False:
            return None
        name = self.config.reasoning_parser
        name = default_reasoning_parser(self.tokenizer.chat_template) if name == "" else name
        return REASONING_FORMATS[name] if name and name != "none" else None

    def call_format(self, functions: list) -> ToolCallFormat:
        return TOOL_CALL_FORMATS[self.tool_call_parser](functions)

    @property
    def limits(self) -> ModelLimits:
        assert self.description is not None, "require_model() first"
        return ModelLimits(self.description.max_model_len, self.description.vocab_size)

    async def encode_prompt(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids, tokenized off the event loop; a text that surely cannot fit the context is a 400
        without tokenizing it."""
        try:
            return await self.tokenizer.off_loop(self.tokenizer.encode, text, add_special_tokens,
                                                 self.limits.max_model_len)
        except PromptTooLong as exc:
            raise prompt_too_long(exc.num_tokens, self.limits.max_model_len, param, at_least=True) from None

    async def encode_chat(self, messages: list[dict], args: ChatTemplateArgs | None = None,
                          param: str = "messages", tools: list[dict] | None = None) -> list[int]:
        """Token ids of the conversation through the chat template, templated and tokenized off the event loop."""
        try:
            return await self.tokenizer.off_loop(self.tokenizer.chat_prompt_ids, messages, args,
                                                 self.limits.max_model_len, tools)
        except PromptTooLong as exc:
            raise prompt_too_long(exc.num_tokens, self.limits.max_model_len, param, at_least=True) from None

    async def check_constraint(self, constraint: Constraint | None, client: str = "") -> StructuredOutput | None:
        """The constraint's grammar once it compiled within the time limit (else a 400 naming its field); `client`
        (the caller's address) bounds how many new grammars one caller has compiling at once."""
        if constraint is None:
            return None
        if self.grammar_checker is None:
            model = self.require_model(None)
            config = self.config
            self.grammar_checker = GrammarChecker(config.model_dir, model.vocab_size, model.eos_token_ids,
                                                  config.grammar_compile_timeout_s, config.grammar_check_workers,
                                                  config.grammar_compiles_per_client)
        return await self.grammar_checker.check(constraint, client)

    @staticmethod
    def with_grammar(jobs: list[ChoiceJob], structured_output: StructuredOutput | None) -> list[ChoiceJob]:
        """The jobs with their grammar, checked after the jobs (so a request that cannot fit is refused before
        its grammar is compiled)."""
        if structured_output is None:
            return jobs
        return [replace(job, request=replace(job.request, sampling=replace(
            job.request.sampling, structured_output=structured_output))) for job in jobs]

    async def close(self) -> None:
        await self.response_store.close()
        if self.grammar_checker is not None:
            await self.grammar_checker.close()
        await self.limiter.close()

    def spend_tokens(self, tenant: Tenant, num_prompt_tokens: int, num_generated_tokens: int,
                     num_cached_tokens: int = 0) -> None:
        """Count a finished request's tokens against its tenant (metrics and tokens-per-minute limit); cached prompt
        tokens are a part of the prompt's, counted apart for the tenant's prefix-cache hit rate."""
        self.tenant_metrics.tokens.labels(tenant.name, "prompt").inc(num_prompt_tokens)
        self.tenant_metrics.tokens.labels(tenant.name, "cached").inc(num_cached_tokens)
        self.tenant_metrics.tokens.labels(tenant.name, "generated").inc(num_generated_tokens)
        self.limiter.spend_tokens(tenant, num_prompt_tokens + num_generated_tokens)

    def build_jobs(self, body: SamplingFields, prompts: list[list[int]], req_id: str, max_tokens: int | None,
                   logprobs: int | None, shape: RequestShape,
                   structured_output: StructuredOutput | None = None,
                   prompt_logprobs: int | None = None) -> list[ChoiceJob]:
        """n scheduler requests per prompt; one req_id when there is one choice, `{req_id}-{i}` otherwise."""
        limit, num_choices = self.config.max_num_choices, len(prompts) * body.n
        if body.n > limit:
            raise OpenAIError(400, f"n must be at most {limit}, got {body.n}", param="n")
        if num_choices > limit:
            raise OpenAIError(400, f"a request may ask for at most {limit} choices (prompts x n), got "
                                   f"{len(prompts)} x {body.n}", param=shape.prompt_param)
        tenant = current_tenant()
        max_tokens = tenant_max_tokens(tenant, max_tokens)
        priority = tenant.clamp_priority(body.priority)
        jobs = []
        for prompt_index, prompt_ids in enumerate(self._truncated(prompts, body.truncate_prompt_tokens)):
            for i in range(body.n):
                params = build_sampling_params(body, max_tokens, logprobs, len(prompt_ids), i,
                                               self.generation_defaults, self.limits, shape, structured_output,
                                               prompt_logprobs)
                index = len(jobs)
                choice_id = req_id if num_choices == 1 else f"{req_id}-{index}"
                request = GenerateRequest(choice_id, prompt_ids, params, tenant_cache_salt(tenant, body.cache_salt),
                                          priority=priority, tenant=tenant.name, tenant_weight=tenant.weight,
                                          tenant_kv_cache_share=tenant.kv_cache_share)
                jobs.append(ChoiceJob(index, prompt_index, request, body.stop_strings, body.include_stop_str_in_output))
        return jobs

    def _truncated(self, prompts: list[list[int]], keep: int | None) -> list[list[int]]:
        """vLLM's truncate_prompt_tokens: each prompt's last `keep` tokens (-1: as many as the context holds)."""
        if keep is None:
            return prompts
        keep = self.limits.max_model_len if keep == -1 else keep
        if keep < 1:
            raise OpenAIError(400, "truncate_prompt_tokens must be at least 1 (or -1)", param="truncate_prompt_tokens")
        return [p[-keep:] for p in prompts]


def tenant_max_tokens(tenant: Tenant, max_tokens: int | None) -> int | None:
    """The request's max_tokens under its tenant's bound: that bound when the request names none, a 400 above it."""
    if tenant.max_tokens is None:
        return max_tokens
    if max_tokens is None:
        return tenant.max_tokens
    if max_tokens > tenant.max_tokens:
        raise OpenAIError(400, f"max_tokens is {max_tokens}, above this key's limit of {tenant.max_tokens}",
                          param="max_tokens", code="invalid_value")
    return max_tokens
