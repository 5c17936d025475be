"""The tables of former keys (``bridge_ray/config/renamed.py``) are wired to their sections and point at keys
that exist: a section path misspelt in a table would silently drop its entries, and a rename to a key that is
not there would send the user to another error."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from bridge_ray.config import Config, ConfigError, load_config
from bridge_ray.config.renamed import REMOVED, RENAMED, former_keys


def _section(path: str) -> type[BaseModel]:
    model: type[BaseModel] = Config
    for part in filter(None, path.split(".")):
        model = model.model_fields[part].annotation
    return model


GONE = {section for section in RENAMED if section.split(".")[0] in REMOVED[""]}  # sections removed whole


@pytest.mark.parametrize("section", sorted({*RENAMED, *REMOVED} - GONE))
def test_each_section_of_the_tables_rejects_its_former_keys(section):
    """Loading moves a renamed key; a section validated directly still names what replaced it."""
    model = _section(section)
    wired = model.FORMER_KEYS
    assert wired and wired == former_keys(section)
    assert not set(wired) & set(model.model_fields), "a former key that is still a field is never met"


@pytest.mark.parametrize(("section", "old", "new"),
                         [(s, old, new) for s, keys in sorted(RENAMED.items()) for old, new in keys.items()])
def test_a_renamed_key_names_a_key_that_exists_and_loads_as_it(section, old, new, capsys, monkeypatch):
    from bridge_ray.config import renamed

    monkeypatch.setattr(renamed, "_noted", set())  # notes are printed once per process
    *path, key = new.split(".")
    assert key in _section(".".join(path)).model_fields
    loaded = load_config(None, [f"{section}.{old}=1"])
    for part in new.split("."):
        loaded = getattr(loaded, part)
    assert loaded == 1
    assert f"override '{section}.{old}=1': {section}.{old} is now {new}" in capsys.readouterr().err


def _dtype_choices(key: str) -> set[str]:
    from typing import get_args

    *path, name = key.split(".")
    return set(get_args(_section(".".join(path)).model_fields[name].annotation))


def test_every_dtype_key_speaks_one_vocabulary():
    from bridge_ray.config.renamed import DTYPE_KEYS, FORMER_DTYPES

    choices = {key: _dtype_choices(key) for key in DTYPE_KEYS}
    assert all(values >= {"auto", "float32", "bfloat16"} for values in choices.values()), choices
    assert not set(FORMER_DTYPES) & set().union(*choices.values()), "a former spelling is still a value"
    assert set(FORMER_DTYPES.values()) <= set().union(*choices.values())


@pytest.mark.parametrize(("old", "new"), [("fp32", "float32"), ("bf16-autocast", "bfloat16-autocast")])
def test_a_former_dtype_spelling_loads_with_a_note_naming_the_key_and_the_file(tmp_path, capsys, old, new):
    path = tmp_path / "old.yaml"
    path.write_text(f"learner:\n  dtype: {old}\n")
    assert load_config(path).learner.dtype == new
    assert f"note: {path}:2: learner.dtype: {old} is a former spelling; write {new}" in capsys.readouterr().err


def test_a_former_dtype_spelling_in_an_override_is_named_by_the_override(capsys):
    assert load_config(None, ["policy.dtype=fp16"]).policy.dtype == "float16"
    assert "note: override 'policy.dtype=fp16': policy.dtype: fp16 is a former spelling" in capsys.readouterr().err


def test_a_dtype_a_key_does_not_take_is_still_an_error():
    with pytest.raises(ConfigError, match=r"learner\.dtype"):
        load_config(None, ["learner.dtype=fp16"])  # float16 once respelled: no learner precision
