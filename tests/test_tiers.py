"""The suite's two tiers (tests/conftest.py): a test's tier follows from the fixtures it uses, a full-tier test
skipped in the default tier says how to run it, and a test not marked `model` cannot load the real model."""

from __future__ import annotations

import pytest

from tests.conftest import FULL, FULL_MARKERS, RUN_FULL, TIER_FIXTURES, ROOT


def test_a_test_not_marked_model_that_loads_the_real_model_fails_saying_so():
    from qval import models, run_reference
    from qval.config import ModelConfig

    for load in (models.load_model, run_reference.load_model):  # the guard replaces every module's name for it
        with pytest.raises(pytest.fail.Exception, match=r"loads the real default model.*@pytest\.mark\.model"):
            load(ModelConfig())


def test_markers_follow_the_fixtures_and_a_skipped_full_tier_test_says_how_to_run_it(request):
    items = request.session.items
    assert set(TIER_FIXTURES.values()) <= set(FULL_MARKERS)
    seen = set()
    for item in items:
        for fixture, marker in TIER_FIXTURES.items():
            if fixture in item.fixturenames:
                assert item.get_closest_marker(marker), (item.nodeid, marker)
                seen.add(marker)
        skip = [m.kwargs.get("reason", "") for m in item.iter_markers("skip")]
        if not FULL and any(item.get_closest_marker(m) for m in FULL_MARKERS):
            assert any(RUN_FULL in r for r in skip), item.nodeid
    if len(items) > 1000:  # the whole suite collected: each fixture's marker is in use
        assert seen == set(TIER_FIXTURES.values()), seen


def test_markers_are_strict_and_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert "--strict-markers" in text
    for marker in (*FULL_MARKERS, "slow", "gpu"):
        assert f'"{marker}: ' in text, marker
