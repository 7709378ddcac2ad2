"""Tiny random-weight models for the real vLLM on the CPU, made here (never downloaded).

Run by the engine venv's python (it needs torch, transformers and tokenizers, which the project's own
venv does not carry): `python lab/vllm_cpu_models.py OUT KIND`. KIND is one of MODELS. Writes a
Hugging Face model directory vLLM loads as it loads a real one: `config.json` (the architecture the
stacks use, shrunk), `model.safetensors` (random weights, seeded), a byte-level BPE tokenizer trained
here on TEXT (`tokenizer.json`, `tokenizer_config.json`) with a ChatML chat template like Qwen3's, and
`generation_config.json`. Deterministic: the same KIND gives the same bytes (lab/vllm_cpu.py checks it
with a manifest of sha256s). The answers are meaningless tokens; the point is real loading, real
kernels, real scheduling and a real KV cache.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

SEED = 33
# ChatML, as Qwen3's template writes it (without tools or thinking): what `/v1/chat/completions` applies.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 2048  # the trainer's target; TEXT below yields about this many (config.vocab_size is the real count)
# The tokenizer's training text: built in, so the tokenizer is the same on every machine.
TEXT = """\
A cluster of servers turns weights on disk into an answering service. Each node holds eight GPUs joined
by NVLink, and a network card speaks RDMA over converged Ethernet to its peers. The operator writes the
whole cluster in one stack file: the nodes, their addresses, the models and where their weights come from,
the pools that serve each model, the gateway in front and the monitoring beside it.
The planner reads that file, checks it against what the hardware can run, and writes every command line,
every configuration file and every script the deployment needs. Nothing reaches a server before the plan
is clean. A policy pack refuses a data type the GPU cannot compute, a tensor parallel size that does not
divide the attention heads, a cache that cannot fit beside the weights, a gateway left open without keys.
The engine loads the weights, reserves memory for the key and value cache, and starts its scheduler. A
request arrives with a prompt; the prompt is split into tokens; the tokens are prefilled in one pass;
then the engine decodes one token at a time until a stop token or the length limit. Prefix caching keeps
the blocks of a prompt that many requests share, so a second conversation with the same system prompt
skips most of its prefill. When the cache is full, the oldest free blocks are evicted first.
The gateway routes each request by its model name, keeps a conversation on the replica that already holds
its prefix, limits each key's rate and concurrency, and streams the answer back as it is generated.
Prometheus scrapes the engines, the exporters and the gateway; alerts fire when a replica stops answering,
when the queue grows, when the cache is nearly full, or when a GPU runs too hot.
On a quiet morning the cluster answered eleven thousand requests an hour. Latency stayed under two seconds
for the first token and forty milliseconds for each token after it. Then a node lost its network link, the
watchdog noticed within ten seconds, and the gateway moved its conversations to the replicas that remained.
Numbers, names and punctuation matter to a tokenizer: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024
2048 4096 8192; alpha, beta, gamma, delta; north, south, east, west; red, green, blue; yes, no, maybe.
"""


def lines() -> list[str]:
    """TEXT, repeated with small variations so the trainer sees every pair often enough."""
    base = [line for line in TEXT.splitlines() if line.strip()]
    out = []
    for i in range(40):
        for j, line in enumerate(base):
            words = line.split()
            k = (i * 7 + j) % len(words)
            out.append(" ".join(words[k:] + words[:k]))
    return out


def tokenizer(out: Path) -> int:
    """Train the byte-level BPE tokenizer, save it with the chat template; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=32768,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return len(fast)


# The architectures the stacks serve, shrunk (head_dim 64: the CPU attention's smallest supported size).
# Sized so a prompt of a few thousand tokens takes hundreds of milliseconds to prefill on two cores while
# the server still starts in seconds; figures in lab/README.md.
MODELS: dict[str, dict] = {
    # Qwen3 dense (Qwen3-32B's shape, 64 layers → 4)
    "qwen3-tiny": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    # Qwen3-MoE (the reference chat pool's Qwen3-30B-A3B: 128 experts, 8 active → 8 experts, 2 active)
    "qwen3-moe-tiny": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 256,
        "intermediate_size": 768,
        "moe_intermediate_size": 256,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    # DeepSeek-V3 (the reference reasoning pool's DeepSeek-R1: 61 layers, 256 routed experts of which 8 are
    # active plus one shared, MLA's low-rank q and kv projections, the noaux_tc gate) → 4 layers, the first
    # dense, 8 routed experts in 2 groups, 2 active, one shared.
    "deepseek-v3-tiny": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 768,
        "moe_intermediate_size": 256,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        # transformers' DeepseekV3Config leaves these unset; vLLM loads the gate's e_score_correction_bias
        # only for noaux_tc, and DeepSeek-V3's own config.json names both.
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 64,
        # With MLA off vLLM attends with per-head q/k of nope + rope = 64 (the CPU attention refuses 48)
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "num_nextn_predict_layers": 0,
    },
}


def make(out: Path, kind: str) -> dict[str, str]:
    """Write model KIND into `out`; returns {file: sha256}."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer(out)
    shape = dict(MODELS[kind])
    model_type = shape.pop("model_type")
    ids = {s: i for i, s in enumerate(SPECIAL)}  # the trainer puts the special tokens first, in order
    config = AutoConfig.for_model(
        model_type,
        vocab_size=vocab,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        dtype="bfloat16",
        **shape,
    )
    torch.manual_seed(SEED)
    with torch.no_grad():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()}


if __name__ == "__main__":
    target, which = Path(sys.argv[1]), sys.argv[2]
    print(json.dumps(make(target, which), indent=1, sort_keys=True))
