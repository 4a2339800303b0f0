from dataclasses import dataclass
from typing import Literal

import pytest

from rlkit.core import params as P


@dataclass(frozen=True)
class Demo:
    model: str
    steps: int = 3
    lr: float = 1e-6
    arms: tuple[str, ...] = ("a",)
    mode: Literal["fast", "slow"] = "fast"
    cap_gib: float | None = None


def test_build_accepts_known_keys_and_coerces():
    cfg = P.build(Demo, {"model": "tiny", "lr": 1, "arms": ["a", "b"]})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.arms == ("a", "b")
    assert P.as_dict(cfg)["arms"] == ["a", "b"]


def test_unknown_key_names_the_key_and_the_known_ones():
    with pytest.raises(P.ParamError, match=r"unknown parameters \['stepz'\].*known keys.*steps"):
        P.build(Demo, {"model": "tiny", "stepz": 4})


def test_missing_required_key():
    with pytest.raises(P.ParamError, match=r"missing parameters \['model'\]"):
        P.build(Demo, {})


@pytest.mark.parametrize("key,value", [("steps", "3"), ("mode", "medium"), ("arms", "a"), ("cap_gib", "x")])
def test_wrong_types_are_rejected(key, value):
    with pytest.raises(P.ParamError, match=key):
        P.build(Demo, {"model": "tiny", key: value})


def test_bool_is_not_an_int_for_bool_fields():
    @dataclass(frozen=True)
    class Flags:
        fix: bool

    with pytest.raises(P.ParamError, match="true/false"):
        P.build(Flags, {"fix": 1})


def test_from_namespace_requires_every_field():
    ns = {"model": "tiny", "steps": 2, "lr": 0.1, "arms": ["x"], "mode": "slow", "cap_gib": None, "other": 1}
    assert P.from_namespace(Demo, ns).steps == 2
    del ns["lr"]
    with pytest.raises(P.ParamError, match="does not define \\['lr'\\]"):
        P.from_namespace(Demo, ns)
