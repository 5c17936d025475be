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
    for part in path.split("."):
        model = model.model_fields[part].annotation
    return model


@pytest.mark.parametrize("section", sorted({*RENAMED, *REMOVED}))
def test_each_section_of_the_tables_rejects_its_former_keys(section):
    model = _section(section)
    wired = model.FORMER_KEYS
    assert wired and wired == former_keys(section)
    assert not set(wired) & set(model.model_fields), "a former key that is still a field is never met"


@pytest.mark.parametrize(("section", "old", "new"),
                         [(s, old, new) for s, keys in sorted(RENAMED.items()) for old, new in keys.items()])
def test_a_renamed_key_names_a_key_that_exists(section, old, new):
    *path, key = new.split(".")
    assert key in _section(".".join(path)).model_fields
    with pytest.raises(ConfigError, match=rf"{section}: {old} was renamed {new} \[override"):
        load_config(None, [f"{section}.{old}=1"])
