import sys

import pytest
import torch
from torch import nn

from wsym.errors import WsymInputError
from wsym.models import registry as factory
from wsym.models.registry import (
    build_model,
    example_inputs,
    hf_model_config,
    parse_config,
    parse_input_shape,
)

TINY_BERT = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "vocab_size": 50,
    "max_position_embeddings": 16,
}


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message
    return message


# --- parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", {}),
        (None, {}),
        ("  ", {}),
        ("a=1", {"a": 1}),
        ("a=-2, b = 0.5 ,c=1e-3", {"a": -2, "b": 0.5, "c": 1e-3}),
        ("t=true,f=False,n=none", {"t": True, "f": False, "n": None}),
        ("act=gelu,name=x.y,ver=1.2.3", {"act": "gelu", "name": "x.y", "ver": "1.2.3"}),
        ("empty=", {"empty": ""}),
    ],
)
def test_parse_config(text, expected):
    result = parse_config(text)
    assert result == expected
    assert [type(v) for v in result.values()] == [type(v) for v in expected.values()]


@pytest.mark.parametrize("text", ["a", "a=1,", "=1", "1a=2", "a-b=1", "a=1,a=2"])
def test_parse_config_errors(text):
    with pytest.raises(WsymInputError) as excinfo:
        parse_config(text)
    assert "config" in one_line_error(excinfo)


def test_parse_input_shape():
    assert parse_input_shape("1,3,224,224") == (1, 3, 224, 224)
    assert parse_input_shape(" 2 , 8 ") == (2, 8)
    assert parse_input_shape("5") == (5,)


@pytest.mark.parametrize("text", ["", "1,,2", "1,x", "0,3", "-1,3", "1.5", "1,3,"])
def test_parse_input_shape_errors(text):
    with pytest.raises(WsymInputError) as excinfo:
        parse_input_shape(text)
    assert "e.g. 1,3,224,224" in one_line_error(excinfo)


# --- building ------------------------------------------------------------------


def test_torchvision_model_random_and_eval():
    model = build_model("torchvision:resnet18", {"num_classes": 7})
    assert not model.training
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)


def test_torchvision_never_downloads_a_backbone(monkeypatch):
    """The builder's default weights_backbone is an ImageNet download; it is overridden."""
    import socket

    import torchvision.models._api as weights_api

    def refuse(*args, **kwargs):
        raise AssertionError("a weight download was attempted")

    monkeypatch.setattr(weights_api.WeightsEnum, "get_state_dict", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    model = build_model("torchvision:lraspp_mobilenet_v3_large", {"num_classes": 3})
    out = model(torch.randn(1, 3, 64, 64))["out"]
    assert out.shape == (1, 3, 64, 64)


@pytest.mark.parametrize(
    "spec, config, key",
    [
        ("torchvision:resnet18", {"weights": "DEFAULT"}, "weights"),
        ("torchvision:fcn_resnet50", {"weights_backbone": "DEFAULT"}, "weights_backbone"),
        ("timm:resnet18", {"pretrained": True}, "pretrained"),
    ],
)
def test_pretrained_weights_are_refused(spec, config, key):
    with pytest.raises(WsymInputError) as excinfo:
        build_model(spec, config)
    assert key in one_line_error(excinfo) and "never downloads" in str(excinfo.value)


def test_timm_model():
    model = build_model("timm:vit_tiny_patch16_224", {"img_size": 32, "patch_size": 16, "depth": 1})
    assert not model.training
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_hf_model_from_config():
    model = build_model("hf:bert", TINY_BERT)
    assert type(model).__name__ == "BertModel"
    assert model.config.hidden_size == 16 and not model.training
    inputs = example_inputs("hf:bert", (2, 8), model=model, seed=0)
    assert model(**inputs).last_hidden_state.shape == (2, 8, 16)


def test_hf_attribute_map_keys():
    config = {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 40, "bos_token_id": 0}
    model = build_model("hf:gpt2", {**config, "eos_token_id": 0})
    assert model.config.hidden_size == 16  # n_embd through the attribute map
    config = hf_model_config("gpt2", {"hidden_size": 24})
    assert config.n_embd == 24


def test_hf_config_typo_is_refused():
    with pytest.raises(WsymInputError) as excinfo:
        hf_model_config("bert", {"hiden_size": 64})
    assert "did you mean hidden_size" in one_line_error(excinfo)


def test_module_path_factory():
    model = build_model("torch.nn:Linear", {"in_features": 4, "out_features": 2, "bias": False})
    assert isinstance(model, nn.Linear) and model.bias is None and not model.training


def test_module_path_nested_attribute():
    model = build_model("torch:nn.Identity")
    assert isinstance(model, nn.Identity)


def test_builtin_registry(monkeypatch):
    monkeypatch.setitem(factory.BUILTIN_MODELS, "toy", lambda width=3: nn.Linear(2, width))
    model = build_model("wsym:toy", {"width": 5})
    assert model.out_features == 5 and not model.training


def test_builtin_inputs_registry(monkeypatch):
    def make_tokens(shape, dtype, generator):
        return torch.randint(0, 11, shape, generator=generator)

    monkeypatch.setitem(factory.BUILTIN_INPUTS, "toy", make_tokens)
    tokens = example_inputs("wsym:toy", (2, 5), seed=1)
    assert tokens.dtype == torch.long and tokens.shape == (2, 5)
    assert torch.equal(tokens, example_inputs("wsym:toy", (2, 5), seed=1))


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("resnet18", "spell a model as"),
        (":resnet18", "spell a model as"),
        ("torchvision:", "spell a model as"),
        ("torchvision:resnet1", "did you mean torchvision:resnet18"),
        ("timm:vit_tiny_patch16", "did you mean timm:vit_tiny_patch16_224"),
        ("hf:bertt", "did you mean hf:bert"),
        ("wsym:no_such_builtin", "unknown builtin model wsym:no_such_builtin"),
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("torch.nn:NoSuchLayer", "has no attribute 'NoSuchLayer'"),
        ("math:pi", "not callable"),
    ],
)
def test_unknown_models(spec, fragment):
    with pytest.raises(WsymInputError) as excinfo:
        build_model(spec)
    assert fragment in one_line_error(excinfo)


def test_rejected_config_is_input_error():
    with pytest.raises(WsymInputError) as excinfo:
        build_model("torch.nn:Linear", {"in_features": 2, "out_features": 2, "widht": 3})
    assert "widht" in one_line_error(excinfo)


def test_factory_must_return_a_module():
    with pytest.raises(WsymInputError) as excinfo:
        build_model("builtins:dict", {"a": 1})
    assert "not a torch.nn.Module" in one_line_error(excinfo)


@pytest.mark.parametrize("source, module", [("timm", "timm"), ("hf", "transformers")])
def test_missing_optional_package_names_the_extra(monkeypatch, source, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(WsymInputError) as excinfo:
        build_model(f"{source}:anything")
    message = one_line_error(excinfo)
    assert "pip install 'wsym[models]'" in message and module in message


# --- example inputs ------------------------------------------------------------


def test_vision_inputs_dtype_and_seed():
    x = example_inputs("torchvision:resnet18", (1, 3, 8, 8), torch.float64, seed=3)
    assert x.shape == (1, 3, 8, 8) and x.dtype == torch.float64
    assert torch.equal(
        x, example_inputs("torchvision:resnet18", (1, 3, 8, 8), torch.float64, seed=3)
    )
    assert not torch.equal(
        x, example_inputs("torchvision:resnet18", (1, 3, 8, 8), torch.float64, seed=4)
    )


def test_hf_inputs_from_config_without_model():
    inputs = example_inputs("hf:bert", (3, 6), config=TINY_BERT, seed=0)
    assert set(inputs) == {"input_ids"}
    ids = inputs["input_ids"]
    assert ids.shape == (3, 6) and ids.dtype == torch.long
    assert 0 <= ids.min() and ids.max() < TINY_BERT["vocab_size"]


def test_hf_encoder_decoder_inputs():
    config = {"d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1, "num_heads": 2}
    model = build_model("hf:t5", {**config, "vocab_size": 30})
    inputs = example_inputs("hf:t5", (2, 4), model=model, seed=0)
    assert set(inputs) == {"input_ids", "decoder_input_ids"}
    assert model(**inputs).last_hidden_state.shape == (2, 4, 16)


def test_hf_vision_inputs():
    config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    config |= {"intermediate_size": 32, "image_size": 8, "patch_size": 4}
    model = build_model("hf:vit", config)
    inputs = example_inputs("hf:vit", (1, 3, 8, 8), model=model, seed=0)
    assert set(inputs) == {"pixel_values"}
    assert model(**inputs).last_hidden_state.shape == (1, 5, 16)


@pytest.mark.parametrize(
    "shape, fragment", [((2, 3, 4), "batch,seq"), ((1, 17), "at most 16 tokens")]
)
def test_hf_input_shape_errors(shape, fragment):
    with pytest.raises(WsymInputError) as excinfo:
        example_inputs("hf:bert", shape, config=TINY_BERT)
    assert fragment in one_line_error(excinfo)


USER_FILE = """
from torch import nn


def build(width=3):
    return nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, 1))
"""


def test_factory_from_a_python_file(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    model = build_model("models/net.py:build", {"width": 5})
    assert model[0].out_features == 5
    absolute = build_model(f"{tmp_path}/models/net.py:build")
    assert absolute[0].out_features == 3


def test_factory_module_imported_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "usernet_cwd.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    assert build_model("usernet_cwd:build")[0].out_features == 3
    assert str(tmp_path) not in sys.path  # the path is restored


def test_missing_module_names_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WsymInputError) as excinfo:
        build_model("no_such_user_module:build")
    message = one_line_error(excinfo)
    assert str(tmp_path) in message and "no_such_user_module.py:factory" in message


def test_missing_or_broken_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WsymInputError) as excinfo:
        build_model("absent.py:build")
    assert "no Python file 'absent.py'" in one_line_error(excinfo)
    (tmp_path / "broken.py").write_text("raise RuntimeError('half written')\n")
    with pytest.raises(WsymInputError) as excinfo:
        build_model("broken.py:build")
    assert "RuntimeError: half written" in one_line_error(excinfo)
