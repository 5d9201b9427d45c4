"""The FastAPI app: its routes and middleware stack (the tenant gate authenticates, limits and counts). Endpoint
logic lives in chat.py / completions.py."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Match

from pagedserve.services.gateway.api.chat import create_chat_completion, template_args
from pagedserve.services.gateway.api.completions import create_completion
from pagedserve.services.gateway.api.openapi_schema import install_openapi
from pagedserve.services.gateway.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pagedserve.services.gateway.api.responses import add_responses_routes
from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.http.admission import AdmissionGate, draining_error
from pagedserve.services.gateway.http.body_limit import BodyLimit
from pagedserve.services.gateway.http.cors import add_cors
from pagedserve.services.gateway.http.errors import ErrorBoundary, OpenAIError, install_error_handlers
from pagedserve.services.gateway.structured.tools import template_messages
from pagedserve.services.gateway.tenants.gate import UNMATCHED, RouteOf, TenantGate

_REQ_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # safe inside Redis keys and span attributes


def _version() -> str:
    try:
        return metadata.version("pagedserve")
    except metadata.PackageNotFoundError:
        return "unknown"


def request_id(request: Request) -> str:
    """The client's X-Request-Id when it is safe to use, else a fresh one: the req_id in every service. Kept in
    `request.state.req_id` for the error handlers (a 500 names it)."""
    given = request.headers.get("x-request-id", "")
    request.state.req_id = given if _REQ_ID.match(given) else uuid.uuid4().hex
    return request.state.req_id


def create_app(serving: Serving, instrument: bool = False) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        background = asyncio.create_task(serving.run_background(), name="gateway-background")
        yield
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
        await serving.close()

    app = FastAPI(title="pagedserve", version=_version(), lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=serving.config.max_body_bytes)
    app.add_middleware(AdmissionGate, admission=serving.admission, shed_counter=serving.metrics.shed_requests)
    app.add_middleware(TenantGate, registry=serving.tenants, limiter=serving.limiter, metrics=serving.metrics,
                       tenant_metrics=serving.tenant_metrics, route_of=route_of(app))
    app.add_middleware(ErrorBoundary)  # the outermost of ours but CORS
    config = serving.config
    add_cors(app, config.allowed_origins, config.allowed_methods, config.allowed_headers, config.allow_credentials)
    _add_routes(app, serving)
    add_responses_routes(app, serving, request_id)
    install_openapi(app, config.max_num_choices, lambda: serving.description, api_key=serving.tenants.auth_required)
    if instrument:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, excluded_urls="health,livez,metrics")
    return app


def route_of(app: FastAPI) -> RouteOf:
    """A scope's route template (bounded label values): the matched route's, else the first route the path and
    method fully match (a request refused before routing), else 'unmatched'."""

    def route_template(scope) -> str:
        route = scope.get("route")
        if route is not None:
            return route.path
        for candidate in app.router.routes:
            if candidate.matches(scope)[0] is Match.FULL:
                return candidate.path
        return UNMATCHED

    return route_template


def _add_routes(app: FastAPI, serving: Serving) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(body, serving, request, request_id(request))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(body, serving, request, request_id(request))

    def model_card() -> dict:
        model = serving.require_model(None)
        return {"id": model.model_name, "object": "model", "created": serving.created, "owned_by": "pagedserve",
                "root": serving.model_root, "max_model_len": model.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str):
        serving.require_model(model_id)  # 404 for a name this server does not serve
        return model_card()

    @app.get("/health")
    async def health():
        """Readiness: 200 while the scheduler serves and the gateway takes requests; 503 otherwise."""
        if serving.admission.draining:
            raise draining_error()
        if not serving.ready and not await serving.refresh():  # no lag behind the periodic poll
            raise OpenAIError(503, "the scheduler is not ready", code="service_unavailable")
        return {"status": "ok"}

    @app.get("/livez")
    async def livez():
        """Liveness: 200 while the process serves HTTP, draining or not."""
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": _version()}

    @app.get("/metrics")
    async def metrics():
        return Response(serving.metrics.render(serving.ready), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        model = serving.require_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "pass exactly one of prompt and messages", param="prompt")
        if body.messages is not None:
            functions = [tool.function for tool in body.tools or []]
            args = template_args(body, serving)
            messages, tools = template_messages(body.messages, functions, serving.tokenizer.supports_tools(args),
                                                serving.call_format(functions))
            tokens = await serving.encode_chat(messages, args, tools=tools)
        else:
            tokens = await serving.encode_prompt(body.prompt, "prompt", add_special_tokens=body.add_special_tokens)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": model.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        model = serving.require_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < model.vocab_size]
        if bad:
            raise OpenAIError(400, f"token id {bad[0]} is out of the vocabulary (size {model.vocab_size})",
                              param="tokens")
        text = await serving.tokenizer.off_loop(serving.tokenizer.decode, body.tokens, False)
        return JSONResponse({"prompt": text})
