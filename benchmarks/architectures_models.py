"""Model lists of the architecture sweep (``benchmarks/architectures.py``).

Each family maps a model name to a zero-argument builder returning
``(model, example_inputs)`` with random weights (nothing is downloaded).
"""

from __future__ import annotations

import torch


def torchvision_models() -> dict:
    import torchvision

    out = {}
    for name in torchvision.models.list_models(module=torchvision.models):
        out[name] = lambda n=name: _torchvision(n)
    return out


def _torchvision(name):
    import torchvision

    kwargs = {"init_weights": False} if name in ("googlenet", "inception_v3") else {}
    if name.startswith("vit_"):
        kwargs["image_size"] = 64
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    size = {"inception_v3": 96, "maxvit_t": 224}.get(name, 64)
    return model, torch.randn(1 if size > 100 else 2, 3, size, size)


TIMM = [
    "resnet18",
    "resnet50d",
    "resnext26ts",
    "seresnet18",
    "regnetx_002",
    "regnety_002",
    "mobilenetv3_small_050",
    "mobilenetv2_050",
    "efficientnet_b0",
    "tf_efficientnet_lite0",
    "mixnet_s",
    "ghostnet_050",
    "ghostnetv2_100",
    "hrnet_w18_small",
    "dla34",
    "dpn48b",
    "densenet121",
    "rexnet_100",
    "lcnet_050",
    "fbnetc_100",
    "mnasnet_small",
    "repvgg_a0",
    "cspresnet50",
    "darknet17",
    "vovnet39a",
    "convnext_atto",
    "convnextv2_atto",
    "edgenext_xx_small",
    "efficientformer_l1",
    "levit_128s",
    "mobilevit_xxs",
    "mobilevitv2_050",
    "poolformer_s12",
    "convmixer_768_32",
    "resmlp_12_224",
    "mixer_s32_224",
    "gmlp_ti16_224",
    "vit_tiny_patch16_224",
    "deit_tiny_patch16_224",
    "cait_xxs24_224",
    "xcit_nano_12_p16_224",
    "coat_lite_tiny",
    "pit_ti_224",
    "tnt_s_patch16_224",
    "swin_tiny_patch4_window7_224",
    "crossvit_tiny_240",
    "maxvit_nano_rw_256",
    "nfnet_l0",
    "inception_v3",
    "xception41",
]
FIXED_SIZE = ("vit_", "deit_", "cait_", "xcit_", "pit_", "tnt_", "swin_", "crossvit_", "mixer_")
FIXED_SIZE += ("resmlp_", "gmlp_", "coat_", "levit_", "maxvit_", "efficientformer_")


def timm_models() -> dict:
    return {name: (lambda n=name: _timm(n)) for name in TIMM}


def _timm(name):
    import timm

    model = timm.create_model(name, pretrained=False)
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
    if not name.startswith(FIXED_SIZE):
        size = 64 if name not in ("inception_v3", "xception41") else 96
    return model, torch.randn(1 if size > 100 else 2, 3, size, size)


TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
HF = {  # model type -> (extra config, input kind)
    "bert": ({}, "ids"),
    "roberta": ({"pad_token_id": 1}, "ids"),
    "distilbert": ({"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64}, "ids"),
    "albert": ({"embedding_size": 16}, "ids"),
    "electra": ({"embedding_size": 16}, "ids"),
    "deberta-v2": ({}, "ids"),
    "mobilebert": (
        {"embedding_size": 16, "true_hidden_size": 32, "intra_bottleneck_size": 32},
        "ids",
    ),
    "xlm-roberta": ({"pad_token_id": 1}, "ids"),
    "gpt2": ({}, "ids"),
    "gpt_neo": ({"attention_types": [[["global", "local"], 1]], "num_layers": 2}, "ids"),
    "gptj": ({"rotary_dim": 4}, "ids"),
    "opt": ({"ffn_dim": 64, "word_embed_proj_dim": 32}, "ids"),
    "bloom": ({}, "ids"),
    "llama": ({"num_key_value_heads": 2}, "ids"),
    "mistral": ({"num_key_value_heads": 2}, "ids"),
    "mixtral": ({"num_key_value_heads": 2, "num_local_experts": 4}, "ids"),
    "qwen2": ({"num_key_value_heads": 2}, "ids"),
    "qwen2_moe": (
        {"num_experts": 4, "moe_intermediate_size": 32, "num_key_value_heads": 2},
        "ids",
    ),
    "phi": ({}, "ids"),
    "phi3": ({"pad_token_id": 0}, "ids"),
    "gemma": ({"head_dim": 8, "num_key_value_heads": 2}, "ids"),
    "falcon": ({"new_decoder_architecture": False}, "ids"),
    "stablelm": ({"num_key_value_heads": 2}, "ids"),
    "gpt_bigcode": ({}, "ids"),
    "olmo": ({}, "ids"),
    "t5": ({"d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 2, "num_heads": 4}, "seq2seq"),
    "bart": ({"d_model": 32, "encoder_layers": 2, "decoder_layers": 2}, "seq2seq"),
    "vit": ({"image_size": 32, "patch_size": 8}, "pixels"),
    "deit": ({"image_size": 32, "patch_size": 8}, "pixels"),
    "swin": (
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1]}
        | {"num_attention_heads": [2, 4], "window_size": 4},
        "pixels",
    ),
    "convnext": ({"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2}, "pixels"),
    "resnet": ({"hidden_sizes": [8, 16], "depths": [1, 1], "embedding_size": 8}, "pixels"),
}


def hf_models() -> dict:
    return {name: (lambda n=name: _hf(n)) for name in HF}


def _hf(model_type):
    from transformers import AutoConfig, AutoModel

    extra, kind = HF[model_type]
    config = AutoConfig.for_model(model_type, **{**TINY, **extra})
    if kind == "seq2seq" and model_type == "bart":
        config.encoder_attention_heads = config.decoder_attention_heads = 4
        config.encoder_ffn_dim = config.decoder_ffn_dim = 64
    model = AutoModel.from_config(config)
    gen = torch.Generator().manual_seed(0)
    if kind == "pixels":
        size = getattr(config, "image_size", 32)
        return model, {"pixel_values": torch.randn(2, 3, size, size, generator=gen)}
    ids = torch.randint(3, 100, (2, 8), generator=gen)
    if kind == "seq2seq":
        return model, {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    return model, {"input_ids": ids}


FAMILIES = {"torchvision": torchvision_models, "timm": timm_models, "hf": hf_models}
