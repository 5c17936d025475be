"""The restricted state loader on enum members pickled by name, as early Python 3.11 releases (3.11.2) write them."""

import collections
import enum

import pytest
import torch
from deepspeed.runtime.zero.config import ZeroStageEnum

from bridge_ray.policy_learner.deepspeed_engine import RestrictedCheckpointEngine


def by_name(self, protocol):
    return getattr, (type(self), self.name)


def test_a_state_enum_pickled_by_name_loads_and_no_other_getattr_does(tmp_path, monkeypatch):
    monkeypatch.setattr(ZeroStageEnum, "__reduce_ex__", by_name)
    state = tmp_path / "optim_states.pt"
    torch.save({"zero_stage": ZeroStageEnum.weights, "t": torch.ones(2)}, state, _use_new_zipfile_serialization=False)
    loaded = RestrictedCheckpointEngine().load(str(state))
    assert loaded["zero_stage"] is ZeroStageEnum.weights and torch.equal(loaded["t"], torch.ones(2))

    monkeypatch.setattr(Colour, "__reduce_ex__", by_name)
    for payload in ({"x": Colour.RED}, {"x": _Getter()}):
        torch.save(payload, state)
        with pytest.raises(ValueError, match="refusing to load DeepSpeed state"):
            RestrictedCheckpointEngine().load(str(state))


class Colour(enum.Enum):
    """An enum DeepSpeed's state never holds."""

    RED = 1


class _Getter:
    """Unpickles as ``getattr(OrderedDict, "fromkeys")``: a reach past the state's own types."""

    def __reduce__(self):
        return getattr, (collections.OrderedDict, "fromkeys")
