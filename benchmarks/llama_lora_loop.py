"""A tiny Llama + PEFT LoRA fine-tune step for the benchmarks (issue 46): ``transformers``'
``LlamaForCausalLM`` from a tiny config (hidden 32, 2 layers, no weights downloaded), LoRA on
``q_proj``/``v_proj`` (``peft``), AdamW over the LoRA parameters, causal-LM loss on random tokens.
``LlamaModel.forward`` slices ``self.layers[:n]`` (a new ``ModuleList`` each forward), the
structure change that made ``hazards="auto"`` arm every step before issue 46.

``build_loop`` has ``bench_small_loop.build_loop``'s signature (``bench_twins.py --loop llama-lora``).
Needs ``transformers`` and ``peft`` (the test extras)."""

from __future__ import annotations

from bench_small_loop import updater  # (the update half of a step, shared with the small loop)

SEQ, BATCH, VOCAB = 32, 8, 256


def build_loop(total: int, device: str = "cpu", bound: bool = False):
    """The model, its optimizer and one training step (``step()`` returns the loss); ``total``
    is the length of the warm-up/cosine schedule; ``bound``: the step calls
    ``torch.autograd.backward`` and ``clip_grad_norm_`` as they are now (``bench_small_loop.build_loop``)."""
    import math
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    import peft
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    model = transformers.LlamaForCausalLM(cfg).to(device)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                       lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    g = torch.Generator().manual_seed(0)
    update = updater(model, opt, sched, bound)  # (backward and clip bound now, before any Monitor)

    def step():
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device)
        loss = model(input_ids=x, labels=x).loss
        update(loss)
        return loss

    return model, opt, step
