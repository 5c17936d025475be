"""Hugging Face encoders: a frozen passage encoder g(d) and a query encoder f_eta(q) with a peft LoRA.

g loads ``spec.passage_encoder`` and f loads ``spec.model``: one model for a symmetric encoder, two for a pair
(MedCPT, DPR), whose LoRA adapts the query model only. Both go through :func:`embed_texts`, so pooling,
normalisation, prefixes and truncation are the same everywhere: the scores a sampler logs at rollout time equal
the scores the retriever learner recomputes with the same adapter weights. The backbone's own dropout is switched
off at load, so only LoRA dropout (zero by default, active in train mode only) can make two evaluations differ.

transformers and peft are imported where a model is built: the job driver and the coordinator import this module
(through the roles' handles) and never build one, and the two libraries cost them ~10 s of start-up each.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from bridge_ray.config.encoders import EncoderSpec, Pooling
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.retrieval.corpus import Document

if TYPE_CHECKING:
    from bridge_ray.config import RetrievalConfig

# LoRA targets per architecture (config.model_type); others fall back to peft's own table.
DEFAULT_TARGET_MODULES: dict[str, list[str]] = {
    "bert": ["query", "key", "value"],
    "roberta": ["query", "key", "value"],
    "xlm-roberta": ["query", "key", "value"],
    "mpnet": ["q", "k", "v"],
    "dpr": ["query", "key", "value"],  # a BERT inside (see load_backbone)
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_backbone(name: str, device: torch.device, dtype: torch.dtype = torch.float32):
    """Tokenizer and transformer of model ``name``, in eval mode with every dropout of the backbone set to 0.

    A DPR checkpoint loads by its own class (``AutoModel`` would read a context encoder's weights into a question
    encoder, as random ones) and is unwrapped to its BERT, whose [CLS] output is DPR's ``pooler_output``.
    """
    import transformers  # where a model is built: see the module docstring

    path = resolve_model_path(name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    config = transformers.AutoConfig.from_pretrained(path)
    if config.model_type == "dpr":
        architecture = (config.architectures or ["none"])[0]
        if architecture not in ("DPRQuestionEncoder", "DPRContextEncoder") or getattr(config, "projection_dim", 0):
            raise ValueError(f"encoder {name}: a DPR {architecture} with projection_dim "
                             f"{getattr(config, 'projection_dim', 0)}; only DPR's question and context encoders "
                             "without a projection (projection_dim 0: the [CLS] output) are supported")
        model = getattr(transformers, architecture).from_pretrained(path, dtype=dtype, use_safetensors=True)
        model = model.base_model.base_model  # DPR*Encoder -> DPREncoder -> BertModel
    else:
        model = transformers.AutoModel.from_pretrained(path, dtype=dtype, use_safetensors=True)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return tokenizer, model.to(device).eval()


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """``[B, T, H] -> [B, H]``: masked mean over tokens, or the first ([CLS]) token."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def embed_texts(
    model: nn.Module, tokenizer, texts: Sequence[str], *, prefix: str, max_length: int, spec: EncoderSpec
) -> torch.Tensor:
    """One forward pass: prefix, truncate, encode, pool, normalise -> float32 ``[B, D]`` (grad if enabled)."""
    device = next(model.parameters()).device
    batch = tokenizer(
        [prefix + t for t in texts], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    ).to(device)
    hidden = model(**batch).last_hidden_state
    pooled = pool(hidden, batch["attention_mask"], spec.pooling).float()
    return nn.functional.normalize(pooled, dim=-1) if spec.normalize else pooled


class PassageEncoder:
    """The frozen document encoder g(d) (``spec.passage_encoder``), used once per corpus to build the index."""

    def __init__(self, spec: EncoderSpec, device: str = "auto", dtype: str = "auto", batch_size: int = 64):
        self.spec = spec
        self.device = resolve_device(device)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        self.tokenizer, self.model = load_backbone(spec.passage_encoder, self.device, DTYPES[dtype])
        self.batch_size = batch_size
        self.dim = int(self.model.config.hidden_size)

    @torch.no_grad()
    def embed_passages(self, documents: Sequence[Document]) -> np.ndarray:
        """``[N, D]`` float32 of each ``contents`` verbatim; batches group similar lengths to waste less padding."""
        texts = [d.contents for d in documents]
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            out[rows] = (
                embed_texts(
                    self.model,
                    self.tokenizer,
                    [texts[i] for i in rows],
                    prefix=self.spec.passage_prefix,
                    max_length=self.spec.max_passage_length,
                    spec=self.spec,
                )
                .cpu()
                .numpy()
            )
        return out


class QueryEncoder(nn.Module):
    """f_eta = f_eta0 + LoRA on ``spec.model`` (a pair's query model): the only trainable part of the retriever.

    ``adapter_dir`` loads a saved adapter (its rank, alpha and targets come from its own
    ``adapter_config.json``); otherwise a fresh adapter starts at the identity (peft's B = 0) with its A drawn
    from ``init_seed`` on the CPU, whatever the device and the process's RNG state: the retriever learner and
    every sampler of a run build the same η_0 (:func:`adapter_init_seed`), and two runs of one seed train alike.
    """

    def __init__(
        self,
        spec: EncoderSpec,
        *,
        rank: int = 16,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Sequence[str] | None = None,
        adapter_dir: str | Path | None = None,
        device: str = "cpu",
        batch_size: int = 64,
        init_seed: int = 0,
    ):
        from peft import LoraConfig, PeftModel, get_peft_model  # where a model is built: see the module docstring

        super().__init__()
        self.spec = spec
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.tokenizer, base = load_backbone(spec.model, torch.device("cpu"))
        self.dim = int(base.config.hidden_size)
        if adapter_dir is not None:
            for name in ("adapter_config.json", "adapter_model.safetensors"):  # a pickled .bin is never loaded
                if not (Path(adapter_dir) / name).is_file():
                    raise FileNotFoundError(f"{adapter_dir}: not a peft adapter directory in safetensors (no {name})")
            self.model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
        else:
            targets = list(target_modules) if target_modules else default_target_modules(base.config.model_type)
            lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
            with torch.random.fork_rng(devices=[]):  # peft draws A from the global CPU RNG, restored after
                torch.default_generator.manual_seed(init_seed)
                self.model = get_peft_model(base, lora)
        self.model.to(self.device).eval()

    @classmethod
    def from_config(
        cls, cfg: RetrievalConfig, adapter_dir: str | Path | None = None, device: str = "cpu", init_seed: int = 0
    ) -> QueryEncoder:
        """The configured encoder with ``adapter_dir`` (a checkpoint's), else the run's starting adapter
        (``retrieval.encoder.adapter``), else a fresh one drawn from ``init_seed``."""
        return cls(
            cfg.encoder.spec(),
            rank=cfg.lora.rank,
            alpha=cfg.lora.alpha,
            dropout=cfg.lora.dropout,
            target_modules=cfg.lora.target_modules,
            adapter_dir=adapter_dir if adapter_dir is not None else cfg.encoder.adapter,
            device=device,
            batch_size=cfg.encoder.query_batch_size,
            init_seed=init_seed,
        )

    def encode_queries(self, texts: Sequence[str]) -> torch.Tensor:
        """``[B, D]`` query embeddings with autograd through the LoRA factors (one forward pass)."""
        return embed_texts(
            self.model,
            self.tokenizer,
            texts,
            prefix=self.spec.query_prefix,
            max_length=self.spec.max_query_length,
            spec=self.spec,
        )

    @torch.no_grad()
    def embed_queries(self, texts: Sequence[str], *, adapted: bool = True) -> np.ndarray:
        """``[B, D]`` float32 without grad, in batches of ``batch_size``: what rollouts and serving use;
        ``adapted=False``: the frozen base encoder's (the adapter switched off)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with contextlib.nullcontext() if adapted else self.model.disable_adapter():
            step = self.batch_size
            chunks = [self.encode_queries(texts[i : i + step]) for i in range(0, len(texts), step)]
        return torch.cat(chunks).cpu().numpy()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA factors in peft's saved-file naming, detached CPU copies."""
        from peft import get_peft_model_state_dict  # as in __init__

        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def load_adapter_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load LoRA factors (e.g. pushed by the retriever learner); keys and shapes must match exactly."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict  # as in __init__

        mine = get_peft_model_state_dict(self.model)
        if set(state_dict) != set(mine):
            missing, unexpected = sorted(set(mine) - set(state_dict)), sorted(set(state_dict) - set(mine))
            raise ValueError(f"adapter state dict mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
        for key, value in state_dict.items():
            if tuple(value.shape) != tuple(mine[key].shape):
                raise ValueError(f"adapter tensor {key}: shape {tuple(value.shape)} != {tuple(mine[key].shape)}")
        set_peft_model_state_dict(self.model, state_dict)

    def save_adapter(self, directory: str | Path) -> Path:
        """``adapter_config.json`` + ``adapter_model.safetensors``, loadable with ``PeftModel.from_pretrained``."""
        self.model.save_pretrained(str(directory))
        return Path(directory)


def adapter_init_seed(run_seed: int) -> int:
    """The ``init_seed`` of a training run's fresh query adapter, derived from ``run.seed``: the same for the
    retriever learner's η_γ, η* and every sampler (all start at one η_0), and apart from the seeds other roles
    draw from ``run.seed``."""
    return zlib.crc32(f"query-adapter:{run_seed}".encode())


def default_target_modules(model_type: str) -> list[str]:
    from peft.utils.constants import (  # see the module docstring
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS,
    )

    targets = DEFAULT_TARGET_MODULES.get(model_type) or PEFT_DEFAULTS.get(model_type)
    if not targets:
        raise ValueError(f"no default LoRA targets for model type {model_type!r}: set retrieval.lora.target_modules")
    return list(targets)
