"""Real vLLM servers on CPU: a tiny local model and server processes.

Used by ``sluicegate bench run --backend vllm`` and by tests/vllm. Two halves, run by two
interpreters:

- :func:`build_model` runs in the vLLM environment (``python vllm_backend.py build-model
  DIR``: this file is run by path, so it imports nothing of sluicegate, and only the
  standard library at module level; torch and transformers inside the function): it writes a
  randomly initialised tiny Llama and a BPE tokenizer trained here on generated text, with a
  chat template. Nothing is downloaded; the same seed gives the same files.
- :class:`VllmServer` runs in the caller's process (standard library only): it starts
  ``python -m vllm.entrypoints.openai.api_server`` on a free loopback port in its own
  process group, waits for ``/health`` and kills the whole group on :meth:`VllmServer.stop`
  (and the kernel kills the server if the caller dies first).

``SLUICEGATE_VLLM_PYTHON`` names the vLLM environment's interpreter (set by
``scripts/test-vllm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PYTHON_ENV = "SLUICEGATE_VLLM_PYTHON"
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 2
"""Small, so a handful of requests sent straight to a server make it queue (``waiting``)."""
BLOCK_SIZE_CPU = 128
"""vLLM's default KV block size on CPU (``vllm/platforms/cpu.py``)."""

# No model hub, no usage reporting: everything the servers need is on disk.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_SYLLABLES = (
    "ka lo mi ne ru sa ti vo ze pa qu de fi go ha ji ly mo nu ox "
    "pre tra sol ven mar dun kel bro sti wan gri fel hom lux tor"
).split()


# ---------------------------------------------------------------------- the model


def corpus(lines: int = 4000, seed: int = 7) -> list[str]:
    """Generated text to train the tokenizer on (pseudo-words, digits, punctuation)."""
    import random

    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    words += "the a of to and in is it you that was for on are with as I his they".split()
    out = []
    for _ in range(lines):
        n = rng.randint(4, 20)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        out.append(f"{sentence.capitalize()}{rng.choice('.?!,;:')} {rng.randint(0, 9999)}")
    return out


def build_model(out: Path, vocab_size: int = 2048, seed: int = 0) -> None:
    """Write a tiny random Llama and its tokenizer to ``out`` (vLLM environment only)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_MODEL_LEN,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        # vLLM's CPU attention needs a head size of at least 32: 128 / 4 heads.
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)


_RUN_AS_MAIN = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def ensure_model(python: str, out: Path, timeout: float = 300.0) -> Path:
    """Build the tiny model into ``out`` with the vLLM environment's ``python`` (once)."""
    done = out / ".complete"
    if not done.exists():
        env = {**os.environ, **OFFLINE_ENV}
        subprocess.run(
            # Run this file by path but without its folder on sys.path (a script's folder
            # comes first there, and this one's sibling package ``http`` would shadow the
            # standard library's).
            [python, "-c", _RUN_AS_MAIN, str(Path(__file__).resolve()), "build-model", str(out)],
            check=True,
            env=env,
            timeout=timeout,
        )
        done.write_text("ok\n")
    return out


# ---------------------------------------------------------------------- the servers


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process dies (Linux), so a
    killed pytest leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


# vLLM's engine-core and worker processes outlive a SIGKILLed API server. This
# ``sitecustomize`` (put on the servers' PYTHONPATH) gives every Python process of a server
# the same "die with your parent" signal, so the whole tree goes when the test process does.
_SITECUSTOMIZE = """\
import os, signal, sys
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)
"""


def _die_with_parent_site(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return folder


@dataclass
class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process (group) on 127.0.0.1."""

    python: str
    model_dir: Path
    log_path: Path
    port: int = 0
    host: str = "127.0.0.1"
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port``, as the gateway names the endpoint."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enforce-eager",
            "--disable-uvicorn-access-log",
            "--seed",
            "0",
            *self.extra_args,
        ]

    def start(self) -> None:
        if not self.port:
            self.port = free_port(self.host)
        env = {**os.environ, **OFFLINE_ENV, **self.env}
        site = _die_with_parent_site(self.log_path.parent / "site")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.model_dir,
                # Its own process group (to kill it whole) but NOT its own session: with
                # the kernel's autogroup scheduling a new session is a separate scheduling
                # group, and vLLM's busy-polling processes then starve this process (the
                # gateway) for seconds at a time while they generate.
                process_group=0,
                preexec_fn=_die_with_parent,
            )

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(self, deadline: float) -> None:
        """Wait until ``/health`` answers 200; raises with the log's tail if it never does."""
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"vLLM on port {self.port} exited with {code} before it was healthy; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"vLLM on port {self.port} not healthy in time; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        proc, self.process = self.process, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        # The engine core and workers are children in the same group: make sure they go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def start_servers(
    python: str,
    model_dir: Path,
    log_dir: Path,
    count: int = 2,
    timeout: float = 180.0,
    env: Callable[[int], Mapping[str, str]] | None = None,
    args: Callable[[int], Sequence[str]] | None = None,
) -> list[VllmServer]:
    """Start ``count`` servers at once and wait for all; stops them all if any fails.

    ``env(i)`` gives server ``i`` its extra environment variables, ``args(i)`` its extra
    command-line arguments.
    """
    servers = [
        VllmServer(
            python,
            model_dir,
            log_dir / f"vllm-{i}.log",
            extra_args=list(args(i) if args else ()),
            env=dict(env(i) if env else {}),
        )
        for i in range(count)
    ]
    try:
        for server in servers:
            server.start()
        deadline = time.monotonic() + timeout
        for server in servers:
            server.wait_healthy(deadline)
    except BaseException:
        for server in servers:
            server.stop(grace=5)
        raise
    return servers


def kv_events_args(pub_port: int, replay_port: int, topic: str) -> list[str]:
    """``--kv-events-config`` for a server publishing on ``pub_port`` with replay on
    ``replay_port``. The host must be a wildcard: with a concrete one vLLM *connects* its
    PUB socket to that address instead of binding it (``ZmqEventPublisher``)."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": topic,
    }
    return ["--kv-events-config", json.dumps(config)]


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build-model":
        sys.exit("usage: vllm_backend.py build-model DIR")
    build_model(Path(sys.argv[2]))
