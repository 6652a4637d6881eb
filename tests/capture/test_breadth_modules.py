"""Library modules that used to break the whole frame (issue #10): nn.MultiheadAttention
(torch.overrides queries), nn.Transformer* layers (generators: self.modules()), Hugging Face
models with ModelOutput results.  Each captures as one graph and matches eager."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from .breadth_util import assert_same, check, check_module_training

torch.manual_seed(0)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_eval(batch_first, need_weights):
    mha = nn.MultiheadAttention(16, 2, batch_first=batch_first).eval()
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 3:] = True

    def f(q, kv):
        out, weights = mha(q, kv, kv, need_weights=need_weights, attn_mask=mask, key_padding_mask=padding)
        return out, weights

    shape = (2, 5, 16) if batch_first else (5, 2, 16)
    check(f, (torch.randn(shape), torch.randn(shape)), (torch.randn(shape), torch.randn(shape)))
    with torch.no_grad():  # eager's fast path (native MHA) when need_weights is False
        check(f, (torch.randn(shape), torch.randn(shape)))


@pytest.mark.parametrize("masks", [False, True])
def test_multihead_attention_training(masks):
    mha = nn.MultiheadAttention(16, 4, batch_first=True).train()
    kwargs = {}
    if masks:
        kwargs = {"attn_mask": torch.ones(5, 5, dtype=torch.bool).triu(1),
                  "key_padding_mask": torch.tensor([[False] * 5, [False] * 3 + [True] * 2])}
    x = torch.randn(2, 5, 16, requires_grad=True)
    check_module_training(mha, (x, x, x), (torch.randn(2, 5, 16), x, x), kwargs=kwargs)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_transformer_encoder_layer(norm_first, training):
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    layer.train(training)
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    calls = [(torch.randn(2, 6, 16, requires_grad=training),), (torch.randn(2, 6, 16),)]
    check_module_training(layer, *calls)
    check_module_training(layer, *calls, kwargs={"src_key_padding_mask": padding})
    if not training:
        with torch.no_grad():  # the fast path: torch._transformer_encoder_layer_fwd, as eager
            check(layer, *calls, kwargs={"src_key_padding_mask": padding})


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_transformer_decoder_layer(norm_first, training):
    layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    layer.train(training)
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    calls = [(torch.randn(2, 6, 16, requires_grad=training), torch.randn(2, 4, 16)),
             (torch.randn(2, 6, 16), torch.randn(2, 4, 16))]
    check_module_training(layer, *calls, kwargs={"tgt_mask": causal})


@pytest.mark.parametrize("training", [False, True])
def test_transformer_encoder_stack(training):
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).train(training)
    padding = torch.tensor([[False] * 6, [False] * 5 + [True]])
    check_module_training(encoder, (torch.randn(2, 6, 16),), (torch.randn(2, 6, 16),),
                          kwargs={"src_key_padding_mask": padding})


def _hf_inputs():
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return ids, mask


def _hf_models():
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    llama = transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
        vocab_size=100, max_position_embeddings=16))
    return {"bert": (bert, {}), "gpt2": (gpt2, {"use_cache": False}), "llama": (llama, {"use_cache": False})}


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("training", [False, True])
def test_hugging_face_model_output(name, training):
    model, extra = _hf_models()[name]
    model.train(training)
    ids, mask = _hf_inputs()
    kwargs = {"attention_mask": mask, "return_dict": True, **extra}
    check_module_training(model, (ids,), (torch.randint(0, 100, (2, 8)),), kwargs=kwargs)


def test_hugging_face_output_fields_and_indexing():
    model, _ = _hf_models()["bert"]
    model.eval()
    ids, mask = _hf_inputs()

    def f(ids, mask):
        out = model(ids, attention_mask=mask, return_dict=True)
        return out.last_hidden_state[:, 0] + out[1], out.to_tuple()[0].shape, "pooler_output" in out

    check(f, (ids, mask), (torch.randint(0, 100, (2, 8)), mask))
    assert_same(type(model(ids, return_dict=True)).__name__, "BaseModelOutputWithPoolingAndCrossAttentions")
