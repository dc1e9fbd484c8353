"""fp16 mixed precision as torch's autocast users know it, on zerod.

Lightning's "16-mixed" and Accelerate's mixed_precision="fp16" are autocast
over fp32 parameters with a torch GradScaler. On zerod the parameters stay
fp32 (zerod holds them), the forward runs under torch.autocast(float16), and
zerod's dynamic loss scaler takes the GradScaler's place: it scales the loss
in backward, and a window whose gradients hold inf or NaN is skipped and the
scale halved. The GradScaler's settings become the scaler's, so training
follows the same scale sequence as the GradScaler would:

    GradScaler              zerod (DeepSpeed config "fp16")
    init_scale = 2^k        initial_scale_power = k
    growth_interval = n     loss_scale_window = n, zerod_window_rule = "torch"
    backoff_factor = 0.5    hysteresis = 1 (halve on every overflow)
    growth_factor = 2.0     (zerod's factor is always 2)

A GradScaler setting with no such counterpart (a scale that is not a power
of two, other growth or backoff factors) is refused naming it. zerod's
scale never goes below min_loss_scale (1 unless the config says otherwise),
and an overflow there fails the step (as DeepSpeed's ZeRO scaler does;
fp16.raise_error_at_min_scale in a job script); torch's has no floor and
skips on. Either only matters after 16 overflows in a row.
"""
import math

from .errors import InvalidArgumentError

# torch.amp.GradScaler's defaults.
GRAD_SCALER_DEFAULTS = dict(init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                            enabled=True)

_SCALER_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                "min_loss_scale")


def grad_scaler_settings(scaler):
    """The settings of a torch.amp.GradScaler (None: the defaults)."""
    if scaler is None:
        return dict(GRAD_SCALER_DEFAULTS)
    return dict(init_scale=float(scaler.get_scale()) if scaler.is_enabled() else 1.0,
                growth_factor=float(scaler.get_growth_factor()), backoff_factor=float(scaler.get_backoff_factor()),
                growth_interval=int(scaler.get_growth_interval()), enabled=bool(scaler.is_enabled()))


def fp16_section(who, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True):
    """The DeepSpeed config "fp16" section that runs a GradScaler's schedule."""
    if not enabled:
        # A disabled GradScaler scales by 1: a fixed scale of 1 (zerod still
        # skips a window whose gradients are not finite, and says so).
        return {"enabled": True, "loss_scale": 1.0}
    power = math.log2(init_scale) if init_scale > 0 else float("nan")
    if not power.is_integer() or not 0 <= power <= 64:
        raise InvalidArgumentError(f"{who}: GradScaler init_scale={init_scale:g} is not a power of two from 1 to "
                                   "2^64; zerod's loss scale starts at 2^k")
    if growth_factor != 2.0 or backoff_factor != 0.5:
        raise InvalidArgumentError(f"{who}: GradScaler growth_factor={growth_factor:g}, backoff_factor="
                                   f"{backoff_factor:g}; zerod's scale doubles and halves (2.0 and 0.5)")
    if growth_interval < 1:
        raise InvalidArgumentError(f"{who}: GradScaler growth_interval={growth_interval} must be at least 1")
    # zerod_window_rule: the GradScaler doubles on the growth_interval-th
    # clean step; DeepSpeed's scaler, which the section otherwise means, an
    # update later.
    return {"enabled": True, "initial_scale_power": int(power), "loss_scale_window": int(growth_interval),
            "hysteresis": 1, "zerod_window_rule": "torch"}


def fill_fp16(cfg, section):
    """Puts `section` into cfg["fp16"] unless the config already says how to
    scale (its own scaler keys win: it is the more specific of the two)."""
    own = cfg.get("fp16") if isinstance(cfg.get("fp16"), dict) else {}
    if any(k in own for k in _SCALER_KEYS):
        own["enabled"] = True
        cfg["fp16"] = own
    else:
        cfg["fp16"] = dict(section)
    return cfg
