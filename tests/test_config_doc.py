"""docs/config.md's reference is the schema's: regenerated here, it must equal the file, and every
field in it must say what it means."""

from __future__ import annotations

from qval import config_doc
from qval.config import GateConfig


def test_docs_config_md_is_what_the_schema_generates():
    page = config_doc.PAGE.read_text(encoding="utf-8")
    assert config_doc.updated(page) == page, (
        "docs/config.md is stale (the config schema changed): run `python -m qval.config_doc` and commit the page")


def test_every_field_says_what_it_means():
    assert config_doc.missing() == [], "add a comment beside each of these fields (or a description=)"


def test_every_section_and_field_is_in_the_reference():
    text = config_doc.render()
    for path, cls, _, backend in config_doc.all_sections():
        title = (f"`{path}`" if path else "Top level") + (f" of `backend: {backend}`" if backend else "")
        assert f"### {title}\n" in text, title
        for name in config_doc._leaves(cls) if cls is not None else ():
            assert f"| `{name}` |" in text, f"{path}.{name}"
    assert "### `fallback`" in text and "| `max_effective_bits` |" in text


def test_notes_name_fields_that_exist():
    for key in config_doc.NOTES:
        cls_name, field = key.split(".")
        classes = {c.__name__: c for _, c, _, _ in config_doc.all_sections() if c is not None} | {"GateConfig": GateConfig}
        assert cls_name in classes and field in classes[cls_name].model_fields, f"NOTES[{key!r}] names no field"


def test_a_field_comment_is_read_from_the_source():
    from qval.config import SnapshotConfig

    comments = config_doc.source_comments(SnapshotConfig)
    assert comments["enabled"].startswith("false: both models in memory")  # on its line
    assert comments["audit"].startswith("while the reference's logits are computed")  # the #: lines above it


def test_the_check_mode_says_how_to_fix_a_stale_page(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "config.md"
    stale.write_text(f"# head\n\n{config_doc.BEGIN}\nold\n{config_doc.END}\n", encoding="utf-8")
    monkeypatch.setattr(config_doc, "PAGE", stale)
    assert config_doc.main(["--check"]) == 1
    assert "python -m qval.config_doc" in capsys.readouterr().err
    assert config_doc.main([]) == 0 and config_doc.main(["--check"]) == 0
    assert stale.read_text(encoding="utf-8").startswith("# head\n\n" + config_doc.BEGIN)
