//! Shared-memory `ld` and `st` of 32-bit narrow values in the lane kernel,
//! where its block's check covered them: one vector access when the lanes'
//! addresses are consecutive, one load when they are the same, else lane by lane.

use super::translate::Translator;
use crate::ir::{Address, Inst, Op, Sp, Src, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64};
use cranelift_codegen::ir::{BlockArg, ConstantData, Endianness, InstBuilder, MemFlagsData, Value};

impl Translator<'_, '_> {
    /// Emits `inst`, a covered unguarded 32-bit shared `ld` or `st` of
    /// narrow registers, for every lane; whether it did.
    pub(super) fn vector_shared(&mut self, inst: &Inst) -> bool {
        let narrow = |t: &Self, s: Src| match s {
            Src::Reg(r) => t.vregs[r as usize].is_some(),
            Src::Imm(_) => true,
            Src::Frame(_) => false,
        };
        let fits = |t: &Self, addr: &Address, size: u32, n: u8| {
            inst.guard == NONE
                && addr.sp == Sp::Shared
                && size == 4
                && n == 1
                && narrow(t, addr.base)
                && t.covered(Sp::Shared)
        };
        match inst.op {
            Op::Ld {
                addr,
                size,
                n,
                ds,
                sext: false,
            } if fits(self, &addr, size, n) && narrow(self, Src::Reg(ds[0])) => {
                let (at, first, step) = self.lane_addresses(&addr);
                let flags = MemFlagsData::trusted().with_endianness(Endianness::Little);
                let p = self.shared_unchecked(first);
                let (whole, same, each) = (
                    self.fb.create_block(),
                    self.fb.create_block(),
                    self.fb.create_block(),
                );
                let join = self.fb.create_block();
                let v = self.fb.append_block_param(join, I32X4);
                let not_whole = self.fb.create_block();
                let (consecutive, equal) = step;
                self.fb.ins().brif(consecutive, whole, &[], not_whole, &[]);
                self.fb.switch_to_block(whole);
                let x = self.fb.ins().load(I32X4, flags, p, 0);
                self.fb.ins().jump(join, &[BlockArg::Value(x)]);
                self.fb.switch_to_block(not_whole);
                self.fb.ins().brif(equal, same, &[], each, &[]);
                self.fb.switch_to_block(same);
                let x = self.fb.ins().load(I32, flags, p, 0);
                let x = self.fb.ins().splat(I32X4, x);
                self.fb.ins().jump(join, &[BlockArg::Value(x)]);
                self.fb.switch_to_block(each);
                let zero = self.fb.ins().iconst(I32, 0);
                let mut x = self.fb.ins().splat(I32X4, zero);
                for k in 0..self.width as u8 {
                    let a = self.fb.ins().extractlane(at, k);
                    let a = self.fb.ins().uextend(I64, a);
                    let p = self.shared_unchecked(a);
                    let e = self.fb.ins().load(I32, flags, p, 0);
                    x = self.fb.ins().insertlane(x, e, k);
                }
                self.fb.ins().jump(join, &[BlockArg::Value(x)]);
                self.fb.switch_to_block(join);
                let var = self.vregs[ds[0] as usize].expect("a narrow destination");
                self.fb.def_var(var, v);
                true
            }
            Op::St {
                n,
                size,
                vals,
                addr,
            } if fits(self, &addr, size, n) && narrow(self, vals[0]) => {
                let (at, first, (consecutive, _)) = self.lane_addresses(&addr);
                let flags = MemFlagsData::trusted().with_endianness(Endianness::Little);
                let x = self.vsrc_pub(vals[0]);
                let (whole, each) = (self.fb.create_block(), self.fb.create_block());
                let join = self.fb.create_block();
                self.fb.ins().brif(consecutive, whole, &[], each, &[]);
                self.fb.switch_to_block(whole);
                let p = self.shared_unchecked(first);
                self.fb.ins().store(flags, x, p, 0);
                self.fb.ins().jump(join, &[]);
                self.fb.switch_to_block(each);
                // lane after lane: where two meet, the later thread's value stays
                for k in 0..self.width as u8 {
                    let a = self.fb.ins().extractlane(at, k);
                    let a = self.fb.ins().uextend(I64, a);
                    let p = self.shared_unchecked(a);
                    let e = self.fb.ins().extractlane(x, k);
                    self.fb.ins().store(flags, e, p, 0);
                }
                self.fb.ins().jump(join, &[]);
                self.fb.switch_to_block(join);
                true
            }
            _ => false,
        }
    }

    /// The lanes' 32-bit addresses of `addr`, the first lane's (an I64),
    /// and whether they are consecutive words, and all the same.
    fn lane_addresses(&mut self, addr: &Address) -> (Value, Value, (Value, Value)) {
        let base = self.vsrc_pub(addr.base);
        let off = self.fb.ins().iconst(I32, addr.off as u32 as i64);
        let off = self.fb.ins().splat(I32X4, off);
        let at = self.fb.ins().iadd(base, off);
        let first = self.fb.ins().extractlane(at, 0);
        let all_first = self.fb.ins().splat(I32X4, first);
        let words: Vec<u8> = [0u32, 4, 8, 12]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let c = self.fb.func.dfg.constants.insert(ConstantData::from(words));
        let words = self.fb.ins().vconst(I32X4, c);
        let expect = self.fb.ins().iadd(all_first, words);
        let eq = self.fb.ins().icmp(IntCC::Equal, at, expect);
        let consecutive = self.fb.ins().vall_true(eq);
        let eq = self.fb.ins().icmp(IntCC::Equal, at, all_first);
        let equal = self.fb.ins().vall_true(eq);
        let first = self.fb.ins().uextend(I64, first);
        (at, first, (consecutive, equal))
    }
}
