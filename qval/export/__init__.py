"""The deployable checkpoint: export (`hf.py`), read-back (`reader.py`), the fidelity check
(`fidelity.py`), the build stage that ties them together (`build.py`) and the gate that turns
the fidelity report into checks (`gate.py`); `command.py` is `qval build`. Heavy libraries are imported inside functions.
"""
