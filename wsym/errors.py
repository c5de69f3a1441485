"""Exceptions that wsym raises for problems the user can fix.

The command line maps :class:`WsymInputError` to exit code 2 and prints its
message as is, so the message must be one line that names the cause and the fix.
"""


class WsymInputError(ValueError):
    """Bad user input: a wrong path, a malformed option, an unknown model name.

    The message is a single line naming the cause and how to fix it.

    Example:
        >>> raise WsymInputError("checkpoint not found: w.pt; check the path")
        Traceback (most recent call last):
        ...
        wsym.errors.WsymInputError: checkpoint not found: w.pt; check the path
    """


class SymmetryWarning(UserWarning):
    """A symmetry candidate was dropped, or an operation blocked symmetries through it."""


def check_finite(state_dict: dict, where: str = "the model") -> None:
    """Raise a one-line :class:`WsymInputError` naming the first tensor with NaN or Inf values.

    Example:
        >>> import torch
        >>> check_finite({"w": torch.tensor([1.0, float("nan")])})
        Traceback (most recent call last):
        ...
        wsym.errors.WsymInputError: w holds NaN or infinite values in the model; ...
    """
    import torch

    for key, t in state_dict.items():
        if not (torch.is_tensor(t) and t.is_floating_point()) or torch.isfinite(t.sum()):
            continue  # a finite sum has finite terms (one pass, no mask; overflow checks all)
        if not torch.isfinite(t).all():
            raise WsymInputError(
                f"{key} holds NaN or infinite values in {where}; "
                "load a finite checkpoint (or reinitialize that tensor)"
            )
