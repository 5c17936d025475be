"""The trained query encoder as a plain Hugging Face model, for Search-R1, FlashRAG and sentence-transformers.

The LoRA is merged into the backbone (peft ``merge_and_unload``), so any ``AutoModel`` loader gets f_eta
itself. What else decides an embedding (pooling, normalisation, query prefix, truncation) is no part of
an HF model, and those tools take it as arguments or guess it from the retriever's name: it is written
beside the weights as ``retrieval_settings.json`` and as sentence-transformers module files (which
FlashRAG also reads to check the pooling), and turned into their flags by :func:`search_r1_command` and
:func:`flashrag_config`. Passages keep the base encoder: the export is for queries, against an index
built with ``spec.model``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from bridge_ray.config.encoders import BGE_QUERY_INSTRUCTION, EncoderSpec
from bridge_ray.model_paths import save_tokenizer
from bridge_ray.retrieval.encoder import QueryEncoder

SETTINGS_FILE = "retrieval_settings.json"
# Search-R1's server and FlashRAG choose the query prefix from the retriever's name ("e5" and "bge" in it), and
# normalise unless "dpr" is in it; FlashRAG also takes an explicit instruction, Search-R1 does not.
_NAME_OF_PREFIX = {"": "bridge", "query: ": "e5", BGE_QUERY_INSTRUCTION: "bge"}
# What Search-R1's retrieval_server.py hard-codes in its __main__ (no flag sets them).
SEARCH_R1_POOLING, SEARCH_R1_MAX_LENGTH = "mean", 256


def export_retriever(spec: EncoderSpec, adapter_dir: Path, out: Path) -> None:
    """Write ``spec.model`` with the adapter of ``adapter_dir`` merged into ``out``, tokenizer and settings included."""
    encoder = QueryEncoder(spec, adapter_dir=adapter_dir)
    merged = encoder.model.merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(encoder.tokenizer, out)
    write_sentence_transformers_files(spec, int(merged.config.hidden_size), out)
    (out / SETTINGS_FILE).write_text(json.dumps(retrieval_settings(spec), indent=2) + "\n")


def retrieval_settings(spec: EncoderSpec) -> dict:
    """The query-side settings under the names Search-R1 and FlashRAG give them, and the index's encoder."""
    return {
        "pooling_method": spec.pooling,
        "normalize": spec.normalize,
        "query_prefix": spec.query_prefix,
        "max_length": spec.max_query_length,
        "retriever_name": retriever_name(spec),
        "index_encoder": spec.model,
        "passage_prefix": spec.passage_prefix,
        "max_passage_length": spec.max_passage_length,
    }


def write_sentence_transformers_files(spec: EncoderSpec, dim: int, out: Path) -> None:
    """Transformer -> Pooling -> (Normalize) in the classic module format, which old and new sentence-transformers
    load and FlashRAG's pooling check reads; the prefix is the "query" prompt, not a default, since FlashRAG's
    sentence-transformers path adds its instruction itself."""
    modules = [("", "sentence_transformers.models.Transformer"), ("1_Pooling", "sentence_transformers.models.Pooling")]
    if spec.normalize:
        modules.append(("2_Normalize", "sentence_transformers.models.Normalize"))
    _write_json(out / "modules.json", [
        {"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(modules)
    ])
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": spec.pooling == "cls",
        "pooling_mode_mean_tokens": spec.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    })
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": spec.max_query_length, "do_lower_case": False})
    prompts = {"query": spec.query_prefix, "document": spec.passage_prefix}
    _write_json(out / "config_sentence_transformers.json", {
        "prompts": {name: text for name, text in prompts.items() if text},
        "default_prompt_name": None,
        "similarity_fn_name": "dot",  # the index scores by inner product
    })


def retriever_name(spec: EncoderSpec) -> str:
    """The ``--retriever_name`` / ``retrieval_method`` under which Search-R1 and FlashRAG prefix and normalise
    queries as ``spec`` does (an unknown prefix gets none: see :func:`caveats`)."""
    return _NAME_OF_PREFIX.get(spec.query_prefix, "bridge") + ("" if spec.normalize else "-dpr")


def caveats(spec: EncoderSpec) -> list[str]:
    """What Search-R1's ``retrieval_server.py`` and FlashRAG cannot be told by flags or keys, as edits to make."""
    found = []
    if spec.query_prefix not in _NAME_OF_PREFIX:
        found.append(f"Search-R1: prepend the query prefix {spec.query_prefix!r} in Encoder.encode (no name gives it)")
    if spec.query_prefix and spec.query_prefix != spec.query_prefix.strip() + " ":
        found.append(f"FlashRAG: prepend the query prefix {spec.query_prefix!r} yourself (it strips it, adds a space)")
    if spec.pooling != SEARCH_R1_POOLING:
        found.append(f"Search-R1: set retrieval_pooling_method={spec.pooling!r} in its __main__ (it hard-codes 'mean')")
    if spec.max_query_length != SEARCH_R1_MAX_LENGTH:
        found.append(
            f"Search-R1: set retrieval_query_max_length={spec.max_query_length} in its __main__ (it hard-codes 256)"
        )
    return found


def search_r1_command(spec: EncoderSpec, model_dir: Path) -> str:
    """Search-R1's dense retrieval server on the exported encoder, over an index built with the base encoder."""
    return (
        "python search_r1/search/retrieval_server.py --index_path $index_file --corpus_path $corpus_file --topk 3"
        f" --retriever_name {retriever_name(spec)} --retriever_model {shlex.quote(str(model_dir))} --faiss_gpu"
    )


def flashrag_config(spec: EncoderSpec, model_dir: Path) -> str:
    """The retrieval keys of a FlashRAG config (YAML; JSON strings are YAML) for the exported encoder.

    FlashRAG turns an instruction into ``instruction.strip() + " "``, so an empty prefix stays unset (null).
    """
    keys = {
        "retrieval_method": retriever_name(spec),
        "retrieval_model_path": str(model_dir),
        "retrieval_pooling_method": spec.pooling,
        "retrieval_query_max_length": spec.max_query_length,
        "instruction": spec.query_prefix or None,
    }
    return "\n".join(f"{key}: {json.dumps(value)}" for key, value in keys.items())


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
