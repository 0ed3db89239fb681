//! Ordered vector accesses of global memory in compiled code
//! (`whole_vector`): one atomic access of the whole vector, its elements
//! split from or packed into its words.

use super::runtime::{rt_load_whole, rt_store_whole};
use super::translate::Translator;
use crate::ir::Sp;
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{InstBuilder, Value};

impl Translator<'_, '_> {
    /// Loads the `n` elements of `size` bytes at `base` in `sp` (aligned
    /// to the vector: checked before) into `ds` as one atomic access of
    /// `bytes` (up to 8: the fast path's atomic load; 16: the helper's),
    /// sign-extended when `sext`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load_whole(
        &mut self,
        sp: Sp,
        base: Value,
        size: u32,
        ds: &[u32],
        sext: bool,
        bytes: u32,
        line: u32,
    ) {
        let words = if bytes < 16 {
            self.atomic = true;
            let w = self.load(sp, base, bytes, line);
            self.atomic = false;
            [w, w]
        } else {
            self.load_16(sp, base, line)
        };
        for (k, &d) in ds.iter().enumerate() {
            let bit = k as u32 * size * 8;
            let mut v = words[(bit / 64) as usize];
            if !bit.is_multiple_of(64) {
                v = self.fb.ins().ushr_imm_u(v, (bit % 64) as i64);
            }
            if size < 8 {
                v = if sext {
                    self.sext(v, size * 8)
                } else {
                    self.fb.ins().band_imm_u(v, (1i64 << (size * 8)) - 1)
                };
            }
            self.set(d, v);
        }
    }

    /// Stores the elements `vals` of `size` bytes at `base` in `sp`
    /// (aligned: checked before) as one atomic access of `bytes`.
    pub(super) fn store_whole(
        &mut self,
        sp: Sp,
        base: Value,
        size: u32,
        vals: &[Value],
        bytes: u32,
        line: u32,
    ) {
        let mut words = [None::<Value>; 2];
        for (k, &v) in vals.iter().enumerate() {
            let bit = k as u32 * size * 8;
            let mut v = v;
            if size < 8 {
                v = self.fb.ins().band_imm_u(v, (1i64 << (size * 8)) - 1);
            }
            if !bit.is_multiple_of(64) {
                v = self.fb.ins().ishl_imm_u(v, (bit % 64) as i64);
            }
            let word = &mut words[(bit / 64) as usize];
            *word = Some(match *word {
                Some(w) => self.fb.ins().bor(w, v),
                None => v,
            });
        }
        let [lo, hi] = words.map(|w| w.unwrap_or_else(|| self.fb.ins().iconst(I64, 0)));
        if bytes < 16 {
            self.atomic = true;
            self.store(sp, base, bytes, lo, line);
            self.atomic = false;
        } else {
            self.store_16(sp, base, lo, hi, line);
        }
    }

    /// The two words of the 16 bytes at `addr` in `sp`, read in one atomic
    /// access by the helper.
    fn load_16(&mut self, sp: Sp, addr: Value, line: u32) -> [Value; 2] {
        self.next_site(sp);
        let [ctx, site, local, spc] = self.access_head(sp);
        let ln = self.imm32(line as i64);
        let out = self.fb.ins().stack_addr(I64, self.slot, 0);
        let f = rt_load_whole as *const ();
        self.call_checked(f, &[ctx, site, local, spc, addr, ln, out]);
        [0, 8].map(|at| self.fb.ins().stack_load(I64, I64, self.slot, at))
    }

    /// Writes the words `lo`, `hi` as the 16 bytes at `addr` in `sp` in one
    /// atomic access by the helper.
    fn store_16(&mut self, sp: Sp, addr: Value, lo: Value, hi: Value, line: u32) {
        self.next_site(sp);
        let [ctx, site, local, spc] = self.access_head(sp);
        let ln = self.imm32(line as i64);
        let f = rt_store_whole as *const ();
        self.call_checked(f, &[ctx, site, local, spc, addr, ln, lo, hi]);
    }
}
