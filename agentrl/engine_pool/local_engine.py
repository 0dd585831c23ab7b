"""LocalEngine: an in-process PyTorch/transformers engine with continuous batching.

Scheduling. One asyncio task (the scheduler) owns every request's state; all model work runs on one
dedicated worker thread, so the event loop never blocks on a forward pass. Each iteration of the
scheduler produces one token for every active request:

1. requests that finished or were aborted leave the batch (their KV is copied to the prefix cache);
2. running requests feed their last token through the shared KV cache (`DecodeBatch.step`);
3. queued requests are prefilled, up to ``max_batch_size`` rows in all, and join the batch; their
   first token is sampled in this same iteration.

So a request that arrives while a step runs joins at the next step, not after the batch drains.
A request that is aborted, or whose ``generate`` call is cancelled, frees its row at the next step.

Prefix caching (`agentrl.engine_pool.prefix_cache`, `agentrl.engine_pool.admission`). When a
request leaves the batch, for whatever reason (stop, length, abort, a cancelled call), the KV of
the tokens it fed (its input ids and every sampled token but the last, which was never fed) is
copied into ``prefix_cache``, keyed by those token ids. A queued request whose context shares a
prefix with an entry prefills only the rest, at positions continuing after the prefix, on top of a
copy of the cached KV (the entry stays in the cache), in its own forward pass when its remaining
length differs widely from the other admissions', and then joins the batch like any other row. A
conversation's next turn (previous prompt + completion + new messages) so computes only the last
completion token and the new messages; aborted partial rollouts resume the same way. Matching is by
token ids only (``session_id`` is a lookup hint). ``prefix_cache_tokens`` bounds the tokens held
(least-recently-used entries are evicted; ``0`` disables the cache); ``end_session`` drops the
entry of a session that will make no more requests (an ended episode's KV is dead weight until it
would be evicted); ``flush_cache`` empties it;
``stats`` counts hit and computed tokens. Memory: ``prefix_cache.nbytes``, at most
``prefix_cache_tokens`` times the KV of one token (46 KB for SmolLM2-135M in float32, so 3 GB at
the default 65536), on top of the running batch's own cache.

Weights. ``update_weights`` runs between iterations (it waits for the one in progress) and bumps
``weight_version``. The KV cache of running requests was computed by the old weights, so the next
iteration rebuilds it by prefilling each running request's input ids + tokens so far; the prefix
cache is emptied by the update, and rows computed before it are never stored: after an update,
every new token is a function of the new weights and the token ids alone, which is what a trainer
recomputing log-probs assumes. ``release_weights`` frees the weights and the prefix cache of an
idle engine (what SGLang's ``release_memory_occupation`` frees), for a trainer in the same process
to use while it trains; the next update must bring back every parameter (a weight sync does), and
requests made meanwhile wait for it. ``token_weight_versions`` records which weights produced each
token. With ``fp8_weights=True`` the engine computes with blockwise-FP8 weights, as an SGLang server
started from a blockwise-FP8 checkpoint does (`agentrl.fp8_weights`): at start and on every update,
each linear weight but the LM head's (less ``fp8_ignored``) is rounded through FP8 (128x128 blocks)
and dequantised to the engine's dtype, so the trainer's mismatch metric shows what FP8 rollout
weights cost. Updates may send FP8 weights with their ``weight_scale_inv`` or full-precision ones.

Guaranteed: per-request sampling (own ``torch.Generator`` seeded from ``SamplingParams.seed``; see
`agentrl.engine_pool.sampling` for which distribution log-probs refer to); constrained decoding
(``json_schema``, ``regex``, ``ebnf``, ``structural_tag``: `agentrl.engine_pool.grammar`, compiled off
the event loop, a request ending with its grammar); invalid input ids
(empty, outside the vocabulary, no room left in the model's context) raise ``ValueError`` to that
caller only; a failing forward pass fails the requests in it with ``EngineError`` and the engine
keeps serving; if the scheduler itself dies, every pending and later call raises ``EngineError``;
a request served from the prefix cache gets the tokens and log-probs it would get without it, up
to the same float rounding as batching.
Not guaranteed: bit-identical logits between a request run alone and in a batch, or with and
without a cached prefix (padding and KV computed in another batch change matmul shapes;
differences are float rounding, ~1e-5 in float32, enough to flip only exact near-ties); fairness
beyond first-come first-served admission.

The engine puts the model in eval mode and runs it under ``torch.inference_mode``. Sharing one
model object with a trainer is possible (tests do it) but the trainer's ``train()`` then also
applies to generation, which matters only for models with dropout.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentrl.engine_pool.admission import cache_rows, prefill_admission
from agentrl.engine_pool.engine import (
    EngineError,
    FinishReason,
    GenerateResult,
    SamplingParams,
    check_input_ids,
)
from agentrl.engine_pool.grammar import GrammarCompiler, accept, constrain_logits
from agentrl.engine_pool.kv_batch import DecodeBatch
from agentrl.engine_pool.penalties import penalized_logits
from agentrl.engine_pool.prefix_cache import PrefixCache
from agentrl.engine_pool.request_state import EngineStats, RequestState
from agentrl.engine_pool.sampling import request_generator, sample_next_tokens
from agentrl.engine_pool.stop_strings import stop_tail_tokens
from agentrl.engine_pool.weights import (
    apply_named_tensors,
    release_parameters,
    released_parameter_names,
    round_weights_through_fp8,
)
from agentrl.fp8_weights import fp8_weight_names
from agentrl.malloc import trim_heap
from agentrl.models import load_model, load_tokenizer

T = TypeVar("T")


class LocalEngine:
    """The embedded engine; implements `agentrl.engine_pool.engine.Engine`.

    ``model`` is ``"smollm2"``, a local model directory or ``.gguf`` path (loaded in ``dtype`` when
    the engine starts), or an already-loaded ``PreTrainedModel`` (used as is, not copied).
    End-of-sequence ids come from ``eos_token_ids``, else ``tokenizer``, else the model reference's
    tokenizer, else the model's generation config. ``prefix_cache_tokens`` bounds the prefix cache
    (``0`` disables it); ``prefix_cache`` may be inspected (while paused, to see a settled state),
    not modified. ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``) is where the model, its inputs,
    KV cache and sampling live; by default a loaded model stays where it is and a loaded reference
    goes to the CPU. ``fp8_weights`` makes it compute with blockwise-FP8 weights (see the module
    docstring); a passed model's weights are then rounded in place. Use as
    ``async with LocalEngine(...) as engine``.
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel = "smollm2",
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_batch_size: int = 32,
        dtype: str = "float32",
        eos_token_ids: Iterable[int] | None = None,
        weight_version: int = 0,
        prefix_cache_tokens: int = 65536,
        fp8_weights: bool = False,
        fp8_ignored: Sequence[str] = (),
        device: str | torch.device | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._source = model
        self._model: PreTrainedModel | None = model if isinstance(model, PreTrainedModel) else None
        self._tokenizer = tokenizer
        self._dtype = dtype
        self._device = torch.device(device) if device is not None else None
        self._fp8_weights = fp8_weights
        self._fp8_ignored = tuple(fp8_ignored)
        self._fp8_names: frozenset[str] = frozenset()  # set from the model in start()
        self._eos: frozenset[int] = (
            frozenset(eos_token_ids) if eos_token_ids is not None else frozenset()
        )
        self.max_batch_size = max_batch_size
        self._weight_version = weight_version
        self._weights_epoch = 0  # bumped by every update_weights call
        self._cache_epoch = 0  # epoch the live KV cache was computed under
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-engine")
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []  # row i of self._batch is self._running[i]
        self._batch: DecodeBatch | None = None
        self._model_lock = asyncio.Lock()  # one iteration or one weight update at a time
        self._wakeup = asyncio.Event()
        self._paused = False
        self._released = False  # the weights are freed until an update brings all of them back
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._ids = itertools.count()
        self._grammars: GrammarCompiler | None = None  # made at the first constrained request
        self._vocab_size = 0  # these two are read from the model in start()
        self._max_context: int | None = None
        self.stats = EngineStats()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> LocalEngine:
        """Load the model (off the event loop) and start the scheduler; idempotent."""
        if self._closed:
            raise EngineError("LocalEngine is closed")
        if self._task is not None:
            return self
        if self._model is None:
            self._model = await self._in_worker(load_model, self._source, self._dtype)
        model = self._model
        if self._device is not None and model.device != self._device:
            await self._in_worker(model.to, self._device)  # moves it in place (returns it)
        self._device = model.device
        if self._tokenizer is None and not isinstance(self._source, PreTrainedModel):
            self._tokenizer = await self._in_worker(load_tokenizer, self._source)
        if not self._eos:
            self._eos = await self._in_worker(self._default_eos)
        model.eval()
        if self._fp8_weights:
            self._fp8_names = fp8_weight_names(model, self._fp8_ignored)
            await self._in_worker(round_weights_through_fp8, model, self._fp8_names)
        # An nn.Embedding's int attribute; Module.__getattr__'s type knows only tensors and modules.
        self._vocab_size = cast(int, model.get_input_embeddings().num_embeddings)
        self._max_context = getattr(model.config, "max_position_embeddings", None)
        self._task = asyncio.create_task(self._schedule(), name="LocalEngine.scheduler")
        return self

    async def __aenter__(self) -> LocalEngine:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Abort every request (partial results, ``"abort"``), stop the scheduler and the thread."""
        if self._closed:
            return
        self._closed = True
        self._finish_matching(None, "abort")
        self._wakeup.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=False)

    # -- the Engine protocol -----------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def serving(self) -> bool:
        """Whether the scheduler runs and requests are accepted (started, not closed or dead)."""
        return self._task is not None and not self._task.done() and not self._closed

    @property
    def model(self) -> PreTrainedModel:
        if self._model is None:
            raise EngineError("LocalEngine has not loaded its model yet: call start()")
        return self._model

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingParams, session_id: str | None = None
    ) -> GenerateResult:
        """Queue one request and wait for its result (see the module docstring for scheduling)."""
        self._check_serving()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        ids = check_input_ids(input_ids, self._vocab_size, self._max_context)
        if (sampling.stop or sampling.constraint) and self._tokenizer is None:
            what = "stop strings" if sampling.stop else "constrained decoding"
            raise ValueError(
                f"{what} need the engine's tokenizer: pass LocalEngine(tokenizer=...) "
                "with a model object"
            )
        grammar = await self._grammar(sampling) if sampling.constraint else None
        request = RequestState(
            request_id=f"local-{next(self._ids)}",
            session_id=session_id,
            input_ids=ids,
            sampling=sampling,
            generator=request_generator(sampling, self._device or "cpu"),
            future=asyncio.get_running_loop().create_future(),
            stop_tail_tokens=stop_tail_tokens(sampling.stop, self._encode) if sampling.stop else 0,
            grammar=grammar,
        )
        self._waiting.append(request)
        self._wakeup.set()
        return await request.future

    async def _grammar(self, sampling: SamplingParams) -> Any:
        """A matcher for the request's constraint, compiled off the event loop and the model's
        thread (a large JSON schema takes seconds); ``ValueError`` if the constraint is invalid."""
        constraint = sampling.constraint
        assert constraint is not None and self._tokenizer is not None
        if self._grammars is None:
            self._grammars = await asyncio.to_thread(
                GrammarCompiler, self._tokenizer, self._vocab_size, self._eos
            )
        compiled = await asyncio.to_thread(self._grammars.compile, *constraint)
        return GrammarCompiler.matcher(compiled, sampling.stop_token_ids)

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load tensors between iterations (see `agentrl.engine_pool.weights`); set the version.

        ``version`` must not decrease; repeating it is allowed (several buckets of one update).
        """
        self._check_serving()
        if version < self._weight_version:
            raise ValueError(f"weight version {version} is older than {self._weight_version}")
        async with self._model_lock:
            await self._in_worker(
                functools.partial(apply_named_tensors, fp8_names=self._fp8_names),
                self.model,
                named_tensors,
            )
            self._weight_version = version
            self._weights_epoch += 1
            self.prefix_cache.clear()  # computed by the old weights
            if self._released and not released_parameter_names(self.model):
                self._released = False
                self._wakeup.set()

    async def release_weights(self) -> int:
        """Free the weights and the prefix cache (see the module docstring); return the bytes
        freed. ``EngineError`` while a request is queued or running. Not for a model shared with
        a trainer: its parameters are the ones freed."""
        self._check_serving()
        async with self._model_lock:
            await self._drop_done()
            if self._running or any(not r.done for r in self._waiting):
                raise EngineError(
                    "release_weights needs an idle engine: requests are queued or running"
                )
            freed = self.prefix_cache.nbytes
            self.prefix_cache.clear()
            freed += await self._in_worker(release_parameters, self.model)
            self._released = True
            await self._in_worker(trim_heap)  # freed heap pages go back to the system now
        return freed

    @property
    def released(self) -> bool:
        """Whether the weights are freed (:meth:`release_weights`) and not all loaded again."""
        return self._released

    async def get_weights_by_name(self, name: str, truncate_size: int = 100) -> torch.Tensor:
        """The first ``truncate_size`` rows of the weight ``name`` (a ``state_dict`` key) as this
        engine holds it, as a float32 CPU copy (exact for float32 and bfloat16 weights): SGLang's
        ``get_weights_by_name``, to check what a weight sync delivered. ``KeyError`` for an
        unknown name. Waits for the step in progress, so it never reads a half-loaded update."""
        self._check_serving()
        async with self._model_lock:
            if self._released and name in released_parameter_names(self.model):
                raise EngineError(f"the weight {name!r} is released (release_weights)")
            return await self._in_worker(_weight_rows, self.model, name, truncate_size)

    async def flush_cache(self) -> None:
        """Empty the prefix cache (SGLang's ``/flush_cache``); running requests are unaffected.

        For example between benchmark runs that repeat the same prompts.
        """
        async with self._model_lock:
            self.prefix_cache.clear()

    async def end_session(self, session_id: str) -> None:
        """``session_id`` will make no more requests: drop its prefix-cache entry (a prefix it
        shares with other sessions stays in theirs). A request of it still running is cached
        when it leaves the batch, as any other, and evicted in turn."""
        async with self._model_lock:
            if self.serving:
                await self._drop_done()  # a row that finished but has not left yet is cached first
            self.prefix_cache.release(session_id)

    async def pause(self) -> None:
        self._paused = True
        async with self._model_lock:  # the iteration in progress, if any, finishes first
            pass

    async def resume(self) -> None:
        self._paused = False
        self._wakeup.set()

    async def abort(self, session_id: str | None = None) -> None:
        self._finish_matching(session_id, "abort")
        self._wakeup.set()

    # -- scheduler ---------------------------------------------------------------------------

    async def _schedule(self) -> None:
        try:
            while await self._wait_for_work():
                async with self._model_lock:
                    await self._iterate()
        except BaseException as exc:
            self._failure = exc
            error = EngineError(f"LocalEngine's scheduler died ({exc!r}); the engine cannot serve")
            error.__cause__ = exc
            for request in [*self._waiting, *self._running]:
                request.fail(error)
            if not isinstance(exc, Exception):  # cancellation, KeyboardInterrupt, SystemExit
                raise

    async def _wait_for_work(self) -> bool:
        """Block until there is something to do and we are not paused; False once closed."""
        while not self._closed and (
            self._paused or self._released or not (self._waiting or self._running)
        ):
            self._wakeup.clear()
            await self._wakeup.wait()
        return not self._closed

    async def _iterate(self) -> None:
        """One scheduler iteration: every active request gets one token (or fails)."""
        await self._drop_done()
        if self._batch is not None and self._cache_epoch != self._weights_epoch:
            to_prefill, self._running, self._batch = self._running, [], None  # rebuild the cache
        else:
            to_prefill = []
        while self._waiting and len(self._running) + len(to_prefill) < self.max_batch_size:
            request = self._waiting.popleft()
            if not request.done:
                to_prefill.append(request)
        logits: list[torch.Tensor] = []  # (rows, V) blocks, in self._running order
        if self._batch is not None:
            try:
                last = [r.token_ids[-1] for r in self._running]
                logits.append(await self._in_worker(self._batch.step, self.model, last))
            except Exception as exc:
                self._fail(self._running, exc)
                self._running, self._batch, logits = [], None, []
        if to_prefill:
            try:
                logits.append(await self._admit(to_prefill))
            except Exception as exc:
                self._fail(to_prefill, exc)
        if not self._running:
            return
        try:
            sampled = await self._in_worker(self._sample, torch.cat(logits))
        except Exception as exc:
            self._fail(self._running, exc)
            self._running, self._batch = [], None
            return
        self._record(*sampled)

    async def _admit(self, requests: list[RequestState]) -> torch.Tensor:
        """Prefill ``requests`` (input ids + tokens so far) on top of their cached prefixes and
        add them to the batch; return their next-token logits in ``self._running`` order."""
        admission = await self._in_worker(
            prefill_admission,
            self.model,
            self.prefix_cache,
            [r.context for r in requests],
            [r.session_id for r in requests],
        )
        if self._batch is None:
            self._batch = admission.batch
        else:
            await self._in_worker(self._batch.extend, admission.batch)
        self._running += [requests[i] for i in admission.order]
        self._cache_epoch = self._weights_epoch
        self.stats.prefills += admission.forwards
        self.stats.prefix_hit_tokens += admission.cached_tokens
        self.stats.prefill_tokens += admission.computed_tokens
        return admission.logits

    def _sample(self, logits: torch.Tensor) -> tuple[list[int], list[float]]:
        rows = self._running
        logits = penalized_logits(logits, [(r.sampling, r.token_ids) for r in rows], self._eos)
        logits = constrain_logits(logits, [r.grammar for r in rows])  # after penalties, as SGLang
        return sample_next_tokens(logits, [r.sampling for r in rows], [r.generator for r in rows])

    def _record(self, tokens: list[int], logprobs: list[float]) -> None:
        """Append each row's new token, finishing requests that hit a stop or a limit."""
        version = self._weight_version
        self.stats.steps += 1
        self.stats.max_rows = max(self.stats.max_rows, len(self._running))
        for request, token, logprob in zip(self._running, tokens, logprobs, strict=True):
            if request.done:  # aborted or cancelled while the step ran: discard its token
                continue
            ended = False
            if request.grammar is not None:
                try:
                    ended = accept(request.grammar, token)
                except RuntimeError as exc:
                    self._fail([request], exc)
                    continue
            self.stats.tokens_generated += 1
            if request.append(token, logprob, version, self._eos, self._max_context, self._decode):
                self.stats.requests_finished += 1
            elif ended:  # the grammar's end, checked after stop tokens and limits (as SGLang)
                request.finish("stop", version)
                self.stats.requests_finished += 1

    async def _drop_done(self) -> None:
        """Remove finished rows from the batch, keeping their KV in the prefix cache first."""
        done = [i for i, request in enumerate(self._running) if request.done]
        if not done:
            return
        if self._batch is not None and self._cache_epoch == self._weights_epoch:
            leaving = [self._running[i] for i in done]  # finished, aborted or cancelled
            await self._in_worker(
                cache_rows,
                self.prefix_cache,
                self._batch,
                done,
                [r.context for r in leaving],
                [r.session_id for r in leaving],
            )
        keep = sorted(set(range(len(self._running))) - set(done))
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._batch = None
        elif self._batch is not None:
            await self._in_worker(self._batch.select, keep)

    def _fail(self, requests: Sequence[RequestState], exc: Exception) -> None:
        error = EngineError(f"the model failed on this request's batch: {exc!r}")
        error.__cause__ = exc
        for request in requests:
            request.fail(error)

    def _finish_matching(self, session_id: str | None, reason: FinishReason) -> None:
        for request in [*self._waiting, *self._running]:
            if session_id is None or request.session_id == session_id:
                request.finish(reason, self._weight_version)

    def _check_serving(self) -> None:
        if self._failure is not None:
            raise EngineError(
                f"LocalEngine's scheduler died ({self._failure!r}); the engine cannot serve"
            ) from self._failure
        if self._closed:
            raise EngineError("LocalEngine is closed")
        if self._task is None:
            raise EngineError("LocalEngine is not started: use `async with LocalEngine(...)`")

    def _decode(self, token_ids: list[int]) -> str:
        assert self._tokenizer is not None  # generate() refuses stop strings without one
        return str(self._tokenizer.decode(token_ids))

    def _encode(self, text: str) -> list[int]:
        assert self._tokenizer is not None
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _default_eos(self) -> frozenset[int]:
        if self._tokenizer is not None and self._tokenizer.eos_token_id is not None:
            return frozenset([self._tokenizer.eos_token_id])
        eos = self.model.generation_config.eos_token_id
        return frozenset([eos] if isinstance(eos, int) else eos or ())

    async def _in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


def _weight_rows(model: PreTrainedModel, name: str, truncate_size: int) -> torch.Tensor:
    weights = model.state_dict(keep_vars=True)
    if name not in weights:
        raise KeyError(f"no weight named {name!r}")
    return weights[name].detach()[:truncate_size].to("cpu", torch.float32, copy=True)
