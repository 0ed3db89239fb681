//! The corpus tests' harness: a corpus source compiled to PTX and loaded on
//! its own device memory, deterministic inputs and tolerance checks.

pub use crate::common::{config, from_bytes, linear, to_bytes, Device, KernelArg};

pub const MEMORY_BYTES: u64 = 256 << 20;

/// The corpus source `source.cu` compiled to PTX and loaded on its own device.
pub fn corpus(source: &str) -> Device {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source(source));
    Device::load(&format!("{source}.cu"), &ptx, MEMORY_BYTES)
}

/// Deterministic inputs: a 64-bit linear congruential generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (f64::from(self.next_u32()) / 4_294_967_296.0)
    }

    /// `n` values uniform in [lo, hi), as f32.
    pub fn uniform_f32s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }

    pub fn range_i32(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next_u32() % (hi - lo + 1) as u32) as i32
    }
}

pub fn assert_close(what: &str, index: usize, got: f64, want: f64, relative: f64) {
    let bound = relative * want.abs().max(1.0);
    assert!(
        (got - want).abs() <= bound,
        "{what}[{index}]: got {got} expected {want} (bound {bound})"
    );
}
