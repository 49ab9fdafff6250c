"""Build the tiny model the vLLM suite serves, offline, in seconds (run with the vLLM venv's Python).

`python engine_tests/tiny_model.py DIR` writes a Hugging Face model folder: a 2-layer Llama (hidden 128, random
weights from a fixed seed) and a byte-level BPE tokenizer trained on this interpreter's standard-library sources,
saved as a `PreTrainedTokenizerFast` with a ChatML chat template. Nothing is downloaded. The output layer is scaled
up (`LOGIT_SCALE`) so that generations at temperature 1 repeat themselves, which gives vLLM's n-gram drafter
something to propose. The folder is rebuilt only when its recipe (`RECIPE`) changed.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path
from typing import Final

VOCAB_SIZE: Final = 32_768
"""Above 30,000: agentx's token-id prompts draw ids from [1000, 30000), inside every common vocabulary."""
HIDDEN: Final = 128
LAYERS: Final = 2
MAX_MODEL_LEN: Final = 131_072
LOGIT_SCALE: Final = 40.0
SEED: Final = 7
CHAT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
RECIPE: Final = {
    "vocab_size": VOCAB_SIZE,
    "hidden": HIDDEN,
    "layers": LAYERS,
    "max_model_len": MAX_MODEL_LEN,
    "logit_scale": LOGIT_SCALE,
    "seed": SEED,
    "training_text": "stdlib-rglob-no-tests",
    "chat_template": CHAT_TEMPLATE,
}


def _training_text() -> list[str]:
    """The standard library's modules, tests and site-packages left out, sorted by path (the same text on every
    machine with this Python: ~13 MB on 3.11, enough merges for the vocabulary)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(path for path in stdlib.rglob("*.py") if not {"site-packages", "test", "tests"} & set(path.parts))
    return [path.read_text(encoding="utf-8", errors="replace") for path in paths]


def build(directory: Path) -> None:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _training_text(),
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,  # the trained `tokenizers.Tokenizer`
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_MODEL_LEN,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "recipe.json").write_text(json.dumps(RECIPE, sort_keys=True))


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python engine_tests/tiny_model.py DIR", file=sys.stderr)
        return 2
    directory = Path(sys.argv[1])
    recipe = directory / "recipe.json"
    if recipe.is_file() and json.loads(recipe.read_text()) == RECIPE:
        print(f"tiny model: {directory} (up to date)")
        return 0
    build(directory)
    print(f"tiny model: {directory} (built)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
