"""Hugging Face transformers backend: batched sampling with a KV cache, and shared-prefix teacher forcing.

``shared_prefix_log_likelihoods`` is also what the learner actors call on their own (trainable) copy of the
policy to get ``log p_θ(y | h, d)``: it runs under the caller's grad mode, so gradients reach θ when wanted.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from bridge_ray.engines.base import Generation, PrefixGroup, SamplingSpec, WeightsLike
from bridge_ray.engines.buckets import least_padding_runs
from bridge_ray.engines.lm_head import head_log_probs
from bridge_ray.engines.lora_merge import MergedLora, read_lora
from bridge_ray.engines.precision import FP32, Precision
from bridge_ray.engines.prefix_cache import CachedRow, PrefixStore, cached_rows, reusable, seeded_cache, window_of

if TYPE_CHECKING:  # type hints only: the control plane imports this module without transformers
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

# Tokens decoded at the end of a sequence to look for a stop string the newest token may have completed.
_STOP_TAIL_TOKENS = 24


def _device(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device


def final_hidden_states(model: torch.nn.Module, **inputs: Any) -> torch.Tensor:
    """``[B, T, H]`` last-layer hidden states of a causal LM (after its final norm), none of them projected.

    Through the top-level forward, so that hooks on the root module run (DeepSpeed's ZeRO-3 parameter gathering,
    also when gradient checkpointing recomputes); an empty ``logits_to_keep`` leaves the model's own head idle,
    so that callers project only the rows whose next token they score (:func:`~bridge_ray.engines.lm_head.head_logits`).
    """
    no_logits = torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device)
    return model(**inputs, output_hidden_states=True, logits_to_keep=no_logits).hidden_states[-1]


def _empty_cache(model: PreTrainedModel) -> DynamicCache:
    from transformers import DynamicCache  # here, not at import: see the TYPE_CHECKING block above

    return DynamicCache(config=model.config)


def _fork_cache(cache: DynamicCache, copies: int) -> DynamicCache:
    """An independent cache holding ``copies`` rows of a one-row cache, as broadcast views of its keys/values.

    Cache layers replace their key/value tensors on every update (concatenating the new states) instead of
    writing into them, so a shallow copy of each layer is independent of the original (and keeps autograd
    history, unlike a deep copy), and that first update materialises the rows: no copy of the prefix before.
    """
    fork = copy.copy(cache)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in fork.layers:
        if layer.is_initialized:
            layer.keys, layer.values = (t.expand(copies, *t.shape[1:]) for t in (layer.keys, layer.values))
    return fork


def shared_prefix_log_likelihoods(
    model: PreTrainedModel,
    group: PrefixGroup,
    batch_size: int = 8,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """Summed log-probs of the scored tail of each continuation of ``group`` ([k], float32).

    The prefix, extended by the leading tokens all continuations share (the ``<information>`` header of the
    k documents), is encoded once; its KV cache is copied to up to ``batch_size`` continuations of similar
    lengths per forward (right-padded, so every real token sits at its true position and sliding-window
    attention sees exactly what a full forward would). A continuation's last token predicts nothing scored, so
    it is not fed. The hidden states that predict a scored token, of all k continuations, then go through the
    LM head together: each head call reads the whole weight (262k x H for Gemma), which on CPU costs as much
    as the matmul, so one call per block of logits (:func:`head_log_probs`) rather than one per forward.
    """
    device = _device(model)
    shared = _shared_length(group)
    prefix = [*group.prefix, *group.continuations[0][:shared]]
    cache = _empty_cache(model)
    prefix_last = final_hidden_states(
        model, input_ids=torch.tensor([prefix], device=device), past_key_values=cache, use_cache=True
    )[:, -1:]
    tails = [c[shared:] for c in group.continuations]
    hidden, targets, owners = [], [], []
    for rows in least_padding_runs([max(len(t) - 1, 0) for t in tails], batch_size):
        before, scored_ids, row_of = _scored_states(model, cache, prefix_last, len(prefix), [tails[i] for i in rows],
                                                    [group.num_scored[i] for i in rows], pad_token_id)
        hidden.append(before)
        targets.append(scored_ids)
        owners.append(torch.tensor(rows, device=device)[row_of])
    logp = head_log_probs(model, torch.cat(hidden), torch.cat(targets))
    # log p(y | context) = Σ_j log p(y_j | context, y_<j) per continuation (Appendix A).
    return torch.zeros(len(tails), dtype=torch.float32, device=device).index_add(0, torch.cat(owners), logp)


def _shared_length(group: PrefixGroup) -> int:
    """How many leading tokens every continuation has in common, none of them scored."""
    limit = min(len(c) - n for c, n in zip(group.continuations, group.num_scored, strict=True))
    first = group.continuations[0]
    length = 0
    while length < limit and all(c[length] == first[length] for c in group.continuations):
        length += 1
    return length


def _scored_states(
    model: PreTrainedModel,
    prefix_cache: DynamicCache,
    prefix_last: torch.Tensor,
    prefix_length: int,
    tails: list[list[int]],
    num_scored: list[int],
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hidden states that predict the last ``num_scored[r]`` tokens of each of ``tails`` (all following the
    prefix), those tokens, and the index into ``tails`` of each: ``[S, H]``, ``[S]``, ``[S]``."""
    device = prefix_last.device
    width = max(len(t) for t in tails)
    ids = torch.tensor([[*t, *[pad_token_id] * (width - len(t))] for t in tails], device=device)
    lengths = torch.tensor([len(t) for t in tails], device=device)[:, None]
    columns = torch.arange(width, device=device)
    scored = (columns < lengths) & (columns >= lengths - torch.tensor(num_scored, device=device)[:, None])
    # Token j of a tail is predicted by the hidden state before it: the prefix's last one for j = 0.
    before = prefix_last.expand(len(tails), -1, -1)
    if width > 1:
        fed = columns[:-1] < lengths - 1
        attention = torch.cat([torch.ones((len(tails), prefix_length), dtype=torch.long, device=device), fed.long()],
                              1)
        body = final_hidden_states(
            model,
            input_ids=ids[:, :-1],
            attention_mask=attention,
            position_ids=(prefix_length + columns[:-1]).expand(len(tails), -1),
            past_key_values=_fork_cache(prefix_cache, len(tails)),
            use_cache=True,
        )
        before = torch.cat([before, body], dim=1)
    return before[scored], ids[scored], scored.nonzero()[:, 0]


class HFEngine:
    """A transformers causal LM as a :class:`~bridge_ray.engines.base.GenerationEngine`."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 16,
        score_batch_size: int = 8,
        seed: int = 0,
        precision: Precision = FP32,
        prefix_cache: bool = True,
        merge_adapter: bool = True,
    ) -> None:
        """``precision``: ``model``'s weights are already in ``precision.weights``; forwards run in its context.
        ``prefix_cache``: a prompt that extends a sequence of the last generate call reuses its keys and values
        (:mod:`~bridge_ray.engines.prefix_cache`). ``merge_adapter``: :meth:`load_adapter` merges a LoRA adapter
        into the weights (:mod:`~bridge_ray.engines.lora_merge`) rather than serving it through peft."""
        self.model = model.eval()
        self.precision = precision
        _cache_weight_casts(model, precision)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.score_batch_size = score_batch_size
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._generator = torch.Generator(device=_device(model)).manual_seed(seed)
        self._version = 0
        self._adapter_loads = 0
        self.prefix_cache = prefix_cache
        self._merged = MergedLora(model) if merge_adapter else None
        self._window = window_of(model)
        self._prefix = PrefixStore()

    @property
    def weight_version(self) -> int:
        return self._version

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], spec: SamplingSpec
    ) -> list[Generation]:
        if len(prompts) != len(max_tokens):
            raise ValueError(f"{len(prompts)} prompts but {len(max_tokens)} max_tokens")
        # Similar lengths decode together (less padding); results come back in the caller's order.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        kept: list[CachedRow] = []
        with self.precision.context(_device(self.model).type):  # one context: each weight is cast once
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = self._generate_batch(
                    [list(prompts[i]) for i in rows], [max_tokens[i] for i in rows], spec, kept
                )
                for i, gen in zip(rows, batch, strict=True):
                    results[i] = gen
        self._prefix = PrefixStore(kept)  # the next call's prompts extend this call's sequences, not older ones
        return results  # type: ignore[return-value]

    def _generate_batch(
        self, prompts: list[list[int]], max_tokens: list[int], spec: SamplingSpec, kept: list[CachedRow]
    ) -> list[Generation]:
        """Decode one batch; a row leaves it when it finishes (its keys and values with it), so that decode steps
        run on the live rows only. With the prefix cache, reuse the last call's columns where a prompt extends its
        sequences, and append this batch's rows to ``kept``."""
        device = _device(self.model)
        n = len(prompts)
        hits = [self._prefix.match(p) for p in prompts] if self.prefix_cache else [(None, 0)] * n
        tails = [p[used:] for p, (_, used) in zip(prompts, hits, strict=True)]
        reused, width = max(used for _, used in hits), max(len(t) for t in tails)
        if reused and not reusable(reused + width + max(max_tokens), self._window):
            hits, tails, reused, width = [(None, 0)] * n, prompts, 0, max(len(p) for p in prompts)
        if reused:
            cache, attention = seeded_cache(_empty_cache(self.model), hits)
        else:
            cache, attention = _empty_cache(self.model), torch.zeros((n, 0), dtype=torch.long, device=device)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=device)
        fresh = torch.zeros((n, width), dtype=torch.long, device=device)
        for r, t in enumerate(tails):  # left padding: every row's next token lands in the last column
            ids[r, width - len(t) :] = torch.tensor(t, device=device)
            fresh[r, width - len(t) :] = 1
        attention = torch.cat([attention, fresh], dim=1)
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)[:, reused:]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        finish: list[tuple[str, str | None] | None] = [None if m > 0 else ("length", None) for m in max_tokens]
        live = list(range(n))  # the rows still in the batch (the cache's rows, in order)
        step_ids = ids
        while any(finish[r] is None for r in live):
            logits = self.model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1].float()
            if spec.temperature > 0:  # the sampling distribution softmax(logits / T), whose log-probs the ratio uses
                logits = logits / spec.temperature
            uniforms = None
            if spec.temperature > 0:  # one per row of the batch, finished ones too: the draws never depend on them
                uniforms = torch.rand((n, 1), generator=self._generator, dtype=torch.float64, device=device)[live]
            sampled = _sample(logits, spec, uniforms)
            sampled_logp = torch.log_softmax(logits, dim=-1).gather(1, sampled[:, None]).squeeze(1)
            for i, r in enumerate(live):
                if finish[r] is None:
                    tokens[r].append(int(sampled[i]))
                    logps[r].append(float(sampled_logp[i]))
                    finish[r] = self._finished(tokens[r], max_tokens[r], spec.stop)
            done = [i for i, r in enumerate(live) if finish[r] is not None]
            if done:  # finished rows leave the batch: no more forward passes for them
                if self.prefix_cache:  # a finished row's last token is the one not fed
                    kept += cached_rows(cache, attention, {i: prompts[live[i]] + tokens[live[i]][:-1] for i in done})
                stay = [i for i, r in enumerate(live) if finish[r] is None]
                if not stay:
                    break
                index = torch.tensor(stay, device=device)
                cache.batch_select_indices(index)
                attention, positions, sampled = attention[index], positions[index], sampled[index]
                live = [live[i] for i in stay]
            step_ids = sampled[:, None]
            attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
            positions = positions[:, -1:] + 1
        return [
            Generation(token_ids=t, logprobs=lp, finish_reason=f[0], stop_string=f[1])  # type: ignore[arg-type]
            for t, lp, f in zip(tokens, logps, finish, strict=True)
        ]

    def _finished(self, tokens: list[int], max_tokens: int, stop: tuple[str, ...]) -> tuple[str, str | None] | None:
        if tokens[-1] in self.eos_ids:
            return ("eos", None)
        if stop:
            tail = self.tokenizer.decode(tokens[-_STOP_TAIL_TOKENS:], skip_special_tokens=False)
            hit = min((s for s in stop if s in tail), key=tail.find, default=None)
            if hit is not None:
                return ("stop", hit)
        if len(tokens) >= max_tokens:
            return ("length", None)
        return None

    def continuation_log_probs(self, groups: Sequence[PrefixGroup]) -> list[torch.Tensor]:
        with torch.no_grad(), self.precision.context(_device(self.model).type):
            return [
                shared_prefix_log_likelihoods(self.model, g, self.score_batch_size, self.pad_id) for g in groups
            ]

    def reseed(self, seed: int) -> None:
        self._generator.manual_seed(seed)

    @torch.no_grad()
    def update_weights(self, weights: WeightsLike, version: int) -> None:
        named = dict(weights.items() if isinstance(weights, Mapping) else weights)
        params = self.model.state_dict(keep_vars=True)  # checkpoint names, tied aliases included
        unknown = sorted(set(named) - set(params))
        if unknown:
            raise KeyError(f"update_weights: the policy has no parameters named {unknown[:5]}")
        for name, value in named.items():
            if params[name].shape != value.shape:
                raise ValueError(f"update_weights: {name} has shape {tuple(value.shape)}, expected "
                                 f"{tuple(params[name].shape)}")
        if self._merged is not None:  # whole weights replace a merged adapter's
            self._merged.restore()
        for name, value in named.items():
            params[name].copy_(value)
        self._version = version
        self._prefix = PrefixStore()  # keys and values of the old weights

    def load_adapter(self, path: str, version: int) -> None:
        """Swap in the LoRA adapter at ``path``: merged into the weights, or served by peft (``merge_adapter``).

        Either way a file that lacks factors its config names is refused, and the adapter in use stays.
        """
        if self._merged is not None:
            self._merged.merge(read_lora(path, self.model))  # validated whole before any weight changes
        else:
            self._load_peft_adapter(path, version)
        self._version = version
        self._prefix = PrefixStore()  # keys and values of the old adapter

    def _load_peft_adapter(self, path: str, version: int) -> None:
        """The adapter beside the base weights, through transformers' peft integration (base weights untouched).

        Each load gets a name of its own: a restarted sampler is given the current adapter and then its re-sent
        call, which can be the push of that same version. A file that lacks factors its config names is refused
        (transformers would start them from their initialisation), and the adapter in use stays.
        """
        self._adapter_loads += 1
        name = f"policy-v{version}-{self._adapter_loads}"
        previous = list(self.model.peft_config) if getattr(self.model, "_hf_peft_config_loaded", False) else []
        with _adapter_load_reports_off():
            info = self.model.load_adapter(path, adapter_name=name)
        missing = sorted(key for key in info.missing_keys if f".{name}." in key)
        if missing:  # the adapter stays as it was
            if previous:
                self.model.set_adapter(previous[-1])
            self.model.delete_adapter(name)
            raise ValueError(f"LoRA adapter {path}: {len(missing)} of the factors its adapter_config.json names are "
                             f"not in its weights file, e.g. {missing[0].replace(f'.{name}.', '.')}")
        self.model.set_adapter(name)
        for old in previous:
            self.model.delete_adapter(old)
        self.model.eval()
        _cache_weight_casts(self.model, self.precision)


def _cache_weight_casts(model: PreTrainedModel, precision: Precision) -> None:
    """Let autocast cast each weight once per context rather than at every call that reads it.

    ``torch.autocast`` keeps the bf16 copy of an fp32 weight for the rest of its context only if the weight is a
    leaf that requires grad. peft freezes the base weights when an adapter loads, and then every decode step and
    every scoring forward cast every matrix again (Gemma 3 270M's tied LM head alone is 168M values). The engine
    computes under ``no_grad``, so requiring grad records nothing.
    """
    if precision.autocast:
        model.requires_grad_(True)


@contextlib.contextmanager
def _adapter_load_reports_off() -> Iterator[None]:
    """Silence what transformers and peft say while a second adapter loads beside the first.

    transformers counts every LoRA parameter already in the model as expected of the new file, so its load report
    calls the previous adapter's factors MISSING and "newly initialized" (they are neither: they belong to the
    adapter being replaced), and peft warns that the model now holds several adapters. ``load_adapter`` checks
    the new adapter's own keys instead.
    """
    logger = logging.getLogger("transformers.integrations.peft")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
            yield
    finally:
        logger.setLevel(level)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the generation config (may list several, e.g. chat models) and the tokenizer."""
    ids: list[int] = []
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for i in source if isinstance(source, list) else [source]:
            if i is not None and i not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("the policy defines no EOS token (generation_config.eos_token_id / tokenizer.eos_token)")
    return ids


def _sample(logits: torch.Tensor, spec: SamplingSpec, uniforms: torch.Tensor | None) -> torch.Tensor:
    """Greedy at temperature 0; otherwise nucleus (top-p) filtering, then an inverse-CDF draw from
    temperature-scaled ``logits`` with one of ``uniforms`` ([rows, 1] in [0, 1), float64) per row.

    One uniform per row keeps the draw cheap on CPU for a vocabulary of 10^5 entries (where multinomial, or Gumbel
    noise over the whole vocabulary, dominate the step time)."""
    if spec.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if spec.top_p < 1.0:
        sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= spec.top_p  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, sorted_idx, sorted_probs)
    if uniforms is None:
        raise ValueError("a draw at temperature > 0 needs one uniform per row")
    cdf = probs.double().cumsum(dim=-1)
    return torch.searchsorted(cdf, uniforms * cdf[:, -1:]).squeeze(1).clamp(max=probs.shape[-1] - 1)
