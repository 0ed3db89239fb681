//! Tensor-core ops: the per-thread `wmma.load`/`wmma.store` of 16x16 tiles,
//! and the warp collectives `ldmatrix`, `mma.sync` (PTX ISA fragment
//! layouts) and `wmma.mma` (our fragment layout: lane l holds elements
//! l*8 .. l*8+8 of a tile).

use super::access::Access;
use super::state::{op_at, Block, Geo, Thread};
use crate::alu::{fval, sext, to_fbits};
use crate::ir::{MmaOperands, Op, Src, Ty};
use crate::launch::Fault;

/// 8-bit elements sit four to a register, f16/bf16 two, wider ones one.
#[inline]
fn elems_per_reg(t: Ty) -> usize {
    (4 / t.bytes().clamp(1, 4)) as usize
}

/// Where element `i` of a register's elements of type `t` starts (bits).
#[inline]
fn elem_shift(t: Ty, i: usize) -> u32 {
    t.bytes() * 8 * (i % elems_per_reg(t)) as u32
}

/// Address of fragment slot `slot` of `lane` in a 16x16 tile at `base`.
fn tile_elem_addr(base: u64, stride: u64, row: bool, lane: u32, slot: usize, es: u32) -> u64 {
    let e = lane as u64 * 8 + slot as u64;
    let (r, c) = (e / 16, e % 16);
    let idx = if row { r * stride + c } else { c * stride + r };
    base.wrapping_add(idx.wrapping_mul(es as u64))
}

/// Raw bits of element `i` of a fragment held in registers `srcs`.
fn frag_bits(th: &Thread, srcs: &[Src], t: Ty, i: usize) -> Option<u64> {
    let per_reg = elems_per_reg(t);
    let s = srcs.get(i / per_reg)?;
    Some((th.get(*s) >> elem_shift(t, i)) & t.mask())
}

/// Element `i` of a fragment as f32 (0 past the fragment's registers).
fn frag_elem(th: &Thread, srcs: &[Src], t: Ty, i: usize) -> f32 {
    fval(frag_bits(th, srcs, t, i).unwrap_or(0), t) as f32
}

/// Register `j` of a result fragment of type `t` whose element `i` is
/// `elem(i)`.
fn frag_reg(t: Ty, j: usize, elem: impl Fn(usize) -> f32) -> u64 {
    let per_reg = elems_per_reg(t);
    (0..per_reg).fold(0u64, |v, h| {
        v | to_fbits(elem(j * per_reg + h) as f64, t) << elem_shift(t, h)
    })
}

/// `d = a * b + c` on row-major f32 tiles: `a` is 16 x `k` (rows 16 apart),
/// `b` is `k` x `n`, `c` and `d` are 16 x `n`; each element accumulates with
/// fused multiply-adds in `k` order.
fn tile_mma(a: &[f32], b: &[f32], c: &[f32], d: &mut [f32], n: usize, k: usize) {
    for i in 0..16 {
        for j in 0..n {
            let mut acc = c[i * n + j];
            for kk in 0..k {
                acc = a[i * 16 + kk].mul_add(b[kk * n + j], acc);
            }
            d[i * n + j] = acc;
        }
    }
}

/// `wmma.load` and `wmma.store` of thread `th` (lane `lane`).
pub(super) fn wmma_load_store(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    op: &Op,
    lane: u32,
    line: u32,
) -> Result<(), Fault> {
    let (Op::WmmaLoad { tile, .. } | Op::WmmaStore { tile, .. }) = op else {
        debug_assert!(false, "{op:?} is not a wmma load or store");
        return Ok(());
    };
    let base = th.address(&tile.addr);
    let stride = th.get(tile.stride) & 0xffff_ffff;
    let es = tile.ety.bytes();
    // element `slot` of this lane's fragment
    let at = |slot| Access {
        sp: tile.addr.sp,
        addr: tile_elem_addr(base, stride, tile.row, lane, slot, es),
        size: es,
        line,
    };
    match op {
        Op::WmmaLoad { ds, .. } => {
            let per_reg = elems_per_reg(tile.ety);
            // a failing element ends its register; the last fault is reported
            let mut res = Ok(());
            for (j, d) in ds.iter().enumerate() {
                let mut v = 0u64;
                for h in 0..per_reg {
                    match b.load(g, &mut th.local, at((j * per_reg + h) % 8)) {
                        Ok(x) => v |= x << elem_shift(tile.ety, h),
                        Err(e) => {
                            res = Err(e);
                            break;
                        }
                    }
                }
                th.set(*d, v);
            }
            res
        }
        Op::WmmaStore { vals, .. } => {
            for slot in 0..8usize {
                let Some(v) = frag_bits(th, vals, tile.ety, slot) else {
                    break;
                };
                b.store(g, &mut th.local, at(slot), v)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// `ldmatrix` for the `lanes` of the warp starting at thread `lo`.
pub(super) fn ldmatrix(
    g: &Geo<'_>,
    threads: &mut [Thread],
    block: &mut Block,
    lo: usize,
    lanes: &[usize],
) -> Result<(), Fault> {
    let prog = g.prog;
    // shape and space of the first lane's instruction, as on the GPU
    let Some(&Op::Ldmatrix {
        num, trans, addr, ..
    }) = lanes.first().and_then(|&l| op_at(prog, &threads[lo + l]))
    else {
        return Ok(());
    };
    let num = num as usize;
    // row addresses: lane j*8+r names row r of matrix j
    let mut rows = [0u64; 32];
    for &lane in lanes {
        let th = &threads[lo + lane];
        if let Some(Op::Ldmatrix { addr, .. }) = op_at(prog, th) {
            rows[lane] = th.address(addr);
        }
    }
    let mut scratch = Vec::new();
    for &lane in lanes {
        let mut regs = [0u64; 4];
        for (j, reg) in regs.iter_mut().enumerate().take(num) {
            let mut v = 0u64;
            for h in 0..2u64 {
                let (row, col) = if trans {
                    ((lane % 4) * 2 + h as usize, lane / 4)
                } else {
                    (lane / 4, (lane % 4) * 2 + h as usize)
                };
                let at = Access {
                    sp: addr.sp,
                    addr: rows[j * 8 + row].wrapping_add(2 * col as u64),
                    size: 2,
                    line: 0,
                };
                let x = block.load(g, &mut scratch, at)?;
                v |= x << (16 * h);
            }
            *reg = v;
        }
        let th = &mut threads[lo + lane];
        if let Some(Op::Ldmatrix { ds, .. }) = op_at(prog, th) {
            for (d, v) in ds.iter().zip(regs) {
                th.set(*d, v);
            }
        }
    }
    Ok(())
}

/// `mma.sync` m16n8k16 / m16n8k8 for the `lanes` of the warp at `lo`.
pub(super) fn mma(g: &Geo<'_>, threads: &mut [Thread], lo: usize, lanes: &[usize]) {
    let prog = g.prog;
    let mut ma = [0f32; 256];
    let mut mb = [0f32; 128];
    let mut mc = [0f32; 128];
    let mut kdim = 16;
    for &lane in lanes {
        let th = &threads[lo + lane];
        let Some(Op::Mma { k, mma }) = op_at(prog, th) else {
            continue;
        };
        let MmaOperands {
            ab,
            cty,
            src: [a, b, c],
            ..
        } = &**mma;
        kdim = *k as usize;
        let (gi, ti) = (lane >> 2, lane & 3);
        let na = if kdim == 16 { 8 } else { 4 };
        for i in 0..na {
            let row = gi + 8 * ((i / 2) & 1);
            let col = ti * 2 + (i % 2) + 8 * (i / 4);
            ma[row * 16 + col] = frag_elem(th, a, *ab, i);
        }
        for i in 0..na / 2 {
            let kk = ti * 2 + (i % 2) + 8 * (i / 2);
            mb[kk * 8 + gi] = frag_elem(th, b, *ab, i);
        }
        for i in 0..4 {
            mc[(gi + 8 * (i / 2)) * 8 + ti * 2 + (i % 2)] = frag_elem(th, c, *cty, i);
        }
    }
    let mut md = [0f32; 128];
    tile_mma(&ma, &mb, &mc, &mut md, 8, kdim);
    for &lane in lanes {
        let th = &mut threads[lo + lane];
        let Some(Op::Mma { mma, .. }) = op_at(prog, th) else {
            continue;
        };
        let (gi, ti) = (lane >> 2, lane & 3);
        let elem = |i: usize| {
            if i < 4 {
                md[(gi + 8 * (i / 2)) * 8 + ti * 2 + (i % 2)]
            } else {
                0.0
            }
        };
        // the four result elements fill at most four registers
        for (j, r) in mma.d.iter().enumerate().take(4) {
            th.set(*r, frag_reg(mma.dty, j, elem));
        }
    }
}

/// The `a`, `b` and `c` 16x16 tiles of a `wmma.mma`, gathered from the
/// fragments of the `lanes` of the warp at `lo` (lane l's slots are
/// elements l*8 .. l*8+8), each element read by `elem`.
fn wmma_tiles<T: Copy + Default>(
    g: &Geo<'_>,
    threads: &[Thread],
    lo: usize,
    lanes: &[usize],
    elem: impl Fn(&Thread, &[Src], Ty, usize) -> T,
) -> [[T; 256]; 3] {
    let mut tiles = [[T::default(); 256]; 3];
    for &lane in lanes {
        let th = &threads[lo + lane];
        if let Some(Op::WmmaMma { mma }) = op_at(g.prog, th) {
            for (tile, (srcs, t)) in tiles.iter_mut().zip([
                (&mma.src[0], mma.ab),
                (&mma.src[1], mma.ab),
                (&mma.src[2], mma.cty),
            ]) {
                for slot in 0..8 {
                    tile[lane * 8 + slot] = elem(th, srcs, t, slot);
                }
            }
        }
    }
    tiles
}

/// `wmma.mma` m16n16k16 for the `lanes` of the warp at `lo`.
pub(super) fn wmma_mma(g: &Geo<'_>, threads: &mut [Thread], lo: usize, lanes: &[usize]) {
    let prog = g.prog;
    let integer = lanes.first().is_some_and(|&l| {
        matches!(op_at(prog, &threads[lo + l]), Some(Op::WmmaMma { mma }) if matches!(mma.ab, Ty::S8 | Ty::U8))
    });
    if integer {
        return wmma_mma_int(g, threads, lo, lanes);
    }
    let [ma, mb, mc] = wmma_tiles(g, threads, lo, lanes, frag_elem);
    let mut md = [0f32; 256];
    tile_mma(&ma, &mb, &mc, &mut md, 16, 16);
    for &lane in lanes {
        let th = &mut threads[lo + lane];
        let Some(Op::WmmaMma { mma }) = op_at(prog, th) else {
            continue;
        };
        // `.satfinite`: an infinite result is the type's largest finite
        // value, a NaN +0
        let most = if mma.dty == Ty::F16 {
            65504.0
        } else {
            f32::MAX
        };
        let finite = |v: f32| match (mma.satfinite, v.is_nan()) {
            (false, _) => v,
            (true, true) => 0.0,
            (true, false) => v.clamp(-most, most),
        };
        for (j, reg) in mma.d.iter().enumerate() {
            th.set(
                *reg,
                frag_reg(mma.dty, j, |slot| finite(md[lane * 8 + slot % 8])),
            );
        }
    }
}

/// Integer `wmma.mma` m16n16k16 (`.s8`/`.u8` inputs, `.s32` accumulators)
/// for the `lanes` of the warp at `lo`: exact sums, wrapped to 32 bits or,
/// with `.satfinite`, clamped to the `s32` range.
fn wmma_mma_int(g: &Geo<'_>, threads: &mut [Thread], lo: usize, lanes: &[usize]) {
    let prog = g.prog;
    let value = |th: &Thread, srcs: &[Src], t: Ty, i: usize| {
        let bits = frag_bits(th, srcs, t, i).unwrap_or(0);
        match t {
            Ty::U8 => bits as i64,
            _ => sext(bits, t.bytes() * 8),
        }
    };
    let [ma, mb, mc] = wmma_tiles(g, threads, lo, lanes, value);
    let mut md = [0i64; 256];
    for i in 0..16 {
        for j in 0..16 {
            md[i * 16 + j] = mc[i * 16 + j]
                + (0..16)
                    .map(|k| ma[i * 16 + k] * mb[k * 16 + j])
                    .sum::<i64>();
        }
    }
    for &lane in lanes {
        let th = &mut threads[lo + lane];
        let Some(Op::WmmaMma { mma }) = op_at(prog, th) else {
            continue;
        };
        let satfinite = mma.satfinite;
        for (j, reg) in mma.d.iter().enumerate() {
            let v = md[lane * 8 + j % 8];
            let v = if satfinite {
                v.clamp(i32::MIN as i64, i32::MAX as i64)
            } else {
                v
            };
            th.set(*reg, v as i32 as u32 as u64);
        }
    }
}
