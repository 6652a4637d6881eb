"""Training steps of many Hugging Face architectures (tiny random configs, CPU, float32) through
ember.compile against eager: the loss and every parameter gradient, over two steps with new inputs.
(A differential sweep over models outside the zoo, not a test.)

    python benchmarks/hf_train_sweep.py [--archs bert,t5,...] [--steps 2]

Dropout is configured off (ember draws its own random masks: equal in distribution, not in value).
Per architecture it prints pass / MISMATCH (the worst relative error, what it is) / ERROR, the
number of graphs and graph breaks of the first step, and any fallback warnings.
"""
from __future__ import annotations

import argparse
import time
import traceback
import warnings

import torch

import ember

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=99,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, classifier_dropout=0.0, hidden_dropout=0.0)
DECODER = dict(num_key_value_heads=1, head_dim=16)

# name -> (model class, config class, config overrides, input kind)
def _archs() -> dict:
    import transformers as t
    seq2seq = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                   encoder_ffn_dim=64, decoder_ffn_dim=64)
    return {
        "bert": (t.BertForMaskedLM, t.BertConfig, {}, "mlm"),
        "roberta": (t.RobertaForMaskedLM, t.RobertaConfig, {}, "mlm"),
        "distilbert": (t.DistilBertForMaskedLM, t.DistilBertConfig,
                       dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64), "mlm"),
        "albert": (t.AlbertForMaskedLM, t.AlbertConfig, dict(embedding_size=16), "mlm"),
        "electra": (t.ElectraForMaskedLM, t.ElectraConfig, dict(embedding_size=16), "mlm"),
        "deberta_v2": (t.DebertaV2ForMaskedLM, t.DebertaV2Config, {}, "mlm"),
        "mobilebert": (t.MobileBertForMaskedLM, t.MobileBertConfig,
                       dict(embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
                            num_feedforward_networks=1), "mlm"),
        "gpt2": (t.GPT2LMHeadModel, t.GPT2Config, dict(n_embd=32, n_layer=2, n_head=2, n_positions=64), "clm"),
        "gpt_neo": (t.GPTNeoForCausalLM, t.GPTNeoConfig,
                    dict(num_layers=2, attention_types=[[["global", "local"], 1]], window_size=4), "clm"),
        "gptj": (t.GPTJForCausalLM, t.GPTJConfig, dict(n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=64),
                 "clm"),
        "opt": (t.OPTForCausalLM, t.OPTConfig, dict(ffn_dim=64, word_embed_proj_dim=32), "clm"),
        "bloom": (t.BloomForCausalLM, t.BloomConfig, dict(n_layer=2, n_head=2), "clm"),
        "falcon": (t.FalconForCausalLM, t.FalconConfig, {}, "clm"),
        "llama": (t.LlamaForCausalLM, t.LlamaConfig, DECODER, "clm"),
        "mistral": (t.MistralForCausalLM, t.MistralConfig, dict(DECODER, sliding_window=4), "clm"),
        "qwen2": (t.Qwen2ForCausalLM, t.Qwen2Config, DECODER, "clm"),
        "phi": (t.PhiForCausalLM, t.PhiConfig, dict(partial_rotary_factor=0.5), "clm"),
        "gemma": (t.GemmaForCausalLM, t.GemmaConfig, DECODER, "clm"),
        "t5": (t.T5ForConditionalGeneration, t.T5Config,
               dict(d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2,
                    dropout_rate=0.0, relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0),
               "seq2seq"),
        "bart": (t.BartForConditionalGeneration, t.BartConfig, seq2seq, "seq2seq"),
        "vit": (t.ViTForImageClassification, t.ViTConfig, dict(image_size=16, patch_size=4, num_labels=5), "image"),
        "convnext": (t.ConvNextForImageClassification, t.ConvNextConfig,
                     dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=5), "image"),
        "resnet": (t.ResNetForImageClassification, t.ResNetConfig,
                   dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5), "image"),
        "swin": (t.SwinForImageClassification, t.SwinConfig,
                 dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                      num_labels=5), "image"),
        "wav2vec2": (t.Wav2Vec2ForCTC, t.Wav2Vec2Config,
                     dict(conv_dim=(8, 8), conv_kernel=(5, 3), conv_stride=(4, 2), num_conv_pos_embeddings=8,
                          num_conv_pos_embedding_groups=2, feat_proj_dropout=0.0, final_dropout=0.0,
                          layerdrop=0.0, mask_time_prob=0.0, vocab_size=12), "audio"),
    }


def make_inputs(kind: str, config, step: int) -> dict:
    gen = torch.Generator().manual_seed(100 + step)
    vocab = getattr(config, "vocab_size", 99)
    ids = torch.randint(1, vocab, (2, 12), generator=gen)
    if kind == "mlm":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids).index_fill_(1, torch.tensor([11]), 0),
                "labels": ids}
    if kind == "clm":
        return {"input_ids": ids, "labels": ids}
    if kind == "seq2seq":
        return {"input_ids": ids, "labels": torch.randint(1, vocab, (2, 7), generator=gen)}
    if kind == "image":
        size = getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else 32
        return {"pixel_values": torch.randn(2, 3, size, size, generator=gen),
                "labels": torch.randint(0, config.num_labels, (2,), generator=gen)}
    if kind == "audio":
        return {"input_values": torch.randn(2, 400, generator=gen),
                "labels": torch.randint(1, 12, (2, 5), generator=gen)}
    raise ValueError(kind)


def run_arch(name: str, spec, steps: int) -> str:
    model_cls, config_cls, overrides, kind = spec
    settings = {**TINY, **overrides}
    if "num_heads" in overrides:            # Swin: a list per stage, which num_attention_heads would replace
        settings.pop("num_attention_heads")
    config = config_cls(**settings)
    torch.manual_seed(0)
    eager_model = model_cls(config).train()
    compiled_model = model_cls(config).train()
    compiled_model.load_state_dict(eager_model.state_dict())
    compiled = ember.compile(compiled_model)
    worst, what = 0.0, ""
    graphs = breaks = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            inputs = make_inputs(kind, config, step)
            for m in (eager_model, compiled_model):
                m.zero_grad(set_to_none=True)
            expected = eager_model(**inputs).loss
            expected.backward()
            if step == 0:
                report = ember.explain(compiled_model, **inputs)
                graphs, breaks = report.graph_count, report.break_count
                compiled_model.zero_grad(set_to_none=True)
            actual = compiled(**inputs).loss
            actual.backward()
            pairs = [("loss", actual, expected)] + [
                (f"grad {n}", pc.grad, pe.grad) for (n, pc), (_, pe) in
                zip(compiled_model.named_parameters(), eager_model.named_parameters())]
            for label, a, e in pairs:
                if e is None and a is None:
                    continue
                if (e is None) != (a is None):
                    return f"MISMATCH step {step}: {label}: one side has no gradient"
                # floored: a gradient that is zero in exact arithmetic (a key bias) is noise
                scale = e.detach().abs().max().clamp_min(1e-5)
                error = ((a.detach() - e.detach()).abs().max() / scale).item()
                if not error <= worst:
                    worst, what = error, f"step {step} {label}"
    fallbacks = sorted({str(w.message).splitlines()[0][:160] for w in caught if "ember" in str(w.message)})
    status = "pass" if worst < 1e-4 else "MISMATCH"
    return f"{status}: worst relative error {worst:.2e} ({what}); graphs {graphs}, breaks {breaks}" + \
        "".join(f"\n    warning: {f}" for f in fallbacks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="all")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    archs = _archs()
    names = list(archs) if args.archs == "all" else args.archs.split(",")
    for name in names:
        start = time.perf_counter()
        try:
            line = run_arch(name, archs[name], args.steps)
        except Exception as error:  # noqa: BLE001 - a sweep reports and goes on
            line = f"ERROR {type(error).__name__}: {str(error)[:300]}\n" + \
                "".join(traceback.format_exception(error)[-3:])[:600]
        print(f"{name:12s} {line}  [{time.perf_counter() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
