//! Element types: `Dtype`, the 16-bit float types `Bf16` and `F16` (bit
//! patterns with conversions, as Rust has no such primitives), and the
//! `Element` trait that ties a Rust type to its `Dtype`.
//!
//! The conversions are zerod's one rule (kit/include/zerod/kit/half.h, which
//! the engine, the plugins and their CUDA kernels use): round to nearest
//! even, subnormals kept, overflow to infinity, and PyTorch's NaN rule. An
//! f32 NaN becomes the bf16 0x7FC0 whatever its sign and payload (c10), and
//! an fp16 NaN that keeps its sign and the top bits of its payload, made
//! quiet (c10's F16C path, `vcvtps2ph`). So a value converted here has the
//! bits the engine would give it. The tests below are the known answers of
//! tests/kernels/half_rule_test.cpp.

use crate::ffi;

/// The element type of a parameter's working copy, its gradient, or a
/// whole-parameter copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    /// The `zd_dtype` value.
    pub fn raw(self) -> ffi::zd_dtype {
        match self {
            Dtype::F32 => ffi::ZD_DTYPE_F32,
            Dtype::Bf16 => ffi::ZD_DTYPE_BF16,
            Dtype::F16 => ffi::ZD_DTYPE_F16,
        }
    }

    /// None for a value this crate does not know (a newer library may add
    /// types).
    pub fn from_raw(raw: ffi::zd_dtype) -> Option<Dtype> {
        match raw {
            ffi::ZD_DTYPE_F32 => Some(Dtype::F32),
            ffi::ZD_DTYPE_BF16 => Some(Dtype::Bf16),
            ffi::ZD_DTYPE_F16 => Some(Dtype::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

/// A bfloat16 value, held as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// The bf16 every NaN becomes (PyTorch's, and the engine's).
    pub const QUIET_NAN: Bf16 = Bf16(0x7fc0);

    /// Rounds to nearest even; every NaN becomes `Bf16::QUIET_NAN` (0x7FC0),
    /// whatever its sign and payload, as PyTorch and the engine do.
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if b & 0x7fff_ffff > 0x7f80_0000 {
            return Bf16::QUIET_NAN;
        }
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }

    /// Exact, NaN payloads included.
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

/// An IEEE binary16 value, held as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

impl F16 {
    /// Rounds to nearest even; too large becomes infinity. A NaN stays a
    /// NaN, made quiet, with its sign and the top 9 bits of its payload (as
    /// PyTorch's F16C path and the engine do).
    pub fn from_f32(x: f32) -> F16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let a = b & 0x7fff_ffff;
        if a > 0x7f80_0000 {
            return F16(sign | 0x7e00 | ((a >> 13) & 0x3ff) as u16);
        }
        if a >= 0x477f_f000 {
            return F16(sign | 0x7c00);
        }
        if a < 0x3880_0000 {
            // Subnormal half: the value in units of 2^-24, rounded to even.
            // (f32::round_ties_even needs Rust 1.77.)
            let units = f32::from_bits(a) * 16_777_216.0;
            let floor = units.floor();
            let frac = units - floor;
            let mut n = floor as u16;
            if frac > 0.5 || (frac == 0.5 && n & 1 == 1) {
                n += 1;
            }
            return F16(sign | n);
        }
        let mut h = (a >> 13) - (112 << 10);
        let rest = a & 0x1fff;
        if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
            h += 1;
        }
        F16(sign | h as u16)
    }

    /// Exact. A NaN comes back quiet with its sign and payload (as
    /// `vcvtph2ps` and the engine give it).
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let e = (h >> 10) & 31;
        let m = h & 0x3ff;
        if e == 31 && m != 0 {
            return f32::from_bits(((h & 0x8000) << 16) | 0x7fc0_0000 | (m << 13));
        }
        let magnitude = if e == 0 {
            m as f32 * f32::from_bits(0x3380_0000) // 2^-24
        } else if e == 31 {
            f32::INFINITY
        } else {
            f32::from_bits(((e + 112) << 23) | (m << 13))
        };
        if h & 0x8000 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::F16 {}
}

/// A Rust type laid out as one zerod element type: `f32`, `Bf16` or `F16`.
/// Sealed: views and whole-parameter copies rely on the layout.
pub trait Element: Copy + Default + sealed::Sealed + 'static {
    const DTYPE: Dtype;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for Bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f32(self) -> f32 {
        Bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        Bf16::from_f32(x)
    }
}

impl Element for F16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f32(self) -> f32 {
        F16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        F16::from_f32(x)
    }
}

#[cfg(test)]
mod tests {
    use super::{Bf16, F16};

    // f32 bits -> the bf16 and fp16 bits of the one rule: the table of
    // tests/kernels/half_rule_test.cpp, which holds the engine, every
    // optimizer kernel and the comm kernels to the same answers.
    const ANSWERS: &[(u32, u16, u16, &str)] = &[
        (0x7FC0_0000, 0x7FC0, 0x7E00, "quiet NaN"),
        (0xFFC0_0000, 0x7FC0, 0xFE00, "negative quiet NaN"),
        (0x7F80_0001, 0x7FC0, 0x7E00, "signalling NaN, low payload"),
        (0x7FA0_0000, 0x7FC0, 0x7F00, "signalling NaN, high payload"),
        (0x7FC1_2345, 0x7FC0, 0x7E09, "quiet NaN with a payload"),
        (0xFFFF_FFFF, 0x7FC0, 0xFFFF, "all-ones NaN"),
        (0x7FFF_FFFF, 0x7FC0, 0x7FFF, "largest positive NaN"),
        (0xFF80_0001, 0x7FC0, 0xFE00, "negative signalling NaN"),
        (0x7F80_0000, 0x7F80, 0x7C00, "+inf"),
        (0xFF80_0000, 0xFF80, 0xFC00, "-inf"),
        (0x0000_0000, 0x0000, 0x0000, "+0"),
        (0x8000_0000, 0x8000, 0x8000, "-0"),
        (0x3F80_0000, 0x3F80, 0x3C00, "1"),
        (0x3F80_8000, 0x3F80, 0x3C04, "bf16 tie, even below"),
        (0x3F81_8000, 0x3F82, 0x3C0C, "bf16 tie, even above"),
        (0x3F80_8001, 0x3F81, 0x3C04, "past a bf16 tie"),
        (0x3F80_7FFF, 0x3F80, 0x3C04, "below a bf16 tie"),
        (0x7F7F_FFFF, 0x7F80, 0x7C00, "largest fp32"),
        (0x7F7F_8000, 0x7F80, 0x7C00, "bf16 tie at the top: to inf"),
        (0x0000_0001, 0x0000, 0x0000, "smallest fp32 denormal"),
        (0x0000_8000, 0x0000, 0x0000, "fp32 denormal, bf16 tie to 0"),
        (0x0001_8000, 0x0002, 0x0000, "fp32 denormal, bf16 tie up"),
        (0x807F_FFFF, 0x8080, 0x8000, "largest negative fp32 denormal"),
        (0x3F80_1000, 0x3F80, 0x3C00, "fp16 tie, even below (1 + 2^-11)"),
        (0x3F80_3000, 0x3F80, 0x3C02, "fp16 tie, even above (1 + 3*2^-11)"),
        (0x3F80_1001, 0x3F80, 0x3C01, "past an fp16 tie"),
        (0x477F_E000, 0x4780, 0x7BFF, "65504, largest fp16"),
        (0x477F_EFFF, 0x4780, 0x7BFF, "just below 65520"),
        (0x477F_F000, 0x4780, 0x7C00, "65520: fp16 tie to inf"),
        (0xC77F_F000, 0xC780, 0xFC00, "-65520"),
        (0x3880_0000, 0x3880, 0x0400, "2^-14, smallest fp16 normal"),
        (0x387F_C000, 0x3880, 0x03FF, "largest fp16 subnormal"),
        (0x3380_0000, 0x3380, 0x0001, "2^-24, smallest fp16 subnormal"),
        (0x3300_0000, 0x3300, 0x0000, "2^-25: fp16 tie to 0"),
        (0xB300_0000, 0xB300, 0x8000, "-2^-25"),
        (0x3300_0001, 0x3300, 0x0001, "just above 2^-25"),
        (0x33C0_0000, 0x33C0, 0x0002, "1.5 * 2^-24: fp16 tie to 2"),
        (0x3420_0000, 0x3420, 0x0002, "2.5 * 2^-24: fp16 tie to 2"),
        (0x387F_E000, 0x3880, 0x0400, "2^-14 - 2^-25: tie up into the fp16 normals"),
    ];

    #[test]
    fn narrowing_gives_the_engines_bits_nans_included() {
        for &(f32_bits, bf16, f16, what) in ANSWERS {
            let x = f32::from_bits(f32_bits);
            assert_eq!(Bf16::from_f32(x), Bf16(bf16), "bf16 of {:#010x} ({})", f32_bits, what);
            assert_eq!(F16::from_f32(x), F16(f16), "fp16 of {:#010x} ({})", f32_bits, what);
        }
    }

    // PyTorch's bf16 NaN: one pattern for every NaN, so no payload or sign
    // can leak through, and none can round into an infinity.
    #[test]
    fn every_f32_nan_is_bf16_0x7fc0() {
        for hi in 0..=0x1ffu32 {
            for lo in [0x0000_0001u32, 0x0000_ffff, 0x0040_0000, 0x007f_ffff, 0x0000_8000] {
                let bits = (hi << 23) | lo;
                if bits & 0x7f80_0000 != 0x7f80_0000 {
                    continue;
                }
                assert_eq!(Bf16::from_f32(f32::from_bits(bits)), Bf16::QUIET_NAN, "{:#010x}", bits);
            }
        }
    }

    // Widening: bf16 exact, bits and all; fp16 exact for numbers, and a NaN
    // comes back quiet with its sign and payload.
    #[test]
    fn widening_is_exact_and_nans_come_back_quiet() {
        for h in 0..=0xffffu32 {
            assert_eq!(Bf16(h as u16).to_f32().to_bits(), h << 16, "bf16 {:#06x}", h);
            let m = h & 0x3ff;
            let got = F16(h as u16).to_f32().to_bits();
            if h & 0x7c00 == 0x7c00 && m != 0 {
                assert_eq!(got, ((h & 0x8000) << 16) | 0x7fc0_0000 | (m << 13), "fp16 NaN {:#06x}", h);
                // Narrowing it again gives the quiet form of the same NaN.
                assert_eq!(F16::from_f32(f32::from_bits(got)), F16((h | 0x200) as u16), "fp16 NaN {:#06x}", h);
            }
        }
    }
}
