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
from sluicegate.sim.text import (
    PromptError,
    StopHit,
    find_stop,
    output_bytes,
    output_text_token,
    render_chat,
    render_prompt,
)
from sluicegate.tokens import BYTES_PER_TOKEN, count_bytes_tokens

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


@dataclass(slots=True, eq=False)
class _Choice:
    """One choice of a request: its sequence in the engine and what its answer keeps.

    Text positions are in bytes of generated text, which is ASCII, so they are characters
    too.
    """

    request_id: str
    """The request's id, which the choices share (each sequence has its own)."""
    index: int
    handle: Handle
    stop: StopHit | None
    sent: int = 0
    """Tokens streamed so far."""
    sent_bytes: int = 0
    """Bytes of text streamed so far."""

    @property
    def stop_reason(self) -> str | int | None:
        """The stop string or token id that ended the answer; None for any other end."""
        return self.stop.reason if self.stop is not None else None

    def keep(self, tokens: int) -> int:
        """Bytes of the first ``tokens`` tokens' text that the answer keeps."""
        end = tokens * BYTES_PER_TOKEN
        return min(end, self.stop.text_bytes) if self.stop is not None else end

    def text(self, start: int, end: int) -> str:
        """Generated text from byte ``start`` to ``end``."""
        if end <= start:
            return ""
        first, last = start // BYTES_PER_TOKEN, -(-end // BYTES_PER_TOKEN)
        chunk = output_bytes(self.handle.seq.output_seed, first, last)
        offset = first * BYTES_PER_TOKEN
        return chunk[start - offset : end - offset].decode()


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
        self.rng = random.Random(options.seed * 1_000_003 + index)
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
        if faults.error_rate > 0 and self.rng.random() < faults.error_rate:
            raise api.ApiError(faults.error_status, "injected fault")
        params = api.parse_generate(await request.read(), chat)
        lora = self._resolve_model(params.model)
        request_id = self.check_context(params)
        event = asyncio.Event()  # wakes the handler for any of the request's choices
        choices: list[_Choice] = []
        try:
            for index in range(params.n):
                seq = self.sequence(params, lora, request_id, index)
                stop = find_stop(
                    seq.output_seed,
                    seq.max_output_tokens,
                    params.stop,
                    params.stop_token_ids,
                    params.include_stop_str,
                    params.min_tokens,
                )
                if stop is not None:
                    # The engine generates only up to the stop, so simulated time and the
                    # batch reflect the shorter answer.
                    seq.max_output_tokens = stop.tokens
                    seq.finish_reason = "stop"
                handle = self.driver.submit(seq, event)
                choices.append(_Choice(request_id, index, handle, stop))
            if params.stream:
                return await self._stream(request, choices, event, params)
            return await self._respond_whole(request, choices, event, params)
        finally:
            for c in choices:
                self.driver.release(c.handle)

    def _resolve_model(self, model: str) -> str | None:
        if model == self.model_name:
            return None
        if model in self.loras:
            return model
        raise api.ApiError(404, f"The model `{model}` does not exist.", "model")

    def check_context(self, params: api.GenerateRequest) -> str:
        """A new request id; a 400 when the request does not fit the context."""
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
        return f"{prefix}-{self.index}-{next(self._ids)}"

    def sequence(
        self, params: api.GenerateRequest, lora: str | None, request_id: str, index: int
    ) -> Sequence:
        """The engine sequence of choice ``index`` (vLLM names a child ``{index}_{id}``)."""
        profile = self.options.profile
        return new_sequence(
            request_id if params.n == 1 else f"{index}_{request_id}",
            params.prompt,
            arrival=self.driver.arrival_time(),
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            max_model_len=min(profile.max_model_len, profile.kv_capacity_tokens),
            model=self.model_name,
            lora=lora,
            cache_salt=params.cache_salt,
            seed=self.options.seed,
            choice=index,
            min_tokens=params.min_tokens,
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
        self,
        request: web.Request,
        choices: list[_Choice],
        event: asyncio.Event,
        params: api.GenerateRequest,
    ) -> web.StreamResponse:
        reset_after = self.faults.reset_after_tokens
        while not all(c.handle.done for c in choices):
            await event.wait()
            event.clear()
            if reset_after is not None and sum(c.handle.visible for c in choices) >= reset_after:
                return self._cut_connection(request)
        bodies = []
        for c in choices:
            seq = c.handle.seq
            logprobs = None
            if params.logprobs is not None:
                logprobs = (
                    api.chat_logprobs(seq.output_seed, 0, seq.num_output, params.logprobs)
                    if params.chat
                    else api.completion_logprobs(
                        seq.output_seed, 0, seq.num_output, params.logprobs, 0
                    )
                )
            bodies.append(
                api.choice(
                    params.chat,
                    c.index,
                    c.text(0, c.keep(seq.num_output)),
                    seq.finish_reason,
                    c.stop_reason,
                    logprobs,
                    stream=False,
                )
            )
        body = api.completion_body(
            choices[0].request_id,
            int(time.time()),
            params.model,
            params.chat,
            bodies,
            self._usage(choices),
        )
        return web.Response(body=body, content_type="application/json", headers=self._headers())

    @staticmethod
    def _usage(choices: list[_Choice], partial: _Choice | None = None) -> dict[str, Any]:
        """``usage``: the prompt once, every choice's tokens (or ``partial``'s streamed ones)."""
        first = choices[0].handle.seq
        generated = partial.sent if partial else sum(c.handle.seq.num_output for c in choices)
        return api.usage(first.prompt_tokens, generated, first.num_cached_prompt_tokens)

    async def _stream(
        self,
        request: web.Request,
        choices: list[_Choice],
        event: asyncio.Event,
        params: api.GenerateRequest,
    ) -> web.StreamResponse:
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
        request_id = choices[0].request_id
        model, chat = params.model, params.chat
        hold_back = params.hold_back
        top = params.logprobs
        reset_after = self.faults.reset_after_tokens
        budget = reset_after if reset_after is not None else -1  # tokens left before the cut
        role_sent = False
        single = choices[0] if len(choices) == 1 else None
        while True:
            if budget == 0:
                self._cut_connection(request)
                return response
            # Runs once per step per stream: the common single choice skips the scans.
            if single is not None:
                ready = choices if single.sent < single.handle.visible else []
            else:
                ready = [c for c in choices if c.sent < c.handle.visible]
            if not ready:
                if single.handle.done if single else all(c.handle.done for c in choices):
                    break
                await event.wait()
                event.clear()
                continue
            frames: list[bytes] = []
            if chat and not role_sent:
                # As vLLM does, the role arrives with the first token, not before it, one
                # chunk per choice.
                role_sent = True
                first = choices[0].handle.seq
                role_usage = (
                    api.usage(first.prompt_tokens, 0, 0) if params.continuous_usage else None
                )
                for c in choices:
                    role = api.choice(chat, c.index, "", None, None, None, stream=True, role=True)
                    frames.append(
                        api.stream_chunk(request_id, created, model, chat, [role], role_usage)
                    )
            for c in ready:
                handle, seq = c.handle, c.handle.seq
                produced = handle.visible
                if budget >= 0:
                    produced = min(produced, c.sent + budget)
                    budget -= produced - c.sent
                # Without a stop string to cut or hold back, each token's text is one piece.
                plain = c.stop is None and hold_back == 0
                seed = seq.output_seed
                for i in range(c.sent, produced):
                    final = handle.done and i == handle.visible - 1
                    if plain:
                        text = output_text_token(seed, i)
                        end = (i + 1) * BYTES_PER_TOKEN
                    else:
                        end = c.keep(i + 1)
                        if not final:
                            end = min(end, (i + 1) * BYTES_PER_TOKEN - hold_back)
                        end = max(end, c.sent_bytes)
                        text = c.text(c.sent_bytes, end)
                    logprobs = None
                    if top is not None:
                        logprobs = (
                            api.chat_logprobs(seed, i, i + 1, top)
                            if chat
                            else api.completion_logprobs(seed, i, i + 1, top, c.sent_bytes)
                        )
                    delta = api.choice(
                        chat,
                        c.index,
                        text,
                        seq.finish_reason if final else None,
                        c.stop_reason if final else None,
                        logprobs,
                        stream=True,
                    )
                    c.sent_bytes = end
                    c.sent = i + 1
                    usage_block = self._usage(choices, c) if params.continuous_usage else None
                    frames.append(
                        api.stream_chunk(request_id, created, model, chat, [delta], usage_block)
                    )
            if not await send(b"".join(frames)):
                return response
        if params.include_usage and not await send(
            api.stream_chunk(request_id, created, model, chat, [], self._usage(choices))
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
