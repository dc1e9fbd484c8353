//! Element types: `Dtype`, the 16-bit float types `Bf16` and `F16` (bit
//! patterns with conversions, as Rust has no such primitives), and the
//! `Element` trait that ties a Rust type to its `Dtype`.

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
    /// Rounds to nearest even; a NaN stays a (quiet) NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if b & 0x7fff_ffff > 0x7f80_0000 {
            return Bf16(((b >> 16) | 0x40) as u16);
        }
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }

    /// Exact.
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

/// An IEEE binary16 value, held as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

impl F16 {
    /// Rounds to nearest even; too large becomes infinity, a NaN stays a NaN.
    pub fn from_f32(x: f32) -> F16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let a = b & 0x7fff_ffff;
        if a > 0x7f80_0000 {
            return F16(sign | 0x7e00);
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

    /// Exact.
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let e = (h >> 10) & 31;
        let m = h & 0x3ff;
        let magnitude = if e == 0 {
            m as f32 * f32::from_bits(0x3380_0000) // 2^-24
        } else if e == 31 {
            if m != 0 {
                f32::NAN
            } else {
                f32::INFINITY
            }
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
