//! `ld` and `st` in compiled code: an open-coded fast path for an aligned
//! access inside the block's shared memory, the thread's local memory, the
//! parameter buffer or the global allocation resolved last, and the checked
//! slow path (`rt_load`/`rt_store`) that resolves, or faults as the
//! interpreter does.

use super::runtime::{rt_load, rt_misaligned_vector, rt_store, space_code, Ctx};
use super::translate::{ctx_off, Translator};
use crate::ir::{Address, Op, Sp};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I64};
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlagsData, Signature, Value};
use std::mem::offset_of;

impl Translator<'_, '_> {
    /// Emits memory op `op` (an `Ld` or `St`) of the instruction on `line`.
    pub(super) fn memory_op(&mut self, op: &Op, line: u32) {
        match *op {
            Op::Ld {
                addr,
                size,
                n,
                ds,
                sext,
            } => {
                let base = self.address(&addr);
                self.vector_alignment(base, size, n, false, line);
                for (k, d) in ds.iter().enumerate().take(n as usize) {
                    let a = self.fb.ins().iadd_imm_s(base, k as i64 * size as i64);
                    let v = self.load(addr.sp, a, size, line);
                    let v = if sext { self.sext(v, size * 8) } else { v };
                    self.set(*d, v);
                }
            }
            Op::St {
                n,
                size,
                vals,
                addr,
            } => {
                let base = self.address(&addr);
                self.vector_alignment(base, size, n, true, line);
                let vs: Vec<Value> = vals.iter().take(n as usize).map(|&s| self.src(s)).collect();
                for (k, v) in vs.into_iter().enumerate() {
                    let a = self.fb.ins().iadd_imm_s(base, k as i64 * size as i64);
                    self.store(addr.sp, a, size, v, line);
                }
            }
            _ => {}
        }
    }

    fn address(&mut self, a: &Address) -> Value {
        let b = self.src(a.base);
        self.fb.ins().iadd_imm_s(b, a.off)
    }

    /// A vector access must be aligned to its whole size (at most 16 bytes).
    fn vector_alignment(&mut self, addr: Value, size: u32, n: u8, write: bool, line: u32) {
        let total = size * n as u32;
        if total <= size {
            return;
        }
        let low = self.fb.ins().band_imm_u(addr, (total.min(16) - 1) as i64);
        let bad = self.fb.create_block();
        let ok = self.fb.create_block();
        self.fb.set_cold_block(bad);
        self.fb.ins().brif(low, bad, &[], ok, &[]);
        self.fb.switch_to_block(bad);
        let mut sig = Signature::new(self.call_conv);
        sig.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
        sig.params.extend([AbiParam::new(I32); 3]);
        sig.returns.push(AbiParam::new(I32));
        let sig = self.fb.import_signature(sig);
        let f = self.imm(rt_misaligned_vector as *const () as usize as i64);
        let t = self.fb.ins().iconst(I32, total as i64);
        let w = self.fb.ins().iconst(I32, write as i64);
        let l = self.fb.ins().iconst(I32, line as i64);
        let call = self
            .fb
            .ins()
            .call_indirect(sig, f, &[self.ctx, addr, t, w, l]);
        let st = self.fb.inst_results(call)[0];
        self.fault_if(st);
        self.fb.ins().jump(ok, &[]);
        self.fb.switch_to_block(ok);
    }

    /// The fast-path host pointer of `size` bytes at `addr` in `sp`, and
    /// whether it may be used (an I8 condition); `None`: always the slow path.
    fn fast_pointer(
        &mut self,
        sp: Sp,
        addr: Value,
        size: u32,
        write: bool,
    ) -> Option<(Value, Value)> {
        let flags = MemFlagsData::trusted();
        let (ok, p) = match sp {
            Sp::Shared => {
                let a32 = self.fb.ins().band_imm_u(addr, 0xffff_ffff);
                let end = self.fb.ins().iadd_imm_s(a32, size as i64);
                let lim = self
                    .fb
                    .ins()
                    .load(I64, flags, self.ctx, ctx_off!(shared_bytes));
                let ok = self.fb.ins().icmp(IntCC::UnsignedLessThanOrEqual, end, lim);
                let base = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(shared));
                (ok, self.fb.ins().iadd(base, a32))
            }
            Sp::Global | Sp::Generic => {
                let gbase = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(gbase));
                let glen = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(glen));
                let off = self.fb.ins().isub(addr, gbase);
                let above = self
                    .fb
                    .ins()
                    .icmp(IntCC::UnsignedGreaterThanOrEqual, addr, gbase);
                let ok = self.within(off, glen, size);
                let ok = self.fb.ins().band(ok, above);
                let base = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(gptr));
                (ok, self.fb.ins().iadd(base, off))
            }
            Sp::Local => {
                let lim = self
                    .fb
                    .ins()
                    .load(I64, flags, self.ctx, ctx_off!(local_bytes));
                let ok = self.within(addr, lim, size);
                (ok, self.fb.ins().iadd(self.local, addr))
            }
            Sp::Param if !write => {
                let lim = self
                    .fb
                    .ins()
                    .load(I64, flags, self.ctx, ctx_off!(params_len));
                let ok = self.within(addr, lim, size);
                let base = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(params));
                (ok, self.fb.ins().iadd(base, addr))
            }
            Sp::Param => return None,
        };
        let ok = if size > 1 {
            let low = self.fb.ins().band_imm_u(addr, (size.min(16) - 1) as i64);
            let aligned = self.fb.ins().icmp_imm_u(IntCC::Equal, low, 0);
            self.fb.ins().band(ok, aligned)
        } else {
            ok
        };
        Some((ok, p))
    }

    /// Whether `size` bytes at `off` lie inside `len` bytes (no overflow).
    fn within(&mut self, off: Value, len: Value, size: u32) -> Value {
        let inside = self.fb.ins().icmp(IntCC::UnsignedLessThan, off, len);
        let room = self.fb.ins().isub(len, off);
        let fits = self
            .fb
            .ins()
            .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, room, size as i64);
        self.fb.ins().band(inside, fits)
    }

    fn load(&mut self, sp: Sp, addr: Value, size: u32, line: u32) -> Value {
        let join = self.fb.create_block();
        let v = self.fb.append_block_param(join, I64);
        let slow = self.fb.create_block();
        self.fb.set_cold_block(slow);
        if let Some((ok, p)) = self.fast_pointer(sp, addr, size, false) {
            let fast = self.fb.create_block();
            self.fb.ins().brif(ok, fast, &[], slow, &[]);
            self.fb.switch_to_block(fast);
            let ty = Self::int_type(size);
            let x = self.fb.ins().load(ty, MemFlagsData::trusted(), p, 0);
            let x = if size < 8 {
                self.fb.ins().uextend(I64, x)
            } else {
                x
            };
            self.jump_with(join, x);
        } else {
            self.fb.ins().jump(slow, &[]);
        }
        self.fb.switch_to_block(slow);
        let mut sig = Signature::new(self.call_conv);
        sig.params
            .extend([AbiParam::new(I64), AbiParam::new(I64), AbiParam::new(I32)]);
        sig.params.push(AbiParam::new(I64));
        sig.params
            .extend([AbiParam::new(I32), AbiParam::new(I32), AbiParam::new(I64)]);
        sig.returns.push(AbiParam::new(I32));
        let sig = self.fb.import_signature(sig);
        let f = self.imm(rt_load as *const () as usize as i64);
        let spc = self.fb.ins().iconst(I32, space_code(sp) as i64);
        let sz = self.fb.ins().iconst(I32, size as i64);
        let ln = self.fb.ins().iconst(I32, line as i64);
        let out = self.fb.ins().stack_addr(I64, self.slot, 0);
        let call =
            self.fb
                .ins()
                .call_indirect(sig, f, &[self.ctx, self.local, spc, addr, sz, ln, out]);
        let st = self.fb.inst_results(call)[0];
        self.fault_if(st);
        let x = self.fb.ins().stack_load(I64, I64, self.slot, 0);
        self.jump_with(join, x);
        self.fb.switch_to_block(join);
        v
    }

    fn store(&mut self, sp: Sp, addr: Value, size: u32, val: Value, line: u32) {
        let join = self.fb.create_block();
        let slow = self.fb.create_block();
        self.fb.set_cold_block(slow);
        if let Some((ok, p)) = self.fast_pointer(sp, addr, size, true) {
            let fast = self.fb.create_block();
            self.fb.ins().brif(ok, fast, &[], slow, &[]);
            self.fb.switch_to_block(fast);
            let x = if size < 8 {
                self.fb.ins().ireduce(Self::int_type(size), val)
            } else {
                val
            };
            self.fb.ins().store(MemFlagsData::trusted(), x, p, 0);
            self.fb.ins().jump(join, &[]);
        } else {
            self.fb.ins().jump(slow, &[]);
        }
        self.fb.switch_to_block(slow);
        let mut sig = Signature::new(self.call_conv);
        sig.params
            .extend([AbiParam::new(I64), AbiParam::new(I64), AbiParam::new(I32)]);
        sig.params.push(AbiParam::new(I64));
        sig.params
            .extend([AbiParam::new(I32), AbiParam::new(I32), AbiParam::new(I64)]);
        sig.returns.push(AbiParam::new(I32));
        let sig = self.fb.import_signature(sig);
        let f = self.imm(rt_store as *const () as usize as i64);
        let spc = self.fb.ins().iconst(I32, space_code(sp) as i64);
        let sz = self.fb.ins().iconst(I32, size as i64);
        let ln = self.fb.ins().iconst(I32, line as i64);
        let call =
            self.fb
                .ins()
                .call_indirect(sig, f, &[self.ctx, self.local, spc, addr, sz, ln, val]);
        let st = self.fb.inst_results(call)[0];
        self.fault_if(st);
        self.fb.ins().jump(join, &[]);
        self.fb.switch_to_block(join);
    }
}

/// The context's layout is what the generated code assumes.
const _: () = assert!(offset_of!(Ctx<'static>, shared) == 0);
