"""Makes the tiny model that the real-vLLM demo and tests serve, from nothing but this file.

No hub: the weights are random (seeded) and the tokenizer is trained here, on text made of the
load generator's own vocabulary (sim/src/text.rs: 64 four-byte pieces, " the", " and", ...)
plus ordinary English, so that every piece of a generated prompt is exactly one token, as it is
for the mock engine: a prompt of n pieces is n tokens to vLLM too, and the two engines' token
counts, block boundaries and cache hits can be compared request by request.

Usage: python make_tiny_model.py OUT_DIR [--layers N] [--hidden N] [--lora OUT_DIR]
           [--embedding OUT_DIR]
The default size (2 layers, hidden 128) makes prefill dominate TTFT on one CPU core as it does on
a GPU: 4,096 prompt tokens take about 170 ms uncached and 18 ms cached, a decode step 2.5 ms.
--lora also writes a LoRA adapter for it (peft, random, seeded) that vLLM can load at run time;
--embedding a second, tiny embedding model (a BERT encoder) for /v1/embeddings.
"""

import argparse
import json
import os
import random

# sim/src/text.rs's PIECES, in order: the load generator's prompts are made of these.
PIECES = [
    " the", " and", " for", " you", " not", " are", " was", " but", " all", " can", " had", " her",
    " one", " our", " out", " day", " get", " has", " him", " his", " how", " man", " new", " now",
    " old", " see", " two", " way", " who", " boy", " did", " its", " let", " put", " say", " she",
    " too", " use", " sun", " sea", " sky", " map", " key", " box", " cup", " pen", " ink", " oak",
    " elm", " fox", " owl", " bee", " ant", " cat", " dog", " car", " bus", " row", " set", " job",
    " art", " law", " war", " age",
]

# Plain text for the rest of the vocabulary (chat questions, test prompts, JSON-ish strings).
ENGLISH = """You are a helpful assistant. Answer the question below using the documents.
Question: what is the capital of France? Summarize the following report in three sentences.
Translate this sentence into German. Write a SQL query that counts the rows of the table.
The quick brown fox jumps over the lazy dog. Hello, world! 0123456789 user assistant system
Please explain how prefix caching works in a large language model serving engine.
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(4000):
        lines.append("".join(rng.choice(PIECES) for _ in range(64)))
    lines.extend(ENGLISH.splitlines() * 50)
    return lines


def make_tokenizer(out: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|bos|>", "<|eos|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(7), trainer=trainer)
    for p in PIECES:  # every piece must be one token, or the token accounting is off
        ids = tok.encode(p).ids
        assert len(ids) == 1, f"piece {p!r} is {len(ids)} tokens"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def make_llama(out: str, layers: int, hidden: int, vocab: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=64,
        max_position_embeddings=16384,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return model


def make_lora(model_dir: str, out: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(base, cfg)
    peft_model.save_pretrained(out)


def make_embedding(out: str, tokenizer_dir: str):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(2)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
    )
    BertModel(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lora")
    ap.add_argument("--embedding")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = make_tokenizer(args.out)
    make_llama(args.out, args.layers, args.hidden, len(tok))
    if args.lora:
        make_lora(args.out, args.lora)
    if args.embedding:
        make_embedding(args.embedding, args.out)
    with open(os.path.join(args.out, "kvmesh-model.json"), "w") as f:
        json.dump({"layers": args.layers, "hidden": args.hidden, "vocab": len(tok)}, f)


if __name__ == "__main__":
    main()
