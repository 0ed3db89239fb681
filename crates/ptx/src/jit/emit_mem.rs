//! `ld`, `st` and `atom` in compiled code: an open-coded fast path for aligned
//! accesses in shared, local, parameter memory or the global allocation the
//! site resolved last; else the checked helpers, which fault as the interpreter.

use super::lane_defs::add_imm;
use super::runtime::{
    rt_atom, rt_load, rt_log_store, rt_misaligned_vector, rt_store, space_code, Ctx,
    GLOBAL_ENTRY_BYTES, LOGGED_BYTES,
};
use super::translate::{ctx_off, Translator};
use crate::ir::{Address, MemOrder, Op, Sp, Src, NONE};
use crate::whole_vector::whole_width;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64};
use cranelift_codegen::ir::{
    AbiParam, Inst as IrInst, InstBuilder, MemFlagsData, Signature, Type, Value,
};
use std::mem::offset_of;

impl Translator<'_, '_> {
    /// Calls the runtime's `f` with `args` (their types are its parameters)
    /// and `returns` results; the call's instruction, for its results.
    pub(super) fn call_runtime(
        &mut self,
        f: *const (),
        args: &[Value],
        returns: &[Type],
    ) -> IrInst {
        let mut sig = Signature::new(self.call_conv);
        for &a in args {
            let t = self.fb.func.dfg.value_type(a);
            sig.params.push(AbiParam::new(t));
        }
        sig.returns
            .extend(returns.iter().map(|&t| AbiParam::new(t)));
        let sig = self.fb.import_signature(sig);
        let f = self.imm(f as usize as i64);
        self.fb.ins().call_indirect(sig, f, args)
    }

    /// Calls the runtime's `f` with `args`; its I32 status (non-zero: a fault).
    pub(super) fn call_status(&mut self, f: *const (), args: &[Value]) -> Value {
        let call = self.call_runtime(f, args, &[I32]);
        self.fb.inst_results(call)[0]
    }

    /// Calls the runtime's `f` with `args` and goes to the fault exit if it
    /// says so.
    pub(super) fn call_checked(&mut self, f: *const (), args: &[Value]) {
        let st = self.call_status(f, args);
        self.fault_if(st);
    }

    /// Emits memory op `op` (an `Ld` or `St`) of the instruction on `line`.
    pub(super) fn memory_op(&mut self, op: &Op, line: u32) {
        match *op {
            Op::Ld {
                addr,
                size,
                n,
                ds,
                sext,
                order,
            } => {
                if let (Some((v, _)), true) = (self.hoisted_param(&addr, size, n), self.width > 1) {
                    // (the lane kernel runs only where every one is in)
                    let v = if sext { self.sext(v, size * 8) } else { v };
                    self.set(ds[0], v);
                    return;
                }
                if let Some((v, all_in)) = self.hoisted_param(&addr, size, n) {
                    // every hoisted parameter is in: the value loaded before
                    // the loop; else this load's own checked path
                    let (fast, slow) = (self.fb.create_block(), self.fb.create_block());
                    let join = self.fb.create_block();
                    let out = self.fb.append_block_param(join, I64);
                    self.fb.ins().brif(all_in, fast, &[], slow, &[]);
                    self.fb.switch_to_block(slow);
                    self.fb.set_cold_block(slow);
                    let a = self.address(&addr);
                    let x = self.load(addr.sp, a, size, line);
                    self.jump_with(join, x);
                    self.fb.switch_to_block(fast);
                    self.jump_with(join, v);
                    self.fb.switch_to_block(join);
                    let v = if sext { self.sext(out, size * 8) } else { out };
                    self.set(ds[0], v);
                    return;
                }
                let base = self.address(&addr);
                if !self.covered(addr.sp) {
                    self.vector_alignment(base, size, n, false, line);
                }
                if let Some(bytes) = whole_width(order, addr.sp, size, n) {
                    self.load_whole(addr.sp, base, size, &ds[..n as usize], sext, bytes, line);
                    return;
                }
                self.atomic = Self::atomic_in(order, addr.sp);
                for (k, d) in ds.iter().enumerate().take(n as usize) {
                    let a = self.add_imm(base, k as i64 * size as i64);
                    let v = self.load(addr.sp, a, size, line);
                    let v = if sext { self.sext(v, size * 8) } else { v };
                    self.set(*d, v);
                }
                self.atomic = false;
            }
            Op::St {
                n,
                size,
                vals,
                addr,
                order,
            } => {
                let base = self.address(&addr);
                if !self.covered(addr.sp) {
                    self.vector_alignment(base, size, n, true, line);
                }
                let vs: Vec<Value> = vals.iter().take(n as usize).map(|&s| self.src(s)).collect();
                if let Some(bytes) = whole_width(order, addr.sp, size, n) {
                    self.store_whole(addr.sp, base, size, &vs, bytes, line);
                    return;
                }
                self.atomic = Self::atomic_in(order, addr.sp);
                for (k, v) in vs.into_iter().enumerate() {
                    let a = self.add_imm(base, k as i64 * size as i64);
                    self.store(addr.sp, a, size, v, line);
                }
                self.atomic = false;
            }
            Op::Atom { addr, d, b, c, .. } => {
                self.next_site(addr.sp);
                let a = self.address(&addr);
                let (bv, cv) = (self.src(b), self.src(c));
                let site = self.imm32(self.site as i64);
                let opp = self.imm(op as *const Op as usize as i64);
                let ln = self.imm32(line as i64);
                let out = self.fb.ins().stack_addr(I64, self.slot, 0);
                let local = self.local_at();
                let args = [self.ctx, site, local, opp, a, bv, cv, ln, out];
                self.call_checked(rt_atom as *const (), &args);
                if d != NONE {
                    let v = self.fb.ins().stack_load(I64, I64, self.slot, 0);
                    self.set(d, v);
                }
            }
            _ => {}
        }
    }

    /// Whether an access ordered by `order` in `sp` is atomic: in global
    /// memory (generic addresses mostly are) other blocks run on other
    /// host threads; shared and local memory are the block's own, whose
    /// threads all run on one.
    fn atomic_in(order: MemOrder, sp: Sp) -> bool {
        order != MemOrder::Plain && matches!(sp, Sp::Global | Sp::Generic)
    }

    fn address(&mut self, a: &Address) -> Value {
        let b = self.src(a.base);
        self.add_imm(b, a.off)
    }

    /// `v + k` (no instruction for 0: code is not optimised after us).
    fn add_imm(&mut self, v: Value, k: i64) -> Value {
        if k == 0 {
            v
        } else {
            add_imm(&mut self.fb, v, k)
        }
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
        let t = self.imm32(total as i64);
        let w = self.imm32(write as i64);
        let l = self.imm32(line as i64);
        let f = rt_misaligned_vector as *const ();
        self.call_checked(f, &[self.ctx, addr, t, w, l]);
        self.fb.ins().jump(ok, &[]);
        self.fb.switch_to_block(ok);
    }

    /// The fast-path host pointer of `size` bytes at `addr` in `sp`, and
    /// whether it may be used (an I8 condition); `None`: always the slow path.
    ///
    /// One compare checks bounds and alignment together: the offset rotated
    /// right by log2(`size`) is below `limit >> log2(size)` exactly when the
    /// offset is aligned and `offset + size <= limit` (a misaligned offset
    /// rotates its low bits to the top; every limit is far below 2^29).
    pub(super) fn fast_pointer(
        &mut self,
        sp: Sp,
        addr: Value,
        size: u32,
        write: bool,
    ) -> Option<(Value, Value)> {
        let flags = MemFlagsData::trusted();
        let fixed = flags.with_readonly();
        let k = size.trailing_zeros() as i64;
        let (offset, limit, base) = match sp {
            Sp::Shared => {
                // shared addresses are 32 bits wide: the low half, wrapped
                let a32 = self.fb.ins().ireduce(I32, addr);
                let (base, lim) = match self.shared_here {
                    Some((base, bytes)) => (base, bytes),
                    None => {
                        let bytes =
                            self.fb
                                .ins()
                                .load(I64, fixed, self.ctx, ctx_off!(shared_bytes));
                        let base = self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(shared));
                        (base, bytes)
                    }
                };
                let lim = self.fb.ins().ushr_imm_u(lim, k);
                let lim = self.fb.ins().ireduce(I32, lim);
                let v = self.rotate(a32, k);
                let ok = self.fb.ins().icmp(IntCC::UnsignedLessThan, v, lim);
                let off = self.fb.ins().uextend(I64, a32);
                return Some((ok, self.fb.ins().iadd(base, off)));
            }
            Sp::Global | Sp::Generic => {
                let cache = self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(gcache));
                let entry = add_imm(&mut self.fb, cache, self.site as i64 * GLOBAL_ENTRY_BYTES);
                let gbase = self.fb.ins().load(I64, flags, entry, 0);
                let glen = self.fb.ins().load(I64, flags, entry, 8);
                let off = self.fb.ins().isub(addr, gbase);
                let base = self.fb.ins().load(I64, flags, entry, 16);
                (off, glen, base)
            }
            Sp::Local => {
                let lim = self
                    .fb
                    .ins()
                    .load(I64, fixed, self.ctx, ctx_off!(local_bytes));
                (addr, lim, self.local_at())
            }
            Sp::Param if !write => {
                let lim = self
                    .fb
                    .ins()
                    .load(I64, fixed, self.ctx, ctx_off!(params_len));
                let base = self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(params));
                (addr, lim, base)
            }
            Sp::Param => return None,
        };
        let v = self.rotate(offset, k);
        let lim = self.fb.ins().ushr_imm_u(limit, k);
        let ok = self.fb.ins().icmp(IntCC::UnsignedLessThan, v, lim);
        Some((ok, self.fb.ins().iadd(base, offset)))
    }

    /// `v` rotated right by `k` bits.
    fn rotate(&mut self, v: Value, k: i64) -> Value {
        if k == 0 {
            v
        } else {
            self.fb.ins().rotr_imm_u(v, k)
        }
    }

    /// Whether an access of `sp` that misses the fast path may still be
    /// fine (a global allocation other than the last one resolved); a miss
    /// in shared, local or parameter space always faults.
    fn slow_may_succeed(sp: Sp) -> bool {
        matches!(sp, Sp::Global | Sp::Generic)
    }

    /// The value and the all-in condition of a parameter load hoisted
    /// before the thread loop.
    pub(super) fn hoisted_param(
        &self,
        addr: &crate::ir::Address,
        size: u32,
        n: u8,
    ) -> Option<(Value, Value)> {
        let Src::Imm(b) = addr.base else {
            return None;
        };
        if addr.sp != Sp::Param || n != 1 {
            return None;
        }
        let at = b.wrapping_add(addr.off as u64);
        let v = self.params.values.iter().find(|(k, _)| *k == (at, size))?.1;
        Some((v, self.params.all_in?))
    }

    /// Whether the access being emitted, in `sp`, is one its block's
    /// check covered.
    pub(super) fn covered(&self, sp: Sp) -> bool {
        sp == Sp::Shared && self.unchecked.contains(&self.pc_now)
    }

    pub(super) fn load(&mut self, sp: Sp, addr: Value, size: u32, line: u32) -> Value {
        if self.covered(sp) {
            let p = self.shared_unchecked(addr);
            return self.fast_load(p, size);
        }
        self.next_site(sp);
        let slow = self.fb.create_block();
        self.fb.set_cold_block(slow);
        let fast = self.fb.create_block();
        let fast_ptr = self.fast_pointer(sp, addr, size, false);
        match fast_ptr {
            Some((ok, _)) => self.fb.ins().brif(ok, fast, &[], slow, &[]),
            None => self.fb.ins().jump(slow, &[]),
        };
        self.fb.switch_to_block(slow);
        let [ctx, site, local, spc] = self.access_head(sp);
        let sz = self.imm32(size as i64);
        let ln = self.imm32(line as i64);
        let out = self.fb.ins().stack_addr(I64, self.slot, 0);
        let args = [ctx, site, local, spc, addr, sz, ln, out];
        let st = self.call_status(rt_load as *const (), &args);
        if !Self::slow_may_succeed(sp) {
            self.fault_if(st);
            // the helper faults whatever it is given here
            self.jump_to_fault();
            self.fb.switch_to_block(fast);
            return match fast_ptr {
                Some((_, p)) => self.fast_load(p, size),
                None => self.imm(0),
            };
        }
        let join = self.fb.create_block();
        let v = self.fb.append_block_param(join, I64);
        self.fault_if(st);
        let x = self.fb.ins().stack_load(I64, I64, self.slot, 0);
        self.jump_with(join, x);
        self.fb.switch_to_block(fast);
        if let Some((_, p)) = fast_ptr {
            let x = if self.atomic {
                self.atomic_load(p, size)
            } else {
                self.fast_load(p, size)
            };
            self.jump_with(join, x);
        } else {
            self.fb.ins().jump(join, &[]);
        }
        self.fb.switch_to_block(join);
        v
    }

    /// Logs the `size` bytes (up to 8, or 16) a lane kernel's global store
    /// at host pointer `p` overwrites (the block is undone if its lanes
    /// part): in place while the log has room, else through the helper.
    pub(super) fn log_store(&mut self, p: Value, size: u32) {
        let flags = MemFlagsData::trusted();
        let len = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(log_len));
        let cap = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(log_cap));
        let room = self.fb.ins().icmp(IntCC::UnsignedLessThan, len, cap);
        let (fast, slow) = (self.fb.create_block(), self.fb.create_block());
        let join = self.fb.create_block();
        self.fb.ins().brif(room, fast, &[], slow, &[]);
        self.fb.switch_to_block(slow);
        self.fb.set_cold_block(slow);
        let sz = self.imm32(size as i64);
        self.call_runtime(rt_log_store as *const (), &[self.ctx, p, sz], &[]);
        self.fb.ins().jump(join, &[]);
        self.fb.switch_to_block(fast);
        let log = self.fb.ins().load(I64, flags, self.ctx, ctx_off!(log));
        let off = self.fb.ins().imul_imm_s(len, LOGGED_BYTES);
        let e = self.fb.ins().iadd(log, off);
        self.fb.ins().store(flags, p, e, 0);
        let sz = self.imm(size as i64);
        self.fb.ins().store(flags, sz, e, 8);
        let old = match size {
            16 => {
                let any = MemFlagsData::new()
                    .with_notrap()
                    .with_endianness(cranelift_codegen::ir::Endianness::Little);
                self.fb.ins().load(I32X4, any, p, 0)
            }
            _ => self.fast_load(p, size),
        };
        let any = MemFlagsData::new()
            .with_notrap()
            .with_endianness(cranelift_codegen::ir::Endianness::Little);
        self.fb.ins().store(any, old, e, 16);
        let len = add_imm(&mut self.fb, len, 1);
        self.fb.ins().store(flags, len, self.ctx, ctx_off!(log_len));
        self.fb.ins().jump(join, &[]);
        self.fb.switch_to_block(join);
    }

    /// Gives a global or generic access its own site in the cache (the
    /// pinned one while `site_pin` holds one).
    pub(super) fn next_site(&mut self, sp: Sp) {
        if let Some(s) = self.site_pin {
            self.site = s;
            return;
        }
        self.site = if Self::slow_may_succeed(sp) {
            self.sites += 1;
            self.sites - 1
        } else {
            u32::MAX
        };
    }

    /// The runtime's arguments before an access's address: the context,
    /// the access's cache site (`next_site`), the lane's local memory and
    /// the space.
    pub(super) fn access_head(&mut self, sp: Sp) -> [Value; 4] {
        let site = self.imm32(self.site as i64);
        let local = self.local_at();
        let spc = self.imm32(space_code(sp) as i64);
        [self.ctx, site, local, spc]
    }

    pub(super) fn fast_load(&mut self, p: Value, size: u32) -> Value {
        let flags = MemFlagsData::trusted();
        // a zero-extending load: one move
        match size {
            1 => self.fb.ins().uload8(I64, flags, p, 0),
            2 => self.fb.ins().uload16(I64, flags, p, 0),
            4 => self.fb.ins().uload32(flags, p, 0),
            _ => self.fb.ins().load(I64, flags, p, 0),
        }
    }

    /// An atomic load of `size` bytes at host pointer `p`, zero-extended:
    /// every run of it reads memory again, and (sequentially consistent)
    /// it orders the loads after it, as `ld.acquire` does.
    fn atomic_load(&mut self, p: Value, size: u32) -> Value {
        let v = self
            .fb
            .ins()
            .atomic_load(Self::int_type(size), MemFlagsData::trusted(), p);
        if size < 8 {
            self.fb.ins().uextend(I64, v)
        } else {
            v
        }
    }

    pub(super) fn store(&mut self, sp: Sp, addr: Value, size: u32, val: Value, line: u32) {
        if self.covered(sp) {
            let p = self.shared_unchecked(addr);
            let x = if size < 8 {
                self.fb.ins().ireduce(Self::int_type(size), val)
            } else {
                val
            };
            self.fb.ins().store(MemFlagsData::trusted(), x, p, 0);
            return;
        }
        self.next_site(sp);
        let slow = self.fb.create_block();
        self.fb.set_cold_block(slow);
        let fast = self.fb.create_block();
        let fast_ptr = self.fast_pointer(sp, addr, size, true);
        match fast_ptr {
            Some((ok, _)) => self.fb.ins().brif(ok, fast, &[], slow, &[]),
            None => self.fb.ins().jump(slow, &[]),
        };
        self.fb.switch_to_block(slow);
        let [ctx, site, local, spc] = self.access_head(sp);
        let sz = self.imm32(size as i64);
        let ln = self.imm32(line as i64);
        let args = [ctx, site, local, spc, addr, sz, ln, val];
        self.call_checked(rt_store as *const (), &args);
        let join = if Self::slow_may_succeed(sp) {
            let join = self.fb.create_block();
            self.fb.ins().jump(join, &[]);
            Some(join)
        } else {
            self.jump_to_fault();
            None
        };
        self.fb.switch_to_block(fast);
        if let Some((_, p)) = fast_ptr {
            if self.width > 1 && Self::slow_may_succeed(sp) {
                self.log_store(p, size);
            }
            let x = if size < 8 {
                self.fb.ins().ireduce(Self::int_type(size), val)
            } else {
                val
            };
            if self.atomic {
                self.fb.ins().atomic_store(MemFlagsData::trusted(), x, p);
            } else {
                self.fb.ins().store(MemFlagsData::trusted(), x, p, 0);
            }
        }
        if let Some(join) = join {
            self.fb.ins().jump(join, &[]);
            self.fb.switch_to_block(join);
        }
    }
}

/// The context's layout is what the generated code assumes.
const _: () = assert!(offset_of!(Ctx<'static>, shared) == 0);
