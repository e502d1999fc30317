"""A run's session (qval/session.py): opened in one place, the candidate's life in the run — built once,
its identity asked of its backend once, its description kept when a sequential run's candidate leaves
(the report names the engine), released and closed through its own methods — on stand-ins, no model."""

from __future__ import annotations

from pathlib import Path

from qval import session as session_mod
from qval.config import parse_config
from qval.session import RunCandidate, Session


class StandIn:
    """An engine with the optional hooks a built candidate may have (`release`, `close`)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def describe(self) -> dict:
        self.calls.append("describe")
        return {"backend": "stand-in", "kernels": ["a", "b"]}

    def release(self) -> None:
        self.calls.append("release")

    def close(self) -> None:
        self.calls.append("close")


def config(name: str = "s"):  # noqa: ANN201
    return parse_config({"name": name, "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.9}}})


def test_a_session_opens_its_run_folder_under_the_config_s_report_dir_or_out(tmp_path: Path) -> None:
    cfg = config("cand")
    assert Session.open(cfg, tmp_path).run.path == tmp_path / "cand"
    default = Session.open(cfg)
    assert default.run.path == Path(cfg.report.dir) / "cand"
    assert default.candidate.engine is None and default.candidate.described() is None


def test_the_candidate_s_identity_is_asked_of_its_backend_once(monkeypatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(session_mod, "engine_identity", lambda cfg: asked.append(1) or {"server": "v1"})
    c = RunCandidate(config())
    first = c.identity(None)
    assert first["server"] == "v1" and first["calibration"] is None and first["quant"]["format"] == "none"
    assert c.identity(None) == first and asked == [1]


def test_a_candidate_that_leaves_is_released_and_still_described() -> None:
    c, engine = RunCandidate(config()), StandIn()
    c.engine = engine
    c.leave()
    assert c.engine is None and engine.calls == ["describe", "release"]
    assert c.described() == {"backend": "stand-in", "kernels": ["a", "b"]}
    c.leave()  # a second leave (nothing held) does nothing
    c.close()  # nothing to close once it left
    assert engine.calls == ["describe", "release"]


def test_closing_the_session_closes_the_candidate_and_the_reference(tmp_path: Path, monkeypatch) -> None:
    s = Session.open(config(), tmp_path)
    engine, closed = StandIn(), []
    s.candidate.engine = engine
    monkeypatch.setattr(s.ref, "close", lambda: closed.append("ref"))
    s.close()
    assert engine.calls == ["close"] and closed == ["ref"]


def test_the_reference_closes_when_the_candidate_s_close_fails(tmp_path: Path, monkeypatch) -> None:
    s = Session.open(config(), tmp_path)
    closed: list[str] = []

    class Failing(StandIn):
        def close(self) -> None:
            raise RuntimeError("the server would not stop")

    s.candidate.engine = Failing()
    monkeypatch.setattr(s.ref, "close", lambda: closed.append("ref"))
    try:
        s.close()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the candidate's failure to close was swallowed")
    assert closed == ["ref"]
