"""replay_poll: verl's V1 replay buffer built by verl's own class polls at RLKIT_REPLAY_POLL_S; revert restores 2 s."""
from __future__ import annotations

import pytest

from rlkit.core import params as P
from rlkit.patches import PatchError
from rlkit.recipes import check
from rlkit.recipes import grpo as R
from rlkit.recipes import job as verl_job
from rlkit.recipes.overrides import render_overrides

pytest.importorskip("verl")


def _buffer():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    return ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                        max_off_policy_strategy="drop", sampler_kwargs={})


def test_buffers_poll_at_the_set_interval_and_revert_restores_verls(monkeypatch):
    from rlkit.patches.verl import replay_poll

    assert _buffer().poll_interval == replay_poll.VERL_DEFAULT_S  # verl 0.9.1's default, what the patch replaces
    monkeypatch.setenv(replay_poll.ENV, "0.2")
    replay_poll.apply()
    try:
        replay_poll.apply()  # idempotent
        assert _buffer().poll_interval == 0.2
    finally:
        replay_poll.revert()
    assert _buffer().poll_interval == replay_poll.VERL_DEFAULT_S


@pytest.mark.parametrize("raw", ["", "fast", "0", "-1", "120"])
def test_an_unusable_interval_stops_the_apply_and_names_the_fix(monkeypatch, raw):
    from rlkit.patches.verl import replay_poll

    monkeypatch.setenv(replay_poll.ENV, raw)
    with pytest.raises(PatchError, match="RLKIT_REPLAY_POLL_S.*Fix: set the recipe's replay_poll_s"):
        replay_poll.apply()
    assert not replay_poll.active()


def test_the_recipe_lever_adds_the_patch_and_its_environment():
    r = R.GRPORecipe(replay_poll_s=0.2, patches=("offload_views",))
    assert r.active_patches == ("offload_views", "replay_poll")
    env = verl_job.launch_env(r, "/tmp/records", base={})
    assert env["RLKIT_REPLAY_POLL_S"] == "0.2" and env["RLKIT_PATCHES"] == "offload_views,replay_poll"
    assert "RLKIT_REPLAY_POLL_S=0.2" in verl_job.shell_command(r, [])
    default = R.GRPORecipe(patches=("offload_views",))
    assert "replay_poll" not in default.active_patches
    assert verl_job.launch_env(default, "/tmp/records", base={})["RLKIT_REPLAY_POLL_S"] == ""
    with pytest.raises(P.ParamError, match=r"GRPORecipe\.patches: replay_poll is the replay_poll_s lever.*Fix: set "):
        R.GRPORecipe(patches=("replay_poll",))
    with pytest.raises(P.ParamError, match=r"GRPORecipe\.replay_poll_s: .*Fix: "):
        R.GRPORecipe(replay_poll_s=0.0)


@pytest.mark.verl
def test_verl_processes_apply_it_from_the_recipe(tmp_path):
    """The tiny profile with replay_poll_s through verl's config check in a fresh process: the plugin applies the
    patch at its target's import, reading the interval launch_env set."""
    from rlkit.core.results import load_profile
    from rlkit.experiments import grpo
    from rlkit.models import data
    from rlkit.models import offline as offline_model

    r = P.build(R.GRPORecipe, {**load_profile(grpo.NOTEBOOK, "tiny"), "replay_poll_s": 0.2})
    dataset = data.synthetic_dapo(r.data_rows, out_path=tmp_path / "train.parquet")
    model = offline_model.write_offline_model(r.model, tmp_path / "model", device="cpu")
    ov = render_overrides(r, R.Paths(model=model["path"], train_file=dataset.path), tmp_path)
    result = check.verify_subprocess(r, ov, tmp_path)
    assert "replay_poll" in result["active_patches"] and not result["pending_patches"]
