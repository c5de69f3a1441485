import os
import pickle

import pytest
import torch

from wsym.errors import WsymInputError
from wsym.io import check_compatible, load_state_dict, save_state_dict

SUFFIXES = [".safetensors", ".pt", ".pth", ".bin"]


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message.strip() == message and message
    return message


def small_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "layer.weight": torch.randn(4, 3),
        "layer.bias": torch.randn(4),
        "bn.num_batches_tracked": torch.tensor(7),
        "half": torch.randn(2, 2, dtype=torch.float16),
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


# --- round trips -------------------------------------------------------------


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip(tmp_path, suffix):
    state = small_state()
    path = tmp_path / f"w{suffix}"
    save_state_dict(state, path)
    loaded = load_state_dict(path)
    assert_same(state, loaded)
    assert all(t.device.type == "cpu" for t in loaded.values())


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_round_trip_tied_views_and_non_contiguous(tmp_path, suffix):
    weight = torch.randn(5, 3)
    big = torch.randn(2000, 4)  # 32 kB, of which the state holds 32 bytes
    state = {"embed": weight, "head": weight, "t": weight.t(), "slice": big[:2]}
    path = tmp_path / f"w{suffix}"
    save_state_dict(state, path)
    assert_same(state, load_state_dict(path))
    # slices are saved alone, not with the storage they view
    if suffix == ".pt":
        assert path.stat().st_size < 8000


def test_safetensors_metadata_is_written(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "w.safetensors"
    save_state_dict(small_state(), path, metadata={"source": "test"})
    with safe_open(path, framework="pt") as handle:
        assert handle.metadata() == {"source": "test"}


@pytest.mark.parametrize("key", ["state_dict", "model"])
def test_wrapped_state_dict(tmp_path, key):
    state = small_state()
    path = tmp_path / "ckpt.pt"
    torch.save({key: state, "epoch": 3, "lr": 0.1}, path)
    assert_same(state, load_state_dict(path))


def test_module_state_dict_round_trip(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    loaded = load_state_dict(path)
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    check_compatible(other.state_dict(), loaded)
    other.load_state_dict(loaded)
    assert_same(model.state_dict(), other.state_dict())


# --- bad files -----------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(tmp_path / "nope.pt")
    assert "not found" in one_line_error(excinfo)


def test_directory_is_refused(tmp_path):
    (tmp_path / "d.pt").mkdir()
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(tmp_path / "d.pt")
    assert "directory" in one_line_error(excinfo)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(b"x")
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    assert ".safetensors" in one_line_error(excinfo)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
@pytest.mark.parametrize("keep", [0.5, 0.95, 0.0])
def test_truncated_file(tmp_path, suffix, keep):
    path = tmp_path / f"w{suffix}"
    save_state_dict(small_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    assert "truncated or corrupt" in one_line_error(excinfo)


def test_truncated_legacy_pickle(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(small_state(), path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    assert "truncated or corrupt" in one_line_error(excinfo)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_garbage_file(tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    path.write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    assert "corrupt" in one_line_error(excinfo)


class CodeRunner:
    """Unpickling this runs code: it touches the sentinel file."""

    def __init__(self, sentinel):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        return (exec, (f"open({self.sentinel!r}, 'w').close()",))


@pytest.mark.parametrize("wrap", ["torch.save", "raw pickle"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, wrap):
    sentinel = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {"w": torch.zeros(2), "x": CodeRunner(sentinel)}
    if wrap == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    message = one_line_error(excinfo)
    assert "not a weights-only checkpoint" in message
    assert "torch.save(model.state_dict()" in message
    assert not sentinel.exists()

    # Control: the payload really does run code when unpickled unsafely.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(CodeRunner(control)))
    assert control.exists()


def test_pickled_module_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    assert "not a weights-only checkpoint" in one_line_error(excinfo)


@pytest.mark.parametrize(
    "content, fragment",
    [
        ({"epoch": 3, "note": "hi"}, "non-tensor"),
        ({"w": torch.zeros(1), "epoch": 3}, "'epoch'"),
        ([torch.zeros(1)], "list"),
        (torch.zeros(3), "Tensor"),
        ({}, "empty"),
        ({1: torch.zeros(1)}, "non-tensor"),
    ],
)
def test_non_tensor_contents(tmp_path, content, fragment):
    path = tmp_path / "w.pt"
    torch.save(content, path)
    with pytest.raises(WsymInputError) as excinfo:
        load_state_dict(path)
    assert fragment in one_line_error(excinfo)


# --- compatibility -------------------------------------------------------------


def test_check_compatible_accepts_matching_state_and_only_it():
    state = small_state()
    check_compatible(state, {k: v.clone() + 1 for k, v in reversed(state.items())})
    name = next(iter(state))
    wrong = {k: v.clone() for k, v in state.items()}
    wrong[name] = torch.zeros(*wrong[name].shape, 1)
    with pytest.raises(WsymInputError, match=name):
        check_compatible(state, wrong)


def test_check_compatible_lists_problems():
    model = {"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}
    loaded = {"a": torch.zeros(3, 2), "b": torch.zeros(4), "extra": torch.zeros(1)}
    with pytest.raises(WsymInputError) as excinfo:
        check_compatible(model, loaded)
    message = one_line_error(excinfo)
    assert "1 missing key (c)" in message
    assert "1 unexpected key (extra)" in message
    assert "1 shape mismatch (a: model [2, 3] vs checkpoint [3, 2])" in message


def test_check_compatible_lists_only_a_few():
    model = {f"k{i:02d}": torch.zeros(1) for i in range(20)}
    with pytest.raises(WsymInputError) as excinfo:
        check_compatible(model, {})
    message = one_line_error(excinfo)
    assert "20 missing keys (k00, k01, k02, and 17 more)" in message
    assert "k19" not in message


# --- atomic writes -------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_atomic_write_leaves_no_temp_files(tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    save_state_dict(small_state(), path)
    save_state_dict({"other": torch.ones(1)}, path)  # overwrite
    assert os.listdir(tmp_path) == [path.name]
    assert set(load_state_dict(path)) == {"other"}


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_failed_write_keeps_old_file_and_no_temp(tmp_path, monkeypatch, suffix):
    path = tmp_path / f"w{suffix}"
    save_state_dict(small_state(), path)
    before = path.read_bytes()

    def broken(obj, target, *args, **kwargs):
        with open(target, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        save_state_dict({"new": torch.ones(3)}, path)
    assert os.listdir(tmp_path) == [path.name]
    assert path.read_bytes() == before


def test_save_refuses_bad_input(tmp_path):
    with pytest.raises(WsymInputError) as excinfo:
        save_state_dict({"w": [1, 2]}, tmp_path / "w.safetensors")
    assert "'w'" in one_line_error(excinfo)
    with pytest.raises(WsymInputError) as excinfo:
        save_state_dict({"w": torch.ones(1)}, tmp_path / "w.txt")
    assert ".safetensors" in one_line_error(excinfo)
    with pytest.raises(WsymInputError) as excinfo:
        save_state_dict({"w": torch.ones(1)}, tmp_path / "missing" / "w.pt")
    assert "does not exist" in one_line_error(excinfo)
    assert os.listdir(tmp_path) == []
