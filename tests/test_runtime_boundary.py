"""Importing and running qval leaves the host process as it found it (issue 27): torch's and
transformers' classes, functions and modules, transformers' attention registries, and every model
config qval did not build — compared by identity and value before qval is imported, while its
runtime is inside a forward (a patch that is put back afterwards is still a patch), and after an
engine has been built, has scored and has generated on the built-in model (runtime on and off, the
plain and the static decoder, the fused step).

Registries: the runtime's attention is registered under qval's own name (decode_attention.NAME),
the one addition allowed; every name transformers had must resolve to the same function, and with
the runtime off nothing is added. (ModelOpt's quantized attention swaps the registry's entry for the
length of each forward and puts it back: the resolved mapping is what is compared.)

Two changes the libraries make themselves when qval calls them, allowed with the runtime on only
(`LIBRARIES_OWN`; with it off the process must be unchanged to the last attribute): torch.compile
(the fused step's) wraps torch.nn.Module.__init__ and __setstate__ the first time anything is compiled
in a process (torch._dynamo.mutation_guard.install_generation_tagging_init), and transformers'
public `set_attn_implementation` memoizes on the model's class whether it may be called
(`_can_set_attn_implementation_cached_value`).

It runs in a fresh interpreter: the test session has imported qval long before."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.model]  # its child process loads the real model

LIBRARIES_OWN = {"torch.nn.modules.module.Module.___needs_generation_tag_patch", "torch.nn.modules.module.Module.__init__",
                 "torch.nn.modules.module.Module.__setstate__",
                 "transformers.models.llama.modeling_llama.LlamaForCausalLM._can_set_attn_implementation_cached_value"}

CODE = r'''
import inspect, json, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.nn.functional, transformers
import transformers.cache_utils, transformers.generation.utils, transformers.integrations.sdpa_attention
import transformers.masking_utils, transformers.modeling_utils
import transformers.models.llama.modeling_llama, transformers.models.qwen2.modeling_qwen2
from transformers import LlamaConfig, LlamaForCausalLM

MODULES = [torch.nn.functional, torch.nn.modules.linear, torch.nn.modules.module, transformers.cache_utils,
           transformers.generation.utils, transformers.integrations.sdpa_attention, transformers.masking_utils,
           transformers.modeling_utils, transformers.models.llama.modeling_llama, transformers.models.qwen2.modeling_qwen2]

def library():
    """id of every attribute of those modules and of every class they define."""
    out = {}
    for mod in MODULES:
        for name, obj in vars(mod).items():
            out[f"{mod.__name__}.{name}"] = id(obj)
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                for attr, value in vars(obj).items():
                    out[f"{mod.__name__}.{name}.{attr}"] = id(value)
    return out

def registries():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return {f"{label}:{k}": id(reg[k]) for label, reg in (("attention", ALL_ATTENTION_FUNCTIONS), ("mask", ALL_MASK_ATTENTION_FUNCTIONS))
            for k in list(reg)}

torch.manual_seed(0)
foreign = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2)).eval()
ids = torch.tensor([[3, 4, 5, 6], [1, 1, 7, 8]]); mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
def foreign_state():
    with torch.no_grad():
        logits = foreign(input_ids=ids, attention_mask=mask).logits
    return {"config": foreign.config.to_json_string(), "attn": foreign.config._attn_implementation,
            "logits": logits.double().sum().item(), "instance": sorted(k for m in foreign.modules() for k in m.__dict__ if k == "forward")}

before = {"library": library(), "registries": registries(), "foreign": foreign_state(),
          "torch": [torch.get_num_threads(), torch.is_grad_enabled(), str(torch.get_default_dtype())]}
during = {"forwards": 0, "library": [], "registries": []}

def diff(now, was):
    return sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))

def inside(module, args):
    during["forwards"] += 1
    for key, now in (("library", library()), ("registries", registries())):
        if (d := diff(now, before[key])) and d not in during[key]:
            during[key].append(d)

from qval.config import ModelConfig, parse_config
from qval.engines.hf import HFEngine
from qval.models import load_model
from tests.engines.runtime_figures import candidate
import tempfile, pathlib

ON = sys.argv[1] == "on"
ref = load_model(ModelConfig(device="cpu"))  # the CPU path on any machine (the GPU one: tests/engines/test_runtime_gpu.py)
tok = ref.tokenizer
prompts = [tok(p)["input_ids"] for p in ("The capital of France is", "Once upon a time there was")]
# on the reference's first layer; a candidate deep-copied from it carries the hook too
ref.model.model.layers[0].register_forward_pre_hook(inside)
if ON:
    engines = [HFEngine(ref.model, tok), HFEngine(ref.model, tok, decode="static")]
    engines[1].static_fused = True  # the fused step on a CPU (the GPU's kernels are Triton: not here)
else:
    engines = [HFEngine(ref.model, tok, runtime="transformers")]
with tempfile.TemporaryDirectory() as tmp:
    engines.append(candidate(ref, "fp8", pathlib.Path(tmp), options=None if ON else {"runtime": "transformers"}))
    if ON:
        engines.append(candidate(ref, "fp16", pathlib.Path(tmp), options={"runtime": "transformers"}))
    x = torch.tensor([prompts[0] * 3])
    for e in engines:
        e.logits(x)
        list(e.logits_pieces(x, 4))
        e.answer_logits(prompts[0], prompts[1])
        e.generate(prompts, 6, suppress_eos=True, batch_size=2)
after = {"library": diff(library(), before["library"]), "registries": diff(registries(), before["registries"])}
print(json.dumps({"during": during, "after": after, "foreign": [before["foreign"], foreign_state()],
                  "torch": [before["torch"], [torch.get_num_threads(), torch.is_grad_enabled(), str(torch.get_default_dtype())]],
                  "runtimes": [e.describe()["runtime"] for e in engines],
                  "reference_attention": ref.model.config._attn_implementation}))
'''


def run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CODE, mode], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=["on", "off"])
def seen(request) -> tuple[str, dict]:
    return request.param, run(request.param)


def test_it_ran_what_it_meant_to(seen):
    mode, s = seen
    from qval.engines.decode_attention import BASE, NAME

    if mode == "on":
        assert s["runtimes"] == ["qval", "qval", "qval", "transformers"]
        assert s["reference_attention"] == NAME  # the runtime on the model qval loaded
    else:
        assert s["runtimes"] == ["transformers", "transformers"] and s["reference_attention"] == BASE
    assert s["during"]["forwards"] >= 20  # per engine: a chunk, 6 pieces, an answer (2), 6 generation steps; self-checks


def test_torch_and_transformers_are_unchanged_inside_a_forward_and_after(seen):
    mode, s = seen
    allowed = LIBRARIES_OWN if mode == "on" else set()
    for d in [*s["during"]["library"], s["after"]["library"]]:
        assert set(d) <= allowed, d


def test_the_registries_gain_qvals_name_only_and_only_with_the_runtime_on(seen):
    mode, s = seen
    from qval.engines.decode_attention import NAME

    allowed = {f"attention:{NAME}", f"mask:{NAME}"} if mode == "on" else set()
    for d in [*s["during"]["registries"], s["after"]["registries"]]:
        assert set(d) <= allowed, d


def test_a_model_qval_did_not_build_is_unchanged(seen):
    _, s = seen
    was, now = s["foreign"]
    assert now == was
    assert s["torch"][0] == s["torch"][1]
