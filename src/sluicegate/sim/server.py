"""The vLLM-compatible HTTP server: ``sluicegate sim``.

Each :class:`Replica` is one simulated model server ("pod") on its own port: vLLM's routes
in front of an :class:`~sluicegate.sim.driver.EngineDriver`, which steps the engine in real
time (optionally scaled). A :class:`SimCluster` runs several in one process.

Time: the engine runs on simulated seconds; ``time_scale`` wall seconds pass per simulated
second (1.0 = real time, 0.1 = ten times faster). Every latency the server reports, in
``/metrics`` or otherwise, is in simulated seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from aiohttp import web

from sluicegate.sim import api
from sluicegate.sim import routes as sim_routes
from sluicegate.sim.driver import EngineDriver, Handle
from sluicegate.sim.engine import Engine, Sequence, new_sequence
from sluicegate.sim.faults import Faults
from sluicegate.sim.metrics import EngineMetrics
from sluicegate.sim.profiles import EngineProfile
from sluicegate.sim.text import PromptError, render_chat, render_prompt
from sluicegate.tokens import count_bytes_tokens

log = logging.getLogger("sluicegate.sim")

MAX_BODY_BYTES = 64 * 1024 * 1024
SIM_VERSION = "0.32.0+sluicegate.sim"


@dataclass(slots=True)
class ReplicaOptions:
    """How to run one replica. ``served_model_name`` defaults to the profile's model."""

    profile: EngineProfile
    served_model_name: str | None = None
    time_scale: float = 1.0
    lora_modules: dict[str, str] = field(default_factory=dict)
    enable_lora: bool = False
    enable_prefix_caching: bool = True
    legacy_metric_names: bool = False
    pod_name_prefix: str = "sim"
    namespace: str = "default"
    seed: int = 0
    histogram_max_age_s: float = 0.0
    """How long ``/metrics`` may reuse its histograms' text, in wall seconds (0: never)."""


class Replica:
    """One simulated vLLM server: HTTP routes on one port in front of an engine driver."""

    def __init__(self, index: int, options: ReplicaOptions, faults: Faults | None = None) -> None:
        self.index = index
        self.options = options
        self.model_name = options.served_model_name or options.profile.model_name
        self.pod_name = f"{options.pod_name_prefix}-{index}"
        self.faults = faults or Faults()
        self.loras: dict[str, str] = dict(options.lora_modules)
        self.port = 0
        self._rng = random.Random(options.seed * 1_000_003 + index)
        self._ids = itertools.count()
        self._transports: set[asyncio.Transport] = set()
        self._frozen_metrics: bytes | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.driver = EngineDriver(
            options.profile,
            self.model_name,
            time_scale=options.time_scale,
            enable_prefix_caching=options.enable_prefix_caching,
            lora_enabled=self.lora_enabled,
            legacy_metric_names=options.legacy_metric_names,
            histogram_max_age_s=options.histogram_max_age_s,
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def lora_enabled(self) -> bool:
        return self.options.enable_lora or bool(self.loras)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> Engine:
        return self.driver.engine

    @property
    def metrics(self) -> EngineMetrics:
        return self.driver.metrics

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0 = any free port) and start the engine."""
        app = self._build_app()
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port)
        await self._site.start()
        # An asyncio.Server, or uvloop's look-alike under uvloop.
        server = cast(asyncio.Server, self._site._server)
        self.port = server.sockets[0].getsockname()[1]
        self.driver.start(f"sim-engine-{self.index}")

    async def stop(self) -> None:
        """Die like a crashed server: close the port, cut every connection, drop all work."""
        if self._site is not None:
            await self._site.stop()  # no new connections from here on
            self._site = None
        await self.driver.stop()
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, host: str = "127.0.0.1") -> None:
        """Come back on the same port with an empty engine (a restarted server)."""
        port = self.port
        await self.stop()
        self.loras = dict(self.options.lora_modules)  # adapters loaded at run time are gone
        self.driver.reset(self.lora_enabled)
        await self.start(host, port)

    # ------------------------------------------------------------------ HTTP

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._track])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._set_faults)
        sim_routes.register(app, self)  # /v1/models, embeddings, responses, detokenize
        return app

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except api.ApiError as exc:
            return self._error(exc)
        except web.HTTPRequestEntityTooLarge as exc:
            return self._error(api.ApiError(413, exc.text or "request body too large"))
        finally:
            if transport is not None:
                self._transports.discard(transport)

    def _headers(self) -> dict[str, str]:
        return {
            "x-inference-pod": self.pod_name,
            "x-inference-port": str(self.port),
            "x-inference-namespace": self.options.namespace,
        }

    def _error(self, exc: api.ApiError) -> web.Response:
        return web.Response(
            status=exc.status,
            body=exc.body(),
            content_type="application/json",
            headers=self._headers(),
        )

    def _json(self, payload: Any, status: int = 200) -> web.Response:
        return web.Response(
            status=status,
            body=orjson.dumps(payload),
            content_type="application/json",
            headers=self._headers(),
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        faults = self.faults
        if faults.hang:
            await asyncio.Event().wait()
        if faults.latency_ms > 0:
            await asyncio.sleep(faults.latency_ms / 1000.0)
        if faults.error_rate > 0 and self._rng.random() < faults.error_rate:
            raise api.ApiError(faults.error_status, "injected fault")
        params = api.parse_generate(await request.read(), chat)
        lora = self._resolve_model(params.model)
        handle = self.driver.submit(self._sequence(params, lora))
        try:
            if params.stream:
                return await self._stream(request, handle, params)
            return await self._respond_whole(request, handle, params)
        finally:
            self.driver.release(handle)

    def _resolve_model(self, model: str) -> str | None:
        if model == self.model_name:
            return None
        if model in self.loras:
            return model
        raise api.ApiError(404, f"The model `{model}` does not exist.", "model")

    def _sequence(self, params: api.GenerateRequest, lora: str | None) -> Sequence:
        """The engine sequence for a request; a 400 when it does not fit the context."""
        profile = self.options.profile
        prompt_tokens = count_bytes_tokens(params.prompt)
        limit = min(profile.max_model_len, profile.kv_capacity_tokens)
        requested = params.max_tokens if params.max_tokens is not None else 1
        if prompt_tokens + requested > limit:
            raise api.ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the "
                f"messages, {requested} in the completion). Please reduce the length of "
                "the messages or completion.",
                "max_tokens" if params.max_tokens is not None else None,
            )
        prefix = "chatcmpl" if params.chat else "cmpl"
        return new_sequence(
            f"{prefix}-{self.index}-{next(self._ids)}",
            params.prompt,
            arrival=self.driver.arrival_time(),
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            max_model_len=limit,
            model=self.model_name,
            lora=lora,
            cache_salt=params.cache_salt,
            seed=self.options.seed,
        )

    def _cut_connection(self, request: web.Request) -> web.StreamResponse:
        """Drop the client's connection (a fault); returns a response that is never sent.

        Returning (rather than raising) lets aiohttp treat the dead connection as a client
        disconnect: no traceback is logged and the handler task ends normally.
        """
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)

    async def _respond_whole(
        self, request: web.Request, handle: Handle, params: api.GenerateRequest
    ) -> web.StreamResponse:
        seq = handle.seq
        reset_after = self.faults.reset_after_tokens
        while not handle.done:
            await handle.event.wait()
            handle.event.clear()
            if reset_after is not None and handle.visible >= reset_after:
                return self._cut_connection(request)
        body = api.completion_body(
            seq.request_id,
            int(time.time()),
            params.model,
            params.chat,
            seq.output_text(),
            seq.finish_reason,
            api.usage(seq.prompt_tokens, seq.num_output, seq.num_cached_prompt_tokens),
        )
        return web.Response(body=body, content_type="application/json", headers=self._headers())

    async def _stream(
        self, request: web.Request, handle: Handle, params: api.GenerateRequest
    ) -> web.StreamResponse:
        seq = handle.seq
        response = web.StreamResponse(
            headers={
                **self._headers(),
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)

        async def send(data: bytes) -> bool:
            """Write ``data``; False if the client has gone away."""
            try:
                await response.write(data)
            except ConnectionResetError:
                return False
            return True

        # On a lost client every path below returns ``response``: aiohttp then fails to
        # finish it, which it treats as a premature disconnect (quietly), and _generate
        # aborts the request in the engine.
        created = int(time.time())
        model, chat = params.model, params.chat
        sent = 0
        reset_after = self.faults.reset_after_tokens
        while True:
            if reset_after is not None and sent >= reset_after:
                self._cut_connection(request)
                return response
            if sent == handle.visible:
                if handle.done:
                    break
                await handle.event.wait()
                handle.event.clear()
                continue
            produced = handle.visible
            if reset_after is not None:
                produced = min(produced, reset_after)
            frames: list[bytes] = []
            if chat and sent == 0:
                # As vLLM does, the role arrives with the first token, not before it.
                role_usage = api.usage(seq.prompt_tokens, 0, 0) if params.continuous_usage else None
                frames.append(
                    api.stream_chunk(
                        seq.request_id, created, model, chat, "", None, role_usage, role=True
                    )
                )
            for i in range(sent, produced):
                last = handle.done and i == handle.visible - 1
                usage_block = (
                    api.usage(seq.prompt_tokens, i + 1, seq.num_cached_prompt_tokens)
                    if params.continuous_usage
                    else None
                )
                frames.append(
                    api.stream_chunk(
                        seq.request_id,
                        created,
                        model,
                        chat,
                        seq.output_text(i, i + 1),
                        seq.finish_reason if last else None,
                        usage_block,
                    )
                )
            if not await send(b"".join(frames)):
                return response
            sent = produced
        if params.include_usage and not await send(
            api.stream_chunk(
                seq.request_id,
                created,
                model,
                chat,
                None,
                None,
                api.usage(seq.prompt_tokens, seq.num_output, seq.num_cached_prompt_tokens),
            )
        ):
            return response
        await send(api.STREAM_DONE)
        return response  # aiohttp writes the end of the chunked body

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200, headers=self._headers())

    async def _version(self, request: web.Request) -> web.Response:
        return self._json({"version": SIM_VERSION})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.faults.freeze_metrics:
            if self._frozen_metrics is None:
                self._frozen_metrics = self.metrics.render()
            body = self._frozen_metrics
        else:
            self._frozen_metrics = None
            body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _read_json_object(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise api.ApiError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise api.ApiError(400, "request body must be a JSON object")
        return body

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await self._read_json_object(request)
        try:
            if "messages" in body:
                prompt = render_chat(body["messages"])
            elif "prompt" in body:
                prompt = render_prompt(body["prompt"])
            else:
                raise api.ApiError(400, "'prompt' or 'messages' is required")
        except PromptError as exc:
            raise api.ApiError(400, str(exc)) from None
        padded = prompt + b"\0" * (-len(prompt) % 4)
        tokens = [int.from_bytes(padded[i : i + 4], "little") for i in range(0, len(padded), 4)]
        return self._json(
            {
                "count": len(tokens),
                "max_model_len": self.options.profile.max_model_len,
                "tokens": tokens,
                "token_strs": None,  # vLLM's, unless ``return_token_strs``
            }
        )

    async def _load_lora(self, request: web.Request) -> web.Response:
        body = await self._read_json_object(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name:
            raise api.ApiError(400, "'lora_name' must be a non-empty string", "lora_name")
        if name in self.loras:
            raise api.ApiError(
                400, f"The lora adapter '{name}' has already been loaded.", "lora_name"
            )
        self.loras[name] = path if isinstance(path, str) and path else f"/adapters/{name}"
        self.metrics.lora_enabled = True
        return web.Response(
            text=f"Success: LoRA adapter '{name}' added successfully.", headers=self._headers()
        )

    async def _unload_lora(self, request: web.Request) -> web.Response:
        body = await self._read_json_object(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or name not in self.loras:
            raise api.ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
        del self.loras[name]
        return web.Response(
            text=f"Success: LoRA adapter '{name}' removed successfully.", headers=self._headers()
        )

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.pool.clear_cache()
        return web.Response(status=200, headers=self._headers())

    async def _get_faults(self, request: web.Request) -> web.Response:
        return self._json(self.faults.as_dict())

    async def _set_faults(self, request: web.Request) -> web.Response:
        body = await self._read_json_object(request)
        was_frozen = self.faults.freeze_metrics
        try:
            self.faults.update(body)
        except ValueError as exc:
            raise api.ApiError(400, str(exc)) from None
        if self.faults.freeze_metrics and not was_frozen:
            self._frozen_metrics = self.metrics.render()  # frozen as it is now
        elif not self.faults.freeze_metrics:
            self._frozen_metrics = None
        log.info("replica %d faults: %s", self.index, self.faults.as_dict())
        return self._json(self.faults.as_dict())


class SimCluster:
    """Several replicas in one process, on consecutive ports from ``base_port``.

    With ``base_port=0`` every replica takes any free port (for tests).
    """

    def __init__(
        self, options: ReplicaOptions, replicas: int, faults: dict[int, Faults] | None = None
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        faults = faults or {}
        self.replicas = [Replica(i, options, faults.get(i)) for i in range(replicas)]

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    async def start(self, host: str = "127.0.0.1", base_port: int = 0) -> None:
        for i, replica in enumerate(self.replicas):
            await replica.start(host, base_port + i if base_port else 0)

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.replicas))
