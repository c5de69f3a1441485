"""Reading and writing checkpoints (state dicts) safely."""

from wsym.io.checkpoint import check_compatible, load_state_dict, save_state_dict

__all__ = ["check_compatible", "load_state_dict", "save_state_dict"]
