"""Small transformers models built from configs (random weights: nothing is fetched from a hub).

Each is a family a service would run: encoders (BERT, RoBERTa, DistilBERT, T5's), decoders without a KV
cache (GPT-2, OPT, Llama and its relatives Qwen2, Mistral, Phi-3, Gemma), a vision transformer (ViT). The configs are tiny (hidden size 64, two
layers) so a cold compile takes seconds on a CPU; ``<name>-large`` widens them for a GPU. A name
may end in ``-bf16`` or ``-fp16``: the model and its float inputs in that dtype.

Each is called the way its users call it: keyword arguments (``input_ids=``, ``attention_mask=``,
``pixel_values=``), and it returns its ``ModelOutput``.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

BATCH, SEQ, IMAGE = 2, 16, 32
SMALL = {"hidden": 64, "layers": 2, "heads": 2, "ffn": 128}
LARGE = {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072}
VOCAB = 1000

#: name -> (config class, model class, inputs: "text" | "image")
FAMILIES = {
    "bert": ("BertConfig", "BertModel", "text"),
    "roberta": ("RobertaConfig", "RobertaModel", "text"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", "text"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "text"),
    "opt": ("OPTConfig", "OPTForCausalLM", "text"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "text"),
    # Llama's relatives with their own modeling code (the held-out zoo of issue 39 names other decoder families)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "text"),
    "mistral": ("MistralConfig", "MistralForCausalLM", "text"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "text"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "text"),
    # more decoder families, each with modeling code of its own (a held-out zoo's kind): rotary or ALiBi,
    # parallel attention, sliding windows and soft-capping, QK norms, a mixture of experts
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "text"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "text"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "text"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", "text"),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", "text"),
    "granite": ("GraniteConfig", "GraniteForCausalLM", "text"),
    "phi": ("PhiConfig", "PhiForCausalLM", "text"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", "text"),
    "falcon": ("FalconConfig", "FalconForCausalLM", "text"),
    "bloom": ("BloomConfig", "BloomForCausalLM", "text"),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", "text"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "text"),
    "electra": ("ElectraConfig", "ElectraModel", "text"),
    "deberta_v2": ("DebertaV2Config", "DebertaV2Model", "text"),
    "dinov2": ("Dinov2Config", "Dinov2Model", "image"),
    "t5": ("T5Config", "T5EncoderModel", "text"),
    "vit": ("ViTConfig", "ViTModel", "image"),
}
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def parse(name: str) -> Tuple[str, bool, str]:
    """(family, large, dtype name or "") of ``bert``, ``gpt2-large-bf16`` ...; raises KeyError for another name."""
    parts = name.split("-")
    dtype = DTYPES[parts.pop()] if parts[-1] in DTYPES else ""
    large = parts[-1] == "large" and len(parts) > 1
    if large:
        parts.pop()
    family = "-".join(parts)
    if family not in FAMILIES:
        raise KeyError(name)
    return family, large, dtype


def is_hf(name: str) -> bool:
    try:
        parse(name)
        return True
    except KeyError:
        return False


def _config_kwargs(family: str, size: Dict[str, int]) -> Dict[str, Any]:
    h, n, heads, ffn = size["hidden"], size["layers"], size["heads"], size["ffn"]
    if family == "distilbert":
        return dict(dim=h, n_layers=n, n_heads=heads, hidden_dim=ffn, vocab_size=VOCAB)
    if family == "gpt2":  # no KV cache: what a scoring or prefill service runs
        return dict(n_embd=h, n_layer=n, n_head=heads, n_inner=ffn, vocab_size=VOCAB, n_positions=512,
                    use_cache=False, bos_token_id=0, eos_token_id=0)
    if family == "t5":
        return dict(d_model=h, num_layers=n, num_heads=heads, d_ff=ffn, d_kv=h // heads, vocab_size=VOCAB)
    if family == "vit":
        return dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=heads, intermediate_size=ffn,
                    image_size=IMAGE, patch_size=8)
    common = dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=heads, vocab_size=VOCAB,
                  max_position_embeddings=512)
    if family == "opt":
        return dict(common, ffn_dim=ffn, word_embed_proj_dim=h, use_cache=False, pad_token_id=1, bos_token_id=2,
                    eos_token_id=2)
    if family in ("gptj",):
        return dict(n_embd=h, n_layer=n, n_head=heads, n_inner=ffn, rotary_dim=h // heads // 2, vocab_size=VOCAB,
                    n_positions=512, use_cache=False, bos_token_id=0, eos_token_id=0)
    if family == "dinov2":
        return dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=heads, mlp_ratio=ffn // h,
                    image_size=IMAGE, patch_size=8)
    if family == "mixtral":  # four experts, two a token: the routing picks rows by value
        return dict(common, intermediate_size=ffn, num_key_value_heads=heads, use_cache=False, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2, num_local_experts=4, num_experts_per_tok=2)
    if family in ("llama", "qwen2", "mistral", "phi3", "gemma", "qwen3", "gemma2", "olmo2", "stablelm", "starcoder2",
                  "granite", "phi", "gpt_neox", "falcon", "bloom"):  # gemma's head_dim defaults to 256
        return dict(common, intermediate_size=ffn, num_key_value_heads=heads, use_cache=False, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2,
                    **({"head_dim": h // heads} if family in ("gemma", "gemma2", "qwen3") else {}))
    return dict(common, intermediate_size=ffn, pad_token_id=1 if family == "roberta" else 0)


def signature(name: str) -> str:
    """``shape_signature((), kwargs)`` of ``build(name)``'s inputs, without importing torch."""
    family, _, dtype = parse(name)
    if FAMILIES[family][2] == "image":
        short = {"bfloat16": "bf16", "float16": "f16"}.get(dtype, "f32")
        return f"pixel_values={short}[{BATCH},3,{IMAGE},{IMAGE}]"
    return f"attention_mask=i64[{BATCH},{SEQ}],input_ids=i64[{BATCH},{SEQ}]"


def build(name: str, device: str = "cpu"):
    """Return (model, args, kwargs) for ``name``: the model in eval mode on ``device``, called with kwargs."""
    import torch
    import transformers

    family, large, dtype = parse(name)
    config_cls, model_cls, kind = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**_config_kwargs(family, LARGE if large else SMALL))
    model = getattr(transformers, model_cls)(config).eval().to(device)
    if dtype:
        model = model.to(getattr(torch, dtype))
    gen = torch.Generator().manual_seed(1)
    if kind == "image":
        pixels = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen)
        return model, (), {"pixel_values": pixels.to(device=device, dtype=getattr(torch, dtype or "float32"))}
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 4:] = 0  # the second sequence padded: the mask is not all ones
    return model, (), {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
