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
import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from sluicegate.sim import admin as sim_admin
from sluicegate.sim import answer, api
from sluicegate.sim import routes as sim_routes
from sluicegate.sim.driver import EngineDriver
from sluicegate.sim.engine import Engine, Sequence, new_sequence
from sluicegate.sim.faults import Faults
from sluicegate.sim.kvevents import KVEventsConfig
from sluicegate.sim.metrics import EngineMetrics
from sluicegate.sim.profiles import EngineProfile
from sluicegate.sim.prompt_tokens import PromptTokens, load_shared
from sluicegate.sim.reply import inject_faults, json_reply, replica_headers
from sluicegate.sim.text import (
    find_stop,
)
from sluicegate.tokens import count_bytes_tokens

if TYPE_CHECKING:
    from sluicegate.sim.kvpublisher import KVEventPublisher

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
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    """vLLM's ``--kv-events-config``: replica *i* publishes on the endpoint's port + *i*."""


class Replica:
    """One simulated vLLM server: HTTP routes on one port in front of an engine driver."""

    def __init__(
        self,
        index: int,
        options: ReplicaOptions,
        faults: Faults | None = None,
        prompt_tokens: PromptTokens | None = None,
    ) -> None:
        """``prompt_tokens``: the profile's tokenizer, loaded (a cluster's replicas share
        one load); None: loaded here when the profile names one."""
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
        self.kv_publisher: KVEventPublisher | None = None
        """This replica's KV-event sockets while it runs (``pub_address``,
        ``replay_address``: where it bound them)."""
        self._kv_bound: tuple[str, str | None] | None = None
        self.driver = EngineDriver(
            options.profile,
            self.model_name,
            time_scale=options.time_scale,
            enable_prefix_caching=options.enable_prefix_caching,
            lora_enabled=self.lora_enabled,
            legacy_metric_names=options.legacy_metric_names,
            histogram_max_age_s=options.histogram_max_age_s,
            prompt_tokens=prompt_tokens,
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
        if self.options.kv_events.active:
            self._start_kv_events()
        self.driver.start(f"sim-engine-{self.index}")

    def _start_kv_events(self) -> None:
        # imported here: ZeroMQ is loaded only by replicas that publish
        from sluicegate.sim.kvpublisher import KVEventPublisher

        # a restarted replica binds the ports it had (a port-0 config took free ones)
        publisher = KVEventPublisher(
            self.options.kv_events,
            self.index,
            self.faults,
            binds=self._kv_bound,
            seed=self.options.seed,
        )
        self._kv_bound = publisher.bound
        self.kv_publisher = publisher
        self.driver.publish_kv_events_to(publisher)

    async def stop(self) -> None:
        """Die like a crashed server: close the port, cut every connection, drop all work."""
        if self._site is not None:
            await self._site.stop()  # no new connections from here on
            self._site = None
        await self.driver.stop()
        if self.kv_publisher is not None:
            self.driver.publish_kv_events_to(None)
            await self.kv_publisher.close()
            self.kv_publisher = None
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
        sim_routes.register(app, self)  # models, embeddings, responses, (de)tokenize
        sim_admin.register(app, self)  # LoRA adapters, prefix cache, faults
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

    def _error(self, exc: api.ApiError) -> web.Response:
        return web.Response(
            status=exc.status,
            body=exc.body(),
            content_type="application/json",
            headers=replica_headers(self),
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        await inject_faults(self)
        params = api.parse_generate(await request.read(), chat, self.driver.engine.prompt_tokens)
        lora = self._resolve_model(params.model)
        request_id = self.check_context(params)
        event = asyncio.Event()  # wakes the handler for any of the request's choices
        choices: list[answer.Choice] = []
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
                choices.append(answer.Choice(request_id, index, handle, stop))
            if params.stream:
                return await answer.stream(self, request, choices, event, params)
            return await answer.respond_whole(self, request, choices, event, params)
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

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200, headers=replica_headers(self))

    async def _version(self, request: web.Request) -> web.Response:
        return json_reply(self, {"version": SIM_VERSION})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.faults.freeze_metrics:
            if self._frozen_metrics is None:
                self._frozen_metrics = self.metrics.render()
            body = self._frozen_metrics
        else:
            self._frozen_metrics = None
            body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    def freeze_metrics(self) -> None:
        """Serve ``/metrics`` as it reads now until :meth:`thaw_metrics` (the
        ``freeze_metrics`` fault turned on)."""
        self._frozen_metrics = self.metrics.render()

    def thaw_metrics(self) -> None:
        """Serve live ``/metrics`` again."""
        self._frozen_metrics = None


class SimCluster:
    """Several replicas in one process, on consecutive ports from ``base_port``.

    With ``base_port=0`` every replica takes any free port (for tests).
    """

    def __init__(
        self,
        options: ReplicaOptions,
        replicas: int,
        faults: dict[int, Faults] | None = None,
        profiles: tuple[EngineProfile, ...] = (),
    ) -> None:
        """``profiles``: one per replica for a pool mixing hardware (each replica runs
        ``options`` with its own profile); empty: every replica runs ``options.profile``."""
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        if profiles and len(profiles) != replicas:
            raise ValueError(f"{len(profiles)} profiles for {replicas} replicas")
        faults = faults or {}
        own = [replace(options, profile=p) for p in profiles] or [options] * replicas
        tokens = load_shared(o.profile.tokenizer for o in own)
        self.replicas = [
            Replica(
                i, o, faults.get(i), tokens[o.profile.tokenizer] if o.profile.tokenizer else None
            )
            for i, o in enumerate(own)
        ]

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    async def start(self, host: str = "127.0.0.1", base_port: int = 0) -> None:
        for i, replica in enumerate(self.replicas):
            await replica.start(host, base_port + i if base_port else 0)

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.replicas))
